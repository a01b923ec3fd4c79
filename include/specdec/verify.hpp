#pragma once
/// \file
/// The hot core: verification of a draft block against the target's γ+1 logit columns,
/// and resampling from the residual distribution. Two schemes:
///  - token verification: modified rejection sampling, token by token (Leviathan et al.
///    2023, Alg. 1 and Sec. 2.3; Chen et al. 2023, Alg. 2 with p and q swapped);
///  - block verification: the draft block is verified jointly (Sun, Mendlovic, Leviathan,
///    Aharoni, Ro, Beirami & Suresh 2024, "Block Verification Accelerates Speculative
///    Decoding", Alg. 2), also exact, never fewer expected tokens, and the default.
///
/// Cost model. Each row the algorithm must normalize is read in one blockwise pass (a
/// vectorized max and exp-sum per L1-sized block) that yields p(x) for the draft token
/// without writing the distribution anywhere; at temperature 0 a row costs one max pass.
/// A full distribution is written only for the one token that is sampled at the end.
/// Token verification never touches rows after the first rejection.

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <random>
#include <span>
#include <vector>

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

/// How a draft block is verified.
enum class verification_scheme {
    /// Token by token: accept x_i with probability min(1, p_i(x_i)/q_i(x_i)) until the
    /// first rejection (Leviathan et al. 2023, Alg. 1).
    token,
    /// Jointly: accept the longest prefix that a single draw over the whole block allows
    /// (Sun et al. 2024). Exact, and never fewer expected accepted tokens than token
    /// verification; for γ = 1 identical to it, draw for draw. The default.
    block,
};

/// Settings of one verification beyond the sampling settings.
struct verify_options {
    /// Lenience l in (0, 1] (Leviathan et al. 2023, App. A.5): accept x with probability
    /// min(1, p(x) / (l·q(x))) and, after a rejection, resample from
    /// norm(max(0, p − l·q)). l = 1, the default, is exact speculative sampling.
    /// **Any l < 1 changes the output distribution**: it is no longer the target's. What
    /// remains guaranteed is that no token is emitted with probability above p(x)/l.
    /// At temperature 0 lenience has no effect (p and q are point masses). Lenience is
    /// defined for token verification only: l < 1 with block verification is an error.
    float lenience = 1.0f;
    /// Check every draft distribution column whose token is tested: non-negative, finite,
    /// summing to 1 within draft_probability_tolerance. Two vectorized passes over each such
    /// column, cheap next to the exp pass over the target row; turn off only for
    /// distributions the caller produced with standardize() itself.
    bool check_draft_distributions = true;
    /// Token or block verification (block is the default).
    verification_scheme scheme = verification_scheme::block;
};

/// Outcome of one verification.
struct verify_result {
    std::size_t accepted = 0;  ///< n: draft tokens x_1..x_n accepted (0 <= n <= γ)
    token_id next_token = 0;   ///< the token that follows them: a correction after a rejection, or a bonus token
};

/// Reusable buffers for verify(); keep one per decoding loop so that verification
/// allocates nothing after the first call with a given vocabulary size.
struct verify_workspace {
    Eigen::VectorXf p;         ///< a materialized target row (truncating sampling only)
    Eigen::VectorXf weights;   ///< weights of the final draw (residual or p)
    sampling_workspace sampling;
    std::vector<double> eta;   ///< block verification: η_1..η_γ
};

namespace detail {

/// A standardized target row prepared for acceptance tests: enough to give p(x) for any x
/// without writing the distribution out.
struct target_row {
    enum class kind { greedy, plain, truncated } mode;
    float inv_t = 1.0f;
    Eigen::Index argmax = 0;  // greedy
    float max = 0.0f;         // plain: p(x) = exp((z_x − max) inv_t) / sum
    double sum = 1.0;
};

/// Normalizes column z of the target (one pass; see the file comment). For truncating
/// sampling the row is materialized in ws.p.
inline target_row prepare_row(const Eigen::Ref<const Eigen::VectorXf>& z, const sampling_config& s,
                              verify_workspace& ws, const char* where) {
    target_row r{};
    if (s.temperature == 0.0f) {
        r.mode = target_row::kind::greedy;
        r.argmax = checked_argmax(z, where).index;
    } else if (truncates(s)) {
        r.mode = target_row::kind::truncated;
        ws.p.resize(z.size());
        standardize(z, s, ws.p, ws.sampling, where);
    } else {
        r.mode = target_row::kind::plain;
        r.inv_t = 1.0f / s.temperature;
        const row_normalizer n = checked_normalizer(z, r.inv_t, where);
        r.max = n.max;
        r.sum = n.sum;
    }
    return r;
}

/// p(x) for the prepared row.
inline double prob_of(const target_row& r, const Eigen::Ref<const Eigen::VectorXf>& z, const verify_workspace& ws,
                      Eigen::Index x) {
    switch (r.mode) {
        case target_row::kind::greedy: return x == r.argmax ? 1.0 : 0.0;
        case target_row::kind::truncated: return ws.p[x];
        case target_row::kind::plain: break;
    }
    return std::exp(static_cast<double>(z[x] - r.max) * r.inv_t) / r.sum;
}

/// Writes a * p into `out`, block by block, calling `combine(out_block, start, len)` on each
/// block right after it is written (while it is in L1).
template <class Combine>
void write_scaled_p(const target_row& r, const Eigen::Ref<const Eigen::VectorXf>& z, const verify_workspace& ws,
                    float a, Eigen::VectorXf& out, Combine&& combine) {
    const Eigen::Index n = z.size();
    out.resize(n);
    const float scale = static_cast<float>(a / r.sum);
    for (Eigen::Index start = 0; start < n; start += block_size) {
        const Eigen::Index len = std::min(block_size, n - start);
        auto o = out.segment(start, len);
        switch (r.mode) {
            case target_row::kind::greedy:
                o.setZero();
                if (r.argmax >= start && r.argmax < start + len) o[r.argmax - start] = a;
                break;
            case target_row::kind::truncated: o = ws.p.segment(start, len) * a; break;
            case target_row::kind::plain:
                o = (((z.segment(start, len).array() - r.max) * r.inv_t).exp() * scale).matrix();
                break;
        }
        combine(o, start, len);
    }
}

/// Draws the emitted token from p itself (after full acceptance, or as the fallback of an
/// empty residual).
inline token_id sample_target(const target_row& r, const Eigen::Ref<const Eigen::VectorXf>& z, verify_workspace& ws,
                              double u) {
    switch (r.mode) {
        case target_row::kind::greedy: return static_cast<token_id>(r.argmax);
        case target_row::kind::truncated: return static_cast<token_id>(sample_from_weights(ws.p, u, ws.sampling));
        case target_row::kind::plain: break;
    }
    // Unnormalized weights exp((z − max) inv_t) suffice for inversion.
    target_row unit = r;
    unit.sum = 1.0;
    std::vector<double>& sums = ws.sampling.block_sums;
    sums.clear();
    double total = 0.0;
    write_scaled_p(unit, z, ws, 1.0f, ws.weights, [&](const auto& block, Eigen::Index, Eigen::Index) {
        const double bs = block.sum();
        sums.push_back(bs);
        total += bs;
    });
    return static_cast<token_id>(sample_with_block_sums(ws.weights, sums, total, u));
}

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

/// q_i(x) of a tested token; with `check`, column i is first checked to be a distribution.
inline double draft_prob(const Eigen::Ref<const Eigen::MatrixXf>* q, std::size_t i, token_id x, bool check,
                         const char* where) {
    if (q == nullptr) return 1.0;  // point mass at x
    const auto col = q->col(static_cast<Eigen::Index>(i));
    if (check) {
        // The sum also catches +Inf; PropagateNaN makes the minimum catch NaN.
        const float lowest = col.minCoeff<Eigen::PropagateNaN>();
        const double sum = col.sum();
        if (!(lowest >= 0.0f) || !(std::abs(sum - 1.0) <= draft_probability_tolerance))
            check_draft_column(col, i, where);  // throws with the details
    }
    return col[x];
}

/// Draws the emitted token from norm(max(0, a·p − b·q)) for column i (Sec. 2.3 with a = 1,
/// b = l; Sun et al.'s residual with a = w_τ, b = 1), or from p when that residual is empty.
/// For point-mass drafts q = δ(x).
inline token_id sample_residual(const target_row& r, const Eigen::Ref<const Eigen::VectorXf>& z,
                                const Eigen::Ref<const Eigen::MatrixXf>* q, std::size_t i, token_id x, float a,
                                float b, verify_workspace& ws, double u) {
    if (r.mode == target_row::kind::greedy) {
        // p = δ(argmax): the residual is a multiple of δ(argmax) or empty, and the fallback is
        // p as well: the argmax either way.
        return static_cast<token_id>(r.argmax);
    }
    std::vector<double>& sums = ws.sampling.block_sums;
    sums.clear();
    double total = 0.0;
    const auto col = static_cast<Eigen::Index>(i);
    write_scaled_p(r, z, ws, a, ws.weights, [&](auto& block, Eigen::Index start, Eigen::Index len) {
        if (q != nullptr) {
            const auto qb = q->col(col).segment(start, len);
            block = (block.array() - b * qb.array()).max(0.0f).matrix();
        } else if (x >= start && x < start + len) {
            block[x - start] = std::max(0.0f, block[x - start] - b);
        }
        const double bs = block.sum();
        sums.push_back(bs);
        total += bs;
    });
    if (!(total > residual_mass_floor)) return sample_target(r, z, ws, u);
    return static_cast<token_id>(sample_with_block_sums(ws.weights, sums, total, u));
}

inline void check_verify_inputs(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                                std::span<const token_id> draft_tokens, const Eigen::Index* q_rows,
                                const Eigen::Index* q_cols, const sampling_config& sampling,
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
    if (opts.lenience != 1.0f && opts.scheme == verification_scheme::block)
        fail_invalid(where, ": lenience = ", opts.lenience,
                     " is defined for token verification only; set scheme = verification_scheme::token");
    for (std::size_t i = 0; i < draft_tokens.size(); ++i)
        if (draft_tokens[i] < 0 || draft_tokens[i] >= vocab)
            fail_invalid(where, ": draft_tokens[", i, "] = ", draft_tokens[i], " is out of range [0, ", vocab, ")");
}

/// Token verification (Leviathan et al. 2023, Alg. 1). q == nullptr: point-mass drafts.
template <class G>
verify_result verify_tokens(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                            std::span<const token_id> draft_tokens, const Eigen::Ref<const Eigen::MatrixXf>* q,
                            const sampling_config& sampling, G& rng, verify_workspace& ws, const verify_options& opts,
                            const char* where) {
    const std::size_t n = draft_tokens.size();
    const double lenience = opts.lenience;
    // Test x_1..x_γ left to right with r_i ~ U(0, 1); the first failure ends the block.
    // Rows after it are never read.
    for (std::size_t i = 0; i < n; ++i) {
        const auto z = target_logits.col(static_cast<Eigen::Index>(i));
        const target_row row = prepare_row(z, sampling, ws, where);
        const token_id x = draft_tokens[i];
        const double qx = draft_prob(q, i, x, opts.check_draft_distributions, where);
        const double px = prob_of(row, z, ws, x);
        const double r = uniform01(rng);
        // Accept iff r < p(x) / (l q(x)), i.e. with probability min(1, p/(l q)) (App. A.5
        // with l = 1 is Alg. 1). A token the drafter gave q(x) = 0 is rejected.
        if (qx > 0.0 && r * lenience * qx < px) continue;
        // Rejected at position i: resample from p' = norm(max(0, p_i − l q_i)) (Sec. 2.3).
        return {i, sample_residual(row, z, q, i, x, 1.0f, opts.lenience, ws, uniform01(rng))};
    }
    // Every draft accepted: the bonus token comes from p_{γ+1}.
    const auto z = target_logits.col(static_cast<Eigen::Index>(n));
    const target_row row = prepare_row(z, sampling, ws, where);
    return {n, sample_target(row, z, ws, uniform01(rng))};
}

/// Σ_x max(0, w p(x) − q(x)) for a prepared row and draft column i (or point mass at x).
inline double residual_mass(const target_row& r, const Eigen::Ref<const Eigen::VectorXf>& z,
                            const Eigen::Ref<const Eigen::MatrixXf>* q, std::size_t i, token_id x, double w,
                            verify_workspace& ws) {
    if (q == nullptr) {
        // q = δ(x): w (1 − p(x)) + max(0, w p(x) − 1), from p(x) alone.
        const double px = prob_of(r, z, ws, x);
        return w * (1.0 - px) + std::max(0.0, w * px - 1.0);
    }
    const auto col = q->col(static_cast<Eigen::Index>(i));
    // p = δ(a) at temperature 0: max(0, w − q(a)); the other terms are max(0, −q) = 0.
    if (r.mode == target_row::kind::greedy) return std::max(0.0, w - static_cast<double>(col[r.argmax]));
    double total = 0.0;
    write_scaled_p(r, z, ws, static_cast<float>(w), ws.weights, [&](const auto& block, Eigen::Index start, Eigen::Index len) {
        total += (block.array() - col.segment(start, len).array()).max(0.0f).sum();
    });
    return total;
}

/// Block verification (Sun et al. 2024, Alg. 2), in Leviathan's notation:
///   w_0 = 1; w_i = min(1, w_{i−1} p_i(x_i) / q_i(x_i));
///   h_i = R_i / (R_i + 1 − w_i) with R_i = Σ_x max(0, w_i p_{i+1}(x) − q_{i+1}(x)) for i < γ,
///   h_γ = w_γ; τ = the LAST i with η_i < h_i (0 if none);
///   accept x_1..x_τ, then sample from p_{γ+1} if τ = γ, else from norm(max(0, w_τ p_{τ+1} − q_{τ+1})).
template <class G>
verify_result verify_block(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                           std::span<const token_id> draft_tokens, const Eigen::Ref<const Eigen::MatrixXf>* q,
                           const sampling_config& sampling, G& rng, verify_workspace& ws, const verify_options& opts,
                           const char* where) {
    const std::size_t n = draft_tokens.size();
    // Every token of the block is tested, so every column is checked (when asked) up front.
    if (q != nullptr && opts.check_draft_distributions)
        for (std::size_t i = 0; i < n; ++i) draft_prob(q, i, draft_tokens[i], true, where);
    ws.eta.resize(n);
    for (double& e : ws.eta) e = uniform01(rng);
    std::size_t tau = 0;
    double w_tau = 1.0, w = 1.0;
    auto z_of = [&](std::size_t i) { return target_logits.col(static_cast<Eigen::Index>(i)); };
    target_row row = prepare_row(z_of(0), sampling, ws, where);  // row i (0-based) = p_{i+1}
    for (std::size_t i = 0; i < n; ++i) {
        const token_id x = draft_tokens[i];
        const double qx = draft_prob(q, i, x, false, where);
        const double px = prob_of(row, z_of(i), ws, x);
        const double w_prev = w;
        // A token the drafter gave q(x) = 0 ends every longer prefix (w = 0).
        w = qx > 0.0 ? std::min(1.0, w_prev * px / qx) : 0.0;
        bool hit;
        if (i + 1 < n) {
            row = prepare_row(z_of(i + 1), sampling, ws, where);
            const double big_r = w > 0.0 ? residual_mass(row, z_of(i + 1), q, i + 1, draft_tokens[i + 1], w, ws) : 0.0;
            const double h = big_r > 0.0 ? big_r / (big_r + 1.0 - w) : 0.0;
            hit = ws.eta[i] < h;
        } else {
            // h_γ = w_γ = min(1, w_{γ−1} p/q), tested as η q < w_{γ−1} p so that γ = 1 is
            // token verification draw for draw.
            hit = qx > 0.0 && ws.eta[i] * qx < w_prev * px;
        }
        if (hit) {
            tau = i + 1;
            w_tau = w;
        }
    }
    const double u = uniform01(rng);
    if (tau == n) {
        const auto z = z_of(n);
        const target_row last = prepare_row(z, sampling, ws, where);
        return {n, sample_target(last, z, ws, u)};
    }
    const auto z = z_of(tau);
    const target_row r = prepare_row(z, sampling, ws, where);
    return {tau, sample_residual(r, z, q, tau, draft_tokens[tau], static_cast<float>(w_tau), 1.0f, ws, u)};
}

template <class G>
verify_result dispatch_verify(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                              std::span<const token_id> draft_tokens, const Eigen::Ref<const Eigen::MatrixXf>* q,
                              const sampling_config& sampling, G& rng, verify_workspace& ws, const verify_options& opts,
                              const char* where) {
    if (opts.scheme == verification_scheme::block)
        return verify_block(target_logits, draft_tokens, q, sampling, rng, ws, opts, where);
    return verify_tokens(target_logits, draft_tokens, q, sampling, rng, ws, opts, where);
}

}  // namespace detail

/// Verifies a draft block against the target and draws the token that follows the
/// accepted prefix.
///
/// Token scheme: accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to right,
/// stopping at the first rejection n; then samples one token from
/// norm(max(0, p_{n+1} − q_{n+1})), or from p_{γ+1} when all γ were accepted (Leviathan et al.
/// 2023, Alg. 1; exactness proved in App. A.1). Block scheme (the default): Sun et al. 2024,
/// see verification_scheme. Either way the accepted tokens and the drawn token together have
/// exactly the target's distribution. p_i is the standardized target distribution of column
/// i of target_logits.
///
/// Randomness, all from `rng` through uniform01: token scheme, one uniform per tested draft
/// token, then one for the emitted token; block scheme, γ uniforms η_1..η_γ, then one for
/// the emitted token.
///
/// \param target_logits V x (γ+1) target logits; column j follows context + x_1..x_j.
/// \param draft_tokens  x_1..x_γ (γ may be 0: then one token is sampled from p_1).
/// \param draft_probs   V x γ; column i is q_i, the distribution x_i was sampled from,
///                      already standardized with the same `sampling` (see standardize()).
/// \param sampling      standardized-sampling settings applied to the target's logits.
/// \param rng           the caller's generator (any std::uniform_random_bit_generator).
/// \param ws            reusable buffers.
/// \param opts          scheme, lenience (token scheme only), input checks.
/// \returns the number of accepted draft tokens and the token that follows them.
/// \throws std::invalid_argument on shape mismatch, out-of-range draft tokens, invalid
///         sampling settings or lenience, NaN/+Inf/all -Inf logits in a row that is read, or
///         (when checked) draft probabilities that are not probabilities.
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
    return detail::dispatch_verify(target_logits, draft_tokens, &draft_probs, sampling, rng, ws, opts, where);
}

/// Verifies point-mass drafts (no draft distributions, e.g. n-gram or prompt-lookup
/// drafters): q_i = δ(x_i), so under token verification x_i is accepted with probability
/// p_i(x_i) and the residual after a rejection is p_i with x_i removed. Otherwise as the
/// overload above.
template <random_generator G>
verify_result verify(const Eigen::Ref<const Eigen::MatrixXf>& target_logits, std::span<const token_id> draft_tokens,
                     point_mass_t, const sampling_config& sampling, G&& rng, verify_workspace& ws,
                     const verify_options& opts = {}) {
    constexpr const char* where = "specdec::verify";
    detail::check_verify_inputs(target_logits, draft_tokens, nullptr, nullptr, sampling, opts, where);
    return detail::dispatch_verify(target_logits, draft_tokens, nullptr, sampling, rng, ws, opts, where);
}

}  // namespace specdec
