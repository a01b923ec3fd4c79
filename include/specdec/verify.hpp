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
/// Cost model. Each row the algorithm must normalize is read in one blockwise pass (per
/// 2048-float block a vectorized max, then a vectorized exp-sum while the block is in L1)
/// that yields p(x) for the draft token without writing the distribution anywhere; at
/// temperature 0 a row costs one max pass (with the NaN check fused into it). No long row is
/// ever written out (top-k / top-p aside, which need the whole distribution; a row of at most
/// kept_row_limit tokens keeps its exponentials, a few KB written from registers): a token is
/// drawn by choosing a block by its mass, then a 256-token chunk and a lane of 16 tokens by the
/// lane sums the pass kept, and recomputing (or, on a short row, reading) those 16
/// exponentials. Token verification never touches rows after the first rejection. After a
/// rejection the correction is drawn by rejection sampling from p (16 exponentials per
/// proposal), with one exact pass over the residual as the fallback. Block verification
/// computes its residual masses R_i only where bounds (one from lane sums of q) do not already
/// decide the outcome and, on long rows, a few proposals from p (block_test_by_coins) do not.

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
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
    /// summing to 1 within draft_probability_tolerance. The column is read in the same pass
    /// as the target row, which then reads twice the bytes: on rows of 32k–152k tokens that
    /// pass costs about 1.1–1.25× an unchecked one (the README's performance section). At
    /// temperature 0 the columns cannot change the outcome (each p_i is a point mass: x_i is
    /// accepted exactly when it is the target's argmax, and the correction is the argmax), so
    /// only the entries that are read, q_i(x_i) (and under block verification q_i at the
    /// argmax), are checked to be probabilities. Turn off only for distributions the caller
    /// produced with standardize() or its sampling variants (standardize_and_sample,
    /// standardize_weights_and_sample): an unchecked column that is not a distribution makes
    /// the output's distribution wrong, silently.
    bool check_draft_distributions = true;
    /// Token or block verification (block is the default).
    verification_scheme scheme = verification_scheme::block;
};

/// Outcome of one verification.
struct verify_result {
    std::size_t accepted = 0;  ///< n: draft tokens x_1..x_n accepted (0 <= n <= γ)
    token_id next_token = 0;   ///< the token that follows them: a correction after a rejection, or a bonus token
};

namespace detail {

/// A target row that verification has normalized (Sec. 2.2 standardization applied).
///  - greedy (temperature 0): only the argmax is kept;
///  - plain: known by its per-block maxima, scales and masses (ws.block_max, ws.scale,
///    ws.block_mass), from which p(x) of one token or the weights of one block are recomputed;
///  - stored (truncating sampling): standardize() wrote p into ws.rows; block scales are 1.
struct target_row {
    enum class form : unsigned char { greedy, plain, stored };
    std::size_t column = 0;  // column j of the logits (and of ws.rows)
    form kind = form::plain;
    Eigen::Index argmax = 0;  // greedy rows
    float inv_t = 1.0f;
    bool q_lanes = false;  // plain rows: the pass also kept the draft column's lane sums (ws.q_lanes)
    bool exps = false;     // plain rows: the pass also wrote its exponentials to ws.rows (short rows)
};

/// Plain rows of at most this many tokens keep the exponentials of their normalizing pass
/// (in ws.rows; a few KB, written while they are in registers), so that a draw or a residual
/// pass over them reads instead of recomputing exps. On short rows those passes cost as much
/// as the normalizing pass itself; on long ones writing the row would cost bandwidth.
inline constexpr Eigen::Index kept_row_limit = row_block;

/// True when row r's values are in ws.rows: p for stored rows (whose block scales are 1), the
/// pass's exponentials for plain rows that kept them; either way p = that value times the
/// block's scale.
inline bool in_rows(const target_row& r) { return r.kind == target_row::form::stored || r.exps; }

}  // namespace detail

/// Reusable buffers for verify(); keep one per decoding loop so that verification
/// allocates nothing after the first call with a given vocabulary size and draft length.
struct verify_workspace {
    /// Target rows written out: under truncating sampling (top-k, top-p, min-p need the whole
    /// distribution) column j holds the standardized probabilities of row j; otherwise, for
    /// rows of at most detail::kept_row_limit tokens, the exponentials of row j's pass.
    Eigen::MatrixXf rows;
    std::vector<float> block_max;    ///< per row and block: the block's largest logit
    std::vector<float> scale;        ///< per row and block: the factor that turns exp((z − m_b) / T) into p
    std::vector<double> block_mass;  ///< per row and block: the probability mass of the block
    std::vector<float> chunk_lanes;  ///< per row and 256-token chunk: its lane sums of exp((z − m_b) / T)
    std::vector<float> q_lanes;      ///< the same lane sums of the draft column (block verification's bound)
    std::vector<double> sums;        ///< block weights of an exact residual draw
    std::vector<double> eta;         ///< block verification: η_1..η_γ
    std::vector<double> weight;      ///< block verification: w_1..w_γ
    std::vector<double> p_draft;     ///< block verification: p_i(x_i)
    std::vector<double> q_draft;     ///< block verification: q_i(x_i)
    std::vector<detail::target_row> prepared;  ///< block verification: the rows normalized
    std::vector<float> block;        ///< the weights of one block during a draw
    sampling_workspace sampling;
};

/// After a rejection the correction is drawn from the residual by rejection sampling from p,
/// then, if no proposal was accepted, by one exact pass over the residual (see
/// detail::sample_residual). A proposal (a walk down the block, chunk and lane sums, 16
/// exponentials, two uniforms and a read of q, mostly latency) costs about as much as the
/// exact pass does over this many tokens, so V / this many proposals, the budget, cost about
/// one pass. (Measured on one core with an exp of eleven instructions per 16 floats: a proposal
/// 40–140 ns, depending on what of the row is in cache, against 5 µs for the pass at V = 32000;
/// 175 ns against 20 µs at V = 151936. Of 256, 512 and 1024, this value had the smallest worst
/// case in verify_bench's BM_rejection, within 1.15x of the best at every V and R there. The
/// present exp makes the pass about 20% cheaper and the proposals no cheaper; the value has not
/// been chosen again since.) Each proposal is accepted with probability R / a
/// (R the residual mass); a lower bound R_lo on R comes with the rejected token. When a / R_lo
/// is within the budget, 6 a / R_lo proposals are made (all fail with probability <= e^−6);
/// otherwise the budget, then the pass: whatever R is, at most about twice the cost of the
/// better of the two. The budget is at least one proposal, except on rows of one block whose
/// values the pass kept (exponentials, or a truncated distribution), whose exact pass needs no
/// exp: there it is V / this many, so that rows of fewer tokens make none. The count changes
/// the cost, never the distribution.
inline constexpr Eigen::Index residual_proposal_cost = 1024;

namespace detail {

/// Offset of row j's per-block entries in ws.block_max / scale / block_mass.
inline std::size_t block_base(Eigen::Index vocab, std::size_t j) {
    return j * static_cast<std::size_t>(blocks_of(vocab));
}

/// Chunks of exp_chunk elements per row block, and the lane sums of block b of row j.
inline constexpr Eigen::Index chunks_per_block = row_block / exp_chunk;
inline std::size_t chunk_offset(Eigen::Index vocab, std::size_t j, Eigen::Index b) {
    const std::size_t block = block_base(vocab, j) + static_cast<std::size_t>(b);
    return block * static_cast<std::size_t>(chunks_per_block * chunk_lanes);
}
inline float* chunk_data(verify_workspace& ws, Eigen::Index vocab, std::size_t j, Eigen::Index b) {
    return ws.chunk_lanes.data() + chunk_offset(vocab, j, b);
}
inline const float* chunk_data(const verify_workspace& ws, Eigen::Index vocab, std::size_t j, Eigen::Index b) {
    return ws.chunk_lanes.data() + chunk_offset(vocab, j, b);
}

/// The name of draft entry (k, i) in error messages: with a column scale c other than 1,
/// the entry is q_i(k) = c · draft_probs(k, i).
inline std::string draft_entry_name(Eigen::Index k, std::size_t i, float c) {
    std::string s = "draft_probs(" + std::to_string(k) + ", " + std::to_string(i) + ")";
    if (c != 1.0f) s = "draft_scales[" + std::to_string(i) + "] * " + s;
    return s;
}

/// Throws unless q_i(k) = c · draft_probs(k, i) is a probability (finite, in [0, 1]).
inline void check_draft_entry(const Eigen::Ref<const Eigen::MatrixXf>& q, Eigen::Index k, std::size_t i, float c,
                              const char* where) {
    const float v = c * q(k, static_cast<Eigen::Index>(i));
    if (!(v >= 0.0f && v <= 1.0f))
        fail_invalid(where, ": ", draft_entry_name(k, i, c), " = ", v,
                     " is not a probability (negative, NaN, Inf or > 1)");
}

/// Throws unless c · q is a probability distribution (with details of what is wrong).
inline void check_draft_column(const Eigen::Ref<const Eigen::VectorXf>& q, std::size_t i, float c, const char* where) {
    double s = 0.0;
    for (Eigen::Index k = 0; k < q.size(); ++k) {
        const float v = q[k];
        if (!(v >= 0.0f) || !std::isfinite(v))
            fail_invalid(where, ": ", draft_entry_name(k, i, 1.0f), " = ", v,
                         " is not a probability (negative, NaN or Inf)");
        s += v;
    }
    s *= c;
    if (std::abs(s - 1.0) > draft_probability_tolerance) {
        if (c != 1.0f)
            fail_invalid(where, ": draft distribution column ", i, " times draft_scales[", i, "] = ", c, " sums to ",
                         s, ", not 1");
        fail_invalid(where, ": draft distribution column ", i, " sums to ", s, ", not 1");
    }
}

/// Accumulates the checks of one block of a draft column (sign and sum, while in L1).
struct column_check {
    bool may_be_negative = false;  // (set on mere suspicion too: finish() then checks exactly)
    double sum = 0.0;
    void add(const auto& qb) {
        may_be_negative = may_be_negative || !(qb.minCoeff() >= 0.0f);
        sum += qb.sum();  // NaN or +Inf anywhere makes the sum fail the check
    }
    /// Throws (with details) unless the column times c was a probability distribution.
    void finish(const Eigen::Ref<const Eigen::VectorXf>& q, std::size_t i, float c, const char* where) const {
        if (may_be_negative || !(std::abs(sum * c - 1.0) <= draft_probability_tolerance))
            check_draft_column(q, i, c, where);
    }
};

/// Checks draft column i, n floats at q with scale c, blockwise (one pass). The sum catches
/// NaN and +Inf.
inline void check_column(const float* q, Eigen::Index n, std::size_t i, float c, const char* where) {
    column_check check;
    for (Eigen::Index start = 0; start < n; start += row_block)
        check.add(Eigen::Map<const Eigen::VectorXf>(q + start, std::min(row_block, n - start)));
    check.finish(Eigen::Map<const Eigen::VectorXf>(q, n), i, c, where);
}

/// The plain (untruncated, temperature > 0) case of prepare_row, for rows that keep their
/// exponentials in ws.rows (keep_exps) or not.
template <bool keep_exps>
target_row prepare_plain_row(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j, const sampling_config& s,
                             verify_workspace& ws, const char* where, const float* check_q, float check_scale) {
    const auto col = static_cast<Eigen::Index>(j);
    const auto z = logits.col(col);
    const Eigen::Index n = z.size(), nb = blocks_of(n);
    const std::size_t base = block_base(n, j);
    float* bmax = ws.block_max.data() + base;
    float* scale = ws.scale.data() + base;
    double* mass = ws.block_mass.data() + base;
    target_row r{};
    r.column = j;
    r.inv_t = 1.0f / s.temperature;
    r.kind = target_row::form::plain;
    r.q_lanes = check_q != nullptr;
    r.exps = keep_exps;
    float* exps = keep_exps ? ws.rows.col(col).data() : nullptr;
    const float inv_t = r.inv_t;
    column_check c;
    const float m = blockwise_exp_pass(
        z, bmax, mass, where,
        [&](Eigen::Index b, Eigen::Index start, Eigen::Index len, float ref) {
            const chunked_exp_sums cs = chunked_exp_pass<keep_exps>(
                z.data() + start, len, ref, inv_t, chunk_data(ws, n, j, b), check_q == nullptr ? nullptr : check_q + start,
                check_q == nullptr ? nullptr : ws.q_lanes.data() + chunk_offset(n, j, b), block_len(n, b + 1),
                keep_exps ? exps + start : nullptr);
            if (check_q != nullptr) {
                c.may_be_negative = c.may_be_negative || cs.q_sign;
                c.sum += cs.q_sum;
            }
            return cs.exp_sum;
        },
        [&](Eigen::Index start, Eigen::Index len) {
            if constexpr (keep_exps) std::fill(exps + start, exps + start + len, 0.0f);
            if (check_q != nullptr) c.add(Eigen::Map<const Eigen::VectorXf>(check_q + start, len));
        });
    if (check_q != nullptr) c.finish(Eigen::Map<const Eigen::VectorXf>(check_q, n), j, check_scale, where);
    if (nb == 1) {
        // One block (its reference is the row's maximum): p = exp((z − m) / T) / its sum.
        const double inv_total = 1.0 / mass[0];
        mass[0] *= inv_total;  // (as below with factor 1)
        scale[0] = static_cast<float>(inv_total);
        return r;
    }
    double total = 0.0;
    for_each_block_factor(bmax, mass, nb, m, inv_t, [&](Eigen::Index b, double f) { total += mass[b] * f; });
    const double inv_total = 1.0 / total;
    std::fill(scale, scale + nb, 0.0f);  // blocks without mass keep scale 0
    for_each_block_factor(bmax, mass, nb, m, inv_t, [&](Eigen::Index b, double f) {
        mass[b] *= f * inv_total;
        scale[b] = static_cast<float>(f * inv_total);
    });
    return r;
}

/// prepare_plain_row for a short row (at most kept_row_limit tokens), kept out of line so that
/// the long rows' pass is compiled on its own.
SPECDEC_NOINLINE target_row prepare_short_row(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j,
                                              const sampling_config& s, verify_workspace& ws, const char* where,
                                              const float* check_q, float check_scale) {
    return prepare_plain_row<true>(logits, j, s, ws, where, check_q, check_scale);
}

/// Normalizes column j of the target logits in one pass: per L1-sized block a vectorized
/// maximum, then a vectorized exp-sum while the block is in L1; the global normalizer is
/// assembled from the block sums (a blockwise log-sum-exp). Nothing of the size of a long row
/// is written (truncating sampling aside): this is exactly the bound's work. `check_q`, when
/// not null, is draft column j, with scale check_scale: it is checked in the same pass (read
/// block by block next to the logits, its loads overlapping the exps).
inline target_row prepare_row_unnamed(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j,
                                      const sampling_config& s, verify_workspace& ws, const char* where,
                                      const float* check_q, float check_scale) {
    const auto col = static_cast<Eigen::Index>(j);
    const auto z = logits.col(col);
    if (s.temperature == 0.0f) {
        target_row r{};
        r.column = j;
        r.kind = target_row::form::greedy;
        r.argmax = checked_argmax(z, where).index;
        return r;
    }
    const Eigen::Index n = z.size();
    if (!truncates(s)) {
        if (n <= kept_row_limit) return prepare_short_row(logits, j, s, ws, where, check_q, check_scale);
        return prepare_plain_row<false>(logits, j, s, ws, where, check_q, check_scale);
    }
    target_row r{};
    r.column = j;
    r.kind = target_row::form::stored;
    r.inv_t = 1.0f / s.temperature;
    const Eigen::Index nb = blocks_of(n);
    const std::size_t base = block_base(n, j);
    auto e = ws.rows.col(col);
    standardize(z, s, e, ws.sampling, where);
    for (Eigen::Index b = 0; b < nb; ++b) {
        ws.scale[base + static_cast<std::size_t>(b)] = 1.0f;
        ws.block_max[base + static_cast<std::size_t>(b)] = 0.0f;
        ws.block_mass[base + static_cast<std::size_t>(b)] = e.segment(b * row_block, block_len(n, b)).sum();
    }
    if (check_q != nullptr) check_column(check_q, n, j, check_scale, where);
    return r;
}

/// prepare_row_unnamed, whose errors about the logits also name the column: "where: target_logits
/// column 2: logit 7 is NaN". (The row is scanned again only when the pass has thrown.)
inline target_row prepare_row(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j, const sampling_config& s,
                              verify_workspace& ws, const char* where, const float* check_q = nullptr,
                              float check_scale = 1.0f) {
    try {
        return prepare_row_unnamed(logits, j, s, ws, where, check_q, check_scale);
    } catch (const std::invalid_argument&) {
        const auto column = logits.col(static_cast<Eigen::Index>(j));
        const auto z = column.array();
        constexpr float inf = std::numeric_limits<float>::infinity();
        if (z.isNaN().any() || (z == inf).any() || (z == -inf).all()) {
            const std::string named = std::string(where) + ": target_logits column " + std::to_string(j);
            diagnose_logits(column, named.c_str());
        }
        throw;  // an error about the draft column
    }
}

/// p(x) for a prepared row: for plain rows exp((z_x − m_b) / T) times the block's scale, the
/// exponential being the very float the row's pass added to its block's sum (kept by the pass
/// on short rows, else recomputed by the same SIMD exp), so that p(x) agrees with the
/// normalizer and with the weights the draws use.
inline double prob_of(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, const verify_workspace& ws,
                      Eigen::Index x) {
    if (r.kind == target_row::form::greedy) return x == r.argmax ? 1.0 : 0.0;
    const Eigen::Index vocab = logits.rows();
    const std::size_t at = block_base(vocab, r.column) + static_cast<std::size_t>(x / row_block);
    const auto col = static_cast<Eigen::Index>(r.column);
    if (r.kind == target_row::form::stored) return static_cast<double>(ws.rows(x, col));
    if (ws.block_mass[at] == 0.0) return 0.0;  // every logit of the block is -Inf
    const float e = r.exps ? ws.rows(x, col) : pass_exp(logits(x, col), ws.block_max[at], r.inv_t);
    return static_cast<double>(e) * ws.scale[at];
}

/// Writes p of elements off..off+len−1 of block b of a prepared (non-greedy) row to out. Plain
/// rows read the exponentials their pass kept, or recompute them (the same exp relative to the
/// same reference as the normalizing pass, so the same floats).
inline void fill_block(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                       const verify_workspace& ws, Eigen::Index b, Eigen::Index off, Eigen::Index len, float* out) {
    const Eigen::Index start = b * row_block + off;
    const std::size_t at = block_base(logits.rows(), r.column) + static_cast<std::size_t>(b);
    const auto col = static_cast<Eigen::Index>(r.column);
    Eigen::Map<Eigen::VectorXf> o(out, len);
    if (ws.block_mass[at] == 0.0) {
        o.setZero();
    } else if (in_rows(r)) {
        o = ws.rows.col(col).segment(start, len) * ws.scale[at];
    } else {
        exp_pass(logits.col(col).data() + start, out, len, ws.block_max[at], r.inv_t);
        o *= ws.scale[at];
    }
}

/// Inverse-CDF draw over blocks with one uniform u: `sums` holds the weight of each of nb
/// blocks of a row of n elements; fill(b, off, len, out) writes the weights of elements
/// off..off+len−1 of block b to out[0..len); a block is filled and scanned 256 elements at a
/// time, up to the crossing. Returns the first element whose running weight exceeds u·total, never one of
/// weight 0 (on rounding overshoot: the last element with weight). On return,
/// buf[y % row_block] holds the weight of the returned element y.
/// `prefix`, when not null, holds the running sums of `sums` (prefix[b] = sums[0] + ... +
/// sums[b]): the block is then found by binary search (for repeated draws from one row).
template <class Fill>
Eigen::Index draw_by_blocks(const double* sums, Eigen::Index nb, Eigen::Index n, double total, double u, float* buf,
                            Fill&& fill, const double* prefix = nullptr) {
    const double target = u * total;
    double acc = 0.0;
    Eigen::Index b = 0;
    if (prefix != nullptr) {
        b = std::min<Eigen::Index>(nb - 1, std::upper_bound(prefix, prefix + nb, target) - prefix);
        acc = b > 0 ? prefix[b - 1] : 0.0;
    } else {
        while (b + 1 < nb && acc + sums[b] <= target) acc += sums[b++];
    }
    Eigen::Index last_block = -1;
    for (Eigen::Index c = b; c < nb; ++c) {
        if (c > b && !(sums[c] > 0.0)) continue;
        const Eigen::Index len = block_len(n, c);
        bool any = false;
        for (Eigen::Index off = 0; off < len; off += exp_chunk) {
            const Eigen::Index cl = std::min(exp_chunk, len - off);
            fill(c, off, cl, buf + off);
            Eigen::Index chunk_last = -1;
            const Eigen::Index k = scan_block(buf + off, cl, acc, target, chunk_last);
            if (k >= 0) return c * row_block + off + k;
            any = any || chunk_last >= 0;
        }
        if (any) last_block = c;
    }
    // Rounding overshoot: the last element with weight, its block refilled into buf.
    for (Eigen::Index c = last_block >= 0 ? last_block : b - 1; c >= 0; --c) {
        if (c != last_block && !(sums[c] > 0.0)) continue;
        const Eigen::Index len = block_len(n, c);
        fill(c, 0, len, buf);
        for (Eigen::Index k = len - 1; k >= 0; --k)
            if (buf[k] > 0.0f) return c * row_block + k;
    }
    SPECDEC_ASSERT(false, "draw_by_blocks: all weights are zero");
    return 0;
}

/// Over w[0..count): the first i at which acc + w[0] + ... + w[i] exceeds target (w[i] > 0),
/// with the weights before it added to acc; when none does (rounding overshoot), the last i
/// with weight and target set to +Inf, so that the levels below take their last element with
/// weight too. -1 when every weight is 0.
inline int pick_crossing(const double* w, int count, double& acc, double& target) {
    int last = -1;
    for (int i = 0; i < count; ++i) {
        if (!(w[i] > 0.0)) continue;
        if (acc + w[i] > target) return i;
        acc += w[i];
        last = i;
    }
    target = std::numeric_limits<double>::infinity();
    return last;
}

/// An element of a row and the weight it was drawn with.
struct weighted_index {
    Eigen::Index index = 0;
    double weight = 0.0;  ///< p(index) as the draw computed it
};

/// The chunk and lane levels of a lane-order draw: over `chunks` chunks whose lane sums are
/// at lanes[c·chunk_lanes + l], picks the chunk, then the lane, where acc + the running weight
/// crosses target (see pick_crossing, which updates both); returns the lane's first element,
/// c·exp_chunk + l, or -1 when no lane has weight.
inline Eigen::Index pick_lane(const float* lanes, Eigen::Index chunks, double& acc, double& target) {
    static_assert(chunks_per_block <= chunk_lanes);  // a block's chunk sums fit in w
    double w[chunk_lanes];
    for (Eigen::Index c = 0; c < chunks; ++c)
        w[c] = Eigen::Map<const Eigen::Array<float, chunk_lanes, 1>>(lanes + c * chunk_lanes).sum();
    const int c = pick_crossing(w, static_cast<int>(chunks), acc, target);
    if (c < 0) return -1;
    for (Eigen::Index l = 0; l < chunk_lanes; ++l) w[l] = lanes[c * chunk_lanes + l];
    const int l = pick_crossing(w, static_cast<int>(chunk_lanes), acc, target);
    return l < 0 ? -1 : static_cast<Eigen::Index>(c) * exp_chunk + l;
}

/// Index of the first of the n non-decreasing values p[0..n) that exceeds t, n when none does:
/// a binary search whose steps depend on n only (a conditional move each, no branch on the
/// data: a draw's uniform makes such branches mispredict half the time).
inline Eigen::Index first_above(const double* p, Eigen::Index n, double t) {
    const double* base = p;
    for (Eigen::Index len = n; len > 1;) {
        const Eigen::Index half = len / 2;
        base = base[half] <= t ? base + half : base;
        len -= half;
    }
    return (base - p) + (*base <= t ? 1 : 0);
}

#if defined(__AVX512F__)
/// pick_crossing over 16 weights in two vectors of doubles (lanes past the count hold 0): the
/// first i with w[i] > 0 and acc + w[0] + ... + w[i] > target, found with no branch (prefix
/// sums in three shift-and-add steps per vector, one compare); acc becomes acc + w[0] + ... +
/// w[i − 1]. -1 when none crosses (rounding overshoot): the caller then takes the scalar path,
/// which handles it. The sums are those of pick_crossing up to the order of the additions.
inline int crossing_16(__m512d lo, __m512d hi, double& acc, double target) {
    const __m512i zero = _mm512_setzero_si512();
    auto scan = [&](__m512d x) {  // inclusive prefix sums of 8 doubles
        x = _mm512_add_pd(x, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(x), zero, 7)));
        x = _mm512_add_pd(x, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(x), zero, 6)));
        return _mm512_add_pd(x, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(x), zero, 4)));
    };
    const __m512d plo = _mm512_add_pd(scan(lo), _mm512_set1_pd(acc));
    const __m512d phi = _mm512_add_pd(scan(hi), _mm512_permutexvar_pd(_mm512_set1_epi64(7), plo));
    const __m512d t = _mm512_set1_pd(target), none = _mm512_setzero_pd();
    const unsigned below = _mm512_mask_cmp_pd_mask(_mm512_cmp_pd_mask(lo, none, _CMP_GT_OQ), plo, t, _CMP_GT_OQ);
    const unsigned above = _mm512_mask_cmp_pd_mask(_mm512_cmp_pd_mask(hi, none, _CMP_GT_OQ), phi, t, _CMP_GT_OQ);
    const unsigned mask = below | (above << 8);
    if (mask == 0) return -1;
    const int i = std::countr_zero(mask);
    // Exclusive prefix sums (acc, P_0, ..., P_14): element i is what precedes w[i].
    const __m512i elo = _mm512_alignr_epi64(_mm512_castpd_si512(plo), _mm512_castpd_si512(_mm512_set1_pd(acc)), 7);
    const __m512i ehi = _mm512_alignr_epi64(_mm512_castpd_si512(phi), _mm512_castpd_si512(plo), 7);
    const __m512i at = _mm512_set1_epi64(i);
    acc = _mm512_cvtsd_f64(_mm512_permutex2var_pd(_mm512_castsi512_pd(elo), at, _mm512_castsi512_pd(ehi)));
    return i;
}

/// crossing_16 over 16 floats, widened to double.
inline int crossing_16(__m512 w, double& acc, double target) {
    return crossing_16(_mm512_cvtps_pd(_mm512_castps512_ps256(w)),
                       _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1))), acc, target);
}

/// The sums of a block's chunks (each the sum of its 16 lane sums, see chunked_exp_pass) in
/// one vector of 8 doubles, from registers: halves added, then pairwise horizontal adds (the
/// lane sums of chunks past the end of the row read as 0).
inline __m512d chunk_sums_avx512(const float* lanes, Eigen::Index chunks) {
    static_assert(chunks_per_block == 8 && chunk_lanes == 16);
    __m256 h[8];
    for (int c = 0; c < 8; ++c) {
        const __m512 v = _mm512_maskz_loadu_ps(c < chunks ? 0xFFFF : 0, lanes + c * chunk_lanes);
        const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        h[c] = _mm256_add_ps(_mm512_castps512_ps256(v), high);
    }
    const __m256 h01 = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    const __m256 h45 = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
    return _mm512_cvtps_pd(
        _mm256_add_ps(_mm256_permute2f128_ps(h01, h45, 0x20), _mm256_permute2f128_ps(h01, h45, 0x31)));
}

/// K draws of draw_plain's walk at once (uniforms u[0..K)), for rows whose pass kept no
/// exponentials, with no branch on the uniforms, stage by stage (block, chunk, lane, element)
/// so that the K independent chains of loads and arithmetic overlap. out[k].index is -1 where
/// rounding overshot at the chunk, lane or element level (the scalar walk then redoes that draw).
template <int K>
void draw_plain_avx512(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, const verify_workspace& ws,
                       const double* prefix, const double* u, weighted_index* out) {
    const Eigen::Index n = logits.rows(), nb = blocks_of(n);
    const std::size_t base = block_base(n, r.column);
    const double* mass = ws.block_mass.data() + base;
    constexpr auto count = static_cast<std::size_t>(K);
    Eigen::Index b[count], len[count], first[count];  // first: the lane's first element, -1 on overshoot
    double target[count], acc[count], scale[count];
    for (int k = 0; k < K; ++k) {  // the block: binary search on the running block masses
        target[k] = u[k] * prefix[nb - 1];
        b[k] = std::min<Eigen::Index>(nb - 1, first_above(prefix, nb, target[k]));
        while (b[k] > 0 && !(mass[b[k]] > 0.0)) --b[k];  // rounding overshoot past the last block with mass
        scale[k] = ws.scale[base + static_cast<std::size_t>(b[k])];
        target[k] = (target[k] - (b[k] > 0 ? prefix[b[k] - 1] : 0.0)) / scale[k];
        acc[k] = 0.0;
        len[k] = block_len(n, b[k]);
        out[k].index = -1;
    }
    for (int k = 0; k < K; ++k) {  // the chunk, then the lane
        const float* lanes = chunk_data(ws, n, r.column, b[k]);
        const int c = crossing_16(chunk_sums_avx512(lanes, chunks_of(len[k])), _mm512_setzero_pd(), acc[k], target[k]);
        const int l = c < 0 ? -1 : crossing_16(_mm512_loadu_ps(lanes + c * chunk_lanes), acc[k], target[k]);
        first[k] = l < 0 ? -1 : static_cast<Eigen::Index>(c) * exp_chunk + l;
    }
    // The lane's 16 elements (past the end of the row: −Inf, whose exp is 0), gathered.
    static_assert(chunk_lanes == 16);  // a lane's elements lie 16 floats apart
    const __m512i offsets = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    const float* z = logits.col(static_cast<Eigen::Index>(r.column)).data();
    for (int k = 0; k < K; ++k) {
        if (first[k] < 0) continue;
        const auto left = static_cast<int>(len[k] - first[k]);  // elements of the block from the lane's first on
        const __mmask16 inside = _mm512_cmplt_epi32_mask(offsets, _mm512_set1_epi32(left));
        const __m512 x = _mm512_mask_i32gather_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), inside,
                                                  offsets, z + b[k] * row_block + first[k], 4);
        const __m512 e = exp2_avx512{ws.block_max[base + static_cast<std::size_t>(b[k])], r.inv_t}(x);
        const int i = crossing_16(e, acc[k], target[k]);
        if (i < 0) continue;
        alignas(64) float ev[chunk_lanes];
        _mm512_store_ps(ev, e);
        const float weight = ev[i] * static_cast<float>(scale[k]);
        out[k] = {b[k] * row_block + first[k] + i * chunk_lanes, static_cast<double>(weight)};
    }
}
#endif

/// The 16 exponentials of the lane whose first element is `first` (offset in block b) of a
/// plain row, recomputed through the pass's own exp (0 past the end of the row): the floats
/// its lane sum was made of, before the block's scale.
inline void recompute_lane(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                           const verify_workspace& ws, Eigen::Index b, Eigen::Index first, float* e) {
    const Eigen::Index n = logits.rows(), len = block_len(n, b);
    const float* z = logits.col(static_cast<Eigen::Index>(r.column)).data() + b * row_block;
    alignas(64) float in[chunk_lanes];
    for (Eigen::Index k = 0; k < chunk_lanes; ++k) {
        const Eigen::Index at = first + k * chunk_lanes;
        in[k] = at < len ? z[at] : -std::numeric_limits<float>::infinity();
    }
    exp_lane(in, e, ws.block_max[block_base(n, r.column) + static_cast<std::size_t>(b)], r.inv_t);
}

/// One inverse-CDF draw from a plain row with uniform u, in (block, chunk, lane, element)
/// order: the block by binary search on the running block masses `prefix`, the 256-token chunk
/// and then the lane by the lane sums the normalizing pass kept (see chunked_exp_pass), and
/// finally one of the lane's 16 elements, whose exponentials are the only ones recomputed (or
/// read, on short rows whose pass kept them). Any fixed order of the elements gives a draw
/// from p; this one costs a binary search, 16 exps and about 40 adds per draw. On long rows
/// with AVX-512 the walk has no branch on u (draw_plain_avx512): a draw's branches mispredict
/// about half the time, and a proposal's loads wait behind the mispredictions of the one before
/// (on fresh uniforms: 65 against 85 ns a draw at V = 32000, 76 against 109 ns at V = 151936).
/// Short rows, whose exponentials are kept, keep the scalar walk, which is as fast there.
inline weighted_index draw_plain_scalar(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                                        const verify_workspace& ws, const double* prefix, double u) {
    const Eigen::Index n = logits.rows(), nb = blocks_of(n);
    const std::size_t base = block_base(n, r.column);
    const double* mass = ws.block_mass.data() + base;
    double target = u * prefix[nb - 1];
    Eigen::Index b = std::min<Eigen::Index>(nb - 1, std::upper_bound(prefix, prefix + nb, target) - prefix);
    while (b > 0 && !(mass[b] > 0.0)) --b;  // rounding overshoot past the last block with mass
    const double scale = ws.scale[base + static_cast<std::size_t>(b)];
    // From here on, weights are the block's exp((z − ref_b) / T), before scaling.
    target = (target - (b > 0 ? prefix[b - 1] : 0.0)) / scale;
    double acc = 0.0;
    const Eigen::Index len = block_len(n, b), chunks = chunks_of(len);
    const Eigen::Index first = pick_lane(chunk_data(ws, n, r.column, b), chunks, acc, target);
    SPECDEC_ASSERT(first >= 0, "draw_plain: a block with mass has no lane with weight");
    // The lane's elements (0 past the end of the row): kept by the pass, or recomputed through
    // the pass's own exp.
    alignas(64) float e[chunk_lanes];
    if (r.exps) {
        const float* kept = ws.rows.col(static_cast<Eigen::Index>(r.column)).data() + b * row_block;
        for (Eigen::Index k = 0; k < chunk_lanes; ++k) {
            const Eigen::Index at = first + k * chunk_lanes;
            e[k] = at < len ? kept[at] : 0.0f;
        }
    } else {
        recompute_lane(r, logits, ws, b, first, e);
    }
    double w[chunk_lanes];
    for (Eigen::Index k = 0; k < chunk_lanes; ++k) w[k] = e[k];
    const int k = pick_crossing(w, static_cast<int>(chunk_lanes), acc, target);
    SPECDEC_ASSERT(k >= 0, "draw_plain: a lane with weight has no element with weight");
    return {b * row_block + first + k * chunk_lanes, static_cast<double>(e[k] * static_cast<float>(scale))};
}

/// See draw_plain_scalar; on long rows with AVX-512, draw_plain_avx512 (the scalar walk only
/// where rounding overshoots).
inline weighted_index draw_plain(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                                 const verify_workspace& ws, const double* prefix, double u) {
#if defined(__AVX512F__)
    if (!r.exps) {
        weighted_index y;
        draw_plain_avx512<1>(r, logits, ws, prefix, &u, &y);
        if (y.index >= 0) return y;
    }
#endif
    return draw_plain_scalar(r, logits, ws, prefix, u);
}

/// Rejection-sampling proposals of the residual are made this many at a time on plain rows
/// that keep no exponentials (more than kept_row_limit tokens): the group's uniforms are drawn
/// first, two a proposal in the order one-by-one proposals would draw them, then its draws
/// (draw_plain_group: their loads and arithmetic overlap), then its tests in order; the first
/// accepted proposal is returned and the rest of the group's uniforms go unused. The tokens are
/// those one-by-one proposals would give from the same uniforms; the i.i.d. proposals tested in
/// order give the residual's distribution however many are made (see sample_residual).
inline constexpr int proposal_group = 4;

/// After a rejection of a point-mass draft (q = δ(x)) on a long plain row, the residual, p with
/// p(x) lowered, is drawn by at most this many proposals from p (two groups; each accepted
/// unless it is x) before the exact draw from the block masses (see sample_residual).
inline constexpr Eigen::Index point_mass_proposals = 2 * proposal_group;

/// draw_plain with each of the uniforms u[0..proposal_group) into out[..] (a plain row that
/// keeps no exponentials); with AVX-512 the draws run side by side (draw_plain_avx512).
inline void draw_plain_group(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                             const verify_workspace& ws, const double* prefix, const double* u, weighted_index* out) {
#if defined(__AVX512F__)
    draw_plain_avx512<proposal_group>(r, logits, ws, prefix, u, out);
    for (int k = 0; k < proposal_group; ++k)
        if (out[k].index < 0) out[k] = draw_plain_scalar(r, logits, ws, prefix, u[k]);
#else
    for (int k = 0; k < proposal_group; ++k) out[k] = draw_plain(r, logits, ws, prefix, u[k]);
#endif
}

/// max(0, a·p − b·q) over block blk of a row of n tokens whose values are in ws.rows (see
/// in_rows), q being the draft column's data: an expression, evaluated where it is used.
inline auto kept_residual(const target_row& r, const verify_workspace& ws, const float* q, Eigen::Index n,
                          Eigen::Index blk, float a, float b) {
    const Eigen::Index start = blk * row_block, len = block_len(n, blk);
    const float scale = ws.scale[block_base(n, r.column) + static_cast<std::size_t>(blk)];
    return (ws.rows.col(static_cast<Eigen::Index>(r.column)).segment(start, len).array() * (a * scale) -
            b * Eigen::Map<const Eigen::ArrayXf>(q + start, len))
        .max(0.0f);
}

/// Lane sums of a row of one block: chunk c, lane l at [c·chunk_lanes + l].
using short_row_lanes = std::array<float, chunks_per_block * chunk_lanes>;

/// For a row of one block whose values are in ws.rows (see in_rows): writes the residual
/// weights max(0, a·p − b·q) into ws.block (zero up to the end of the last 256-token chunk)
/// and their lane sums into `lanes`, in one vectorized pass; returns the total. The lanes are
/// those of draw_plain (chunk c, lane l: the elements c·exp_chunk + l + chunk_lanes·k).
inline double short_residual_weights(const target_row& r, const float* q, float a, float b, verify_workspace& ws,
                                     Eigen::Index n, short_row_lanes& lanes_out) {
    const Eigen::Index chunks = chunks_of(n);
    float* w = ws.block.data();
    Eigen::Map<Eigen::ArrayXf>(w, n) = kept_residual(r, ws, q, n, 0, a, b);
    std::fill(w + n, w + chunks * exp_chunk, 0.0f);
    double total = 0.0;
    for (Eigen::Index c = 0; c < chunks; ++c) {
        using lane_matrix = Eigen::Matrix<float, chunk_lanes, exp_chunk / chunk_lanes>;
        auto lanes = Eigen::Map<Eigen::Matrix<float, chunk_lanes, 1>>(lanes_out.data() + c * chunk_lanes);
        lanes = Eigen::Map<const lane_matrix>(w + c * exp_chunk).rowwise().sum();
        total += static_cast<double>(lanes.sum());
    }
    return total;
}

/// One inverse-CDF draw with uniform u from the weights and lane sums short_residual_weights
/// made (total their sum), in draw_plain's (chunk, lane, element) order; never an element of
/// weight 0 (on rounding overshoot, the last element with weight).
inline Eigen::Index draw_short_residual(const verify_workspace& ws, const short_row_lanes& lane_sums, Eigen::Index n,
                                        double total, double u) {
    const float* w = ws.block.data();
    double target = u * total, acc = 0.0;
    const Eigen::Index first = pick_lane(lane_sums.data(), chunks_of(n), acc, target);
    SPECDEC_ASSERT(first >= 0, "draw_short_residual: a residual with weight has no lane with weight");
    double v[chunk_lanes];
    for (Eigen::Index k = 0; k < chunk_lanes; ++k) v[k] = w[first + k * chunk_lanes];
    const int k = pick_crossing(v, static_cast<int>(chunk_lanes), acc, target);
    SPECDEC_ASSERT(k >= 0, "draw_short_residual: a lane with weight has no element with weight");
    return first + k * chunk_lanes;
}

/// Running sums of row r's block masses into ws.sums (for draw_plain); returns the total.
inline const double* block_prefix(const target_row& r, Eigen::Index vocab, verify_workspace& ws) {
    const Eigen::Index nb = blocks_of(vocab);
    const double* mass = ws.block_mass.data() + block_base(vocab, r.column);
    ws.sums.resize(static_cast<std::size_t>(nb));
    double acc = 0.0;
    for (Eigen::Index b = 0; b < nb; ++b) ws.sums[static_cast<std::size_t>(b)] = acc += mass[b];
    return ws.sums.data();
}

/// Draws a token from p itself (after full acceptance, or as the fallback of an empty
/// residual): plain rows by draw_plain, stored rows blockwise.
inline token_id sample_target(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                              verify_workspace& ws, double u) {
    if (r.kind == target_row::form::greedy) return static_cast<token_id>(r.argmax);
    const Eigen::Index n = logits.rows(), nb = blocks_of(n);
    const double* prefix = block_prefix(r, n, ws);
    if (r.kind == target_row::form::plain) return static_cast<token_id>(draw_plain(r, logits, ws, prefix, u).index);
    const double* mass = ws.block_mass.data() + block_base(n, r.column);
    return static_cast<token_id>(draw_by_blocks(
        mass, nb, n, prefix[nb - 1], u, ws.block.data(),
        [&](Eigen::Index b, Eigen::Index off, Eigen::Index len, float* out) { fill_block(r, logits, ws, b, off, len, out); },
        prefix));
}

/// sample_target with a uniform from rng; a greedy row gives its argmax and draws none.
template <class G>
token_id sample_target_from(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, verify_workspace& ws,
                            G& rng) {
    if (r.kind == target_row::form::greedy) return static_cast<token_id>(r.argmax);
    return sample_target(r, logits, ws, uniform01(rng));
}

/// Σ max(0, a·p(y) − b·q(y)) over block blk of a prepared (non-greedy) row, q being the draft
/// column's data: one fused pass (exp, scale, subtract, clamp, sum) with nothing written.
inline double block_residual(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                             const verify_workspace& ws, const float* q, Eigen::Index blk, float a, float b) {
    const Eigen::Index n = logits.rows(), start = blk * row_block, len = block_len(n, blk);
    const std::size_t at = block_base(n, r.column) + static_cast<std::size_t>(blk);
    if (ws.block_mass[at] == 0.0) return 0.0;  // p = 0 on the block: max(0, −b·q) = 0
    const auto col = static_cast<Eigen::Index>(r.column);
    if (in_rows(r)) return kept_residual(r, ws, q, n, blk, a, b).sum();
    return residual_sum(logits.col(col).data() + start, q + start, len, ws.block_max[at], r.inv_t, a * ws.scale[at], b,
                        block_len(n, blk + 1));
}

/// Draws the emitted token from norm(max(0, a·p − b·q)) for row r against draft column
/// r.column (Leviathan et al. 2023, Sec. 2.3 with a = 1, b = l (App. A.5); Sun et al.'s
/// residual with a = w_τ, b = 1), or from p when that residual is empty. q == nullptr: point
/// mass at x. Uses the generator from its first uniform on.
///
/// With draft distributions the residual is drawn by rejection sampling from p: propose y ~ p
/// (block masses, then one block), accept with probability max(0, a·p(y) − b·q(y)) / (a·p(y)).
/// Each proposal costs 16 exponentials (see draw_plain), not a row, and is accepted with
/// probability R / a, where R is the residual mass. R >= R_lo = max(a·p(x) − b·q(x),
/// (a − b) + max(0, b·q(x) − a·p(x)), 0), from Σ max(0, a·p − b·q) − Σ max(0, b·q − a·p) = a − b:
/// the number of proposals follows from it (see residual_proposal_cost). If none is accepted,
/// one exact pass over the residual (block sums, then one block) draws it; short rows whose
/// values are kept (fewer than residual_proposal_cost tokens) make no proposal and go to that
/// pass directly. Either way the token has exactly
/// the normalized residual's distribution: each attempt that accepts returns y with
/// probability ∝ max(0, a·p(y) − b·q(y)), and the final exact draw has that distribution too,
/// so the mixture over where the procedure stops does as well (von Neumann's rejection
/// method). In exact token verification a rejection happens with probability R, so the
/// expected number of proposals per verification is at most 1 however small R is. For a point
/// mass the residual is p with p(x) lowered, whose mass and block sums follow from the block
/// masses; on long plain rows up to point_mass_proposals proposals (accepted unless they hit x)
/// come before its exact draw, which fills and scans part of one block. With draft
/// distributions q = c · the column (c = 1 unless the columns come with scales).
template <class G>
token_id sample_residual(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                         const Eigen::Ref<const Eigen::MatrixXf>* q, float c, token_id x, float a, float b,
                         verify_workspace& ws, G& rng) {
    // p = δ(argmax): the residual is a multiple of δ(argmax) or empty, and the fallback is p
    // as well: the argmax either way, drawn with no uniform.
    if (r.kind == target_row::form::greedy) return static_cast<token_id>(r.argmax);
    const double u = uniform01(rng);
    const Eigen::Index n = logits.rows(), nb = blocks_of(n);
    const auto j = static_cast<Eigen::Index>(r.column);
    const double* mass = ws.block_mass.data() + block_base(n, r.column);
    float* buf = ws.block.data();
    auto fill_p = [&](Eigen::Index blk, Eigen::Index off, Eigen::Index len, float* out) {
        fill_block(r, logits, ws, blk, off, len, out);
    };
    ws.sums.resize(static_cast<std::size_t>(nb));
    double total = 0.0;
    // q(k): c times the draft column, or the point mass at x. The passes below take b·q as
    // bc times the column.
    const float* qc = q == nullptr ? nullptr : q->col(j).data();
    auto q_at = [&](Eigen::Index k) { return qc == nullptr ? (k == x ? 1.0f : 0.0f) : c * qc[k]; };
    const float bc = b * c;
    // Point mass at x: the residual is a·p with a·p(x) lowered by b, whose block sums follow
    // from the block masses (no pass): its mass R is known, and the exact draw costs the fill
    // and scan of one block.
    double px_left = 0.0;
    if (qc == nullptr) {
        const Eigen::Index xb = x / row_block;
        const double px = a * prob_of(r, logits, ws, x);
        px_left = std::max(0.0, px - b);
        for (Eigen::Index blk = 0; blk < nb; ++blk) {
            double bs = a * mass[blk];
            if (blk == xb) bs = std::max(0.0, bs - px + px_left);
            ws.sums[static_cast<std::size_t>(blk)] = bs;
            total += bs;
        }
        if (!(total > residual_mass_floor)) return sample_target(r, logits, ws, u);
    }
    // A row of one block whose values are kept has an exact pass with no exp (see
    // short_residual_weights): about 0.1 ns a token against about 40 ns a proposal, so that a
    // proposal pays for itself only where it is accepted with probability above about 400 / V.
    // Below residual_proposal_cost tokens that needs R > 0.4: such rows go to the pass at once
    // (budget 0), with u as its uniform.
    const bool short_kept = nb == 1 && in_rows(r);
    Eigen::Index proposals = 0;
    if (qc == nullptr) {
        // Point mass: the exact draw costs about as much as ten proposals (filling and scanning
        // part of one block), so proposals pay only on long plain rows (16 exps each), where one
        // is accepted with probability R / a: at most point_mass_proposals when that is >= 1/4.
        if (r.kind == target_row::form::plain && !r.exps && total >= 0.25 * a) proposals = point_mass_proposals;
    } else {
        const Eigen::Index budget = short_kept ? n / residual_proposal_cost
                                               : std::max<Eigen::Index>(1, n / residual_proposal_cost);
        proposals = budget;
        if (budget > 0) {
            const double ap = a * prob_of(r, logits, ws, x), bq = static_cast<double>(b) * q_at(x);
            const double r_low = std::max({ap - bq, (static_cast<double>(a) - b) + std::max(0.0, bq - ap), 0.0});
            // When R >= R_lo says that the a / R_lo proposals expected cost at most the budget
            // (about one pass), 6 a / R_lo of them (all fail with probability <= e^−6);
            // otherwise the budget, then the pass (at most about twice the cost of the better
            // choice, whatever R is).
            if (r_low > 0.0 && a / r_low <= static_cast<double>(budget))
                proposals = static_cast<Eigen::Index>(std::ceil(6.0 * a / r_low));
        }
    }
    const double* prefix = proposals > 0 ? block_prefix(r, n, ws) : nullptr;  // running block masses
    // Long plain rows make their proposals in groups (see proposal_group): the group's
    // uniforms in the order of one-by-one proposals (draw, test, draw, test, ...), then its
    // draws, then its tests in order.
    const int group = r.kind == target_row::form::plain && !r.exps ? proposal_group : 1;
    constexpr auto most = static_cast<std::size_t>(proposal_group);
    double draw_u[most], test_u[most];
    weighted_index y[most];
    for (Eigen::Index t = 0; t < proposals; t += group) {
        for (int k = 0; k < group; ++k) {
            draw_u[k] = t + k == 0 ? u : uniform01(rng);
            test_u[k] = uniform01(rng);
        }
        if (group > 1) {
            draw_plain_group(r, logits, ws, prefix, draw_u, y);
        } else if (r.kind == target_row::form::plain) {
            y[0] = draw_plain(r, logits, ws, prefix, draw_u[0]);
        } else {
            y[0].index = draw_by_blocks(mass, nb, n, prefix[nb - 1], draw_u[0], buf, fill_p, prefix);
            y[0].weight = buf[y[0].index % row_block];
        }
        for (int k = 0; k < group; ++k) {
            const double py = static_cast<double>(a) * y[k].weight;  // the weight y was drawn with
            const double ry = py - static_cast<double>(b) * q_at(y[k].index);
            if (test_u[k] * py < ry) return static_cast<token_id>(y[k].index);
        }
    }
    if (qc == nullptr) {  // the exact draw of the point mass's residual
        const double w = proposals > 0 ? uniform01(rng) : u;
        return static_cast<token_id>(draw_by_blocks(
            ws.sums.data(), nb, n, total, w, buf, [&](Eigen::Index blk, Eigen::Index off, Eigen::Index len, float* out) {
                fill_p(blk, off, len, out);
                Eigen::Map<Eigen::VectorXf>(out, len) *= a;
                const Eigen::Index at = x - blk * row_block - off;
                if (at >= 0 && at < len) out[at] = static_cast<float>(px_left);
            }));
    }
    // No proposal accepted: one exact pass. A row of one block whose values are kept writes
    // the residual's weights and lane sums, then draws in lane order (any fixed order of the
    // elements gives an exact draw); longer rows take block sums of the residual, then fill
    // and scan the one block the draw lands in.
    if (short_kept) {
        short_row_lanes lanes;
        total = short_residual_weights(r, qc, a, bc, ws, n, lanes);
        const double w = proposals > 0 ? uniform01(rng) : u;
        if (!(total > residual_mass_floor)) return sample_target(r, logits, ws, w);
        return static_cast<token_id>(draw_short_residual(ws, lanes, n, total, w));
    }
    for (Eigen::Index blk = 0; blk < nb; ++blk) {
        const double bs = block_residual(r, logits, ws, qc, blk, a, bc);
        ws.sums[static_cast<std::size_t>(blk)] = bs;
        total += bs;
    }
    const double w = uniform01(rng);
    if (!(total > residual_mass_floor)) return sample_target(r, logits, ws, w);
    return static_cast<token_id>(draw_by_blocks(
        ws.sums.data(), nb, n, total, w, buf, [&](Eigen::Index blk, Eigen::Index off, Eigen::Index len, float* out) {
            fill_p(blk, off, len, out);
            Eigen::Map<Eigen::ArrayXf> o(out, len);
            o = (o * a - bc * Eigen::Map<const Eigen::ArrayXf>(qc + blk * row_block + off, len)).max(0.0f);
        }));
}

/// Throws unless every token is in [0, vocab), naming `what` and the first bad entry.
inline void check_token_range(std::span<const token_id> tokens, std::ptrdiff_t vocab, const char* where,
                              const char* what) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            fail_invalid(where, ": ", what, "[", i, "] = ", tokens[i], " is out of range [0, vocab_size = ", vocab,
                         ")");
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
    check_token_range(draft_tokens, vocab, where, "draft_tokens");
}

/// Throws unless `scales` has one finite, positive factor per draft column (`columns`);
/// messages call them `name`.
inline void check_draft_scales(std::span<const float> scales, Eigen::Index columns, const char* where,
                               const char* name = "draft_scales") {
    if (static_cast<Eigen::Index>(scales.size()) != columns)
        fail_invalid(where, ": ", name, " has ", scales.size(), " entries; expected one per draft column = ", columns);
    for (std::size_t i = 0; i < scales.size(); ++i)
        if (!(scales[i] > 0.0f && scales[i] < std::numeric_limits<float>::infinity()))
            fail_invalid(where, ": ", name, "[", i, "] = ", scales[i], " must be finite and positive");
}

/// Sizes the workspace for V x (n + 1) rows; grows only, so a shorter draft reuses storage.
/// The V x (n + 1) matrix of rows is allocated only under truncating sampling or for short rows
/// (at most kept_row_limit tokens).
inline void reserve_rows(verify_workspace& ws, Eigen::Index vocab, std::size_t n, const sampling_config& s) {
    if (s.temperature == 0.0f) return;  // greedy rows keep nothing
    const auto cols = static_cast<Eigen::Index>(n + 1);
    if ((truncates(s) || vocab <= kept_row_limit) && (ws.rows.rows() != vocab || ws.rows.cols() < cols))
        ws.rows.resize(vocab, cols);
    const std::size_t need = static_cast<std::size_t>(blocks_of(vocab)) * static_cast<std::size_t>(cols);
    if (ws.scale.size() < need) {
        ws.scale.resize(need);
        ws.block_max.resize(need);
        ws.block_mass.resize(need);
        ws.chunk_lanes.resize(need * static_cast<std::size_t>(chunks_per_block * chunk_lanes));
        ws.q_lanes.resize(ws.chunk_lanes.size());
    }
    if (ws.block.size() < static_cast<std::size_t>(row_block)) ws.block.resize(static_cast<std::size_t>(row_block));
}

/// Column i's scale c_i (q_i = c_i · draft_probs column i): 1 without scales.
inline float draft_scale(const float* scales, std::size_t i) { return scales == nullptr ? 1.0f : scales[i]; }

/// q_i(x) = c · draft_probs(x, i) (1 for a point mass).
inline double draft_prob(const Eigen::Ref<const Eigen::MatrixXf>* q, std::size_t i, token_id x, float c) {
    return q == nullptr ? 1.0 : static_cast<double>(c * (*q)(x, static_cast<Eigen::Index>(i)));
}

/// Draft column i's data when it is to be checked in the pass over row i (temperature > 0),
/// else null; at temperature 0 only the entries the decision reads are checked, here q_i(x_i).
inline const float* column_to_check(const Eigen::Ref<const Eigen::MatrixXf>* q, bool check, std::size_t i, token_id x,
                                    float c, const sampling_config& s, const char* where) {
    if (!check) return nullptr;
    if (s.temperature == 0.0f) {
        check_draft_entry(*q, x, i, c, where);
        return nullptr;
    }
    return q->col(static_cast<Eigen::Index>(i)).data();
}

/// Token verification (Leviathan et al. 2023, Alg. 1). q == nullptr: point-mass drafts;
/// q_scales == nullptr: q_i is column i itself, else q_scales[i] times it.
template <class G>
verify_result verify_tokens(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                            std::span<const token_id> draft_tokens, const Eigen::Ref<const Eigen::MatrixXf>* q,
                            const float* q_scales, const sampling_config& sampling, G& rng, verify_workspace& ws,
                            const verify_options& opts, const char* where) {
    const std::size_t n = draft_tokens.size();
    const double lenience = opts.lenience;
    const bool check = q != nullptr && opts.check_draft_distributions;
    const bool greedy = sampling.temperature == 0.0f;
    reserve_rows(ws, target_logits.rows(), n, sampling);
    // Test x_1..x_γ left to right with r_i ~ U(0, 1); the first failure ends the block.
    // Rows after it are never read. No row is written out: the test needs p(x) only, and a
    // draw recomputes the one block it lands in.
    for (std::size_t i = 0; i < n; ++i) {
        const token_id x = draft_tokens[i];
        const float c = draft_scale(q_scales, i);
        const float* check_q = column_to_check(q, check, i, x, c, sampling, where);
        const target_row row = prepare_row(target_logits, i, sampling, ws, where, check_q, c);
        const double qx = draft_prob(q, i, x, c);
        const double px = prob_of(row, target_logits, ws, x);
        // Greedy rows have p(x) in {0, 1}: the test below does not depend on r, so none is drawn.
        const double r = greedy ? 0.0 : uniform01(rng);
        // Accept iff r < p(x) / (l q(x)), i.e. with probability min(1, p/(l q)) (App. A.5
        // with l = 1 is Alg. 1). A token the drafter gave q(x) = 0 is rejected.
        if (qx > 0.0 && r * lenience * qx < px) continue;
        // Rejected at position i: resample from p' = norm(max(0, p_i − l q_i)) (Sec. 2.3).
        return {i, sample_residual(row, target_logits, q, c, x, 1.0f, opts.lenience, ws, rng)};
    }
    // Every draft accepted: the bonus token comes from p_{γ+1}.
    const target_row row = prepare_row(target_logits, n, sampling, ws, where);
    return {n, sample_target_from(row, target_logits, ws, rng)};
}

/// Σ_x max(0, w p(x) − q(x)) for a prepared row and its draft column (q = c · the column),
/// or a point mass at x; at temperature 0 checks the one draft entry it reads when `check`.
inline double residual_mass(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                            const Eigen::Ref<const Eigen::MatrixXf>* q, float c, token_id x, double w, bool check,
                            verify_workspace& ws, const char* where) {
    const auto j = static_cast<Eigen::Index>(r.column);
    if (q == nullptr) {
        // q = δ(x): w (1 − p(x)) + max(0, w p(x) − 1), from p(x) alone.
        const double px = prob_of(r, logits, ws, x);
        return w * (1.0 - px) + std::max(0.0, w * px - 1.0);
    }
    const auto qc = q->col(j);
    if (r.kind == target_row::form::greedy) {
        // p = δ(a): max(0, w − q(a)); the other terms are max(0, −q) = 0.
        if (check) check_draft_entry(*q, r.argmax, r.column, c, where);
        return std::max(0.0, w - static_cast<double>(c * qc[r.argmax]));
    }
    // (Plain and stored rows have temperature > 0: their draft column was checked in the pass
    // that prepared them.)
    double total = 0.0;
    for (Eigen::Index blk = 0; blk < blocks_of(logits.rows()); ++blk)
        total += block_residual(r, logits, ws, qc.data(), blk, static_cast<float>(w), c);
    return total;
}

/// A lower bound on Σ_x max(0, w p(x) − q(x)) for a plain row whose pass kept the draft
/// column's lane sums: Σ over lanes L of max(0, w p(L) − q(L)) (the positive part of a sum is
/// at most the sum of the positive parts). Reads V/16 floats of each, no exp; within rounding of
/// the exact value when p − q keeps one sign inside each lane of 16 tokens. q = c · the
/// column whose lane sums were kept.
inline double residual_mass_lower_bound(const target_row& r, Eigen::Index vocab, const verify_workspace& ws, double w,
                                        float c) {
    const std::size_t base = block_base(vocab, r.column);
    double total = 0.0;
    for (Eigen::Index b = 0; b < blocks_of(vocab); ++b) {
        const auto at = base + static_cast<std::size_t>(b);
        if (ws.block_mass[at] == 0.0) continue;  // p = 0 there: no positive part
        const Eigen::Index count = chunks_of(block_len(vocab, b)) * chunk_lanes;
        const std::size_t off = chunk_offset(vocab, r.column, b);
        const Eigen::Map<const Eigen::ArrayXf> p(ws.chunk_lanes.data() + off, count), q(ws.q_lanes.data() + off, count);
        total += (p * static_cast<float>(w * ws.scale[at]) - q * c).max(0.0f).sum();
    }
    return total;
}

/// For a plain row prepared without the draft-column check: the lane sums of draft column
/// r.column, laid out as the checking pass keeps them (one pass over q, no exp), so that
/// residual_mass_lower_bound can be used; far cheaper than the pass over the row that R needs.
inline void keep_draft_lanes(target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& q, verify_workspace& ws) {
    const Eigen::Index n = q.rows();
    const float* qc = q.col(static_cast<Eigen::Index>(r.column)).data();
    for (Eigen::Index b = 0; b < blocks_of(n); ++b) {
        if (ws.block_mass[block_base(n, r.column) + static_cast<std::size_t>(b)] == 0.0) continue;
        float* out = ws.q_lanes.data() + chunk_offset(n, r.column, b);
        const Eigen::Index start = b * row_block, len = block_len(n, b);
        for (Eigen::Index c = 0; c * exp_chunk < len; ++c)
            chunk_lane_sums(qc + start + c * exp_chunk, std::min(exp_chunk, len - c * exp_chunk), out + c * chunk_lanes);
    }
    r.q_lanes = true;
}

/// For token y of a plain row that keeps no exponentials, whose pass kept the draft column's
/// lane sums: the fraction 1 − l / R_lane of max(0, w p(y) − q(y)) that is not covered by its
/// lane's term l = max(0, w p(lane) − q(lane)) of residual_mass_lower_bound (the same floats),
/// R_lane being Σ max(0, w p − q) over the lane's 16 tokens, recomputed as a draw does. Summed
/// over a row, max(0, w p(y) − q(y)) times this fraction gives R − L, L the lower bound.
/// q = c · the column at `q`.
inline double lane_excess_fraction(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                                   const verify_workspace& ws, const float* q, float c, Eigen::Index y, double w) {
    const Eigen::Index n = logits.rows(), b = y / row_block, in_block = y - b * row_block;
    const Eigen::Index first = in_block / exp_chunk * exp_chunk + in_block % chunk_lanes;  // the lane's first token
    const Eigen::Index len = block_len(n, b), start = b * row_block;
    const std::size_t at = block_base(n, r.column) + static_cast<std::size_t>(b);
    const float scale = ws.scale[at];
    alignas(64) float e[chunk_lanes];
    recompute_lane(r, logits, ws, b, first, e);
    double lane_r = 0.0;
    for (Eigen::Index k = 0; k < chunk_lanes; ++k) {
        const Eigen::Index o = first + k * chunk_lanes;
        if (o < len)
            lane_r += std::max(0.0, w * static_cast<double>(e[k] * scale) - static_cast<double>(c * q[start + o]));
    }
    const std::size_t lane = chunk_offset(n, r.column, b) + static_cast<std::size_t>(first / exp_chunk * chunk_lanes +
                                                                                     first % chunk_lanes);
    const float low = std::max(0.0f, ws.chunk_lanes[lane] * static_cast<float>(w * scale) - ws.q_lanes[lane] * c);
    return lane_r > 0.0 ? std::max(0.0, 1.0 - static_cast<double>(low) / lane_r) : 0.0;
}

/// Block verification's test η_i < h_i = R / (R + 1 − w) once the bounds have left it open,
/// that is with η_i known to lie in [L / (L + 1 − w), w) (L = low, the lane-level lower bound
/// on R), decided without the pass over the row that R needs. Conditional on that, the test
/// holds with probability g = (R − L) / ((R + 1 − w)(w − L)) = t / (t + B (w − R)), where
/// t = R − L and B = L + 1 − w <= 1: a ratio of the probabilities of two disjoint events,
/// which rounds of independent trials sample without knowing R (a Bernoulli factory, as in
/// the two-coin algorithm for Barker's acceptance ratio). Both events are read off one proposal
/// y ~ p (a draw, as in sample_residual) and one uniform u, as disjoint parts of [0, p(y)):
///  - u p(y) < B min(w p(y), q(y)): the test fails (Σ_y min(w p, q) = w − R);
///  - else u p(y) < B min(w p(y), q(y)) + max(0, w p(y) − q(y)) · lane_excess_fraction: it
///    holds (these parts sum to R − L);
///  - else a new round (they fit: B min(w p, q) + max(0, w p − q) <= w p).
/// Rounds are independent, so the test holds with probability t / (t + B (w − R)) = g, after
/// 1 / ((R + 1 − w)(w − L)) rounds on average, at most 1 / (B (w − L)). Returns 1 or 0, or −1
/// (nothing decided) when that bound exceeds the proposal budget (V / residual_proposal_cost,
/// about one pass) or the budget runs out: the caller then computes R and tests η_i < h_i,
/// which, η_i being independent of the rounds, holds with probability g too. The decision has
/// exactly the test's probability; only the uniforms it takes differ.
template <class G>
int block_test_by_coins(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, const float* q, float c,
                        double w, double low, verify_workspace& ws, G& rng) {
    const Eigen::Index n = logits.rows();
    const double b = low + (1.0 - w);
    const Eigen::Index budget = std::max<Eigen::Index>(1, n / residual_proposal_cost);
    if (!(w > low && 1.0 / (b * (w - low)) <= static_cast<double>(budget))) return -1;  // (also when b = 0)
    const double* prefix = block_prefix(r, n, ws);
    for (Eigen::Index t = 0; t < budget; ++t) {
        const weighted_index y = draw_plain(r, logits, ws, prefix, uniform01(rng));
        const double at = uniform01(rng) * y.weight, wp = w * y.weight, qy = static_cast<double>(c * q[y.index]);
        const double fails = b * std::min(wp, qy), over = std::max(0.0, wp - qy);
        if (at < fails) return 0;
        if (at < fails + over && at < fails + over * lane_excess_fraction(r, logits, ws, q, c, y.index, w)) return 1;
    }
    return -1;
}

/// Block verification (Sun et al. 2024, Alg. 2), in Leviathan's notation:
///   w_0 = 1; w_i = min(1, w_{i−1} p_i(x_i) / q_i(x_i));
///   h_i = R_i / (R_i + 1 − w_i) with R_i = Σ_x max(0, w_i p_{i+1}(x) − q_{i+1}(x)) for i < γ,
///   h_γ = w_γ; τ = the LAST i with η_i < h_i (0 if none);
///   accept x_1..x_τ, then sample from p_{γ+1} if τ = γ, else from norm(max(0, w_τ p_{τ+1} − q_{τ+1})).
///
/// Evaluation order (same law of τ): a forward pass normalizes rows 1..k, k the first
/// position where w_k = 0 (or γ), and records w_i, p_i(x_i), q_i(x_i); then τ is searched
/// from the end, i = k down to 1, stopping at the first hit. R_i, the only quantity that needs
/// a second pass over a row (and over q_{i+1}), is computed only when bounds cannot decide:
/// R_i <= w_i gives h_i <= w_i (no hit when η_i >= w_i), and lower bounds on R_i give lower
/// bounds on h_i (a hit when η_i is below one): R_i >= w_i p_{i+1}(x_{i+1}) − q_{i+1}(x_{i+1}),
/// and the lane-level bound of residual_mass_lower_bound (lane sums of q kept by the checking
/// pass, or made then from q alone), which decides nearly every hit. What the bounds leave
/// open on a row that keeps no exponentials (more than kept_row_limit tokens) is decided by
/// block_test_by_coins, with exactly the test's probability, from a few proposals (about five
/// in verify_bench's typical mix); R_i is computed only when those could take more than the
/// proposal budget. So block verification usually costs the token scheme's passes plus a few
/// proposals. (On short rows R_i's pass needs no exp and costs less than the proposals.)
template <class G>
verify_result verify_block(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                           std::span<const token_id> draft_tokens, const Eigen::Ref<const Eigen::MatrixXf>* q,
                           const float* q_scales, const sampling_config& sampling, G& rng, verify_workspace& ws,
                           const verify_options& opts, const char* where) {
    const std::size_t n = draft_tokens.size();
    const bool check = q != nullptr && opts.check_draft_distributions;
    reserve_rows(ws, target_logits.rows(), n, sampling);
    const bool greedy = sampling.temperature == 0.0f;
    // Per-position scratch, grown only (one size check a call rather than five resize calls);
    // only entries 0..n−1 are written and read, so what a longer draft left beyond them is unused.
    if (ws.eta.size() < n) {
        ws.eta.resize(n);
        ws.weight.resize(n);
        ws.p_draft.resize(n);
        ws.q_draft.resize(n);
        ws.prepared.resize(n);
    }
    // At temperature 0 every w_i and h_i is 0 or 1, so η_i in [0, 1) decides nothing: none is drawn.
    for (std::size_t i = 0; i < n; ++i) ws.eta[i] = greedy ? 0.0 : uniform01(rng);
    // Forward: rows 0..k−1 (row i holds p_{i+1}), each draft column checked in its row's pass.
    std::size_t reached = 0;  // positions 1..reached have w > 0
    double w = 1.0;
    for (std::size_t i = 0; i < n; ++i) {
        const token_id x = draft_tokens[i];
        const float c = draft_scale(q_scales, i);
        const float* check_q = column_to_check(q, check, i, x, c, sampling, where);
        ws.prepared[i] = prepare_row(target_logits, i, sampling, ws, where, check_q, c);
        const double qx = draft_prob(q, i, x, c);
        const double px = prob_of(ws.prepared[i], target_logits, ws, x);
        ws.p_draft[i] = px;
        ws.q_draft[i] = qx;
        // A token the drafter gave q(x) = 0 ends every longer prefix (w = 0).
        w = qx > 0.0 ? std::min(1.0, w * px / qx) : 0.0;
        ws.weight[i] = w;
        if (w == 0.0) break;  // every later h is 0; later rows are never read
        reached = i + 1;
    }
    // Backward: τ = the last i <= reached with η_i < h_i.
    std::size_t tau = 0;
    for (std::size_t i = reached; i >= 1; --i) {
        const double wi = ws.weight[i - 1], eta = ws.eta[i - 1];
        if (i == n) {
            // h_γ = w_γ = min(1, w_{γ−1} p/q), tested as η q < w_{γ−1} p so that γ = 1 is
            // token verification draw for draw.
            const double w_prev = n >= 2 ? ws.weight[n - 2] : 1.0;
            if (eta * ws.q_draft[n - 1] < w_prev * ws.p_draft[n - 1]) {
                tau = i;
                break;
            }
            continue;
        }
        if (eta >= wi) continue;  // h_i <= w_i <= η_i
        const float c = draft_scale(q_scales, i);  // the scale of q_{i+1}, column i (i < n here)
        // R_i needs row i (p_{i+1}) and draft token i (x_{i+1}), both seen in the forward pass.
        const double low = wi * ws.p_draft[i] - (q == nullptr ? 1.0 : ws.q_draft[i]);
        bool hit = low > 0.0 && eta < low / (low + 1.0 - wi);
        if (!hit && q != nullptr && ws.prepared[i].kind == target_row::form::plain) {
            // A tighter lower bound from lane sums of q (kept by the checking pass, else made
            // now from q alone): decides nearly every hit without a pass over the row.
            if (!ws.prepared[i].q_lanes) keep_draft_lanes(ws.prepared[i], *q, ws);
            const double lanes_low = residual_mass_lower_bound(ws.prepared[i], target_logits.rows(), ws, wi, c);
            hit = lanes_low > 0.0 && eta < lanes_low / (lanes_low + 1.0 - wi);
            // Still open (η in [h(L), w), L = lanes_low): on a long row, by coins rather than a pass.
            // (A positive draft-token bound above L would mean w_{i+1} = 1, after which this test
            // is almost never reached; the pass decides it.)
            if (!hit && !ws.prepared[i].exps && low <= lanes_low) {
                const float* qi = q->col(static_cast<Eigen::Index>(i)).data();
                const int coins = block_test_by_coins(ws.prepared[i], target_logits, qi, c, wi, lanes_low, ws, rng);
                if (coins == 1) hit = true;
                if (coins == 0) continue;
            }
        }
        if (!hit) {
            const double big_r = residual_mass(ws.prepared[i], target_logits, q, c, draft_tokens[i], wi,
                                                 check && sampling.temperature == 0.0f, ws, where);
            const double h = big_r > 0.0 ? big_r / (big_r + 1.0 - wi) : 0.0;
            hit = eta < h;
        }
        if (hit) {
            tau = i;
            break;
        }
    }
    if (tau == n) {
        const target_row last = prepare_row(target_logits, n, sampling, ws, where);
        return {n, sample_target_from(last, target_logits, ws, rng)};
    }
    const double w_tau = tau == 0 ? 1.0 : ws.weight[tau - 1];
    // Row τ (0-based; p_{τ+1} in Sun et al.'s 1-based notation) was prepared in the forward pass.
    return {tau, sample_residual(ws.prepared[tau], target_logits, q, draft_scale(q_scales, tau), draft_tokens[tau],
                                 static_cast<float>(w_tau), 1.0f, ws, rng)};
}

template <class G>
verify_result dispatch_verify(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                              std::span<const token_id> draft_tokens, const Eigen::Ref<const Eigen::MatrixXf>* q,
                              const float* q_scales, const sampling_config& sampling, G& rng, verify_workspace& ws,
                              const verify_options& opts, const char* where) {
    if (opts.scheme == verification_scheme::block)
        return verify_block(target_logits, draft_tokens, q, q_scales, sampling, rng, ws, opts, where);
    return verify_tokens(target_logits, draft_tokens, q, q_scales, sampling, rng, ws, opts, where);
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
/// Randomness, all from `rng` through uniform01, and none at temperature 0 (where every
/// decision follows from the argmax): token scheme, one uniform per tested draft token; block
/// scheme, γ uniforms η_1..η_γ; then, either way, the emitted token: one uniform when it comes
/// from p (all drafts accepted, or point-mass drafts); after a rejection with draft
/// distributions, two per rejection-sampling proposal (see residual_proposal_cost for how many
/// are made; without truncation, on rows of more than 2048 tokens, they are made four at a
/// time, see detail::proposal_group) and, if none is accepted, one more for the exact draw.
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
    return detail::dispatch_verify(target_logits, draft_tokens, &draft_probs, nullptr, sampling, rng, ws, opts, where);
}

/// verify() with draft distributions given as weights and one factor per column:
/// q_i = draft_scales[i] · draft_probs.col(i), as standardize_weights_and_sample() writes
/// them, so that a drafter need not normalize its columns. The same decisions and draws as
/// verify() with the columns multiplied out (exactly so when the factors are powers of two);
/// with the check on, the products are what is checked.
///
/// \param draft_probs  V x γ non-negative weights (any positive multiple of q_i in column i).
/// \param draft_scales γ factors, each finite and > 0.
/// \throws std::invalid_argument as verify(), and for a draft_scales of the wrong length or
///         a factor that is not finite and positive.
///
/// \code
/// auto d = specdec::standardize_weights_and_sample(draft_logits, sampling, weights.col(i), u, sws);
/// scales[i] = d.scale;  // ... for each draft position i, then:
/// auto r = specdec::verify(target_logits, draft_tokens, weights, scales, sampling, rng, ws);
/// \endcode
template <random_generator G>
verify_result verify(const Eigen::Ref<const Eigen::MatrixXf>& target_logits, std::span<const token_id> draft_tokens,
                     const Eigen::Ref<const Eigen::MatrixXf>& draft_probs, std::span<const float> draft_scales,
                     const sampling_config& sampling, G&& rng, verify_workspace& ws, const verify_options& opts = {}) {
    constexpr const char* where = "specdec::verify";
    const Eigen::Index qr = draft_probs.rows(), qc = draft_probs.cols();
    detail::check_verify_inputs(target_logits, draft_tokens, &qr, &qc, sampling, opts, where);
    detail::check_draft_scales(draft_scales, qc, where);
    return detail::dispatch_verify(target_logits, draft_tokens, &draft_probs, draft_scales.data(), sampling, rng, ws,
                                   opts, where);
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
    return detail::dispatch_verify(target_logits, draft_tokens, nullptr, nullptr, sampling, rng, ws, opts, where);
}

}  // namespace specdec
