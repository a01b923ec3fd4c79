#pragma once
/// \file
/// The checks of a sampling_config (the body of specdec::validate(), which the core's checks of
/// verify()'s inputs run as well).

#include <cmath>

#include "error_helpers.hpp"
#include "vocabulary.hpp"

namespace specdec::detail {

/// Throws std::invalid_argument naming `where` and the offending field when temperature < 0 or
/// not finite (or so small that 2 / temperature overflows), top_k < 0, top_p outside (0, 1], or
/// min_p outside [0, 1] (see specdec::validate).
inline void check_sampling_config(const sampling_config& s, const char* where) {
    if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
        fail_invalid(where, ": sampling.temperature = ", s.temperature, " must be finite and >= 0");
    // Exponents are scaled by 1/T (times log2(e), or 2): it must stay a finite float.
    if (s.temperature > 0.0f && !std::isfinite(2.0f / s.temperature))
        fail_invalid(where, ": sampling.temperature = ", s.temperature,
                     " is too small: 2 / temperature overflows a float (below about 5.9e-39);"
                     " use 0 for greedy (argmax) decoding");
    if (s.top_k < 0) fail_invalid(where, ": sampling.top_k = ", s.top_k, " must be >= 0 (0 disables it)");
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
        fail_invalid(where, ": sampling.top_p = ", s.top_p, " must lie in (0, 1] (1 disables it)");
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
        fail_invalid(where, ": sampling.min_p = ", s.min_p, " must lie in [0, 1] (0 disables it)");
}

}  // namespace specdec::detail
