#pragma once
/// \file
/// The threads and buffers of the batch loop (batch_decoder, batch_decoder.hpp): the
/// BatchExecutor concept that runs the per-sequence work of a step, the built-in fork-join pool
/// (batch_workspace), the per-sequence step workspaces and the buffers of the packed target pass;
/// and, internal, detail::speculative_step_batch: one step over B sequences with per-sequence
/// models (spans of drafters and verifiers), each with its own token buffer, statistics and
/// generator, so that a batch step gives every sequence exactly what B separate
/// speculative_step calls with the same generators would, whatever the thread count.

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
    std::vector<tree_score_request> tree_scores;  // the requests of a multi-sequence tree pass
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
    /// How many threads run a step (the constructor's `threads`; 1: the calling thread alone).
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

namespace detail {

/// (Internal; the public batch loop is batch_decoder.) One speculative step (Leviathan et al. 2023, Alg. 1) on each of B sequences: sequence i
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
    constexpr const char* where = "specdec::speculative_step_batch";
    if (drafters.size() != sequences.size() || verifiers.size() != sequences.size())
        fail_invalid(where, ": ", drafters.size(), " drafters, ", verifiers.size(), " verifiers and ",
                             sequences.size(), " sequences; one of each per sequence is needed");
    check_step_options(opts.gamma, opts.sampling, opts.lenience, opts.scheme, where);
    check_draft_sampling(opts.draft_sampling, where);
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
                fail_invalid(step_name, ": sequence ", i, " has no tokens; each needs a context of at least one token");
            const std::ptrdiff_t vocab = checked_vocab(c->drafters[i], c->verifiers[i], step_name);
            check_token_range(s.tokens, vocab, step_name, "sequence tokens");
            step_extras extras{.draft_sampling = c->opts.draft_sampling ? &*c->opts.draft_sampling : nullptr};
            step_impl(c->drafters[i], c->verifiers[i], s.tokens, s.stats, c->opts.gamma, c->opts.sampling,
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

/// The same with the drafters, verifiers and sequences in vectors (the usual case), so that
/// no std::span needs to be spelled out.
template <class D, class V, class G>
void speculative_step_batch(std::vector<D>& drafters, std::vector<V>& verifiers,
                            std::vector<batch_sequence<G>>& sequences, const step_options& opts, batch_workspace& ws) {
    speculative_step_batch(std::span<D>(drafters), std::span<V>(verifiers), std::span<batch_sequence<G>>(sequences),
                           opts, ws);
}


}  // namespace detail

}  // namespace specdec
