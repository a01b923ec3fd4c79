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
/// decide the outcome.
///
/// The code is in specdec/detail/, one fragment per step of Algorithm 1 (detail/instance_verify.inc
/// lists them), compiled once per instruction set and chosen at run time (specdec/isa.hpp).

#include <Eigen/Core>

#include <concepts>
#include <span>
#include <type_traits>

#include "detail/argument_diagnostics.hpp"
#include "detail/buffers.hpp"
#include "detail/verify_checks.hpp"
#include "detail/verify_core.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "types.hpp"
#include "verify_types.hpp"

namespace specdec {

/// Reusable buffers for verify(); keep one per decoding loop so that verification
/// allocates nothing after the first call with a given vocabulary size and draft length.
/// Its contents are private.
class verify_workspace {
    friend struct detail::buffers_access;
    detail::verify_buffers buffers_;
};

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
/// scheme, γ uniforms η_1..η_γ, and two per round where a test is decided by coin rounds
/// (detail::block_test_by_coins) instead of its residual mass; then, either way, the emitted
/// token: one uniform when it comes from p (all drafts accepted); after a rejection, two per
/// rejection-sampling proposal from p (with draft distributions see residual_proposal_cost for
/// how many are made, and without truncation, on rows of more than 2048 tokens, they are made
/// four at a time, see detail::proposal_group; with point-mass drafts up to eight on long rows
/// when the residual holds at least a quarter of the mass) and, if none is accepted, one more
/// for the exact draw. How many are drawn can depend on rounding (a proposal's test, a bound),
/// so the instruction-set paths, which round differently, may consume the stream differently.
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
    return detail::run_verify({target_logits, draft_tokens, &draft_probs, nullptr, sampling, opts, where}, rng, ws);
}

/// Chosen only when an argument of the overload above has the wrong type (target_logits or
/// draft_probs not an Eigen matrix of float, draft_tokens not a range of token_id, rng not a
/// generator): reports which one, and the fix, in a static_assert (see
/// detail/argument_diagnostics.hpp). Never viable together with the overload above.
template <class L, class T, class Q, class G>
    requires(!std::same_as<std::remove_cvref_t<Q>, point_mass_t> && !detail::verify_arguments<L, T, Q, G>)
verify_result verify(L&&, T&&, Q&&, const sampling_config&, G&&, verify_workspace&, const verify_options& = {}) {
    detail::reject_verify_call<L, T, Q, void, G>();
    return {};
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
    return detail::run_verify({target_logits, draft_tokens, &draft_probs, draft_scales.data(), sampling, opts, where},
                              rng, ws);
}

/// Chosen only when an argument of the overload above has the wrong type: reports which one,
/// and the fix, in a static_assert (as above).
template <class L, class T, class Q, class S, class G>
    requires(!detail::verify_scaled_arguments<L, T, Q, S, G>)
verify_result verify(L&&, T&&, Q&&, S&&, const sampling_config&, G&&, verify_workspace&,
                     const verify_options& = {}) {
    detail::reject_verify_call<L, T, Q, S, G>();
    return {};
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
    return detail::run_verify({target_logits, draft_tokens, nullptr, nullptr, sampling, opts, where}, rng, ws);
}

/// Chosen only when an argument of the overload above has the wrong type: reports which one,
/// and the fix, in a static_assert (as above).
template <class L, class T, class G>
    requires(!detail::verify_point_mass_arguments<L, T, G>)
verify_result verify(L&&, T&&, point_mass_t, const sampling_config&, G&&, verify_workspace&,
                     const verify_options& = {}) {
    detail::reject_verify_call<L, T, void, void, G>();
    return {};
}

}  // namespace specdec
