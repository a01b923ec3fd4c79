#pragma once
/// \file
/// The conformance kit: tests that a user's own adapters keep speculative decoding exact.
///
/// specdec's output has the target's distribution (Leviathan et al. 2023, App. A.1) only if
/// the adapters keep the promises of concepts.hpp. The checks here test those promises on the
/// user's models, from the user's own test framework; each returns a `report` (verdict,
/// statistic, p-value or largest error, the first failing case in words, what was run):
///
/// | check                     | what it tests                                                   | false alarms  |
/// |---------------------------|-----------------------------------------------------------------|---------------|
/// | check_contract            | score() column j = a fresh model's logits after context + draft[0..j), after rollbacks, shrinking contexts, any order, on copies; score_tree() column i + 1 = the logits after context + node i's path | none (deterministic) |
/// | check_draft_consistency   | a drafter's tokens (or tree nodes) follow the distributions it reports (χ² per position or depth; for chains also the joint law of consecutive positions), after random contexts and after the drafter's own samples | `significance` per test |
/// | check_equivalence         | the law of the first n tokens of speculative_decode = plain sampling from the target; reports the measured acceptance | `significance` per scheme and sampling config |
/// | check_determinism         | the same seed gives the same tokens                              | none          |
/// | check_multi_sequence_contract | score_batch / score_tree_batch / draft_batch give each request what it gets alone, across joining, leaving, reused slots, shuffled and ragged requests | none (deterministic) |
///
/// `run_conformance` runs them all. The decoding checks run the step of
/// `conformance_options::decode` (decode_options::step): a chain (the default) under each of the
/// chain schemes in `schemes`, or a tree under its own scheme; with a tree step, a tree drafter
/// (TreeDrafter) is checked tree by tree and a tree verifier's score_tree() in the contract. Not
/// included by specdec/specdec.hpp.
///
/// \code
/// #include <specdec/testing.hpp>
/// TEST_CASE("my adapters keep speculative decoding exact") {
///     my_engine target = load_target(), draft = load_draft();
///     const auto report = specdec::testing::run_conformance(draft, target, {.prompt = {1}});
///     CHECK(report);  // on failure, Catch2 prints the one-line summary of every check
/// }
/// \endcode

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "adapters.hpp"
#include "concepts.hpp"
#include "decode_options.hpp"
#include "multi_sequence.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "speculative_decode.hpp"
#include "testing/stats.hpp"
#include "tree.hpp"
#include "types.hpp"
#include "verify_types.hpp"

namespace specdec::testing {

/// Outcome of one check. Converts to bool (passed), so `CHECK(report)` works in Catch2; with
/// GoogleTest, `EXPECT_TRUE(report.ok()) << report;`.
struct report {
    std::string check;  ///< which check ran ("adapter contract", ...)
    bool passed = true;  ///< whether the check passed
    /// The test statistic of the worst case (χ² for the statistical checks; 0 for the others).
    double statistic = 0.0;
    /// The smallest p-value among the tests run (statistical checks); NaN for the others.
    double p_value = std::numeric_limits<double>::quiet_NaN();
    /// The largest error measured (the contract's total-variation distance); NaN when not measured.
    double max_error = std::numeric_limits<double>::quiet_NaN();
    /// Probability that an adapter that is right fails this check (0: deterministic check).
    double false_alarm_rate = 0.0;
    /// Fraction of drafted tokens the target accepted in the check's decoding runs (the
    /// equivalence check; NaN for the others, or when nothing was drafted). Exactness does not
    /// depend on it; a draft model that got worse shows here first, as a slower decode.
    double acceptance = std::numeric_limits<double>::quiet_NaN();
    std::size_t drafted = 0;  ///< drafted tokens `acceptance` rests on
    std::string failure;  ///< the first failing case, in words (empty when passed)
    std::string ran;      ///< what was run
    double seconds = 0.0;  ///< how long it took

    /// Whether the check passed (`passed`).
    [[nodiscard]] bool ok() const noexcept { return passed; }
    /// Whether the check passed (`passed`), so that `CHECK(report)` works.
    explicit operator bool() const noexcept { return passed; }

    /// One line: "PASS <check>: <what was run> ..." or "FAIL <check>: <first failing case> ...".
    [[nodiscard]] std::string to_string() const {
        std::ostringstream os;
        os << (passed ? "PASS " : "FAIL ") << check << ": ";
        if (!passed) os << failure << " | ran: ";
        os << ran;
        if (!std::isnan(p_value)) os << "; smallest p = " << p_value;
        if (!std::isnan(max_error)) os << "; max error = " << max_error;
        if (!std::isnan(acceptance))
            os << "; acceptance " << std::round(acceptance * 1000.0) / 1000.0 << " of " << drafted << " drafted tokens";
        if (false_alarm_rate > 0.0) os << "; false-alarm rate " << false_alarm_rate;
        os << " (" << std::round(seconds * 100.0) / 100.0 << " s)";
        return os.str();
    }
};

/// Writes r.to_string().
inline std::ostream& operator<<(std::ostream& os, const report& r) { return os << r.to_string(); }

/// The reports of run_conformance. Converts to bool (every check passed).
struct conformance_report {
    std::vector<report> checks;  ///< one report per check run, in the order they ran
    /// Whether every check passed (true when none ran).
    [[nodiscard]] bool ok() const noexcept {
        return std::all_of(checks.begin(), checks.end(), [](const report& r) { return r.passed; });
    }
    /// ok(): whether every check passed.
    explicit operator bool() const noexcept { return ok(); }
    /// One line per check.
    [[nodiscard]] std::string to_string() const {
        std::string s;
        for (const auto& r : checks) s += r.to_string() + "\n";
        return s;
    }
};

/// Writes r.to_string() (one line per check).
inline std::ostream& operator<<(std::ostream& os, const conformance_report& r) { return os << r.to_string(); }

/// What the checks run, and their budgets. Aggregate: `{.prompt = {1}, .samples = 5000}`.
struct conformance_options {
    /// Every context the checks build starts with these tokens (a llama2.c model needs BOS = 1).
    std::vector<token_id> prompt{};
    /// γ of chain steps: the decoding checks run chains of this γ (in place of the chain's own in
    /// `decode`), the draft check blocks of γ tokens, and the contract check scores drafts of up
    /// to γ + 1 tokens. With a tree step, the tree's depth takes its place.
    std::size_t gamma = 4;
    /// The chain verification schemes the equivalence and determinism checks run, each in turn,
    /// when decode.step is a chain. A tree step runs its own scheme (tree::scheme) instead.
    std::vector<verification_scheme> schemes{verification_scheme::token, verification_scheme::block};
    /// The sampling settings the draft and decoding checks run (each with every scheme).
    std::vector<sampling_config> samplings{sampling_config{}, sampling_config{.temperature = 0.6f, .top_k = 40}};
    /// Further decoding settings: the step (a specdec::chain, the default, or a specdec::tree
    /// such as `{.shape = {.branching = {2, 2, 1, 1}}}`), the length policy, the draft's own
    /// sampling and stop, stop tokens. Set by the checks: the target's sampling (each of
    /// `samplings`), budget.max_new_tokens and on_step; of a chain, its γ (`gamma`) and scheme
    /// (each of `schemes`; lenience 1 under block verification and in the equivalence check,
    /// whose law is the target's only at lenience 1). The determinism check runs the fixed
    /// policy, the equivalence check a fresh adaptive controller per run (length.controller is
    /// not used). A drafter that only proposes trees runs a tree step: decode.step's tree, or the
    /// default specdec::tree{} when decode.step is a chain.
    decode_options decode{};

    // ---- adapter contract ----
    /// The longest context the contract and draft checks build (prompt included).
    std::size_t max_context = 48;
    /// Calls per scenario of the contract check (six scenarios).
    std::size_t contract_calls = 24;
    /// Largest total-variation distance allowed between the distribution (softmax at temperature
    /// 1) of a score() column or next_logits result and a fresh model's for the same tokens.
    /// 0 demands bit-for-bit agreement up to rounding of the softmax; raise it for engines whose
    /// batched and single-token kernels round differently.
    double tolerance = 1e-4;
    /// The most sequences in one pass of the multi-sequence contract check (score_batch,
    /// score_tree_batch, draft_batch); it runs 2 * contract_calls passes of each.
    std::size_t batch = 4;

    // ---- draft consistency ----
    std::size_t draft_contexts = 16;  ///< contexts the drafter drafts after
    /// Half of the draft check's contexts (chain drafters) continue the prompt with the drafter's
    /// own samples, where a draft model is confident, as decoding meets it; the rest are random
    /// tokens (where it rarely is). false: all random.
    bool draft_own_contexts = true;
    std::size_t draft_blocks = 1000;  ///< blocks drawn per sampling config
    std::size_t pit_bins = 16;        ///< cells of the χ² test of each position

    // ---- sequence-level equivalence ----
    std::size_t length = 5;  ///< n: the law of the first n generated tokens is tested
    /// Sequences drawn per scheme and sampling config (from each of the two samplers, in the
    /// two-sample test).
    std::size_t samples = 2000;
    /// Test against `samples` sequences of plain sampling from the target (autoregressive_decode)
    /// instead of the target's exact probabilities: twice the sampling and less power, but no
    /// enumeration of the target's probability tree.
    bool two_sample = false;
    /// Stop drawing a sample after this many seconds (0: no limit; the report says how many
    /// were drawn). Makes the outcome depend on the machine's speed.
    double max_seconds = 0.0;

    /// False-alarm rate of each statistical test (each draft position; each scheme and sampling
    /// config of the equivalence check).
    double significance = 1e-4;
    /// Seed of the checks' own generator: the same seed, the same verdict.
    std::uint64_t seed = 1;
};

namespace detail {

inline std::string tokens_text(std::span<const token_id> t) {
    std::ostringstream os;
    os << "[";
    const std::size_t show = 10;
    for (std::size_t i = 0; i < t.size(); ++i) {
        if (t.size() > show && i == show / 2) {
            os << " ...";
            i = t.size() - show / 2;
        }
        os << (i ? " " : "") << t[i];
    }
    os << "]";
    return os.str();
}

inline std::string number(double x) {
    std::ostringstream os;
    os.precision(3);
    os << x;
    return os.str();
}

/// Below this total variation, a mismatch that matches no shifted or other sequence's logits
/// looks like rounding rather than a cache or mask bug (which change a distribution by far more).
inline constexpr double rounding_like_error = 0.05;

/// The hint for a small mismatch: reduced-precision arithmetic (a bf16 or fp16 batched pass
/// against a float next_logits, relative 4e-3 on each logit, differs by about 0.002-0.02 in
/// total variation) and how to accept it.
inline std::string rounding_hint(double error) {
    return "; a difference this small (total variation " + number(error) + " < " + number(rounding_like_error) +
           ") is what reduced-precision arithmetic gives (a bf16/fp16 batched pass against a float next_logits); "
           "if your engine computes in reduced precision, set conformance_options::tolerance to a few times it, "
           "e.g. " + number(10 * error) + " (a KV-cache or mask bug usually differs by far more)";
}

inline double seconds_between(std::chrono::steady_clock::time_point a) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

/// The step the checks run with drafter type D: decode.step, except that a drafter that only
/// proposes trees runs the default tree when decode.step is a chain (it cannot draft chains).
template <class D>
step_shape step_of(const conformance_options& o) {
    if constexpr (!Drafter<D> && !MultiSequenceDrafter<D>) {
        if (std::holds_alternative<specdec::chain>(o.decode.step)) return specdec::tree{};
    }
    return o.decode.step;
}

/// The longest draft of a step: the chain's γ (the options' `gamma`) or the tree's depth.
inline std::size_t longest_draft(const step_shape& step, const conformance_options& o) {
    if (const auto* t = std::get_if<specdec::tree>(&step)) return t->shape.depth();
    return o.gamma;
}

/// "tree 2,2,1,1 (14 nodes)".
inline std::string shape_text(const tree_shape& shape) {
    std::string s = "tree ";
    for (std::size_t d = 0; d < shape.depth(); ++d) {  // appended piece by piece (GCC 12's -Wrestrict)
        if (d) s += ',';
        s += std::to_string(shape.branching[d]);
    }
    s += " (";
    s += std::to_string(shape.nodes());
    s += " nodes)";
    return s;
}

inline const char* tree_scheme_text(tree_verification_scheme s) {
    return s == tree_verification_scheme::traversal ? "traversal verification" : "recursive rejection sampling";
}

/// Softmax at temperature 1, in double; `problem` names what makes the logits invalid.
struct distribution {
    std::vector<double> p;
    std::string problem;
};

inline distribution to_distribution(const Eigen::Ref<const Eigen::VectorXf>& z) {
    distribution d;
    double mx = -std::numeric_limits<double>::infinity();
    for (Eigen::Index i = 0; i < z.size(); ++i) {
        const double v = z[i];
        if (std::isnan(v) || v == std::numeric_limits<double>::infinity()) {
            d.problem = "logit " + std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : "+Inf");
            return d;
        }
        mx = std::max(mx, v);
    }
    if (mx == -std::numeric_limits<double>::infinity()) {
        d.problem = "every logit is -Inf";
        return d;
    }
    d.p.resize(static_cast<std::size_t>(z.size()));
    double sum = 0.0;
    for (Eigen::Index i = 0; i < z.size(); ++i) sum += d.p[static_cast<std::size_t>(i)] = std::exp(z[i] - mx);
    for (double& x : d.p) x /= sum;
    return d;
}

inline double total_variation(const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(a[i] - b[i]);
    return 0.5 * s;
}

/// The logits the library reads for the token after `context` when it samples from the target
/// alone: next_logits, or for a BatchVerifier without it score(context, {}).
template <Verifier M>
Eigen::VectorXf single_logits(M& m, std::span<const token_id> context) {
    if constexpr (LanguageModel<M>) {
        return m.next_logits(context);
    } else {
        Eigen::MatrixXf s = m.score(context, std::span<const token_id>{});
        if (s.cols() != 1)
            specdec::detail::fail_invalid("specdec::testing: score(context, {}) returned ", s.cols(), " columns; expected 1");
        return s.col(0);
    }
}

/// Models the checks drive: one sequence's (Drafter, TreeDrafter; Verifier) or many sequences'
/// (MultiSequenceDrafter; MultiSequenceVerifier, MultiSequenceTreeVerifier).
template <class D>
concept kit_drafter = Drafter<D> || TreeDrafter<D> || MultiSequenceDrafter<D>;
template <class V>
concept kit_target = Verifier<V> || MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>;
template <class M>
concept multi_sequence_model = MultiSequenceVerifier<M> || MultiSequenceTreeVerifier<M> || MultiSequenceDrafter<M>;

/// A multi-sequence verifier as one sequence's LanguageModel: next_logits(context) is the one
/// column of a pass with that request alone (slot 0, no draft; an empty tree for a verifier of
/// trees only). What plain sampling from the target, and the exact law of the equivalence
/// check, read from a target that has no next_logits or score of its own.
template <class V>
    requires(MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>)
struct one_sequence_view {
    V* model;
    packed_logits out{};
    std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(model->vocab_size()); }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        if constexpr (MultiSequenceVerifier<V>) {
            const score_request r{0, context, {}};
            out.shape(vocab_size(), std::span<const score_request>(&r, 1));
            model->score_batch(std::span<const score_request>(&r, 1), out);
        } else {
            const draft_tree none;
            const tree_score_request r{0, context, &none};
            out.shape(vocab_size(), std::span<const tree_score_request>(&r, 1));
            model->score_tree_batch(std::span<const tree_score_request>(&r, 1), out);
        }
        return out.sequence(0).col(0);
    }
};

/// The target as plain sampling reads it: itself when it is a Verifier, else its one-sequence view.
template <kit_target V>
decltype(auto) plain_target(V& v) {
    if constexpr (Verifier<V>) return (v);
    else return one_sequence_view<V>{&v};
}

/// A random draft tree for a context with `room` tokens left: up to `levels` levels, 1 to 3
/// children of the root and 0 to 3 of each other node, at most min(room, 3 * levels) nodes,
/// random tokens (siblings may repeat, as i.i.d. draws do).
inline draft_tree random_tree(std::mt19937_64& rng, std::ptrdiff_t vocab, std::size_t levels, std::size_t room) {
    auto uniform = [&](std::size_t lo, std::size_t hi) { return lo + static_cast<std::size_t>(rng() % (hi - lo + 1)); };
    draft_tree t;
    const std::size_t depth = uniform(0, std::min(levels, room));
    const std::size_t cap = std::min(room, 3 * levels);
    std::size_t begin = 0, end = 0;
    for (std::size_t d = 0; d < depth && t.size() < cap; ++d) {
        const std::size_t parents = d == 0 ? 1 : end - begin;
        for (std::size_t k = 0; k < parents && t.size() < cap; ++k) {
            const std::int32_t parent = d == 0 ? -1 : static_cast<std::int32_t>(begin + k);
            const std::size_t children = uniform(d == 0 ? 1 : 0, 3);
            for (std::size_t j = 0; j < children && t.size() < cap; ++j)
                t.add(parent, static_cast<token_id>(rng() % static_cast<std::uint64_t>(vocab)));
        }
        begin = d == 0 ? 0 : end;
        end = t.size();
        if (begin == end) break;
    }
    return t;
}

/// The sequences of a simulated batch across passes, as a serving loop keeps them: sequences
/// join (in the lowest free slot, so freed slots are reused; some sharing a prefix with a live
/// sequence), leave (at random, or when their context is full), and are sent in any order.
class batch_schedule {
public:
    using seq = std::vector<token_id>;
    struct member {
        std::size_t id, slot, joined;  // joined: the pass it joined at
        std::string origin;            // where its slot came from
        seq context;
    };

    batch_schedule(std::mt19937_64& rng, std::ptrdiff_t vocab, const conformance_options& o)
        : rng_(rng), vocab_(vocab), o_(o) {}

    std::vector<member> live;

    /// An empty batch, no history: each part of the check starts from here.
    void reset() {
        live.clear();
        next_id_ = 0;
        freed_by_.clear();
        leaves_.clear();
    }

    /// Before pass `pass`: sequences leave and join; contexts leave `room` tokens to max_context.
    void churn(std::size_t pass, std::size_t room) {
        const std::size_t lo = o_.prompt.size() + 1;
        const std::size_t hi = o_.max_context > lo + 1 + room ? o_.max_context - room : lo + 1;
        for (auto it = live.begin(); it != live.end();) {
            if (it->context.size() > hi || (pass > 0 && rng_() % 5 == 0)) {
                leaves_.push_back({pass, "sequence #" + std::to_string(it->id) + " left slot " +
                                             std::to_string(it->slot) + " before pass " + std::to_string(pass)});
                freed_by_[it->slot] = it->id;
                it = live.erase(it);
            } else {
                ++it;
            }
        }
        const std::size_t cap = std::max<std::size_t>(o_.batch, 1);
        const std::size_t want = rng_() % 2 == 0 ? cap : 1 + static_cast<std::size_t>(rng_() % cap);
        while (live.size() < want) join(pass, hi);
    }

    /// The order of the requests: live order, or shuffled.
    std::vector<std::size_t> order() {
        std::vector<std::size_t> out(live.size());
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = i;
        if (rng_() % 3 == 0) std::shuffle(out.begin(), out.end(), rng_);
        return out;
    }

    /// "sequence #5 in slot 3 (joined at pass 4 in the slot sequence #2 left), context of 17 tokens [...]".
    std::string describe(const member& m) const {
        return "sequence #" + std::to_string(m.id) + " in slot " + std::to_string(m.slot) + " (joined at pass " +
               std::to_string(m.joined) + " in " + m.origin + "), context of " + std::to_string(m.context.size()) +
               " tokens " + tokens_text(m.context);
    }

    /// Sequences that left while `m` was in the batch, or left its slot before it: the likeliest
    /// cause when its results depend on more than its request.
    std::string leaves_seen_by(const member& m) const {
        std::string s;
        std::size_t n = 0;
        for (auto it = leaves_.rbegin(); it != leaves_.rend() && it->first >= m.joined && n < 3; ++it, ++n)
            s += (s.empty() ? "" : "; ") + it->second;
        return s;
    }

private:
    void join(std::size_t pass, std::size_t hi) {
        std::size_t slot = 0;
        while (std::any_of(live.begin(), live.end(), [&](const member& m) { return m.slot == slot; })) ++slot;
        const auto f = freed_by_.find(slot);
        member m{next_id_++, slot, pass,
                 f == freed_by_.end() ? std::string("a slot not used before")
                                      : "the slot sequence #" + std::to_string(f->second) + " left",
                 o_.prompt};
        const std::size_t lo = o_.prompt.size() + 1;
        const std::size_t len = lo + static_cast<std::size_t>(rng_() % ((lo + hi) / 2 - lo + 1));
        if (!live.empty() && rng_() % 3 == 0) {  // a prefix shared with a live sequence
            const seq& other = live[static_cast<std::size_t>(rng_() % live.size())].context;
            const std::size_t keep = std::min(other.size(), std::max(lo, len - 1));
            m.context.assign(other.begin(), other.begin() + static_cast<std::ptrdiff_t>(keep));
            m.origin += ", sharing its first " + std::to_string(keep) + " tokens with a live sequence";
        }
        const std::size_t size = std::max(len, m.context.size() + 1);  // at least one token of its own
        while (m.context.size() < size)
            m.context.push_back(static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)));
        live.push_back(std::move(m));
    }

    std::mt19937_64& rng_;
    std::ptrdiff_t vocab_;
    const conformance_options& o_;
    std::size_t next_id_ = 0;
    std::map<std::size_t, std::size_t> freed_by_;                 // slot -> the sequence that last left it
    std::vector<std::pair<std::size_t, std::string>> leaves_;     // (pass, what left)
};


/// The adapter-contract check (see check_contract).
template <Verifier M, class Make>
class contract_runner {
public:
    contract_runner(M& model, Make& make, const conformance_options& o)
        : model_(model), make_(make), o_(o), rng_(o.seed) {
        vocab_ = static_cast<std::ptrdiff_t>(model.vocab_size());
        r_.check = "adapter contract";
        r_.max_error = 0.0;
    }

    report run() {
        const auto t0 = std::chrono::steady_clock::now();
        if (vocab_ <= 0) {
            fail("vocab_size() = " + std::to_string(vocab_) + " must be positive");
        } else if (o_.max_context < o_.prompt.size() + max_draft() + 2) {
            fail("max_context = " + std::to_string(o_.max_context) + " leaves no room for a context after the " +
                 std::to_string(o_.prompt.size()) + "-token prompt and a draft of " + std::to_string(max_draft()));
        } else {
            for (token_id t : o_.prompt)
                if (t < 0 || t >= vocab_) {
                    fail("the prompt's token " + std::to_string(t) + " is outside [0, " + std::to_string(vocab_) + ")");
                    break;
                }
            if (r_.passed) scenarios();
        }
        std::string reached;
        for (const char* s : reached_) reached += std::string(reached.empty() ? "" : ", ") + s;
        r_.ran = std::to_string(columns_) + " logit vectors compared with a fresh model's (" + std::to_string(calls_) +
                 " calls; scenarios: " + reached + "; draft lengths 0.." + std::to_string(max_draft()) +
                 ", contexts up to " + std::to_string(o_.max_context) + " tokens), tolerance " +
                 number(o_.tolerance) + " in total variation";
        r_.seconds = seconds_between(t0);
        return r_;
    }

private:
    using seq = std::vector<token_id>;

    std::size_t max_draft() const { return longest_draft(o_.decode.step, o_) + 1; }

    void fail(std::string why) {
        if (!r_.passed) return;
        r_.passed = false;
        r_.failure = std::move(why);
    }

    token_id random_token() { return static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)); }
    std::size_t uniform(std::size_t lo, std::size_t hi) {  // in [lo, hi]
        return lo + static_cast<std::size_t>(rng_() % static_cast<std::uint64_t>(hi - lo + 1));
    }
    std::size_t min_len() const { return o_.prompt.size() + 1; }
    seq random_sequence(std::size_t len) {
        seq s = o_.prompt;
        while (s.size() < len) s.push_back(random_token());
        return s;
    }
    seq random_draft(std::size_t room) {
        seq d;
        const std::size_t n = uniform(0, std::min(max_draft(), room));
        for (std::size_t i = 0; i < n; ++i) d.push_back(random_token());
        return d;
    }

    /// A fresh model's distribution after `s` (memoized).
    const std::vector<double>& reference(const seq& s) {
        auto it = refs_.find(s);
        if (it != refs_.end()) return it->second;
        auto fresh = make_();
        const Eigen::VectorXf z = single_logits(fresh, s);
        distribution d;
        if (z.size() != vocab_)
            d.problem = "returned " + std::to_string(z.size()) + " logits; vocab_size() is " + std::to_string(vocab_);
        else
            d = to_distribution(z);
        if (!d.problem.empty()) {
            fail("a fresh model's logits after " + tokens_text(s) + " are invalid: " + d.problem);
            d.p.assign(static_cast<std::size_t>(vocab_), 1.0 / static_cast<double>(vocab_));
        }
        return refs_.emplace(s, std::move(d.p)).first->second;
    }

    /// Compares logits `z` that should follow `prefix` with a fresh model's. `what` names the
    /// call; `where` the scenario and history. On a mismatch, looks for the prefix one token
    /// shorter or longer that they do match (logits shifted by one position).
    bool compare(const Eigen::VectorXf& z, const seq& prefix, const seq& longer, const std::string& what,
                 const std::string& where) {
        ++columns_;
        if (z.size() != vocab_) {
            fail(what + " returned " + std::to_string(z.size()) + " logits; vocab_size() is " + std::to_string(vocab_) +
                 " (" + where + ")");
            return false;
        }
        const auto d = to_distribution(z);
        if (!d.problem.empty()) {
            fail(what + " after " + tokens_text(prefix) + ": " + d.problem + " (" + where + ")");
            return false;
        }
        const auto& ref = reference(prefix);
        if (!r_.passed) return false;
        const double e = total_variation(d.p, ref);
        r_.max_error = std::max(r_.max_error, e);
        if (e <= o_.tolerance) return true;
        std::string why = what + " after " + std::to_string(prefix.size()) + " tokens " + tokens_text(prefix) +
                          " differs from a fresh model's logits for the same tokens: total variation " + number(e) +
                          " > tolerance " + number(o_.tolerance) + " (" + where + ")";
        const std::size_t unhinted = why.size();
        if (prefix.size() >= 2) {
            const seq shorter(prefix.begin(), prefix.end() - 1);
            if (total_variation(d.p, reference(shorter)) <= o_.tolerance)
                why += "; they equal the logits after the first " + std::to_string(shorter.size()) +
                       " tokens: shifted by one position (the logits of position i returned for position i+1; "
                       "check the offset where the scores are sliced)";
        }
        if (longer.size() == prefix.size() + 1 && total_variation(d.p, reference(longer)) <= o_.tolerance)
            why += "; they equal the logits after " + std::to_string(longer.size()) +
                   " tokens: shifted by one position (the logits of position i+1 returned for position i; "
                   "check the offset where the scores are sliced)";
        if (why.size() == unhinted && e < rounding_like_error) why += rounding_hint(e);
        fail(std::move(why));
        return false;
    }

    /// One call the library would make: score(context, draft) (score_into when the verifier has
    /// it) for a BatchVerifier, next_logits per position otherwise; every column is compared.
    /// Sometimes also next_logits(context) alone, which autoregressive_decode calls.
    bool probe(M& m, const seq& context, const seq& draft, const std::string& where, seq& last) {
        ++calls_;
        seq full = context;
        full.insert(full.end(), draft.begin(), draft.end());
        if constexpr (BatchVerifier<M>) {
            Eigen::MatrixXf s;
            if constexpr (InPlaceBatchVerifier<M>) {
                m.score_into(context, draft, scratch_);
                s = scratch_;
            } else {
                s = m.score(context, draft);
            }
            if (s.rows() != vocab_ || s.cols() != static_cast<Eigen::Index>(draft.size() + 1)) {
                fail("score(context of " + std::to_string(context.size()) + " tokens, draft of " +
                     std::to_string(draft.size()) + ") returned " + std::to_string(s.rows()) + " x " +
                     std::to_string(s.cols()) + "; expected " + std::to_string(vocab_) + " x " +
                     std::to_string(draft.size() + 1) + " (" + where + ")");
                return false;
            }
            for (std::size_t j = 0; j <= draft.size(); ++j) {
                const seq prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j));
                const seq longer(full.begin(),
                                 full.begin() + static_cast<std::ptrdiff_t>(context.size() + std::min(j + 1, draft.size())));
                const Eigen::VectorXf col = s.col(static_cast<Eigen::Index>(j));
                if (!compare(col, prefix, longer,
                             "score(context of " + std::to_string(context.size()) + " tokens, draft of " +
                                 std::to_string(draft.size()) + ") column " + std::to_string(j),
                             where))
                    return false;
            }
            last = full;
        }
        if constexpr (LanguageModel<M>) {
            // Without score(), the library calls next_logits once per position (model_verifier).
            const std::size_t upto = BatchVerifier<M> ? (rng_() % 2 == 0 ? 0 : 1) : draft.size() + 1;
            for (std::size_t j = 0; j < upto; ++j) {
                const seq prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j));
                const seq longer(full.begin(),
                                 full.begin() + static_cast<std::ptrdiff_t>(context.size() + std::min(j + 1, draft.size())));
                const Eigen::VectorXf z = m.next_logits(prefix);
                if (!compare(z, prefix, longer, "next_logits(" + std::to_string(prefix.size()) + " tokens)", where))
                    return false;
                last = prefix;
            }
        }
        return true;
    }

    static std::size_t common_prefix(const seq& a, const seq& b) {
        std::size_t k = 0;
        while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
        return k;
    }

    /// How `context` relates to what the model last held, in words.
    static std::string history(const seq& last, const seq& context) {
        const std::size_t k = common_prefix(last, context);
        std::string s = "the model last held " + std::to_string(last.size()) + " tokens; this context has " +
                        std::to_string(context.size()) + " and shares the first " + std::to_string(k) + " of them";
        if (last.empty()) return s;
        if (k == last.size()) return s + ", a plain continuation";
        if (k == context.size())
            return s + ": it is a prefix of what the model held (is the cache cut back when the context gets "
                       "shorter?)";
        return s + ", then differs: " + std::to_string(last.size() - k) +
               " held tokens are dropped for other ones, as after a rejected draft (does the cache roll back to "
               "the longest common prefix of what it holds and the new context?)";
    }

    /// The next context of a sequence whose last call held `last` (context + draft): a
    /// rejection at a random draft position (or all accepted, with `accept_all`), plus a
    /// correction or bonus token. Starts over when the maximum length is near.
    seq next_context(const seq& context, const seq& draft, bool accept_all) {
        seq next = context;
        std::size_t k = draft.size();
        if (!accept_all && !draft.empty()) k = uniform(0, draft.size() - 1);
        next.insert(next.end(), draft.begin(), draft.begin() + static_cast<std::ptrdiff_t>(k));
        token_id c = random_token();
        if (k < draft.size() && vocab_ > 1)
            while (c == draft[k]) c = random_token();  // a correction differs from the rejected token
        next.push_back(c);
        return next;
    }

    void scenarios() {
        const std::size_t lo = min_len(), hi = o_.max_context - max_draft();
        M& a = model_;
        seq last;  // what `a` was last called with

        reached_.push_back("independent copies");
        // 0. Copies must not share mutable state: a call on a copy must not change another's answer.
        {
            const seq c1 = random_sequence(uniform(lo, (lo + hi) / 2)), c2 = random_sequence(hi);
            const auto before = to_distribution(single_logits(a, c1));
            if (!before.problem.empty()) return fail("next logits after " + tokens_text(c1) + ": " + before.problem);
            {
                auto b = copy_of(a);
                (void)single_logits(b, c2);
            }
            (void)reference(c2);
            const auto after = to_distribution(single_logits(a, c1));
            calls_ += 3;
            if (!after.problem.empty() || total_variation(before.p, after.p) > o_.tolerance)
                return fail("the same call on the same model gave different logits after a copy of it (or a fresh "
                            "model) ran on another context: total variation " +
                            (after.problem.empty() ? number(total_variation(before.p, after.p)) : after.problem) +
                            ". The copies share mutable state (a KV cache or buffer behind a pointer, a static), "
                            "or the model has hidden randomness");
            last = c1;
        }

        reached_.push_back("a fresh model");
        // 1. A fresh model (as given, or as made), then the same call repeated.
        {
            auto fresh = make_();
            seq fresh_last;
            const seq c = random_sequence(uniform(lo, hi));
            const seq d = random_draft(o_.max_context - c.size());
            if (!probe(fresh, c, d, "the first call on a fresh model", fresh_last)) return;
            if (!probe(fresh, c, d, "the same call repeated on that model", fresh_last)) return;
        }
        reached_.push_back("a growing context");
        // 2. A growing context: every draft accepted, plus a bonus token (continuing from c1).
        seq context = last;
        seq draft;
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            if (context.size() > hi) break;
            draft = random_draft(o_.max_context - context.size());
            if (!probe(a, context, draft, "a growing context, every draft accepted; " + history(last, context), last))
                return;
            context = next_context(context, draft, true);
        }
        reached_.push_back("rejections");
        // 3. Rejections: the context keeps a random prefix of the last draft, then a correction.
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            if (context.size() > hi) context = random_sequence(uniform(lo, (lo + hi) / 2));
            draft = random_draft(o_.max_context - context.size());
            // At least one draft token, so that there is something to reject.
            if (draft.empty() && context.size() < o_.max_context) draft.push_back(random_token());
            if (!probe(a, context, draft,
                       "after rejections: each context keeps part of the last draft, then a correction; " +
                           history(last, context),
                       last))
                return;
            context = next_context(context, draft, false);
        }
        reached_.push_back("shrinking contexts");
        // 4. The context shrinks (a new request with the same start), then grows again.
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            const std::size_t keep = uniform(lo, std::max(lo, std::min(context.size(), hi) - 1));
            context.resize(std::min(keep, context.size()));
            while (context.size() < lo) context.push_back(random_token());
            if (i % 2 == 1) context.push_back(random_token());
            draft = random_draft(o_.max_context - context.size());
            if (!probe(a, context, draft,
                       "shrinking contexts; " + history(last, context),
                       last))
                return;
        }
        reached_.push_back("arbitrary order");
        // 5. Arbitrary order: unrelated contexts, and earlier ones again.
        std::vector<seq> seen;
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            if (!seen.empty() && rng_() % 2 == 0)
                context = seen[static_cast<std::size_t>(rng_() % seen.size())];
            else
                context = random_sequence(uniform(lo, hi));
            seen.push_back(context);
            draft = random_draft(o_.max_context - context.size());
            if (!probe(a, context, draft,
                       "calls on unrelated contexts in arbitrary order; " + history(last, context),
                       last))
                return;
        }
        reached_.push_back("two copies in turn");
        // 6. Two copies on different sequences, used in turn (as a batch of sequences).
        {
            auto b = copy_of(a);
            seq last_b = last, ctx_a = random_sequence(uniform(lo, hi)), ctx_b = random_sequence(uniform(lo, hi));
            for (std::size_t i = 0; i < o_.contract_calls; ++i) {
                const bool on_a = i % 2 == 0;
                seq& ctx = on_a ? ctx_a : ctx_b;
                if (ctx.size() > hi) ctx = random_sequence(uniform(lo, (lo + hi) / 2));
                draft = random_draft(o_.max_context - ctx.size());
                const std::string who = on_a ? "the original" : "the copy";
                if (!probe(on_a ? a : b, ctx, draft,
                           "two copies of one model used in turn on different sequences, this call on " + who +
                               " (do the copies share a cache or buffer?); " + history(on_a ? last : last_b, ctx),
                           on_a ? last : last_b))
                    return;
                ctx = next_context(ctx, draft, false);
            }
        }
        if constexpr (TreeVerifier<M>) {
            if (std::holds_alternative<specdec::tree>(o_.decode.step)) tree_steps();
        }
    }

    /// A random tree for a context with `room` tokens left before max_context: every node fits
    /// (context + nodes <= max_context, as an engine whose window holds the whole tree needs).
    draft_tree random_tree(std::size_t room) { return detail::random_tree(rng_, vocab_, max_draft(), room); }

    /// One score_tree(context, tree) call (TreeVerifier 1-2): column 0 must be a fresh model's
    /// logits after the context, column i + 1 those after the context + node i's path. A column
    /// that matches the context + every node before it in index order instead points at the
    /// attention mask.
    bool probe_tree(M& m, const seq& context, const draft_tree& tree, const std::string& where) {
        ++calls_;
        Eigen::MatrixXf s;
        m.score_tree(std::span<const token_id>(context), tree, s);
        const std::string call = "score_tree(context of " + std::to_string(context.size()) + " tokens, tree of " +
                                 std::to_string(tree.size()) + " nodes)";
        if (s.rows() != vocab_ || s.cols() != static_cast<Eigen::Index>(tree.size() + 1)) {
            fail(call + " returned " + std::to_string(s.rows()) + " x " + std::to_string(s.cols()) + "; expected " +
                 std::to_string(vocab_) + " x " + std::to_string(tree.size() + 1) + " (" + where + ")");
            return false;
        }
        std::vector<token_id> path;
        for (std::size_t c = 0; c <= tree.size(); ++c) {
            path_tokens(tree, static_cast<std::int32_t>(c) - 1, path);
            seq prefix = context;
            prefix.insert(prefix.end(), path.begin(), path.end());
            const Eigen::VectorXf col = s.col(static_cast<Eigen::Index>(c));
            const std::string what =
                call + " column " + std::to_string(c) +
                (c == 0 ? std::string(" (the root)")
                        : " (node " + std::to_string(c - 1) + " at depth " + std::to_string(path.size()) + ")");
            if (compare(col, prefix, prefix, what, where)) continue;
            // Node c - 1 read as if the tree were a chain of the nodes in index order: it attends
            // to earlier nodes that are not its ancestors.
            seq in_order = context;
            in_order.insert(in_order.end(), tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(c));
            if (c > 0 && in_order != prefix && r_.failure.find("differs from a fresh model's logits") != std::string::npos) {
                const auto d = to_distribution(col);
                if (d.problem.empty() && total_variation(d.p, reference(in_order)) <= o_.tolerance)
                    r_.failure += "; they equal the logits after the context and every node before it in index "
                                  "order: the node attends to nodes that are not its ancestors (check the tree "
                                  "attention mask: node i may see the context, its ancestors and itself only)";
            }
            return false;
        }
        return true;
    }

    /// 7. score_tree as tree decoding calls it (TreeVerifier 3): requests on fresh models, each
    ///    call's context the last one, then the path to an accepted node of its tree (or none),
    ///    then one more token.
    void tree_steps() {
        reached_.push_back("tree steps");
        const std::size_t lo = min_len(), hi = o_.max_context - max_draft();
        std::size_t calls = 0;
        while (calls < o_.contract_calls) {
            auto m = make_();
            seq context = random_sequence(uniform(lo, (lo + hi) / 2));
            bool first = true;
            while (calls < o_.contract_calls && context.size() < o_.max_context) {
                ++calls;
                const draft_tree tree = random_tree(o_.max_context - context.size());
                if (!probe_tree(m, context, tree,
                                first ? std::string("the first score_tree call on a fresh model")
                                      : std::string("tree steps: each context is the last one, then the path to "
                                                    "the accepted node of its tree, then one more token")))
                    return;
                first = false;
                std::vector<token_id> path;
                path_tokens(tree, static_cast<std::int32_t>(uniform(0, tree.size())) - 1, path);
                context.insert(context.end(), path.begin(), path.end());
                context.push_back(random_token());
            }
        }
    }

    auto copy_of(M& m) {
        if constexpr (std::copy_constructible<M>)
            return M(m);
        else
            return make_();
    }

    M& model_;
    Make& make_;
    const conformance_options& o_;
    std::mt19937_64 rng_;
    std::ptrdiff_t vocab_ = 0;
    report r_;
    std::size_t columns_ = 0, calls_ = 0;
    std::map<seq, std::vector<double>> refs_;
    Eigen::MatrixXf scratch_;
    std::vector<const char*> reached_;  // the scenarios begun
};

/// The probability integral transform of token x under q, in the order of decreasing
/// probability (ties by index): F(x) = Σ_{y before x} q(y); u = F(x) + v q(x) with v uniform
/// in [0, 1) is uniform on [0, 1) exactly when x was drawn from q (randomized PIT). Ordering by
/// probability makes the test sensitive to a draw that is too peaked or too flat (a
/// temperature applied differently), whatever the token ids.
inline double randomized_pit(const Eigen::Ref<const Eigen::VectorXf>& probs, double scale, Eigen::Index x, double v) {
    const double qx = scale * probs[x];
    double before = 0.0;
    for (Eigen::Index y = 0; y < probs.size(); ++y) {
        const double qy = scale * probs[y];
        if (qy > qx || (qy == qx && y < x)) before += qy;
    }
    return std::clamp(before + v * qx, 0.0, std::nextafter(1.0, 0.0));
}

inline std::string sampling_text(const sampling_config& s) {
    std::string t = "temperature " + number(s.temperature);
    if (s.top_k > 0) t += ", top-k " + std::to_string(s.top_k);
    if (s.top_p < 1.0f) t += ", top-p " + number(s.top_p);
    if (s.min_p > 0.0f) t += ", min-p " + number(s.min_p);
    return t;
}

inline const char* scheme_text(verification_scheme s) {
    return s == verification_scheme::token ? "token verification" : "block verification";
}

/// A Drafter as the library drafts with it: a BlockDrafter as it is, a plain LanguageModel
/// through model_drafter (and, below, a MultiSequenceDrafter through draft_batch).
template <class D>
struct as_block_drafter {
    explicit as_block_drafter(D& d) : d_(&d) {}
    void draft(std::span<const token_id> c, std::size_t gamma, const sampling_config& s, uniform_source& u,
               draft_block& out) {
        d_->draft(c, gamma, s, u, out);
    }
    D* d_;
};
template <Drafter D>
    requires(!BlockDrafter<D>)
struct as_block_drafter<D> {
    explicit as_block_drafter(D& d) : m_(d) {}
    void draft(std::span<const token_id> c, std::size_t gamma, const sampling_config& s, uniform_source& u,
               draft_block& out) {
        m_.draft(c, gamma, s, u, out);
    }
    model_drafter<D> m_;
};

/// Which of a model's multi-sequence functions the check drives (of those it models).
struct multi_sequence_parts {
    bool scores = true;  ///< score_batch and score_tree_batch
    bool drafts = true;  ///< draft_batch
};

/// The multi-sequence contract check (see check_multi_sequence_contract).
template <class M, class Make>
class multi_sequence_runner {
public:
    using seq = std::vector<token_id>;
    using member = batch_schedule::member;
    multi_sequence_runner(M& model, Make& make, const conformance_options& o, multi_sequence_parts p)
        : model_(model), make_(make), o_(o), parts_(p), rng_(o.seed ^ 0x5851f42d4c957f2dULL),
          vocab_(static_cast<std::ptrdiff_t>(model.vocab_size())), batch_(rng_, vocab_, o) {
        r_.check = "multi-sequence contract";
        r_.max_error = 0.0;
    }

    report run() {
        const auto t0 = std::chrono::steady_clock::now();
        if (vocab_ <= 0) fail("vocab_size() = " + std::to_string(vocab_) + " must be positive");
        else if (o_.max_context < o_.prompt.size() + max_draft() + 3)
            fail("max_context = " + std::to_string(o_.max_context) + " leaves no room for a context after the " +
                 std::to_string(o_.prompt.size()) + "-token prompt and a draft of " + std::to_string(max_draft()));
        for (token_id t : o_.prompt)
            if (t < 0 || t >= vocab_) fail("the prompt's token " + std::to_string(t) + " is outside the vocabulary");
        if constexpr (MultiSequenceVerifier<M>)
            if (parts_.scores && r_.passed) chain_passes();
        if constexpr (MultiSequenceTreeVerifier<M>)
            if (parts_.scores && r_.passed) tree_passes();
        if constexpr (MultiSequenceDrafter<M>)
            if (parts_.drafts && r_.passed) draft_passes();
        r_.ran = (ran_.empty() ? std::string("no pass") : ran_) + "; up to " + std::to_string(std::max<std::size_t>(o_.batch, 1)) +
                 " sequences a pass, joining, leaving, in reused slots, in any order, some sharing a prefix; "
                 "tolerance " + number(o_.tolerance) + " in total variation";
        r_.seconds = seconds_between(t0);
        return r_;
    }

private:
    std::size_t max_draft() const { return longest_draft(o_.decode.step, o_) + 1; }
    /// Passes of score_batch; score_tree_batch and draft_batch run half as many (their
    /// references cost more).
    std::size_t passes() const { return 2 * std::max<std::size_t>(o_.contract_calls, 1); }
    std::size_t uniform(std::size_t lo, std::size_t hi) {
        return lo + static_cast<std::size_t>(rng_() % static_cast<std::uint64_t>(hi - lo + 1));
    }
    void fail(std::string why) {
        if (!r_.passed) return;
        r_.passed = false;
        r_.failure = std::move(why);
    }
    void add_ran(const std::string& s) { ran_ += (ran_.empty() ? "" : "; ") + s; }

    /// A ragged draft: empty a quarter of the time, else 0 to max_draft() random tokens.
    seq random_draft(const seq& context) {
        seq d;
        if (rng_() % 4 == 0) return d;
        const std::size_t n = uniform(0, std::min(max_draft(), o_.max_context - context.size()));
        for (std::size_t i = 0; i < n; ++i) d.push_back(static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)));
        return d;
    }

    /// The next context of a sequence: its draft accepted up to a random rejection (or all of
    /// it, half of the time), then a correction or bonus token.
    seq next_context(const seq& context, std::span<const token_id> draft) {
        seq next = context;
        std::size_t k = draft.size();
        if (rng_() % 2 == 0 && !draft.empty()) k = uniform(0, draft.size() - 1);
        next.insert(next.end(), draft.begin(), draft.begin() + static_cast<std::ptrdiff_t>(k));
        token_id c = static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_));
        if (k < draft.size() && vocab_ > 1)
            while (c == draft[k]) c = static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_));
        next.push_back(c);
        return next;
    }

    /// The logits of context + draft[0..j) for every j, from a fresh model that sees this request
    /// alone: its next_logits or score when it has them, else a pass with this one request in
    /// slot 0 (a chain as a tree for a verifier of trees only).
    Eigen::MatrixXf alone(const seq& context, const seq& draft) {
        auto fresh = make_();
        if constexpr (BatchVerifier<M>) {
            return fresh.score(std::span<const token_id>(context), std::span<const token_id>(draft));
        } else if constexpr (LanguageModel<M>) {
            Eigen::MatrixXf s(vocab_, static_cast<Eigen::Index>(draft.size() + 1));
            seq prefix = context;
            for (std::size_t j = 0; j <= draft.size(); ++j) {
                s.col(static_cast<Eigen::Index>(j)) = fresh.next_logits(std::span<const token_id>(prefix));
                if (j < draft.size()) prefix.push_back(draft[j]);
            }
            return s;
        } else if constexpr (MultiSequenceVerifier<M>) {
            const score_request r{0, context, draft};
            packed_logits out;
            out.shape(vocab_, std::span<const score_request>(&r, 1));
            fresh.score_batch(std::span<const score_request>(&r, 1), out);
            return out.sequence(0);
        } else {
            draft_tree chain;
            for (std::size_t j = 0; j < draft.size(); ++j) chain.add(static_cast<std::int32_t>(j) - 1, draft[j]);
            const tree_score_request r{0, context, &chain};
            packed_logits out;
            out.shape(vocab_, std::span<const tree_score_request>(&r, 1));
            fresh.score_tree_batch(std::span<const tree_score_request>(&r, 1), out);
            return out.sequence(0);
        }
    }

    /// Makes sure the reference of every prefix context + draft[0..j) is known (memoized).
    void ensure(const seq& context, const seq& draft) {
        seq full = context;
        full.insert(full.end(), draft.begin(), draft.end());
        bool known = true;
        for (std::size_t j = 0; j <= draft.size() && known; ++j)
            known = refs_.count(seq(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j))) > 0;
        if (known) return;
        const Eigen::MatrixXf s = alone(context, draft);
        if (s.rows() != vocab_ || s.cols() != static_cast<Eigen::Index>(draft.size() + 1))
            return fail("the reference (a fresh model, this request alone) returned " + std::to_string(s.rows()) +
                        " x " + std::to_string(s.cols()) + " logits for a draft of " + std::to_string(draft.size()));
        for (std::size_t j = 0; j <= draft.size(); ++j) {
            auto d = to_distribution(s.col(static_cast<Eigen::Index>(j)));
            const seq prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j));
            if (!d.problem.empty()) {
                fail("a fresh model's logits after " + tokens_text(prefix) + " are invalid: " + d.problem);
                d.p.assign(static_cast<std::size_t>(vocab_), 1.0 / static_cast<double>(vocab_));
            }
            refs_.emplace(prefix, std::move(d.p));
        }
    }

    /// Total variation between logits z and the reference after `prefix` (which ensure() made known).
    double error(const distribution& d, const seq& prefix) { return total_variation(d.p, refs_.at(prefix)); }

    /// Logits a wrong column may hold instead, each with what it means.
    struct candidate {
        seq prefix;
        std::string hint;
    };

    /// Compares column z with the reference after `prefix`; on a mismatch fails naming `what`
    /// and the first candidate whose logits z are (else `otherwise`).
    template <class Candidates>
    bool column_ok(const Eigen::VectorXf& z, const seq& prefix, const std::string& what, Candidates candidates,
                   const std::string& otherwise) {
        ++columns_;
        if (z.size() != vocab_) {
            fail(what + " has " + std::to_string(z.size()) + " rows; vocab_size() is " + std::to_string(vocab_));
            return false;
        }
        const auto d = to_distribution(z);
        if (!d.problem.empty()) {
            fail(what + ": " + d.problem);
            return false;
        }
        const double e = error(d, prefix);
        r_.max_error = std::max(r_.max_error, e);
        if (e <= o_.tolerance) return true;
        std::string hint = otherwise;
        bool matched = false;
        for (const auto& c : candidates())
            if (refs_.count(c.prefix) && error(d, c.prefix) <= o_.tolerance) {
                hint = c.hint;
                matched = true;
                break;
            }
        if (!matched && e < rounding_like_error) hint += rounding_hint(e);
        fail(what + " differs from the logits of this request scored alone on a fresh model (after " +
             std::to_string(prefix.size()) + " tokens " + tokens_text(prefix) + "): total variation " + number(e) +
             " > tolerance " + number(o_.tolerance) + "; " + hint);
        return false;
    }

    /// The hint when a wrong column matches no other logits: what happened to the batch while
    /// the sequence was in it.
    std::string history_hint(const member& m) const {
        const std::string left = batch_.leaves_seen_by(m);
        if (!left.empty())
            return "they match no other request's logits; while it was in the batch, " + left +
                   ": it likely reads the cache of another sequence (check the map from slots to KV-cache rows "
                   "when a sequence leaves and rows are compacted or freed, and when a freed slot is reused)";
        if (m.origin.rfind("the slot sequence", 0) == 0)
            return "they match no other request's logits; its slot was left by another sequence: a stale cache "
                   "read (is a slot's cache rolled back to the longest common prefix of what it holds and the new "
                   "context when another sequence takes the slot?)";
        return "they match no other request's logits: the result depends on the other sequences of the pass or "
               "on the slot's earlier contents (each request's logits must depend on that request alone)";
    }

    /// Candidates for column j of request i of a chain pass: another request's columns (the
    /// packed offsets), the neighbouring columns of its own (the offset within the sequence).
    std::vector<candidate> chain_candidates(std::size_t i, std::size_t j, const std::vector<seq>& fulls,
                                            const std::vector<std::size_t>& contexts) const {
        std::vector<candidate> out;
        const auto prefix = [&](std::size_t k, std::size_t c) {
            return seq(fulls[k].begin(), fulls[k].begin() + static_cast<std::ptrdiff_t>(contexts[k] + c));
        };
        for (std::size_t k = 0; k < fulls.size(); ++k)
            for (std::size_t c = 0; k != i && contexts[k] + c <= fulls[k].size(); ++c)
                out.push_back({prefix(k, c), "they are the logits of request " + std::to_string(k) + "'s column " +
                                                 std::to_string(c) +
                                                 ": the columns of another sequence (written at the wrong offset "
                                                 "in the packed scores, off by one sequence? request i owns the "
                                                 "columns out.offset(i) .. out.offset(i) + out.columns(i) - 1)"});
        if (j > 0)
            out.push_back({prefix(i, j - 1), "they are the logits of its own column " + std::to_string(j - 1) +
                                                 ": shifted by one position (check the offset within the sequence)"});
        if (contexts[i] + j + 1 <= fulls[i].size())
            out.push_back({prefix(i, j + 1), "they are the logits of its own column " + std::to_string(j + 1) +
                                                 ": shifted by one position (check the offset within the sequence)"});
        return out;
    }

    /// Appends " slot:n" to the layout of a pass (appends one by one: GCC 12 misreads the
    /// concatenation of temporaries under -Wrestrict).
    static void add_layout(std::string& layout, std::size_t slot, std::size_t n) {
        layout += ' ';
        layout += std::to_string(slot);
        layout += ':';
        layout += std::to_string(n);
    }

    /// "score_batch, pass 3 of 48 (slots 0, 2, 1 with 3, 0, 5 draft tokens), request 1 of 3: sequence #..."
    std::string where(const char* call, std::size_t pass, std::size_t passes, const std::string& layout,
                      std::size_t i, std::size_t n, const member& m) const {
        return std::string(call) + ", pass " + std::to_string(pass) + " of " + std::to_string(passes) + " (" +
               layout + "), request " + std::to_string(i) + " of " + std::to_string(n) + ": " + batch_.describe(m);
    }

    /// After a call: the layout shape() gave `out` is still there.
    template <class Request>
    bool layout_kept(const packed_logits& out, const std::vector<Request>& req, const char* call, std::size_t pass) {
        try {
            specdec::detail::check_packed_layout(out, std::span<const Request>(req), vocab_,
                                                 "specdec::testing::check_multi_sequence_contract", call);
        } catch (const std::invalid_argument& e) {
            fail("pass " + std::to_string(pass) + ": " + e.what());
            return false;
        }
        return true;
    }

    /// score_batch over passes(): each live sequence sends its context and a ragged draft; every
    /// column is compared; then each context takes an accepted prefix of its draft.
    void chain_passes() {
        batch_.reset();
        std::size_t requests = 0, before = columns_;
        packed_logits out;
        for (std::size_t pass = 0; pass < passes() && r_.passed; ++pass) {
            batch_.churn(pass, max_draft());
            const auto order = batch_.order();
            std::vector<seq> drafts, fulls;
            std::vector<std::size_t> contexts;
            std::vector<score_request> req;
            std::string layout = "slot:draft";
            for (std::size_t k : order) drafts.push_back(random_draft(batch_.live[k].context));
            for (std::size_t i = 0; i < order.size(); ++i) {
                const member& m = batch_.live[order[i]];
                req.push_back({m.slot, m.context, drafts[i]});
                fulls.push_back(m.context);
                fulls.back().insert(fulls.back().end(), drafts[i].begin(), drafts[i].end());
                contexts.push_back(m.context.size());
                add_layout(layout, m.slot, drafts[i].size());
            }
            out.shape(vocab_, std::span<const score_request>(req));
            model_.score_batch(std::span<const score_request>(req), out);
            requests += req.size();
            if (!layout_kept(out, req, "score_batch", pass)) return;
            for (std::size_t i = 0; i < req.size(); ++i) ensure(batch_.live[order[i]].context, drafts[i]);
            for (std::size_t i = 0; i < req.size() && r_.passed; ++i) {
                const member& m = batch_.live[order[i]];
                const auto cols = out.sequence(i);
                for (std::size_t j = 0; j <= drafts[i].size(); ++j) {
                    const std::string what = where("score_batch", pass, passes(), layout, i, req.size(), m) + ", draft " +
                                             tokens_text(drafts[i]) + ", column " + std::to_string(j);
                    const seq prefix(fulls[i].begin(), fulls[i].begin() + static_cast<std::ptrdiff_t>(contexts[i] + j));
                    if (!column_ok(cols.col(static_cast<Eigen::Index>(j)), prefix, what,
                                   [&] { return chain_candidates(i, j, fulls, contexts); }, history_hint(m)))
                        break;
                }
            }
            for (std::size_t i = 0; i < order.size(); ++i) {
                member& m = batch_.live[order[i]];
                m.context = next_context(m.context, drafts[i]);
            }
        }
        add_ran("score_batch: " + std::to_string(columns_ - before) + " columns of " + std::to_string(requests) +
                " requests in " + std::to_string(passes()) + " passes compared with " + reference_name());
    }

    static std::string reference_name() {
        if constexpr (BatchVerifier<M>) return "a fresh model's score() of the request alone";
        else if constexpr (LanguageModel<M>) return "a fresh model's next_logits";
        else return "a fresh model's pass with the request alone";
    }

    /// score_tree_batch over passes(): each live sequence sends its context and a random tree
    /// (some without nodes); column c + 1 of a request is compared with the logits after its
    /// context and node c's path; then each context takes the path to a random node and a token.
    void tree_passes() {
        batch_.reset();
        std::size_t requests = 0, before = columns_;
        packed_logits out;
        for (std::size_t pass = 0; pass < passes() / 2 && r_.passed; ++pass) {
            batch_.churn(pass, 3 * max_draft());
            const auto order = batch_.order();
            std::vector<draft_tree> trees;
            std::vector<tree_score_request> req;
            std::string layout = "slot:nodes";
            for (std::size_t k : order) {
                const std::size_t room = o_.max_context - batch_.live[k].context.size();
                trees.push_back(rng_() % 4 == 0 ? draft_tree{} : random_tree(rng_, vocab_, max_draft(), room));
            }
            for (std::size_t i = 0; i < order.size(); ++i) {
                const member& m = batch_.live[order[i]];
                req.push_back({m.slot, m.context, &trees[i]});
                add_layout(layout, m.slot, trees[i].size());
            }
            out.shape(vocab_, std::span<const tree_score_request>(req));
            model_.score_tree_batch(std::span<const tree_score_request>(req), out);
            requests += req.size();
            if (!layout_kept(out, req, "score_tree_batch", pass)) return;
            for (std::size_t i = 0; i < req.size() && r_.passed; ++i)
                check_tree(out.sequence(i), batch_.live[order[i]], trees[i],
                           where("score_tree_batch", pass, passes() / 2, layout, i, req.size(), batch_.live[order[i]]));
            for (std::size_t i = 0; i < order.size(); ++i) {
                member& m = batch_.live[order[i]];
                seq path;
                path_tokens(trees[i], static_cast<std::int32_t>(uniform(0, trees[i].size())) - 1, path);
                m.context.insert(m.context.end(), path.begin(), path.end());
                m.context.push_back(static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)));
            }
        }
        add_ran("score_tree_batch: " + std::to_string(columns_ - before) + " columns of " + std::to_string(requests) +
                " requests in " + std::to_string(passes() / 2) + " passes compared with " + reference_name());
    }

    /// The columns of one request of a tree pass; a column that holds the logits after the
    /// context and every earlier node in index order points at the attention mask.
    void check_tree(const Eigen::Ref<const Eigen::MatrixXf>& cols, const member& m, const draft_tree& tree,
                    const std::string& where) {
        std::vector<seq> paths(tree.size() + 1);
        for (std::size_t c = tree.size() + 1; c-- > 0;) {  // the deepest first: their paths cover their parents
            path_tokens(tree, static_cast<std::int32_t>(c) - 1, paths[c]);
            ensure(m.context, paths[c]);
        }
        for (std::size_t c = 0; c <= tree.size() && r_.passed; ++c) {
            seq prefix = m.context, in_order = m.context;
            prefix.insert(prefix.end(), paths[c].begin(), paths[c].end());
            in_order.insert(in_order.end(), tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(c));
            auto cands = [&] {  // only on a mismatch: a reference more
                std::vector<candidate> out;
                if (c == 0 || in_order == prefix) return out;
                ensure(m.context, seq(tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(c)));
                out.push_back({in_order, "they are the logits after the context and every node before it in index "
                                           "order: the node attends to nodes that are not its ancestors (check the "
                                           "tree attention mask of this sequence: node i may see its context, its "
                                           "ancestors and itself only)"});
                return out;
            };
            const std::string what = where + ", tree of " + std::to_string(tree.size()) + " nodes " +
                                     tokens_text(tree.tokens) + ", column " + std::to_string(c) +
                                     (c == 0 ? std::string(" (the root)")
                                             : " (node " + std::to_string(c - 1) + " at depth " +
                                                   std::to_string(paths[c].size()) + ")");
            if (!column_ok(cols.col(static_cast<Eigen::Index>(c)), prefix, what, cands, history_hint(m))) return;
        }
    }

    /// draft_batch over passes() / 2: each live sequence asks for 0 to max_draft() tokens with a
    /// generator of its own; each block must be what a fresh model drafts for that request alone
    /// with the same uniforms. Sampling configs from o.samplings, one per pass in turn.
    void draft_passes() {
        batch_.reset();
        std::size_t requests = 0;
        const std::size_t total = passes() / 2;
        for (std::size_t pass = 0; pass < total && r_.passed; ++pass) {
            batch_.churn(pass, max_draft());
            const auto order = batch_.order();
            const sampling_config s = o_.samplings.empty() ? sampling_config{} : o_.samplings[pass % o_.samplings.size()];
            const std::size_t n = order.size();
            std::vector<std::uint64_t> seeds(n);
            std::vector<std::mt19937_64> gens;
            gens.reserve(n);  // the requests' uniform_sources point into it
            std::vector<draft_block> blocks(n);
            std::vector<draft_request> req;
            std::string layout = "slot:gamma";
            for (std::size_t i = 0; i < n; ++i) gens.emplace_back(seeds[i] = rng_());
            for (std::size_t i = 0; i < n; ++i) {
                const member& m = batch_.live[order[i]];
                const std::size_t gamma = rng_() % 4 == 0 ? 0 : uniform(1, max_draft());
                req.push_back({m.slot, m.context, gamma, uniform_source(gens[i]), &blocks[i]});
                add_layout(layout, m.slot, gamma);
            }
            model_.draft_batch(std::span<draft_request>(req), s);
            requests += n;
            for (std::size_t i = 0; i < n && r_.passed; ++i)
                check_block(where("draft_batch", pass, total, layout, i, n, batch_.live[order[i]]),
                            batch_.live[order[i]].context, req[i].gamma, seeds[i], gens[i], blocks[i], s);
            for (std::size_t i = 0; i < n; ++i) {
                member& m = batch_.live[order[i]];
                m.context = next_context(m.context, blocks[i].tokens);
            }
        }
        add_ran("draft_batch: " + std::to_string(requests) + " blocks in " + std::to_string(total) +
                " passes compared with a fresh model drafting each request alone with the same uniforms");
    }

    /// One block of a draft pass against the same request drafted alone by a fresh model.
    void check_block(const std::string& where, const seq& context, std::size_t gamma, std::uint64_t seed,
                     const std::mt19937_64& after, const draft_block& got, const sampling_config& s) {
        auto fresh = make_();
        std::mt19937_64 g(seed);
        draft_block want;
        draft_request r{0, context, gamma, uniform_source(g), &want};
        fresh.draft_batch(std::span<draft_request>(&r, 1), s);
        std::string diff = block_difference(got, want);
        if (diff.empty() && g != after)
            diff = "it drew another number of uniforms from its generator than drafting it alone does";
        if (diff.empty()) return;
        fail(where + ", gamma " + std::to_string(gamma) + ", " + sampling_text(s) + ": the block " +
             tokens_text(got.tokens) + " differs from drafting this request alone on a fresh model with the same "
             "uniforms (" + tokens_text(want.tokens) + "): " + diff + "; the block depends on the other requests "
             "of the call (draws from another sequence's uniforms, or one generator for the whole batch? another "
             "sequence's tokens, cache or slot?): sequence i must draw only from requests[i].uniforms, in the "
             "order drafting it alone does");
    }

    /// What differs between two blocks, in words (empty when nothing does).
    std::string block_difference(const draft_block& a, const draft_block& b) const {
        for (std::size_t k = 0; k < std::min(a.tokens.size(), b.tokens.size()); ++k)
            if (a.tokens[k] != b.tokens[k])
                return "token " + std::to_string(k) + " is " + std::to_string(a.tokens[k]) + ", alone " +
                       std::to_string(b.tokens[k]);
        if (a.tokens.size() != b.tokens.size())
            return std::to_string(a.tokens.size()) + " tokens, alone " + std::to_string(b.tokens.size());
        if (a.has_distributions() != b.has_distributions())
            return a.has_distributions() ? "it reports distributions, alone none" : "it reports none, alone some";
        if (!a.has_distributions()) return {};
        if (a.probs.rows() != b.probs.rows() || a.probs.cols() < static_cast<Eigen::Index>(a.tokens.size()) ||
            b.probs.cols() < static_cast<Eigen::Index>(b.tokens.size()))
            return "the distributions are " + std::to_string(a.probs.rows()) + " x " + std::to_string(a.probs.cols()) +
                   ", alone " + std::to_string(b.probs.rows()) + " x " + std::to_string(b.probs.cols());
        for (std::size_t k = 0; k < a.tokens.size(); ++k) {
            const double sa = a.scales.size() > k ? a.scales[k] : 1.0, sb = b.scales.size() > k ? b.scales[k] : 1.0;
            double tv = 0.0;
            for (Eigen::Index y = 0; y < a.probs.rows(); ++y)
                tv += std::abs(sa * a.probs(y, static_cast<Eigen::Index>(k)) - sb * b.probs(y, static_cast<Eigen::Index>(k)));
            if (0.5 * tv > o_.tolerance)
                return "the distribution of token " + std::to_string(k) + " differs by total variation " + number(0.5 * tv);
        }
        return {};
    }

    M& model_;
    Make& make_;
    const conformance_options& o_;
    multi_sequence_parts parts_;
    std::mt19937_64 rng_;
    std::ptrdiff_t vocab_;
    batch_schedule batch_;
    report r_;
    std::string ran_;
    std::size_t columns_ = 0;
    std::map<seq, std::vector<double>> refs_;  // reference distributions after each prefix
};

/// A MultiSequenceDrafter that is no Drafter, as one sequence's BlockDrafter: draft_batch with
/// the one request, in slot 0.
template <class D>
    requires(!Drafter<D> && MultiSequenceDrafter<D>)
struct as_block_drafter<D> {
    explicit as_block_drafter(D& d) : d_(&d) {}
    void draft(std::span<const token_id> c, std::size_t gamma, const sampling_config& s, uniform_source& u,
               draft_block& out) {
        draft_request r{0, c, gamma, u, &out};
        d_->draft_batch(std::span<draft_request>(&r, 1), s);
    }
    D* d_;
};

/// How the χ² test of draft consistency failed, in words: too many draws in the first cells (of
/// the most probable tokens) means the tokens come from a more peaked distribution than the
/// reported q.
/// The χ² test of uniformity of each row of `counts` (randomized PIT values binned, one row per
/// draft position or tree depth), skipping rows with fewer than 5 draws per cell; counts the
/// tests made and keeps the smallest p-value (and its statistic). Returns the first row whose
/// p-value is below `significance` and its test, or a row index of counts.size() when none is.
struct pit_rows_outcome {
    std::size_t failed_row = 0;
    gof_result test{};
    std::size_t draws = 0;
};
inline pit_rows_outcome test_pit_rows(const std::vector<std::vector<std::size_t>>& counts, std::size_t bins,
                                      double significance, std::size_t& tests, double& worst_p, double& worst_stat) {
    const std::vector<double> uniform(bins, 1.0 / static_cast<double>(bins));
    for (std::size_t i = 0; i < counts.size(); ++i) {
        std::size_t n = 0;
        for (auto c : counts[i]) n += c;
        if (n < 5 * bins) continue;  // too few draws in this row for the χ² approximation
        const auto g = chi_square_test(counts[i], uniform);
        ++tests;
        if (g.p_value < worst_p) {
            worst_p = g.p_value;
            worst_stat = g.statistic;
        }
        if (g.p_value < significance) return {i, g, n};
    }
    return {counts.size(), {}, 0};
}

inline std::string pit_direction(const std::vector<std::size_t>& counts) {
    return counts.front() > counts.back()
               ? "the drafted tokens are more concentrated on the likely tokens than q says (drawn at a lower "
                 "temperature than the one reported?)"
               : "the drafted tokens are more spread out than q says (drawn at a higher temperature than the one "
                 "reported, or from another position's q?)";
}

/// Cells per position of the joint test of two consecutive draft positions (4 x 4 cells).
inline constexpr std::size_t joint_bins = 4;

/// The cell of a pair of probability-integral values (both uniform and independent for a correct
/// drafter: each position's randomized PIT under its q given the tokens before it is uniform,
/// whatever those were).
inline std::size_t joint_cell(double first, double second) {
    const auto bin = [](double u) { return std::min(joint_bins - 1, static_cast<std::size_t>(u * joint_bins)); };
    return bin(first) * joint_bins + bin(second);
}

/// How many of the draft check's contexts continue the prompt with the drafter's own samples.
inline std::size_t own_contexts(const conformance_options& o) {
    return o.draft_own_contexts ? std::max<std::size_t>(o.draft_contexts, 1) / 2 : 0;
}

/// The contexts of the draft check: the prompt, then up to max_context − gamma tokens; every
/// second one (draft_own_contexts) continued with the drafter's own samples at the first
/// sampling config (the contexts a draft is confident on: decoding meets them), the others with
/// random tokens. `call(context, sampling, uniforms, block)` drafts one block.
template <class Call>
std::vector<std::vector<token_id>> draft_check_contexts(Call& call, const conformance_options& o, std::size_t gamma,
                                                        std::ptrdiff_t vocab, std::mt19937_64& rng,
                                                        draft_block& block) {
    std::vector<std::vector<token_id>> contexts;
    if (vocab <= 0) return contexts;
    const std::size_t lo = o.prompt.size() + 1, hi = std::max(lo, o.max_context > gamma ? o.max_context - gamma : lo);
    const sampling_config own = o.samplings.empty() ? sampling_config{} : o.samplings.front();
    const auto random_token = [&] { return static_cast<token_id>(rng() % static_cast<std::uint64_t>(vocab)); };
    for (std::size_t i = 0; i < std::max<std::size_t>(o.draft_contexts, 1); ++i) {
        std::vector<token_id> c = o.prompt;
        const std::size_t len = lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
        const bool sampled = o.draft_own_contexts && i % 2 == 1;
        while (c.size() < len) {
            if (!sampled || c.empty()) {
                c.push_back(random_token());
                continue;
            }
            uniform_source u(rng);
            call(c, own, u, block);
            bool valid = !block.tokens.empty();
            for (const token_id t : block.tokens) valid = valid && t >= 0 && t < vocab;
            if (!valid) {
                c.push_back(random_token());  // (what is wrong with such a block is reported below)
                continue;
            }
            for (std::size_t k = 0; k < block.tokens.size() && c.size() < len; ++k) c.push_back(block.tokens[k]);
        }
        contexts.push_back(std::move(c));
    }
    return contexts;
}

/// Draft consistency of a chain drafter: blocks of `gamma` tokens.
template <class D>
    requires(Drafter<D> || MultiSequenceDrafter<D>)
report block_draft_consistency(D& drafter, const conformance_options& o, std::size_t gamma) {
    const auto t0 = std::chrono::steady_clock::now();
    report r;
    r.check = "draft consistency";
    const auto vocab = static_cast<std::ptrdiff_t>(drafter.vocab_size());
    std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
    auto fail = [&](std::string why) {
        if (r.passed) {
            r.passed = false;
            r.failure = std::move(why);
        }
    };
    if (vocab <= 0) fail("vocab_size() = " + std::to_string(vocab) + " must be positive");
    as_block_drafter<D> blocks_of(drafter);
    auto call = [&](const std::vector<token_id>& c, const sampling_config& s, uniform_source& u, draft_block& out) {
        out.clear();
        out.stop_below = 0.0f;
        blocks_of.draft(std::span<const token_id>(c), gamma, s, u, out);
    };
    draft_block block, again;
    const std::vector<std::vector<token_id>> contexts = draft_check_contexts(call, o, gamma, vocab, rng, block);
    std::size_t blocks = 0, point_blocks = 0, tested_tokens = 0, tests = 0, joint_tests = 0;
    double worst_p = 1.0, worst_stat = 0.0;
    for (const sampling_config& s : o.samplings) {
        if (!r.passed) break;
        const std::string config = sampling_text(s);
        const std::size_t bins = std::max<std::size_t>(o.pit_bins, 2);
        std::vector<std::vector<std::size_t>> counts(gamma, std::vector<std::size_t>(bins, 0));
        // The PIT values of positions i and i + 1 of a block, binned jointly (joint_bins² cells).
        std::vector<std::vector<std::size_t>> pairs(gamma > 1 ? gamma - 1 : 0,
                                                    std::vector<std::size_t>(joint_bins * joint_bins, 0));
        std::map<std::vector<token_id>, std::vector<token_id>> point_drafts;  // context -> tokens
        for (std::size_t k = 0; k < o.draft_blocks && r.passed; ++k) {
            // Context by context, so that a drafter with a cache recomputes only the draft positions.
            const auto& c = contexts[k * contexts.size() / o.draft_blocks];
            uniform_source u(rng);
            call(c, s, u, block);
            ++blocks;
            const std::string where = "block " + std::to_string(k + 1) + " after " + tokens_text(c) + ", " + config;
            if (block.tokens.size() > gamma) {
                fail("draft() proposed " + std::to_string(block.tokens.size()) + " tokens; gamma was " +
                     std::to_string(gamma) + " (" + where + ")");
                break;
            }
            for (std::size_t i = 0; i < block.tokens.size(); ++i)
                if (block.tokens[i] < 0 || block.tokens[i] >= vocab) {
                    fail("draft token " + std::to_string(i) + " = " + std::to_string(block.tokens[i]) +
                         " is outside [0, " + std::to_string(vocab) + ") (" + where + ")");
                    break;
                }
            if (!r.passed) break;
            if (!block.has_distributions()) {
                // Point masses: the tokens must be a function of the context alone.
                ++point_blocks;
                auto [it, inserted] = point_drafts.emplace(c, block.tokens);
                if (!inserted && it->second != block.tokens)
                    fail("a drafter without distributions (point masses) proposed " + tokens_text(block.tokens) +
                         " after proposing " + tokens_text(it->second) +
                         " for the same context: point-mass drafts must be a deterministic function of the context; "
                         "report the distributions the tokens were sampled from instead (" + where + ")");
                continue;
            }
            if (block.probs.rows() != vocab || block.probs.cols() < static_cast<Eigen::Index>(block.tokens.size()) ||
                (!block.scales.empty() && block.scales.size() < block.tokens.size())) {
                fail("the draft distributions are " + std::to_string(block.probs.rows()) + " x " +
                     std::to_string(block.probs.cols()) + " with " + std::to_string(block.scales.size()) +
                     " scales for " + std::to_string(block.tokens.size()) + " tokens; expected " +
                     std::to_string(vocab) + " rows and one column per token (" + where + ")");
                break;
            }
            double previous_pit = 0.0;
            for (std::size_t i = 0; i < block.tokens.size() && r.passed; ++i) {
                const auto col = block.probs.col(static_cast<Eigen::Index>(i));
                const double scale = block.scales.empty() ? 1.0 : block.scales[i];
                double sum = 0.0;
                bool valid = std::isfinite(scale) && scale > 0.0;
                for (Eigen::Index y = 0; y < col.size() && valid; ++y) {
                    const double v = col[y];
                    valid = std::isfinite(v) && v >= 0.0;
                    sum += scale * v;
                }
                if (!valid || std::abs(sum - 1.0) > 1e-3) {
                    fail("the reported q of draft position " + std::to_string(i) +
                         (valid ? " sums to " + number(sum) : std::string(" has a negative or non-finite entry")) +
                         "; it must be a distribution (" + where + ")");
                    break;
                }
                const auto x = static_cast<Eigen::Index>(block.tokens[i]);
                if (col[x] <= 0.0f) {
                    fail("draft token " + std::to_string(i) + " = " + std::to_string(x) +
                         " has probability 0 under the reported q: the token was not drawn from it (" + where + ")");
                    break;
                }
                const double v = uniform01(rng);
                const double pit = randomized_pit(col, scale, x, v);
                ++counts[i][std::min(bins - 1, static_cast<std::size_t>(pit * static_cast<double>(bins)))];
                if (i > 0) ++pairs[i - 1][joint_cell(previous_pit, pit)];
                previous_pit = pit;
                ++tested_tokens;
            }
        }
        if (!r.passed) break;
        const auto t = test_pit_rows(counts, bins, o.significance, tests, worst_p, worst_stat);
        if (const std::size_t i = t.failed_row; i < counts.size()) {
            const auto& g = t.test;
            fail("draft position " + std::to_string(i) + ", " + config + ": the tokens are not distributed as the "
                 "reported q (chi2 = " + number(g.statistic) + ", df = " + std::to_string(g.degrees_of_freedom) +
                 ", p = " + number(g.p_value) + " < " + number(o.significance) + " over " + std::to_string(t.draws) +
                 " tokens): " + pit_direction(counts[i]));
            break;
        }
        const std::size_t before = tests;
        const auto j = test_pit_rows(pairs, joint_bins * joint_bins, o.significance, tests, worst_p, worst_stat);
        joint_tests += tests - before;
        if (const std::size_t i = j.failed_row; i < pairs.size())
            fail("draft positions " + std::to_string(i) + " and " + std::to_string(i + 1) + ", " + config +
                 ": each position's tokens follow its reported q, but the two positions are not drawn independently "
                 "given their contexts (chi2 = " + number(j.test.statistic) + ", df = " +
                 std::to_string(j.test.degrees_of_freedom) + ", p = " + number(j.test.p_value) + " < " +
                 number(o.significance) + " over " + std::to_string(j.draws) +
                 " pairs of probability-integral values): the drafter reuses randomness across the positions of a "
                 "block (the same uniform for several tokens?), or its q's do not condition on the tokens drafted "
                 "before them; the fault is the drafter's");
    }
    r.statistic = worst_stat;
    if (tests > 0) r.p_value = worst_p;
    r.false_alarm_rate = static_cast<double>(tests) * o.significance;
    r.ran = std::to_string(blocks) + " blocks of up to " + std::to_string(gamma) + " tokens on " +
            std::to_string(contexts.size()) + " contexts, " + std::to_string(o.samplings.size()) +
            " sampling configs (" + std::to_string(own_contexts(o)) + " contexts from the drafter's own samples); " +
            std::to_string(tested_tokens) + " tokens tested against their reported q (" +
            std::to_string(tests - joint_tests) + " chi-square tests, one per position and config, " +
            std::to_string(o.pit_bins) + " cells each; " + std::to_string(joint_tests) +
            " of consecutive positions' joint law, " + std::to_string(joint_bins * joint_bins) + " cells each)" +
            (point_blocks ? "; " + std::to_string(point_blocks) + " point-mass blocks checked for determinism" : "");
    r.seconds = seconds_between(t0);
    return r;
}

/// Draft consistency of a tree drafter (TreeDrafter 1-3): trees of `shape`, each node's token
/// tested against its column, given its earlier siblings when it was drawn without
/// replacement (the column with their tokens removed, renormalized): uniform PIT values exactly
/// when every node was drawn as the tree says.
template <TreeDrafter D>
report tree_draft_consistency(D& drafter, const tree_shape& shape, const conformance_options& o) {
    const auto t0 = std::chrono::steady_clock::now();
    report r;
    r.check = "draft consistency";
    const auto vocab = static_cast<std::ptrdiff_t>(drafter.vocab_size());
    std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
    auto fail = [&](std::string why) {
        if (r.passed) {
            r.passed = false;
            r.failure = std::move(why);
        }
    };
    if (vocab <= 0) fail("vocab_size() = " + std::to_string(vocab) + " must be positive");
    const std::size_t depth = shape.depth(), cap = shape.nodes();
    // Room for every node after the context (an engine whose window holds the whole tree).
    const std::size_t lo = o.prompt.size() + 1, hi = std::max(lo, o.max_context > cap ? o.max_context - cap : lo);
    std::vector<std::vector<token_id>> contexts;
    for (std::size_t i = 0; i < std::max<std::size_t>(o.draft_contexts, 1) && r.passed; ++i) {
        std::vector<token_id> c = o.prompt;
        const std::size_t len = lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
        while (c.size() < len) c.push_back(static_cast<token_id>(rng() % static_cast<std::uint64_t>(vocab)));
        contexts.push_back(std::move(c));
    }
    std::size_t trees = 0, point_trees = 0, tested_nodes = 0, tests = 0;
    double worst_p = 1.0, worst_stat = 0.0;
    draft_tree tree;
    Eigen::VectorXf w;
    for (const sampling_config& s : o.samplings) {
        if (!r.passed) break;
        const std::string config = sampling_text(s);
        const std::size_t bins = std::max<std::size_t>(o.pit_bins, 2);
        std::vector<std::vector<std::size_t>> counts(depth, std::vector<std::size_t>(bins, 0));
        // context -> (tokens, parents) of a point-mass tree
        std::map<std::vector<token_id>, std::pair<std::vector<token_id>, std::vector<std::int32_t>>> point_trees_of;
        for (std::size_t k = 0; k < o.draft_blocks && r.passed; ++k) {
            const auto& c = contexts[k * contexts.size() / o.draft_blocks];
            uniform_source u(rng);
            tree.clear();
            drafter.propose_tree(std::span<const token_id>(c), shape, s, u, tree);
            ++trees;
            const std::string where = "tree " + std::to_string(k + 1) + " after " + tokens_text(c) + ", " + config;
            if (tree.size() > cap || static_cast<std::size_t>(std::max(tree.max_depth(), 0)) > depth) {
                fail("propose_tree proposed " + std::to_string(tree.size()) + " nodes of depth up to " +
                     std::to_string(tree.max_depth()) + "; the shape " + shape_text(shape) + " allows at most " +
                     std::to_string(cap) + " of depth " + std::to_string(depth) + " (" + where + ")");
                break;
            }
            try {
                specdec::detail::check_tree_structure(tree, vocab, "propose_tree");
            } catch (const std::invalid_argument& e) {
                fail(std::string("the proposed tree is malformed: ") + e.what() + " (" + where + ")");
                break;
            }
            if (!tree.has_distributions()) {
                // Point masses: the tree must be a function of the context alone.
                ++point_trees;
                auto [it, inserted] = point_trees_of.emplace(c, std::make_pair(tree.tokens, tree.parents));
                if (!inserted && (it->second.first != tree.tokens || it->second.second != tree.parents))
                    fail("a tree drafter without distributions (point masses) proposed the tokens " +
                         tokens_text(tree.tokens) + " after proposing " + tokens_text(it->second.first) +
                         " (or another structure) for the same context: point-mass trees must be a deterministic "
                         "function of the context; report the distributions the nodes were drawn from instead (" +
                         where + ")");
                continue;
            }
            if (tree.probs.rows() != vocab || tree.probs.cols() != static_cast<Eigen::Index>(tree.size())) {
                fail("the tree's draft distributions are " + std::to_string(tree.probs.rows()) + " x " +
                     std::to_string(tree.probs.cols()) + " for " + std::to_string(tree.size()) + " nodes; expected " +
                     std::to_string(vocab) + " rows and one column per node (" + where + ")");
                break;
            }
            for (std::size_t i = 0; i < tree.size() && r.passed; ++i) {
                const auto col = tree.probs.col(static_cast<Eigen::Index>(i));
                double sum = 0.0;
                bool valid = true;
                for (Eigen::Index y = 0; y < col.size() && valid; ++y) {
                    const double v = col[y];
                    valid = std::isfinite(v) && v >= 0.0;
                    sum += v;
                }
                if (!valid || std::abs(sum - 1.0) > 1e-3) {
                    fail("the reported q of node " + std::to_string(i) +
                         (valid ? " sums to " + number(sum) : std::string(" has a negative or non-finite entry")) +
                         "; it must be a distribution (" + where + ")");
                    break;
                }
                // The law node i was drawn from: its column, without the tokens of its earlier
                // siblings when it was drawn without replacement.
                w = col;
                double mass = 1.0;
                if (tree.draws_of(i) == sibling_draws::without_replacement) {
                    for (std::size_t j = 0; j < i; ++j)
                        if (tree.parents[j] == tree.parents[i]) w[tree.tokens[j]] = 0.0f;
                    mass = 0.0;
                    for (Eigen::Index y = 0; y < w.size(); ++y) mass += w[y];
                }
                const auto x = static_cast<Eigen::Index>(tree.tokens[i]);
                if (!(w[x] > 0.0f) || !(mass > 0.0)) {
                    fail("node " + std::to_string(i) + " (token " + std::to_string(x) +
                         ") has probability 0 under the reported q" +
                         (tree.draws_of(i) == sibling_draws::without_replacement
                              ? std::string(" once its earlier siblings are removed (drawn without replacement)")
                              : std::string()) +
                         ": the token was not drawn from it (" + where + ")");
                    break;
                }
                const double pit = randomized_pit(w, 1.0 / mass, x, uniform01(rng));
                const auto d = static_cast<std::size_t>(tree.depths[i] - 1);
                ++counts[d][std::min(bins - 1, static_cast<std::size_t>(pit * static_cast<double>(bins)))];
                ++tested_nodes;
            }
        }
        if (!r.passed) break;
        const auto t = test_pit_rows(counts, bins, o.significance, tests, worst_p, worst_stat);
        if (const std::size_t d = t.failed_row; d < counts.size()) {
            const auto& g = t.test;
            fail("tree depth " + std::to_string(d + 1) + ", " + config +
                 ": the nodes' tokens are not distributed as the reported q (chi2 = " + number(g.statistic) +
                 ", df = " + std::to_string(g.degrees_of_freedom) + ", p = " + number(g.p_value) + " < " +
                 number(o.significance) + " over " + std::to_string(t.draws) + " nodes): " + pit_direction(counts[d]));
        }
    }
    r.statistic = worst_stat;
    if (tests > 0) r.p_value = worst_p;
    r.false_alarm_rate = static_cast<double>(tests) * o.significance;
    r.ran = std::to_string(trees) + " trees of the shape " + shape_text(shape) + " on " +
            std::to_string(contexts.size()) + " contexts, " + std::to_string(o.samplings.size()) +
            " sampling configs; " + std::to_string(tested_nodes) +
            " nodes tested against their reported q, given their earlier siblings (" + std::to_string(tests) +
            " chi-square tests, one per depth and config, " + std::to_string(o.pit_bins) + " cells each)" +
            (point_trees ? "; " + std::to_string(point_trees) + " point-mass trees checked for determinism" : "");
    r.seconds = seconds_between(t0);
    return r;
}

/// Draft consistency of the drafter as the checks' step drafts with it: trees with a tree step
/// and a TreeDrafter, blocks otherwise (a chain's γ, or as deep as the tree).
template <kit_drafter D>
report draft_consistency(D& drafter, const conformance_options& o) {
    const step_shape step = step_of<D>(o);
    if (const auto* t = std::get_if<specdec::tree>(&step)) {
        if constexpr (TreeDrafter<D>) return tree_draft_consistency(drafter, t->shape, o);
    }
    if constexpr (Drafter<D> || MultiSequenceDrafter<D>) {
        return block_draft_consistency(drafter, o, longest_draft(step, o));
    } else {
        return {};  // unreachable: step_of gives a drafter of trees only a tree step
    }
}

/// The target's exact law over a partition of the sequences of its first `length` tokens into
/// prefix cells, from its probability tree: every prefix of probability at least `min_prob` is
/// expanded (one target call each); a cell is a sequence of full length (or ended by a stop
/// token) reached through expanded prefixes, or "an expanded prefix X, then a token whose
/// prefix X + t is not expanded" (its probability is the sum of those continuations'). With
/// min_prob = 0 this enumerates every sequence. The partition depends on the target alone.
class prefix_law {
public:
    template <Verifier V>
    prefix_law(V& target, const std::vector<token_id>& prompt, std::size_t length, const sampling_config& s,
               const std::vector<token_id>& stop_tokens, double min_prob)
        : stop_(stop_tokens) {
        std::vector<token_id> seq = prompt;
        sampling_workspace ws;
        const auto vocab = static_cast<Eigen::Index>(target.vocab_size());
        Eigen::VectorXf p(vocab);
        auto rec = [&](auto&& self, double prob) -> void {
            std::vector<token_id> x(seq.begin() + static_cast<std::ptrdiff_t>(prompt.size()), seq.end());
            if (x.size() == length || stops(x)) {
                add_cell(std::move(x), prob);
                return;
            }
            const Eigen::VectorXf z = single_logits(target, seq);
            if (z.size() != vocab)
                specdec::detail::fail_invalid("specdec::testing::check_equivalence: the target returned ", z.size(),
                                              " logits; its vocab_size() is ", vocab);
            standardize(z, s, p, ws, "specdec::testing::check_equivalence");
            std::vector<bool> zero(static_cast<std::size_t>(vocab));
            std::vector<std::pair<token_id, double>> children;
            double rest = 0.0;
            for (Eigen::Index t = 0; t < vocab; ++t) {
                const double q = prob * static_cast<double>(p[t]);
                if (p[t] <= 0.0f) zero[static_cast<std::size_t>(t)] = true;
                else if (q >= min_prob) children.emplace_back(static_cast<token_id>(t), q);
                else rest += q;
            }
            std::vector<token_id> rest_key = x;
            rest_key.push_back(-1);
            expanded_.emplace(std::move(x), std::move(zero));
            if (rest > 0.0) add_cell(std::move(rest_key), rest);
            for (const auto& [t, q] : children) {
                seq.push_back(t);
                self(self, q);
                seq.pop_back();
            }
        };
        rec(rec, 1.0);
    }

    /// The cell of a generated sequence, or npos for one the target cannot generate.
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);
    [[nodiscard]] std::size_t locate(const std::vector<token_id>& s) const {
        std::vector<token_id> x;
        for (;;) {
            if (x.size() == s.size()) {
                auto it = cell_.find(x);  // a leaf: full length, or ended by a stop token
                return it == cell_.end() ? npos : it->second;
            }
            auto node = expanded_.find(x);
            if (node == expanded_.end()) return npos;
            const token_id t = s[x.size()];
            if (t < 0 || static_cast<std::size_t>(t) >= node->second.size() || node->second[static_cast<std::size_t>(t)])
                return npos;
            x.push_back(t);
            if (expanded_.count(x) == 0 && cell_.count(x) == 0) {
                x.back() = -1;  // the rest cell of the prefix
                auto it = cell_.find(x);
                return it == cell_.end() ? npos : it->second;
            }
        }
    }

    [[nodiscard]] const std::vector<double>& probs() const noexcept { return probs_; }
    [[nodiscard]] const std::vector<std::vector<token_id>>& names() const noexcept { return names_; }
    [[nodiscard]] std::size_t expanded() const noexcept { return expanded_.size(); }

private:
    bool stops(const std::vector<token_id>& x) const {
        return !x.empty() && std::find(stop_.begin(), stop_.end(), x.back()) != stop_.end();
    }
    void add_cell(std::vector<token_id> key, double prob) {
        cell_.emplace(key, probs_.size());
        probs_.push_back(prob);
        names_.push_back(std::move(key));
    }

    std::vector<token_id> stop_;
    std::map<std::vector<token_id>, std::vector<bool>> expanded_;  // prefix -> tokens of probability 0 after it
    std::map<std::vector<token_id>, std::size_t> cell_;
    std::vector<double> probs_;
    std::vector<std::vector<token_id>> names_;
};

/// "[1 2 3]", or "[1 2] then a less likely token" for a rest cell.
inline std::string cell_text(std::vector<token_id> key) {
    if (!key.empty() && key.back() == -1) {
        key.pop_back();
        return tokens_text(key) + " then a token of low probability";
    }
    return tokens_text(key);
}

/// Cells of the two-sample test: each sequence goes to its longest prefix that at least
/// `min_count` sequences of the pooled sample share. The partition depends on the pooled
/// sample only, never on which sampler drew what, so the test of homogeneity stays valid.
inline std::vector<std::vector<token_id>> prefix_cells(const std::vector<std::vector<token_id>>& pooled,
                                                       std::size_t min_count) {
    std::map<std::vector<token_id>, std::size_t> prefix_count;
    for (const auto& s : pooled)
        for (std::size_t k = 0; k <= s.size(); ++k) ++prefix_count[std::vector<token_id>(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k))];
    std::vector<std::vector<token_id>> cell_of;
    cell_of.reserve(pooled.size());
    for (const auto& s : pooled) {
        std::size_t k = s.size();
        while (k > 0 && prefix_count[std::vector<token_id>(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k))] < min_count) --k;
        // A sequence of full length: the sequence itself (closed cells); shorter prefixes are
        // marked as such so that a sequence that ends with a stop token is not confused with
        // the prefix cell of longer ones.
        std::vector<token_id> cell(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k));
        if (k < s.size()) cell.push_back(-1);
        cell_of.push_back(std::move(cell));
    }
    return cell_of;
}

/// A step the decoding checks run, and its name in the reports.
struct named_step {
    step_shape step;
    std::string name;
};

/// The steps the decoding checks run with drafter type D, one per scheme: a chain step (γ =
/// o.gamma) under each of o.schemes, its lenience kept only under token verification and when
/// `keep_lenience`; or the tree step under its own scheme.
template <class D>
std::vector<named_step> steps_to_run(const conformance_options& o, bool keep_lenience) {
    const step_shape step = step_of<D>(o);
    std::vector<named_step> out;
    if (const auto* t = std::get_if<specdec::tree>(&step)) {
        out.push_back({*t, shape_text(t->shape) + ", " + tree_scheme_text(t->scheme)});
        return out;
    }
    for (const auto scheme : o.schemes) {
        specdec::chain c = std::get<specdec::chain>(step);
        c.gamma = o.gamma;
        c.scheme = scheme;
        if (!keep_lenience || scheme != verification_scheme::token) c.lenience = 1.0f;
        out.push_back({c, scheme_text(scheme)});
    }
    return out;
}

template <kit_drafter D, kit_target V>
report equivalence(D& drafter, V& target, const conformance_options& o) {
    decltype(auto) plain = plain_target(target);  // what plain sampling from the target reads
    const auto t0 = std::chrono::steady_clock::now();
    report r;
    r.check = "sequence-level equivalence";
    double worst_p = 1.0, worst_stat = 0.0;
    std::size_t tests = 0, index = 0, drafted = 0, accepted = 0;
    std::ostringstream ran;
    // One speculative run, its drafted and accepted tokens counted.
    const auto run_one = [&](const decode_options& opts, std::mt19937_64& rng) {
        decode_result out = speculative_decode(drafter, target, o.prompt, opts, rng);
        drafted += out.stats.drafted_tokens;
        accepted += out.stats.accepted_tokens;
        return std::move(out.tokens);
    };
    for (const auto& step : steps_to_run<D>(o, false)) {
        for (const auto& s : o.samplings) {
            if (!r.passed) break;
            ++index;
            decode_options opts = o.decode;
            opts.step = step.step;
            opts.sampling = s;
            opts.budget.max_new_tokens = o.length;
            opts.on_step = nullptr;
            if (opts.length.policy == gamma_policy::adaptive) opts.length.controller = nullptr;
            const std::string config = step.name + ", " + sampling_text(s);
            std::mt19937_64 rng_a(o.seed + 1000 * index), rng_b(o.seed + 1000 * index + 1);
            const auto ts = std::chrono::steady_clock::now();
            std::vector<std::vector<token_id>> a, b;
            a.reserve(o.samples);
            if (!o.two_sample) {
                // Every prefix the sample is expected to reach 5 times or more is expanded.
                const prefix_law law(plain, o.prompt, o.length, s, opts.budget.stop_tokens,
                                     5.0 / static_cast<double>(std::max<std::size_t>(o.samples, 1)));
                std::vector<std::size_t> counts(law.probs().size(), 0);
                for (std::size_t k = 0; k < o.samples; ++k) {
                    if (o.max_seconds > 0.0 && k % 64 == 0 && seconds_between(ts) > o.max_seconds) break;
                    a.push_back(run_one(opts, rng_a));
                    const std::size_t c = law.locate(a.back());
                    if (c == prefix_law::npos) {
                        r.passed = false;
                        r.failure = config + ": speculative decoding generated " + tokens_text(a.back()) +
                                    ", a sequence that plain sampling from the target never generates (probability 0)";
                        r.statistic = std::numeric_limits<double>::infinity();
                        worst_p = 0.0;
                        break;
                    }
                    ++counts[c];
                }
                if (!r.passed) break;
                const auto g = chi_square_test(counts, law.probs());
                ++tests;
                if (g.p_value < worst_p) {
                    worst_p = g.p_value;
                    worst_stat = g.statistic;
                }
                ran << (tests > 1 ? "; " : "") << config << ": " << a.size() << " sequences against the target's exact "
                    << "probabilities of " << law.probs().size() << " prefix cells (" << law.expanded()
                    << " prefixes expanded; df " << g.degrees_of_freedom << ")";
                if (g.p_value < o.significance) {
                    // The cell furthest from its expected count.
                    std::size_t worst = 0;
                    double z = -1.0;
                    const auto n = static_cast<double>(a.size());
                    for (std::size_t i = 0; i < counts.size(); ++i) {
                        const double e = law.probs()[i] * n;
                        if (e < 5.0) continue;
                        const double d = std::abs(static_cast<double>(counts[i]) - e) / std::sqrt(e);
                        if (d > z) {
                            z = d;
                            worst = i;
                        }
                    }
                    r.passed = false;
                    r.failure = config + ": the law of the first " + std::to_string(o.length) +
                                " tokens differs from the target's (chi2 = " + number(g.statistic) + ", df = " +
                                std::to_string(g.degrees_of_freedom) + ", p = " + number(g.p_value) + " < " +
                                number(o.significance) + "); e.g. " + cell_text(law.names()[worst]) + " came " +
                                std::to_string(counts[worst]) + " times, " + number(law.probs()[worst] * n) +
                                " expected";
                }
            } else {
                b.reserve(o.samples);
                for (std::size_t k = 0; k < o.samples; ++k) {
                    if (o.max_seconds > 0.0 && k % 64 == 0 && seconds_between(ts) > o.max_seconds) break;
                    a.push_back(run_one(opts, rng_a));
                    b.push_back(autoregressive_decode(plain, o.prompt, opts, rng_b).tokens);
                }
                std::vector<std::vector<token_id>> pooled = a;
                pooled.insert(pooled.end(), b.begin(), b.end());
                const auto cells = prefix_cells(pooled, 20);
                std::map<std::vector<token_id>, std::size_t> index_of;
                for (const auto& c : cells) index_of.emplace(c, index_of.size());
                std::vector<std::size_t> ca(index_of.size(), 0), cb(index_of.size(), 0);
                for (std::size_t k = 0; k < cells.size(); ++k) ++(k < a.size() ? ca : cb)[index_of[cells[k]]];
                const auto g = chi_square_two_sample_test(ca, cb);
                ++tests;
                if (g.p_value < worst_p) {
                    worst_p = g.p_value;
                    worst_stat = g.statistic;
                }
                ran << (tests > 1 ? "; " : "") << config << ": " << a.size() << " speculative against " << b.size()
                    << " plain sequences, " << index_of.size() << " prefix cells (df " << g.degrees_of_freedom << ")";
                if (g.p_value < o.significance) {
                    std::vector<token_id> worst;
                    double z = -1.0;
                    std::size_t wa = 0, wb = 0;
                    for (const auto& [c, i] : index_of) {
                        const double t = static_cast<double>(ca[i] + cb[i]);
                        if (t < 10.0) continue;
                        const double d = std::abs(static_cast<double>(ca[i]) - static_cast<double>(cb[i])) / std::sqrt(t);
                        if (d > z) {
                            z = d;
                            worst = c;
                            wa = ca[i];
                            wb = cb[i];
                        }
                    }
                    const bool prefix = !worst.empty() && worst.back() == -1;
                    if (prefix) worst.pop_back();
                    r.passed = false;
                    r.failure = config + ": the law of the first " + std::to_string(o.length) +
                                " tokens differs from plain sampling from the target (two-sample chi2 = " +
                                number(g.statistic) + ", df = " + std::to_string(g.degrees_of_freedom) + ", p = " +
                                number(g.p_value) + " < " + number(o.significance) + "); e.g. " +
                                (prefix ? "sequences starting " : "") + tokens_text(worst) + ": " + std::to_string(wa) +
                                " from speculative decoding, " + std::to_string(wb) + " from plain sampling";
                }
            }
        }
    }
    r.statistic = worst_stat;
    r.p_value = worst_p;
    r.false_alarm_rate = static_cast<double>(tests) * o.significance;
    r.drafted = drafted;
    if (drafted > 0) r.acceptance = static_cast<double>(accepted) / static_cast<double>(drafted);
    r.ran = std::string(o.two_sample ? "two-sample test; " : "exact probabilities; ") + ran.str();
    r.seconds = seconds_between(t0);
    return r;
}

template <kit_drafter D, kit_target V>
report determinism(D& drafter, V& target, const conformance_options& o) {
    decltype(auto) plain = plain_target(target);  // what plain sampling from the target reads
    const auto t0 = std::chrono::steady_clock::now();
    report r;
    r.check = "determinism";
    decode_options opts = o.decode;
    opts.budget.max_new_tokens = std::max<std::size_t>(o.length, 4 * (longest_draft(step_of<D>(o), o) + 1));
    opts.on_step = nullptr;
    // At a fixed γ (or tree depth): the adaptive policy chooses γ from measured times, which
    // differ between runs of a correct adapter and change which uniforms each step uses (exact
    // either way); this check is of the adapters, so nothing but them may vary.
    opts.length.policy = gamma_policy::fixed;
    opts.length.controller = nullptr;
    std::size_t runs = 0;
    for (const auto& step : steps_to_run<D>(o, true)) {
        for (const auto& s : o.samplings) {
            if (!r.passed) break;
            opts.step = step.step;
            opts.sampling = s;
            auto run = [&](std::uint64_t seed, bool spec) {
                std::mt19937_64 g(seed);
                ++runs;
                return spec ? speculative_decode(drafter, target, o.prompt, opts, g).tokens
                            : autoregressive_decode(plain, o.prompt, opts, g).tokens;
            };
            for (const bool spec : {true, false}) {
                const auto first = run(o.seed, spec);
                const auto second = run(o.seed, spec);
                (void)run(o.seed + 1, spec);  // another run in between must leave no trace
                const auto third = run(o.seed, spec);
                for (const auto* other : {&second, &third}) {
                    if (*other == first) continue;
                    std::size_t i = 0;
                    while (i < first.size() && i < other->size() && first[i] == (*other)[i]) ++i;
                    r.passed = false;
                    r.failure = std::string(spec ? "speculative_decode" : "autoregressive_decode") + ", " +
                                step.name + ", " + sampling_text(s) + ": the same seed gave different tokens " +
                                (other == &second ? "on a second run" : "after a run with another seed") +
                                ", first at token " + std::to_string(i) + " (" + tokens_text(first) + " then " +
                                tokens_text(*other) + "): hidden randomness (a generator of the adapter's own?) or "
                                "state a call leaves behind that changes the next";
                    break;
                }
                if (!r.passed) break;
            }
        }
    }
    r.ran = std::to_string(runs) + " runs of " + std::to_string(opts.budget.max_new_tokens) +
            " tokens, speculative and autoregressive, each seed repeated (also after a run with another seed)";
    r.seconds = seconds_between(t0);
    return r;
}

/// Runs a check; an exception (from an adapter, or the library's checks of what the adapters
/// returned) becomes a failed report that quotes it.
template <class F>
report guarded(const char* check, F&& run) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
        return run();
    } catch (const std::exception& e) {
        report r;
        r.check = check;
        r.passed = false;
        r.failure = std::string("an exception was thrown: ") + e.what();
        r.ran = "stopped by the exception";
        r.seconds = seconds_between(t0);
        return r;
    }
}

}  // namespace detail

/// Adapter contract (concepts.hpp: LanguageModel 1, BatchVerifier 1-2): every score() column,
/// and every next_logits result, equals (within `o.tolerance` in total variation of the
/// softmax) the logits a fresh model gives for the same tokens. Scenarios, in order: a call on a
/// copy must not change another copy's answer; a fresh model (and the same call repeated); a
/// growing context; rejections (the context drops draft tokens and adds a correction: the
/// classic KV-cache bug); a shrinking context; unrelated contexts in arbitrary order; two copies
/// used in turn on different sequences. Contexts are `o.prompt` followed by random tokens, up to
/// `o.max_context`; drafts have 0 to γ + 1 tokens (the tree's depth + 1 with a tree step). With a
/// tree step (o.decode.step) and a TreeVerifier, also score_tree (TreeVerifier 1-3): random trees
/// (up to depth + 1 levels, the context and every node within `o.max_context`) on fresh models,
/// each call's context the last one, then the path to an accepted node, then one more token;
/// every column is compared. The
/// first mismatch is reported with the scenario, the call, the history and, when the logits
/// match those of a neighbouring position, that they are shifted by one (for a tree node: when
/// they match the context + every earlier node in index order, that the attention mask lets it
/// see nodes that are not its ancestors).
///
/// Deterministic: a model that keeps the contract always passes (false-alarm rate 0).
///
/// \param model  the model under test, as constructed (nothing cached); it is called, and its
///               fresh copies (`M(model)` taken before any call) give the reference logits.
template <Verifier M>
    requires std::copy_constructible<M>
[[nodiscard]] report check_contract(M& model, const conformance_options& o = {}) {
    return detail::guarded("adapter contract", [&] {
        const M pristine(model);
        auto make = [&pristine] { return M(pristine); };
        return detail::contract_runner<M, decltype(make)>(model, make, o).run();
    });
}

/// As above, for a model that cannot be copied: `make()` returns a fresh model (by value) each
/// time it is called; the model under test is one of them.
template <class Make>
    requires std::invocable<Make&> && Verifier<std::invoke_result_t<Make&>>
[[nodiscard]] report check_contract_with(Make make, const conformance_options& o = {}) {
    using M = std::invoke_result_t<Make&>;
    return detail::guarded("adapter contract", [&] {
        M model = make();
        return detail::contract_runner<M, Make>(model, make, o).run();
    });
}

/// Draft consistency (concepts.hpp: BlockDrafter 1-3): each drafted token was drawn from the
/// distribution q_i the drafter reports for it. For each sampling config in `o.samplings` and
/// each draft position i, `o.draft_blocks` blocks are drawn after `o.draft_contexts` random
/// contexts, each token goes through the randomized probability integral transform of its q_i
/// (uniform exactly when it was drawn from q_i, whatever the context), and a χ² test with
/// `o.pit_bins` equiprobable cells compares the values with the uniform law. A block without
/// distributions (point masses) must repeat its tokens for the same context. Also checks that
/// each q_i is a distribution and gives its token positive probability.
///
/// With a tree step and a TreeDrafter (TreeDrafter 1-3), the drafter proposes trees of the
/// step's shape instead, each checked for its structure (parents first, depths, tokens in range,
/// at most the shape's nodes and depth), and each node's token goes through the transform of the
/// law it was drawn from: its column, given its earlier siblings when tree.draws says without
/// replacement; one χ² test per depth. A point-mass tree must repeat itself for the same context.
/// Other drafters with a tree step are checked as blocks as deep as the tree.
///
/// False-alarm rate: at most `o.significance` per position (or depth) and config (the report
/// states the total), plus the error of the χ² approximation. A plain LanguageModel drafter goes
/// through model_drafter (the library's own sampling).
template <detail::kit_drafter D>
[[nodiscard]] report check_draft_consistency(D& drafter, const conformance_options& o = {}) {
    return detail::guarded("draft consistency", [&] { return detail::draft_consistency(drafter, o); });
}

/// Sequence-level equivalence (Leviathan et al. 2023, App. A.1): the law of the first `o.length`
/// tokens generated after `o.prompt` by speculative_decode with the user's pair equals the law
/// of plain sampling from the target, for every scheme in `o.schemes` (or, for a tree step, the
/// tree's own scheme) and sampling config in `o.samplings` (with `o.decode`'s other settings:
/// the tree's shape, the length policy, the draft's sampling and stop, stop tokens).
///
/// By default `o.samples` sequences are tested (Pearson's χ²) against the target's exact
/// probabilities of a partition into prefix cells: the target's probability tree is enumerated
/// (standardized as the library does) down to the prefixes of probability 5 / `o.samples`, so
/// every cell the sample can fill is resolved, and when V^n is small every sequence is a cell of
/// its own. The partition depends on the target alone. With `o.two_sample`, `o.samples`
/// sequences of speculative_decode and as many of autoregressive_decode are compared instead by
/// a χ² test of homogeneity over prefix cells (each sequence counted in its longest prefix that
/// 20 of the pooled sequences share; a partition that does not depend on which sampler drew what).
///
/// False-alarm rate: `o.significance` per scheme and config (the report states the total), up
/// to the error of the χ² approximation (cells expected fewer than 5 times are pooled, and a
/// pool still that small is tested exactly on its own, see testing::chi_square_test; for the
/// same test specdec's distribution suite measured 1-2 × 10^-4 at a nominal 10^-4).
template <detail::kit_drafter D, detail::kit_target V>
[[nodiscard]] report check_equivalence(D& drafter, V& target, const conformance_options& o = {}) {
    return detail::guarded("sequence-level equivalence", [&] { return detail::equivalence(drafter, target, o); });
}

/// Determinism: speculative_decode and autoregressive_decode give the same tokens for the same
/// seed, run twice and again after a run with another seed, for every scheme (or the tree step)
/// and sampling config. Always at the fixed γ policy (an adaptive policy that measures times may
/// choose another γ on a second run of a correct adapter). Deterministic: false-alarm rate 0.
template <detail::kit_drafter D, detail::kit_target V>
[[nodiscard]] report check_determinism(D& drafter, V& target, const conformance_options& o = {}) {
    return detail::guarded("determinism", [&] { return detail::determinism(drafter, target, o); });
}

namespace detail {

/// The multi-sequence contract of some of `model`'s functions, the references copies of `pristine`.
template <multi_sequence_model M>
report multi_sequence_part(M& model, const M& pristine, const conformance_options& o,
                           multi_sequence_parts parts) {
    auto make = [&pristine] { return M(pristine); };
    return guarded("multi-sequence contract", [&] {
        return multi_sequence_runner<M, decltype(make)>(model, make, o, parts).run();
    });
}

}  // namespace detail

/// Multi-sequence contract (multi_sequence.hpp: MultiSequenceVerifier 1-2,
/// MultiSequenceTreeVerifier, MultiSequenceDrafter): a serving loop's passes, driven as
/// batch_decoder drives them, each request checked against that request alone. Over
/// 2 * `o.contract_calls` passes of score_batch (and half as many of score_tree_batch and of
/// draft_batch, for each the model has), up to `o.batch` sequences a pass: sequences join (in
/// the lowest free slot, so slots that others left are reused; a third of them sharing a prefix
/// with a live sequence) and leave at random, requests come in any order, drafts are ragged
/// (empty a quarter of the time, else up to γ + 1 tokens; trees random, some without nodes), and
/// each context then grows by an accepted prefix of its draft (all of it in some sequences, up to
/// a rejection and a correction in others) or a tree path. Every column of score_batch and
/// score_tree_batch is compared (within `o.tolerance` in total variation) with the logits of
/// that request scored alone by a fresh model: its score() or next_logits when the model has
/// them, else a pass with that request alone in slot 0. Every draft_batch block must equal (tokens,
/// distributions within `o.tolerance`, uniforms drawn) the block a fresh model drafts for that
/// request alone with the same uniforms. The first mismatch names the pass (its slots and draft
/// lengths), the request, its sequence and slot history, the column and the difference, and the
/// likely bug: the logits of another request (packed offsets), of a neighbouring column (shift),
/// of the earlier nodes in index order (tree attention mask), or none after sequences left (a
/// slot map that points at another sequence's cache).
///
/// Deterministic: a model that keeps the contract always passes (false-alarm rate 0).
///
/// \param model  the model under test, as constructed (nothing cached)
/// \param make   returns a fresh model (by value) each call: the references
template <class M, class Make>
    requires detail::multi_sequence_model<M> && std::invocable<Make&> &&
             std::same_as<std::invoke_result_t<Make&>, M>
[[nodiscard]] report check_multi_sequence_contract(M& model, Make make, const conformance_options& o = {}) {
    return detail::guarded("multi-sequence contract", [&] {
        return detail::multi_sequence_runner<M, Make>(model, make, o, {}).run();
    });
}

/// As above, the references fresh copies of the model (`M(model)` taken before any call).
template <detail::multi_sequence_model M>
    requires std::copy_constructible<M>
[[nodiscard]] report check_multi_sequence_contract(M& model, const conformance_options& o = {}) {
    const M pristine(model);
    return check_multi_sequence_contract(model, [&pristine] { return M(pristine); }, o);
}

/// As above, for a model that cannot be copied: `make()` returns a fresh model each call; the
/// model under test is one of them.
template <class Make>
    requires std::invocable<Make&> && detail::multi_sequence_model<std::invoke_result_t<Make&>>
[[nodiscard]] report check_multi_sequence_contract_with(Make make, const conformance_options& o = {}) {
    using M = std::invoke_result_t<Make&>;
    return detail::guarded("multi-sequence contract", [&] {
        M model = make();
        return detail::multi_sequence_runner<M, Make>(model, make, o, {}).run();
    });
}

/// Runs every check on the pair: the contract of the target (and of the drafter, when it is a
/// copyable LanguageModel), the multi-sequence contract of a target that models
/// MultiSequenceVerifier or MultiSequenceTreeVerifier (score_batch, score_tree_batch) and of a
/// drafter that models MultiSequenceDrafter (draft_batch), draft consistency, determinism,
/// sequence-level equivalence. A model that cannot be copied skips its contracts (use
/// check_contract_with, check_multi_sequence_contract_with). The drafter may be a TreeDrafter
/// (then the checks run a tree step, see conformance_options::decode) or a MultiSequenceDrafter
/// alone (drafting one sequence through draft_batch), the target a MultiSequenceVerifier or
/// MultiSequenceTreeVerifier alone (plain sampling from it through a pass of one request).
template <detail::kit_drafter D, detail::kit_target V>
[[nodiscard]] conformance_report run_conformance(D& drafter, V& target, const conformance_options& o = {}) {
    conformance_report out;
    auto add = [&out](report r, const char* name) {
        r.check = name;
        out.checks.push_back(std::move(r));
    };
    // The references of the multi-sequence contracts: copies taken before any call.
    constexpr bool multi_target = (MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>) && std::copy_constructible<V>;
    constexpr bool multi_drafter = MultiSequenceDrafter<D> && std::copy_constructible<D>;
    std::optional<V> pristine_target;
    std::optional<D> pristine_drafter;
    if constexpr (multi_target) pristine_target.emplace(target);
    if constexpr (multi_drafter) pristine_drafter.emplace(drafter);
    if constexpr (Verifier<V> && std::copy_constructible<V>) add(check_contract(target, o), "adapter contract (target)");
    if constexpr (LanguageModel<D> && std::copy_constructible<D>) add(check_contract(drafter, o), "adapter contract (draft)");
    if constexpr (multi_target)
        add(detail::multi_sequence_part(target, *pristine_target, o, {.scores = true, .drafts = false}),
            "multi-sequence contract (target)");
    if constexpr (multi_drafter)
        add(detail::multi_sequence_part(drafter, *pristine_drafter, o, {.scores = false, .drafts = true}),
            "multi-sequence contract (draft)");
    out.checks.push_back(check_draft_consistency(drafter, o));
    out.checks.push_back(check_determinism(drafter, target, o));
    out.checks.push_back(check_equivalence(drafter, target, o));
    return out;
}

}  // namespace specdec::testing
