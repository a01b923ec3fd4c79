#pragma once
/// \file
/// The internal configuration of the instruction sets (specdec/isa.hpp is the public API): which
/// copies of the hot core this build compiles, the intrinsics headers they need, the namespaces
/// that hold them, and the choice of the copy that runs, kept as an index (0 portable, 1 AVX2 +
/// FMA, 2 AVX-512 F + DQ: the values of SPECDEC_DETAIL_ISA and of specdec::isa). The core's
/// dispatch (detail/sampling_core.hpp, detail/verify_core.hpp) reads only this header.

#include <atomic>

#if !defined(SPECDEC_NO_DISPATCH) && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
/// 1 when the AVX2 and AVX-512 copies of the core are compiled (GCC or Clang on x86-64).
#define SPECDEC_DETAIL_X86_DISPATCH 1
#else
#define SPECDEC_DETAIL_X86_DISPATCH 0
#endif
/// Compiled mode: with SPECDEC_COMPILED defined (the specdec::compiled CMake target defines it
/// for its users), the copies of the hot core are compiled once, in the library's own source file
/// (src/specdec_core.cpp, which also defines SPECDEC_DETAIL_BUILD_CORE), and every other
/// translation unit only declares the functions that run them (detail/sampling_core.hpp,
/// detail/verify_core.hpp). Header-only use (the default) compiles them, inline, in each
/// translation unit that calls them. Every translation unit of a program uses one mode.
#if defined(SPECDEC_COMPILED) && !defined(SPECDEC_DETAIL_BUILD_CORE)
#define SPECDEC_DETAIL_CORE_DECLARED_ONLY 1
#else
#define SPECDEC_DETAIL_CORE_DECLARED_ONLY 0
#endif
/// How the functions that run the core are declared: inline in header-only use, with one
/// out-of-line definition (in the library) in compiled mode.
#if defined(SPECDEC_COMPILED)
#define SPECDEC_DETAIL_CORE_ENTRY
#else
#define SPECDEC_DETAIL_CORE_ENTRY inline
#endif
/// Compiled mode's entry points are declared between SPECDEC_DETAIL_CORE_BEGIN and
/// SPECDEC_DETAIL_CORE_END: an inline namespace named after how Eigen allocates its heap memory
/// in the translation unit (EIGEN_DEFAULT_ALIGN_BYTES, which the instruction-set flags set: 16
/// with SSE2, 32 with AVX, 64 with AVX-512; EIGEN_MALLOC_ALREADY_ALIGNED). The library allocates
/// workspace memory that the caller's translation units free, and Eigen's allocator and its
/// free function differ between those settings, so a program whose translation units were
/// compiled with other flags than the library's source file would corrupt its heap: with the
/// tag it does not link (an undefined reference to specdec::detail::compiled_align32_malloc0::...
/// names the mismatch). Header-only use needs no tag: each translation unit frees what it
/// allocated. Expanded where <Eigen/Core> is included.
#if defined(SPECDEC_COMPILED)
#define SPECDEC_DETAIL_COMPILED_ABI                                                  \
    SPECDEC_DETAIL_CAT(SPECDEC_DETAIL_CAT(compiled_align, EIGEN_DEFAULT_ALIGN_BYTES), \
                       SPECDEC_DETAIL_CAT(_malloc, EIGEN_MALLOC_ALREADY_ALIGNED))
#define SPECDEC_DETAIL_CORE_BEGIN inline namespace SPECDEC_DETAIL_COMPILED_ABI {
#define SPECDEC_DETAIL_CORE_END }
#else
#define SPECDEC_DETAIL_CORE_BEGIN
#define SPECDEC_DETAIL_CORE_END
#endif

// The AVX2 and AVX-512 copies, and a portable copy built with AVX or wider, need <immintrin.h>;
// a portable copy at SSE2 needs only <emmintrin.h>, which costs far less to compile (about half
// of Eigen/Core's own time, measured with scripts/compile_time.sh). A translation unit that only
// declares the core (compiled mode) needs neither.
#if SPECDEC_DETAIL_CORE_DECLARED_ONLY
#elif SPECDEC_DETAIL_X86_DISPATCH || defined(__AVX__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

/// The translation unit's own vector instruction set, as a namespace suffix.
#if defined(__AVX512F__)
#define SPECDEC_DETAIL_BASE_ISA avx512
#elif defined(__AVX2__) && defined(__FMA__)
#define SPECDEC_DETAIL_BASE_ISA avx2fma
#elif defined(__AVX2__)
#define SPECDEC_DETAIL_BASE_ISA avx2
#elif defined(__AVX__)
#define SPECDEC_DETAIL_BASE_ISA avx
#elif defined(__SSE4_1__)
#define SPECDEC_DETAIL_BASE_ISA sse41
#elif defined(__SSE2__)
#define SPECDEC_DETAIL_BASE_ISA sse2
#elif defined(__ARM_FEATURE_SVE)
#define SPECDEC_DETAIL_BASE_ISA sve
#elif defined(__ARM_NEON)
#define SPECDEC_DETAIL_BASE_ISA neon
#else
#define SPECDEC_DETAIL_BASE_ISA generic
#endif
/// Whether Eigen vectorizes in this translation unit (EIGEN_DONT_VECTORIZE changes the portable core).
#if defined(EIGEN_DONT_VECTORIZE)
#define SPECDEC_DETAIL_BASE_TAG SPECDEC_DETAIL_CAT(SPECDEC_DETAIL_BASE_ISA, _novec)
#else
#define SPECDEC_DETAIL_BASE_TAG SPECDEC_DETAIL_BASE_ISA
#endif
#define SPECDEC_DETAIL_CAT_(a, b) a##b
#define SPECDEC_DETAIL_CAT(a, b) SPECDEC_DETAIL_CAT_(a, b)
/// The namespaces of the three copies of the core, within specdec::detail.
#define SPECDEC_DETAIL_NS_PORTABLE SPECDEC_DETAIL_CAT(portable_, SPECDEC_DETAIL_BASE_TAG)
#define SPECDEC_DETAIL_NS_AVX2 SPECDEC_DETAIL_CAT(avx2_, SPECDEC_DETAIL_BASE_TAG)
#define SPECDEC_DETAIL_NS_AVX512 SPECDEC_DETAIL_CAT(avx512_, SPECDEC_DETAIL_BASE_TAG)

namespace specdec::detail {

/// The indices of the copies of the core (SPECDEC_DETAIL_ISA; the values of specdec::isa).
inline constexpr int isa_portable = 0;
inline constexpr int isa_avx2 = 1;
inline constexpr int isa_avx512 = 2;

/// Whether this build has the copy of index i and this CPU (and the OS, which must save the
/// wider registers) can run it.
[[nodiscard]] inline bool isa_index_supported(int i) noexcept {
#if SPECDEC_DETAIL_X86_DISPATCH
    switch (i) {
        case isa_portable: return true;
        case isa_avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case isa_avx512:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }
    return false;
#else
    return i == isa_portable;
#endif
}

/// The index of the best copy isa_index_supported() allows.
[[nodiscard]] inline int best_isa_index() noexcept {
    if (isa_index_supported(isa_avx512)) return isa_avx512;
    if (isa_index_supported(isa_avx2)) return isa_avx2;
    return isa_portable;
}

/// The chosen copy, as its index + 1; 0 before the first choice. One object in the whole
/// program (an inline variable), whatever flags each translation unit was compiled with.
inline std::atomic<int> chosen_isa{0};

/// The index of the copy the core runs with: the best this CPU supports (chosen on first use),
/// or the one specdec::force_isa() set.
[[nodiscard]] inline int active_isa_index() noexcept {
    const int v = chosen_isa.load(std::memory_order_relaxed);
    if (v != 0) return v - 1;
    const int i = best_isa_index();
    chosen_isa.store(i + 1, std::memory_order_relaxed);
    return i;
}

}  // namespace specdec::detail
