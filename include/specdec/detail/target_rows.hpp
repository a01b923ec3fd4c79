/// \file
/// A target row normalized by verification (Sec. 2.2 standardization, blockwise), and p(x) or a
/// block of p read back from it.
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

/// Accumulates the checks of one block of a draft column (sign and sum, while in L1).
struct column_check {
    bool may_be_negative = false;  // (set on mere suspicion too: finish() then checks exactly)
    double sum = 0.0;
    void add(const float* qb, Eigen::Index len) {
        // (NaN or +Inf anywhere makes the sum fail the check)
        sum += sum_floats_noting_negative(qb, len, may_be_negative);
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
        check.add(q + start, std::min(row_block, n - start));
    check.finish(Eigen::Map<const Eigen::VectorXf>(q, n), i, c, where);
}

/// The plain (untruncated, temperature > 0) case of prepare_row, for rows that keep their
/// exponentials in ws.rows (keep_exps) or not.
template <bool keep_exps>
target_row prepare_plain_row(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j, const sampling_config& s,
                             verify_buffers& ws, const char* where, const float* check_q, float check_scale) {
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
            exp_pass_args args;
            args.z = z.data() + start;
            args.len = len;
            args.m = ref;
            args.inv_t = inv_t;
            args.lanes = chunk_data(ws, n, j, b);
            if (check_q != nullptr) {
                args.q = check_q + start;
                args.q_lanes = ws.q_lanes.data() + chunk_offset(n, j, b);
            }
            args.next_len = block_len(n, b + 1);
            if constexpr (keep_exps) args.out = exps + start;
            const chunked_exp_sums cs = chunked_exp_pass<keep_exps>(args);
            if (check_q != nullptr) {
                c.may_be_negative = c.may_be_negative || cs.q_sign;
                c.sum += cs.q_sum;
            }
            return cs.exp_sum;
        },
        [&](Eigen::Index start, Eigen::Index len) {
            if constexpr (keep_exps) std::fill(exps + start, exps + start + len, 0.0f);
            if (check_q != nullptr) c.add(check_q + start, len);
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
                                              const sampling_config& s, verify_buffers& ws, const char* where,
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
                                      const sampling_config& s, verify_buffers& ws, const char* where,
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
        ws.block_mass[base + static_cast<std::size_t>(b)] = sum_floats(e.data() + b * row_block, block_len(n, b));
    }
    if (check_q != nullptr) check_column(check_q, n, j, check_scale, where);
    return r;
}

/// prepare_row_unnamed, whose errors about the logits also name the column: "where: target_logits
/// column 2: logit 7 is NaN". (The row is scanned again only when the pass has thrown.)
inline target_row prepare_row(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j, const sampling_config& s,
                              verify_buffers& ws, const char* where, const float* check_q = nullptr,
                              float check_scale = 1.0f) {
    try {
        return prepare_row_unnamed(logits, j, s, ws, where, check_q, check_scale);
    } catch (const std::invalid_argument&) {
        name_bad_target_column(logits, j, where);
        throw;  // an error about the draft column
    }
}

/// p(x) for a prepared row: for plain rows exp((z_x − m_b) / T) times the block's scale, the
/// exponential being the very float the row's pass added to its block's sum (kept by the pass
/// on short rows, else recomputed by the same SIMD exp), so that p(x) agrees with the
/// normalizer and with the weights the draws use.
inline double prob_of(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, const verify_buffers& ws,
                      Eigen::Index x) {
    if (r.kind == target_row::form::greedy) return x == r.argmax ? 1.0 : 0.0;
    const Eigen::Index vocab = logits.rows();
    const std::size_t at = block_base(vocab, r.column) + static_cast<std::size_t>(x / row_block);
    const auto col = static_cast<Eigen::Index>(r.column);
    if (r.kind == target_row::form::stored) return static_cast<double>(ws.rows(x, col));
    if (ws.block_mass[at] == 0.0) return 0.0;  // every logit of the block is -Inf
    const float e = r.exps ? ws.rows(x, col) : pass_exp(logits(x, col), ws.block_max[at], r.inv_t);
    // The product in float, as fill_block makes the draws' weights: p(x) is 0 exactly where a
    // draw's weight is (a token whose probability underflows float is never accepted, as
    // sampling from standardize() never emits it).
    return static_cast<double>(e * ws.scale[at]);
}

/// Writes p of elements off..off+len−1 of block b of a prepared (non-greedy) row to out. Plain
/// rows read the exponentials their pass kept, or recompute them (the same exp relative to the
/// same reference as the normalizing pass, so the same floats).
inline void fill_block(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                       const verify_buffers& ws, Eigen::Index b, Eigen::Index off, Eigen::Index len, float* out) {
    const Eigen::Index start = b * row_block + off;
    const std::size_t at = block_base(logits.rows(), r.column) + static_cast<std::size_t>(b);
    const auto col = static_cast<Eigen::Index>(r.column);
    if (ws.block_mass[at] == 0.0) {
        std::fill(out, out + len, 0.0f);
    } else if (in_rows(r)) {
        scaled_copy(ws.rows.col(col).data() + start, ws.scale[at], out, len);
    } else {
        exp_pass(logits.col(col).data() + start, out, len, ws.block_max[at], r.inv_t);
        scale_floats(out, len, ws.scale[at]);
    }
}

/// Inverse-CDF draw over blocks with one uniform u: `sums` holds the weight of each of nb
/// blocks of a row of n elements; fill(b, off, len, out) writes the weights of elements
/// off..off+len−1 of block b to out[0..len); a block is filled and scanned 256 elements at a
/// time, up to the crossing. Returns the first element whose running weight exceeds u·total, never one of
/// weight 0 (on rounding overshoot: the last element with weight). On return,
/// buf[y % row_block] holds the weight of the returned element y.
/// `prefix`, when not null, holds the running sums of `sums` (prefix[b] = sums[0] + ... +
