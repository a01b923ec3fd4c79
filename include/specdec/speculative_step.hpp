#pragma once
/// \file
/// One iteration of speculative decoding (Leviathan et al. 2023, Alg. 1): draft γ tokens,
/// score all γ+1 positions with the target in one pass, verify, append.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "adapters.hpp"
#include "concepts.hpp"
#include "detail/reshape.hpp"
#include "diagnostics.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "types.hpp"
#include "verify.hpp"

namespace specdec {

/// Settings of one speculative step.
struct step_options {
    /// γ: how many draft tokens to propose. \pre gamma >= 1.
    std::size_t gamma = 4;
    /// Standardized sampling of the target; the draft's too unless draft_sampling is set.
    sampling_config sampling{};
    /// Lenience l in (0, 1]; see verify_options::lenience. **l < 1 changes the output
    /// distribution** (Leviathan et al. App. A.5); 1, the default, is exact. Needs
    /// scheme = verification_scheme::token.
    float lenience = 1.0f;
    /// Token or block verification; block (Sun et al. 2024) is the default. Both are exact.
    verification_scheme scheme = verification_scheme::block;
    /// The draft's own sampling settings (see draft_settings::sampling); unset (the
    /// default), the drafter samples with `sampling`, as the target.
    std::optional<sampling_config> draft_sampling{};
};

/// What one step did. `draft` views the workspace and is valid until it is reused.
struct step_result {
    std::span<const token_id> draft;  ///< the proposed block x_1..x_n
    std::size_t accepted = 0;         ///< how many of them were accepted
    token_id next_token = 0;          ///< the correction (after a rejection) or bonus token
    /// β_i = Σ_x min(p_i(x), q_i(x)) of each draft position the step tested (i <= accepted),
    /// the probability that token verification accepts it (Leviathan et al. Def. 3.1);
    /// p_i(x_i) for point-mass drafts. Empty unless acceptance is estimated (see
    /// chain::estimate_acceptance).
    std::span<const float> acceptance;
    /// True when every draft token was accepted, so next_token is a bonus from p_{n+1}.
    [[nodiscard]] bool all_accepted() const noexcept { return accepted == draft.size(); }
    /// Tokens this step appended: accepted + 1.
    [[nodiscard]] std::size_t emitted() const noexcept { return accepted + 1; }
};

/// Buffers reused across steps, so that the library allocates nothing per step after
/// warm-up (models may still allocate in their own calls).
struct step_workspace {
    draft_block draft;               ///< the current block
    Eigen::MatrixXf target_logits;   ///< V x (n+1) scores of the current block
    verify_workspace verify;         ///< verification buffers
    std::vector<token_id> context;   ///< scratch for plain-model adapters
    Eigen::VectorXf logits;          ///< scratch for plain-model adapters
    sampling_workspace sampling;     ///< scratch for plain-model drafting
    std::vector<float> acceptance;   ///< β of the tested rows (when estimated)
    Eigen::VectorXf target_probs;    ///< scratch: a standardized target row, for β

    /// Gives target_logits `cols` columns of `rows` before the target writes them (contents
    /// unspecified), from the matrix an earlier step of that draft length left: an Eigen
    /// matrix reallocates whenever its size changes, and draft lengths vary (prompt lookup,
    /// a fallback chain, the last step of a run), so a verifier whose score_into resizes its
    /// output would otherwise allocate on every change. Allocates only for a length not
    /// seen before.
    void shape_target_logits(Eigen::Index rows, Eigen::Index cols) {
        const Eigen::Index have = target_logits.cols();
        if (have != cols) {
            const auto slots = static_cast<std::size_t>(std::max(have, cols)) + 1;
            if (by_length_.size() < slots) by_length_.resize(slots);
            target_logits.swap(by_length_[static_cast<std::size_t>(have)]);
            target_logits.swap(by_length_[static_cast<std::size_t>(cols)]);
        }
        detail::reshape(target_logits, rows, cols);
    }

private:
    std::vector<Eigen::MatrixXf> by_length_;  // by column count: the matrices not in use
};

namespace detail {

/// What a decoding loop asks of a step beyond step_options.
struct step_extras {
    bool estimate_acceptance = false;  ///< fill step_result::acceptance
    /// With estimate_acceptance: β at the first position goes to the sibling statistics
    /// (decode_stats::reached_at_sibling[0], expected_accepted_at_sibling[0]: a_1 at the root)
    /// instead of the per-position ones, as a tree planner's chain step records it, so that a
    /// run of trees and chains keeps each kind of statistic from one kind of step.
    bool acceptance_as_sibling = false;
    float draft_stop_below = 0.0f;     ///< end the draft after a token with q_i(x_i) below this
    bool time = false;                 ///< measure the two fields below (steady clock)
    double draft_seconds = 0.0;        ///< the drafter's call
    double pass_seconds = 0.0;         ///< the verifier's call
    /// The sampling settings the drafter is given (decode_options::draft.sampling); null: the
    /// target's. Verification standardizes the target's rows with the target's settings
    /// whatever this is, and takes q from the draft block: exact for any draft settings.
    const sampling_config* draft_sampling = nullptr;
};

/// β_i = Σ_x min(p_i(x), q_i(x)) for the first `tested` draft positions (Leviathan et al.
/// Def. 3.1; p_i(x_i) for point masses), p_i the standardized target row i.
inline void estimate_acceptance(const Eigen::Ref<const Eigen::MatrixXf>& target_logits, const draft_block& block,
                                const Eigen::Ref<const Eigen::MatrixXf>& probs, const sampling_config& sampling,
                                std::size_t tested, step_workspace& ws) {
    ws.acceptance.resize(tested);
    reshape(ws.target_probs, target_logits.rows());
    for (std::size_t i = 0; i < tested; ++i) {
        const auto col = static_cast<Eigen::Index>(i);
        standardize(target_logits.col(col), sampling, ws.target_probs, ws.sampling);
        double beta;
        if (probs.cols() == 0) {
            beta = ws.target_probs[block.tokens[i]];
        } else {
            const float scale = block.scales.empty() ? 1.0f : block.scales[i];
            beta = ws.target_probs.array().min(scale * probs.col(col).array()).template cast<double>().sum();
        }
        ws.acceptance[i] = static_cast<float>(std::clamp(beta, 0.0, 1.0));
    }
}

/// Seconds since `t0` (steady clock).
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline void check_step_options(std::size_t gamma, const sampling_config& sampling, float lenience,
                               verification_scheme scheme, const char* where) {
    if (gamma == 0) fail_invalid(where, ": gamma = 0; at least one draft token per step is needed (gamma >= 1)");
    validate(sampling, where);
    if (!(lenience > 0.0f && lenience <= 1.0f))
        fail_invalid(where, ": lenience = ", lenience, " must lie in (0, 1] (1 is exact)");
    if (lenience != 1.0f && scheme == verification_scheme::block)
        fail_invalid(where, ": lenience = ", lenience,
                     " is defined for token verification only; set scheme = verification_scheme::token");
}

/// Checks step_options::draft_sampling (or decode_options::draft.sampling, with prefix
/// "draft.") as validate() does, naming the field in the message.
inline void check_draft_sampling(const std::optional<sampling_config>& draft, const char* where,
                                 const char* prefix = "draft_") {
    if (!draft) return;
    try {
        validate(*draft, where);
    } catch (const std::invalid_argument& e) {
        std::string message = e.what();
        if (const auto at = message.find("sampling."); at != std::string::npos) message.insert(at, prefix);
        throw std::invalid_argument(message);
    }
}

/// The one vocabulary check of every entry point: a model's vocab_size() must be positive, and
/// a drafter's must equal the target's. Returns the vocabulary size.
template <class M>
std::ptrdiff_t checked_vocab(M& model, const char* where) {
    const auto v = static_cast<std::ptrdiff_t>(model.vocab_size());
    if (v <= 0) fail_invalid(where, ": vocab_size() = ", v, " must be positive");
    return v;
}
template <class D, class V>
std::ptrdiff_t checked_vocab(D& drafter, V& verifier, const char* where) {
    const auto vd = static_cast<std::ptrdiff_t>(drafter.vocab_size());
    const auto vt = static_cast<std::ptrdiff_t>(verifier.vocab_size());
    if (vd != vt)
        fail_invalid(where, ": draft vocab_size() = ", vd, " differs from target vocab_size() = ", vt,
                     "; both models must share one vocabulary");
    return checked_vocab(verifier, where);
}

/// Step phase 1, before drafting: empties the block and sets its draft-side stop. Nothing of
/// the last step's block (made by this drafter or another) reaches this one: a drafter that
/// writes only tokens makes point-mass drafts, one that sets no scales has none, and
/// standardized stays false unless the drafter sets it.
inline void begin_draft(draft_block& block, const step_extras* extras) {
    block.clear();
    block.stop_below = extras ? extras->draft_stop_below : 0.0f;
}

/// Step phase 1 with a per-sequence Drafter (Alg. 1, first loop: sample γ guesses from M_q)
/// into ws.draft; γ = 0 drafts nothing (one token is then sampled from the target).
template <Drafter D>
void run_drafter(D& drafter, std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
                 uniform_source& uniforms, step_workspace& ws, const char* where) {
    if (gamma == 0) return;
    if constexpr (BlockDrafter<D>) {
        drafter.draft(context, gamma, sampling, uniforms, ws.draft);
    } else {
        draft_from_model(drafter, context, gamma, sampling, uniforms, ws.draft, ws.context, ws.logits, ws.sampling, where);
    }
}

/// Step phase 1, after drafting: checks the block the drafter wrote (before the target sees
/// it) and ends it at the draft-side stop. Returns its length n.
inline std::size_t check_draft(draft_block& block, std::size_t gamma, std::ptrdiff_t vocab, const char* where) {
    std::size_t n = block.tokens.size();
    if (n > gamma) fail_invalid(where, ": the drafter proposed ", n, " tokens; at most gamma = ", gamma, " were asked for");
    // Before the target sees them: a token out of range would index its embedding table.
    check_token_range(block.tokens, vocab, where, "the drafter's tokens");
    // A drafter that stopped early (draft_block::stop_below) may keep unused columns.
    const auto cols = block.probs.cols(), drafted = static_cast<Eigen::Index>(n);
    if (block.has_distributions() &&
        (block.probs.rows() != vocab || (cols != drafted && !(block.stop_below > 0.0f && cols > drafted))))
        fail_invalid(where, ": the drafter's probs is ", block.probs.rows(), " x ", cols,
                     "; expected vocab_size x drafted tokens = ", vocab, " x ", n, " (or 0 columns for point-mass drafts)");
    // Scales, when given, are one per drafted column of probs (none for point masses).
    const bool scaled = !block.scales.empty();
    if (scaled) check_draft_scales(block.scales, block.has_distributions() ? drafted : 0, where, "the drafter's scales");
    // The draft-side stop (p_min in llama.cpp, where it ends drafting before a token whose
    // draft probability is low): the block ends after the first token x_i with
    // q_i(x_i) < stop_below. That token stays in the block and is verified as usual, so where
    // the block ends depends on draft values only and every position is an ordinary exact
    // test: the output keeps the target's distribution.
    if (block.stop_below > 0.0f && block.has_distributions()) {
        for (std::size_t i = 0; i < n; ++i) {
            const auto col = static_cast<Eigen::Index>(i);
            const double q = (scaled ? static_cast<double>(block.scales[i]) : 1.0) *
                             static_cast<double>(block.probs(block.tokens[i], col));
            if (q < static_cast<double>(block.stop_below)) {
                n = i + 1;
                block.tokens.resize(n);
                if (scaled) block.scales.resize(n);
                break;
            }
        }
    }
    return n;
}

/// Step phase 2 with a per-sequence Verifier (Alg. 1: run M_p on all γ+1 prefixes in one
/// pass) into ws.target_logits.
template <Verifier V>
void run_verifier(V& verifier, std::span<const token_id> context, std::span<const token_id> draft_tokens,
                  step_workspace& ws, std::ptrdiff_t vocab, const char* where) {
    if constexpr (InPlaceBatchVerifier<V>) {
        ws.shape_target_logits(vocab, static_cast<Eigen::Index>(draft_tokens.size() + 1));
        verifier.score_into(context, draft_tokens, ws.target_logits);
    } else if constexpr (BatchVerifier<V>) {
        ws.target_logits = verifier.score(context, draft_tokens);
    } else {
        ws.shape_target_logits(vocab, static_cast<Eigen::Index>(draft_tokens.size() + 1));
        score_with_model(verifier, context, draft_tokens, ws.target_logits, ws.context, ws.logits, where);
    }
}

/// Step phase 3: checks the target's scores of the block in ws.draft (its n tokens), verifies
/// them with `rng`, and appends the result to `sequence`. Strong guarantee: if anything throws,
/// `sequence` and `stats` are as they were.
template <class G>
step_result finish_step(const Eigen::Ref<const Eigen::MatrixXf>& target_logits, std::vector<token_id>& sequence,
                        decode_stats& stats, std::size_t target_calls, const sampling_config& sampling,
                        float lenience, verification_scheme scheme, G& rng, step_workspace& ws, std::ptrdiff_t vocab,
                        const char* where, step_extras* extras) {
    draft_block& block = ws.draft;
    const std::size_t n = block.tokens.size();
    const std::span<const token_id> draft_tokens(block.tokens);
    if (target_logits.rows() != vocab || target_logits.cols() != static_cast<Eigen::Index>(n + 1))
        fail_invalid(where, ": the target's score() returned ", target_logits.rows(), " x ", target_logits.cols(),
                     "; expected vocab_size x (draft length + 1) = ", vocab, " x ", n + 1);
    const bool scaled = !block.scales.empty();

    // Modified rejection sampling and residual resampling.
    verify_options vopts;
    vopts.lenience = lenience;
    vopts.scheme = scheme;
    // Columns written by standardize() or its sampling variants (draft_from_model's, through
    // model_drafter or a plain LanguageModel drafter) are distributions by construction.
    vopts.check_draft_distributions = !block.standardized;
    const Eigen::Index q_rows = vocab, q_cols = static_cast<Eigen::Index>(n);
    check_verify_inputs(target_logits, draft_tokens, block.has_distributions() ? &q_rows : nullptr, &q_cols,
                        sampling, vopts, where);
    const Eigen::Ref<const Eigen::MatrixXf> probs(block.probs.leftCols(block.has_distributions() ? q_cols : 0));
    const verify_result r = run_verify({target_logits, draft_tokens, block.has_distributions() ? &probs : nullptr,
                                        scaled ? block.scales.data() : nullptr, sampling, vopts, where},
                                       rng, ws.verify);
    const std::size_t tested = std::min(n, r.accepted + 1);
    if (extras && extras->estimate_acceptance) estimate_acceptance(target_logits, block, probs, sampling, tested, ws);
    else ws.acceptance.clear();

    // Commit. Everything that can throw (allocation) happens before the first change. The
    // sequence grows geometrically, as push_back would: reserving only what this step needs
    // would reallocate and copy the whole sequence on every step once its capacity is used up.
    const std::size_t need = sequence.size() + r.accepted + 1;
    if (need > sequence.capacity()) sequence.reserve(std::max(need, 2 * sequence.capacity()));
    const std::size_t positions = std::max(stats.accepted_at_position.size(), n);
    const bool as_sibling = extras && extras->estimate_acceptance && extras->acceptance_as_sibling;
    const bool estimated = extras && extras->estimate_acceptance && !as_sibling;
    stats.accepted_at_position.reserve(positions);
    stats.reached_at_position.reserve(positions);
    if (estimated) stats.expected_accepted_at_position.reserve(positions);
    if (as_sibling && tested > 0) {
        stats.reached_at_sibling.reserve(1);
        stats.expected_accepted_at_sibling.reserve(1);
    }
    stats.accepted_at_position.resize(positions, 0);
    stats.reached_at_position.resize(positions, 0);
    if (estimated) stats.expected_accepted_at_position.resize(positions, 0.0);
    sequence.insert(sequence.end(), block.tokens.begin(), block.tokens.begin() + static_cast<std::ptrdiff_t>(r.accepted));
    sequence.push_back(r.next_token);
    stats.steps += 1;
    stats.target_calls += target_calls;
    // A drafter that does not report its model calls costs one call per block it proposed.
    stats.draft_calls += block.model_calls.value_or(n > 0 ? 1 : 0);
    stats.drafted_tokens += n;
    stats.accepted_tokens += r.accepted;
    stats.rejected_tokens += (r.accepted < n) ? 1 : 0;
    for (std::size_t i = 0; i < r.accepted; ++i) ++stats.accepted_at_position[i];
    for (std::size_t i = 0; i < tested; ++i) ++stats.reached_at_position[i];
    if (estimated)
        for (std::size_t i = 0; i < tested; ++i) stats.expected_accepted_at_position[i] += ws.acceptance[i];
    if (as_sibling && tested > 0) {  // reserved above: no allocation after the commit
        if (stats.reached_at_sibling.empty()) stats.reached_at_sibling.resize(1, 0);
        if (stats.expected_accepted_at_sibling.empty()) stats.expected_accepted_at_sibling.resize(1, 0.0);
        ++stats.reached_at_sibling[0];
        stats.expected_accepted_at_sibling[0] += ws.acceptance[0];
    }
    return {draft_tokens, r.accepted, r.next_token, std::span<const float>(ws.acceptance)};
}

/// The body of a step, for gamma >= 0 (0: no draft, one token sampled from the target):
/// phases 1 to 3 above with per-sequence models. Options must have been checked. Strong
/// guarantee: if anything throws, `sequence` and `stats` are as they were.
template <Drafter D, Verifier V, class G>
step_result step_impl(D& drafter, V& verifier, std::vector<token_id>& sequence, decode_stats& stats,
                      std::size_t gamma, const sampling_config& sampling, float lenience,
                      verification_scheme scheme, G& rng,
                      step_workspace& ws, std::ptrdiff_t vocab, const char* where, step_extras* extras = nullptr) {
    static_assert(BatchVerifier<V> || !requires(V& v, std::span<const token_id> c, Eigen::MatrixXf& out) {
        v.score_into(c, c, out);
    }, "specdec: the verifier has score_into() but no score(); a batched verifier needs score() too (it may call "
       "score_into), else it is used as a plain LanguageModel, one next_logits call per position");
    const std::span<const token_id> context(sequence);

    uniform_source uniforms(rng);
    begin_draft(ws.draft, extras);
    const bool timed = extras && extras->time;
    auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    run_drafter(drafter, context, gamma, extras && extras->draft_sampling ? *extras->draft_sampling : sampling,
                uniforms, ws, where);
    if (timed) {
        extras->draft_seconds = seconds_since(t0);
        t0 = std::chrono::steady_clock::now();
    }
    const std::size_t n = check_draft(ws.draft, gamma, vocab, where);

    run_verifier(verifier, context, std::span<const token_id>(ws.draft.tokens), ws, vocab, where);
    if (timed) extras->pass_seconds = seconds_since(t0);
    return finish_step(ws.target_logits, sequence, stats, score_calls(verifier, n), sampling, lenience, scheme, rng, ws,
                       vocab, where, extras);
}

}  // namespace detail

/// Runs one step of speculative decoding on `sequence` (Leviathan et al. 2023, Alg. 1):
/// the drafter proposes up to γ tokens x_1..x_n sampled from its standardized
/// distributions, the verifier scores all n+1 positions in one pass, verify() accepts a
/// prefix x_1..x_k and draws one more token, and x_1..x_k plus that token are appended.
///
/// The appended tokens have exactly the distribution the target model gives them
/// (App. A.1), for any drafter, unless lenience < 1.
///
/// \param drafter   a Drafter (a BlockDrafter, or a plain LanguageModel)
/// \param verifier  a Verifier (a BatchVerifier, or a plain LanguageModel)
/// \param sequence  the context (prompt and tokens so far, at least one token); the step
///                  appends to it
/// \param stats     counters the step adds to
/// \param opts      γ, sampling (and the draft's, draft_sampling), lenience, scheme
/// \param rng       the caller's generator; all randomness comes from it
/// \param ws        reusable buffers
/// \returns what was drafted, accepted and emitted.
/// \throws std::invalid_argument for γ = 0, invalid sampling settings (or draft_sampling) or
///         lenience, a vocabulary mismatch, an empty `sequence` or a token of it out of range, a malformed draft block
///         (checked before the target sees it) or score() result, or invalid logits; and
///         whatever an adapter throws. In every case `sequence` and `stats` are left exactly
///         as they were (strong guarantee). `rng` is not rewound (the uniforms drawn before
///         the throw are spent). After an adapter's exception `ws` stays usable: a later step
///         with it equals one with a fresh workspace. After a std::bad_alloc from the step's
///         own buffers, continue with a fresh workspace.
template <Drafter D, Verifier V, random_generator G>
step_result speculative_step(D& drafter, V& verifier, std::vector<token_id>& sequence, decode_stats& stats,
                             const step_options& opts, G&& rng, step_workspace& ws) {
    [[maybe_unused]] constexpr bool diagnosed = detail::diagnose_speculative_call<D, V, G>();  // logits of float
    constexpr const char* where = "specdec::speculative_step";
    detail::check_step_options(opts.gamma, opts.sampling, opts.lenience, opts.scheme, where);
    detail::check_draft_sampling(opts.draft_sampling, where);
    const std::ptrdiff_t vocab = detail::checked_vocab(drafter, verifier, where);
    if (sequence.empty())
        detail::fail_invalid(where, ": sequence is empty; the models need at least one context token to condition on"
                                    " (start it with the model's BOS token)");
    detail::check_token_range(sequence, vocab, where, "sequence");
    detail::step_extras extras{.draft_sampling = opts.draft_sampling ? &*opts.draft_sampling : nullptr};
    return detail::step_impl(drafter, verifier, sequence, stats, opts.gamma, opts.sampling, opts.lenience,
                             opts.scheme, rng, ws, vocab, where, &extras);
}

/// Chosen only when the drafter, verifier or generator misses a requirement: reports which
/// one, and the fix, in a static_assert (see diagnostics.hpp).
template <class D, class V, class G>
step_result speculative_step(D&, V&, std::vector<token_id>&, decode_stats&, const step_options&, G&&,
                             step_workspace&) {
    detail::reject_speculative_call<D, V, G>();
    return {};
}

}  // namespace specdec
