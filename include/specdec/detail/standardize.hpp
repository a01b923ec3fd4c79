/// \file
/// Standardized sampling of one row (Leviathan et al. 2023, Sec. 2.2): the bodies of the public
/// functions of specdec/sampling.hpp, which check their arguments and dispatch here.
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

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
                        Eigen::Ref<Eigen::VectorXf> out, sampling_buffers& ws, const char* where) {
    const Eigen::Index n = logits.size();
    const row_argmax best = checked_argmax(logits, where);
    if (s.temperature == 0.0f) {
        // Argmax as a distribution: zero all but the max and normalize (Sec. 2.2).
        std::fill(out.data(), out.data() + n, 0.0f);
        out[best.index] = 1.0f;
        return;
    }
    const float m = best.value;
    const float inv_t = 1.0f / s.temperature;
    // exp(-inf) == 0: impossible stays impossible.
    const double total = exp_pass(logits.data(), out.data(), n, m, inv_t);
    if (!truncates(s)) {
        scale_floats(out.data(), n, static_cast<float>(1.0 / total));
        return;
    }

    if (s.top_k > 0 && s.top_k < n) {
        const float threshold = top_k_threshold(logits, s.top_k, ws.values);
        zero_below(logits.data(), threshold, out.data(), n);
    }
    if (s.top_p < 1.0f) {
        const double kept = sum_in_double(out);
        const float threshold =
            top_p_threshold(out, kept, static_cast<double>(s.top_p) * kept, ws.values, ws.buckets);
        zero_below(out.data(), threshold, out.data(), n);
    }
    if (s.min_p > 0.0f) {
        // p >= min_p * p_max, in weights: the largest logit's weight (about exp(0) = 1) times min_p.
        const float threshold = s.min_p * out[best.index];
        zero_below(out.data(), threshold, out.data(), n);
    }
    divide_floats(out.data(), n, sum_floats(out.data(), n));  // (sum_floats: an order fixed by the copy)
}

/// Draws an index from non-negative weights by inversion with one uniform u in [0, 1): the
/// first index whose running sum exceeds u * Σw. Never returns an index of weight 0. The
/// weights need not be normalized. Blocked: one vectorized pass for block sums, then a scan
/// of one block.
/// \pre the weights are non-negative (not checked: it would take another pass).
/// \throws std::invalid_argument when the weights sum to zero or to a value that is not
///         finite (all zero, an empty vector, NaN or Inf among them).
[[nodiscard]] inline Eigen::Index sample_from_weights(const Eigen::Ref<const Eigen::VectorXf>& w, double u,
                                                      sampling_buffers& ws, const char* where) {
    const double total = compute_block_sums(w, ws.block_sums);
    if (!(total > 0.0) || !std::isfinite(total))
        fail_invalid(where, ": the weights sum to ", total, " over ", w.size(),
                             " entries; they must be finite, non-negative and not all zero");
    return sample_with_block_sums(w, ws.block_sums, total, u);
}

/// standardize() and sample_from_weights() in one: writes the standardized distribution to
/// `out` and returns a draw from it with the uniform u (the first index whose running
/// probability exceeds u). Without truncation (the common case for a drafter) the row is read
/// once, blockwise: per 2048-float block a vectorized max, then the exps, written to `out`
/// relative to the running maximum, with the block's sum; one scaling pass then normalizes
/// `out`, and the draw picks a block by its mass and scans that block only (groups of 16
/// skipped by their sums). The same distribution as the two calls, up to float rounding, with
/// two passes fewer over the row; the draw may differ from theirs only where rounding moves a
/// block boundary. Truncating settings and temperature 0 take the two calls' path.
/// \throws std::invalid_argument as standardize().
[[nodiscard]] inline Eigen::Index standardize_and_sample(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                                         const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
                                                         double u, sampling_buffers& ws, const char* where) {
    const Eigen::Index n = logits.size();
    if (s.temperature == 0.0f || truncates(s)) {
        standardize(logits, s, out, ws, where);
        return sample_from_weights(out, u, ws, "specdec::sample_from_weights");
    }
    if (n == 0) fail_invalid(where, ": logits row is empty");
    const Eigen::Index nb = blocks_of(n);
    ws.block_sums.resize(static_cast<std::size_t>(nb));
    ws.block_refs.resize(static_cast<std::size_t>(nb));
    double* mass = ws.block_sums.data();
    float* ref = ws.block_refs.data();
    const float inv_t = 1.0f / s.temperature;
    const float m = blockwise_exp_pass(
        logits, ref, mass, where,
        [&](Eigen::Index b, Eigen::Index start, Eigen::Index len, float ref_m) {
            return exp_pass(logits.data() + start, out.data() + start, len, ref_m, inv_t,
                                    block_len(n, b + 1));
        },
        [&](Eigen::Index start, Eigen::Index len) { std::fill(out.data() + start, out.data() + start + len, 0.0f); });
    double total = 0.0;
    for_each_block_factor(ref, mass, nb, m, inv_t, [&](Eigen::Index b, double f) { total += mass[b] * f; });
    // Normalize block by block, and draw on the way: the masses are normalized, so the target is u.
    double acc = 0.0;
    Eigen::Index pick = -1, last = -1;
    for_each_block_factor(ref, mass, nb, m, inv_t, [&](Eigen::Index b, double f) {
        const Eigen::Index start = b * row_block, len = block_len(n, b);
        const double scale = f / total;
        scale_floats(out.data() + start, len, static_cast<float>(scale));
        mass[b] *= scale;
        if (pick >= 0) return;
        if (acc + mass[b] <= u) {
            acc += mass[b];
            last = b;
            return;
        }
        Eigen::Index block_last = -1;
        const Eigen::Index k = scan_block(out.data() + start, len, acc, u, block_last);
        if (k >= 0) {
            pick = start + k;
        } else {
            last = b;  // rounding: the block's weights did not reach the target
        }
    });
    if (pick >= 0) return pick;
    // Rounding overshoot past every block: the last element with weight.
    const Eigen::Index k = last_weighted(out.data(), n, last);
    SPECDEC_ASSERT(k >= 0, "standardize_and_sample: all weights are zero");
    return std::max<Eigen::Index>(k, 0);
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
/// \throws std::invalid_argument as standardize().
[[nodiscard]] inline scaled_draw standardize_weights_and_sample(
    const Eigen::Ref<const Eigen::VectorXf>& logits, const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
    double u, sampling_buffers& ws, const char* where) {
    const Eigen::Index n = logits.size();
    if (s.temperature == 0.0f || truncates(s))
        return {standardize_and_sample(logits, s, out, u, ws, where), 1.0f};
    if (n == 0) fail_invalid(where, ": logits row is empty");
    constexpr float inf = std::numeric_limits<float>::infinity();
    const Eigen::Index nb = blocks_of(n);
    ws.block_sums.resize(static_cast<std::size_t>(nb));
    double* mass = ws.block_sums.data();
    // One reference for the whole row, its maximum, so that one factor normalizes every block.
    float m = -inf;
    for (Eigen::Index b = 0; b < nb; ++b) {
        const float bm = block_max(logits, b * row_block, block_len(n, b));
        if (std::isnan(bm) || bm == inf) diagnose_logits(logits, where);
        m = std::max(m, bm);
    }
    if (m == -inf) diagnose_logits(logits, where);
    const float inv_t = 1.0f / s.temperature;
    double total = 0.0;
    for (Eigen::Index b = 0; b < nb; ++b) {
        const Eigen::Index start = b * row_block;
        mass[b] = exp_pass(logits.data() + start, out.data() + start, block_len(n, b), m, inv_t,
                                   block_len(n, b + 1));
        total += mass[b];
    }
    if (std::isnan(total)) diagnose_logits(logits, where);  // a NaN the maxima did not show
    const auto scale = static_cast<float>(1.0 / total);
    // Inversion over the block sums, then within one block (groups of 16 skipped by their sums).
    const double target = u * total;
    double acc = 0.0;
    Eigen::Index last = -1;
    for (Eigen::Index b = 0; b < nb; ++b) {
        if (acc + mass[b] <= target) {
            acc += mass[b];
            if (mass[b] > 0.0) last = b;
            continue;
        }
        Eigen::Index block_last = -1;
        const Eigen::Index k = scan_block(out.data() + b * row_block, block_len(n, b), acc, target,
                                                  block_last);
        if (k >= 0) return {b * row_block + k, scale};
        if (block_last >= 0) last = b;  // rounding: the block's weights did not reach the target
    }
    // Rounding overshoot past every block: the last element with weight.
    const Eigen::Index k = last_weighted(out.data(), n, last);
    SPECDEC_ASSERT(k >= 0, "standardize_weights_and_sample: all weights are zero");
    return {std::max<Eigen::Index>(k, 0), scale};
}
