#pragma once
/// \file
/// One speculative step over B independent sequences, optionally spread over threads.
///
/// Each sequence has its own drafter, verifier (they may share weights; a model with a KV
/// cache needs one per sequence), token buffer, statistics and generator stream, and
/// acceptance is ragged: each sequence accepts its own number of tokens. Because nothing
/// random or stateful is shared, a batch step gives every sequence exactly what B separate
/// speculative_step calls with the same generators would, whatever the thread count.

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
#include "error.hpp"
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

}  // namespace detail

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

private:
    std::vector<std::unique_ptr<step_workspace>> steps_;
    std::unique_ptr<detail::worker_pool> pool_;
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
template <Drafter D, Verifier V, random_generator G>
void speculative_step_batch(std::span<D> drafters, std::span<V> verifiers, std::span<batch_sequence<G>> sequences,
                            const step_options& opts, batch_workspace& ws) {
    constexpr const char* where = "specdec::speculative_step_batch";
    if (drafters.size() != sequences.size() || verifiers.size() != sequences.size())
        detail::fail_invalid(where, ": ", drafters.size(), " drafters, ", verifiers.size(), " verifiers and ",
                             sequences.size(), " sequences; one of each per sequence is needed");
    detail::check_step_options(opts.gamma, opts.sampling, opts.lenience, opts.scheme, where);
    for (std::size_t i = 0; i < sequences.size(); ++i) (void)ws.sequence(i);  // workspaces exist before threads run
    ws.parallel_for(sequences.size(), [&](std::size_t i) {
        auto& s = sequences[i];
        const std::ptrdiff_t vocab = detail::checked_vocab(drafters[i], verifiers[i], where);
        detail::check_token_range(s.tokens, vocab, where, "sequence tokens");
        detail::step_impl(drafters[i], verifiers[i], s.tokens, s.stats, opts.gamma, opts.sampling, opts.lenience,
                          opts.scheme, s.rng, ws.sequence(i), vocab, where);
    });
}

/// The same with the drafters, verifiers and sequences in vectors (the usual case), so that
/// no std::span needs to be spelled out.
template <Drafter D, Verifier V, random_generator G>
void speculative_step_batch(std::vector<D>& drafters, std::vector<V>& verifiers,
                            std::vector<batch_sequence<G>>& sequences, const step_options& opts, batch_workspace& ws) {
    speculative_step_batch(std::span<D>(drafters), std::span<V>(verifiers), std::span<batch_sequence<G>>(sequences),
                           opts, ws);
}

}  // namespace specdec
