#pragma once
/// \file
/// How did a conformance check go, and what does it run? `report` (one check's verdict, its
/// statistic, smallest p-value or largest error, first failing case in words, what was run),
/// `conformance_report` (the reports of run_conformance) and `conformance_options` (what the
/// checks run, and their budgets).
///
/// Also, in namespace detail, what the checks share: the text of tokens, numbers and settings in
/// their messages, the steps they run (a chain under each scheme, or a tree), the softmax and
/// total variation that compare logits, random draft trees, the target as plain sampling reads
/// it, and the guard that turns an exception into a failed report.
///
/// Part of the conformance kit (specdec/testing.hpp, which includes every check and defines
/// run_conformance). Not included by specdec/specdec.hpp.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <ostream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "../concepts.hpp"
#include "../decode_options.hpp"
#include "../error.hpp"
#include "../multi_sequence.hpp"
#include "../tree.hpp"
#include "../types.hpp"
#include "../verify_types.hpp"

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
    /// Every context the checks build starts with these tokens (a llama2.c model needs BOS = 1):
    /// at least one (decoding refuses an empty prompt); token 0 unless set.
    std::vector<token_id> prompt{0};
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
    /// Sequential sampling, in the draft check and the equivalence check's exact test: each
    /// config's sample is tested after a quarter, a half and all of its budget (`draft_blocks`,
    /// `samples`), and drawing stops at the first failure, so a clear one costs a quarter of the
    /// budget; when the last p-value is borderline (below 0.01 without failing), the sample grows
    /// to twice and four times the budget, tested again each time. Each of the at most five
    /// looks tests at `significance` / 5 (Bonferroni), so a right adapter still fails each test
    /// with probability at most `significance`. false: one test of the budget at `significance`.
    bool sequential = true;
    /// Seed of the checks' own generator: the same seed, the same verdict.
    std::uint64_t seed = 1;
};

/// The thorough budget: `o` with 16 times the draft blocks, 8 times the sequences and 4 times
/// the contexts of the defaults (at least what `o` has). On the shipped llama2.c pair it detects
/// a drafter that moves 1% of q's mass between its two likeliest tokens (docs/testing.md) and
/// takes about 30 s of CPU time where the defaults take 4.
[[nodiscard]] inline conformance_options thorough(conformance_options o = {}) {
    const conformance_options defaults{};
    o.draft_blocks = std::max(o.draft_blocks, 16 * defaults.draft_blocks);
    o.samples = std::max(o.samples, 8 * defaults.samples);
    o.draft_contexts = std::max(o.draft_contexts, 4 * defaults.draft_contexts);
    return o;
}

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

/// The looks of a sequential test (conformance_options::sequential) of a sample whose budget is
/// `budget` draws: after a quarter, a half and all of it, and, while the p-value stays
/// borderline, after twice and four times it; each at significance / 5 (Bonferroni over the
/// looks: a group-sequential design with a constant boundary). Not sequential: one look at the
/// budget, at the significance.
struct sequential_plan {
    static constexpr std::size_t max_looks = 5;
    static constexpr std::size_t budget_look = 2;  ///< the look after all of the budget
    static constexpr double borderline = 1e-2;

    std::size_t budget;
    bool sequential;
    double significance;

    std::size_t first() const { return sequential ? 0 : budget_look; }
    /// Draws made by the end of look `look`.
    std::size_t draws(std::size_t look) const {
        constexpr std::size_t quarters[max_looks] = {1, 2, 4, 8, 16};
        return budget * quarters[look] / 4;
    }
    double level() const { return sequential ? significance / static_cast<double>(max_looks) : significance; }
    /// Whether to draw on after look `look`, whose smallest p-value was p (and no test failed).
    bool go_on(std::size_t look, double p) const {
        if (!sequential) return false;
        return look < budget_look || (look + 1 < max_looks && p < borderline);
    }
    /// The level in words, for failure messages.
    std::string level_text() const;
};

inline std::string number(double x) {
    std::ostringstream os;
    os.precision(3);
    os << x;
    return os.str();
}

inline std::string sequential_plan::level_text() const {
    return sequential ? number(level()) + " (significance " + number(significance) + " over " +
                            std::to_string(max_looks) + " sequential looks)"
                      : number(level());
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

/// The step the checks run with drafter type D and target type V: decode.step, except that a
/// drafter that only proposes trees, or a target that only scores trees, runs the default tree
/// when decode.step is a chain (a chain step cannot run on it). V = void: the drafter alone
/// decides (the draft-consistency check, which runs no target).
template <class D, class V = void>
step_shape step_of(const conformance_options& o) {
    constexpr bool trees_only_drafter = !Drafter<D> && !MultiSequenceDrafter<D>;
    constexpr bool trees_only_target = !std::is_void_v<V> && !Verifier<V> && !MultiSequenceVerifier<V>;
    if constexpr (trees_only_drafter || trees_only_target) {
        if (std::holds_alternative<specdec::chain>(o.decode.step)) return specdec::tree{};
    }
    return o.decode.step;
}

/// The longest draft of a step: the chain's γ (the options' `gamma`) or the tree's depth.
inline std::size_t longest_draft(const step_shape& step, const conformance_options& o) {
    if (const auto* t = std::get_if<specdec::tree>(&step)) return t->shape.depth();
    return o.gamma;
}

/// "tree 2,2,1,1 (14 nodes)", or for a children list "tree of children 3,2,1,0,1 (7 nodes)".
inline std::string shape_text(const tree_shape& shape) {
    std::string s = shape.children.empty() ? "tree " : "tree of children ";
    const auto& listed = shape.children.empty() ? shape.branching : shape.children;
    const std::size_t n = shape.children.empty() ? std::min(shape.depth(), listed.size()) : listed.size();
    for (std::size_t d = 0; d < n; ++d) {  // appended piece by piece (GCC 12's -Wrestrict)
        if (d) s += ',';
        s += std::to_string(listed[d]);
    }
    s += " (";
    s += std::to_string(shape.nodes());
    s += " nodes)";
    return s;
}

inline const char* tree_scheme_text(tree_verification_scheme s) {
    return s == tree_verification_scheme::traversal ? "traversal verification" : "recursive rejection sampling";
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
concept kit_target = Verifier<V> || TreeVerifier<V> || MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>;
/// A target that scores trees only (score_tree), with neither score() nor next_logits().
template <class V>
concept tree_only_target = TreeVerifier<V> && !Verifier<V>;
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

/// A target of trees only (tree_only_target) as a BatchVerifier: score(context, draft) is
/// score_tree(context, the draft as a chain), column j after context + draft[0..j) as score()
/// gives it. What plain sampling reads from such a target, and what the adapter contract
/// compares its trees with: a chain's columns need no mask beyond the causal one, so a tree
/// whose nodes see other branches differs from them. `Held` is the target (a copy of its own:
/// fresh models for the contract) or a pointer to it.
template <class Held>
struct chain_tree_view {
    Held held;
    draft_tree chain{};

    /// The target.
    auto& target() {
        if constexpr (std::is_pointer_v<Held>) return *held;
        else return held;
    }
    /// The target's vocabulary size (non-const: TreeVerifier asks no const vocab_size()).
    std::ptrdiff_t vocab_size() { return static_cast<std::ptrdiff_t>(target().vocab_size()); }
    /// score_tree(context, the draft as a chain).
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        chain.clear();
        for (std::size_t i = 0; i < draft.size(); ++i) chain.add(static_cast<std::int32_t>(i) - 1, draft[i]);
        Eigen::MatrixXf out;
        target().score_tree(context, chain, out);
        return out;
    }
    /// The target's own score_tree.
    void score_tree(std::span<const token_id> context, const draft_tree& tree, Eigen::MatrixXf& out) {
        target().score_tree(context, tree, out);
    }
};

/// The target as plain sampling reads it: itself when it is a Verifier, else its one-sequence
/// view (a multi-sequence target) or its chains (a target of trees only).
template <kit_target V>
decltype(auto) plain_target(V& v) {
    if constexpr (Verifier<V>) return (v);
    else if constexpr (MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>) return one_sequence_view<V>{&v};
    else return chain_tree_view<V*>{&v};
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

/// A step the decoding checks run, and its name in the reports.
struct named_step {
    step_shape step;
    std::string name;
};

/// The steps the decoding checks run with drafter type D, one per scheme: a chain step (γ =
/// o.gamma) under each of o.schemes, its lenience kept only under token verification and when
/// `keep_lenience`; or the tree step under its own scheme.
template <class D, class V>
std::vector<named_step> steps_to_run(const conformance_options& o, bool keep_lenience) {
    const step_shape step = step_of<D, V>(o);
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

}  // namespace specdec::testing
