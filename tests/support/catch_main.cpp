// The one compiled test main shared by every test executable: built once as a static library,
// so no test file pays for Catch2's runner again.
//
// SPECDEC_TEST_ISA=portable|avx2|avx512 in the environment pins the hot core to that
// instruction set (specdec::force_isa) before any test runs, so one build tests every path;
// when this CPU cannot run it, the program prints why and exits with 77, which ctest reports as
// a skip. Unset, the core runs the best path this CPU has.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <cstdio>
#include <cstdlib>

#include <specdec/isa.hpp>

int main(int argc, char* argv[]) {
    if (const char* name = std::getenv("SPECDEC_TEST_ISA"); name != nullptr && *name != '\0') {
        const auto chosen = specdec::parse_isa(name);
        if (!chosen) {
            std::fprintf(stderr, "SPECDEC_TEST_ISA = %s is not one of portable, avx2, avx512\n", name);
            return 2;
        }
        if (!specdec::isa_supported(*chosen)) {
            std::printf("skipped: this CPU or build has no %s path (best here: %s)\n", name,
                        specdec::isa_name(specdec::best_isa()));
            return 77;
        }
        specdec::force_isa(*chosen);
    }
    return Catch::Session().run(argc, argv);
}
