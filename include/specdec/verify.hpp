#pragma once
/// \file
/// The hot core: modified rejection sampling of a draft block against the target's
/// γ+1 logit columns, and resampling from the residual distribution
/// (Leviathan et al. 2023, Alg. 1 and Sec. 2.3; Chen et al. 2023, Alg. 2 with p and q swapped).

#include <Eigen/Core>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <random>
#include <span>

#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "types.hpp"

namespace specdec {

/// Tag for draft blocks without distributions (point-mass drafts: q_i = δ(x_i)).
struct point_mass_t {
    explicit constexpr point_mass_t() = default;
};
/// The point-mass tag value: `verify(logits, tokens, specdec::point_mass, ...)`.
inline constexpr point_mass_t point_mass{};

/// Allowed |Σ q − 1| for a draft distribution column; larger deviations are an error.
inline constexpr double draft_probability_tolerance = 1e-3;

/// A residual max(0, p − q) whose total mass is at most this is treated as zero "up to
/// rounding" and resampling falls back to p. Such a residual can only be reached through
/// rounding (p ≈ q), whose effect on the output is of the same order.
inline constexpr double residual_mass_floor = 1e-6;

/// Settings of one verification beyond the sampling settings.
struct verify_options {
    /// Lenience l in (0, 1] (Leviathan et al. 2023, App. A.5): accept x with probability
    /// min(1, p(x) / (l·q(x))) and, after a rejection, resample from
    /// norm(max(0, p − l·q)). l = 1, the default, is exact speculative sampling.
    /// **Any l < 1 changes the output distribution**: it is no longer the target's. What
    /// remains guaranteed is that no token is emitted with probability above p(x)/l.
    /// At temperature 0 lenience has no effect (p and q are point masses).
    float lenience = 1.0f;
    /// Check every draft distribution column that is read (finite, non-negative, sums to
    /// 1 within draft_probability_tolerance). Turn off only for distributions the caller
    /// produced with standardize() itself.
    bool check_draft_distributions = true;
};

/// Outcome of one verification.
struct verify_result {
    std::size_t accepted = 0;  ///< n: draft tokens x_1..x_n accepted (0 <= n <= γ)
    token_id next_token = 0;   ///< the token that follows them: a correction after a rejection, or a bonus token
};

/// Reusable buffers for verify(); keep one per decoding loop so that verification
/// allocates nothing after the first call with a given vocabulary size.
struct verify_workspace {
    Eigen::VectorXf p;         ///< standardized target distribution of the row being tested
    Eigen::VectorXf residual;  ///< max(0, p − l·q) after a rejection
    sampling_workspace sampling;
};

namespace detail {

inline void check_draft_column(const Eigen::Ref<const Eigen::VectorXf>& q, std::size_t i, const char* where) {
    double s = 0.0;
    for (Eigen::Index k = 0; k < q.size(); ++k) {
        const float v = q[k];
        if (!(v >= 0.0f) || !std::isfinite(v))
            fail_invalid(where, ": draft_probs(", k, ", ", i, ") = ", v, " is not a probability (negative, NaN or Inf)");
        s += v;
    }
    if (std::abs(s - 1.0) > draft_probability_tolerance)
        fail_invalid(where, ": draft distribution column ", i, " sums to ", s, ", not 1");
}

inline void check_verify_inputs(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                                std::span<const token_id> draft_tokens, const Eigen::MatrixXf::Index* q_rows,
                                const Eigen::MatrixXf::Index* q_cols, const sampling_config& sampling,
                                const verify_options& opts, const char* where) {
    const auto n = static_cast<Eigen::Index>(draft_tokens.size());
    const Eigen::Index vocab = target_logits.rows();
    if (vocab <= 0) fail_invalid(where, ": target_logits has no rows (vocabulary size 0)");
    if (target_logits.cols() != n + 1)
        fail_invalid(where, ": target_logits has ", target_logits.cols(),
                     " columns; expected draft_tokens.size() + 1 = ", n + 1, " (one per position, column-major)");
    if (q_rows != nullptr && (*q_rows != vocab || *q_cols != n))
        fail_invalid(where, ": draft_probs is ", *q_rows, " x ", *q_cols, "; expected vocab_size x draft length = ",
                     vocab, " x ", n);
    validate(sampling, where);
    if (!(opts.lenience > 0.0f && opts.lenience <= 1.0f))
        fail_invalid(where, ": lenience = ", opts.lenience, " must lie in (0, 1] (1 is exact)");
    for (std::size_t i = 0; i < draft_tokens.size(); ++i)
        if (draft_tokens[i] < 0 || draft_tokens[i] >= vocab)
            fail_invalid(where, ": draft_tokens[", i, "] = ", draft_tokens[i], " is out of range [0, ", vocab, ")");
}

/// Token verification. QCol(i) yields draft column i (only called when HasQ).
template <bool HasQ, class QRef, class G>
verify_result verify_tokens(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                            std::span<const token_id> draft_tokens, const QRef& q, const sampling_config& sampling,
                            G& rng, verify_workspace& ws, const verify_options& opts, const char* where) {
    const Eigen::Index vocab = target_logits.rows();
    const std::size_t n = draft_tokens.size();
    const double lenience = opts.lenience;
    ws.p.resize(vocab);

    // Leviathan et al. Alg. 1: test x_1..x_γ left to right with r_i ~ U(0, 1); the first
    // failure ends the block. Rows after it are never standardized.
    for (std::size_t i = 0; i < n; ++i) {
        standardize(target_logits.col(static_cast<Eigen::Index>(i)), sampling, ws.p, ws.sampling, where);
        const token_id x = draft_tokens[i];
        double qx = 1.0;
        if constexpr (HasQ) {
            if (opts.check_draft_distributions) check_draft_column(q.col(static_cast<Eigen::Index>(i)), i, where);
            qx = q(x, static_cast<Eigen::Index>(i));
        }
        const double px = ws.p[x];
        const double r = uniform01(rng);
        // Accept iff r < p(x) / (l q(x)), i.e. with probability min(1, p/(l q)) (App. A.5
        // with l = 1 is Alg. 1). A token the drafter gave q(x) = 0 is rejected.
        if (qx > 0.0 && r * lenience * qx < px) continue;

        // Rejected at position i: resample from p' = norm(max(0, p_i − l q_i)) (Sec. 2.3).
        if constexpr (HasQ) {
            ws.residual = (ws.p.array() - static_cast<float>(lenience) * q.col(static_cast<Eigen::Index>(i)).array())
                              .max(0.0f)
                              .matrix();
        } else {
            // Point mass at x: p minus l at x, clipped; for l = 1, p with x removed.
            ws.residual = ws.p;
            ws.residual[x] = std::max(0.0f, ws.p[x] - static_cast<float>(lenience));
        }
        double mass = sum_in_double(ws.residual);
        const double u = uniform01(rng);
        if (!(mass > residual_mass_floor)) {
            // p and q agree up to rounding: the residual carries no information; use p.
            return {i, static_cast<token_id>(sample_from_weights(ws.p, sum_in_double(ws.p), u))};
        }
        return {i, static_cast<token_id>(sample_from_weights(ws.residual, mass, u))};
    }
    // Every draft accepted: the bonus token comes from p_{γ+1}.
    standardize(target_logits.col(static_cast<Eigen::Index>(n)), sampling, ws.p, ws.sampling, where);
    const double u = uniform01(rng);
    return {n, static_cast<token_id>(sample_from_weights(ws.p, sum_in_double(ws.p), u))};
}

}  // namespace detail

/// Verifies a draft block against the target (modified rejection sampling).
///
/// Accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to right, stopping at the
/// first rejection n; then samples one token from norm(max(0, p_{n+1} − q_{n+1})), or from
/// p_{γ+1} when all γ were accepted (Leviathan et al. 2023, Alg. 1; proof of exactness in
/// App. A.1). p_i is the standardized target distribution of column i of target_logits.
///
/// Randomness: one uniform per tested draft token, then one for the emitted token, all from
/// `rng` through uniform01, in that order.
///
/// \param target_logits V x (γ+1) target logits; column j follows context + x_1..x_j.
/// \param draft_tokens  x_1..x_γ (γ may be 0: then one token is sampled from p_1).
/// \param draft_probs   V x γ; column i is q_i, the distribution x_i was sampled from,
///                      already standardized with the same `sampling` (see standardize()).
/// \param sampling      standardized-sampling settings applied to the target's logits.
/// \param rng           the caller's generator (any std::uniform_random_bit_generator).
/// \param ws            reusable buffers.
/// \returns the number of accepted draft tokens and the token that follows them.
/// \throws std::invalid_argument on shape mismatch, out-of-range draft tokens, invalid
///         sampling settings or lenience, NaN/+Inf/all -Inf logits, or (when checked) draft
///         columns that are not probability distributions.
///
/// \code
/// specdec::verify_workspace ws;
/// auto r = specdec::verify(target_logits, draft_tokens, draft_probs, {.temperature = 0.8f}, rng, ws);
/// // append draft_tokens[0..r.accepted) and r.next_token to the sequence
/// \endcode
template <random_generator G>
verify_result verify(const Eigen::Ref<const Eigen::MatrixXf>& target_logits, std::span<const token_id> draft_tokens,
                     const Eigen::Ref<const Eigen::MatrixXf>& draft_probs, const sampling_config& sampling, G&& rng,
                     verify_workspace& ws, const verify_options& opts = {}) {
    constexpr const char* where = "specdec::verify";
    const Eigen::Index qr = draft_probs.rows(), qc = draft_probs.cols();
    detail::check_verify_inputs(target_logits, draft_tokens, &qr, &qc, sampling, opts, where);
    return detail::verify_tokens<true>(target_logits, draft_tokens, draft_probs, sampling, rng, ws, opts, where);
}

/// Verifies point-mass drafts (no draft distributions, e.g. n-gram or prompt-lookup
/// drafters): q_i = δ(x_i), so x_i is accepted with probability p_i(x_i) and the residual
/// after a rejection is p_i with x_i removed. Otherwise as the overload above.
template <random_generator G>
verify_result verify(const Eigen::Ref<const Eigen::MatrixXf>& target_logits, std::span<const token_id> draft_tokens,
                     point_mass_t, const sampling_config& sampling, G&& rng, verify_workspace& ws,
                     const verify_options& opts = {}) {
    constexpr const char* where = "specdec::verify";
    detail::check_verify_inputs(target_logits, draft_tokens, nullptr, nullptr, sampling, opts, where);
    const int unused = 0;
    return detail::verify_tokens<false>(target_logits, draft_tokens, unused, sampling, rng, ws, opts, where);
}

}  // namespace specdec
