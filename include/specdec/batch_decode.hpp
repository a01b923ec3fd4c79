#pragma once
/// \file
/// The batch decoding loop: many sequences decoded together, one draft phase and one target
/// pass per step for all of them, sequences joining and leaving between steps. It owns what a
/// batch caller would otherwise get wrong with per-sequence KV caches: each sequence's stop
/// tokens and token budget, and which model slot (cache) belongs to which sequence, so a
/// sequence that finishes or leaves never disturbs the others.
///
/// Exactness: each sequence is decoded with its own generator, drawing exactly what
/// speculative_decode with that generator draws, so under the fixed γ policy a sequence's
/// tokens equal those of a separate speculative_decode run with the same seed, prompt, budget
/// and stop tokens, whatever the other sequences do (tests/batch_test.cpp); under the adaptive
/// policy each step's γ is chosen from earlier steps only, so every sequence keeps the target's
/// distribution (tests/batch_distribution_test.cpp).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "adaptive_gamma.hpp"
#include "batch.hpp"
#include "concepts.hpp"
#include "error.hpp"
#include "multi_sequence.hpp"
#include "random.hpp"
#include "speculative_decode.hpp"
#include "speculative_step.hpp"
#include "types.hpp"

namespace specdec {

/// Settings shared by all sequences of a batch_decoder. Aggregate: designated initializers.
struct batch_decode_options {
    /// γ, draft tokens per step (each sequence asks for at most its tokens still needed − 1,
    /// as speculative_decode does). 0: no drafts, batched autoregressive decoding (one target
    /// pass over one new position per sequence per step). Under the adaptive policy, the
    /// longest draft it may choose (then >= 1).
    std::size_t gamma = 4;
    /// Fixed γ, or adaptive: before each step one γ in [0, gamma] for the whole batch, the one
    /// with the most expected tokens per unit of time (gamma_controller, fed the batch's pass
    /// and draft times and the β of every sequence's tested positions, averaged per position).
    /// The batched pass's cost grows with B·(γ+1), so the larger the batch, the shorter the
    /// draft it picks. Exact: the choice depends on earlier steps only.
    gamma_policy policy = gamma_policy::fixed;
    /// Settings of the adaptive policy.
    adaptive_gamma_options adaptive{};
    /// Standardized sampling, applied identically to target and draft.
    sampling_config sampling{};
    /// Lenience l in (0, 1] (token verification only). **l < 1 changes the output
    /// distribution**; 1, the default, is exact.
    float lenience = 1.0f;
    /// Token or block verification; both exact.
    verification_scheme scheme = verification_scheme::block;
    /// Compute β of every tested draft position into each sequence's
    /// decode_stats::expected_accepted_at_position with the fixed policy too (always on under the
    /// adaptive one); see decode_options::estimate_acceptance. Does not change the output.
    bool estimate_acceptance = false;
    /// The draft-side stop (see decode_options::draft_stop_below). \pre 0 <= it <= 1.
    float draft_stop_below = 0.0f;
    /// Default budget and stop tokens of a sequence added without sequence_options.
    std::size_t max_new_tokens = 128;
    std::vector<token_id> stop_tokens{};
    /// Called after every step of every sequence with its id and what the step produced (for
    /// streaming), on the calling thread; may be empty.
    std::function<void(std::size_t id, const step_event&)> on_step{};
};

/// One sequence's own settings.
struct sequence_options {
    /// Exactly this many tokens are generated, unless a stop token ends the sequence earlier.
    std::size_t max_new_tokens = 128;
    /// Generating any of these ends the sequence; the stop token is included in its output.
    std::vector<token_id> stop_tokens{};
};

/// Decodes many sequences together (see the file comment).
///
/// \tparam D a MultiSequenceDrafter, or a Drafter shared by all sequences (called once per
///           sequence, on the calling thread; it must return for each context what it would
///           alone: a stateless drafter, or a model whose cache follows the context)
/// \tparam V a MultiSequenceVerifier, or a Verifier shared the same way
/// \tparam G the sequences' generator type
///
/// A sequence is identified by the id add() returns, which is also its slot in the models
/// (score_request::slot); a finished sequence keeps its id until take() or remove(), then the
/// id may be given to a sequence added later. Not thread-safe; one decoder per loop.
///
/// \code
/// specdec::batch_decoder<my_drafter, llama2::batch_transformer, std::mt19937_64> dec(draft, target, {.gamma = 3});
/// auto a = dec.add(prompt_a, std::mt19937_64(1), {.max_new_tokens = 64, .stop_tokens = {2}});
/// auto b = dec.add(prompt_b, std::mt19937_64(2));
/// while (dec.active() != 0) dec.step();          // more sequences may be added between steps
/// specdec::decode_result ra = dec.take(a), rb = dec.take(b);
/// \endcode
template <class D, class V, random_generator G>
    requires((MultiSequenceDrafter<D> || Drafter<D>) && (MultiSequenceVerifier<V> || Verifier<V>))
class batch_decoder {
public:
    /// \param threads threads of the built-in executor (1: the calling thread alone); unused
    ///        by step(executor).
    /// \throws std::invalid_argument for invalid options (γ, sampling, lenience, the draft-side
    ///         stop, adaptive settings), a vocabulary mismatch, a stop token out of range, or
    ///         threads = 0.
    batch_decoder(D& drafter, V& verifier, batch_decode_options options = {}, std::size_t threads = 1)
        : drafter_(drafter), verifier_(verifier), options_(std::move(options)), ws_(threads) {
        constexpr const char* where = "specdec::batch_decoder";
        const bool adaptive = options_.policy == gamma_policy::adaptive;
        if (options_.gamma == 0 && adaptive)
            detail::fail_invalid(where, ": gamma = 0 with the adaptive policy; it needs gamma >= 1 as the longest draft");
        detail::check_step_options(std::max<std::size_t>(options_.gamma, 1), options_.sampling, options_.lenience,
                                   options_.scheme, where);
        if (!(options_.draft_stop_below >= 0.0f && options_.draft_stop_below <= 1.0f))
            detail::fail_invalid(where, ": draft_stop_below = ", options_.draft_stop_below, " must lie in [0, 1] (0 is off)");
        const auto vd = static_cast<std::ptrdiff_t>(drafter.vocab_size());
        vocab_ = static_cast<std::ptrdiff_t>(verifier.vocab_size());
        if (vd != vocab_)
            detail::fail_invalid(where, ": draft vocab_size() = ", vd, " differs from target vocab_size() = ", vocab_,
                                 "; both models must share one vocabulary");
        if (vocab_ <= 0) detail::fail_invalid(where, ": vocab_size() = ", vocab_, " must be positive");
        detail::check_token_range(options_.stop_tokens, vocab_, where, "stop_tokens");
        if (adaptive) controller_.emplace(options_.gamma, options_.adaptive);
    }

    /// Adds a sequence to the batch; it takes part from the next step on.
    /// \returns its id (and model slot): the lowest id not in use.
    /// \throws std::invalid_argument for an empty prompt or a prompt or stop token out of
    ///         range (nothing changes).
    std::size_t add(std::span<const token_id> prompt, G rng, sequence_options so) {
        constexpr const char* where = "specdec::batch_decoder::add";
        if (prompt.empty()) detail::fail_invalid(where, ": empty prompt; a sequence needs at least one token of context");
        detail::check_prompt_and_stop_tokens(prompt, so.stop_tokens, vocab_, where);
        std::size_t id = 0;
        while (id < entries_.size() && entries_[id]) ++id;
        auto e = std::make_unique<entry>(std::move(rng));
        e->sequence.reserve(prompt.size() + std::min(so.max_new_tokens, detail::initial_reserve) +
                            std::min(options_.gamma, detail::initial_reserve) + 1);
        e->sequence.assign(prompt.begin(), prompt.end());
        e->prompt = prompt.size();
        e->done = so.max_new_tokens == 0;
        e->options = std::move(so);
        if (id == entries_.size()) entries_.emplace_back();
        entries_[id] = std::move(e);
        return id;
    }
    /// Adds a sequence with the decoder's default budget and stop tokens.
    std::size_t add(std::span<const token_id> prompt, G rng) {
        return add(prompt, std::move(rng), sequence_options{options_.max_new_tokens, options_.stop_tokens});
    }

    /// Sequences still generating (not finished).
    [[nodiscard]] std::size_t active() const noexcept {
        std::size_t n = 0;
        for (const auto& e : entries_) n += (e && !e->done) ? 1u : 0u;
        return n;
    }
    /// True when `id` is a sequence of this decoder (generating or finished, not yet taken).
    [[nodiscard]] bool contains(std::size_t id) const noexcept { return id < entries_.size() && entries_[id]; }
    /// True when sequence `id` has finished (budget reached or stop token).
    [[nodiscard]] bool finished(std::size_t id) const { return at(id, "finished").done; }
    /// The tokens sequence `id` has generated so far (prompt excluded); valid until the next
    /// step, add, take or remove.
    [[nodiscard]] std::span<const token_id> generated(std::size_t id) const {
        const entry& e = at(id, "generated");
        return std::span<const token_id>(e.sequence).subspan(e.prompt);
    }
    /// Sequence `id`'s counters so far.
    [[nodiscard]] const decode_stats& stats(std::size_t id) const { return at(id, "stats").stats; }
    /// Sequence `id`'s generator (it has advanced by what the sequence drew).
    [[nodiscard]] G& rng(std::size_t id) { return at(id, "rng").rng; }

    /// Removes sequence `id` from the batch (finished or not) and returns what it generated;
    /// the other sequences are not disturbed, and the id becomes free.
    /// \throws std::invalid_argument for an id not in the batch.
    decode_result take(std::size_t id) {
        entry& e = at(id, "take");
        decode_result r;
        r.tokens.assign(e.sequence.begin() + static_cast<std::ptrdiff_t>(e.prompt), e.sequence.end());
        r.stats = std::move(e.stats);
        r.stop = e.stop;
        entries_[id].reset();
        return r;
    }
    /// Removes sequence `id`, discarding its output. \throws std::invalid_argument for an id
    /// not in the batch.
    void remove(std::size_t id) {
        (void)at(id, "remove");
        entries_[id].reset();
    }

    /// One step of every active sequence: drafts for all, one target pass, verification per
    /// sequence on `executor` (see BatchExecutor), then each sequence's stop tokens and budget.
    /// \returns the number of sequences still active.
    /// \throws the exception of draft_batch or score_batch (no sequence changed; the
    ///         generators of sequences that drafted have advanced; the adaptive policy has not
    ///         observed the step); else, after every other sequence has stepped, the exception
    ///         of the lowest-id sequence whose step threw (that sequence unchanged, still
    ///         active: step again, or remove it; the adaptive policy has observed the sequences
    ///         that stepped). An exception from on_step propagates once every sequence of the
    ///         step is settled (its tokens, budget and stop); the callbacks of the sequences
    ///         after it in that step are skipped. Either way the decoder stays usable.
    template <BatchExecutor E>
    std::size_t step(E& executor) {
        constexpr const char* where = "specdec::batch_decoder::step";
        items_.clear();
        std::size_t limit = 0;  // the most any sequence could still use
        for (std::size_t id = 0; id < entries_.size(); ++id) {
            entry* e = entries_[id].get();
            if (!e || e->done) continue;
            const std::size_t remaining = e->options.max_new_tokens - e->generated;
            limit = std::max(limit, remaining - 1);
            items_.push_back({.slot = id, .tokens = &e->sequence, .stats = &e->stats, .rng = &e->rng, .ws = &e->ws,
                              .gamma = std::min(options_.gamma, remaining - 1), .extras = &e->extras});
        }
        if (items_.empty()) return 0;
        const bool adaptive = controller_.has_value();
        std::size_t gamma = options_.gamma;
        bool first = false;
        if (adaptive) {
            gamma = controller_->choose(limit);
            for (auto& it : items_) {
                const entry& e = *entries_[it.slot];
                it.gamma = std::min(gamma, e.options.max_new_tokens - e.generated - 1);
                first = first || e.stats.steps == 0;
            }
        }
        const bool estimate = adaptive || options_.estimate_acceptance;
        for (auto& it : items_)
            *it.extras = detail::step_extras{.estimate_acceptance = estimate, .draft_stop_below = options_.draft_stop_below};
        detail::multi_timing timing{.time = adaptive && controller_->measures_time()};
        const auto t0 = timing.time ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        const std::span<detail::multi_item<G>> items(items_);
        try {
            detail::multi_step(drafter_, verifier_, items, options_.sampling, options_.lenience, options_.scheme, vocab_,
                               ws_.multi(), executor, where, &timing);
        } catch (...) {
            settle(items);  // what the executor committed before it threw
            throw;
        }
        settle(items);
        if (adaptive) observe(gamma, first, timing, t0, items);
        detail::rethrow_first(items);
        return active();
    }
    /// One step on the built-in executor (the decoder's threads).
    std::size_t step() { return step(ws_); }

    /// Steps until no sequence is active (on `executor`, or the built-in one).
    template <BatchExecutor E>
    void run(E& executor) {
        while (step(executor) != 0) {
        }
    }
    void run() { run(ws_); }

    /// The adaptive policy's controller (null under the fixed policy).
    [[nodiscard]] const gamma_controller* controller() const noexcept {
        return controller_ ? &*controller_ : nullptr;
    }

private:
    struct entry {
        explicit entry(G g) : rng(std::move(g)) {}
        std::vector<token_id> sequence;  // prompt, then generated tokens
        std::size_t prompt = 0;
        std::size_t generated = 0;
        sequence_options options;
        G rng;
        decode_stats stats;
        stop_reason stop = stop_reason::max_new_tokens;
        bool done = false;
        step_workspace ws;
        detail::step_extras extras;
    };

    entry& at(std::size_t id, const char* fn) const {
        if (!contains(id))
            detail::fail_invalid("specdec::batch_decoder::", fn, ": id ", id, " is not a sequence of this batch");
        return *entries_[id];
    }

    /// Stop tokens and budgets of the sequences that stepped (as speculative_decode's loop),
    /// all of them first; then on_step for each, so that a callback that throws (or takes or
    /// removes a sequence) leaves no sequence of the step half settled.
    void settle(std::span<detail::multi_item<G>> items) {
        for (auto& it : items) {
            if (!it.stepped) continue;
            it.stepped = false;  // settled once
            entry& e = *entries_[it.slot];
            const step_result& r = it.result;
            if (e.stats.steps_at_gamma.size() <= it.gamma) e.stats.steps_at_gamma.resize(it.gamma + 1, 0);
            ++e.stats.steps_at_gamma[it.gamma];
            const bool stopped = detail::cut_at_stop(e.sequence, r.emitted(), e.options.stop_tokens);
            it.appended = e.sequence.size() - e.prompt - e.generated;
            it.settled = true;
            e.generated += it.appended;
            if (stopped) {
                e.stop = stop_reason::stop_token;
                e.done = true;
            } else if (e.generated >= e.options.max_new_tokens) {
                e.stop = stop_reason::max_new_tokens;
                e.done = true;
            }
        }
        for (auto& it : items) {
            if (!it.settled) continue;
            it.settled = false;
            const entry* e = entries_[it.slot].get();
            // (None, or an earlier callback took the sequence out, or put another in its slot.)
            if (!options_.on_step || e == nullptr || it.tokens != &e->sequence) continue;
            const step_result& r = it.result;
            options_.on_step(it.slot, step_event{r.draft, r.accepted, r.next_token,
                                                 std::span<const token_id>(e->sequence).last(it.appended),
                                                 r.acceptance, it.gamma});
        }
    }

    /// Feeds the controller one observation for the whole batch: the step's γ, the times of
    /// its draft phase and target pass, and per draft position the mean β over the sequences
    /// that tested it.
    void observe(std::size_t gamma, bool first, const detail::multi_timing& timing,
                 std::chrono::steady_clock::time_point t0, std::span<const detail::multi_item<G>> items) {
        beta_sum_.assign(gamma, 0.0);
        beta_count_.assign(gamma, 0);
        std::size_t drafted = 0, emitted = 0, stepped = 0;
        for (const auto& it : items) {
            if (it.error) continue;
            ++stepped;
            drafted = std::max(drafted, it.result.draft.size());
            emitted += it.result.emitted();
            for (std::size_t i = 0; i < it.result.acceptance.size() && i < gamma; ++i) {
                beta_sum_[i] += it.result.acceptance[i];
                ++beta_count_[i];
            }
        }
        if (stepped == 0) return;
        mean_beta_.clear();
        for (std::size_t i = 0; i < gamma && beta_count_[i] != 0; ++i)
            mean_beta_.push_back(static_cast<float>(beta_sum_[i] / static_cast<double>(beta_count_[i])));
        gamma_controller::step_observation o{.gamma = gamma, .drafted = drafted,
                                             .emitted = (emitted + stepped / 2) / stepped,
                                             .acceptance = mean_beta_};
        o.first = first;
        if (timing.time) {
            o.draft_seconds = timing.draft_seconds;
            o.pass_seconds = timing.pass_seconds;
            o.step_seconds = detail::seconds_since(t0);
        }
        controller_->observe(o);
    }

    D& drafter_;
    V& verifier_;
    batch_decode_options options_;
    std::ptrdiff_t vocab_ = 0;
    batch_workspace ws_;
    std::optional<gamma_controller> controller_;
    std::vector<std::unique_ptr<entry>> entries_;  // by id; null: free
    std::vector<detail::multi_item<G>> items_;
    std::vector<double> beta_sum_;
    std::vector<std::size_t> beta_count_;
    std::vector<float> mean_beta_;
};

/// Decodes every prompt with one batch_decoder and returns the results in prompt order:
/// sequence i with rngs[i] (advanced by what it drew), the options' budget and stop tokens.
/// Under the fixed policy, result i equals speculative_decode(drafter_i, verifier_i,
/// prompts[i], ...) with rngs[i] for models that give each context what the shared ones do.
/// \throws std::invalid_argument when prompts and rngs differ in length, and as batch_decoder.
template <class D, class V, random_generator G>
    requires((MultiSequenceDrafter<D> || Drafter<D>) && (MultiSequenceVerifier<V> || Verifier<V>))
std::vector<decode_result> speculative_decode_batch(D& drafter, V& verifier,
                                                    std::span<const std::vector<token_id>> prompts,
                                                    const batch_decode_options& options, std::span<G> rngs,
                                                    std::size_t threads = 1) {
    if (prompts.size() != rngs.size())
        detail::fail_invalid("specdec::speculative_decode_batch: ", prompts.size(), " prompts and ", rngs.size(),
                             " generators; one generator per prompt is needed");
    batch_decoder<D, V, G> dec(drafter, verifier, options, threads);
    std::vector<std::size_t> ids;
    ids.reserve(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(dec.add(prompts[i], rngs[i]));
    dec.run();
    std::vector<decode_result> out;
    out.reserve(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        rngs[i] = dec.rng(ids[i]);
        out.push_back(dec.take(ids[i]));
    }
    return out;
}

}  // namespace specdec
