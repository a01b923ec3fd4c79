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
/// allocates nothing after the first call with a given vocabulary size and draft length.
struct verify_workspace {
    /// Exponentiated target rows, one column per row the verification normalized: column j
    /// holds exp((z − m_b) / T) with m_b the maximum of the element's block (truncating
    /// sampling: the standardized probabilities themselves).
    Eigen::MatrixXf rows;
    std::vector<float> scale;        ///< per row and block: the factor that turns `rows` into p
    std::vector<double> block_mass;  ///< per row and block: the probability mass of the block
    std::vector<double> sums;        ///< block weights of the final draw
    std::vector<double> eta;         ///< block verification: η_1..η_γ
    sampling_workspace sampling;
};

namespace detail {

/// A target row that verification has normalized (Sec. 2.2 standardization applied).
/// Greedy rows keep only their argmax; other rows are stored in the workspace, so p(x) of
/// any token is one multiply and no row is exponentiated twice.
struct target_row {
    std::size_t column = 0;   // column j of the logits, and of ws.rows
    bool greedy = false;
    Eigen::Index argmax = 0;  // greedy rows
    bool stored = true;       // false: a plain row known only by its normalizer (below)
    float max = 0.0f;         // not stored: p(x) = exp((z_x − max) inv_t) / sum
    float inv_t = 1.0f;
    double sum = 1.0;
};

inline Eigen::Index blocks_of(Eigen::Index n) { return (n + block_size - 1) / block_size; }

/// Normalizes column j of the target logits in one pass: per L1-sized block a vectorized
/// maximum, then the block's exponentials written once and summed while in L1; the global
/// normalizer is assembled from the block sums (a blockwise log-sum-exp).
///
/// With store = false a plain row (no truncation) is only normalized, nothing is written:
/// enough for an acceptance test, and exactly the bound's work.
inline target_row prepare_row(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j, const sampling_config& s,
                              verify_workspace& ws, const char* where, bool store = true) {
    const auto col = static_cast<Eigen::Index>(j);
    const auto z = logits.col(col);
    target_row r{};
    r.column = j;
    if (s.temperature == 0.0f) {
        r.greedy = true;
        r.argmax = checked_argmax(z, where).index;
        return r;
    }
    if (!store && !truncates(s)) {
        r.stored = false;
        r.inv_t = 1.0f / s.temperature;
        const row_normalizer nz = checked_normalizer(z, r.inv_t, where);
        r.max = nz.max;
        r.sum = nz.sum;
        return r;
    }
    const Eigen::Index n = z.size(), nb = blocks_of(n);
    const std::size_t base = j * static_cast<std::size_t>(nb);
    auto e = ws.rows.col(col);
    float* scale = ws.scale.data() + base;
    double* mass = ws.block_mass.data() + base;
    if (truncates(s)) {
        standardize(z, s, e, ws.sampling, where);
        for (Eigen::Index b = 0; b < nb; ++b) {
            const Eigen::Index start = b * block_size, len = std::min(block_size, n - start);
            scale[b] = 1.0f;
            mass[b] = e.segment(start, len).sum();
        }
        return r;
    }
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    const float inv_t = 1.0f / s.temperature;
    float m = neg_inf;
    for (Eigen::Index b = 0; b < nb; ++b) {
        const Eigen::Index start = b * block_size, len = std::min(block_size, n - start);
        const float bm = block_max(z, start, len);
        if (std::isnan(bm) || bm == std::numeric_limits<float>::infinity()) diagnose_logits(z, where);
        scale[b] = bm;  // the block maximum, turned into the scale below
        if (bm == neg_inf) {
            e.segment(start, len).setZero();
            mass[b] = 0.0;
            continue;
        }
        m = std::max(m, bm);
        mass[b] = exp_pass(z.data() + start, e.data() + start, len, bm, inv_t);
        if (std::isnan(mass[b])) diagnose_logits(z, where);  // a NaN logit in the block
    }
    if (m == neg_inf) diagnose_logits(z, where);
    double total = 0.0;
    for (Eigen::Index b = 0; b < nb; ++b)
        if (mass[b] > 0.0) total += mass[b] * std::exp(static_cast<double>(scale[b] - m) * inv_t);
    for (Eigen::Index b = 0; b < nb; ++b) {
        const double f = mass[b] > 0.0 ? std::exp(static_cast<double>(scale[b] - m) * inv_t) / total : 0.0;
        scale[b] = static_cast<float>(f);
        mass[b] *= f;
    }
    return r;
}

/// p(x) for a prepared row.
inline double prob_of(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, const verify_workspace& ws,
                      Eigen::Index x) {
    if (r.greedy) return x == r.argmax ? 1.0 : 0.0;
    if (!r.stored)
        return std::exp(static_cast<double>(logits(x, static_cast<Eigen::Index>(r.column)) - r.max) * r.inv_t) / r.sum;
    const std::size_t nb = static_cast<std::size_t>(blocks_of(ws.rows.rows()));
    return static_cast<double>(ws.rows(x, static_cast<Eigen::Index>(r.column))) *
           ws.scale[r.column * nb + static_cast<std::size_t>(x / block_size)];
}

/// Draws the emitted token from p itself (after full acceptance, or as the fallback of an
/// empty residual).
inline token_id sample_target(const target_row& r, verify_workspace& ws, double u) {
    if (r.greedy) return static_cast<token_id>(r.argmax);
    const Eigen::Index n = ws.rows.rows(), nb = blocks_of(n);
    const std::size_t base = r.column * static_cast<std::size_t>(nb);
    ws.sums.assign(ws.block_mass.begin() + static_cast<std::ptrdiff_t>(base),
                   ws.block_mass.begin() + static_cast<std::ptrdiff_t>(base) + nb);
    double total = 0.0;
    for (double x : ws.sums) total += x;
    const auto e = ws.rows.col(static_cast<Eigen::Index>(r.column));
    const float* scale = ws.scale.data() + base;
    return static_cast<token_id>(
        draw_blocked(ws.sums, total, n, u, [&](Eigen::Index k) { return double(e[k]) * scale[k / block_size]; }));
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

/// Accumulates the checks of one block of a draft column (minimum and sum, while in L1).
struct column_check {
    float lowest = 0.0f;
    double sum = 0.0;
    void add(const auto& qb) {
        lowest = std::min(lowest, qb.minCoeff());
        sum += qb.sum();  // NaN or +Inf anywhere makes the sum fail the check
    }
    /// Throws (with details) unless the column was a probability distribution.
    void finish(const Eigen::Ref<const Eigen::VectorXf>& q, std::size_t i, const char* where) const {
        if (!(lowest >= 0.0f) || !(std::abs(sum - 1.0) <= draft_probability_tolerance)) check_draft_column(q, i, where);
    }
};

/// Checks draft column i blockwise (one pass). The sum catches NaN and +Inf.
inline void check_column(const Eigen::Ref<const Eigen::MatrixXf>& q, std::size_t i, const char* where) {
    const auto col = q.col(static_cast<Eigen::Index>(i));
    column_check c;
    const Eigen::Index n = col.size();
    for (Eigen::Index start = 0; start < n; start += block_size) c.add(col.segment(start, std::min(block_size, n - start)));
    c.finish(col, i, where);
}

/// Draws the emitted token from norm(max(0, a·p − b·q)) for row r against draft column
/// r.column (Sec. 2.3 with a = 1, b = l; Sun et al.'s residual with a = w_τ, b = 1), or from p
/// when that residual is empty. q == nullptr: point mass at x. The residual is never
/// written out: block sums first, then one block is recomputed element by element.
inline token_id sample_residual(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>* q, token_id x, float a,
                                float b, verify_workspace& ws, double u) {
    // p = δ(argmax): the residual is a multiple of δ(argmax) or empty, and the fallback is p
    // as well: the argmax either way.
    if (r.greedy) return static_cast<token_id>(r.argmax);
    const Eigen::Index n = ws.rows.rows(), nb = blocks_of(n);
    const auto j = static_cast<Eigen::Index>(r.column);
    const std::size_t base = r.column * static_cast<std::size_t>(nb);
    const auto e = ws.rows.col(j);
    const float* scale = ws.scale.data() + base;
    ws.sums.resize(static_cast<std::size_t>(nb));
    double total = 0.0;
    if (q != nullptr) {
        const auto qc = q->col(j);
        for (Eigen::Index blk = 0; blk < nb; ++blk) {
            const Eigen::Index start = blk * block_size, len = std::min(block_size, n - start);
            const double bs =
                ((e.segment(start, len).array() * (a * scale[blk])) - b * qc.segment(start, len).array()).max(0.0f).sum();
            ws.sums[static_cast<std::size_t>(blk)] = bs;
            total += bs;
        }
        if (!(total > residual_mass_floor)) return sample_target(r, ws, u);
        return static_cast<token_id>(draw_blocked(ws.sums, total, n, u, [&](Eigen::Index k) {
            return static_cast<double>(std::max(0.0f, e[k] * (a * scale[k / block_size]) - b * qc[k]));
        }));
    }
    // Point mass at x: the residual is a·p with a·p(x) lowered by b.
    const double px = static_cast<double>(e[x] * (a * scale[x / block_size]));
    const double px_left = std::max(0.0, px - b);
    for (Eigen::Index blk = 0; blk < nb; ++blk) {
        double bs = a * ws.block_mass[base + static_cast<std::size_t>(blk)];
        if (x / block_size == blk) bs = std::max(0.0, bs - px + px_left);
        ws.sums[static_cast<std::size_t>(blk)] = bs;
        total += bs;
    }
    if (!(total > residual_mass_floor)) return sample_target(r, ws, u);
    return static_cast<token_id>(draw_blocked(ws.sums, total, n, u, [&](Eigen::Index k) {
        return k == x ? px_left : static_cast<double>(e[k] * (a * scale[k / block_size]));
    }));
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

/// Sizes the workspace for V x (n + 1) rows; grows only, so a shorter draft reuses storage.
inline void reserve_rows(verify_workspace& ws, Eigen::Index vocab, std::size_t n, const sampling_config& s) {
    if (s.temperature == 0.0f) return;  // greedy rows are not stored
    const auto cols = static_cast<Eigen::Index>(n + 1);
    if (ws.rows.rows() != vocab || ws.rows.cols() < cols) ws.rows.resize(vocab, cols);
    const std::size_t need = static_cast<std::size_t>(blocks_of(vocab)) * static_cast<std::size_t>(ws.rows.cols());
    if (ws.scale.size() < need) {
        ws.scale.resize(need);
        ws.block_mass.resize(need);
    }
}

/// q_i(x) (1 for a point mass).
inline double draft_prob(const Eigen::Ref<const Eigen::MatrixXf>* q, std::size_t i, token_id x) {
    return q == nullptr ? 1.0 : static_cast<double>((*q)(x, static_cast<Eigen::Index>(i)));
}

/// Token verification (Leviathan et al. 2023, Alg. 1). q == nullptr: point-mass drafts.
template <class G>
verify_result verify_tokens(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                            std::span<const token_id> draft_tokens, const Eigen::Ref<const Eigen::MatrixXf>* q,
                            const sampling_config& sampling, G& rng, verify_workspace& ws, const verify_options& opts,
                            const char* where) {
    const std::size_t n = draft_tokens.size();
    const double lenience = opts.lenience;
    const bool check = q != nullptr && opts.check_draft_distributions;
    reserve_rows(ws, target_logits.rows(), n, sampling);
    // Test x_1..x_γ left to right with r_i ~ U(0, 1); the first failure ends the block.
    // Rows after it are never read.
    for (std::size_t i = 0; i < n; ++i) {
        if (check) check_column(*q, i, where);
        // The test needs p(x) only: normalize the row without writing it out.
        const target_row row = prepare_row(target_logits, i, sampling, ws, where, false);
        const token_id x = draft_tokens[i];
        const double qx = draft_prob(q, i, x);
        const double px = prob_of(row, target_logits, ws, x);
        const double r = uniform01(rng);
        // Accept iff r < p(x) / (l q(x)), i.e. with probability min(1, p/(l q)) (App. A.5
        // with l = 1 is Alg. 1). A token the drafter gave q(x) = 0 is rejected.
        if (qx > 0.0 && r * lenience * qx < px) continue;
        // Rejected at position i: resample from p' = norm(max(0, p_i − l q_i)) (Sec. 2.3),
        // for which the row is now stored (once per step).
        const target_row full = row.stored ? row : prepare_row(target_logits, i, sampling, ws, where);
        return {i, sample_residual(full, q, x, 1.0f, opts.lenience, ws, uniform01(rng))};
    }
    // Every draft accepted: the bonus token comes from p_{γ+1}.
    const target_row row = prepare_row(target_logits, n, sampling, ws, where);
    return {n, sample_target(row, ws, uniform01(rng))};
}

/// Σ_x max(0, w p(x) − q(x)) for a prepared row and its draft column (or a point mass at
/// x); checks the draft column on the way when `check`.
inline double residual_mass(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                            const Eigen::Ref<const Eigen::MatrixXf>* q, token_id x, double w, bool check,
                            verify_workspace& ws, const char* where) {
    const auto j = static_cast<Eigen::Index>(r.column);
    if (q == nullptr) {
        // q = δ(x): w (1 − p(x)) + max(0, w p(x) − 1), from p(x) alone.
        const double px = prob_of(r, logits, ws, x);
        return w * (1.0 - px) + std::max(0.0, w * px - 1.0);
    }
    const auto qc = q->col(j);
    if (r.greedy) {
        // p = δ(a): max(0, w − q(a)); the other terms are max(0, −q) = 0.
        if (check) check_column(*q, r.column, where);
        return std::max(0.0, w - static_cast<double>(qc[r.argmax]));
    }
    const Eigen::Index n = ws.rows.rows(), nb = blocks_of(n);
    const auto e = ws.rows.col(j);
    const float* scale = ws.scale.data() + r.column * static_cast<std::size_t>(nb);
    column_check c;
    double total = 0.0;
    for (Eigen::Index blk = 0; blk < nb; ++blk) {
        const Eigen::Index start = blk * block_size, len = std::min(block_size, n - start);
        const auto qb = qc.segment(start, len);
        if (check) c.add(qb);
        total += ((e.segment(start, len).array() * static_cast<float>(w * scale[blk])) - qb.array()).max(0.0f).sum();
    }
    if (check) c.finish(qc, r.column, where);
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
    const bool check = q != nullptr && opts.check_draft_distributions;
    reserve_rows(ws, target_logits.rows(), n, sampling);
    ws.eta.resize(n);
    for (double& e : ws.eta) e = uniform01(rng);
    // Column 0 is checked here; columns 1..γ−1 while R_i reads them.
    if (check && n > 0) check_column(*q, 0, where);
    std::size_t tau = 0;
    double w_tau = 1.0, w = 1.0;
    target_row row = prepare_row(target_logits, 0, sampling, ws, where);  // row i holds p_{i+1}
    target_row tau_row = row;
    for (std::size_t i = 0; i < n; ++i) {
        const token_id x = draft_tokens[i];
        const double qx = draft_prob(q, i, x);
        const double px = prob_of(row, target_logits, ws, x);
        const double w_prev = w;
        // A token the drafter gave q(x) = 0 ends every longer prefix (w = 0).
        w = qx > 0.0 ? std::min(1.0, w_prev * px / qx) : 0.0;
        if (w == 0.0) break;  // every later h is 0: τ is final, later rows are never read
        bool hit;
        if (i + 1 < n) {
            row = prepare_row(target_logits, i + 1, sampling, ws, where);
            const double big_r = residual_mass(row, target_logits, q, draft_tokens[i + 1], w, check, ws, where);
            const double h = big_r > 0.0 ? big_r / (big_r + 1.0 - w) : 0.0;
            hit = ws.eta[i] < h;
        } else {
            // h_γ = w_γ = min(1, w_{γ−1} p/q), tested as η q < w_{γ−1} p so that γ = 1 is
            // token verification draw for draw.
            hit = ws.eta[i] * qx < w_prev * px;
        }
        if (hit) {
            tau = i + 1;
            w_tau = w;
            tau_row = row;
        }
    }
    const double u = uniform01(rng);
    if (tau == n) {
        const target_row last = prepare_row(target_logits, n, sampling, ws, where);
        return {n, sample_target(last, ws, u)};
    }
    // Row τ was prepared during the loop (row τ+1 in Sun et al.'s 1-based p_{τ+1}).
    return {tau, sample_residual(tau_row, q, draft_tokens[tau], static_cast<float>(w_tau), 1.0f, ws, u)};
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
