// Fault injection: adapters that throw at their k-th call, for every k of a whole generation,
// and allocations that fail one at a time inside the llama2 engine. What is checked:
//
//  - speculative_decode, chains and token trees (a fault in propose_tree, score_tree, a block
//    drafter's draft, or any model call under them; with the draft's own sampling, the
//    draft-side stop and the adaptive depth): the adapter's own exception type comes out;
//    afterwards the same adapter objects, given a fresh generator of the same seed, decode
//    exactly the tokens and statistics of an undisturbed run (the result of the failed call is
//    lost: basic guarantee; the drafter, the verifier and the generator stay usable).
//  - speculative_step: `sequence` and `stats` are exactly as they were (strong guarantee), and
//    the workspace and adapters go on to give what a fresh workspace gives; the same for a
//    std::bad_alloc at any allocation of the step's vectors, with acceptance estimated or not.
//  - detail::speculative_step_batch: the lowest-numbered failing sequence's exception comes out,
//    that sequence is unchanged and every other one has taken its step (strong per sequence,
//    basic for the batch), on one thread as on two.
//  - batch_decoder with token trees (shared adapters; a fault in one sequence's propose_tree,
//    score_tree or model call): the lowest-id failing sequence's exception comes out; that
//    sequence is unchanged (tokens and statistics) and still active; every other sequence has
//    taken its step exactly as it would alone; the decoder stays usable (the failed sequence
//    steps on, every sequence reaches its budget, the others with their undisturbed output).
//    With chains of many sequences: a fault in draft_batch or score_batch changes no sequence
//    and no estimate of a caller's controller, and the decoder goes on.
//  - measure_engine_profile and measure_batch_profile: the adapter's exception comes out, and
//    the same adapters then measure a valid profile.
//  - step_recorder (traces): after a fault the trace holds exactly the completed steps.
//  - llama2::transformer: its own errors (context beyond seq_len, a token outside the
//    vocabulary, an empty context) and a std::bad_alloc at any allocation of a call leave its
//    cache (and score_into's output matrix) unchanged (strong guarantee), and faults of an
//    adapter around it leave it computing bit for bit what a fresh engine computes.
//
// Running the tests under AddressSanitizer shows that no fault leaks or corrupts memory. The
// checks can fail: the "negative controls" case feeds them operations that are not strong, and
// an adapter that keeps damage after its fault, and requires them to notice.
//
// This file replaces the global allocation functions (to fail the k-th allocation on demand), so
// it is its own test executable. Eigen allocates with malloc, which operator new does not see:
// with EIGEN_RUNTIME_NO_MALLOC, Eigen checks every allocation against a flag through
// eigen_assert, which this file routes to the same counter. (Both before any Eigen header.)
#define EIGEN_RUNTIME_NO_MALLOC
#define eigen_assert(x) specdec_fault_eigen_assert(static_cast<bool>(x), #x)
void specdec_fault_eigen_assert(bool ok, const char* condition);

// GCC sees malloc/free behind replaced new/delete and warns; that pairing is the point here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_cached.hpp"
#include "support/multi_markov.hpp"

#include <specdec/specdec.hpp>

#include "llama2/checkpoint.hpp"
#include "llama2/transformer.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

// ---- Allocation faults: the k-th allocation after arming throws std::bad_alloc. ----

namespace {
std::atomic<bool> g_alloc_armed{false};
std::size_t g_alloc_fail_at = 0;  // only read and written while armed, on the arming thread
std::size_t g_alloc_seen = 0;

/// Counts one allocation while armed; throws std::bad_alloc at the armed one.
void count_allocation() {
    if (!g_alloc_armed.load(std::memory_order_relaxed)) return;
    if (++g_alloc_seen == g_alloc_fail_at) throw std::bad_alloc();
}

void* fault_new(std::size_t size, std::size_t align) {
    count_allocation();
    void* p = nullptr;
    if (align <= alignof(std::max_align_t)) {
        p = std::malloc(size == 0 ? 1 : size);
    } else {
        const std::size_t bytes = (std::max<std::size_t>(size, 1) + align - 1) / align * align;
        p = std::aligned_alloc(align, bytes);
    }
    if (p == nullptr) throw std::bad_alloc();
    return p;
}
}  // namespace

void* operator new(std::size_t size) { return fault_new(size, alignof(std::max_align_t)); }
void* operator new[](std::size_t size) { return fault_new(size, alignof(std::max_align_t)); }
void* operator new(std::size_t size, std::align_val_t a) { return fault_new(size, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t size, std::align_val_t a) { return fault_new(size, static_cast<std::size_t>(a)); }
// The nothrow forms too: a sanitizer's runtime defines its own, which would not pair with these.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    try {
        return fault_new(size, alignof(std::max_align_t));
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t size, const std::nothrow_t& t) noexcept { return ::operator new(size, t); }
void* operator new(std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
    try {
        return fault_new(size, static_cast<std::size_t>(a));
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t size, std::align_val_t a, const std::nothrow_t& t) noexcept {
    return ::operator new(size, a, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

void specdec_fault_eigen_assert(bool ok, const char* condition) {
    if (ok) return;
    // While armed, Eigen's heap allocations are "forbidden": each one lands here first.
    if (std::strstr(condition, "heap allocation is forbidden") != nullptr) {
        count_allocation();
        return;
    }
    std::fprintf(stderr, "Eigen assertion failed: %s\n", condition);
    std::abort();
}

namespace {

using specdec::token_id;
using specdec_test::batched_markov;
using specdec_test::markov_model;
using specdec_test::shift_drafter;
using tokens = std::vector<token_id>;

/// Which allocations an armed allocation_faults counts.
enum class allocations { all, operator_new_only };

/// Arms allocation faults for its lifetime: the k-th allocation (operator new, and Eigen's
/// unless told otherwise) throws.
class allocation_faults {
public:
    allocation_faults(std::size_t k, allocations which) {
        g_alloc_fail_at = k;
        g_alloc_seen = 0;
        if (which == allocations::all) Eigen::internal::set_is_malloc_allowed(false);
        g_alloc_armed.store(true, std::memory_order_relaxed);
    }
    allocation_faults(const allocation_faults&) = delete;
    allocation_faults& operator=(const allocation_faults&) = delete;
    ~allocation_faults() {
        g_alloc_armed.store(false, std::memory_order_relaxed);
        Eigen::internal::set_is_malloc_allowed(true);
    }
};

/// Runs op() with the k-th allocation failing. True when op threw std::bad_alloc; false when it
/// completed (it made fewer than k allocations).
template <class Op>
bool fails_at_allocation(std::size_t k, Op&& op, allocations which = allocations::all) {
    allocation_faults armed(k, which);
    try {
        op();
    } catch (const std::bad_alloc&) {
        return true;
    }
    return false;
}

// ---- Adapter faults. ----

/// The exception of an injected fault: its own type, naming where it came from.
struct injected_fault : std::exception {
    injected_fault(std::size_t from, std::size_t at) : source(from), call(at) {}
    const char* what() const noexcept override { return "injected fault"; }
    std::size_t source;  ///< fault_plan::source of the adapter that threw
    std::size_t call;    ///< its call number (1-based)
};

/// Counts the calls of every method of the adapters that share it (vocab_size included) and
/// makes the armed one throw injected_fault, before or after delegating to the wrapped object.
struct fault_plan {
    static constexpr std::size_t never = std::numeric_limits<std::size_t>::max();
    std::size_t source = 0;
    std::size_t throw_at = never;
    std::size_t calls = 0;
    bool after = false;

    void arm(std::size_t k, bool throw_after) {
        throw_at = k;
        after = throw_after;
        calls = 0;
    }
    void disarm() {
        throw_at = never;
        calls = 0;
    }
    /// One call of an adapter method: `inner` delegates.
    template <class F>
    auto call(F&& inner) -> decltype(inner()) {
        const std::size_t k = ++calls;
        const bool fire = k == throw_at;
        if (fire && !after) throw injected_fault(source, k);
        if constexpr (std::is_void_v<decltype(inner())>) {
            inner();
            if (fire) throw injected_fault(source, k);
        } else {
            auto r = inner();
            if (fire) throw injected_fault(source, k);
            return r;
        }
    }
};

/// A LanguageModel that forwards to *inner through `plan`.
template <class Inner>
struct faulty_model {
    Inner* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const {
        return plan->call([&] { return static_cast<std::ptrdiff_t>(inner->vocab_size()); });
    }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        return plan->call([&] { return Eigen::VectorXf(inner->next_logits(context)); });
    }
};

/// A BatchVerifier that forwards to *inner through `plan`; in place (score_into) when Inner is.
template <class Inner>
struct faulty_verifier {
    Inner* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const {
        return plan->call([&] { return static_cast<std::ptrdiff_t>(inner->vocab_size()); });
    }
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        return plan->call([&] { return Eigen::MatrixXf(inner->score(context, draft)); });
    }
    void score_into(std::span<const token_id> context, std::span<const token_id> draft, Eigen::MatrixXf& out)
        requires specdec::InPlaceBatchVerifier<Inner>
    {
        plan->call([&] { inner->score_into(context, draft, out); });
    }
};

/// A BlockDrafter that forwards to *inner through `plan` (after delegating, the block is filled).
template <class Inner>
struct faulty_drafter {
    Inner* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const {
        return plan->call([&] { return static_cast<std::ptrdiff_t>(inner->vocab_size()); });
    }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& sampling,
               specdec::uniform_source& uniforms, specdec::draft_block& out) {
        plan->call([&] { inner->draft(context, gamma, sampling, uniforms, out); });
    }
};

/// A TreeDrafter that forwards to *inner through `plan` (after delegating, the tree is filled).
template <class Inner>
struct faulty_tree_drafter {
    Inner* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const {
        return plan->call([&] { return static_cast<std::ptrdiff_t>(inner->vocab_size()); });
    }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& sampling, specdec::uniform_source& uniforms,
                      specdec::draft_tree& out) {
        plan->call([&] { inner->propose_tree(context, shape, sampling, uniforms, out); });
    }
};

/// A TreeVerifier that forwards to *inner through `plan` (after delegating, the scores are written).
template <class Inner>
struct faulty_tree_verifier {
    Inner* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const {
        return plan->call([&] { return static_cast<std::ptrdiff_t>(inner->vocab_size()); });
    }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        plan->call([&] { inner->score_tree(context, tree, out); });
    }
};

/// A TreeDrafter over a plain model: draft_tree_from_model (one next_logits call per node that
/// gets children), so faults of the model land in the middle of a tree.
template <class M>
struct model_tree_drafter {
    M* model;
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(model->vocab_size()); }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& sampling, specdec::uniform_source& uniforms,
                      specdec::draft_tree& out) {
        specdec::draft_tree_from_model(*model, context, shape, sampling, uniforms, out, path, logits, q, scratch, sws);
    }
};

/// A TreeVerifier over a plain model: one next_logits call per column (the root, then each
/// node), written into `out` as they come (a fault leaves it part written).
template <class M>
struct model_tree_verifier {
    M* model;
    std::vector<token_id> path{};
    std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(model->vocab_size()); }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        out.resize(static_cast<Eigen::Index>(model->vocab_size()), static_cast<Eigen::Index>(tree.size() + 1));
        for (std::size_t c = 0; c <= tree.size(); ++c) {
            specdec::path_tokens(tree, static_cast<std::int32_t>(c) - 1, path);
            path.insert(path.begin(), context.begin(), context.end());
            out.col(static_cast<Eigen::Index>(c)) = model->next_logits(path);
        }
    }
};

static_assert(specdec::LanguageModel<faulty_model<markov_model>>);
static_assert(specdec::BlockDrafter<faulty_drafter<shift_drafter>>);
static_assert(specdec::BatchVerifier<faulty_verifier<batched_markov>> &&
              !specdec::InPlaceBatchVerifier<faulty_verifier<batched_markov>>);
static_assert(specdec::InPlaceBatchVerifier<faulty_verifier<specdec::model_verifier<faulty_model<markov_model>>>>);
static_assert(specdec::InPlaceBatchVerifier<faulty_verifier<llama2::transformer>>);
static_assert(specdec::TreeDrafter<faulty_tree_drafter<model_tree_drafter<faulty_model<markov_model>>>> &&
              !specdec::Drafter<faulty_tree_drafter<model_tree_drafter<faulty_model<markov_model>>>>);
static_assert(specdec::TreeVerifier<faulty_tree_verifier<model_tree_verifier<faulty_model<markov_model>>>> &&
              !specdec::Verifier<faulty_tree_verifier<model_tree_verifier<faulty_model<markov_model>>>>);

bool same_stats(const specdec::decode_stats& a, const specdec::decode_stats& b) {
    return a.steps == b.steps && a.target_calls == b.target_calls && a.draft_calls == b.draft_calls &&
           a.drafted_tokens == b.drafted_tokens && a.accepted_tokens == b.accepted_tokens &&
           a.rejected_tokens == b.rejected_tokens && a.accepted_at_position == b.accepted_at_position &&
           a.reached_at_position == b.reached_at_position &&
           a.expected_accepted_at_position == b.expected_accepted_at_position && a.steps_at_gamma == b.steps_at_gamma;
}

/// Bit for bit (not merely ==, which equates 0 and -0).
bool bit_identical(const Eigen::MatrixXf& a, const Eigen::MatrixXf& b) {
    return a.rows() == b.rows() && a.cols() == b.cols() &&
           (a.size() == 0 ||
            std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0);
}

/// What happened to (sequence, stats) in an operation that may throw an injected fault.
enum class outcome { completed, fault_left_unchanged, fault_changed_state };

/// Runs op() on `sequence` and `stats`; on an injected fault, says whether both are exactly as
/// they were (the strong guarantee).
template <class Op>
outcome run_checked(std::vector<token_id>& sequence, specdec::decode_stats& stats, Op&& op) {
    const std::vector<token_id> sequence_before = sequence;
    const specdec::decode_stats stats_before = stats;
    try {
        op();
    } catch (const injected_fault&) {
        return sequence == sequence_before && same_stats(stats, stats_before) ? outcome::fault_left_unchanged
                                                                              : outcome::fault_changed_state;
    }
    return outcome::completed;
}

/// speculative_decode with a fault at every call k of a whole generation (before and after the
/// adapter delegates): the fault's own exception comes out, and then the same objects, with the
/// fault disarmed and the same seed, decode exactly what an undisturbed run decodes.
template <class D, class V>
void check_decode_under_faults(D& drafter, V& verifier, fault_plan& plan, std::span<const token_id> prompt,
                               const specdec::decode_options& options, std::uint64_t seed) {
    plan.disarm();
    std::mt19937_64 rng(seed);
    const specdec::decode_result reference = specdec::speculative_decode(drafter, verifier, prompt, options, rng);
    const std::size_t total = plan.calls;
    REQUIRE(total > 2);
    for (const bool after : {false, true}) {
        for (std::size_t k = 1; k <= total; ++k) {
            INFO("fault at call " << k << " of " << total << (after ? " (after delegating)" : " (before delegating)"));
            plan.arm(k, after);
            std::mt19937_64 g(seed);
            std::size_t caught_at = 0;
            try {
                (void)specdec::speculative_decode(drafter, verifier, prompt, options, g);
            } catch (const injected_fault& e) {  // any other type would escape and fail the test
                caught_at = e.call;
            }
            CHECK(caught_at == k);
            plan.disarm();
            std::mt19937_64 again(seed);
            const specdec::decode_result r = specdec::speculative_decode(drafter, verifier, prompt, options, again);
            CHECK(r.tokens == reference.tokens);
            CHECK(same_stats(r.stats, reference.stats));
            CHECK(r.stop == reference.stop);
            CHECK(plan.calls == total);
        }
    }
}

/// speculative_step over a whole generation with a fault at every call k: the failing step
/// leaves sequence and stats exactly as they were, and continuing with the same workspace and
/// adapters gives what a fresh workspace gives from the same state. Returns how many faults
/// left the caller's generator advanced.
template <class D, class V>
std::size_t check_steps_under_faults(D& drafter, V& verifier, fault_plan& plan, const specdec::step_options& opts,
                              std::uint64_t seed) {
    const tokens prompt{2, 7};
    constexpr std::size_t length = 26;
    specdec::step_workspace ws;  // one workspace through every fault
    plan.disarm();
    {
        tokens seq = prompt;
        specdec::decode_stats stats;
        std::mt19937_64 rng(seed);
        while (seq.size() < length) specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
    }
    const std::size_t total = plan.calls;
    REQUIRE(total > 2);
    std::size_t rng_moved = 0;
    for (const bool after : {false, true}) {
        for (std::size_t k = 1; k <= total; ++k) {
            INFO("fault at call " << k << " of " << total << (after ? " (after delegating)" : " (before delegating)"));
            plan.arm(k, after);
            tokens seq = prompt;
            specdec::decode_stats stats;
            std::mt19937_64 rng(seed);
            std::size_t faults = 0;
            while (seq.size() < length) {
                const std::mt19937_64 rng_before = rng;
                const outcome o = run_checked(
                    seq, stats, [&] { specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws); });
                if (o == outcome::completed) continue;
                ++faults;
                CHECK(o == outcome::fault_left_unchanged);
                if (rng != rng_before) ++rng_moved;
                plan.disarm();
                // The workspace and the adapters are usable: the next step is the one a fresh
                // workspace makes from the same sequence, statistics and generator.
                tokens seq2 = seq;
                specdec::decode_stats stats2 = stats;
                std::mt19937_64 rng2 = rng;
                specdec::step_workspace fresh;
                specdec::speculative_step(drafter, verifier, seq2, stats2, opts, rng2, fresh);
                specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
                CHECK(seq == seq2);
                CHECK(same_stats(stats, stats2));
                CHECK(rng == rng2);
            }
            CHECK(faults == 1);
        }
    }
    return rng_moved;
}

}  // namespace

TEST_CASE("Fault harness negative controls: operations that are not strong, and damage kept after a fault, are caught",
          "[faults][negative]") {
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    fault_plan plan;
    faulty_model<markov_model> d{&draft, &plan}, t{&target, &plan};
    const specdec::step_options opts{.gamma = 3, .sampling = {.temperature = 0.9f}};
    specdec::step_workspace ws;
    std::mt19937_64 rng(3);
    tokens seq{1, 2};
    specdec::decode_stats stats;

    // A change before the throw is seen, in the sequence or in the statistics.
    CHECK(run_checked(seq, stats, [&] {
              seq.push_back(0);
              throw injected_fault(0, 1);
          }) == outcome::fault_changed_state);
    seq = {1, 2};
    CHECK(run_checked(seq, stats, [&] {
              ++stats.steps;
              throw injected_fault(0, 1);
          }) == outcome::fault_changed_state);
    stats = {};
    // Two steps are not one: a fault in the second leaves the first's tokens in place.
    plan.disarm();
    {
        tokens s = seq;
        specdec::decode_stats st;
        std::mt19937_64 g = rng;
        specdec::speculative_step(d, t, s, st, opts, g, ws);
    }
    const std::size_t first_step_calls = plan.calls;
    plan.arm(first_step_calls + 1, false);
    CHECK(run_checked(seq, stats, [&] {
              specdec::speculative_step(d, t, seq, stats, opts, rng, ws);
              specdec::speculative_step(d, t, seq, stats, opts, rng, ws);
          }) == outcome::fault_changed_state);
    // One step is: the same fault inside a single step leaves everything unchanged.
    seq = {1, 2};
    stats = {};
    plan.arm(5, false);
    CHECK(run_checked(seq, stats, [&] { specdec::speculative_step(d, t, seq, stats, opts, rng, ws); }) ==
          outcome::fault_left_unchanged);

    // An adapter that keeps damage after its fault (a logit bias from then on) makes the rerun
    // differ from the undisturbed run: the decode check would catch such hidden state.
    struct scarred_model {
        markov_model* inner;
        fault_plan* plan;
        float bias = 0.0f;
        std::ptrdiff_t vocab_size() const { return inner->vocab; }
        Eigen::VectorXf next_logits(std::span<const token_id> context) {
            try {
                plan->call([] { return 0; });
            } catch (const injected_fault&) {
                bias = 8.0f;
                throw;
            }
            Eigen::VectorXf z = inner->next_logits(context);
            z[0] += bias;
            return z;
        }
    };
    scarred_model scarred{&target, &plan};
    const tokens prompt{1, 2, 3};
    const specdec::decode_options o{.step = specdec::chain{.gamma = 3}, .sampling = {.temperature = 0.9f},
                                    .budget = {.max_new_tokens = 24}};
    plan.disarm();
    std::mt19937_64 g1(9);
    const auto reference = specdec::speculative_decode(draft, scarred, prompt, o, g1);
    plan.arm(2, false);
    std::mt19937_64 g2(9);
    CHECK_THROWS_AS(specdec::speculative_decode(draft, scarred, prompt, o, g2), injected_fault);
    plan.disarm();
    std::mt19937_64 g3(9);
    CHECK(specdec::speculative_decode(draft, scarred, prompt, o, g3).tokens != reference.tokens);
}

TEST_CASE("speculative_decode: a fault at any call comes out with its own type, and the same objects then decode as if "
          "it never happened",
          "[faults][decode]") {
    constexpr int vocab = 12;
    auto target = markov_model::random(vocab, 2, 11);
    auto draft = markov_model::random(vocab, 2, 12);
    const tokens prompt{3, 1, 4};
    fault_plan plan;
    // Plain language models on both sides (drafted and scored through next_logits).
    faulty_model<markov_model> plain_draft{&draft, &plan}, plain_target{&target, &plan};
    // The library's block adapters over faulty models: faults inside model_drafter and
    // model_verifier (mid-block) and at their boundary (after delegating: a filled block, a
    // written score matrix).
    faulty_model<markov_model> inner_draft{&draft, &plan}, inner_target{&target, &plan};
    specdec::model_drafter<faulty_model<markov_model>> md(inner_draft);
    specdec::model_verifier<faulty_model<markov_model>> mv(inner_target);
    faulty_drafter<specdec::model_drafter<faulty_model<markov_model>>> block_draft{&md, &plan};
    faulty_verifier<specdec::model_verifier<faulty_model<markov_model>>> block_target{&mv, &plan};
    // Point-mass drafts against a batched target without score_into.
    shift_drafter shift{vocab, 5};
    batched_markov batched{&target};
    faulty_drafter<shift_drafter> point_draft{&shift, &plan};
    faulty_verifier<batched_markov> point_target{&batched, &plan};
    // Hierarchical drafting: faults in the inner drafter and in the draft model its inner loop
    // runs (mid inner step, between inner steps).
    auto tiny = markov_model::random(vocab, 1, 13);
    faulty_model<markov_model> inner_tiny{&tiny, &plan}, layered_model{&draft, &plan};
    specdec::hierarchical_drafter layered(inner_tiny, layered_model, {.gamma = 2});

    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        for (const auto policy : {specdec::gamma_policy::fixed, specdec::gamma_policy::adaptive}) {
            INFO("scheme " << (scheme == specdec::verification_scheme::token ? "token" : "block") << ", policy "
                           << (policy == specdec::gamma_policy::fixed ? "fixed" : "adaptive"));
            specdec::decode_options o{.step = specdec::chain{.gamma = 3, .scheme = scheme},
                                      .length = {.policy = policy},
                                      .sampling = {.temperature = 0.9f},
                                      .budget = {.max_new_tokens = 20}};
            o.length.adaptive.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); };
            o.length.adaptive.pass_cost = [](std::size_t) { return 1.0; };
            {
                INFO("plain models");
                check_decode_under_faults(plain_draft, plain_target, plan, prompt, o, 7);
            }
            {
                INFO("model_drafter / model_verifier");
                check_decode_under_faults(block_draft, block_target, plan, prompt, o, 8);
            }
            {
                INFO("point-mass drafter / batched verifier");
                check_decode_under_faults(point_draft, point_target, plan, prompt, o, 9);
            }
            {
                INFO("hierarchical drafter / plain target");
                check_decode_under_faults(layered, plain_target, plan, prompt, o, 11);
            }
        }
    }
    // The callback is a fault site too (a throw after its step was committed), with stop tokens.
    specdec::decode_options o{.step = specdec::chain{.gamma = 2}, .sampling = {.temperature = 1.0f},
                              .budget = {.max_new_tokens = 30, .stop_tokens = {6}}};
    o.on_step = [&plan](const specdec::step_event&) { (void)plan.call([] { return 0; }); };
    check_decode_under_faults(block_draft, block_target, plan, prompt, o, 10);
}

TEST_CASE("speculative_decode with token trees: a fault in propose_tree, score_tree or any model call under them "
          "comes out with its own type, and the same objects then decode as if it never happened",
          "[faults][decode][tree]") {
    constexpr int vocab = 12;
    auto target = markov_model::random(vocab, 2, 13);
    auto draft = markov_model::random(vocab, 2, 14);
    const tokens prompt{3, 1, 4};
    fault_plan plan;
    // Plain models on both sides: the tree drafted node by node (next_logits), the target scored
    // node by node.
    faulty_model<markov_model> plain_draft{&draft, &plan}, plain_target{&target, &plan};
    // A TreeDrafter and a TreeVerifier over faulty models: faults at their boundary (before and
    // after a filled tree or score matrix) and in the middle of a tree.
    faulty_model<markov_model> inner_draft{&draft, &plan}, inner_target{&target, &plan};
    model_tree_drafter<faulty_model<markov_model>> mtd{&inner_draft};
    model_tree_verifier<faulty_model<markov_model>> mtv{&inner_target};
    faulty_tree_drafter<model_tree_drafter<faulty_model<markov_model>>> tree_draft{&mtd, &plan};
    faulty_tree_verifier<model_tree_verifier<faulty_model<markov_model>>> tree_target{&mtv, &plan};
    // A block drafter (its block becomes a chain as deep as the tree) against the TreeVerifier.
    specdec::model_drafter<faulty_model<markov_model>> md(inner_draft);
    faulty_drafter<specdec::model_drafter<faulty_model<markov_model>>> block_draft{&md, &plan};

    for (const auto scheme :
         {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection}) {
        for (const auto policy : {specdec::gamma_policy::fixed, specdec::gamma_policy::adaptive}) {
            INFO("scheme " << (scheme == specdec::tree_verification_scheme::traversal ? "traversal" : "recursive")
                           << ", policy " << (policy == specdec::gamma_policy::fixed ? "fixed" : "adaptive"));
            // The draft's own sampling and the draft-side stop too: every part of a tree step.
            specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {2, 2, 1}}, .scheme = scheme},
                                      .length = {.policy = policy},
                                      .sampling = {.temperature = 0.9f},
                                      .draft = {.sampling = specdec::sampling_config{.temperature = 1.2f, .top_k = 6},
                                                .stop_below = 0.1f},
                                      .budget = {.max_new_tokens = 18}};
            o.length.adaptive.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); };
            o.length.adaptive.pass_cost = [](std::size_t) { return 1.0; };
            {
                INFO("plain models");
                check_decode_under_faults(plain_draft, plain_target, plan, prompt, o, 17);
            }
            {
                INFO("TreeDrafter / TreeVerifier");
                check_decode_under_faults(tree_draft, tree_target, plan, prompt, o, 18);
            }
            {
                INFO("block drafter / TreeVerifier");
                check_decode_under_faults(block_draft, tree_target, plan, prompt, o, 19);
            }
        }
    }
    // A tree from a children list (drafted node by node from it), fixed and planned (the tree
    // planner's best trees among the plans).
    for (const auto policy : {specdec::gamma_policy::fixed, specdec::gamma_policy::adaptive}) {
        INFO("a shape from children, policy " << (policy == specdec::gamma_policy::fixed ? "fixed" : "adaptive"));
        specdec::decode_options o{.step = specdec::tree{.shape = specdec::tree_shape::from_children({2, 2, 1, 0, 1})},
                                  .length = {.policy = policy},
                                  .sampling = {.temperature = 0.9f},
                                  .budget = {.max_new_tokens = 18}};
        o.length.adaptive.draft_cost = [](std::size_t n) { return 0.01 * static_cast<double>(n); };
        o.length.adaptive.pass_cost = [](std::size_t) { return 1.0; };
        check_decode_under_faults(plain_draft, plain_target, plan, prompt, o, 21);
        check_decode_under_faults(tree_draft, tree_target, plan, prompt, o, 22);
    }
    // The callback of a tree step is a fault site too, with stop tokens.
    specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {3, 1}}},
                              .sampling = {.temperature = 1.0f},
                              .budget = {.max_new_tokens = 30, .stop_tokens = {6}}};
    o.on_step = [&plan](const specdec::step_event&) { (void)plan.call([] { return 0; }); };
    check_decode_under_faults(tree_draft, tree_target, plan, prompt, o, 20);
}

TEST_CASE("speculative_decode with the caller's gamma_controller: after a fault the controller stays usable (basic)",
          "[faults][decode]") {
    auto target = markov_model::random(10, 2, 31);
    auto draft = markov_model::random(10, 2, 32);
    fault_plan plan;
    faulty_model<markov_model> d{&draft, &plan}, t{&target, &plan};
    const tokens prompt{1};
    specdec::decode_options o{.step = specdec::chain{.gamma = 4},
                              .length = {.policy = specdec::gamma_policy::adaptive},
                              .budget = {.max_new_tokens = 16}};
    o.length.adaptive.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); };
    o.length.adaptive.pass_cost = [](std::size_t) { return 1.0; };
    specdec::gamma_controller controller(4, o.length.adaptive);
    o.length.controller = &controller;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(d, t, prompt, o, rng);
    // Every run makes at least 10 adapter calls (16 tokens, at most 5 per step, 2 calls or more
    // per step, and the 2 vocab_size checks), whatever the controller chooses.
    for (std::size_t k = 1; k <= 10; ++k) {
        INFO("fault at call " << k);
        plan.arm(k, k % 2 == 0);
        CHECK_THROWS_AS(specdec::speculative_decode(d, t, prompt, o, rng), injected_fault);
        plan.disarm();
        // The failed step's choice is counted, its observation is not: the estimates hold the
        // steps that completed. The controller goes on choosing within [0, gamma].
        const auto r = specdec::speculative_decode(d, t, prompt, o, rng);
        CHECK(r.tokens.size() == 16);
        CHECK(r.stats.steps_at_gamma.size() <= 5);
    }
}

TEST_CASE("step_recorder: after a fault at any call the trace holds exactly the steps that completed, as an "
          "undisturbed run recorded them",
          "[faults][trace]") {
    auto target = markov_model::random(10, 2, 41);
    auto draft = markov_model::random(10, 2, 42);
    fault_plan plan;
    faulty_model<markov_model> d{&draft, &plan}, t{&target, &plan};
    const tokens prompt{1, 2};
    for (const bool is_tree : {false, true}) {
        INFO((is_tree ? "trees 2,1" : "chains of 3"));
        specdec::decode_options o{.budget = {.max_new_tokens = 12}};
        if (is_tree) o.step = specdec::tree{.shape = {.branching = {2, 1}}};
        else o.step = specdec::chain{.gamma = 3};
        auto record = [&](specdec::step_recorder& r, std::size_t fault_at) {
            o.on_step = std::ref(r);
            std::mt19937_64 rng(5);
            plan.arm(fault_at, false);
            try {
                (void)specdec::speculative_decode(d, t, prompt, o, rng);
            } catch (const injected_fault&) {
            }
            plan.disarm();
        };
        specdec::step_recorder whole;
        record(whole, fault_plan::never);
        plan.disarm();
        std::mt19937_64 count_rng(5);
        o.on_step = {};
        (void)specdec::speculative_decode(d, t, prompt, o, count_rng);
        const std::size_t total = plan.calls;
        REQUIRE(whole.steps().size() > 2);
        for (std::size_t k = 1; k <= total; ++k) {
            INFO("fault at call " << k << " of " << total);
            specdec::step_recorder r;
            record(r, k);
            REQUIRE(r.steps().size() < whole.steps().size());
            for (std::size_t i = 0; i < r.steps().size(); ++i) {
                const auto& a = r.steps()[i];
                const auto& b = whole.steps()[i];
                CHECK(a.accepted == b.accepted);
                CHECK(a.next_token == b.next_token);
                CHECK(std::ranges::equal(r.tokens(a), whole.tokens(b)));
            }
        }
    }
}

TEST_CASE("speculative_step: a fault at any call of a generation leaves sequence and stats unchanged (strong)",
          "[faults][step]") {
    constexpr int vocab = 10;
    auto target = markov_model::random(vocab, 2, 41);
    auto draft = markov_model::random(vocab, 2, 42);
    fault_plan plan;
    faulty_model<markov_model> plain_draft{&draft, &plan}, plain_target{&target, &plan};
    faulty_model<markov_model> inner_draft{&draft, &plan}, inner_target{&target, &plan};
    specdec::model_drafter<faulty_model<markov_model>> md(inner_draft);
    specdec::model_verifier<faulty_model<markov_model>> mv(inner_target);
    faulty_drafter<specdec::model_drafter<faulty_model<markov_model>>> block_draft{&md, &plan};
    faulty_verifier<specdec::model_verifier<faulty_model<markov_model>>> block_target{&mv, &plan};
    shift_drafter shift{vocab, 3};
    batched_markov batched{&target};
    faulty_drafter<shift_drafter> point_draft{&shift, &plan};
    faulty_verifier<batched_markov> point_target{&batched, &plan};
    // Hierarchical drafting: faults in the inner drafter and in the draft model its inner loop
    // runs (mid inner step, between inner steps).
    auto tiny = markov_model::random(vocab, 1, 13);
    faulty_model<markov_model> inner_tiny{&tiny, &plan}, layered_model{&draft, &plan};
    specdec::hierarchical_drafter layered(inner_tiny, layered_model, {.gamma = 2});
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        INFO("scheme " << (scheme == specdec::verification_scheme::token ? "token" : "block"));
        const specdec::step_options opts{.gamma = 4, .sampling = {.temperature = 0.8f}, .scheme = scheme};
        // The generator is the caller's and is not rewound: a fault after a sampling drafter drew
        // its uniforms leaves it advanced (as the documentation of speculative_step says).
        CHECK(check_steps_under_faults(plain_draft, plain_target, plan, opts, 1) > 0);
        CHECK(check_steps_under_faults(block_draft, block_target, plan, opts, 2) > 0);
        (void)check_steps_under_faults(point_draft, point_target, plan, opts, 3);  // draws no uniforms
    }
}

TEST_CASE("speculative_step: std::bad_alloc at any allocation of its containers leaves sequence and stats unchanged",
          "[faults][step]") {
    // The step's vectors (sequence, statistics, draft block, scratch) go through operator new.
    // Eigen's own allocations are left alone here: Eigen 3.4's resize() frees a matrix's storage
    // before allocating the new one, so a failure there would leave a workspace matrix holding
    // a freed pointer, whatever the library does around it.
    auto target = markov_model::random(10, 2, 61);
    auto draft = markov_model::random(10, 2, 62);
    const specdec::sampling_config sampling{.temperature = 0.8f};
    for (const bool estimate : {false, true}) {
        INFO("acceptance " << (estimate ? "estimated (as decoding loops ask)" : "not estimated"));
        specdec::detail::step_extras extras{.estimate_acceptance = estimate};
        std::size_t faults = 0;
        for (std::size_t k = 1;; ++k) {
            INFO("allocation " << k << " fails");
            tokens seq{1, 2};  // no spare capacity: the step must grow it
            specdec::decode_stats stats;
            specdec::step_workspace ws;
            std::mt19937_64 rng(4);
            const outcome o = run_checked(seq, stats, [&] {
                if (fails_at_allocation(
                        k,
                        [&] {
                            (void)specdec::detail::step_impl(draft, target, seq, stats, 4, sampling, 1.0f,
                                                             specdec::verification_scheme::block, rng, ws, 10,
                                                             "test", &extras);
                        },
                        allocations::operator_new_only))
                    throw injected_fault(0, k);  // (reported as a fault to run_checked)
            });
            if (o == outcome::completed) break;
            ++faults;
            CHECK(o == outcome::fault_left_unchanged);
            // The caller goes on, with a new workspace: a verification workspace whose growth
            // failed part way is not yet safe to reuse (its buffers are grown in several
            // places, and not every later use checks each one's size).
            specdec::step_workspace fresh;
            (void)specdec::detail::step_impl(draft, target, seq, stats, 4, sampling, 1.0f,
                                             specdec::verification_scheme::block, rng, fresh, 10, "test", &extras);
            CHECK(stats.steps == 1);
        }
        CHECK(faults > 3);
    }
}

TEST_CASE("detail::speculative_step_batch: a fault in one sequence at any call: its exception, that sequence unchanged, the "
          "others stepped",
          "[faults][batch]") {
    constexpr std::size_t batch = 3, steps = 8;
    constexpr int vocab = 10;
    using model = faulty_model<markov_model>;
    using sequence = specdec::batch_sequence<std::mt19937_64>;
    // One copy of each model per sequence: a markov_model counts its calls, and the sequences
    // may run on different threads.
    const auto target = markov_model::random(vocab, 2, 51);
    const auto draft = markov_model::random(vocab, 2, 52);
    std::vector<markov_model> targets(batch, target), drafts(batch, draft);
    std::array<fault_plan, batch> plans;
    std::vector<model> drafters, verifiers;
    for (std::size_t i = 0; i < batch; ++i) {
        plans[i].source = i;
        drafters.push_back({&drafts[i], &plans[i]});
        verifiers.push_back({&targets[i], &plans[i]});
    }
    auto start = [](std::size_t i) {
        return sequence{{static_cast<token_id>(i + 1)}, {}, std::mt19937_64(100 + i)};
    };

    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        INFO("scheme " << (scheme == specdec::verification_scheme::token ? "token" : "block"));
        const specdec::step_options opts{.gamma = 3, .sampling = {.temperature = 0.9f}, .scheme = scheme};
        // Undisturbed: each sequence alone, its state after every step, and its adapter calls.
        std::vector<std::vector<sequence>> reference(batch);
        std::array<std::size_t, batch> total{};
        for (std::size_t i = 0; i < batch; ++i) {
            plans[i].disarm();
            sequence s = start(i);
            specdec::step_workspace ws;
            for (std::size_t step = 0; step < steps; ++step) {
                specdec::speculative_step(drafters[i], verifiers[i], s.tokens, s.stats, opts, s.rng, ws);
                reference[i].push_back(s);
            }
            total[i] = plans[i].calls;
        }
        for (const std::size_t threads : {1u, 2u}) {
            specdec::batch_workspace ws(threads);  // one workspace through every fault
            for (std::size_t faulty = 0; faulty < batch; ++faulty) {
                for (const bool after : {false, true}) {
                    for (std::size_t k = 1; k <= total[faulty]; ++k) {
                        INFO(threads << " thread(s), fault in sequence " << faulty << " at call " << k << " of "
                                     << total[faulty] << (after ? " (after delegating)" : " (before delegating)"));
                        std::vector<sequence> seqs;
                        for (std::size_t i = 0; i < batch; ++i) {
                            seqs.push_back(start(i));
                            plans[i].disarm();
                        }
                        plans[faulty].arm(k, after);
                        std::size_t faults = 0;
                        for (std::size_t step = 0; step < steps; ++step) {
                            const tokens tokens_before = seqs[faulty].tokens;
                            const specdec::decode_stats stats_before = seqs[faulty].stats;
                            try {
                                specdec::detail::speculative_step_batch(drafters, verifiers, seqs, opts, ws);
                            } catch (const injected_fault& e) {
                                ++faults;
                                CHECK(e.source == faulty);
                                CHECK(e.call == k);
                                // The failing sequence is exactly as it was (strong, per sequence).
                                CHECK(seqs[faulty].tokens == tokens_before);
                                CHECK(same_stats(seqs[faulty].stats, stats_before));
                                plans[faulty].disarm();
                            }
                            // Every other sequence took this step, exactly as alone.
                            for (std::size_t i = 0; i < batch; ++i) {
                                if (i == faulty) continue;
                                CHECK(seqs[i].tokens == reference[i][step].tokens);
                                CHECK(same_stats(seqs[i].stats, reference[i][step].stats));
                            }
                        }
                        CHECK(faults == 1);
                        // The failed sequence went on stepping after its fault (unless it came in
                        // the last step).
                        CHECK(seqs[faulty].stats.steps == steps - 1);
                    }
                }
            }
            // Two sequences failing in the same step: the lower-numbered one's exception comes
            // out (the other's is dropped), both are unchanged, the one between them stepped.
            std::vector<sequence> seqs;
            for (std::size_t i = 0; i < batch; ++i) {
                seqs.push_back(start(i));
                plans[i].disarm();
            }
            plans[0].arm(2, false);
            plans[2].arm(1, false);
            std::size_t source = batch;
            try {
                specdec::detail::speculative_step_batch(drafters, verifiers, seqs, opts, ws);
            } catch (const injected_fault& e) {
                source = e.source;
            }
            CHECK(source == 0);
            CHECK(seqs[0].tokens == start(0).tokens);
            CHECK(seqs[2].tokens == start(2).tokens);
            CHECK(seqs[0].stats.steps + seqs[2].stats.steps == 0);
            CHECK(seqs[1].tokens == reference[1][0].tokens);
            for (auto& p : plans) p.disarm();
        }
    }
}

// ---- batch_decoder. ----

namespace {

constexpr std::size_t kSequences = 3;
using plans_t = std::array<fault_plan, kSequences>;

/// Shared adapters whose faults are planned per sequence: each call is counted by, and may
/// fail in, the plan of the sequence it serves, the one whose prompt starts with its index.
/// vocab_size() is no fault site (a batch_decoder reads it once, at construction).
template <class Inner>
struct routed_model {
    Inner* inner;
    plans_t* plans;
    std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(inner->vocab_size()); }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        return (*plans)[static_cast<std::size_t>(context.front())].call(
            [&] { return Eigen::VectorXf(inner->next_logits(context)); });
    }
};
template <class Inner>
struct routed_tree_drafter {
    Inner* inner;
    plans_t* plans;
    std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(inner->vocab_size()); }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& sampling, specdec::uniform_source& uniforms,
                      specdec::draft_tree& out) {
        (*plans)[static_cast<std::size_t>(context.front())].call(
            [&] { inner->propose_tree(context, shape, sampling, uniforms, out); });
    }
};
template <class Inner>
struct routed_tree_verifier {
    Inner* inner;
    plans_t* plans;
    std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(inner->vocab_size()); }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        (*plans)[static_cast<std::size_t>(context.front())].call([&] { inner->score_tree(context, tree, out); });
    }
};

/// A sequence's state as a batch_decoder shows it.
struct sequence_state {
    tokens generated;
    specdec::decode_stats stats;
};

template <class Decoder>
sequence_state state_of(const Decoder& dec, std::size_t id) {
    const auto g = dec.generated(id);
    return {tokens(g.begin(), g.end()), dec.stats(id)};
}

}  // namespace

TEST_CASE("batch_decoder with token trees: a fault in one sequence at any call: its exception, that sequence "
          "unchanged and still active, the others stepped as alone, the decoder usable",
          "[faults][batch][tree]") {
    constexpr int vocab = 10;
    constexpr std::size_t budget = 14;
    auto target = markov_model::random(vocab, 2, 71);
    auto draft = markov_model::random(vocab, 2, 72);
    plans_t plans;
    for (std::size_t i = 0; i < kSequences; ++i) plans[i].source = i;
    // Shared by every sequence: a TreeDrafter over a model (faults at propose_tree and at each
    // node's next_logits), a TreeVerifier over a model (at score_tree and at each column).
    routed_model<markov_model> draft_model{&draft, &plans}, target_model{&target, &plans};
    model_tree_drafter<routed_model<markov_model>> mtd{&draft_model};
    model_tree_verifier<routed_model<markov_model>> mtv{&target_model};
    routed_tree_drafter<model_tree_drafter<routed_model<markov_model>>> drafter{&mtd, &plans};
    routed_tree_verifier<model_tree_verifier<routed_model<markov_model>>> verifier{&mtv, &plans};
    auto prompt = [](std::size_t i) { return tokens{static_cast<token_id>(i), static_cast<token_id>(2 * i + 1)}; };
    const specdec::decode_options options{
        .step = specdec::tree{.shape = {.branching = {2, 2, 1}}},
        .sampling = {.temperature = 0.9f},
        .draft = {.sampling = specdec::sampling_config{.temperature = 1.2f}, .stop_below = 0.1f},
        .budget = {.max_new_tokens = budget}};
    using decoder = specdec::batch_decoder<decltype(drafter), decltype(verifier)>;

    // Undisturbed: each sequence alone, its state after every step, and its adapter calls.
    std::array<std::vector<sequence_state>, kSequences> reference;
    std::array<std::size_t, kSequences> total{};
    std::size_t most_steps = 0;
    for (std::size_t i = 0; i < kSequences; ++i) {
        for (auto& p : plans) p.disarm();
        decoder alone(drafter, verifier, options);
        const auto id = alone.add(prompt(i), std::mt19937_64(100 + i));
        while (alone.step() != 0) reference[i].push_back(state_of(alone, id));
        reference[i].push_back(state_of(alone, id));  // (the last step finished it)
        REQUIRE(reference[i].back().generated.size() == budget);
        total[i] = plans[i].calls;
        most_steps = std::max(most_steps, reference[i].size());
    }
    auto expected = [&](std::size_t i, std::size_t step) -> const sequence_state& {
        return reference[i][std::min(step, reference[i].size() - 1)];
    };
    for (const std::size_t threads : {1u, 2u}) {
        for (std::size_t faulty = 0; faulty < kSequences; ++faulty) {
            for (const bool after : {false, true}) {
                for (std::size_t k = 1; k <= total[faulty]; ++k) {
                    INFO(threads << " thread(s), fault in sequence " << faulty << " at call " << k << " of "
                                 << total[faulty] << (after ? " (after delegating)" : " (before delegating)"));
                    for (auto& p : plans) p.disarm();
                    decoder dec(drafter, verifier, options, threads);
                    std::array<std::size_t, kSequences> id{};
                    for (std::size_t i = 0; i < kSequences; ++i) id[i] = dec.add(prompt(i), std::mt19937_64(100 + i));
                    plans[faulty].arm(k, after);
                    std::size_t faults = 0, fault_step = 0;
                    for (std::size_t step = 0; step < most_steps; ++step) {
                        const sequence_state before = state_of(dec, id[faulty]);
                        const bool was_active = !dec.finished(id[faulty]);
                        try {
                            dec.step();
                        } catch (const injected_fault& e) {
                            ++faults;
                            fault_step = step;
                            CHECK(e.source == faulty);
                            CHECK(e.call == k);
                            // The failing sequence is exactly as it was, and still active.
                            const sequence_state now = state_of(dec, id[faulty]);
                            CHECK(now.generated == before.generated);
                            CHECK(same_stats(now.stats, before.stats));
                            CHECK(was_active);
                            CHECK(!dec.finished(id[faulty]));
                            plans[faulty].disarm();
                        }
                        // Every other sequence took this step, exactly as alone.
                        for (std::size_t i = 0; i < kSequences; ++i) {
                            if (i == faulty) continue;
                            const sequence_state now = state_of(dec, id[i]);
                            CHECK(now.generated == expected(i, step).generated);
                            CHECK(same_stats(now.stats, expected(i, step).stats));
                        }
                    }
                    CHECK(faults == 1);
                    // Usable: the failed sequence steps on to its budget (its generator has
                    // advanced by what the failed step drew: its tokens may differ from then on).
                    dec.run();
                    const auto failed = dec.take(id[faulty]);
                    CHECK(failed.tokens.size() == budget);
                    CHECK(failed.stats.steps >= 1);
                    // What it had before the failed step is the undisturbed output's beginning.
                    const tokens& undisturbed = reference[faulty].back().generated;
                    const std::size_t kept = fault_step == 0 ? 0 : expected(faulty, fault_step - 1).generated.size();
                    CHECK(std::equal(failed.tokens.begin(), failed.tokens.begin() + static_cast<std::ptrdiff_t>(kept),
                                     undisturbed.begin()));
                    for (std::size_t i = 0; i < kSequences; ++i)
                        if (i != faulty) CHECK(dec.take(id[i]).tokens == reference[i].back().generated);
                }
            }
        }
        // Two sequences failing in the same step: the lower id's exception comes out (the other's
        // is dropped), both are unchanged and active, the one between them stepped.
        for (auto& p : plans) p.disarm();
        decoder dec(drafter, verifier, options, threads);
        std::array<std::size_t, kSequences> id{};
        for (std::size_t i = 0; i < kSequences; ++i) id[i] = dec.add(prompt(i), std::mt19937_64(100 + i));
        plans[0].arm(2, false);
        plans[2].arm(1, false);
        std::size_t source = kSequences;
        try {
            dec.step();
        } catch (const injected_fault& e) {
            source = e.source;
        }
        CHECK(source == 0);
        CHECK(dec.generated(id[0]).empty());
        CHECK(dec.generated(id[2]).empty());
        CHECK(dec.stats(id[0]).steps + dec.stats(id[2]).steps == 0);
        CHECK(dec.active() == kSequences);
        CHECK(state_of(dec, id[1]).generated == expected(1, 0).generated);
        for (auto& p : plans) p.disarm();
        dec.run();
        for (std::size_t i = 0; i < kSequences; ++i) CHECK(dec.generated(id[i]).size() == budget);
    }
}

namespace {

/// A MultiSequenceDrafter and a MultiSequenceVerifier that forward to *inner through `plan`.
struct faulty_multi_drafter {
    specdec_test::multi_markov_drafter* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const { return inner->vocab_size(); }
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling) {
        plan->call([&] { inner->draft_batch(requests, sampling); });
    }
};
struct faulty_multi_verifier {
    specdec_test::multi_markov_verifier* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const { return inner->vocab_size(); }
    void score_batch(std::span<const specdec::score_request> requests, specdec::packed_logits& out) {
        plan->call([&] { inner->score_batch(requests, out); });
    }
};
/// A MultiSequenceVerifier and MultiSequenceTreeVerifier (score_batch, score_tree_batch) through `plan`.
struct faulty_multi_tree_verifier {
    specdec_test::multi_cached_model* inner;
    fault_plan* plan;
    std::ptrdiff_t vocab_size() const { return inner->vocab_size(); }
    void score_batch(std::span<const specdec::score_request> requests, specdec::packed_logits& out) {
        plan->call([&] { inner->score_batch(requests, out); });
    }
    void score_tree_batch(std::span<const specdec::tree_score_request> requests, specdec::packed_logits& out) {
        plan->call([&] { inner->score_tree_batch(requests, out); });
    }
};

}  // namespace

TEST_CASE("batch_decoder with chains of many sequences: a fault in draft_batch or score_batch at any call changes "
          "no sequence and no estimate of the caller's controller, and the decoder goes on",
          "[faults][batch][multi]") {
    constexpr std::size_t budget = 20;
    const auto target = markov_model::random(10, 2, 81);
    const auto draft = markov_model::random(10, 2, 82);
    specdec_test::multi_markov_drafter md{&draft};
    specdec_test::multi_markov_verifier mv{&target};
    fault_plan plan;
    faulty_multi_drafter drafter{&md, &plan};
    faulty_multi_verifier verifier{&mv, &plan};
    specdec::decode_options options{.step = specdec::chain{.gamma = 3},
                                    .sampling = {.temperature = 0.9f},
                                    .draft = {.sampling = specdec::sampling_config{.temperature = 1.3f}},
                                    .budget = {.max_new_tokens = budget}};
    // With a caller's controller (the adaptive policy, known costs): the failed step's
    // observation is not recorded, so its estimates are those of the steps that completed.
    std::optional<specdec::gamma_controller> controller;
    auto estimates = [&] {
        std::vector<double> e;
        if (controller)
            for (std::size_t i = 0; i < controller->gamma_max(); ++i) e.push_back(controller->acceptance(i));
        return e;
    };
    auto run = [&](std::size_t fault_at, bool after, std::size_t& faults) {
        if (options.length.policy == specdec::gamma_policy::adaptive) {  // a fresh one: the same calls until the fault
            controller.emplace(specdec::make_controller(options));
            options.length.controller = &*controller;
        }
        specdec::batch_decoder dec(drafter, verifier, options);
        std::vector<std::size_t> ids;
        for (token_id p = 0; p < 3; ++p) ids.push_back(dec.add(tokens{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p))));
        plan.arm(fault_at, after);
        while (dec.active() != 0) {
            std::vector<sequence_state> before;
            for (const auto id : ids) before.push_back(state_of(dec, id));
            const std::vector<double> estimated = estimates();
            try {
                dec.step();
            } catch (const injected_fault& e) {
                ++faults;
                CHECK(e.call == fault_at);
                for (std::size_t i = 0; i < ids.size(); ++i) {  // no sequence changed
                    const sequence_state now = state_of(dec, ids[i]);
                    CHECK(now.generated == before[i].generated);
                    CHECK(same_stats(now.stats, before[i].stats));
                }
                CHECK(estimates() == estimated);
                plan.disarm();
            }
        }
        for (const auto id : ids) CHECK(dec.generated(id).size() == budget);
    };
    for (const bool with_controller : {false, true}) {
        INFO((with_controller ? "adaptive, the caller's controller" : "fixed gamma"));
        if (with_controller) {
            options.length.policy = specdec::gamma_policy::adaptive;
            options.length.adaptive.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); };
            options.length.adaptive.pass_cost = [](std::size_t) { return 1.0; };
        }
        std::size_t faults = 0;
        plan.disarm();
        run(fault_plan::never, false, faults);
        const std::size_t total = plan.calls;
        REQUIRE(total > 4);
        for (const bool after : {false, true})
            for (std::size_t k = 1; k <= total; ++k) {
                INFO("fault at call " << k << " of " << total << (after ? " (after delegating)" : " (before delegating)"));
                faults = 0;
                run(k, after, faults);
                CHECK(faults == 1);
            }
    }
}

namespace {

/// The models of a tree planner's batch: chains of many sequences (draft_batch, score_batch) and
/// plain models for the tree steps (next_logits), every call through `plan`.
struct faulty_planned_drafter {
    specdec_test::multi_markov_drafter* inner;
    markov_model* model;
    fault_plan* plan;
    bool* batch_call;  // whether the last call served every sequence
    std::ptrdiff_t vocab_size() const { return inner->vocab_size(); }
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling) {
        *batch_call = true;
        plan->call([&] { inner->draft_batch(requests, sampling); });
    }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        *batch_call = false;
        Eigen::VectorXf out;
        plan->call([&] { out = model->next_logits(context); });
        return out;
    }
};
struct faulty_planned_verifier {
    specdec_test::multi_markov_verifier* inner;
    markov_model* model;
    fault_plan* plan;
    bool* batch_call;
    std::ptrdiff_t vocab_size() const { return inner->vocab_size(); }
    void score_batch(std::span<const specdec::score_request> requests, specdec::packed_logits& out) {
        *batch_call = true;
        plan->call([&] { inner->score_batch(requests, out); });
    }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        *batch_call = false;
        Eigen::VectorXf out;
        plan->call([&] { out = model->next_logits(context); });
        return out;
    }
};

}  // namespace

TEST_CASE("batch_decoder under the tree planner: a fault at any call, in a chain step (draft_batch, score_batch) or a "
          "tree step, changes no sequence and no estimate of the caller's planner, and the decoder goes on",
          "[faults][batch][multi][tree][adaptive]") {
    constexpr std::size_t budget = 20;
    auto target = markov_model::random(10, 2, 83);
    auto draft = markov_model::random(10, 2, 84);
    specdec_test::multi_markov_drafter md{&draft};
    specdec_test::multi_markov_verifier mv{&target};
    fault_plan plan;
    bool batch_call = false;
    faulty_planned_drafter drafter{&md, &draft, &plan, &batch_call};
    faulty_planned_verifier verifier{&mv, &target, &plan, &batch_call};
    specdec::decode_options options{.step = specdec::tree{.shape = {.branching = {2, 1, 1}}},
                                    .length = {.policy = specdec::gamma_policy::adaptive},
                                    .sampling = {.temperature = 0.9f},
                                    .draft = {.sampling = specdec::sampling_config{.temperature = 1.3f}},
                                    .budget = {.max_new_tokens = budget}};
    // A pass flat up to 6 positions: chains for the batch, trees now and then (explored).
    options.length.adaptive.profile =
        specdec::engine_profile{.target_pass = {1, 1, 1, 1, 1, 1, 1.6, 2.2, 2.8}, .draft_step = {0.05}};
    options.length.adaptive.explore_every = 2;
    std::optional<specdec::gamma_controller> planner;
    auto estimates = [&] {
        std::vector<double> e;
        for (std::size_t k = 1; k <= 2; ++k) e.push_back(planner->sibling_acceptance(k));
        return e;
    };
    std::size_t chain_steps = 0, tree_steps = 0, batch_faults = 0, sequence_faults = 0;
    options.on_step = [&](const specdec::step_event& e) { (e.tree ? tree_steps : chain_steps) += 1; };
    auto run = [&](std::size_t fault_at, bool after, std::size_t& faults) {
        planner.emplace(specdec::make_controller(options, specdec::tree_draft_calls::per_parent, true));
        auto opts = options;
        opts.length.controller = &*planner;
        specdec::batch_decoder dec(drafter, verifier, opts);
        std::vector<std::size_t> ids;
        for (token_id p = 0; p < 3; ++p) ids.push_back(dec.add(tokens{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p))));
        plan.arm(fault_at, after);
        while (dec.active() != 0) {
            std::vector<sequence_state> before;
            for (const auto id : ids) before.push_back(state_of(dec, id));
            const std::vector<double> estimated = estimates();
            try {
                dec.step();
            } catch (const injected_fault& e) {
                ++faults;
                CHECK(e.call == fault_at);
                // A call that serves every sequence (draft_batch, score_batch) changes none, and
                // the planner observes nothing; a per-sequence call of a tree step leaves its
                // own sequence unchanged (the others step, and the planner observes them).
                std::size_t unchanged = 0;
                for (std::size_t i = 0; i < ids.size(); ++i) {
                    const sequence_state now = state_of(dec, ids[i]);
                    const bool same = now.generated == before[i].generated && same_stats(now.stats, before[i].stats);
                    unchanged += same;
                    if (batch_call) CHECK(same);
                }
                CHECK(unchanged >= 1);
                if (batch_call) CHECK(estimates() == estimated);
                ++(batch_call ? batch_faults : sequence_faults);
                plan.disarm();
            }
        }
        for (const auto id : ids) CHECK(dec.generated(id).size() == budget);
    };
    std::size_t faults = 0;
    plan.disarm();
    run(fault_plan::never, false, faults);
    const std::size_t total = plan.calls;
    REQUIRE(total > 4);
    REQUIRE(chain_steps > 0);  // both kinds of step are exercised
    REQUIRE(tree_steps > 0);
    for (const bool after : {false, true})
        for (std::size_t k = 1; k <= total; ++k) {
            INFO("fault at call " << k << " of " << total << (after ? " (after delegating)" : " (before delegating)"));
            faults = 0;
            run(k, after, faults);
            CHECK(faults == 1);
        }
    CHECK(batch_faults > 0);  // both kinds of call failed somewhere
    CHECK(sequence_faults > 0);
}

TEST_CASE("measure_engine_profile and measure_batch_profile: a fault at any adapter call comes out with its own "
          "type, and the same adapters then measure a valid profile",
          "[faults][profile]") {
    const auto target = markov_model::random(10, 2, 91);
    const auto draft = markov_model::random(10, 2, 92);
    fault_plan plan;
    // measure() once undisturbed, counting the adapter calls; then a fault at each call, before
    // and after delegating: it comes out, and the next measure() gives a valid profile.
    auto check_every_fault = [&plan](auto measure) {
        plan.disarm();
        (void)measure();
        const std::size_t total = plan.calls;
        REQUIRE(total > 4);
        for (const bool after : {false, true})
            for (std::size_t k = 1; k <= total; ++k) {
                INFO("fault at call " << k << " of " << total << (after ? " (after delegating)" : ""));
                plan.arm(k, after);
                CHECK_THROWS_AS(measure(), injected_fault);
                plan.disarm();
                CHECK_NOTHROW(specdec::validate(measure(), "test"));
            }
    };
    SECTION("one sequence: plain models") {
        markov_model t = target, d = draft;
        faulty_model<markov_model> fd{&d, &plan}, ft{&t, &plan};
        const tokens context{1, 2, 3};
        const specdec::profile_measurement m{.max_positions = 4, .repeats = 2};
        check_every_fault([&] { return specdec::measure_engine_profile(fd, ft, context, m); });
    }
    SECTION("one sequence: a target with score_tree too (tree passes timed)") {
        // next_logits and score_tree through the plan (score_tree one next_logits per column).
        struct faulty_chain_tree_model : faulty_model<markov_model> {
            model_tree_verifier<markov_model> trees{inner};
            void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
                plan->call([&] { trees.score_tree(context, tree, out); });
            }
        };
        markov_model t = target, d = draft;
        faulty_model<markov_model> fd{&d, &plan};
        faulty_chain_tree_model ft{{&t, &plan}};
        const tokens context{1, 2, 3};
        const specdec::profile_measurement m{.max_positions = 4, .repeats = 2};
        REQUIRE(specdec::measure_engine_profile(fd, ft, context, m).tree_pass.size() == 4);
        check_every_fault([&] { return specdec::measure_engine_profile(fd, ft, context, m); });
    }
    SECTION("many sequences: draft_batch and score_batch") {
        specdec_test::multi_markov_drafter md{&draft};
        specdec_test::multi_markov_verifier mv{&target};
        faulty_multi_drafter fd{&md, &plan};
        faulty_multi_verifier fv{&mv, &plan};
        const std::vector<tokens> contexts{{1, 2}, {3, 4, 5}};
        const specdec::batch_profile_measurement m{.max_positions = 6, .max_sequences = 2, .draft_tokens = 2, .repeats = 1};
        check_every_fault([&] { return specdec::measure_batch_profile(fd, fv, contexts, m); });
    }
    SECTION("many sequences: score_tree_batch too (tree passes timed)") {
        specdec_test::multi_markov_drafter md{&draft};
        specdec_test::multi_cached_model mc(10, 93);
        faulty_multi_drafter fd{&md, &plan};
        faulty_multi_tree_verifier fv{&mc, &plan};
        const std::vector<tokens> contexts{{1, 2}, {3, 4, 5}};
        const specdec::batch_profile_measurement m{.max_positions = 6, .max_sequences = 2, .draft_tokens = 2, .repeats = 1};
        REQUIRE(specdec::measure_batch_profile(fd, fv, contexts, m).tree_pass.size() == 6);
        check_every_fault([&] { return specdec::measure_batch_profile(fd, fv, contexts, m); });
    }
}

// ---- The llama2 engine. ----

namespace {

/// A tiny random model (2 layers, grouped-query attention, a classifier of its own).
std::shared_ptr<const llama2::checkpoint> tiny_model() {
    auto ck = std::make_shared<llama2::checkpoint>();
    ck->name = "tiny-random";
    llama2::config& c = ck->cfg;
    c.dim = 16;
    c.hidden_dim = 40;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 32;
    c.seq_len = 64;
    c.shared_classifier = false;
    ck->w = llama2::random_weights(c, 2024);
    return ck;
}

std::span<const token_id> prefix(const tokens& t, std::size_t n) { return std::span<const token_id>(t).first(n); }

/// score(context, draft) of a fresh engine of the same depth.
Eigen::MatrixXf fresh_score(const llama2::transformer& like, std::span<const token_id> context,
                            std::span<const token_id> draft) {
    llama2::transformer fresh(like.model(), like.n_layers());
    return fresh.score(context, draft);
}

/// The engine, whatever state its cache is in, computes bit for bit what a fresh engine
/// computes: after a rollback to a short context, and on a longer one again.
void check_like_fresh(llama2::transformer& e, const tokens& full) {
    const std::size_t lengths[] = {full.size() / 3, full.size() - 4, full.size() / 2};
    for (const std::size_t n : lengths) {
        INFO("context of " << n << " tokens, draft of 3");
        const auto context = prefix(full, n);
        const auto draft = std::span<const token_id>(full).subspan(n, 3);
        CHECK(bit_identical(e.score(context, draft), fresh_score(e, context, draft)));
    }
}

/// The engine's cache, as far as a caller can observe it.
struct cache_state {
    tokens cached;
    std::ptrdiff_t capacity = 0;
    std::uint64_t bytes = 0;
    explicit cache_state(const llama2::transformer& e)
        : cached(e.cached_tokens().begin(), e.cached_tokens().end()),
          capacity(e.cache_capacity()),
          bytes(e.cache_bytes()) {}
    bool operator==(const cache_state&) const = default;
};

}  // namespace

TEST_CASE("llama2: faults of adapters around the engine in speculative_decode leave it computing what a fresh "
          "engine computes",
          "[faults][llama2]") {
    const auto model = tiny_model();
    llama2::transformer target(model), early(model, 1);  // the draft: the first layer of the target
    fault_plan plan;
    faulty_model<llama2::transformer> d{&early, &plan};
    faulty_verifier<llama2::transformer> t{&target, &plan};  // in place: score_into into the workspace
    const tokens prompt{1, 7, 3};
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        INFO("scheme " << (scheme == specdec::verification_scheme::token ? "token" : "block"));
        // 43 tokens and a draft of 4: the caches grow from 16 to 32 to 64 positions.
        const specdec::decode_options o{.step = specdec::chain{.gamma = 4, .scheme = scheme},
                                        .sampling = {.temperature = 1.0f},
                                        .budget = {.max_new_tokens = 40}};
        plan.disarm();
        target.clear_cache();
        early.clear_cache();
        std::mt19937_64 rng(5);
        const auto reference = specdec::speculative_decode(d, t, prompt, o, rng);
        const std::size_t total = plan.calls;
        REQUIRE(reference.tokens.size() == 40);
        tokens full = prompt;
        full.insert(full.end(), reference.tokens.begin(), reference.tokens.end());
        for (const bool after : {false, true}) {
            for (std::size_t k = 1; k <= total; ++k) {
                INFO("fault at call " << k << " of " << total << (after ? " (after delegating)" : " (before delegating)"));
                plan.arm(k, after);
                std::mt19937_64 g(5);
                CHECK_THROWS_AS(specdec::speculative_decode(d, t, prompt, o, g), injected_fault);
                plan.disarm();
                // Straight after the fault, both engines compute what fresh ones compute.
                check_like_fresh(target, full);
                check_like_fresh(early, full);
                // And the same objects decode the undisturbed tokens again.
                std::mt19937_64 again(5);
                const auto r = specdec::speculative_decode(d, t, prompt, o, again);
                CHECK(r.tokens == reference.tokens);
                CHECK(same_stats(r.stats, reference.stats));
            }
        }
    }
}

TEST_CASE("llama2: the engine's own errors in the middle of a generation leave its cache unchanged (strong)",
          "[faults][llama2]") {
    const auto model = tiny_model();
    llama2::transformer e(model);
    const auto limit = static_cast<std::size_t>(e.max_context());
    const auto vocab = static_cast<token_id>(e.vocab_size());
    Eigen::MatrixXf out = Eigen::MatrixXf::Constant(vocab, 3, 0.25f);  // the caller's matrix for score_into
    tokens seq{1};
    std::mt19937 g(17);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::size_t errors = 0;
    // Greedy-with-noise generation up to seq_len, the cache growing through 16, 32 and 64.
    while (seq.size() < limit) {
        const std::size_t step = seq.size();
        INFO("step " << step);
        // One provoked error per step, of a kind that depends on the step.
        const cache_state before(e);
        const Eigen::MatrixXf out_before = out;
        tokens bad = seq;
        switch (step % 6) {
            case 0:  // a context beyond seq_len
                bad.resize(limit + 1, 5);
                CHECK_THROWS_AS((void)e.next_logits(bad), std::length_error);
                break;
            case 1: {  // context + draft beyond seq_len
                const tokens draft(limit + 1 - seq.size(), 4);
                CHECK_THROWS_AS(e.score_into(seq, draft, out), std::length_error);
                break;
            }
            case 2:  // a token outside the vocabulary at the end of the context (the rest is cached)
                bad.back() = vocab;
                CHECK_THROWS_AS((void)e.next_logits(bad), std::out_of_range);
                break;
            case 3: {  // a negative draft token
                const tokens draft{-1};
                CHECK_THROWS_AS(e.score_into(seq, draft, out), std::out_of_range);
                break;
            }
            case 4:  // an empty context
                CHECK_THROWS_AS((void)e.score(std::span<const token_id>{}, seq), std::invalid_argument);
                break;
            default:  // reserve beyond seq_len
                CHECK_THROWS_AS(e.reserve(e.max_context() + 1), std::length_error);
                break;
        }
        ++errors;
        CHECK(cache_state(e) == before);
        CHECK(bit_identical(out, out_before));
        // A rollback now and then (a rejected draft), then the next token's logits, each bit for
        // bit what a fresh engine gives.
        if (step % 4 == 3) {
            const auto shorter = prefix(seq, step / 2 + 1);
            CHECK(bit_identical(e.next_logits(shorter), fresh_score(e, shorter, {})));
        }
        const Eigen::VectorXf logits = e.next_logits(seq);
        REQUIRE(bit_identical(logits, fresh_score(e, seq, {})));
        Eigen::Index best = 0;
        logits.maxCoeff(&best);
        seq.push_back(u(g) < 0.7f ? static_cast<token_id>(best) : static_cast<token_id>(g() % 32));
    }
    CHECK(errors == limit - 1);
    CHECK(e.cache_capacity() == e.max_context());
    // A score over the full window into the caller's matrix, then clear_cache: still exact.
    e.score_into(prefix(seq, limit - 2), std::span<const token_id>(seq).last(2), out);
    CHECK(bit_identical(out, fresh_score(e, prefix(seq, limit - 2), std::span<const token_id>(seq).last(2))));
    e.clear_cache();
    CHECK(bit_identical(e.next_logits(prefix(seq, 9)), fresh_score(e, prefix(seq, 9), {})));
}

TEST_CASE("llama2: std::bad_alloc at any allocation of an engine call leaves the engine unchanged (strong)",
          "[faults][llama2]") {
    const auto model = tiny_model();
    const auto vocab = static_cast<Eigen::Index>(model->cfg.vocab_size);
    tokens seq{1};
    for (token_id i = 0; i < 45; ++i) seq.push_back((i * 7 + 3) % 32);
    const auto draft5 = std::span<const token_id>(seq).subspan(14, 5);
    const auto draft8 = std::span<const token_id>(seq).subspan(12, 8);
    struct scenario {
        const char* name;
        Eigen::Index out_cols;  // the shape of the caller's matrix before the call
        void (*prepare)(llama2::transformer&, const tokens&);
        // The call under test, its result into `result` (sized beforehand, so that storing it
        // allocates nothing); score_into writes the caller's `out`.
        void (*call)(llama2::transformer&, const tokens&, Eigen::MatrixXf& out, Eigen::MatrixXf& result);
    };
    auto warm = [](llama2::transformer& e, const tokens& s) { (void)e.next_logits(prefix(s, 10)); };
    auto score_14_5_into = [](llama2::transformer& e, const tokens& s, Eigen::MatrixXf& out, Eigen::MatrixXf& result) {
        e.score_into(prefix(s, 14), std::span<const token_id>(s).subspan(14, 5), out);
        result = out;
    };
    const scenario scenarios[] = {
        {"first call of a fresh engine", 2, [](llama2::transformer&, const tokens&) {},
         [](llama2::transformer& e, const tokens& s, Eigen::MatrixXf&, Eigen::MatrixXf& result) {
             result = e.next_logits(prefix(s, 20));
         }},
        {"score across cache growth", 2, warm,
         [](llama2::transformer& e, const tokens& s, Eigen::MatrixXf&, Eigen::MatrixXf& result) {
             result = e.score(prefix(s, 14), std::span<const token_id>(s).subspan(14, 5));
         }},
        {"score_into a matrix of another shape, across cache growth", 2, warm, score_14_5_into},
        {"score_into a matrix of the right shape, across cache growth", 6, warm, score_14_5_into},
        {"more positions than before, no cache growth (activations only)", 2,
         [](llama2::transformer& e, const tokens& s) {
             e.reserve(e.max_context());
             (void)e.next_logits(prefix(s, 3));
         },
         [](llama2::transformer& e, const tokens& s, Eigen::MatrixXf&, Eigen::MatrixXf& result) {
             result = e.score(prefix(s, 12), std::span<const token_id>(s).subspan(12, 8));
         }},
        {"reserve", 2, warm,
         [](llama2::transformer& e, const tokens&, Eigen::MatrixXf&, Eigen::MatrixXf&) { e.reserve(40); }},
    };
    const llama2::transformer like(model);
    const Eigen::MatrixXf expected[] = {fresh_score(like, prefix(seq, 20), {}), fresh_score(like, prefix(seq, 14), draft5),
                                        fresh_score(like, prefix(seq, 14), draft5), fresh_score(like, prefix(seq, 14), draft5),
                                        fresh_score(like, prefix(seq, 12), draft8), Eigen::MatrixXf()};
    for (std::size_t s = 0; s < std::size(scenarios); ++s) {
        const scenario& sc = scenarios[s];
        INFO(sc.name);
        std::size_t faults = 0;
        for (std::size_t k = 1;; ++k) {
            INFO("allocation " << k << " fails");
            llama2::transformer e(model);
            Eigen::MatrixXf out = Eigen::MatrixXf::Constant(vocab, sc.out_cols, 0.5f);
            Eigen::MatrixXf result(expected[s].rows(), expected[s].cols());
            sc.prepare(e, seq);
            const cache_state before(e);
            const Eigen::MatrixXf out_before = out;
            if (!fails_at_allocation(k, [&] { sc.call(e, seq, out, result); })) {
                // Fewer than k allocations: the call completed.
                CHECK(bit_identical(result, expected[s]));
                break;
            }
            ++faults;
            CHECK(cache_state(e) == before);
            CHECK(bit_identical(out, out_before));
            // Then the same call, a rollback and a longer context are exact.
            sc.call(e, seq, out, result);
            CHECK(bit_identical(result, expected[s]));
            CHECK(bit_identical(e.next_logits(prefix(seq, 5)), fresh_score(e, prefix(seq, 5), {})));
            CHECK(bit_identical(e.score(prefix(seq, 30), draft8), fresh_score(e, prefix(seq, 30), draft8)));
        }
        CHECK(faults > 0);  // the call did allocate: the faults were real
    }
}
