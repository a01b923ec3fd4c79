#pragma once
/// \file
/// speculative_decode, one sequence (Leviathan et al. 2023, Alg. 1 repeated; chains or trees,
/// see decode_options), and the autoregressive baseline it is measured and tested against.
/// speculative_decode runs the one decoding loop, batch_decoder, with one sequence.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "adapters.hpp"
#include "batch_decoder.hpp"
#include "concepts.hpp"
#include "decode_options.hpp"
#include "diagnostics.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "types.hpp"

namespace specdec {

namespace detail {

/// A plain LanguageModel and nothing more: none of the other adapter interfaces the decoding
/// loop looks for (block drafting, batched or tree scoring, many sequences at once). For such
/// models the loop takes the same branches as for model_ref, which makes compiled mode's
/// once-compiled loop (decode_models) exact for them.
template <class M>
concept plain_language_model = LanguageModel<M> && !BlockDrafter<M> && !TreeDrafter<M> && !MultiSequenceDrafter<M> &&
                               !BatchVerifier<M> && !TreeVerifier<M> && !MultiSequenceVerifier<M> &&
                               !MultiSequenceTreeVerifier<M>;
static_assert(plain_language_model<model_ref>);

/// A generator that hands out the uniforms of a uniform_source: each call returns the 53 bits of
/// the source's next uniform at the top of a 64-bit word, so uniform01 of it (one call, the top
/// 53 bits) is that uniform, bit for bit. Compiled mode's loops draw from the caller's
/// generator through it, and get the uniforms they would get from the generator itself.
struct uniform_bits {
    uniform_source* source;
    using result_type = std::uint64_t;
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return ~result_type{0}; }
    result_type operator()() { return static_cast<result_type>((*source)() * 0x1.0p53) << 11; }
};

/// The decoding loop of speculative_decode for two plain models, through model_ref: compiled
/// once in the library's source file in compiled mode (decode_models); a template here, so
/// that header-only use instantiates it nowhere unless called.
template <class = void>
decode_result decode_models_loop(model_ref& drafter, model_ref& verifier, std::span<const token_id> prompt,
                                 const decode_options& options, uniform_source& rng) {
    constexpr const char* where = "specdec::speculative_decode";
    batch_decoder<model_ref, model_ref, uniform_bits> decoder(entry_point{where, where, where}, drafter, verifier,
                                                              options, 1);
    const std::size_t id = decoder.add(prompt, uniform_bits{&rng});
    decoder.run();
    return decoder.take(id);
}

/// The loop of autoregressive_decode (see there), for any Verifier and generator.
template <class M, class G>
decode_result autoregressive_loop(M& model, std::span<const token_id> prompt, const decode_options& options, G& rng);

/// autoregressive_loop for a plain model, through model_ref (as decode_models_loop).
template <class = void>
decode_result autoregressive_models_loop(model_ref& model, std::span<const token_id> prompt,
                                         const decode_options& options, uniform_source& rng) {
    return autoregressive_loop(model, prompt, options, rng);
}

#if defined(SPECDEC_COMPILED)
SPECDEC_DETAIL_CORE_BEGIN
/// Compiled mode: the loops for plain models, defined once in the library (src/specdec_core.cpp).
decode_result decode_models(model_ref& drafter, model_ref& verifier, std::span<const token_id> prompt,
                            const decode_options& options, uniform_source& rng);
decode_result autoregressive_models(model_ref& model, std::span<const token_id> prompt, const decode_options& options,
                                    uniform_source& rng);
#if defined(SPECDEC_DETAIL_BUILD_CORE)
decode_result decode_models(model_ref& drafter, model_ref& verifier, std::span<const token_id> prompt,
                            const decode_options& options, uniform_source& rng) {
    return decode_models_loop(drafter, verifier, prompt, options, rng);
}
decode_result autoregressive_models(model_ref& model, std::span<const token_id> prompt, const decode_options& options,
                                    uniform_source& rng) {
    return autoregressive_models_loop(model, prompt, options, rng);
}
#endif
SPECDEC_DETAIL_CORE_END
#endif

}  // namespace detail

/// Generates up to options.budget.max_new_tokens tokens after `prompt` with speculative
/// decoding: each step drafts a chain of γ tokens or a token tree (options.step), the target
/// scores it in one pass, and verification accepts a prefix (a path) and draws one more token.
///
/// The output has exactly the distribution of sampling from the target alone with the same
/// sampling settings (Leviathan et al. 2023, Thm. in App. A.1; verify_tree for trees),
/// whatever the drafter, its own sampling settings and the draft-side stop, unless a chain's
/// lenience is below 1. Each step asks for at most (tokens still needed − 1) draft tokens or
/// levels, so no draft work is wasted at the end; under the adaptive policy the γ (or the
/// tree's depth) is chosen per step from earlier steps (see draft_length).
///
/// \param drafter   draft model: a BlockDrafter, a TreeDrafter, or a plain LanguageModel
/// \param verifier  target model: a BatchVerifier, a TreeVerifier, or a plain LanguageModel
/// \param prompt    the context to continue (not included in the result): at least one token
///                  (usually the model's BOS first); any contiguous range of token_id, or a
///                  braced list `{1, 2, 3}`
/// \param options   the step's shape, its length policy, sampling (the target's, and optionally
///                  the draft's), budget, callback (see decode_options)
/// \param rng       the caller's generator: the same seed gives the same tokens (under the
///                  adaptive policy only with known costs, see draft_length::adaptive)
///
/// In compiled mode (SPECDEC_COMPILED, the specdec::compiled target), two plain models (types
/// with vocab_size() and next_logits() and none of the other adapter interfaces) run the loop
/// the library compiled once, reached through type-erased references to the models and the
/// generator: the same calls, the same uniforms, the same tokens; the calling translation unit
/// instantiates no loop. Other adapters instantiate the loop where they are used.
/// \returns the generated tokens, statistics and stop reason.
/// \throws std::invalid_argument for invalid options, a shape the models cannot serve, a
///         vocabulary mismatch between the models, an empty prompt, a prompt or stop token out
///         of range, or malformed model output, naming specdec::speculative_decode; and
///         whatever an adapter or the callback throws, unchanged. Basic guarantee: the tokens
///         generated so far are lost, and the drafter, verifier and generator stay usable (the
///         generator may have advanced); given a generator with the same seed, the same
///         objects (if their own throw left them sound) then produce exactly the output of an
///         undisturbed run. A caller's controller has counted the failed step's length among
///         its choices but not observed the step.
///
/// \code
/// my_model target{...}, draft{...};   // any types with vocab_size() and next_logits(span)
/// std::mt19937_64 rng(42);
/// auto out = specdec::speculative_decode(draft, target, prompt,
///     {.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = 64}}, rng);
/// auto tree_out = specdec::speculative_decode(draft, target, prompt,
///     {.step = specdec::tree{.shape = {.branching = {2, 2, 1, 1}}}}, rng);
/// \endcode
template <DecodeDrafter D, DecodeVerifier V, random_generator G>
decode_result speculative_decode(D& drafter, V& verifier, std::span<const token_id> prompt,
                                 const decode_options& options, G&& rng) {
    [[maybe_unused]] constexpr bool diagnosed = detail::diagnose_decoder_call<D, V, G>();  // logits of float
#if defined(SPECDEC_COMPILED)
    // Compiled mode: plain models run the loop the library compiled once (same calls, same
    // uniforms, same tokens); other adapters instantiate it here.
    if constexpr (detail::plain_language_model<D> && detail::plain_language_model<V>) {
        detail::model_ref draft_ref(drafter), target_ref(verifier);
        uniform_source uniforms(rng);
        return detail::decode_models(draft_ref, target_ref, prompt, options, uniforms);
    } else
#endif
    {
    constexpr const char* where = "specdec::speculative_decode";
    using generator = detail::generator_ref<std::remove_reference_t<G>>;
    batch_decoder<D, V, generator> decoder(detail::entry_point{where, where, where}, drafter, verifier, options, 1);
    const std::size_t id = decoder.add(prompt, generator{&rng});
    decoder.run();
    return decoder.take(id);
    }
}

/// Chosen only when the drafter, verifier or generator misses a requirement: reports which
/// one, and the fix, in a static_assert (see diagnostics.hpp).
template <class D, class V, class G>
decode_result speculative_decode(D&, V&, std::span<const token_id>, const decode_options&, G&&) {
    detail::reject_decoder_call<D, V, G>();
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
/// token). Of the options, only sampling, budget and on_step apply (the step's shape, its
/// length and the draft's settings are ignored).
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
#if defined(SPECDEC_COMPILED)
    if constexpr (detail::plain_language_model<M>) {  // the loop the library compiled once (as speculative_decode)
        detail::model_ref ref(model);
        uniform_source uniforms(rng);
        return detail::autoregressive_models(ref, prompt, options, uniforms);
    } else
#endif
    {
        return detail::autoregressive_loop(model, prompt, options, rng);
    }
}

namespace detail {

template <class M, class G>
decode_result autoregressive_loop(M& model, std::span<const token_id> prompt, const decode_options& options, G& rng) {
    constexpr const char* where = "specdec::autoregressive_decode";
    validate(options.sampling, where);
    const auto vocab = static_cast<Eigen::Index>(detail::checked_vocab(model, where));
    detail::check_prompt_and_stop_tokens(prompt, options.budget.stop_tokens, vocab, where);

    decode_result result;
    std::vector<token_id> sequence(prompt.begin(), prompt.end());
    sequence.reserve(prompt.size() + std::min(options.budget.max_new_tokens, detail::initial_reserve));
    Eigen::VectorXf logits, p(vocab);
    Eigen::MatrixXf scores;
    sampling_workspace sws;
    const bool timed = bool(options.on_step);  // step_timing for on_step
    using clock = std::chrono::steady_clock;
    while (result.tokens.size() < options.budget.max_new_tokens) {
        const auto t0 = timed ? clock::now() : clock::time_point{};
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
        const double target_seconds = timed ? detail::seconds_since(t0) : 0.0;
        const token_id t =
            standardize_weights_and_sample(logits, options.sampling, p, uniform01(rng), sws, where).token;
        sequence.push_back(t);
        result.tokens.push_back(t);
        result.stats.steps += 1;
        result.stats.target_calls += 1;
        if (result.stats.steps_at_gamma.empty()) result.stats.steps_at_gamma.push_back(0);
        ++result.stats.steps_at_gamma[0];
        if (options.on_step)
            options.on_step(step_event{
                .next_token = t,
                .emitted = std::span<const token_id>(sequence).last(1),
                .target_passes = 1,
                .timing = {.start = t0,
                           .target_seconds = target_seconds,
                           .library_seconds = std::max(0.0, detail::seconds_since(t0) - target_seconds)}});
        if (std::find(options.budget.stop_tokens.begin(), options.budget.stop_tokens.end(), t) != options.budget.stop_tokens.end()) {
            result.stop = stop_reason::stop_token;
            break;
        }
    }
    return result;
}

}  // namespace detail

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


