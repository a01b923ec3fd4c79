#pragma once
/// \file
/// The decoding loops: speculative_decode (Leviathan et al. 2023, Alg. 1 repeated) and the
/// autoregressive baseline it is measured and tested against.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <functional>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "adapters.hpp"
#include "adaptive_gamma.hpp"
#include "concepts.hpp"
#include "diagnostics.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "speculative_step.hpp"
#include "tree.hpp"
#include "types.hpp"

namespace specdec {

/// What the per-step callback sees. Spans are valid during the call only.
struct step_event {
    /// The block the drafter proposed (empty for autoregressive decoding).
    std::span<const token_id> draft;
    /// How many of the draft tokens were accepted (by verification: a stop token among them
    /// still cuts the output, see `emitted`).
    std::size_t accepted = 0;
    /// The token the target added: a correction after a rejection, a bonus otherwise (not in
    /// the output when a stop token came before it).
    token_id next_token = 0;
    /// The tokens appended to the output by this step: draft[0..accepted) then next_token,
    /// cut after a stop token. Stream these.
    std::span<const token_id> emitted;
    /// β of each draft position the step tested (see step_result::acceptance); empty unless
    /// acceptance is estimated.
    std::span<const float> acceptance;
    /// The γ this step asked the drafter for (the adaptive policy's choice; 0 for a plain
    /// target step). The drafter may have proposed fewer (`draft.size()`).
    std::size_t gamma = 0;
};

/// Settings of a decoding run. Aggregate: use designated initializers,
/// `{.gamma = 4, .max_new_tokens = 128, .sampling = {.temperature = 0.7f}}`.
struct decode_options {
    /// γ, draft tokens per step (ignored by autoregressive_decode); under the adaptive
    /// policy, the longest draft it may choose. \pre gamma >= 1.
    std::size_t gamma = 4;
    /// Fixed γ (the default) or adaptive: before each step, the γ in [0, gamma] with the most
    /// expected tokens per unit of time, from what earlier steps measured (gamma_controller;
    /// γ = 0 is a plain target step, so a pair for which speculation does not pay decodes at
    /// about the target's own speed). Exact either way: the choice depends on the past only.
    gamma_policy policy = gamma_policy::fixed;
    /// Settings of the adaptive policy (exploration, smoothing, known costs). Unless both
    /// cost callbacks are set, each draft call and target pass is timed with a steady clock.
    adaptive_gamma_options adaptive{};
    /// The adaptive policy's estimates, kept across calls (successive requests of one model
    /// pair): a controller of your own, made with gamma_max = gamma; `adaptive` is then
    /// unused. Null (the default): a fresh one per call, which learns from the call's first
    /// steps. Must outlive the call.
    gamma_controller* controller = nullptr;
    /// Compute β_i = Σ min(p_i, q_i) of every tested draft position, into
    /// decode_stats::expected_accepted_at_position and step_event::acceptance, with the
    /// fixed policy too (always on under the adaptive one). Costs one standardization of each
    /// tested target row; does not change the output.
    bool estimate_acceptance = false;
    /// The draft-side stop: end each draft block after the first token x_i whose draft
    /// probability q_i(x_i) is below this (0, the default, turns it off). llama.cpp's p_min
    /// idea (it stops drafting when the draft's best candidate is less likely than p_min),
    /// made exact: the low token is kept and verified as usual, and since where the block ends
    /// depends on draft values only, the output keeps the target's distribution. Saves the
    /// draft calls (and target positions) that would follow an unlikely token.
    /// \pre 0 <= draft_stop_below <= 1.
    float draft_stop_below = 0.0f;
    /// Exactly this many tokens are generated, unless a stop token ends the run earlier.
    std::size_t max_new_tokens = 128;
    /// Generating any of these ends the run; the stop token is included in the output.
    std::vector<token_id> stop_tokens{};
    /// Standardized sampling of the target (the output's distribution); also the draft's unless
    /// draft_sampling is set.
    sampling_config sampling{};
    /// The draft's own sampling settings: when set, the drafter samples its proposals with
    /// these (a plain LanguageModel drafter standardizes its logits with them; a BlockDrafter
    /// receives them as its `sampling` argument), e.g. a draft at another temperature or top-k
    /// than the target. Unset (the default): the target's `sampling`, which usually gives the
    /// most accepted tokens. Exact either way: verification takes q from the distributions the
    /// draft tokens were actually sampled from, and the output keeps the distribution of the
    /// target under `sampling` (Leviathan et al. 2023, App. A.1 holds for any q). Ignored by
    /// autoregressive_decode. \pre valid settings, as validate() checks.
    std::optional<sampling_config> draft_sampling{};
    /// Lenience l in (0, 1]. **l < 1 changes the output distribution** (Leviathan et al.
    /// App. A.5; see verify_options::lenience); 1, the default, is exact. Needs
    /// scheme = verification_scheme::token.
    float lenience = 1.0f;
    /// Token or block verification; block (Sun et al. 2024) is the default. Both are exact.
    verification_scheme scheme = verification_scheme::block;
    /// Draft token trees instead of chains: the branching per depth and an optional node
    /// budget, e.g. `.tree = specdec::tree_shape{.branching = {2, 2, 1, 1}}` or
    /// `{.branching = {4, 4, 2, 1}, .max_nodes = 16}`. Each step then drafts a tree of that
    /// shape (a plain LanguageModel drafter samples branching[d] siblings per node; a
    /// BlockDrafter's block is a chain), scores the root and every node (one score_tree pass
    /// with a TreeVerifier; one pass per root-to-leaf path otherwise) and verifies the tree
    /// exactly with `tree_scheme` (see speculative_decode_tree, which this forwards to). The
    /// shape's depth replaces gamma; policy, controller, estimate_acceptance,
    /// draft_stop_below, draft_sampling, lenience and scheme apply to chains only and must keep
    /// their defaults (std::invalid_argument otherwise). Unset (the default): chains of gamma tokens.
    std::optional<tree_shape> tree{};
    /// How trees are verified when `tree` is set: traversal verification (the default) or
    /// recursive rejection sampling. Both are exact.
    tree_verification_scheme tree_scheme = tree_verification_scheme::traversal;
    /// Called after every step with what it produced (for streaming); may be empty. For a
    /// tree step, `draft` is the accepted path and `gamma` the depth the step asked for (the
    /// drafter's tree may be shallower).
    std::function<void(const step_event&)> on_step{};
};

/// Outcome of a decoding run.
struct decode_result {
    std::vector<token_id> tokens;                  ///< generated tokens, prompt excluded
    /// Work done: counts every verified token, also those after a stop token that `tokens`
    /// does not hold, so tokens_per_step() can exceed what the output gained per step.
    decode_stats stats;
    stop_reason stop = stop_reason::max_new_tokens;  ///< why the run ended
};

namespace detail {

/// Cuts `sequence` after the first stop token among its last `fresh` tokens, if any.
/// Returns true when a stop token was found.
inline bool cut_at_stop(std::vector<token_id>& sequence, std::size_t fresh, std::span<const token_id> stop_tokens) {
    if (stop_tokens.empty()) return false;
    for (std::size_t k = sequence.size() - fresh; k < sequence.size(); ++k) {
        if (std::find(stop_tokens.begin(), stop_tokens.end(), sequence[k]) != stop_tokens.end()) {
            sequence.resize(k + 1);
            return true;
        }
    }
    return false;
}

/// The prompt must not be empty, and it and the stop tokens must be tokens of the models'
/// vocabulary.
inline void check_prompt_and_stop_tokens(std::span<const token_id> prompt, std::span<const token_id> stop_tokens,
                                         std::ptrdiff_t vocab, const char* where) {
    if (prompt.empty())
        fail_invalid(where, ": the prompt is empty; the models need at least one context token to condition on"
                            " (start the prompt with the model's BOS token)");
    check_token_range(prompt, vocab, where, "prompt");
    check_token_range(stop_tokens, vocab, where, "stop_tokens");
}

/// How many generated tokens to reserve room for up front: a large budget with a stop token
/// ("until end of text") must not allocate the whole budget.
inline constexpr std::size_t initial_reserve = 4096;

}  // namespace detail

namespace detail {
/// speculative_decode with options.tree set: speculative_decode_tree (defined in
/// tree_decode.hpp, which this header includes at its end).
template <class D, class V, class G>
decode_result decode_with_trees(D& drafter, V& verifier, std::span<const token_id> prompt,
                                const decode_options& options, G&& rng);
}  // namespace detail

/// Generates up to options.max_new_tokens tokens after `prompt` with speculative decoding.
///
/// The output has exactly the distribution of sampling from the target alone with the same
/// sampling settings (Leviathan et al. 2023, Thm. in App. A.1), whatever the drafter,
/// unless lenience < 1. Each step proposes min(γ, tokens still needed − 1) draft tokens,
/// so no draft work is wasted at the end; under gamma_policy::adaptive, γ is chosen per step
/// (see decode_options::policy and gamma_controller). With options.tree set, each step
/// drafts and verifies a token tree instead (speculative_decode_tree), equally exact.
///
/// \param drafter   draft model: a BlockDrafter, or a plain LanguageModel
/// \param verifier  target model: a BatchVerifier, or a plain LanguageModel
/// \param prompt    the context to continue (not included in the result): at least one token
///                  (usually the model's BOS first); any contiguous range of token_id, or a
///                  braced list `{1, 2, 3}`
/// \param options   γ and its policy, token budget, stop tokens, sampling (the target's, and
///                  optionally the draft's), lenience, callback
/// \param rng       the caller's generator: the same seed gives the same tokens
/// \returns the generated tokens, statistics and stop reason.
/// \throws std::invalid_argument for invalid options, a vocabulary mismatch between the
///         models, an empty prompt, a prompt or stop token out of range, or malformed model
///         output; and
///         whatever an adapter or the callback throws, unchanged. Basic guarantee: the
///         tokens generated so far are lost, and the drafter, verifier and generator stay
///         usable (the generator may have advanced); given a generator with the same seed, the
///         same objects (if their own throw left them sound) then produce exactly the output
///         of an undisturbed run. A caller's
///         options.controller has counted the failed step's γ among its choices but not
///         observed the step.
///
/// \code
/// my_model target{...}, draft{...};   // any types with vocab_size() and next_logits(span)
/// std::mt19937_64 rng(42);
/// auto out = specdec::speculative_decode(draft, target, prompt, {.gamma = 4, .max_new_tokens = 64}, rng);
/// \endcode
template <Drafter D, Verifier V, random_generator G>
decode_result speculative_decode(D& drafter, V& verifier, std::span<const token_id> prompt,
                                 const decode_options& options, G&& rng) {
    [[maybe_unused]] constexpr bool diagnosed = detail::diagnose_speculative_call<D, V, G>();  // logits of float
    if (options.tree) return detail::decode_with_trees(drafter, verifier, prompt, options, rng);
    constexpr const char* where = "specdec::speculative_decode";
    detail::check_step_options(options.gamma, options.sampling, options.lenience, options.scheme, where);
    detail::check_draft_sampling(options.draft_sampling, where);
    const std::ptrdiff_t vocab = detail::checked_vocab(drafter, verifier, where);
    detail::check_prompt_and_stop_tokens(prompt, options.stop_tokens, vocab, where);

    if (!(options.draft_stop_below >= 0.0f && options.draft_stop_below <= 1.0f))
        detail::fail_invalid(where, ": draft_stop_below = ", options.draft_stop_below, " must lie in [0, 1] (0 is off)");
    const bool adaptive = options.policy == gamma_policy::adaptive;
    std::optional<gamma_controller> own;
    gamma_controller* controller = nullptr;
    if (adaptive) {
        if (options.controller) {
            if (options.controller->gamma_max() != options.gamma)
                detail::fail_invalid(where, ": the controller's gamma_max() = ", options.controller->gamma_max(),
                                     " differs from gamma = ", options.gamma);
            controller = options.controller;
        } else {
            controller = &own.emplace(options.gamma, options.adaptive);
        }
    }
    detail::step_extras extras{.estimate_acceptance = adaptive || options.estimate_acceptance,
                               .draft_stop_below = options.draft_stop_below,
                               .time = adaptive && controller->measures_time(),
                               .draft_sampling = options.draft_sampling ? &*options.draft_sampling : nullptr};

    decode_result result;
    std::vector<token_id> sequence(prompt.begin(), prompt.end());
    sequence.reserve(prompt.size() + std::min(options.max_new_tokens, detail::initial_reserve) +
                     std::min(options.gamma, detail::initial_reserve) + 1);
    step_workspace ws;
    std::size_t generated = 0;
    while (generated < options.max_new_tokens) {
        const std::size_t remaining = options.max_new_tokens - generated;
        const std::size_t gamma = adaptive ? controller->choose(remaining - 1) : std::min(options.gamma, remaining - 1);
        const auto t0 = extras.time ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        const step_result r = detail::step_impl(drafter, verifier, sequence, result.stats, gamma, options.sampling,
                                                options.lenience, options.scheme, rng, ws, vocab, where, &extras);
        if (adaptive) {
            gamma_controller::step_observation o{.gamma = gamma, .drafted = r.draft.size(), .emitted = r.emitted(),
                                                 .acceptance = r.acceptance};
            o.first = result.stats.steps == 1;
            if (extras.time) {
                o.draft_seconds = extras.draft_seconds;
                o.pass_seconds = extras.pass_seconds;
                o.step_seconds = detail::seconds_since(t0);
            }
            controller->observe(o);
        }
        if (result.stats.steps_at_gamma.size() <= gamma) result.stats.steps_at_gamma.resize(gamma + 1, 0);
        ++result.stats.steps_at_gamma[gamma];
        const bool stopped = detail::cut_at_stop(sequence, r.emitted(), options.stop_tokens);
        const std::size_t appended = sequence.size() - prompt.size() - generated;
        generated += appended;
        if (options.on_step)
            options.on_step(step_event{r.draft, r.accepted, r.next_token,
                                       std::span<const token_id>(sequence).last(appended), r.acceptance, gamma});
        if (stopped) {
            result.stop = stop_reason::stop_token;
            break;
        }
    }
    result.tokens.assign(sequence.begin() + static_cast<std::ptrdiff_t>(prompt.size()), sequence.end());
    return result;
}

/// Chosen only when the drafter, verifier or generator misses a requirement: reports which
/// one, and the fix, in a static_assert (see diagnostics.hpp).
template <class D, class V, class G>
decode_result speculative_decode(D&, V&, std::span<const token_id>, const decode_options&, G&&) {
    detail::reject_speculative_call<D, V, G>();
    return {};
}

/// speculative_decode with a braced prompt: `speculative_decode(draft, target, {1, 2, 3}, options, rng)`.
template <class D, class V, class G>
decode_result speculative_decode(D& drafter, V& verifier, std::initializer_list<token_id> prompt,
                                 const decode_options& options, G&& rng) {
    return speculative_decode(drafter, verifier, std::span<const token_id>(prompt.begin(), prompt.size()), options,
                              std::forward<G>(rng));
}

/// The baseline: plain autoregressive sampling from the target, one model call per token,
/// with the same standardized sampling and the same uniform conversion (one uniform per
/// token). options.gamma and options.lenience are ignored.
///
/// \param model  a Verifier; a plain LanguageModel is called through next_logits, a
///               BatchVerifier without it through score(context, {}).
/// \param prompt as for speculative_decode (not empty; a braced list works too)
/// \throws std::invalid_argument for invalid options, an empty prompt, a prompt or stop token
///         out of range, or malformed model output.
template <Verifier M, random_generator G>
decode_result autoregressive_decode(M& model, std::span<const token_id> prompt, const decode_options& options,
                                    G&& rng) {
    [[maybe_unused]] constexpr bool diagnosed = detail::diagnose_autoregressive_call<M, G>();  // logits of float
    constexpr const char* where = "specdec::autoregressive_decode";
    validate(options.sampling, where);
    const auto vocab = static_cast<Eigen::Index>(model.vocab_size());
    if (vocab <= 0) detail::fail_invalid(where, ": vocab_size() = ", vocab, " must be positive");
    detail::check_prompt_and_stop_tokens(prompt, options.stop_tokens, vocab, where);

    decode_result result;
    std::vector<token_id> sequence(prompt.begin(), prompt.end());
    sequence.reserve(prompt.size() + std::min(options.max_new_tokens, detail::initial_reserve));
    Eigen::VectorXf logits, p(vocab);
    Eigen::MatrixXf scores;
    sampling_workspace sws;
    while (result.tokens.size() < options.max_new_tokens) {
        const std::span<const token_id> context(sequence);
        if constexpr (LanguageModel<M>) {
            detail::checked_next_logits(model, context, vocab, logits, where);
        } else {
            scores = model.score(context, std::span<const token_id>{});
            if (scores.rows() != vocab || scores.cols() != 1)
                detail::fail_invalid(where, ": score(context, {}) returned ", scores.rows(), " x ", scores.cols(),
                                     "; expected ", vocab, " x 1");
            logits = scores.col(0);
        }
        // Only the draw is needed: the weights are never normalized.
        const token_id t =
            standardize_weights_and_sample(logits, options.sampling, p, uniform01(rng), sws, where).token;
        sequence.push_back(t);
        result.tokens.push_back(t);
        result.stats.steps += 1;
        result.stats.target_calls += 1;
        if (result.stats.steps_at_gamma.empty()) result.stats.steps_at_gamma.push_back(0);
        ++result.stats.steps_at_gamma[0];
        if (options.on_step)
            options.on_step(step_event{{}, 0, t, std::span<const token_id>(sequence).last(1), {}, 0});
        if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), t) != options.stop_tokens.end()) {
            result.stop = stop_reason::stop_token;
            break;
        }
    }
    return result;
}

/// Chosen only when the model or generator misses a requirement: reports which one, and the
/// fix, in a static_assert (see diagnostics.hpp).
template <class M, class G>
decode_result autoregressive_decode(M&, std::span<const token_id>, const decode_options&, G&&) {
    detail::reject_autoregressive_call<M, G>();
    return {};
}

/// autoregressive_decode with a braced prompt: `autoregressive_decode(target, {1, 2, 3}, options, rng)`.
template <class M, class G>
decode_result autoregressive_decode(M& model, std::initializer_list<token_id> prompt, const decode_options& options,
                                    G&& rng) {
    return autoregressive_decode(model, std::span<const token_id>(prompt.begin(), prompt.size()), options,
                                 std::forward<G>(rng));
}

}  // namespace specdec

// The tree path of speculative_decode (detail::decode_with_trees).
#include "tree_decode.hpp"
