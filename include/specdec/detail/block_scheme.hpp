/// \file
/// Block verification (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding",
/// Alg. 2): the draft block verified jointly, its residual masses bounded before they are computed.
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

/// Σ_x max(0, w p(x) − q(x)) for a prepared row and its draft column (q = c · the column),
/// or a point mass at x; at temperature 0 checks the one draft entry it reads when `check`.
inline double residual_mass(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                            const Eigen::Ref<const Eigen::MatrixXf>* q, float c, token_id x, double w, bool check,
                            verify_buffers& ws, const char* where) {
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
inline double residual_mass_lower_bound(const target_row& r, Eigen::Index vocab, const verify_buffers& ws, double w,
                                        float c) {
    const std::size_t base = block_base(vocab, r.column);
    double total = 0.0;
    for (Eigen::Index b = 0; b < blocks_of(vocab); ++b) {
        const auto at = base + static_cast<std::size_t>(b);
        if (ws.block_mass[at] == 0.0) continue;  // p = 0 there: no positive part
        const Eigen::Index count = chunks_of(block_len(vocab, b)) * chunk_lanes;
        const std::size_t off = chunk_offset(vocab, r.column, b);
        total += positive_part_sum(ws.chunk_lanes.data() + off, static_cast<float>(w * ws.scale[at]),
                                   ws.q_lanes.data() + off, c, count);
    }
    return total;
}

/// For a plain row prepared without the draft-column check: the lane sums of draft column
/// r.column, laid out as the checking pass keeps them (one pass over q, no exp), so that
/// residual_mass_lower_bound can be used; far cheaper than the pass over the row that R needs.
inline void keep_draft_lanes(target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& q, verify_buffers& ws) {
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
                                   const verify_buffers& ws, const float* q, float c, Eigen::Index y, double w) {
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
inline int block_test_by_coins(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, const float* q, float c,
                        double w, double low, verify_buffers& ws, uniform_source& rng) {
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
/// The forward pass of verify_block: draws η_1..η_γ (none at temperature 0), prepares rows
/// 0..k−1 (row i holds p_{i+1}), each draft column checked in its row's pass, and records w_i,
/// p_i(x_i), q_i(x_i); returns k, the positions 1..k with w > 0.
inline std::size_t block_forward(const verify_call& call, uniform_source& rng, verify_buffers& ws) {
    const std::size_t n = call.draft_tokens.size();
    const bool check = call.q != nullptr && call.opts.check_draft_distributions;
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
    const bool greedy = call.sampling.temperature == 0.0f;
    for (std::size_t i = 0; i < n; ++i) ws.eta[i] = greedy ? 0.0 : uniform01(rng);
    std::size_t reached = 0;
    double w = 1.0;
    for (std::size_t i = 0; i < n; ++i) {
        const token_id x = call.draft_tokens[i];
        const float c = draft_scale(call.q_scales, i);
        const float* check_q = column_to_check(call.q, check, i, x, c, call.sampling, call.where);
        ws.prepared[i] = prepare_row(call.target_logits, i, call.sampling, ws, call.where, check_q, c);
        const double qx = draft_prob(call.q, i, x, c);
        const double px = prob_of(ws.prepared[i], call.target_logits, ws, x);
        ws.p_draft[i] = px;
        ws.q_draft[i] = qx;
        // A token the drafter gave q(x) = 0 ends every longer prefix (w = 0).
        w = qx > 0.0 ? std::min(1.0, w * px / qx) : 0.0;
        ws.weight[i] = w;
        if (w == 0.0) break;  // every later h is 0; later rows are never read
        reached = i + 1;
    }
    return reached;
}

/// Whether η_i < h_i at a position 1 <= i < γ whose w_i > η_i (see verify_block): by the
/// draft-token bound, the lane-level bound, coins on long rows, and R_i's pass when those
/// leave it open.
inline bool block_hit_at(const verify_call& call, std::size_t i, uniform_source& rng, verify_buffers& ws) {
    const auto* const q = call.q;
    const double wi = ws.weight[i - 1], eta = ws.eta[i - 1];
    const float c = draft_scale(call.q_scales, i);  // the scale of q_{i+1}, column i (i < n here)
    // R_i needs row i (p_{i+1}) and draft token i (x_{i+1}), both seen in the forward pass.
    const double low = wi * ws.p_draft[i] - (q == nullptr ? 1.0 : ws.q_draft[i]);
    if (low > 0.0 && eta < low / (low + 1.0 - wi)) return true;
    target_row& row = ws.prepared[i];
    if (q != nullptr && row.kind == target_row::form::plain) {
        // A tighter lower bound from lane sums of q (kept by the checking pass, else made now
        // from q alone): decides nearly every hit without a pass over the row.
        if (!row.q_lanes) keep_draft_lanes(row, *q, ws);
        const double lanes_low = residual_mass_lower_bound(row, call.target_logits.rows(), ws, wi, c);
        if (lanes_low > 0.0 && eta < lanes_low / (lanes_low + 1.0 - wi)) return true;
        // Still open (η in [h(L), w), L = lanes_low): on a long row, by coins rather than a pass.
        // (A positive draft-token bound above L would mean w_{i+1} = 1, after which this test
        // is almost never reached; the pass decides it.)
        if (!row.exps && low <= lanes_low) {
            const float* qi = q->col(static_cast<Eigen::Index>(i)).data();
            const int coins = block_test_by_coins(row, call.target_logits, qi, c, wi, lanes_low, ws, rng);
            if (coins >= 0) return coins == 1;
        }
    }
    const bool check = q != nullptr && call.opts.check_draft_distributions;
    const double big_r = residual_mass(row, call.target_logits, q, c, call.draft_tokens[i], wi,
                                       check && call.sampling.temperature == 0.0f, ws, call.where);
    const double h = big_r > 0.0 ? big_r / (big_r + 1.0 - wi) : 0.0;
    return eta < h;
}

inline verify_result verify_block(const verify_call& call, uniform_source& rng, verify_buffers& ws) {
    const std::size_t n = call.draft_tokens.size();
    reserve_rows(ws, call.target_logits.rows(), n, call.sampling);
    const std::size_t reached = block_forward(call, rng, ws);
    // Backward: τ = the last i <= reached with η_i < h_i.
    std::size_t tau = 0;
    for (std::size_t i = reached; i >= 1; --i) {
        if (i == n) {
            // h_γ = w_γ = min(1, w_{γ−1} p/q), tested as η q < w_{γ−1} p so that γ = 1 is
            // token verification draw for draw.
            const double w_prev = n >= 2 ? ws.weight[n - 2] : 1.0;
            if (ws.eta[n - 1] * ws.q_draft[n - 1] < w_prev * ws.p_draft[n - 1]) {
                tau = i;
                break;
            }
            continue;
        }
        if (ws.eta[i - 1] >= ws.weight[i - 1]) continue;  // h_i <= w_i <= η_i
        if (block_hit_at(call, i, rng, ws)) {
            tau = i;
            break;
        }
    }
    if (tau == n) {
        const target_row last = prepare_row(call.target_logits, n, call.sampling, ws, call.where);
        return {n, sample_target_from(last, call.target_logits, ws, rng)};
    }
    const double w_tau = tau == 0 ? 1.0 : ws.weight[tau - 1];
    // Row τ (0-based; p_{τ+1} in Sun et al.'s 1-based notation) was prepared in the forward pass.
    return {tau, sample_residual({ws.prepared[tau], call.target_logits, call.q, draft_scale(call.q_scales, tau),
                                  call.draft_tokens[tau], static_cast<float>(w_tau), 1.0f},
                                 ws, rng)};
}
