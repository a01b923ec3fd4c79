#pragma once
/// \file
/// Run-time choice of the instruction set the hot core runs with.
///
/// Every build compiles the hot core (detail/instance_*.hpp) once per instruction set it supports,
/// each copy in a namespace of its own: the portable one, compiled with the translation unit's
/// own flags, and, with GCC or Clang on x86-64, one for AVX2 + FMA and one for AVX-512
/// (F + DQ), compiled with function-level target attributes whatever the flags. The first call
/// that needs the core picks the best copy this CPU can run, and every later call uses it;
/// force_isa() changes it. Each namespace also carries a tag of the
/// translation unit's own instruction-set flags (`SPECDEC_DETAIL_BASE_TAG`), so translation
/// units compiled with different -march flags never share a function body: which copy the
/// linker keeps cannot change a result or put an instruction the CPU lacks into another path.
///
/// Define SPECDEC_NO_DISPATCH before including specdec to compile the portable copy only (other
/// compilers, MSVC included, get only that one).

#include <atomic>
#include <optional>
#include <string_view>

#include "error.hpp"

#if !defined(SPECDEC_NO_DISPATCH) && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
/// 1 when the AVX2 and AVX-512 copies of the core are compiled (GCC or Clang on x86-64).
#define SPECDEC_DETAIL_X86_DISPATCH 1
#else
#define SPECDEC_DETAIL_X86_DISPATCH 0
#endif
// The AVX2 and AVX-512 copies, and a portable copy built with AVX or wider, need <immintrin.h>;
// a portable copy at SSE2 needs only <emmintrin.h>, which costs far less to compile (about half
// of Eigen/Core's own time, measured with scripts/compile_time.sh).
#if SPECDEC_DETAIL_X86_DISPATCH || defined(__AVX__)
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

namespace specdec {

/// The instruction sets the hot core is compiled for.
enum class isa {
    portable,  ///< the build's own flags (Eigen's packets; SSE2 on x86-64 without -march)
    avx2,      ///< AVX2 + FMA (x86-64, GCC or Clang)
    avx512,    ///< AVX-512 F + DQ, with AVX2 + FMA (x86-64, GCC or Clang)
};

/// The name of an instruction set: "portable", "avx2" or "avx512".
[[nodiscard]] constexpr const char* isa_name(isa i) noexcept {
    switch (i) {
        case isa::avx2: return "avx2";
        case isa::avx512: return "avx512";
        default: return "portable";
    }
}

/// The instruction set named `name` ("portable", "avx2", "avx512"), or none.
[[nodiscard]] constexpr std::optional<isa> parse_isa(std::string_view name) noexcept {
    if (name == "portable") return isa::portable;
    if (name == "avx2") return isa::avx2;
    if (name == "avx512") return isa::avx512;
    return std::nullopt;
}

/// Whether this build has a copy of the core for `i` and this CPU can run it: always for
/// portable; for avx2 and avx512, with GCC or Clang on x86-64 (and SPECDEC_NO_DISPATCH
/// undefined), when the CPU (and the OS, which must save the wider registers) supports them.
[[nodiscard]] inline bool isa_supported(isa i) noexcept {
#if SPECDEC_DETAIL_X86_DISPATCH
    switch (i) {
        case isa::portable: return true;
        case isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case isa::avx512:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }
    return false;
#else
    return i == isa::portable;
#endif
}

/// The best instruction set isa_supported() allows.
[[nodiscard]] inline isa best_isa() noexcept {
    if (isa_supported(isa::avx512)) return isa::avx512;
    if (isa_supported(isa::avx2)) return isa::avx2;
    return isa::portable;
}

namespace detail {

/// The chosen instruction set, as int(isa) + 1; 0 before the first choice. One object in the
/// whole program (an inline variable), whatever flags each translation unit was compiled with.
inline std::atomic<int> chosen_isa{0};

}  // namespace detail

/// The instruction set the hot core runs with: the best this CPU supports (best_isa(), chosen on
/// first use), or the one force_isa() set.
[[nodiscard]] inline isa active_isa() noexcept {
    const int v = detail::chosen_isa.load(std::memory_order_relaxed);
    if (v != 0) return static_cast<isa>(v - 1);
    const isa i = best_isa();
    detail::chosen_isa.store(static_cast<int>(i) + 1, std::memory_order_relaxed);
    return i;
}

/// Pins the hot core to `i` for every later call, in every thread (for tests, and for programs
/// that must run one path everywhere); returns the previous choice. Results differ between
/// paths only in float rounding, never in distribution. Not meant to be called while another
/// thread is inside a specdec call (that call may run either path).
/// \throws std::invalid_argument when this build has no copy for `i` or the CPU cannot run it.
inline isa force_isa(isa i) {
    if (!isa_supported(i))
        detail::fail_invalid("specdec::force_isa: ", isa_name(i), " is not available here (best: ",
                             isa_name(best_isa()), ")");
    const int old = detail::chosen_isa.exchange(static_cast<int>(i) + 1, std::memory_order_relaxed);
    return old == 0 ? best_isa() : static_cast<isa>(old - 1);
}

}  // namespace specdec
