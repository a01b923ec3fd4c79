#pragma once
/// \file
/// Standardized sampling (Leviathan et al. 2023, Sec. 2.2): temperature, top-k, top-p
/// and min-p turn logits into one probability distribution, and every sampling method
/// becomes plain sampling from that distribution. Target and draft logits go through
/// the same function, so the draft token is sampled from exactly the q that
/// verification later uses.

///
/// The work runs in the hot core (specdec/detail/), compiled once per instruction set and chosen
/// at run time (see specdec/isa.hpp: active_isa(), force_isa()).

#include <Eigen/Core>

#include <cmath>
#include <limits>

#include "detail/buffers.hpp"
#include "detail/sampling_checks.hpp"
#include "detail/sampling_core.hpp"
#include "error.hpp"
#include "isa.hpp"
#include "types.hpp"

namespace specdec {

/// Checks a sampling_config.
/// \throws std::invalid_argument naming `where` and the offending field when
///         temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], or
///         min_p outside [0, 1].
inline void validate(const sampling_config& s, const char* where = "specdec::validate") {
    detail::check_sampling_config(s, where);
}

namespace detail {

/// Draws are returned as token_id: a row longer than a token_id can index is refused.
inline void check_token_count(Eigen::Index size, const char* where, const char* name) {
    if (size > static_cast<Eigen::Index>(std::numeric_limits<token_id>::max()) + 1)
        fail_invalid(where, ": ", name, " has ", size, " entries, more than a token_id can index");
}

/// The O(1) checks of every public sampling call: valid settings, and an output view of the
/// logits' size (an Eigen::Ref is written in place and cannot be resized).
inline void check_sampling_call(Eigen::Index logits_size, Eigen::Index out_size, const sampling_config& s,
                                const char* where) {
    validate(s, where);
    check_token_count(logits_size, where, "logits");
    if (out_size != logits_size)
        fail_invalid(where, ": out has ", out_size, " entries but logits has ", logits_size,
                     "; size out to match first (it is written in place, not resized)");
}

}  // namespace detail

/// A token drawn from weights w, with the factor that turns them into the distribution it was
/// drawn from: q = scale · w (what standardize_weights_and_sample() returns).
struct token_draw {
    token_id token = 0;  ///< the token drawn
    float scale = 1.0f;  ///< q = scale · w; 1 when w is already the distribution
};

/// Scratch buffers for the truncating filters and the blockwise draws; reuse one across calls
/// so that sampling allocates nothing after warm-up. Its contents are private.
class sampling_workspace {
    friend struct detail::buffers_access;
    detail::sampling_buffers buffers_;
};

/// Turns one row of logits into the standardized distribution it is sampled from.
///
/// \param logits  raw logits, one per token (any contiguous float vector or column)
/// \param s       sampling settings (checked as validate() does)
/// \param out     receives the probabilities (sums to 1); must already have logits.size()
///                entries: a view is written in place, not resized
/// \param ws      scratch for top-k / top-p
/// \param where   function name used in error messages
/// \throws std::invalid_argument for invalid settings, an `out` of another size, or logits
///         that contain NaN or +Inf, or are all -Inf.
inline void standardize(const Eigen::Ref<const Eigen::VectorXf>& logits, const sampling_config& s,
                        Eigen::Ref<Eigen::VectorXf> out, sampling_workspace& ws,
                        const char* where = "specdec::standardize") {
    detail::check_sampling_call(logits.size(), out.size(), s, where);
    detail::run_standardize(logits, s, out, detail::buffers_access::of(ws), where);
}

/// Draws a token from non-negative weights (one per token) by inversion with one uniform u in
/// [0, 1): the first index whose running sum exceeds u * Σw. Never returns a token of weight 0.
/// The weights need not be normalized. Blocked: one vectorized pass for block sums, then a
/// scan of one block.
/// \pre the weights are non-negative (not checked: it would take another pass).
/// \returns the token drawn, in [0, w.size()).
/// \throws std::invalid_argument when the weights sum to zero or to a value that is not
///         finite (all zero, an empty vector, NaN or Inf among them), or there are more of them
///         than a token_id can index.
[[nodiscard]] inline token_id sample_from_weights(const Eigen::Ref<const Eigen::VectorXf>& w, double u,
                                                  sampling_workspace& ws,
                                                  const char* where = "specdec::sample_from_weights") {
    detail::check_token_count(w.size(), where, "w");
    return static_cast<token_id>(detail::run_sample_from_weights(w, u, detail::buffers_access::of(ws), where));
}

/// standardize() and sample_from_weights() in one: writes the standardized distribution to
/// `out` and returns a draw from it with the uniform u (the first token whose running
/// probability exceeds u). Without truncation (the common case for a drafter) the row is read
/// once, blockwise: per 2048-float block a vectorized max, then the exps, written to `out`
/// relative to the running maximum, with the block's sum; one scaling pass then normalizes
/// `out`, and the draw picks a block by its mass and scans that block only (groups of 16
/// skipped by their sums). The same distribution as the two calls, up to float rounding, with
/// two passes fewer over the row; the draw may differ from theirs only where rounding moves a
/// block boundary. Truncating settings and temperature 0 take the two calls' path.
/// \returns the token drawn.
/// \throws std::invalid_argument as standardize(), and for a row longer than a token_id can
///         index.
[[nodiscard]] inline token_id standardize_and_sample(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                                     const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
                                                     double u, sampling_workspace& ws,
                                                     const char* where = "specdec::standardize_and_sample") {
    detail::check_sampling_call(logits.size(), out.size(), s, where);
    return static_cast<token_id>(
        detail::run_standardize_and_sample(logits, s, out, u, detail::buffers_access::of(ws), where));
}

/// standardize_and_sample without its normalizing pass: writes weights w to `out` with the
/// standardized distribution q = scale · w, and returns a draw from q with the uniform u
/// together with that scale. This is what a drafter needs for verification, which takes the
/// scale with the weights (see the verify() overload with draft_scales, and
/// draft_block::scales), so the row is read twice (a vectorized maximum, then the exps,
/// written, with their block sums) and written once, never rescaled. Without truncation and
/// at temperature > 0, w = exp((z − max z) / T) (the largest weight is 1 up to rounding, so
/// the scale lies in about [1 / V, 1]); truncating settings and temperature 0 write the
/// distribution itself (scale 1), as standardize_and_sample. The draw is the first index whose
/// running weight exceeds u · Σw.
/// \returns the token drawn and the scale of the weights (see token_draw).
/// \throws std::invalid_argument as standardize(), and for a row longer than a token_id can
///         index.
[[nodiscard]] inline token_draw standardize_weights_and_sample(
    const Eigen::Ref<const Eigen::VectorXf>& logits, const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
    double u, sampling_workspace& ws, const char* where = "specdec::standardize_weights_and_sample") {
    detail::check_sampling_call(logits.size(), out.size(), s, where);
    const auto d =
        detail::run_standardize_weights_and_sample(logits, s, out, u, detail::buffers_access::of(ws), where);
    return {static_cast<token_id>(d.index), d.scale};
}

}  // namespace specdec
