// The one compiled test main shared by every test executable: built once as a static library,
// so no test file pays for Catch2's runner again.
//
// `--specdec-isa=portable|avx2|avx512` (or SPECDEC_TEST_ISA in the environment) pins the hot
// core to that instruction set (specdec::force_isa) before any test runs, so one build tests
// every path; when this CPU cannot run it, the program prints why and exits with 77, which
// ctest reports as a skip. Unset, the core runs the best path this CPU has. `best` pins that
// best path, and is reported as a skip where it is the portable one (which "portable: " runs).
// `--specdec-exit-on-skip`: a test that cannot run here exits with 77 (support/skip.hpp).
// ctest passes both as arguments (tests/CMakeLists.txt): Catch2's test discovery keeps only the
// first of several environment variables, and arguments reach the process intact. Both are
// removed before Catch2 sees the command line.
//
// Allocator settings (glibc only): the statistical cases run a whole decode, with its
// workspace, hundreds of thousands of times, and adapters return fresh logit rows. glibc hands
// a freed heap top above 128 KiB back to the system and maps blocks above its threshold
// afresh, so each decode faulted its pages in again: half or more of such a case's time went to
// the kernel (the sparse 7000-token case: 32 s, 19 s of it in the kernel; 1.2 s with freed memory
// kept). The main keeps freed memory in the process. It changes no result: only where the
// allocator gets its pages.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <specdec/isa.hpp>

int main(int argc, char* argv[]) {
#if defined(__GLIBC__)
    mallopt(M_TRIM_THRESHOLD, 1 << 30);  // never give a freed heap top back
    mallopt(M_MMAP_THRESHOLD, 32 << 20); // blocks up to 32 MiB come from the heap (glibc's maximum)
    mallopt(M_TOP_PAD, 16 << 20);        // grow the heap 16 MiB at a time
#endif
    const char* name = std::getenv("SPECDEC_TEST_ISA");
    std::vector<char*> rest;
    for (int i = 0; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (i > 0 && a.substr(0, 14) == "--specdec-isa=") {
            name = argv[i] + 14;
        } else if (i > 0 && a == "--specdec-exit-on-skip") {
            setenv("SPECDEC_TEST_EXIT_ON_SKIP", "1", 1);
        } else {
            rest.push_back(argv[i]);
        }
    }
    if (name != nullptr && std::string_view(name) == "best") {
        if (specdec::best_isa() == specdec::isa::portable) {
            std::printf("skipped: the best path here is the portable one, which its own run covers\n");
            return 77;
        }
        name = specdec::isa_name(specdec::best_isa());
    }
    if (name != nullptr && *name != '\0') {
        const auto chosen = specdec::parse_isa(name);
        if (!chosen) {
            std::fprintf(stderr, "SPECDEC_TEST_ISA = %s is not one of portable, avx2, avx512, best\n", name);
            return 2;
        }
        if (!specdec::isa_supported(*chosen)) {
            std::printf("skipped: this CPU or build has no %s path (best here: %s)\n", name,
                        specdec::isa_name(specdec::best_isa()));
            return 77;
        }
        specdec::force_isa(*chosen);
    }
    return Catch::Session().run(static_cast<int>(rest.size()), rest.data());
}
