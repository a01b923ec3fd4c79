#pragma once
/// \file
/// One speculative step over B independent sequences, optionally spread over threads.
///
/// Each sequence has its own drafter, verifier (they may share weights; a model with a KV
/// cache needs one per sequence), token buffer, statistics and generator stream, and
/// acceptance is ragged: each sequence accepts its own number of tokens. Because nothing
/// random or stateful is shared, a batch step gives every sequence exactly what B separate
/// speculative_step calls with the same generators would, whatever the thread count.
///
/// Two forms: per-sequence models (spans of drafters and verifiers, one target pass per
/// sequence), and one MultiSequenceVerifier for all (multi_sequence.hpp: one target pass for
/// the whole batch, as serving engines run it; the drafter a MultiSequenceDrafter or one plain
/// drafter). The per-sequence work runs on a BatchExecutor: the workspace's own threads, or the
/// caller's. The decoding loop over such steps, with stop tokens, budgets and sequences joining
/// and leaving, is batch_decoder (batch_decode.hpp).

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "concepts.hpp"
#include "diagnostics.hpp"
#include "error.hpp"
#include "multi_sequence.hpp"
#include "random.hpp"
#include "speculative_step.hpp"
#include "types.hpp"

namespace specdec {

/// One sequence of a batch.
template <random_generator G>
struct batch_sequence {
    std::vector<token_id> tokens;  ///< context so far; each step appends to it
    decode_stats stats;            ///< this sequence's counters
    G rng;                         ///< this sequence's own generator stream
};

namespace detail {

/// A fixed set of worker threads that run one indexed job at a time (fork-join), so that a
/// batch step does not pay for creating threads.
class worker_pool {
public:
    explicit worker_pool(std::size_t workers) {
        threads_.reserve(workers);
        for (std::size_t t = 0; t < workers; ++t) threads_.emplace_back([this, t] { loop(t + 1); });
    }
    worker_pool(const worker_pool&) = delete;
    worker_pool& operator=(const worker_pool&) = delete;
    ~worker_pool() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_) t.join();
    }

    [[nodiscard]] std::size_t size() const noexcept { return threads_.size() + 1; }

    /// Runs job(i) for i in [0, n), spread over the calling thread and the workers; after every
    /// job has finished, rethrows the exception of the lowest i whose job threw (whatever the
    /// threads' timing).
    void run(std::size_t n, const std::function<void(std::size_t)>& job) {
        {
            std::lock_guard lock(mutex_);
            job_ = &job;
            count_ = n;
            next_ = 0;
            pending_ = threads_.size();
            error_ = nullptr;
            ++generation_;
        }
        wake_.notify_all();
        work();
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return pending_ == 0; });
        job_ = nullptr;
        if (error_) std::rethrow_exception(error_);
    }

private:
    void work() {
        for (;;) {
            std::size_t i;
            {
                std::lock_guard lock(mutex_);
                if (next_ >= count_) return;
                i = next_++;
            }
            try {
                (*job_)(i);
            } catch (...) {
                std::lock_guard lock(mutex_);
                if (!error_ || i < error_index_) {
                    error_ = std::current_exception();
                    error_index_ = i;
                }
            }
        }
    }
    void loop(std::size_t) {
        std::size_t seen = 0;
        for (;;) {
            {
                std::unique_lock lock(mutex_);
                wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_;
            }
            work();
            {
                std::lock_guard lock(mutex_);
                --pending_;
            }
            done_.notify_one();
        }
    }

    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(std::size_t)>* job_ = nullptr;
    std::size_t count_ = 0, next_ = 0, pending_ = 0, generation_ = 0, error_index_ = 0;
    std::exception_ptr error_;
    bool stop_ = false;
};

/// Buffers of a multi-sequence step.
struct multi_buffers {
    packed_logits logits;                // the target's scores, all sequences
    std::vector<score_request> scores;   // the requests of the target pass
    std::vector<draft_request> drafts;   // the requests of a multi-sequence draft
    std::vector<std::size_t> scored;     // the items behind `scores`, in order
    std::vector<std::exception_ptr> errors;  // per sequence, the per-model overload's
};

/// A distinct address per type (batch_workspace::scratch).
template <class T>
inline constexpr char type_tag = 0;

}  // namespace detail

/// Runs the per-sequence work of a batch step: `e.parallel_for(n, job)` runs job(i) once for
/// each i in [0, n), on whatever threads it owns, and returns once all have finished. The
/// built-in default is batch_workspace (a fork-join pool it creates); a serving stack passes
/// its own pool.
///
/// Semantic requirements (not checked by the compiler):
///  1. Every job(i) runs exactly once, and parallel_for returns only after all have finished
///     (jobs may run concurrently: each touches one sequence's state only).
///  2. The jobs specdec hands in do not throw: each records its sequence's exception, which
///     the step rethrows (the lowest-numbered sequence's) after parallel_for has returned, so
///     an executor needs no exception handling of its own and the reported error does not
///     depend on it.
///
/// Exception guarantee when the executor itself throws (it cannot start a thread, say): the
/// batch step propagates that exception; each sequence has either taken its step completely
/// or is unchanged (tell by its stats.steps), as when a sequence's own step throws.
template <class E>
concept BatchExecutor = requires(E& e, std::size_t n, const std::function<void(std::size_t)>& job) {
    e.parallel_for(n, job);
};

/// Buffers and threads for batch steps; reuse one across steps.
class batch_workspace {
public:
    /// \param threads how many threads run a step (1: the calling thread alone).
    /// \throws std::invalid_argument for threads = 0.
    explicit batch_workspace(std::size_t threads = 1) {
        if (threads == 0) detail::fail_invalid("specdec::batch_workspace: threads = 0 must be >= 1");
        if (threads > 1) pool_ = std::make_unique<detail::worker_pool>(threads - 1);
    }
    [[nodiscard]] std::size_t threads() const noexcept { return pool_ ? pool_->size() : 1; }

    /// The step workspace of sequence i (grown on demand).
    step_workspace& sequence(std::size_t i) {
        while (steps_.size() <= i) steps_.emplace_back(std::make_unique<step_workspace>());
        return *steps_[i];
    }

    /// Runs job(i) for i in [0, n) on the workspace's threads; after every job has run,
    /// rethrows the exception of the lowest i whose job threw, on one thread as on several.
    void parallel_for(std::size_t n, const std::function<void(std::size_t)>& job) {
        if (!pool_ || n <= 1) {
            std::exception_ptr first;
            for (std::size_t i = 0; i < n; ++i) {
                try {
                    job(i);
                } catch (...) {
                    if (!first) first = std::current_exception();
                }
            }
            if (first) std::rethrow_exception(first);
            return;
        }
        pool_->run(n, job);
    }

    /// Buffers of the multi-sequence steps (packed scores, requests), reused across steps.
    detail::multi_buffers& multi() noexcept { return multi_; }

    /// A scratch object of type T kept across calls (made on first use, replaced when another
    /// type is asked for): the per-sequence records of a multi-sequence step, whose type
    /// depends on the generator type.
    template <class T>
    T& scratch() {
        if (scratch_tag_ != &detail::type_tag<T>) {
            scratch_ = std::make_shared<T>();
            scratch_tag_ = &detail::type_tag<T>;
        }
        return *static_cast<T*>(scratch_.get());
    }

private:
    std::vector<std::unique_ptr<step_workspace>> steps_;
    std::unique_ptr<detail::worker_pool> pool_;
    detail::multi_buffers multi_;
    std::shared_ptr<void> scratch_;
    const void* scratch_tag_ = nullptr;
};

/// One speculative step (Leviathan et al. 2023, Alg. 1) on each of B sequences: sequence i
/// is drafted by drafters[i], scored by verifiers[i] and sampled with sequences[i].rng.
///
/// \returns nothing; each sequence's tokens and stats are updated as speculative_step does.
/// \throws std::invalid_argument when the spans differ in length or the options are invalid
///         (before any sequence changes), and otherwise the exception of the lowest-numbered
///         sequence whose step threw, after all others finished. A sequence whose step threw is unchanged
///         (speculative_step's strong guarantee); the others have taken their step.
///         So the call as a whole gives the basic guarantee: every sequence's tokens and stats
///         are valid, each either stepped or untouched (tell which by stats.steps); the
///         exceptions of higher-numbered failing sequences are dropped; a failed sequence's rng
///         has advanced by what it drew; the drafters, verifiers and `ws` stay usable.
///         `executor` (a BatchExecutor; the workspace's own threads when omitted) runs the
///         sequences' steps; see BatchExecutor for its own exceptions.
template <Drafter D, Verifier V, random_generator G, BatchExecutor E>
void speculative_step_batch(std::span<D> drafters, std::span<V> verifiers, std::span<batch_sequence<G>> sequences,
                            const step_options& opts, batch_workspace& ws, E& executor) {
    [[maybe_unused]] constexpr bool diagnosed = detail::diagnose_speculative_call<D, V, G>();  // logits of float
    constexpr const char* where = "specdec::speculative_step_batch";
    if (drafters.size() != sequences.size() || verifiers.size() != sequences.size())
        detail::fail_invalid(where, ": ", drafters.size(), " drafters, ", verifiers.size(), " verifiers and ",
                             sequences.size(), " sequences; one of each per sequence is needed");
    detail::check_step_options(opts.gamma, opts.sampling, opts.lenience, opts.scheme, where);
    detail::check_draft_sampling(opts.draft_sampling, where);
    for (std::size_t i = 0; i < sequences.size(); ++i) (void)ws.sequence(i);  // workspaces exist before threads run
    auto& errors = ws.multi().errors;
    errors.assign(sequences.size(), nullptr);
    // Each job records its exception (BatchExecutor: jobs do not throw) and captures one
    // pointer, so std::function stores it without allocating.
    struct context_t {
        std::span<D> drafters;
        std::span<V> verifiers;
        std::span<batch_sequence<G>> sequences;
        const step_options& opts;
        batch_workspace& ws;
        std::vector<std::exception_ptr>& errors;
    } ctx{drafters, verifiers, sequences, opts, ws, errors};
    const std::function<void(std::size_t)> job = [c = &ctx](std::size_t i) {
        constexpr const char* step_name = "specdec::speculative_step_batch";  // (constexpr locals are not captured)
        try {
            auto& s = c->sequences[i];
            if (s.tokens.empty())
                detail::fail_invalid(step_name, ": sequence ", i, " has no tokens; each needs a context of at least one token");
            const std::ptrdiff_t vocab = detail::checked_vocab(c->drafters[i], c->verifiers[i], step_name);
            detail::check_token_range(s.tokens, vocab, step_name, "sequence tokens");
            detail::step_extras extras{.draft_sampling = c->opts.draft_sampling ? &*c->opts.draft_sampling : nullptr};
            detail::step_impl(c->drafters[i], c->verifiers[i], s.tokens, s.stats, c->opts.gamma, c->opts.sampling,
                              c->opts.lenience, c->opts.scheme, s.rng, c->ws.sequence(i), vocab, step_name, &extras);
        } catch (...) {
            c->errors[i] = std::current_exception();
        }
    };
    executor.parallel_for(sequences.size(), job);
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
}

/// The same on the workspace's own threads.
template <Drafter D, Verifier V, random_generator G>
void speculative_step_batch(std::span<D> drafters, std::span<V> verifiers, std::span<batch_sequence<G>> sequences,
                            const step_options& opts, batch_workspace& ws) {
    speculative_step_batch(drafters, verifiers, sequences, opts, ws, ws);
}

/// Chosen only when a drafter, verifier or generator type misses a requirement: reports which
/// one, and the fix, in a static_assert (see diagnostics.hpp).
template <class D, class V, class G>
void speculative_step_batch(std::span<D>, std::span<V>, std::span<batch_sequence<G>>, const step_options&,
                            batch_workspace&) {
    detail::reject_speculative_call<D, V, G>();
}

/// The same with the drafters, verifiers and sequences in vectors (the usual case), so that
/// no std::span needs to be spelled out.
template <class D, class V, class G>
void speculative_step_batch(std::vector<D>& drafters, std::vector<V>& verifiers,
                            std::vector<batch_sequence<G>>& sequences, const step_options& opts, batch_workspace& ws) {
    speculative_step_batch(std::span<D>(drafters), std::span<V>(verifiers), std::span<batch_sequence<G>>(sequences),
                           opts, ws);
}



namespace detail {

/// One sequence of a multi-sequence step, as multi_step sees it.
template <class G>
struct multi_item {
    std::size_t slot = 0;                   // the models' per-sequence state to use
    std::vector<token_id>* tokens = nullptr;
    decode_stats* stats = nullptr;
    G* rng = nullptr;
    step_workspace* ws = nullptr;
    std::size_t gamma = 0;                  // this sequence's γ (0: a plain target step)
    step_extras* extras = nullptr;          // may be null
    std::exception_ptr error{};             // what this sequence's step threw
    bool stepped = false;                   // the step was committed
    step_result result{};
    std::size_t appended = 0;               // tokens the settled step added (after a stop-token cut)
    bool settled = false;                   // settled in this call of settle, its on_step not yet run
};

/// What multi_step measured (steady clock) when asked to.
struct multi_timing {
    bool time = false;
    double draft_seconds = 0.0;  // the drafting phase, all sequences
    double pass_seconds = 0.0;   // the target pass, all sequences
};

/// One speculative step (Leviathan et al. 2023, Alg. 1) of every item: the drafts of all (one
/// draft_batch call with a MultiSequenceDrafter, else the shared drafter once per sequence),
/// one target pass for all (score_batch with a MultiSequenceVerifier, else the shared verifier
/// once per sequence), then verification and commit per sequence on the executor, each with
/// its own generator and workspace. So each sequence draws exactly the uniforms, in the same
/// order, that a one-sequence step with its generator draws, and its result equals that
/// step's.
///
/// Errors: an exception of a per-sequence call (drafting, checks, scoring, verification) is
/// recorded in that item, whose sequence stays unchanged; the others step. An exception of a
/// call that serves all sequences (draft_batch, score_batch) propagates before any sequence
/// changes. An exception of the executor propagates after what was committed (see
/// multi_item::stepped). Options must have been checked.
template <class D, class V, class G, BatchExecutor E>
void multi_step(D& drafter, V& verifier, std::span<multi_item<G>> items, const sampling_config& sampling,
                float lenience, verification_scheme scheme, std::ptrdiff_t vocab, multi_buffers& buf, E& executor,
                const char* where, multi_timing* timing = nullptr) {
    for (auto& it : items) {
        it.error = nullptr;
        it.stepped = false;
        begin_draft(it.ws->draft, it.extras);
    }
    const bool timed = timing && timing->time;
    auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};

    // Alg. 1, first loop, for every sequence.
    if constexpr (MultiSequenceDrafter<D>) {
        buf.drafts.clear();
        for (auto& it : items)
            if (it.gamma > 0)
                buf.drafts.push_back({it.slot, std::span<const token_id>(*it.tokens), it.gamma, uniform_source(*it.rng),
                                      &it.ws->draft});
        if (!buf.drafts.empty()) drafter.draft_batch(std::span<draft_request>(buf.drafts), sampling);
    } else {
        for (auto& it : items) {
            try {
                uniform_source uniforms(*it.rng);
                run_drafter(drafter, std::span<const token_id>(*it.tokens), it.gamma, sampling, uniforms, *it.ws);
            } catch (...) {
                it.error = std::current_exception();
            }
        }
    }
    for (auto& it : items) {
        if (it.error) continue;
        try {
            (void)check_draft(it.ws->draft, it.gamma, vocab, where);
        } catch (...) {
            it.error = std::current_exception();
        }
    }
    if (timed) {
        timing->draft_seconds = seconds_since(t0);
        t0 = std::chrono::steady_clock::now();
    }

    // Alg. 1: run M_p on every sequence's γ+1 prefixes, all in one pass.
    buf.scores.clear();
    buf.scored.clear();
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (items[i].error) continue;
        buf.scores.push_back({items[i].slot, std::span<const token_id>(*items[i].tokens),
                              std::span<const token_id>(items[i].ws->draft.tokens)});
        buf.scored.push_back(i);
    }
    constexpr bool packed = MultiSequenceVerifier<V>;
    if constexpr (packed) {
        if (!buf.scores.empty()) {
            buf.logits.shape(static_cast<Eigen::Index>(vocab), buf.scores);
            verifier.score_batch(std::span<const score_request>(buf.scores), buf.logits);
            check_packed_layout(buf.logits, std::span<const score_request>(buf.scores),
                                static_cast<Eigen::Index>(vocab), where);
        }
    } else {
        for (std::size_t k = 0; k < buf.scores.size(); ++k) {
            auto& it = items[buf.scored[k]];
            try {
                run_verifier(verifier, buf.scores[k].context, buf.scores[k].draft, *it.ws, vocab);
            } catch (...) {
                it.error = std::current_exception();
            }
        }
    }
    if (timed) timing->pass_seconds = seconds_since(t0);

    // Modified rejection sampling per sequence, with its own generator, on the executor. The
    // job captures one pointer, so std::function stores it without allocating.
    struct context_t {
        std::span<multi_item<G>> items;
        multi_buffers& buf;
        V& verifier;
        const sampling_config& sampling;
        float lenience;
        verification_scheme scheme;
        std::ptrdiff_t vocab;
        const char* where;
    } ctx{items, buf, verifier, sampling, lenience, scheme, vocab, where};
    const std::function<void(std::size_t)> job = [c = &ctx](std::size_t k) {
        auto& it = c->items[c->buf.scored[k]];
        if (it.error) return;  // a per-sequence scoring call failed
        try {
            const std::size_t n = it.ws->draft.tokens.size();
            std::size_t calls = 1;
            if constexpr (!packed) calls = score_calls(c->verifier, n);
            if constexpr (packed) {
                it.result = finish_step(c->buf.logits.sequence(k), *it.tokens, *it.stats, calls, c->sampling,
                                        c->lenience, c->scheme, *it.rng, *it.ws, c->vocab, c->where, it.extras);
            } else {
                it.result = finish_step(it.ws->target_logits, *it.tokens, *it.stats, calls, c->sampling, c->lenience,
                                        c->scheme, *it.rng, *it.ws, c->vocab, c->where, it.extras);
            }
            it.stepped = true;
        } catch (...) {
            it.error = std::current_exception();
        }
    };
    executor.parallel_for(buf.scored.size(), job);
}

/// The exception of the lowest-numbered item that failed, if any.
template <class G>
void rethrow_first(std::span<multi_item<G>> items) {
    for (const auto& it : items)
        if (it.error) std::rethrow_exception(it.error);
}

}  // namespace detail

/// One speculative step on each of B sequences with one target pass for all of them: the
/// drafts of all sequences (one draft_batch call when the drafter is a MultiSequenceDrafter,
/// else the one drafter is called once per sequence, on the calling thread), one score_batch
/// call of the MultiSequenceVerifier over every sequence's context and ragged draft, then
/// verification per sequence on `executor`, sequence i with sequences[i].rng and slot i of the
/// models. Each sequence gets exactly what speculative_step with its own generator gives (for
/// a drafter whose blocks do not depend on the batch, as MultiSequenceDrafter requires).
///
/// \returns nothing; each sequence's tokens and stats are updated as speculative_step does
///          (stats.target_calls counts the shared pass once per sequence).
/// \throws std::invalid_argument for invalid options, a vocabulary mismatch or a sequence
///         token out of range (before anything changes); the exception of draft_batch or
///         score_batch (no sequence changed); else the exception of the lowest-numbered
///         sequence whose step threw, after the others stepped (that sequence is unchanged).
///         The drafter, verifier and `ws` stay usable. See BatchExecutor for an executor's
///         own exceptions.
///
/// \code
/// llama2::batch_transformer target(weights);             // a MultiSequenceVerifier
/// std::vector<specdec::batch_sequence<std::mt19937_64>> seqs = ...;
/// specdec::batch_workspace ws;
/// specdec::speculative_step_batch(drafter, target, std::span(seqs), {.gamma = 3}, ws);
/// \endcode
template <class D, MultiSequenceVerifier V, random_generator G, BatchExecutor E>
    requires(MultiSequenceDrafter<D> || Drafter<D>)
void speculative_step_batch(D& drafter, V& verifier, std::span<batch_sequence<G>> sequences, const step_options& opts,
                            batch_workspace& ws, E& executor) {
    constexpr const char* where = "specdec::speculative_step_batch";
    detail::check_step_options(opts.gamma, opts.sampling, opts.lenience, opts.scheme, where);
    if (opts.draft_sampling)
        detail::fail_invalid(where, ": draft_sampling is not supported by the multi-sequence step yet; leave it unset"
                                    " (the draft then samples with `sampling`)");
    const auto vd = static_cast<std::ptrdiff_t>(drafter.vocab_size());
    const auto vocab = static_cast<std::ptrdiff_t>(verifier.vocab_size());
    if (vd != vocab)
        detail::fail_invalid(where, ": draft vocab_size() = ", vd, " differs from target vocab_size() = ", vocab,
                             "; both models must share one vocabulary");
    if (vocab <= 0) detail::fail_invalid(where, ": vocab_size() = ", vocab, " must be positive");
    for (std::size_t i = 0; i < sequences.size(); ++i) {
        if (sequences[i].tokens.empty())
            detail::fail_invalid(where, ": sequence ", i, " has no tokens; each needs a context of at least one token");
        detail::check_token_range(sequences[i].tokens, vocab, where, "sequence tokens");
    }
    auto& items = ws.scratch<std::vector<detail::multi_item<G>>>();
    items.resize(sequences.size());
    for (std::size_t i = 0; i < sequences.size(); ++i) {
        auto& s = sequences[i];
        items[i] = detail::multi_item<G>{.slot = i, .tokens = &s.tokens, .stats = &s.stats, .rng = &s.rng,
                                         .ws = &ws.sequence(i), .gamma = opts.gamma};
    }
    const std::span<detail::multi_item<G>> all(items);
    detail::multi_step(drafter, verifier, all, opts.sampling, opts.lenience, opts.scheme, vocab, ws.multi(), executor,
                       where);
    detail::rethrow_first(all);
}

/// The same on the workspace's own threads.
template <class D, MultiSequenceVerifier V, random_generator G>
    requires(MultiSequenceDrafter<D> || Drafter<D>)
void speculative_step_batch(D& drafter, V& verifier, std::span<batch_sequence<G>> sequences, const step_options& opts,
                            batch_workspace& ws) {
    speculative_step_batch(drafter, verifier, sequences, opts, ws, ws);
}

/// The same with the sequences in a vector.
template <class D, MultiSequenceVerifier V, random_generator G>
    requires(MultiSequenceDrafter<D> || Drafter<D>)
void speculative_step_batch(D& drafter, V& verifier, std::vector<batch_sequence<G>>& sequences,
                            const step_options& opts, batch_workspace& ws) {
    speculative_step_batch(drafter, verifier, std::span<batch_sequence<G>>(sequences), opts, ws, ws);
}

}  // namespace specdec
