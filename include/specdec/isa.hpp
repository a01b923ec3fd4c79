#pragma once
/// \file
/// Run-time choice of the instruction set the hot core runs with.
///
/// Every build compiles the hot core (detail/instance_*.inc) once per instruction set it supports,
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
///
/// This header is the public API (the names of the instruction sets, the queries, force_isa());
/// which copies a build compiles, their namespaces and the stored choice are the internal
/// configuration, detail/isa_config.hpp, the only part the core itself includes.

#include <optional>
#include <string_view>

#include "detail/isa_config.hpp"
#include "error.hpp"

namespace specdec {

/// The instruction sets the hot core is compiled for.
enum class isa {
    portable,  ///< the build's own flags (Eigen's packets; SSE2 on x86-64 without -march)
    avx2,      ///< AVX2 + FMA (x86-64, GCC or Clang)
    avx512,    ///< AVX-512 F + DQ, with AVX2 + FMA (x86-64, GCC or Clang)
};
static_assert(static_cast<int>(isa::portable) == detail::isa_portable &&
                  static_cast<int>(isa::avx2) == detail::isa_avx2 &&
                  static_cast<int>(isa::avx512) == detail::isa_avx512,
              "specdec::isa names the copies of the core by their index (detail/isa_config.hpp)");

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
    return detail::isa_index_supported(static_cast<int>(i));
}

/// The best instruction set isa_supported() allows.
[[nodiscard]] inline isa best_isa() noexcept { return static_cast<isa>(detail::best_isa_index()); }

/// The instruction set the hot core runs with: the best this CPU supports (best_isa(), chosen on
/// first use), or the one force_isa() set.
[[nodiscard]] inline isa active_isa() noexcept { return static_cast<isa>(detail::active_isa_index()); }

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
