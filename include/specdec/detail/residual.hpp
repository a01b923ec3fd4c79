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

/// What a residual draw is made from: norm(max(0, a·p − b·q)) with p the target row r and q
/// c times draft column r.column of *q, or the point mass at x when q is null.
struct residual_request {
    const target_row& r;
    const Eigen::Ref<const Eigen::MatrixXf>& logits;
    const Eigen::Ref<const Eigen::MatrixXf>* q;
    float c;
    token_id x;
    float a;
    float b;
};

/// A residual draw's request with what every stage reads: the row's length and blocks, its
/// block masses, the draft column (null for a point mass) and b·c.
struct residual_draw {
    const residual_request& req;
    verify_buffers& ws;
    Eigen::Index n, nb;
    const double* mass;
    const float* qc;
    float bc;

    residual_draw(const residual_request& request, verify_buffers& buffers)
        : req(request), ws(buffers), n(request.logits.rows()), nb(blocks_of(n)),
          mass(buffers.block_mass.data() + block_base(n, request.r.column)),
          qc(request.q == nullptr ? nullptr : request.q->col(static_cast<Eigen::Index>(request.r.column)).data()),
          bc(request.b * request.c) {}
    /// q(k): c times the draft column, or the point mass at x.
    float q_at(Eigen::Index k) const { return qc == nullptr ? (k == req.x ? 1.0f : 0.0f) : req.c * qc[k]; }
    /// p's values in block blk, elements off..off+len, into out.
    void fill_p(Eigen::Index blk, Eigen::Index off, Eigen::Index len, float* out) const {
        fill_block(req.r, req.logits, ws, blk, off, len, out);
    }
};

/// Point mass at x: the residual is a·p with a·p(x) lowered by b, whose block sums follow from
/// the block masses (no pass). Writes them to ws.sums and a·p(x) − b, floored at 0, to px_left;
/// returns their total R.
inline double point_mass_block_sums(const residual_draw& d, double& px_left) {
    const residual_request& rq = d.req;
    const Eigen::Index xb = rq.x / row_block;
    const double px = rq.a * prob_of(rq.r, rq.logits, d.ws, rq.x);
    px_left = std::max(0.0, px - rq.b);
    double total = 0.0;
    for (Eigen::Index blk = 0; blk < d.nb; ++blk) {
        double bs = rq.a * d.mass[blk];
        if (blk == xb) bs = std::max(0.0, bs - px + px_left);
        d.ws.sums[static_cast<std::size_t>(blk)] = bs;
        total += bs;
    }
    return total;
}

/// How many proposals y ~ p to make before the exact pass (see sample_residual); `total` is
/// the point mass's residual mass (unused with draft distributions).
inline Eigen::Index residual_proposals(const residual_draw& d, double total, bool short_kept) {
    const residual_request& rq = d.req;
    if (d.qc == nullptr) {
        // Point mass: the exact draw costs about as much as ten proposals (filling and scanning
        // part of one block), so proposals pay only on long plain rows (16 exps each), where one
        // is accepted with probability R / a: at most point_mass_proposals when that is >= 1/4.
        return rq.r.kind == target_row::form::plain && !rq.r.exps && total >= 0.25 * rq.a ? point_mass_proposals : 0;
    }
    // A row of one block whose values are kept has an exact pass with no exp (see
    // short_residual_weights): about 0.1 ns a token against about 40 ns a proposal, so that a
    // proposal pays for itself only where it is accepted with probability above about 400 / V.
    // Below residual_proposal_cost tokens that needs R > 0.4: such rows go to the pass at once
    // (budget 0), with u as its uniform.
    const Eigen::Index budget =
        short_kept ? d.n / residual_proposal_cost : std::max<Eigen::Index>(1, d.n / residual_proposal_cost);
    if (budget == 0) return 0;
    const double ap = rq.a * prob_of(rq.r, rq.logits, d.ws, rq.x), bq = static_cast<double>(rq.b) * d.q_at(rq.x);
    const double r_low = std::max({ap - bq, (static_cast<double>(rq.a) - rq.b) + std::max(0.0, bq - ap), 0.0});
    // When R >= R_lo says that the a / R_lo proposals expected cost at most the budget (about
    // one pass), 6 a / R_lo of them (all fail with probability <= e^−6); otherwise the budget,
    // then the pass (at most about twice the cost of the better choice, whatever R is).
    if (r_low > 0.0 && rq.a / r_low <= static_cast<double>(budget))
        return static_cast<Eigen::Index>(std::ceil(6.0 * rq.a / r_low));
    return budget;
}

/// Up to `proposals` proposals y ~ p, each accepted with probability max(0, a·p(y) − b·q(y)) /
/// (a·p(y)); the first proposal's draw takes u. Long plain rows make them in groups (see
/// proposal_group): the group's uniforms in the order of one-by-one proposals (draw, test,
/// draw, test, ...), then its draws, then its tests in order. True, with the token in `out`,
/// when one is accepted.
inline bool propose_residual(const residual_draw& d, Eigen::Index proposals, double u, uniform_source& rng,
                             token_id& out) {
    const residual_request& rq = d.req;
    const double* prefix = block_prefix(rq.r, d.n, d.ws);  // running block masses
    const int group = rq.r.kind == target_row::form::plain && !rq.r.exps ? proposal_group : 1;
    constexpr auto most = static_cast<std::size_t>(proposal_group);
    double draw_u[most], test_u[most];
    weighted_index y[most];
    float* buf = d.ws.block.data();
    for (Eigen::Index t = 0; t < proposals; t += group) {
        for (int k = 0; k < group; ++k) {
            draw_u[k] = t + k == 0 ? u : uniform01(rng);
            test_u[k] = uniform01(rng);
        }
        if (group > 1) {
            draw_plain_group(rq.r, rq.logits, d.ws, prefix, draw_u, y);
        } else if (rq.r.kind == target_row::form::plain) {
            y[0] = draw_plain(rq.r, rq.logits, d.ws, prefix, draw_u[0]);
        } else {
            y[0].index = draw_by_blocks(
                d.mass, d.nb, d.n, prefix[d.nb - 1], draw_u[0], buf,
                [&](Eigen::Index blk, Eigen::Index off, Eigen::Index len, float* o) { d.fill_p(blk, off, len, o); },
                prefix);
            y[0].weight = buf[y[0].index % row_block];
        }
        for (int k = 0; k < group; ++k) {
            const double py = static_cast<double>(rq.a) * y[k].weight;  // the weight y was drawn with
            const double ry = py - static_cast<double>(rq.b) * d.q_at(y[k].index);
            if (test_u[k] * py < ry) {
                out = static_cast<token_id>(y[k].index);
                return true;
            }
        }
    }
    return false;
}

/// The exact draw of a point mass's residual from its block sums (point_mass_block_sums, total
/// their sum): fills and scans the one block the draw lands in.
inline token_id draw_point_mass_residual(const residual_draw& d, double total, double px_left, double w) {
    const residual_request& rq = d.req;
    return static_cast<token_id>(draw_by_blocks(
        d.ws.sums.data(), d.nb, d.n, total, w, d.ws.block.data(),
        [&](Eigen::Index blk, Eigen::Index off, Eigen::Index len, float* out) {
            d.fill_p(blk, off, len, out);
            scale_floats(out, len, rq.a);
            const Eigen::Index at = rq.x - blk * row_block - off;
            if (at >= 0 && at < len) out[at] = static_cast<float>(px_left);
        }));
}

/// The exact draw from a draft distribution's residual, by one pass with uniform w: a row of one
/// block whose values are kept writes the residual's weights and lane sums, then draws in lane
/// order (any fixed order of the elements gives an exact draw); longer rows take block sums of
/// the residual, then fill and scan the one block the draw lands in. An empty residual: from p.
inline token_id draw_residual_exactly(const residual_draw& d, bool short_kept, double w) {
    const residual_request& rq = d.req;
    if (short_kept) {
        short_row_lanes lanes;
        const double total = short_residual_weights(rq.r, d.qc, rq.a, d.bc, d.ws, d.n, lanes);
        if (!(total > residual_mass_floor)) return sample_target(rq.r, rq.logits, d.ws, w);
        return static_cast<token_id>(draw_short_residual(d.ws, lanes, d.n, total, w));
    }
    double total = 0.0;
    for (Eigen::Index blk = 0; blk < d.nb; ++blk) {
        const double bs = block_residual(rq.r, rq.logits, d.ws, d.qc, blk, rq.a, d.bc);
        d.ws.sums[static_cast<std::size_t>(blk)] = bs;
        total += bs;
    }
    if (!(total > residual_mass_floor)) return sample_target(rq.r, rq.logits, d.ws, w);
    return static_cast<token_id>(draw_by_blocks(
        d.ws.sums.data(), d.nb, d.n, total, w, d.ws.block.data(),
        [&](Eigen::Index blk, Eigen::Index off, Eigen::Index len, float* out) {
            d.fill_p(blk, off, len, out);
            positive_part_into(out, rq.a, d.qc + blk * row_block + off, d.bc, out, len);
        }));
}

/// Draws the emitted token from norm(max(0, a·p − b·q)) for row r against draft column
/// r.column (residual_request) (Leviathan et al. 2023, Sec. 2.3 with a = 1, b = l (App. A.5); Sun et al.'s
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
inline token_id sample_residual(const residual_request& req, verify_buffers& ws, uniform_source& rng) {
    // p = δ(argmax): the residual is a multiple of δ(argmax) or empty, and the fallback is p
    // as well: the argmax either way, drawn with no uniform.
    if (req.r.kind == target_row::form::greedy) return static_cast<token_id>(req.r.argmax);
    const double u = uniform01(rng);
    const residual_draw d(req, ws);
    ws.sums.resize(static_cast<std::size_t>(d.nb));
    double total = 0.0, px_left = 0.0;
    if (d.qc == nullptr) {
        total = point_mass_block_sums(d, px_left);
        if (!(total > residual_mass_floor)) return sample_target(req.r, req.logits, ws, u);
    }
    const bool short_kept = d.nb == 1 && in_rows(req.r);
    const Eigen::Index proposals = residual_proposals(d, total, short_kept);
    token_id y = 0;
    if (proposals > 0 && propose_residual(d, proposals, u, rng, y)) return y;
    if (d.qc == nullptr) return draw_point_mass_residual(d, total, px_left, proposals > 0 ? uniform01(rng) : u);
    // No proposal accepted (or none made): one exact pass. Rows of one block with no proposal
    // use u; otherwise a fresh uniform.
    return draw_residual_exactly(d, short_kept, short_kept && proposals == 0 ? u : uniform01(rng));
}
