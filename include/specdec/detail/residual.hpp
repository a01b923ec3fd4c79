/// \file
/// Resampling from the residual norm(max(0, a·p − b·q)) after a rejection (Leviathan et al. 2023,
/// Sec. 2.3 and App. A.5; Sun et al. 2024's residual with a = w_τ): rejection sampling from p,
/// then one exact pass.
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

/// Lane sums of a row of one block: chunk c, lane l at [c·chunk_lanes + l].
using short_row_lanes = std::array<float, chunks_per_block * chunk_lanes>;

/// For a row of one block whose values are in ws.rows (see in_rows): writes the residual
/// weights max(0, a·p − b·q) into ws.block (zero up to the end of the last 256-token chunk)
/// and their lane sums into `lanes`, in one vectorized pass; returns the total. The lanes are
/// those of draw_plain (chunk c, lane l: the elements c·exp_chunk + l + chunk_lanes·k).
inline double short_residual_weights(const target_row& r, const float* q, float a, float b, verify_buffers& ws,
                                     Eigen::Index n, short_row_lanes& lanes_out) {
    const Eigen::Index chunks = chunks_of(n);
    float* w = ws.block.data();
    positive_part_into(ws.rows.col(static_cast<Eigen::Index>(r.column)).data(), a * ws.scale[block_base(n, r.column)], q,
                       b, w, n);
    std::fill(w + n, w + chunks * exp_chunk, 0.0f);
    double total = 0.0;
    for (Eigen::Index c = 0; c < chunks; ++c) {
        float* lanes = lanes_out.data() + c * chunk_lanes;
        lane_sums_16(w + c * exp_chunk, exp_chunk / chunk_lanes, lanes);
        total += static_cast<double>(sum_floats(lanes, chunk_lanes));
    }
    return total;
}

/// One inverse-CDF draw with uniform u from the weights and lane sums short_residual_weights
/// made (total their sum), in draw_plain's (chunk, lane, element) order; never an element of
/// weight 0 (on rounding overshoot, the last element with weight).
inline Eigen::Index draw_short_residual(const verify_buffers& ws, const short_row_lanes& lane_sums, Eigen::Index n,
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

inline double block_residual(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                             const verify_buffers& ws, const float* q, Eigen::Index blk, float a, float b) {
    const Eigen::Index n = logits.rows(), start = blk * row_block, len = block_len(n, blk);
    const std::size_t at = block_base(n, r.column) + static_cast<std::size_t>(blk);
    if (ws.block_mass[at] == 0.0) return 0.0;  // p = 0 on the block: max(0, −b·q) = 0
    const auto col = static_cast<Eigen::Index>(r.column);
    if (in_rows(r))
        return positive_part_sum(ws.rows.col(col).data() + start, a * ws.scale[at], q + start, b, len);
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
inline token_id sample_residual(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                         const Eigen::Ref<const Eigen::MatrixXf>* q, float c, token_id x, float a, float b,
                         verify_buffers& ws, uniform_source& rng) {
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
                scale_floats(out, len, a);
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
            positive_part_into(out, a, qc + blk * row_block + off, bc, out, len);
        }));
}
