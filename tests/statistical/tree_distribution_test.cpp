// Tree speculative decoding keeps the target's distribution over whole sequences.
//
// Method (as distribution_test.cpp): random Markov models (V = 4 or 5, logits depending on the
// last two tokens) as draft and target; 100,000 sequences of 4 tokens per case, from the prompt
// {0}, drafted as trees of several shapes (depth 1 with k siblings, a pure chain, deeper
// trees), under both tree schemes, through speculative_decode with `.step = specdec::tree{...}`;
// Pearson's chi-square test against the exact target distribution of the 4-token sequences
// (cells with expected count < 5 pooled). A case fails when p < 1e-4: one or two false alarms
// in 10^4 per test (the chi-square approximation, see distribution_test.cpp), about 60 tests
// here, so a correct implementation fails a run with probability about 0.8% (fixed seeds: a
// run is reproducible). Each case also checks that its steps both rejected at the first level
// and accepted whole paths, so the residual updates between siblings and the deep acceptances
// are exercised.
//
// The same test covers what a tree step shares with chains: the draft's own sampling settings
// (another temperature, top-k, top-p, greedy), the draft-side stop (pruning a large share of
// the trees, which is checked), the adaptive depth with known costs (several depths used, which
// is checked), and all three together. The output law cannot show that the draft's settings
// reached the drafter, so those cases also check each tree's first column against the draft's q
// under its own settings.
//
// Negative controls run the same test on deliberately wrong procedures and require p < 1e-4:
// siblings drawn without replacement but marked i.i.d.; recursive rejection sampling that does
// not update the residual between siblings; with draft-side sampling, a tree drafter that
// reports as q its model's distributions at the target's temperature instead of the ones it
// sampled from; a draft-side stop that drops the unlikely node instead of keeping it without
// children. The correct form of each (a double-precision transcription; the honest drafter; the
// correct stop, applied by the drafter) must pass the same test.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/stats.hpp"
#include "support/tree_reference.hpp"

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

using namespace specdec_test;
using specdec::sibling_draws;
using specdec::token_id;
using specdec::tree_verification_scheme;

namespace {

constexpr std::size_t kSamples = 100000;
constexpr int kLength = 4;
constexpr double kFalseAlarm = 1e-4;
const std::vector<token_id> kPrompt{0};

std::size_t encode(const std::vector<token_id>& tokens, int vocab) {
    std::size_t index = 0;
    for (token_id t : tokens) index = index * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(t);
    return index;
}

gof_result sequence_test(const std::function<std::vector<token_id>(std::mt19937_64&)>& sample,
                         const std::vector<double>& exact, int vocab, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::size_t> counts(exact.size(), 0);
    for (std::size_t s = 0; s < kSamples; ++s) {
        const auto tokens = sample(rng);
        REQUIRE(tokens.size() == static_cast<std::size_t>(kLength));
        ++counts[encode(tokens, vocab)];
    }
    return chi_square_test(counts, exact);
}

std::string describe(const gof_result& r) {
    std::ostringstream os;
    os << "chi2 = " << r.statistic << ", df = " << r.degrees_of_freedom << ", p = " << r.p_value;
    return os.str();
}

const char* name(tree_verification_scheme s) {
    return s == tree_verification_scheme::traversal ? "traversal verification" : "recursive rejection sampling";
}

/// Changes a case's options before it runs (the draft's settings, the adaptive depth), per scheme.
using customize_fn = std::function<void(specdec::decode_options&, tree_verification_scheme)>;

/// Decodes with speculative_decode and `.step = specdec::tree{shape, scheme}` under both schemes
/// and tests the sequences. With `exercised`, also requires steps that accepted nothing and
/// steps that accepted a whole path of the tree's depth.
template <class D, class V>
void check_tree_case(D& drafter, V& verifier, const markov_model& target, const specdec::sampling_config& s,
                     const specdec::tree_shape& shape, std::uint64_t seed, bool exercised = true,
                     const customize_fn& customize = {}) {
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, s);
    for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
        INFO(name(scheme));
        std::size_t none = 0, full = 0;
        specdec::decode_options opts{.step = specdec::tree{.shape = shape, .scheme = scheme},
                                     .sampling = s,
                                     .budget = {.max_new_tokens = kLength}};
        opts.on_step = [&](const specdec::step_event& e) {
            if (e.tree == nullptr || e.tree->size() == 0) return;
            none += e.accepted == 0;
            full += e.accepted == static_cast<std::size_t>(e.tree->max_depth()) && e.tree->max_depth() > 1;
        };
        if (customize) customize(opts, scheme);
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) {
                return specdec::speculative_decode(drafter, verifier, kPrompt, opts, rng).tokens;
            },
            exact, target.vocab, seed);
        INFO(describe(r) << "; steps accepting nothing " << none << ", whole deep paths " << full);
        CHECK(r.p_value >= kFalseAlarm);
        if (exercised) {
            CHECK(none > 0);
            if (shape.depth() > 1) CHECK(full > 0);
        }
    }
}

void check_pair(int vocab, const specdec::sampling_config& s, const specdec::tree_shape& shape, std::uint64_t seed,
                bool exercised = true, const customize_fn& customize = {}) {
    auto target = markov_model::random(vocab, 2, seed);
    auto draft = markov_model::random(vocab, 2, seed + 1);
    tree_markov verifier{&target};
    check_tree_case(draft, verifier, target, s, shape, 1000 + seed, exercised, customize);
}

/// A point-mass tree drafter: below every node (and the root), the tokens last + 1, last + 2, ...
/// (mod V), as many as the shape asks; deterministic.
struct shift_tree_drafter {
    int vocab = 4;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config&, specdec::uniform_source&, specdec::draft_tree& out) const {
        out.clear();
        std::vector<std::int32_t> level{-1};
        for (std::size_t d = 0; d < shape.depth(); ++d) {
            std::vector<std::int32_t> next;
            for (std::int32_t par : level) {
                const token_id last = par < 0 ? context.back() : out.tokens[static_cast<std::size_t>(par)];
                for (std::size_t j = 0; j < shape.branching[d]; ++j)
                    next.push_back(out.add(par, static_cast<token_id>((last + 1 + static_cast<int>(j)) % vocab)));
            }
            level = next;
        }
    }
};

/// WRONG on purpose: draws siblings without replacement, then marks them i.i.d.
struct mislabeled_drafter {
    markov_model* model = nullptr;
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& u, specdec::draft_tree& out) {
        specdec::tree_shape wor = shape;
        wor.draws = sibling_draws::without_replacement;
        specdec::draft_tree_from_model(*model, context, wor, s, u, out, path, logits, q, scratch, sws);
        for (auto& d : out.draws) d = sibling_draws::iid;
    }
};


/// Watches every tree step of a case that uses the draft's own settings or the adaptive depth,
/// and checks the trees on the way: the root's first column is the draft's q under the draft's
/// own settings (so draft.sampling reached the drafter; the output law alone cannot show it);
/// no node hangs below a node whose q is below the stop; how many trees the stop pruned (fewer
/// nodes than the shape cut to the depth asked); steps by the depth asked.
struct tree_watch {
    markov_model* draft = nullptr;
    std::optional<specdec::sampling_config> draft_sampling{};
    float stop_below = 0.0f;
    specdec::tree_shape shape{};
    std::vector<token_id> seq = kPrompt;
    std::size_t trees = 0, column_ok = 0, stop_ok = 0, pruned = 0;
    std::vector<std::size_t> depths{};
    /// The tree planner of the run (null: the shape is fixed): its plan is the shape asked.
    const specdec::gamma_controller* planner = nullptr;
    std::size_t planned_trees = 0, planned_chains = 0;  // plans with a level of 2+ children, plans of 1 each
    std::size_t planned_best_trees = 0;                 // plans from best_tree's trees (children lists)

    /// Sets the draft's settings and wraps the case's on_step.
    void apply(specdec::decode_options& o) {
        o.draft = {.sampling = draft_sampling, .stop_below = stop_below};
        auto inner = o.on_step;
        o.on_step = [this, inner](const specdec::step_event& e) {
            observe(e);
            if (inner) inner(e);
        };
    }
    void observe(const specdec::step_event& e) {
        if (depths.size() <= e.gamma) depths.resize(e.gamma + 1, 0);
        ++depths[e.gamma];
        if (e.tree != nullptr && e.tree->size() != 0) {
            ++trees;
            if (draft_sampling) {
                const auto q = ref_standardize(draft->next_logits(seq), *draft_sampling);
                double err = 0.0;
                for (std::size_t x = 0; x < q.size(); ++x)
                    err = std::max(err, std::abs(q[x] - static_cast<double>(
                                                            e.tree->probs(static_cast<Eigen::Index>(x), 0))));
                column_ok += err < 1e-5;
            }
            stop_ok += respects_stop(*e.tree, stop_below);
            specdec::tree_shape plan_shape = shape, cut;
            if (planner != nullptr) {
                const auto plan = planner->planned_shape();
                const auto children = planner->planned_children();  // a best tree's (best_tree())
                plan_shape.branching.assign(plan.begin(), plan.end());
                plan_shape.children.assign(children.begin(), children.end());
                if (!children.empty()) {
                    plan_shape.max_nodes = 0;
                    for (const std::size_t k : children) plan_shape.max_nodes += k;
                    ++planned_best_trees;
                }
                const bool wide = std::any_of(plan.begin(), plan.end(), [](std::size_t b) { return b > 1; });
                ++(wide ? planned_trees : planned_chains);
            }
            plan_shape.cut(e.gamma, cut);
            pruned += e.tree->size() < cut.nodes();
        }
        seq.insert(seq.end(), e.emitted.begin(), e.emitted.end());
        if (seq.size() >= kPrompt.size() + kLength) seq = kPrompt;  // the run is over
    }
    std::size_t distinct_depths() const {
        return static_cast<std::size_t>(
            std::count_if(depths.begin(), depths.end(), [](std::size_t n) { return n != 0; }));
    }
    std::string describe_depths() const {
        std::ostringstream os;
        os << "steps by depth:";
        for (const std::size_t n : depths) os << ' ' << n;
        return os.str();
    }
};

/// The tree planner with known costs (reproducible), exploring every other step: draft calls
/// cost 0.01 of a pass, a pass 1 + 0.02 per extra position (as the chain suite's
/// adaptive_setup). One controller per scheme, kept across the 100,000 runs, so each run's
/// shapes depend on everything before it.
struct adaptive_trees {
    specdec::gamma_controller rrs, tv;
    /// `position_cost`: what each position adds to a pass (the default keeps extra nodes nearly
    /// free, so the planner plans trees; a larger one makes chains and plain steps pay too).
    explicit adaptive_trees(const specdec::tree_shape& shape, double position_cost = 0.02)
        : rrs(limits(shape), options(position_cost)), tv(limits(shape), options(position_cost)) {}
    static specdec::tree_plan_limits limits(const specdec::tree_shape& shape) {
        return {.branching = {shape.branching.begin(), shape.branching.begin() +
                                                           static_cast<std::ptrdiff_t>(shape.depth())},
                .max_nodes = shape.max_nodes};
    }
    static specdec::adaptive_gamma_options options(double position_cost) {
        specdec::adaptive_gamma_options o;
        o.draft_cost = [](std::size_t n) { return 0.01 * static_cast<double>(n); };
        o.pass_cost = [position_cost](std::size_t m) { return 1.0 + position_cost * static_cast<double>(m - 1); };
        o.explore_every = 2;
        o.max_explore_every = 2;
        o.explore_budget = 1.0;
        o.window = 8;
        return o;
    }
    void apply(specdec::decode_options& o, tree_verification_scheme scheme) {
        o.length = {.policy = specdec::gamma_policy::adaptive,
                    .controller = scheme == tree_verification_scheme::traversal ? &tv : &rrs};
    }
};

/// A tree drafter (a model's trees, sampled with the settings it is given) that reports as q
/// either the columns it sampled from (`reported` unset: correct) or, WRONG on purpose, the
/// model's distributions under `reported`: with draft-side sampling at another temperature,
/// q is then not what the tokens were drawn from.
struct reporting_tree_drafter {
    markov_model* model = nullptr;
    std::optional<specdec::sampling_config> reported{};
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& u, specdec::draft_tree& out) {
        specdec::draft_tree_from_model(*model, context, shape, s, u, out, path, logits, q, scratch, sws);
        if (!reported) return;
        std::vector<token_id> prefix;
        for (std::size_t i = 0; i < out.size(); ++i) {
            specdec::path_tokens(out, out.parents[i], prefix);
            prefix.insert(prefix.begin(), context.begin(), context.end());
            const auto wrong = ref_standardize(model->next_logits(prefix), *reported);
            for (std::size_t x = 0; x < wrong.size(); ++x)
                out.probs(static_cast<Eigen::Index>(x), static_cast<Eigen::Index>(i)) = static_cast<float>(wrong[x]);
        }
        out.standardized = false;
    }
};

/// A tree drafter that applies a draft-side stop of its own: the correct rule (a node whose
/// q(token) is below `stop_below` keeps its place and loses its children, as the library's
/// draft.stop_below does), or, with `drop_low`, WRONG on purpose: such a node is dropped with
/// its subtree, so the siblings that stay were drawn from q given q >= stop_below, not from q.
struct self_stopping_tree_drafter {
    markov_model* model = nullptr;
    float stop_below = 0.3f;
    bool drop_low = false;
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& u, specdec::draft_tree& out) {
        specdec::draft_tree drawn;
        specdec::draft_tree_from_model(*model, context, shape, s, u, drawn, path, logits, q, scratch, sws);
        out = ref_prune(drawn, stop_below, drop_low);
    }
};

}  // namespace

TEST_CASE("Tree decoding samples whole sequences from the target at temperature 1 (without replacement)",
          "[statistical][distribution][tree]") {
    check_pair(4, {}, {.branching = {2, 2, 1}, .draws = sibling_draws::without_replacement}, 11);
}

TEST_CASE("Tree decoding with i.i.d. siblings matches the target at temperature 1", "[statistical][distribution][tree]") {
    check_pair(4, {}, {.branching = {2, 2, 1}, .draws = sibling_draws::iid}, 21);
}

TEST_CASE("Tree decoding matches the target at temperature 0.6", "[statistical][distribution][tree]") {
    check_pair(4, {.temperature = 0.6f}, {.branching = {3, 1}, .draws = sibling_draws::without_replacement}, 31);
    check_pair(4, {.temperature = 0.6f}, {.branching = {3, 1}, .draws = sibling_draws::iid}, 33);
}

TEST_CASE("Tree decoding matches the target under top-k and top-p", "[statistical][distribution][tree]") {
    check_pair(5, {.top_k = 3}, {.branching = {3, 2}, .draws = sibling_draws::without_replacement}, 41);
    check_pair(5, {.top_p = 0.9f}, {.branching = {2, 1, 1}, .draws = sibling_draws::iid}, 43);
    check_pair(5, {.temperature = 0.8f, .min_p = 0.1f}, {.branching = {2, 2}, .draws = sibling_draws::without_replacement}, 45);
}

TEST_CASE("Depth-1 trees of k siblings match the target", "[statistical][distribution][tree]") {
    // V = 4 siblings drawn without replacement cover the vocabulary: one is always accepted.
    check_pair(4, {}, {.branching = {4}, .draws = sibling_draws::without_replacement}, 51, false);
    check_pair(5, {}, {.branching = {3}, .draws = sibling_draws::without_replacement}, 55);
    check_pair(4, {}, {.branching = {3}, .draws = sibling_draws::iid}, 53);
}

TEST_CASE("Trees whose nodes of one depth differ (tree_shape::from_children, best_tree) match the target",
          "[statistical][distribution][tree]") {
    // The first child carries a deeper subtree than its siblings, as best_tree's trees do.
    check_pair(4, {}, specdec::tree_shape::from_children({3, 2, 0, 0, 1}), 71);
    check_pair(5, {.temperature = 0.7f}, specdec::tree_shape::from_children({2, 1, 2, 1}, sibling_draws::iid), 73);
    check_pair(4, {}, specdec::best_tree(std::vector<double>{0.6, 0.3, 0.2}, 6, std::vector<std::size_t>{3, 2, 1}), 75);
}

TEST_CASE("A pure chain matches the target", "[statistical][distribution][tree]") {
    check_pair(4, {.temperature = 0.8f}, {.branching = {1, 1, 1}}, 61);
}

TEST_CASE("Point-mass trees keep the target distribution", "[statistical][distribution][tree]") {
    auto target = markov_model::random(4, 2, 71);
    also_plain<shift_tree_drafter> drafter{{4}};
    tree_markov verifier{&target};
    check_tree_case(drafter, verifier, target, {}, {.branching = {2, 2, 1}}, 1071);
}

TEST_CASE("A draft tree with support disjoint from the target's is always rejected, exactly",
          "[statistical][distribution][tree]") {
    auto target = markov_model::random(5, 2, 81);
    auto draft = markov_model::random(5, 2, 82);
    target.forbid(0);
    for (token_id t = 1; t < 5; ++t) draft.forbid(t);
    tree_markov verifier{&target};
    for (const auto draws : {sibling_draws::iid, sibling_draws::without_replacement}) {
        std::size_t accepted = 0;
        const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
        for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
            INFO(name(scheme));
            const auto r = sequence_test(
                [&](std::mt19937_64& rng) {
                    auto out = specdec::speculative_decode(
                        draft, verifier, kPrompt,
                        {.step = specdec::tree{.shape = {.branching = {2, 2}, .draws = draws}, .scheme = scheme},
                         .budget = {.max_new_tokens = kLength}},
                        rng);
                    accepted += out.stats.accepted_tokens;
                    return out.tokens;
                },
                exact, 5, 1081);
            INFO(describe(r));
            CHECK(r.p_value >= kFalseAlarm);
            CHECK(accepted == 0);
        }
    }
}

TEST_CASE("Verifiers without score_tree and block drafters keep the target distribution",
          "[statistical][distribution][tree]") {
    auto target = markov_model::random(4, 2, 91);
    auto draft = markov_model::random(4, 2, 92);
    batched_markov batched{&target};
    check_tree_case(draft, batched, target, {}, {.branching = {2, 1, 1}}, 1091);
    check_tree_case(draft, target, target, {}, {.branching = {2, 2}}, 1093);
    shift_drafter block{4, 1};
    tree_markov verifier{&target};
    check_tree_case(block, verifier, target, {}, {.branching = {1, 1, 1}}, 1095);
}

TEST_CASE("Tree decoding with the draft at another temperature than the target matches the target",
          "[statistical][distribution][tree][draft-sampling]") {
    struct draft_case {
        int vocab;
        specdec::sampling_config target, draft;
        specdec::tree_shape shape;
        std::uint64_t seed;
    };
    const draft_case cases[] = {
        {4, {}, {.temperature = 0.5f}, {.branching = {2, 2, 1}, .draws = sibling_draws::without_replacement}, 121},
        {5, {.temperature = 0.8f, .top_k = 3}, {.temperature = 1.5f, .top_p = 0.9f},
         {.branching = {3, 1}, .draws = sibling_draws::iid}, 123},
    };
    for (const auto& c : cases) {
        auto target = markov_model::random(c.vocab, 2, c.seed);
        auto draft = markov_model::random(c.vocab, 2, c.seed + 1);
        tree_markov verifier{&target};
        tree_watch watch{.draft = &draft, .draft_sampling = c.draft, .shape = c.shape};
        check_tree_case(draft, verifier, target, c.target, c.shape, 1000 + c.seed, true,
                        [&](specdec::decode_options& o, tree_verification_scheme) { watch.apply(o); });
        INFO(watch.column_ok << " of " << watch.trees << " trees with the draft's q under its own settings");
        CHECK(watch.trees > kSamples);
        CHECK(watch.column_ok == watch.trees);
    }
}

TEST_CASE("Tree decoding with the draft at another top-k than the target (or greedy) matches the target",
          "[statistical][distribution][tree][draft-sampling]") {
    struct draft_case {
        int vocab;
        specdec::sampling_config target, draft;
        specdec::tree_shape shape;
        std::uint64_t seed;
    };
    const draft_case cases[] = {
        {5, {.temperature = 0.8f}, {.temperature = 0.8f, .top_k = 2},
         {.branching = {2, 2}, .draws = sibling_draws::without_replacement}, 125},
        // A greedy draft: its groups drawn without replacement stop after one node (chains).
        {4, {}, {.temperature = 0.0f}, {.branching = {3, 1}, .draws = sibling_draws::without_replacement}, 127},
    };
    for (const auto& c : cases) {
        auto target = markov_model::random(c.vocab, 2, c.seed);
        auto draft = markov_model::random(c.vocab, 2, c.seed + 1);
        tree_markov verifier{&target};
        tree_watch watch{.draft = &draft, .draft_sampling = c.draft, .shape = c.shape};
        check_tree_case(draft, verifier, target, c.target, c.shape, 1000 + c.seed, true,
                        [&](specdec::decode_options& o, tree_verification_scheme) { watch.apply(o); });
        INFO(watch.column_ok << " of " << watch.trees << " trees with the draft's q under its own settings");
        CHECK(watch.trees > kSamples);
        CHECK(watch.column_ok == watch.trees);
    }
}

TEST_CASE("Tree decoding with the draft-side stop matches the target, and the stop prunes often",
          "[statistical][distribution][tree][draft-stop]") {
    struct stop_case {
        specdec::sampling_config target;
        std::optional<specdec::sampling_config> draft;
        specdec::tree_shape shape;
        std::uint64_t seed;
    };
    const stop_case cases[] = {
        {{}, std::nullopt, {.branching = {2, 2, 1}, .draws = sibling_draws::iid}, 131},
        {{.temperature = 0.8f}, specdec::sampling_config{.temperature = 1.2f},
         {.branching = {2, 2, 1}, .draws = sibling_draws::without_replacement}, 133},
    };
    for (const auto& c : cases) {
        auto target = markov_model::random(4, 2, c.seed);
        auto draft = markov_model::random(4, 2, c.seed + 1);
        tree_markov verifier{&target};
        tree_watch watch{.draft = &draft, .draft_sampling = c.draft, .stop_below = 0.3f, .shape = c.shape};
        check_tree_case(draft, verifier, target, c.target, c.shape, 1000 + c.seed, true,
                        [&](specdec::decode_options& o, tree_verification_scheme) { watch.apply(o); });
        INFO(watch.pruned << " of " << watch.trees << " trees pruned");
        CHECK(watch.stop_ok == watch.trees);
        CHECK(watch.pruned * 4 > watch.trees);  // a quarter of the trees at least: often, not by accident
        if (c.draft) CHECK(watch.column_ok == watch.trees);
    }
}

TEST_CASE("Tree decoding with the tree planner (known costs) matches the target, and plans trees, chains and plain "
          "steps",
          "[statistical][distribution][tree][adaptive]") {
    struct adaptive_case {
        int vocab;
        specdec::sampling_config target;
        specdec::tree_shape shape;
        std::uint64_t seed;
        double position_cost;
    };
    const adaptive_case cases[] = {
        {4, {}, {.branching = {2, 2, 1}, .draws = sibling_draws::without_replacement}, 141, 0.15},
        {5, {.temperature = 0.7f, .top_k = 3}, {.branching = {3, 1, 1}, .draws = sibling_draws::iid}, 143, 0.05},
    };
    std::size_t chains = 0, best_trees = 0;
    for (const auto& c : cases) {
        auto target = markov_model::random(c.vocab, 2, c.seed);
        auto draft = markov_model::random(c.vocab, 2, c.seed + 1);
        tree_markov verifier{&target};
        adaptive_trees adaptive(c.shape, c.position_cost);
        tree_watch watch{.draft = &draft, .shape = c.shape};
        check_tree_case(draft, verifier, target, c.target, c.shape, 1000 + c.seed, true,
                        [&](specdec::decode_options& o, tree_verification_scheme scheme) {
                            adaptive.apply(o, scheme);
                            watch.planner = o.length.controller;
                            watch.apply(o);
                        });
        INFO(watch.describe_depths() << "; plans: " << watch.planned_trees << " trees ("
                                     << watch.planned_best_trees << " best trees), " << watch.planned_chains
                                     << " chains");
        CHECK(watch.distinct_depths() >= 3);
        CHECK(watch.depths[0] > 0);      // plain steps
        CHECK(watch.planned_trees > 0);  // and trees, chosen by the planner
        CHECK(watch.pruned == 0);        // every tree had the planned shape cut to the depth asked
        chains += watch.planned_chains;
        best_trees += watch.planned_best_trees;
    }
    CHECK(chains > 0);      // and chains (the second case plans some)
    CHECK(best_trees > 0);  // and trees whose nodes of one depth differ (tree_plan_limits::best_trees)
}

TEST_CASE("Tree decoding with the tree planner, the draft's own sampling and the draft-side stop together "
          "matches the target",
          "[statistical][distribution][tree][adaptive][draft-sampling][draft-stop]") {
    const specdec::tree_shape shape{.branching = {2, 2, 1}, .draws = sibling_draws::without_replacement};
    auto target = markov_model::random(4, 2, 151);
    auto draft = markov_model::random(4, 2, 152);
    tree_markov verifier{&target};
    adaptive_trees adaptive(shape);
    tree_watch watch{.draft = &draft, .draft_sampling = specdec::sampling_config{.temperature = 1.3f},
                     .stop_below = 0.25f, .shape = shape};
    check_tree_case(draft, verifier, target, {}, shape, 1151, true,
                    [&](specdec::decode_options& o, tree_verification_scheme scheme) {
                        adaptive.apply(o, scheme);
                        watch.planner = o.length.controller;
                        watch.apply(o);
                    });
    INFO(watch.describe_depths() << "; " << watch.pruned << " of " << watch.trees << " trees pruned");
    CHECK(watch.distinct_depths() >= 3);
    CHECK(watch.stop_ok == watch.trees);
    CHECK(watch.pruned * 10 > watch.trees);
    CHECK(watch.column_ok == watch.trees);
}

TEST_CASE("Negative control: siblings drawn without replacement but verified as i.i.d. are caught",
          "[statistical][distribution][tree][negative]") {
    auto target = markov_model::random(4, 2, 101);
    auto draft = markov_model::random(4, 2, 102);
    also_plain<mislabeled_drafter> drafter{};
    drafter.model = &draft;
    tree_markov verifier{&target};
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
        INFO(name(scheme));
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) {
                return specdec::speculative_decode(
                           drafter, verifier, kPrompt,
                           {.step = specdec::tree{.shape = {.branching = {3, 1}}, .scheme = scheme},
                            .budget = {.max_new_tokens = kLength}},
                           rng)
                    .tokens;
            },
            exact, 4, 1101);
        INFO(describe(r));
        CHECK(r.p_value < kFalseAlarm);
    }
}

TEST_CASE("Negative control: a tree from children whose siblings are drawn without replacement but verified as "
          "i.i.d. is caught",
          "[statistical][distribution][tree][negative]") {
    auto target = markov_model::random(4, 2, 101);
    auto draft = markov_model::random(4, 2, 102);
    also_plain<mislabeled_drafter> drafter{};
    drafter.model = &draft;
    tree_markov verifier{&target};
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    const auto r = sequence_test(
        [&](std::mt19937_64& rng) {
            return specdec::speculative_decode(
                       drafter, verifier, kPrompt,
                       {.step = specdec::tree{.shape = specdec::tree_shape::from_children({3, 2, 0, 0, 1})},
                        .budget = {.max_new_tokens = kLength}},
                       rng)
                .tokens;
        },
        exact, 4, 1103);
    INFO(describe(r));
    CHECK(r.p_value < kFalseAlarm);
}

TEST_CASE("Negative control: recursive rejection without the residual update between siblings is caught",
          "[statistical][distribution][tree][negative]") {
    auto target = markov_model::random(4, 2, 111);
    auto draft = markov_model::random(4, 2, 112);
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    for (const bool update : {true, false}) {
        INFO((update ? "correct transcription" : "WRONG: no residual update"));
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) {
                std::vector<token_id> seq = kPrompt;
                specdec::uniform_source u(rng);
                specdec::draft_tree tree;
                std::vector<token_id> path;
                Eigen::VectorXf logits, q, scratch;
                specdec::sampling_workspace sws;
                while (seq.size() < kPrompt.size() + kLength) {
                    const std::size_t left = kPrompt.size() + kLength - seq.size();
                    specdec::tree_shape shape{.branching = {3, 1}, .draws = sibling_draws::iid};
                    shape.branching.resize(std::min<std::size_t>(2, left - 1));
                    if (shape.branching.empty()) tree.clear();
                    else specdec::draft_tree_from_model(draft, seq, shape, {}, u, tree, path, logits, q, scratch, sws);
                    const Eigen::MatrixXf z = tree_logits(target, seq, tree);
                    const auto [last, next] = ref_rrs_sample(tree, z, {}, rng, update);
                    specdec::path_tokens(tree, last, path);
                    seq.insert(seq.end(), path.begin(), path.end());
                    seq.push_back(next);
                }
                return std::vector<token_id>(seq.begin() + 1, seq.end());
            },
            exact, 4, 1111);
        INFO(describe(r));
        if (update) CHECK(r.p_value >= kFalseAlarm);
        else CHECK(r.p_value < kFalseAlarm);
    }
}

TEST_CASE("Negative control: a tree drafter whose q is not what it sampled from (draft-side sampling) is caught",
          "[statistical][distribution][tree][negative][draft-sampling]") {
    // The draft samples at temperature 0.4 (draft.sampling); the wrong drafter reports its
    // model's distributions at the target's temperature 1 as q. The honest one must pass.
    auto target = markov_model::random(4, 2, 161);
    auto draft = markov_model::random(4, 2, 162);
    tree_markov verifier{&target};
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    for (const bool honest : {true, false}) {
        also_plain<reporting_tree_drafter> drafter{};
        drafter.model = &draft;
        if (!honest) drafter.reported = specdec::sampling_config{};
        for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
            INFO((honest ? "q as sampled" : "WRONG: q at the target's temperature") << ", " << name(scheme));
            const specdec::decode_options opts{
                .step = specdec::tree{.shape = {.branching = {2, 1}, .draws = sibling_draws::without_replacement},
                                      .scheme = scheme},
                .draft = {.sampling = specdec::sampling_config{.temperature = 0.4f}},
                .budget = {.max_new_tokens = kLength}};
            const auto r = sequence_test(
                [&](std::mt19937_64& rng) {
                    return specdec::speculative_decode(drafter, verifier, kPrompt, opts, rng).tokens;
                },
                exact, 4, 1161);
            INFO(describe(r));
            if (honest) CHECK(r.p_value >= kFalseAlarm);
            else CHECK(r.p_value < kFalseAlarm);
        }
    }
}

TEST_CASE("Negative control: a draft-side stop that drops the unlikely node (not only its children) is caught",
          "[statistical][distribution][tree][negative][draft-stop]") {
    // The correct rule, applied by the drafter itself, must pass the same test.
    auto target = markov_model::random(4, 2, 171);
    auto draft = markov_model::random(4, 2, 172);
    tree_markov verifier{&target};
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    for (const bool drop_low : {false, true}) {
        also_plain<self_stopping_tree_drafter> drafter{};
        drafter.model = &draft;
        drafter.stop_below = 0.3f;
        drafter.drop_low = drop_low;
        for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
            INFO((drop_low ? "WRONG: the low node dropped" : "the low node kept, its children dropped") << ", "
                                                                                                       << name(scheme));
            const specdec::decode_options opts{
                .step = specdec::tree{.shape = {.branching = {2, 2, 1}, .draws = sibling_draws::iid}, .scheme = scheme},
                .budget = {.max_new_tokens = kLength}};
            const auto r = sequence_test(
                [&](std::mt19937_64& rng) {
                    return specdec::speculative_decode(drafter, verifier, kPrompt, opts, rng).tokens;
                },
                exact, 4, 1171);
            INFO(describe(r));
            if (drop_low) CHECK(r.p_value < kFalseAlarm);
            else CHECK(r.p_value >= kFalseAlarm);
        }
    }
}

namespace {

/// A planner that cheats, WRONG on purpose (a negative control for the tree planner): it draws
/// a tree of shape {2, 1} from the draft model, then keeps it only when the target gives the
/// first child's token probability at least 0.3, and otherwise proposes nothing (a plain step).
/// The step's shape then depends on the target's values at the drafted tokens, which a plan
/// must never see. With `honest`, the choice is made before drawing, from the draft's
/// confidence at the root (its largest q at least 0.5): a function of the context only, as the
/// planner's choices are, so exact. (Dropping the tree because of the drawn token's own q would
/// be wrong too: the draft-side stop keeps that token, see the control above.)
struct peeking_tree_drafter {
    markov_model* model = nullptr;
    markov_model* target = nullptr;
    bool honest = false;
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& u, specdec::draft_tree& out) {
        specdec::draft_tree_from_model(*model, context, shape, s, u, out, path, logits, q, scratch, sws);
        if (out.size() == 0) return;
        std::vector<token_id> ctx(context.begin(), context.end());
        if (honest) {
            const auto q_root = ref_standardize(model->next_logits(ctx), s);
            if (*std::max_element(q_root.begin(), q_root.end()) < 0.5) out.clear();
        } else {
            const auto p_root = ref_standardize(target->next_logits(ctx), s);
            if (p_root[static_cast<std::size_t>(out.tokens[0])] < 0.3) out.clear();
        }
    }
};

}  // namespace

TEST_CASE("Negative control: a tree shape chosen from the target's values at drafted tokens is caught (from the context: exact)",
          "[statistical][distribution][tree][negative][adaptive]") {
    auto target = markov_model::random(4, 2, 181);
    auto draft = markov_model::random(4, 2, 182);
    tree_markov verifier{&target};
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    for (const bool honest : {true, false}) {
        also_plain<peeking_tree_drafter> drafter{};
        drafter.model = &draft;
        drafter.target = &target;
        drafter.honest = honest;
        for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
            INFO((honest ? "shape from the draft's confidence at the root" : "WRONG: shape from the target's p at a drafted token")
                 << ", " << name(scheme));
            const specdec::decode_options opts{
                .step = specdec::tree{.shape = {.branching = {2, 1}, .draws = sibling_draws::iid}, .scheme = scheme},
                .budget = {.max_new_tokens = kLength}};
            const auto r = sequence_test(
                [&](std::mt19937_64& rng) {
                    return specdec::speculative_decode(drafter, verifier, kPrompt, opts, rng).tokens;
                },
                exact, 4, 1181);
            INFO(describe(r));
            if (honest) CHECK(r.p_value >= kFalseAlarm);
            else CHECK(r.p_value < kFalseAlarm);
        }
    }
}

namespace {

/// A model over V = 5000 tokens (three row blocks of the core) with eight live tokens spread over
/// the blocks, their logits a hash of the last token plus 0.7 per block (so that most rows have
/// their maximum in a later block than the first, whose block is then rescaled after the exp
/// pass), and the rest at −30 (mass about 1e-10); siblings' tokens, removed from each other's
/// columns without replacement, sit in different blocks.
struct sparse_model {
    static constexpr std::ptrdiff_t kVocab = 5000;
    static constexpr token_id kLive[8] = {3, 700, 2047, 2048, 2100, 4100, 4500, 4999};
    std::uint64_t seed = 1;
    float spread = 2.0f;
    std::ptrdiff_t vocab_size() const { return kVocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) const {
        Eigen::VectorXf out = Eigen::VectorXf::Constant(kVocab, -30.0f);
        const auto last = static_cast<std::uint64_t>(context.empty() ? 0 : context.back());
        for (std::uint64_t k = 0; k < 8; ++k) {
            std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + last * 0xbf58476d1ce4e5b9ull + k * 0x94d049bb133111ebull;
            z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
            z ^= z >> 29;
            out[kLive[k]] = spread * static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53) +
                            0.7f * static_cast<float>(kLive[k] / 2048);
        }
        return out;
    }
};

std::size_t live_index(token_id t) {
    const auto* at = std::find(std::begin(sparse_model::kLive), std::end(sparse_model::kLive), t);
    return static_cast<std::size_t>(at - std::begin(sparse_model::kLive));  // 8: not live
}

/// Counts of the first two tokens after the context {1} (8 x 8 cells over the live tokens),
/// decoded with trees drafted with `how` and verified with `scheme`: the first verification's
/// accepted path and drawn token, and when it accepted nothing a second one after the drawn
/// token. With `mislabel`, trees drawn without replacement are verified as i.i.d. (wrong: the
/// negative control). Checks that no other token is emitted.
std::vector<std::size_t> two_token_counts(const std::vector<std::size_t>& branching, sibling_draws how,
                                          tree_verification_scheme scheme, bool mislabel, std::uint64_t seed,
                                          std::size_t n) {
    const sparse_model target{.seed = 11, .spread = 3.0f}, draft{.seed = 12, .spread = 4.0f};
    std::mt19937_64 rng(seed);
    specdec::uniform_source uniforms(rng);
    specdec::draft_tree tree;
    std::vector<token_id> path, ctx, accepted;
    Eigen::VectorXf logits, q, scratch;
    Eigen::MatrixXf z;
    specdec::sampling_workspace sws;
    specdec::tree_verify_workspace ws;
    const auto step = [&](const std::vector<token_id>& context) {  // the tokens one tree step emits
        specdec::draft_tree_from_model(draft, context, {.branching = branching, .draws = how}, {}, uniforms, tree, path,
                                       logits, q, scratch, sws);
        if (mislabel) tree.draws.assign(tree.size(), sibling_draws::iid);
        z.resize(sparse_model::kVocab, static_cast<Eigen::Index>(tree.size() + 1));
        z.col(0) = target.next_logits(context);
        for (std::size_t c = 0; c < tree.size(); ++c) {
            specdec::path_tokens(tree, static_cast<std::int32_t>(c), ctx);
            ctx.insert(ctx.begin(), context.begin(), context.end());
            z.col(static_cast<Eigen::Index>(c + 1)) = target.next_logits(ctx);
        }
        const auto r = specdec::verify_tree(z, tree, {}, rng, ws, {.scheme = scheme});
        specdec::path_tokens(tree, r.last_node, accepted);
        accepted.push_back(r.next_token);
        return accepted;
    };
    std::vector<std::size_t> counts(64, 0);
    std::size_t elsewhere = 0;
    for (std::size_t i = 0; i < n; ++i) {
        std::vector<token_id> out = step({1});
        if (out.size() < 2) out.push_back(step({1, out[0]}).front());
        const std::size_t a = live_index(out[0]), b = live_index(out[1]);
        if (a == 8 || b == 8) ++elsewhere;
        else ++counts[a * 8 + b];
    }
    CHECK(elsewhere == 0);
    return counts;
}

/// The exact law of those two tokens (the dead tokens' 1e-10 of mass left out).
std::vector<double> two_token_law() {
    const sparse_model target{.seed = 11, .spread = 3.0f};
    const auto live_law = [&](const std::vector<token_id>& context) {
        const auto p = ref_standardize(target.next_logits(context), {});
        std::vector<double> law;
        for (const token_id t : sparse_model::kLive) law.push_back(p[static_cast<std::size_t>(t)]);
        double total = 0.0;
        for (double x : law) total += x;
        for (double& x : law) x /= total;
        return law;
    };
    const auto first = live_law({1});
    std::vector<double> law;
    for (std::size_t a = 0; a < 8; ++a) {
        const auto second = live_law({1, sparse_model::kLive[a]});
        for (std::size_t b = 0; b < 8; ++b) law.push_back(first[a] * second[b]);
    }
    return law;
}

}  // namespace

TEST_CASE("Over a vocabulary of several row blocks tree decoding keeps the target's law of two tokens",
          "[statistical][distribution][tree]") {
    // 30,000 two-token decodes per case, against the exact law (64 cells): the core's tree
    // passes across row blocks (rescaled blocks, tokens removed in other blocks, the lazily
    // summed mass left after earlier siblings). False alarm: p < 1e-4 per case, 4 cases.
    const auto law = two_token_law();
    struct shape_case {
        std::vector<std::size_t> branching;
        sibling_draws how;
    };
    const std::vector<shape_case> shapes{{{3, 2}, sibling_draws::without_replacement}, {{2, 2, 1}, sibling_draws::iid}};
    std::uint64_t seed = 500;
    for (const auto& sh : shapes)
        for (const auto scheme : {tree_verification_scheme::traversal, tree_verification_scheme::recursive_rejection}) {
            INFO(name(scheme) << ", depth " << sh.branching.size());
            const auto r = chi_square_test(two_token_counts(sh.branching, sh.how, scheme, false, ++seed, 30000), law);
            INFO("chi2 = " << r.statistic << ", p = " << r.p_value);
            CHECK(r.p_value >= kFalseAlarm);
        }
}

TEST_CASE("Negative control: over several row blocks, siblings drawn without replacement but verified as i.i.d. "
          "are caught",
          "[statistical][distribution][tree][negative]") {
    const auto law = two_token_law();
    for (const auto scheme : {tree_verification_scheme::traversal, tree_verification_scheme::recursive_rejection}) {
        INFO(name(scheme));
        const auto r = chi_square_test(two_token_counts({3, 2}, sibling_draws::without_replacement, scheme, true, 600, 30000), law);
        INFO("chi2 = " << r.statistic << ", p = " << r.p_value);
        CHECK(r.p_value < kFalseAlarm);
    }
}
