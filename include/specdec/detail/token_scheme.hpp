/// \file
/// Token verification (Leviathan et al. 2023, Alg. 1): modified rejection sampling, token by token.
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

/// Token verification (Leviathan et al. 2023, Alg. 1). q == nullptr: point-mass drafts;
/// q_scales == nullptr: q_i is column i itself, else q_scales[i] times it.
inline verify_result verify_tokens(const verify_call& call, uniform_source& rng, verify_buffers& ws) {
    const Eigen::Ref<const Eigen::MatrixXf>& target_logits = call.target_logits;
    const std::span<const token_id> draft_tokens = call.draft_tokens;
    const Eigen::Ref<const Eigen::MatrixXf>* const q = call.q;
    const float* const q_scales = call.q_scales;
    const sampling_config& sampling = call.sampling;
    const verify_options& opts = call.opts;
    const char* const where = call.where;
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
        return {i, sample_residual({row, target_logits, q, c, x, 1.0f, opts.lenience}, ws, rng)};
    }
    // Every draft accepted: the bonus token comes from p_{γ+1}.
    const target_row row = prepare_row(target_logits, n, sampling, ws, where);
    return {n, sample_target_from(row, target_logits, ws, rng)};
}

/// Σ_x max(0, w p(x) − q(x)) for a prepared row and its draft column (q = c · the column),
