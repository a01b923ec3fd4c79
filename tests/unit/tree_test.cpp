// Draft trees and their exact verification (tree.hpp, tree_verify.hpp) and tree steps of
// speculative_decode (`.step = specdec::tree{...}`): malformed trees are rejected with a message;
// the exact expected accepted length by enumeration equals the empirical mean of the library's
// verification; traversal verification is never worse than recursive rejection sampling (which
// is why it is the default); a chain under traversal verification has exactly block
// verification's law; temperature 0 is greedy decoding, token for token, also with the draft's
// own sampling, the draft-side stop and the adaptive depth; a tree step draws exactly what a
// hand-written loop of draft_tree_from_model and verify_tree draws, and its step_event says so;
// a verifier without score_tree scores the same columns.
//
// False alarms: the mean tests reject at |z| > 5 (two-sided, about 6e-7 each under the normal
// approximation); the chi-square tests at p < 1e-4 (one or two in 10^4 each, see
// distribution_test.cpp). About 30 such tests: a correct implementation fails a run with
// probability about 3e-3 at most; the seeds are fixed, so a run is reproducible.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/stats.hpp"
#include "support/tree_reference.hpp"

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

using namespace specdec_test;
using specdec::draft_tree;
using specdec::sibling_draws;
using specdec::token_id;
using specdec::tree_verification_scheme;

static_assert(specdec::TreeVerifier<tree_markov>);
static_assert(!specdec::TreeVerifier<markov_model>);
static_assert(!specdec::TreeDrafter<markov_model>);
static_assert(specdec::AnyTreeDrafter<markov_model>);
static_assert(specdec::AnyTreeDrafter<shift_drafter>);
static_assert(specdec::AnyTreeVerifier<batched_markov>);

namespace {

constexpr tree_verification_scheme kTreeSchemes[] = {tree_verification_scheme::recursive_rejection,
                                                     tree_verification_scheme::traversal};
const char* name(tree_verification_scheme s) {
    return s == tree_verification_scheme::traversal ? "traversal verification" : "recursive rejection sampling";
}
const char* name(sibling_draws d) { return d == sibling_draws::iid ? "i.i.d. siblings" : "without replacement"; }

/// A valid two-level tree over V = 4 with distributions: root -> {1, 2}, 1 -> {3}.
draft_tree small_tree() {
    draft_tree t;
    t.add(-1, 1, sibling_draws::without_replacement);
    t.add(-1, 2, sibling_draws::without_replacement);
    t.add(0, 3);
    t.resize_probs(4, 3).setConstant(0.25f);
    return t;
}

template <class F>
void expect_invalid(F&& f, const std::string& fragment) {
    try {
        f();
        FAIL("no exception; expected one mentioning \"" << fragment << "\"");
    } catch (const std::invalid_argument& e) {
        INFO(e.what());
        CHECK(std::string(e.what()).find(fragment) != std::string::npos);
    }
}

struct enum_case {
    int vocab = 4;
    std::vector<std::size_t> branching;
    sibling_draws draws = sibling_draws::iid;
    specdec::sampling_config sampling{};
    std::uint64_t target_seed = 1, draft_seed = 2;
};

struct exact_lengths {
    double rrs = 0.0, tv = 0.0;
};

exact_lengths enumerate_expected(const enum_case& c) {
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    const std::vector<token_id> context{0, 1};
    exact_lengths out;
    double total = 0.0;
    enumerate_trees(draft, context, c.branching, c.draws, c.sampling, [&](const draft_tree& t, double prob) {
        const Eigen::MatrixXf logits = tree_logits(target, context, t);
        out.rrs += prob * ref_rrs_expected(t, logits, c.sampling);
        out.tv += prob * ref_tv_expected(t, logits, c.sampling);
        total += prob;
    });
    REQUIRE(std::abs(total - 1.0) < 1e-6);
    return out;
}

}  // namespace

TEST_CASE("A chain made from a block counts its draft calls as decode_stats does", "[tree]") {
    specdec::draft_block block;
    specdec::draft_tree tree;
    specdec::tree_from_block(block, tree);
    CHECK(tree.model_calls == 0);  // nothing proposed
    block.tokens = {1, 2, 3};
    specdec::tree_from_block(block, tree);
    CHECK(tree.size() == 3);
    CHECK(tree.model_calls == 1);  // not reported: one call for a block that proposed tokens
    block.model_calls = 3;
    specdec::tree_from_block(block, tree);
    CHECK(tree.model_calls == 3);
}

TEST_CASE("Malformed trees are rejected with a message that names the problem", "[tree]") {
    specdec::tree_verify_workspace ws;
    std::mt19937_64 rng(1);
    const Eigen::MatrixXf logits = Eigen::MatrixXf::Zero(4, 4);
    auto verify = [&](const draft_tree& t, const Eigen::MatrixXf& z) { (void)specdec::verify_tree(z, t, {}, rng, ws); };

    CHECK_NOTHROW(verify(small_tree(), logits));
    expect_invalid([&] { draft_tree t; t.add(3, 1); }, "parent = 3");
    {
        auto t = small_tree();
        t.parents[1] = 2;  // a parent after its child
        expect_invalid([&] { verify(t, logits); }, "node 1 has parent 2");
    }
    {
        auto t = small_tree();
        t.depths[2] = 3;
        expect_invalid([&] { verify(t, logits); }, "node 2 has depth 3");
    }
    {
        auto t = small_tree();
        t.tokens[2] = 4;
        expect_invalid([&] { verify(t, logits); }, "token 4, out of range");
    }
    {
        auto t = small_tree();
        t.depths.pop_back();
        expect_invalid([&] { verify(t, logits); }, "arrays disagree");
    }
    {
        auto t = small_tree();
        t.resize_probs(4, 2);
        expect_invalid([&] { verify(t, logits); }, "probs is 4 x 2");
    }
    {
        auto t = small_tree();
        t.probs(1, 0) = 0.0f;
        t.probs(0, 0) = 0.5f;
        expect_invalid([&] { verify(t, logits); }, "node 0 has token 1 of draft probability 0");
    }
    {
        auto t = small_tree();
        t.probs(0, 2) = 0.5f;  // column 2 sums to 1.25
        expect_invalid([&] { verify(t, logits); }, "column 2 of the tree's probs is not a distribution");
    }
    {
        auto t = small_tree();
        t.tokens[1] = 1;  // drawn without replacement, yet equal to its earlier sibling
        expect_invalid([&] { verify(t, logits); }, "repeats its earlier sibling 0");
    }
    expect_invalid([&] { verify(small_tree(), Eigen::MatrixXf::Zero(4, 3)); }, "expected one for the root and one per node = 4");
    {
        Eigen::MatrixXf bad = logits;
        bad(1, 0) = std::nanf("");
        expect_invalid([&] { verify(small_tree(), bad); }, "specdec::verify_tree: target_logits column 0: logit 1 is NaN");
        bad(1, 0) = std::numeric_limits<float>::infinity();
        expect_invalid([&] { verify(small_tree(), bad); }, "specdec::verify_tree: target_logits column 0: logit 1 is +Inf");
        bad.col(0).setConstant(-std::numeric_limits<float>::infinity());
        expect_invalid([&] { verify(small_tree(), bad); }, "target_logits column 0: every logit is -Inf");
        // The same at temperature 0 (standardize's checks) and for a node's column: node 0's
        // row (column 1) is read whenever its token is accepted, which a root column whose
        // argmax is token 1 (small_tree's node 0) makes certain at temperature 0.
        bad = logits;
        bad(1, 0) = 1.0f;
        bad(2, 1) = std::nanf("");
        expect_invalid([&] { (void)specdec::verify_tree(bad, small_tree(), {.temperature = 0.0f}, rng, ws); },
                       "specdec::verify_tree: target_logits column 1: logit 2 is NaN");
    }
    auto target = markov_model::random(4, 2, 3);
    std::vector<token_id> prompt{0};
    expect_invalid(
        [&] {
            (void)specdec::speculative_decode(target, target, prompt, {.step = specdec::tree{.shape = {.branching = {}}}},
                                              rng);
        },
        "depth 0");
}

TEST_CASE("The exact expected accepted length by enumeration equals the empirical mean of verify_tree",
          "[tree][statistical]") {
    const std::vector<enum_case> cases{
        {.branching = {3}, .draws = sibling_draws::iid, .target_seed = 5, .draft_seed = 6},
        {.branching = {2, 2}, .draws = sibling_draws::without_replacement, .target_seed = 7, .draft_seed = 8},
        {.branching = {2, 1, 1}, .draws = sibling_draws::iid, .sampling = {.temperature = 0.7f}, .target_seed = 9, .draft_seed = 10},
        {.branching = {1, 1, 1}, .draws = sibling_draws::iid, .target_seed = 11, .draft_seed = 12},
        {.vocab = 5, .branching = {3, 1}, .draws = sibling_draws::without_replacement, .sampling = {.top_k = 3}, .target_seed = 13, .draft_seed = 14},
    };
    constexpr std::size_t n = 100000;
    for (const auto& c : cases) {
        const exact_lengths exact = enumerate_expected(c);
        auto target = markov_model::random(c.vocab, 2, c.target_seed);
        auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
        const std::vector<token_id> context{0, 1};
        for (const auto scheme : kTreeSchemes) {
            INFO(name(scheme) << ", " << name(c.draws) << ", depth " << c.branching.size());
            std::mt19937_64 rng(100 + c.target_seed);
            specdec::uniform_source uniforms(rng);
            specdec::draft_tree tree;
            std::vector<token_id> path;
            Eigen::VectorXf logits, q, scratch;
            specdec::sampling_workspace sws;
            specdec::tree_verify_workspace ws;
            const specdec::tree_shape shape{.branching = c.branching, .draws = c.draws};
            double sum = 0.0, sum2 = 0.0;
            for (std::size_t i = 0; i < n; ++i) {
                specdec::draft_tree_from_model(draft, context, shape, c.sampling, uniforms, tree, path, logits, q,
                                               scratch, sws);
                const Eigen::MatrixXf z = tree_logits(target, context, tree);
                const auto r = specdec::verify_tree(z, tree, c.sampling, rng, ws, {.scheme = scheme});
                const auto a = static_cast<double>(r.accepted);
                sum += a;
                sum2 += a * a;
            }
            const double mean = sum / n, var = sum2 / n - mean * mean;
            const double want = scheme == tree_verification_scheme::traversal ? exact.tv : exact.rrs;
            const double z = (mean - want) / std::sqrt(var / n);
            INFO("exact " << want << ", empirical " << mean << ", z = " << z);
            CHECK(std::abs(z) < 5.0);
        }
    }
}

TEST_CASE("Traversal verification accepts at least as many tokens as recursive rejection sampling (enumeration)",
          "[tree]") {
    // The evidence behind the default: on every case, exact expected accepted lengths.
    std::size_t strictly_better = 0, deep = 0;
    const std::vector<std::vector<std::size_t>> shapes{{3}, {2, 2}, {1, 1, 1}, {2, 1, 1}, {3, 1}, {2, 2, 1}};
    const std::vector<specdec::sampling_config> samplings{{}, {.temperature = 0.6f}, {.top_k = 2}, {.top_p = 0.8f}};
    std::uint64_t seed = 200;
    for (const auto& shape : shapes)
        for (const auto& s : samplings)
            for (const auto draws : {sibling_draws::iid, sibling_draws::without_replacement}) {
                seed += 2;
                const enum_case c{.vocab = 4, .branching = shape, .draws = draws, .sampling = s,
                                  .target_seed = seed, .draft_seed = seed + 1};
                const exact_lengths e = enumerate_expected(c);
                INFO("shape depth " << shape.size() << ", first branching " << shape[0] << ", " << name(draws)
                                    << ": traversal " << e.tv << ", recursive rejection " << e.rrs);
                CHECK(e.tv >= e.rrs - 1e-6);
                if (shape.size() == 1) CHECK(std::abs(e.tv - e.rrs) < 1e-6);  // identical at depth 1
                if (shape.size() > 1) {
                    ++deep;
                    strictly_better += e.tv > e.rrs + 1e-6;
                }
            }
    INFO(strictly_better << " of " << deep << " deeper cases strictly better");
    CHECK(strictly_better * 2 > deep);
}

TEST_CASE("A chain under traversal verification has exactly block verification's law", "[tree][statistical]") {
    // Exact: for every chain the draft can draw, the accepted count's law under the traversal
    // recursion (probability of acceptance at each depth) equals Sun et al.'s block verification.
    auto target = markov_model::random(4, 2, 31);
    auto draft = markov_model::random(4, 2, 32);
    const std::vector<token_id> context{0, 1};
    const specdec::sampling_config s{.temperature = 0.8f};
    std::vector<double> tv_law(4, 0.0), block_law(4, 0.0);
    enumerate_trees(draft, context, {1, 1, 1}, sibling_draws::iid, s, [&](const draft_tree& t, double prob) {
        const Eigen::MatrixXf z = tree_logits(target, context, t);
        std::vector<dvec> p, q;
        std::vector<std::size_t> x;
        for (std::size_t i = 0; i < 3; ++i) {
            p.push_back(ref_standardize(z.col(static_cast<Eigen::Index>(i)), s));
            q.push_back(ref_draft_dist(t, i));
            x.push_back(static_cast<std::size_t>(t.tokens[i]));
        }
        p.push_back(ref_standardize(z.col(3), s));
        const dvec law = ref_block_law(p, q, x);
        for (std::size_t i = 0; i < 4; ++i) block_law[i] += prob * law[i];
        // Traversal: P(accepted >= i) from the chain truncated after node i − 1 is not the
        // law; instead compute P(τ = i) directly by the recursion's acceptance weights.
        // E over a chain of depth d of the traversal recursion, for d = 1..3, gives P(τ >= i).
        for (std::size_t d = 1; d <= 3; ++d) {
            // P(τ >= d): the visit of node d−1 (weight w) and anything below it accepts.
            double w = 1.0;
            for (std::size_t i = 0; i < d; ++i) w = std::min(1.0, w * p[i][x[i]] / q[i][x[i]]);
            tv_law[d] += prob * w;  // the visit of node d − 1 accepts with probability w (invariant)
        }
    });
    // tv_law[d] holds P(τ >= d); turn it into P(τ = d).
    tv_law[0] = 1.0;
    for (std::size_t d = 0; d < 3; ++d) tv_law[d] -= tv_law[d + 1];
    for (std::size_t i = 0; i < 4; ++i) {
        INFO("accepted " << i << ": traversal " << tv_law[i] << ", block " << block_law[i]);
        CHECK(std::abs(tv_law[i] - block_law[i]) < 1e-6);  // float columns
    }
    // Empirical: the library's traversal verification on chains, and its block verification of
    // the same chains as blocks, both against the exact law.
    for (const bool as_tree : {true, false}) {
        INFO((as_tree ? "verify_tree, traversal" : "verify, block scheme"));
        std::mt19937_64 rng(as_tree ? 41 : 42);
        specdec::uniform_source uniforms(rng);
        specdec::draft_tree tree;
        std::vector<token_id> path;
        Eigen::VectorXf logits, q, scratch;
        specdec::sampling_workspace sws;
        specdec::tree_verify_workspace tws;
        specdec::verify_workspace vws;
        std::vector<std::size_t> counts(4, 0);
        for (int i = 0; i < 100000; ++i) {
            specdec::draft_tree_from_model(draft, context, {.branching = {1, 1, 1}}, s, uniforms, tree, path, logits, q,
                                           scratch, sws);
            const Eigen::MatrixXf z = tree_logits(target, context, tree);
            std::size_t a;
            if (as_tree) {
                a = specdec::verify_tree(z, tree, s, rng, tws).accepted;
            } else {
                const std::vector<token_id> toks(tree.tokens.begin(), tree.tokens.end());
                a = specdec::verify(z, toks, tree.probs, s, rng, vws).accepted;
            }
            ++counts[a];
        }
        const auto r = chi_square_test(counts, block_law);
        INFO("chi2 = " << r.statistic << ", p = " << r.p_value);
        CHECK(r.p_value >= 1e-4);
    }
}

TEST_CASE("At temperature 0 tree decoding is greedy decoding, token for token", "[tree]") {
    auto target = markov_model::random(6, 2, 51);
    auto draft = markov_model::random(6, 2, 52);
    auto near = target;  // a draft that agrees with the target most of the time
    for (std::size_t i = 0; i < near.table.size(); i += 5) near.table[i] += 0.8f;
    const std::vector<token_id> prompt{0, 3};
    const specdec::sampling_config greedy{.temperature = 0.0f};
    std::mt19937_64 ar_rng(1);
    const auto expected =
        specdec::autoregressive_decode(target, prompt, {.sampling = greedy, .budget = {.max_new_tokens = 40}}, ar_rng)
            .tokens;
    tree_markov verifier{&target};
    for (const auto scheme : kTreeSchemes)
        for (markov_model* d : {&draft, &near})
            for (const auto& branching : std::vector<std::vector<std::size_t>>{{3}, {1, 1, 1, 1}, {3, 2, 1, 1}}) {
                for (const auto draws : {sibling_draws::iid, sibling_draws::without_replacement}) {
                    INFO(name(scheme) << ", " << name(draws) << ", depth " << branching.size());
                    std::mt19937_64 rng(7);
                    const auto out = specdec::speculative_decode(
                        *d, verifier, prompt,
                        {.step = specdec::tree{.shape = {.branching = branching, .draws = draws}, .scheme = scheme},
                         .sampling = greedy,
                         .budget = {.max_new_tokens = 40}},
                        rng);
                    CHECK(out.tokens == expected);
                }
            }
}

TEST_CASE("A verifier without score_tree scores the same columns, path by path or node by node", "[tree]") {
    auto target = markov_model::random(5, 2, 61);
    auto draft = markov_model::random(5, 2, 62);
    std::mt19937_64 rng(3);
    specdec::uniform_source uniforms(rng);
    specdec::draft_tree tree;
    std::vector<token_id> path;
    std::vector<char> leaf;
    Eigen::VectorXf logits, q, scratch;
    specdec::sampling_workspace sws;
    const std::vector<token_id> context{2, 4};
    specdec::draft_tree_from_model(draft, context, {.branching = {3, 2, 1}}, {}, uniforms, tree, path, logits, q,
                                   scratch, sws);
    REQUIRE(tree.size() == 3 + 6 + 6);
    CHECK(tree.model_calls == 1 + 3 + 6);
    const Eigen::MatrixXf want = tree_logits(target, context, tree);
    batched_markov batched{&target};
    Eigen::MatrixXf got;
    CHECK(specdec::detail::score_tree_by_paths(batched, context, tree, got, path, leaf, logits, "test") == 6);
    CHECK(got == want);
    CHECK(specdec::detail::score_tree_by_paths(target, context, tree, got, path, leaf, logits, "test") == 16);
    CHECK(got == want);
}

TEST_CASE("Model-drafted trees have the requested shape and distinct siblings without replacement", "[tree]") {
    auto draft = markov_model::random(6, 2, 71);
    std::mt19937_64 rng(5);
    specdec::uniform_source uniforms(rng);
    specdec::draft_tree tree;
    std::vector<token_id> path;
    Eigen::VectorXf logits, q, scratch;
    specdec::sampling_workspace sws;
    for (int rep = 0; rep < 200; ++rep) {
        specdec::draft_tree_from_model(draft, std::vector<token_id>{1}, {.branching = {4, 2, 1}, .max_nodes = 14}, {},
                                       uniforms, tree, path, logits, q, scratch, sws);
        REQUIRE(tree.size() == 14);
        CHECK(tree.max_depth() == 3);
        CHECK_NOTHROW(specdec::validate(tree, 6));
        for (std::size_t i = 0; i < tree.size(); ++i)
            for (std::size_t j = 0; j < i; ++j)
                if (tree.parents[i] == tree.parents[j]) CHECK(tree.tokens[i] != tree.tokens[j]);
    }
    // Top-k 2 leaves two tokens: a group of 4 without replacement stops after 2.
    specdec::draft_tree_from_model(draft, std::vector<token_id>{1}, {.branching = {4}}, {.top_k = 2}, uniforms, tree,
                                   path, logits, q, scratch, sws);
    CHECK(tree.size() == 2);
    CHECK(tree.probs.cols() == 2);
}

TEST_CASE("Verification reads only the target rows it needs", "[tree]") {
    // Point masses at temperature 0: root -> {a = 2 (the argmax), b = 1}; a -> {c = 3 (its argmax)};
    // b -> {0}. Both schemes accept a, then c, and never read the rows of b's subtree.
    draft_tree t;
    t.add(-1, 2);
    t.add(-1, 1);
    t.add(0, 3);
    t.add(1, 0);
    Eigen::MatrixXf z = Eigen::MatrixXf::Zero(4, 5);
    z(2, 0) = 5.0f;  // root: argmax 2 = a
    z(3, 1) = 5.0f;  // after a: argmax 3 = c
    z(0, 3) = 5.0f;  // after c (a leaf): argmax 0
    specdec::tree_verify_workspace ws;
    std::mt19937_64 rng(1);
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        const auto r = specdec::verify_tree(z, t, {.temperature = 0.0f}, rng, ws, {.scheme = scheme});
        CHECK(r.accepted == 2);
        CHECK(r.last_node == 2);
        CHECK(r.next_token == 0);
        CHECK(ws.rows_read() == 3);  // root, a, c: not b, nor b's child
    }
}

namespace {

struct ref_tree_step {
    draft_tree tree;            // after the draft-side stop
    std::size_t drawn = 0;      // nodes drawn before it
    std::size_t asked = 0;      // the depth asked
    specdec::tree_verify_result r{};
};

struct ref_tree_run {
    std::vector<token_id> tokens;
    std::vector<ref_tree_step> steps;
};

struct ref_tree_settings {
    specdec::tree_shape shape;
    tree_verification_scheme scheme = tree_verification_scheme::traversal;
    specdec::sampling_config sampling{};        // the target's
    specdec::sampling_config draft_sampling{};  // the draft's
    float stop_below = 0.0f;
    std::size_t max_new_tokens = 0;
    std::vector<token_id> stop_tokens{};
};

/// What a tree decode under the fixed policy must draw, written with the public primitives
/// only: per step the depth min(shape depth, tokens still needed − 1); a tree of the shape cut
/// to that depth drawn by draft_tree_from_model with the draft's settings (uniforms from `rng`);
/// the draft-side stop (ref_prune); the target's columns; verify_tree with `rng`; the accepted
/// path and the drawn token appended, cut after a stop token.
ref_tree_run ref_tree_decode(markov_model& draft, markov_model& target, const std::vector<token_id>& prompt,
                             const ref_tree_settings& c, std::mt19937_64& rng) {
    ref_tree_run out;
    std::vector<token_id> seq = prompt, path;
    draft_tree tree;
    Eigen::VectorXf logits, q, scratch;
    specdec::sampling_workspace sws;
    specdec::tree_verify_workspace ws;
    while (out.tokens.size() < c.max_new_tokens) {
        ref_tree_step step;
        step.asked = std::min(c.shape.depth(), c.max_new_tokens - out.tokens.size() - 1);
        specdec::tree_shape cut = c.shape;
        cut.branching.resize(step.asked);
        tree.clear();
        if (step.asked > 0) {
            specdec::uniform_source u(rng);
            specdec::draft_tree_from_model(draft, seq, cut, c.draft_sampling, u, tree, path, logits, q, scratch, sws);
        }
        step.drawn = tree.size();
        step.tree = ref_prune(tree, c.stop_below);
        const Eigen::MatrixXf z = tree_logits(target, seq, step.tree);
        step.r = specdec::verify_tree(z, step.tree, c.sampling, rng, ws, {.scheme = c.scheme});
        specdec::path_tokens(step.tree, step.r.last_node, path);
        path.push_back(step.r.next_token);
        bool stopped = false;
        for (const token_id t : path) {
            out.tokens.push_back(t);
            seq.push_back(t);
            if (std::find(c.stop_tokens.begin(), c.stop_tokens.end(), t) != c.stop_tokens.end()) {
                stopped = true;
                break;
            }
        }
        out.steps.push_back(std::move(step));
        if (stopped) break;
    }
    return out;
}

/// The number of children of the root (its sibling group).
std::size_t root_group(const draft_tree& t) {
    return static_cast<std::size_t>(std::count(t.parents.begin(), t.parents.end(), -1));
}

/// Known costs for the adaptive depth (reproducible runs), exploring every other step.
specdec::adaptive_gamma_options known_costs() {
    specdec::adaptive_gamma_options o;
    o.draft_cost = [](std::size_t n) { return 0.05 * static_cast<double>(n); };
    o.pass_cost = [](std::size_t m) { return 1.0 + 0.05 * static_cast<double>(m - 1); };
    o.explore_every = 2;
    o.max_explore_every = 2;
    o.explore_budget = 1.0;
    o.window = 8;
    return o;
}

std::size_t distinct_lengths(std::span<const std::size_t> counts) {
    return static_cast<std::size_t>(std::count_if(counts.begin(), counts.end(), [](std::size_t n) { return n != 0; }));
}

}  // namespace

TEST_CASE("A tree step draws what draft_tree_from_model, the draft-side stop and verify_tree draw, as its event "
          "says",
          "[tree]") {
    // The reference is a loop of the public primitives (ref_tree_decode): token for token, tree
    // for tree, uniform for uniform, under both schemes, with the target's sampling for the
    // draft or the draft's own, with and without the draft-side stop, with a stop token.
    auto target = markov_model::random(6, 2, 81);
    auto draft = markov_model::random(6, 2, 82);
    tree_markov verifier{&target};
    const std::vector<token_id> prompt{0, 3};
    const specdec::sampling_config s{.temperature = 0.9f};
    struct variant {
        const char* what;
        std::optional<specdec::sampling_config> draft_sampling;
        float stop_below;
        std::vector<token_id> stop_tokens;
        sibling_draws draws;
    };
    const variant variants[] = {
        {"the target's sampling for the draft", std::nullopt, 0.0f, {}, sibling_draws::without_replacement},
        {"draft at temperature 1.3, top-k 4", specdec::sampling_config{.temperature = 1.3f, .top_k = 4}, 0.0f, {},
         sibling_draws::iid},
        {"draft-side stop 0.25", std::nullopt, 0.25f, {}, sibling_draws::without_replacement},
        {"draft at temperature 1.5, stop 0.3, stop token 5", specdec::sampling_config{.temperature = 1.5f}, 0.3f, {5},
         sibling_draws::iid},
    };
    for (const auto scheme : kTreeSchemes)
        for (const auto& v : variants) {
            INFO(name(scheme) << ", " << v.what);
            const specdec::tree_shape shape{.branching = {3, 2, 1}, .max_nodes = 12, .draws = v.draws};
            const ref_tree_settings settings{.shape = shape, .scheme = scheme, .sampling = s,
                                             .draft_sampling = v.draft_sampling.value_or(s), .stop_below = v.stop_below,
                                             .max_new_tokens = 60, .stop_tokens = v.stop_tokens};
            std::mt19937_64 rng_ref(9), rng_lib(9);
            const ref_tree_run want = ref_tree_decode(draft, target, prompt, settings, rng_ref);
            REQUIRE(!want.steps.empty());
            std::size_t k = 0, passes = 0, bad_events = 0;
            std::vector<token_id> stream, path;
            verifier.passes = 0;
            // (Assigned member by member: GCC 12 warns, wrongly, that a braced initializer
            // with the stop-token vector leaves it uninitialized.)
            specdec::decode_options options;
            options.step = specdec::tree{.shape = shape, .scheme = scheme};
            options.sampling = s;
            options.draft = {.sampling = v.draft_sampling, .stop_below = v.stop_below};
            options.budget.max_new_tokens = 60;
            options.budget.stop_tokens = v.stop_tokens;
            options.on_step = [&](const specdec::step_event& e) {
                if (k >= want.steps.size() || e.tree == nullptr) {
                    ++bad_events;
                    return;
                }
                const ref_tree_step& w = want.steps[k++];
                specdec::path_tokens(*e.tree, e.last_node, path);
                const bool ok =
                    e.sequence == 0 && e.tree->tokens == w.tree.tokens && e.tree->parents == w.tree.parents &&
                    e.tree->probs.rows() == w.tree.probs.rows() && e.tree->probs.cols() == w.tree.probs.cols() &&
                    e.tree->probs == w.tree.probs && e.gamma == w.asked && e.last_node == w.r.last_node &&
                    e.accepted == w.r.accepted && e.next_token == w.r.next_token &&
                    e.draft.size() == e.accepted &&
                    std::equal(e.draft.begin(), e.draft.end(), path.begin(), path.end()) &&
                    e.target_passes == 1 && e.acceptance.empty() &&
                    // Emitted: the accepted path, then the token, cut after a stop token.
                    e.emitted.size() <= e.accepted + 1 &&
                    std::equal(e.emitted.begin(), e.emitted.begin() + static_cast<std::ptrdiff_t>(
                                                                          std::min(e.emitted.size(), e.accepted)),
                               e.draft.begin()) &&
                    (e.emitted.size() <= e.accepted || e.emitted.back() == e.next_token);
                if (!ok) {
                    ++bad_events;
                    UNSCOPED_INFO("step " << k - 1 << " differs from the reference");
                }
                passes += e.target_passes;
                stream.insert(stream.end(), e.emitted.begin(), e.emitted.end());
            };
            const auto got = specdec::speculative_decode(draft, verifier, prompt, options, rng_lib);
            CHECK(bad_events == 0);
            CHECK(got.tokens == want.tokens);
            CHECK(k == want.steps.size());
            CHECK(stream == got.tokens);
            CHECK(rng_ref() == rng_lib());  // the same uniforms were drawn
            std::size_t drafted = 0, drawn = 0, draft_calls = 0, accepted = 0;
            std::vector<std::size_t> at_depth(shape.depth() + 1, 0);
            for (const auto& w : want.steps) {
                drafted += w.tree.size();
                drawn += w.drawn;
                draft_calls += w.tree.model_calls;
                accepted += w.r.accepted;
                ++at_depth[w.asked];
            }
            CHECK(got.stats.steps == want.steps.size());
            CHECK(got.stats.target_calls == passes);
            CHECK(verifier.passes == passes);
            CHECK(got.stats.drafted_tokens == drafted);
            CHECK(got.stats.draft_calls == draft_calls);
            CHECK(got.stats.accepted_tokens == accepted);
            at_depth.resize(got.stats.steps_at_gamma.size(), 0);
            CHECK(got.stats.steps_at_gamma == at_depth);
            if (v.stop_below > 0.0f) CHECK(drafted < drawn);  // the stop pruned
            else CHECK(drafted == drawn);
            if (!v.stop_tokens.empty()) CHECK(got.stop == specdec::stop_reason::stop_token);
            else CHECK(got.tokens.size() == 60);
        }
}

TEST_CASE("At temperature 0 tree decoding with the draft's own sampling is greedy decoding, and the draft uses it",
          "[tree]") {
    // The draft samples its trees with draft.sampling (visible in the trees: one child per group
    // at temperature 0 without replacement, two under top-k 2, three otherwise; and in the
    // columns, its q under those settings); the target at temperature 0 still decodes greedily.
    auto target = markov_model::random(6, 2, 51);
    auto draft = markov_model::random(6, 2, 52);
    auto near = target;
    for (std::size_t i = 0; i < near.table.size(); i += 5) near.table[i] += 0.8f;
    const std::vector<token_id> prompt{0, 3};
    const specdec::sampling_config greedy{.temperature = 0.0f};
    std::mt19937_64 ar_rng(1);
    const auto expected =
        specdec::autoregressive_decode(target, prompt, {.sampling = greedy, .budget = {.max_new_tokens = 60}}, ar_rng)
            .tokens;
    tree_markov verifier{&target};
    struct draft_case {
        specdec::sampling_config sampling;
        std::size_t root_group;  // siblings below the root, drawn without replacement from {3, ...}
    };
    const draft_case cases[] = {{{.temperature = 0.0f}, 1}, {{.temperature = 1.0f, .top_k = 2}, 2},
                                {{.temperature = 1.5f}, 3}, {{.temperature = 0.5f}, 3}};
    for (const auto scheme : kTreeSchemes)
        for (markov_model* d : {&draft, &near})
            for (const auto& c : cases) {
                INFO(name(scheme) << ", draft temperature " << c.sampling.temperature << ", top-k "
                                  << c.sampling.top_k);
                std::vector<token_id> seq = prompt;
                std::size_t trees = 0, group_ok = 0, column_ok = 0;
                std::mt19937_64 rng(7);
                const auto out = specdec::speculative_decode(
                    *d, verifier, prompt,
                    {.step = specdec::tree{.shape = {.branching = {3, 2, 1}}, .scheme = scheme},
                     .sampling = greedy,
                     .draft = {.sampling = c.sampling},
                     .budget = {.max_new_tokens = 60},
                     .on_step =
                         [&](const specdec::step_event& e) {
                             if (e.tree != nullptr && e.tree->size() != 0) {
                                 ++trees;
                                 group_ok += root_group(*e.tree) == c.root_group;
                                 // Column 0 (the root's first child) is the draft's q after the context.
                                 const auto q = ref_standardize(d->next_logits(seq), c.sampling);
                                 double err = 0.0;
                                 for (std::size_t x = 0; x < q.size(); ++x)
                                     err = std::max(err, std::abs(q[x] - static_cast<double>(e.tree->probs(
                                                                             static_cast<Eigen::Index>(x), 0))));
                                 column_ok += err < 1e-5;
                             }
                             seq.insert(seq.end(), e.emitted.begin(), e.emitted.end());
                         }},
                    rng);
                CHECK(out.tokens == expected);
                CHECK(trees > 0);
                CHECK(group_ok == trees);
                CHECK(column_ok == trees);
            }
}

TEST_CASE("The draft-side stop prunes tree steps and keeps temperature 0 greedy", "[tree]") {
    // With the draft at temperature 1 its tokens' probabilities are spread, so a stop at 0.3
    // prunes often: fewer drafted tokens, no node below a low one, the same greedy output.
    auto target = markov_model::random(6, 2, 53);
    auto near = target;
    for (std::size_t i = 0; i < near.table.size(); i += 5) near.table[i] += 0.8f;
    const std::vector<token_id> prompt{0, 3};
    const specdec::sampling_config greedy{.temperature = 0.0f};
    std::mt19937_64 ar_rng(1);
    const auto expected =
        specdec::autoregressive_decode(target, prompt, {.sampling = greedy, .budget = {.max_new_tokens = 80}}, ar_rng)
            .tokens;
    tree_markov verifier{&target};
    for (const auto scheme : kTreeSchemes)
        for (const auto draws : {sibling_draws::iid, sibling_draws::without_replacement}) {
            INFO(name(scheme) << ", " << name(draws));
            const specdec::tree_shape shape{.branching = {3, 2, 1}, .draws = draws};
            std::size_t pruned = 0, stop_ok = 0, trees = 0;
            auto run = [&](float stop_below) {
                std::mt19937_64 rng(11);
                return specdec::speculative_decode(
                    near, verifier, prompt,
                    {.step = specdec::tree{.shape = shape, .scheme = scheme},
                     .sampling = greedy,
                     .draft = {.sampling = specdec::sampling_config{.temperature = 1.0f}, .stop_below = stop_below},
                     .budget = {.max_new_tokens = 80},
                     .on_step =
                         [&](const specdec::step_event& e) {
                             if (stop_below == 0.0f || e.tree == nullptr || e.gamma == 0) return;
                             ++trees;
                             specdec::tree_shape cut = shape;
                             cut.branching.resize(e.gamma);
                             pruned += e.tree->size() < cut.nodes();
                             stop_ok += respects_stop(*e.tree, stop_below);
                         }},
                    rng);
            };
            const auto full = run(0.0f);
            const auto stopped = run(0.3f);
            INFO("drafted tokens: " << full.stats.drafted_tokens << " without the stop, "
                                    << stopped.stats.drafted_tokens << " with it; " << pruned << " of " << trees
                                    << " trees pruned");
            CHECK(full.tokens == expected);
            CHECK(stopped.tokens == expected);
            CHECK(stopped.stats.drafted_tokens < full.stats.drafted_tokens);
            CHECK(stop_ok == trees);
            CHECK(pruned * 4 > trees);  // often, not by accident
        }
}

TEST_CASE("The tree planner works with trees: several depths chosen, temperature 0 still greedy",
          "[tree][adaptive]") {
    auto target = markov_model::random(6, 2, 55);
    auto draft = markov_model::random(6, 2, 56);
    auto near = target;
    for (std::size_t i = 0; i < near.table.size(); i += 5) near.table[i] += 0.8f;
    const std::vector<token_id> prompt{0, 3};
    const specdec::sampling_config greedy{.temperature = 0.0f};
    std::mt19937_64 ar_rng(1);
    const auto expected =
        specdec::autoregressive_decode(target, prompt, {.sampling = greedy, .budget = {.max_new_tokens = 150}}, ar_rng)
            .tokens;
    tree_markov verifier{&target};
    const specdec::tree_shape shape{.branching = {3, 2, 1, 1}};
    for (const auto scheme : kTreeSchemes)
        for (markov_model* d : {&draft, &near}) {
            INFO(name(scheme) << (d == &near ? ", a near draft" : ", a random draft"));
            // The caller's controller (its choices are visible), then the decoder's own: the tree
            // planner, for a plain next_logits drafter (one draft call per parent).
            specdec::gamma_controller controller = specdec::make_controller(
                {.step = specdec::tree{.shape = shape}, .length = {.adaptive = known_costs()}},
                specdec::tree_draft_calls::per_parent);
            std::size_t events = 0, depth_ok = 0;
            const auto on_step = [&](const specdec::step_event& e) {
                ++events;
                depth_ok += e.tree != nullptr && static_cast<std::size_t>(e.tree->max_depth()) <= e.gamma &&
                            (e.gamma != 0 || (e.tree->size() == 0 && e.accepted == 0)) && e.target_passes == 1;
            };
            std::mt19937_64 rng(13);
            const auto mine = specdec::speculative_decode(
                *d, verifier, prompt,
                {.step = specdec::tree{.shape = shape, .scheme = scheme},
                 .length = {.policy = specdec::gamma_policy::adaptive, .controller = &controller},
                 .sampling = greedy,
                 .budget = {.max_new_tokens = 150},
                 .on_step = on_step},
                rng);
            CHECK(mine.tokens == expected);
            CHECK(depth_ok == events);
            CHECK(events == mine.stats.steps);
            const auto choices = controller.choices();
            const std::vector<std::size_t> chosen(choices.begin(), choices.end());
            std::vector<std::size_t> used = mine.stats.steps_at_gamma;
            used.resize(chosen.size(), 0);
            CHECK(used == chosen);  // each step asked for the depth the controller chose
            INFO("steps by depth: " << used[0] << ", " << used[1] << ", " << used[2] << ", " << used[3] << ", "
                                    << used[4]);
            CHECK(distinct_lengths(used) >= 2);
            // The decoder's own controller, from the same options: the same run, reproducibly.
            std::mt19937_64 rng2(13);
            const specdec::decode_options own{.step = specdec::tree{.shape = shape, .scheme = scheme},
                                              .length = {.policy = specdec::gamma_policy::adaptive,
                                                         .adaptive = known_costs()},
                                              .sampling = greedy,
                                              .budget = {.max_new_tokens = 150}};
            const auto a = specdec::speculative_decode(*d, verifier, prompt, own, rng2);
            CHECK(a.tokens == expected);
            CHECK(a.stats.steps_at_gamma == mine.stats.steps_at_gamma);
            specdec::batch_decoder dec(*d, verifier, own);
            CHECK(dec.controller() != nullptr);
            CHECK(dec.controller()->gamma_max() == shape.depth());
        }
}

TEST_CASE("Tree steps refuse invalid draft settings and a controller that does not plan their tree, naming the field",
          "[tree]") {
    auto target = markov_model::random(5, 2, 83);
    auto draft = markov_model::random(5, 2, 84);
    const std::vector<token_id> prompt{0, 1};
    std::mt19937_64 rng(1);
    const specdec::tree shape_step{.shape = {.branching = {2, 1}}};
    auto run = [&](specdec::decode_options o) {
        o.step = shape_step;
        o.budget.max_new_tokens = 5;
        (void)specdec::speculative_decode(draft, target, prompt, o, rng);
    };
    expect_invalid([&] { run({.draft = {.stop_below = 1.5f}}); }, "draft.stop_below");
    expect_invalid([&] { run({.draft = {.stop_below = -0.1f}}); }, "draft.stop_below");
    expect_invalid([&] { run({.draft = {.sampling = specdec::sampling_config{.temperature = -1.0f}}}); },
                   "draft.sampling");
    specdec::gamma_controller deeper(3);
    expect_invalid([&] { run({.length = {.policy = specdec::gamma_policy::adaptive, .controller = &deeper}}); },
                   "does not plan this step's tree");
    specdec::gamma_controller wider(specdec::tree_plan_limits{.branching = {3, 1}});
    expect_invalid([&] { run({.length = {.policy = specdec::gamma_policy::adaptive, .controller = &wider}}); },
                   "does not plan this step's tree");
    expect_invalid(
        [&] {
            (void)specdec::speculative_decode(draft, target, prompt,
                                              {.step = specdec::tree{.shape = {.branching = {0, 2}}}}, rng);
        },
        "depth 0");
    // A plain target without score_tree and a plain drafter: the node-by-node fallback, one
    // next_logits call per column, which step_event::target_passes reports.
    std::mt19937_64 rng2(2);
    std::size_t passes = 0, passes_ok = 0, events = 0;
    const auto out = specdec::speculative_decode(
        draft, target, prompt,
        {.step = specdec::tree{.shape = {.branching = {2, 1}}},
         .budget = {.max_new_tokens = 12},
         .on_step =
             [&](const specdec::step_event& e) {
                 ++events;
                 passes += e.target_passes;
                 passes_ok += e.tree != nullptr && e.target_passes == e.tree->size() + 1;
             }},
        rng2);
    CHECK(out.tokens.size() == 12);
    CHECK(passes_ok == events);
    CHECK(out.stats.target_calls == passes);
}

namespace {
/// A block drafter that proposes one token out of range (the vocabulary's size) after a good one.
struct out_of_range_block_drafter {
    int vocab = 5;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void draft(std::span<const token_id>, std::size_t gamma, const specdec::sampling_config&, specdec::uniform_source&,
               specdec::draft_block& out) {
        out.tokens = {1, static_cast<token_id>(vocab)};
        out.tokens.resize(std::min<std::size_t>(gamma, 2));
    }
};
/// A verifier that fails the test if it is ever shown a token out of range.
struct range_checking_verifier : batched_markov {
    std::size_t bad = 0;
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        for (token_id t : draft) bad += t < 0 || t >= model->vocab;
        return batched_markov::score(context, draft);
    }
};
}  // namespace

TEST_CASE("A drafted tree is checked before the target scores it (fuzz finding)", "[tree]") {
    // Found by decode_fuzz: a block drafter's out-of-range token reached the verifier through
    // the path-by-path scoring before verify_tree's check saw the tree.
    auto target = markov_model::random(5, 2, 91);
    range_checking_verifier verifier{{&target}};
    out_of_range_block_drafter drafter;
    std::mt19937_64 rng(1);
    const std::vector<token_id> prompt{0, 1};
    expect_invalid(
        [&] {
            (void)specdec::speculative_decode(
                drafter, verifier, prompt,
                {.step = specdec::tree{.shape = {.branching = {1, 1, 1}}}, .budget = {.max_new_tokens = 8}}, rng);
        },
        "the drafter's tokens[1] = 5 is out of range");
    CHECK(verifier.bad == 0);
    CHECK(verifier.passes == 0);
}

namespace {
/// A block drafter whose block is malformed in one of several ways (sizes of probs and scales,
/// a scale's value), with tokens in range.
struct malformed_block_drafter {
    int vocab = 5;
    int flaw = 0;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void draft(std::span<const token_id>, std::size_t gamma, const specdec::sampling_config&, specdec::uniform_source&,
               specdec::draft_block& out) const {
        const std::size_t n = std::min<std::size_t>(gamma, 2);
        out.tokens.assign(n, 1);
        out.probs = Eigen::MatrixXf::Constant(vocab, static_cast<Eigen::Index>(n), 1.0f / static_cast<float>(vocab));
        if (flaw == 0) out.probs.resize(vocab, 1);            // fewer columns than tokens
        if (flaw == 1) out.probs.resize(vocab - 1, 2);        // a row short
        if (flaw == 2) out.scales = {1.0f};                   // fewer scales than columns
        if (flaw == 3) out.scales = {1.0f, -1.0f};            // a negative scale
    }
};
}  // namespace

TEST_CASE("A block drafter's malformed block is refused by name in tree decoding (review finding)", "[tree]") {
    // The tree path checked only the block's length before turning it into a tree, which reads
    // every column of probs and every scale: a short probs or scales was read out of bounds.
    auto target = markov_model::random(5, 2, 92);
    batched_markov verifier{&target};
    const std::vector<token_id> prompt{0, 1};
    const char* expected[] = {"probs is 5 x 1", "probs is 4 x 2", "scales", "scales"};
    const specdec::decode_options options{.step = specdec::tree{.shape = {.branching = {1, 1, 1}}},
                                          .budget = {.max_new_tokens = 8}};
    for (int flaw = 0; flaw < 4; ++flaw) {
        INFO("flaw " << flaw);
        malformed_block_drafter drafter{5, flaw};
        std::mt19937_64 rng(1);
        expect_invalid([&] { (void)specdec::speculative_decode(drafter, verifier, prompt, options, rng); },
                       expected[flaw]);
        CHECK(verifier.passes == 0);
    }
}

TEST_CASE("Tree decoding counts a BatchVerifier's passes as its calls_per_score says (review finding)", "[tree]") {
    // model_verifier over a plain model: each score() of a path of n tokens is n + 1 model calls,
    // as chain decoding counts them; path-by-path scoring counted one per path.
    auto target = markov_model::random(6, 2, 93);
    auto draft = markov_model::random(6, 2, 94);
    specdec::model_verifier<markov_model> verifier(target);
    const std::vector<token_id> prompt{0, 1};
    std::mt19937_64 rng(5);
    target.calls = 0;
    const auto out = specdec::speculative_decode(draft, verifier, prompt,
                                                 {.step = specdec::tree{.shape = {.branching = {2, 2}}},
                                                  .sampling = {.temperature = 1.0f},
                                                  .budget = {.max_new_tokens = 40}},
                                                 rng);
    CHECK(out.tokens.size() == 40);
    CHECK(target.calls > 0);
    CHECK(out.stats.target_calls == target.calls);
}

namespace {
// A LanguageModel whose batched score() takes two passes (as an engine that scores in two
// chunks might), which it reports through calls_per_score.
struct two_pass_model {
    markov_model* model;
    std::size_t passes = 0;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        ++passes;
        return model->next_logits(context);
    }
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        passes += 2;
        batched_markov inner{model};
        return inner.score(context, draft);
    }
    static std::size_t calls_per_score(std::size_t) { return 2; }
};
}  // namespace

TEST_CASE("model_verifier reports a batched model's own calls_per_score, and decoding counts it (review finding)",
          "[tree]") {
    auto target = markov_model::random(6, 2, 95);
    auto draft = markov_model::random(6, 2, 96);
    two_pass_model model{&target};
    specdec::model_verifier<two_pass_model> verifier(model);
    CHECK(verifier.calls_per_score(4) == 2);
    markov_model plain = target;
    CHECK(specdec::model_verifier<markov_model>(plain).calls_per_score(4) == 5);
    const std::vector<token_id> prompt{0, 1};
    for (const bool tree : {false, true}) {
        INFO("tree steps: " << tree);
        model.passes = 0;
        std::mt19937_64 rng(6);
        specdec::decode_options opts{.sampling = {.temperature = 1.0f}, .budget = {.max_new_tokens = 40}};
        if (tree) opts.step = specdec::tree{.shape = {.branching = {2, 2}}};
        const auto out = specdec::speculative_decode(draft, verifier, prompt, opts, rng);
        CHECK(out.tokens.size() == 40);
        CHECK(model.passes > 0);
        CHECK(out.stats.target_calls == model.passes);
    }
}

TEST_CASE("Tree statistics count a rejection only where the accepted node has children (review finding)", "[tree]") {
    // Shape {2, 1} capped at 3 nodes: the second child of the root is a leaf at depth 1. When it
    // is accepted nothing below it was tested, so the step has no rejection and reaches depth 1 only.
    auto target = markov_model::random(6, 2, 95);
    auto draft = markov_model::random(6, 2, 96);
    tree_markov verifier{&target};
    const std::vector<token_id> prompt{2, 3};
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        std::size_t rejections = 0, shallow_leaves = 0;
        std::vector<std::size_t> reached;
        specdec::decode_options options;
        options.step = specdec::tree{.shape = {.branching = {2, 1}, .max_nodes = 3}, .scheme = scheme};
        options.sampling = {.temperature = 1.0f};
        options.budget.max_new_tokens = 400;
        options.on_step = [&](const specdec::step_event& e) {
            const auto& parents = e.tree->parents;
            const bool has_children = std::find(parents.begin(), parents.end(), e.last_node) != parents.end();
            rejections += has_children;
            shallow_leaves += !has_children && e.accepted < static_cast<std::size_t>(e.tree->max_depth());
            const std::size_t depth_reached = e.accepted + (has_children ? 1 : 0);
            if (reached.size() < depth_reached) reached.resize(depth_reached, 0);
            for (std::size_t i = 0; i < depth_reached; ++i) ++reached[i];
        };
        std::mt19937_64 rng(7);
        const auto out = specdec::speculative_decode(draft, verifier, prompt, options, rng);
        CHECK(shallow_leaves > 0);  // the case under test happened
        CHECK(out.stats.rejected_tokens == rejections);
        reached.resize(out.stats.reached_at_position.size(), 0);
        CHECK(out.stats.reached_at_position == reached);
    }
}

TEST_CASE("A tree drawn without replacement from a peaked column is accepted and verified exactly (outside finding)",
          "[tree][statistical]") {
    // Draft logits {0, -43, -60}: q ≈ {1, 2.1e-19, 8.8e-27}. Two siblings drawn without
    // replacement: token 0, then token 1 (from what is left, ≈ {0, 1 − 4e-8, 4e-8}). The mass
    // left after the first, ≈ 2.1e-19, is below the double rounding of the column's sum
    // (1 + 2.1e-19 == 1), so the old "sum − removed" computed 0 and refused the tree.
    Eigen::VectorXf draft_logits(3);
    draft_logits << 0.0f, -43.0f, -60.0f;
    Eigen::VectorXf q(3);
    specdec::sampling_workspace sws;
    specdec::standardize(draft_logits, {}, q, sws);
    REQUIRE(q[1] > 0.0f);
    REQUIRE(static_cast<double>(q[0]) + static_cast<double>(q[1]) + static_cast<double>(q[2]) - static_cast<double>(q[0]) == 0.0);
    draft_tree t;
    t.add(-1, 0, sibling_draws::without_replacement);
    t.add(-1, 1, sibling_draws::without_replacement);
    t.resize_probs(3, 2);
    t.probs.col(0) = q;
    t.probs.col(1) = q;
    for (const bool standardized : {false, true}) {
        t.standardized = standardized;
        CHECK_NOTHROW(specdec::validate(t, 3));
    }
    // Target: p = {0.2, 0.3, 0.5} at the root; after token 0, {0.6, 0.3, 0.1}; after 1, {0.1, 0.1, 0.8}.
    // Given this tree (drawn with probability 1 − 2e-19) both schemes accept node 0 with
    // probability 0.2, node 1 with 0.8 · 0.375 = 0.3, and otherwise draw 2 at the root: the
    // outcome (node, next token) has the target's law of the first two tokens (the first only
    // at the root).
    Eigen::MatrixXf z(3, 3);
    z.col(0) << std::log(0.2f), std::log(0.3f), std::log(0.5f);
    z.col(1) << std::log(0.6f), std::log(0.3f), std::log(0.1f);
    z.col(2) << std::log(0.1f), std::log(0.1f), std::log(0.8f);
    const std::vector<double> law{0.0,        0.0,        0.5,         // root, then 0 / 1 / 2
                                  0.2 * 0.6,  0.2 * 0.3,  0.2 * 0.1,   // node 0 (token 0), then ...
                                  0.3 * 0.1,  0.3 * 0.1,  0.3 * 0.8};  // node 1 (token 1), then ...
    constexpr int n = 40000;
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        specdec::tree_verify_workspace ws;
        std::mt19937_64 rng(scheme == tree_verification_scheme::traversal ? 11 : 12);
        std::vector<std::size_t> counts(9, 0);
        for (int i = 0; i < n; ++i) {
            const auto r = specdec::verify_tree(z, t, {}, rng, ws, {.scheme = scheme});
            REQUIRE(r.next_token >= 0);
            REQUIRE(r.next_token < 3);
            ++counts[static_cast<std::size_t>((r.last_node + 1) * 3 + r.next_token)];
        }
        const auto g = chi_square_test(counts, law);
        INFO("chi2 = " << g.statistic << ", p = " << g.p_value);
        CHECK(g.p_value >= 1e-4);
    }
}

namespace {
/// A tree drafter that proposes one point-mass node with a sibling_draws value that is neither
/// enumerator.
struct bad_draws_drafter {
    std::ptrdiff_t vocab_size() const { return 4; }
    void propose_tree(std::span<const token_id>, const specdec::tree_shape&, const specdec::sampling_config&,
                      specdec::uniform_source&, draft_tree& out) const {
        out.add(-1, 1);
        out.draws[0] = static_cast<sibling_draws>(7);
    }
};
}  // namespace

TEST_CASE("A sibling_draws value that is neither enumerator is refused by name (outside finding)", "[tree]") {
    // It passed the check, then counted as i.i.d. in the check's mass and as without
    // replacement in verification.
    const auto bad = static_cast<sibling_draws>(7);
    auto t = small_tree();
    t.draws[1] = bad;
    expect_invalid([&] { specdec::validate(t, 4, "my_check"); },
                   "my_check: node 1 has draws = 7, neither sibling_draws::iid nor sibling_draws::without_replacement");
    specdec::tree_verify_workspace ws;
    std::mt19937_64 rng(1);
    const Eigen::MatrixXf logits = Eigen::MatrixXf::Zero(4, 4);
    expect_invalid([&] { (void)specdec::verify_tree(logits, t, {}, rng, ws); }, "specdec::verify_tree: node 1 has draws = 7");
    {
        auto p = small_tree();
        p.probs.resize(0, 0);  // point masses: no column reads the value, the structure check does
        p.draws[0] = bad;
        expect_invalid([&] { (void)specdec::verify_tree(logits, p, {}, rng, ws); }, "node 0 has draws = 7");
    }
    expect_invalid([&] { draft_tree u; u.add(-1, 1, bad); }, "specdec::draft_tree::add: how = 7");
    // A model drafter asked for such draws, directly or through tree decoding.
    auto model = markov_model::random(4, 2, 5);
    specdec::uniform_source uniforms(rng);
    draft_tree out;
    std::vector<token_id> path;
    Eigen::VectorXf lg, q, scratch;
    specdec::sampling_workspace sws;
    expect_invalid(
        [&] {
            specdec::draft_tree_from_model(model, std::vector<token_id>{1}, {.branching = {2}, .draws = bad}, {},
                                           uniforms, out, path, lg, q, scratch, sws);
        },
        "specdec::draft_tree_from_model: shape.draws = 7");
    const std::vector<token_id> prompt{0, 1};
    expect_invalid(
        [&] {
            (void)specdec::speculative_decode(model, model, prompt,
                                              {.step = specdec::tree{.shape = {.branching = {2}, .draws = bad}},
                                               .budget = {.max_new_tokens = 4}},
                                              rng);
        },
        "specdec::speculative_decode: step.shape.draws = 7");
    // A tree drafter that writes one: refused before the target scores the tree.
    bad_draws_drafter drafter;
    tree_markov verifier{&model};
    expect_invalid(
        [&] {
            (void)specdec::speculative_decode(drafter, verifier, prompt,
                                              {.step = specdec::tree{.shape = {.branching = {1}}},
                                               .budget = {.max_new_tokens = 4}},
                                              rng);
        },
        "specdec::speculative_decode: node 0 has draws = 7");
    CHECK(verifier.passes == 0);
}

namespace {

/// Exact P(child k of the root is accepted | children 1..k−1 were not), k = 1..siblings, by
/// enumerating the earlier children's tokens: each is drawn from q (i.i.d.) or from q without
/// the earlier ones (renormalized), and fails with 1 − min(1, r_j(x_j) / q_j(x_j)); after a
/// failure r ← norm(max(0, r − q_j)). The same for recursive rejection and traversal at the root.
std::vector<double> exact_sibling_acceptance(const std::vector<double>& p, const std::vector<double>& q,
                                             std::size_t siblings, bool without_replacement) {
    const std::size_t V = p.size();
    std::vector<double> reached_mass(siblings, 0.0), accept_mass(siblings, 0.0);
    // Depth-first over histories: (probability of reaching this point, residual, tokens used).
    const auto visit = [&](auto&& self, std::size_t k, double reach, const std::vector<double>& r,
                           std::vector<bool>& used) -> void {
        std::vector<double> qk = q;
        if (without_replacement) {
            double left = 0.0;
            for (std::size_t x = 0; x < V; ++x) left += used[x] ? 0.0 : q[x];
            for (std::size_t x = 0; x < V; ++x) qk[x] = used[x] ? 0.0 : q[x] / left;
        }
        double a = 0.0;
        for (std::size_t x = 0; x < V; ++x) a += std::min(r[x], qk[x]);
        reached_mass[k] += reach;
        accept_mass[k] += reach * a;
        if (k + 1 == siblings) return;
        for (std::size_t x = 0; x < V; ++x) {
            if (qk[x] == 0.0) continue;
            const double fail = 1.0 - std::min(1.0, r[x] / qk[x]);
            if (fail <= 0.0) continue;
            std::vector<double> next(V);
            double mass = 0.0;
            for (std::size_t y = 0; y < V; ++y) mass += next[y] = std::max(0.0, r[y] - qk[y]);
            for (auto& v : next) v /= mass;
            const bool was = used[x];
            used[x] = true;
            self(self, k + 1, reach * qk[x] * fail, next, used);
            used[x] = was;
        }
    };
    std::vector<bool> used(V, false);
    visit(visit, 0, 1.0, p, used);
    std::vector<double> out(siblings);
    for (std::size_t k = 0; k < siblings; ++k) out[k] = accept_mass[k] / reached_mass[k];
    return out;
}

}  // namespace

TEST_CASE("Sibling acceptance at the root: each tested child's a_k, averaged over the steps that reached it, "
          "matches exact enumeration",
          "[tree][statistical]") {
    // p and q overlap partly, so later siblings face a residual far from p (a_2, a_3 differ from
    // Σ min(p, q), which the check below confirms, so a report of the unconditional overlap fails).
    const std::vector<double> p{0.40, 0.25, 0.15, 0.12, 0.08}, q{0.10, 0.45, 0.05, 0.30, 0.10};
    const std::size_t V = p.size(), siblings = 3, runs = 40000;
    Eigen::MatrixXf logits(static_cast<Eigen::Index>(V), static_cast<Eigen::Index>(siblings + 1));
    for (std::size_t x = 0; x < V; ++x)
        for (Eigen::Index j = 0; j <= static_cast<Eigen::Index>(siblings); ++j)
            logits(static_cast<Eigen::Index>(x), j) = static_cast<float>(std::log(p[x]));
    double unconditional = 0.0;
    for (std::size_t x = 0; x < V; ++x) unconditional += std::min(p[x], q[x]);
    for (const bool wor : {false, true}) {
        const auto exact = exact_sibling_acceptance(p, q, siblings, wor);
        CHECK(std::abs(exact[1] - unconditional) > 0.05);
        CHECK(std::abs(exact[2] - unconditional) > 0.05);
        for (const auto scheme : {tree_verification_scheme::traversal, tree_verification_scheme::recursive_rejection}) {
            INFO((wor ? "without replacement, " : "i.i.d., ")
                 << (scheme == tree_verification_scheme::traversal ? "traversal" : "recursive rejection"));
            std::mt19937_64 rng(wor ? 11 : 12);
            specdec::tree_verify_workspace ws;
            std::vector<double> sum(siblings, 0.0);
            std::vector<std::size_t> count(siblings, 0);
            std::vector<bool> used(V);
            for (std::size_t run = 0; run < runs; ++run) {
                draft_tree t;
                t.resize_probs(static_cast<Eigen::Index>(V), static_cast<Eigen::Index>(siblings));
                std::fill(used.begin(), used.end(), false);
                for (std::size_t k = 0; k < siblings; ++k) {
                    // Draw child k from q (without the earlier children's tokens when so drawn).
                    double left = 0.0;
                    for (std::size_t x = 0; x < V; ++x) left += (wor && used[x]) ? 0.0 : q[x];
                    double u = specdec::uniform01(rng) * left;
                    std::size_t x = 0;
                    for (; x + 1 < V; ++x) {
                        const double w = (wor && used[x]) ? 0.0 : q[x];
                        if (u < w) break;
                        u -= w;
                    }
                    while (wor && used[x]) --x;  // rounding at the end of the range
                    used[x] = true;
                    t.add(-1, static_cast<token_id>(x), wor ? sibling_draws::without_replacement : sibling_draws::iid);
                    for (std::size_t y = 0; y < V; ++y)
                        t.probs(static_cast<Eigen::Index>(y), static_cast<Eigen::Index>(k)) = static_cast<float>(q[y]);
                }
                const auto r = specdec::verify_tree(logits, t, {}, rng, ws,
                                                    {.scheme = scheme, .estimate_sibling_acceptance = true});
                REQUIRE(!r.sibling_acceptance.empty());
                REQUIRE(r.sibling_acceptance.size() <= siblings);
                // Child k was tested only when the ones before it were not accepted.
                if (r.last_node >= 0) CHECK(r.sibling_acceptance.size() == static_cast<std::size_t>(r.last_node) + 1);
                else CHECK(r.sibling_acceptance.size() == siblings);
                for (std::size_t k = 0; k < r.sibling_acceptance.size(); ++k) {
                    sum[k] += r.sibling_acceptance[k];
                    ++count[k];
                }
            }
            for (std::size_t k = 0; k < siblings; ++k) {
                // a_k lies in [0, 1]: the mean of n of them has a standard error of at most
                // 0.5 / sqrt(n); 5 of those is a false alarm below 1e-6 per check.
                const double mean = sum[k] / static_cast<double>(count[k]);
                INFO("sibling " << k + 1 << ": mean " << mean << " over " << count[k] << ", exact " << exact[k]);
                CHECK(count[k] > 1000);
                CHECK(std::abs(mean - exact[k]) < 5.0 * 0.5 / std::sqrt(static_cast<double>(count[k])));
            }
        }
    }
}

// ---- Trees whose nodes of one depth differ (tree_shape::from_children) and best_tree ----


TEST_CASE("A tree shape from children: its depth, nodes and widest node per depth, its cut, and bad lists refused "
          "by name",
          "[tree][shape]") {
    const auto s = specdec::tree_shape::from_children({3, 2, 1, 0, 1});
    CHECK(s.nodes() == 7);
    CHECK(s.depth() == 3);
    CHECK(s.branching == std::vector<std::size_t>{3, 2, 1});
    CHECK(s.max_nodes == 7);
    CHECK(s.children_of(1, 1) == 2);
    CHECK(s.children_of(9, 2) == 0);  // past the list
    specdec::tree_shape c;
    s.cut(2, c);
    CHECK(c.children == std::vector<std::size_t>{3, 2, 1, 0});
    CHECK(c.nodes() == 6);
    CHECK(c.depth() == 2);
    CHECK(c.branching == std::vector<std::size_t>{3, 2});
    s.cut(0, c);
    CHECK(c.nodes() == 0);
    CHECK(c.depth() == 0);
    specdec::tree_shape u{.branching = {2, 2, 1}};
    u.cut(1, u);  // in place
    CHECK(u.nodes() == 2);
    CHECK_THROWS_WITH(specdec::tree_shape::from_children({1, 0, 2}),
                      contains("tree_shape::from_children") &&
                          contains("a node that no earlier entry made"));
    CHECK_THROWS_WITH(specdec::tree_shape::from_children({0}), contains("has no node"));
    CHECK_THROWS_WITH(specdec::tree_shape::from_children({0, 1}), contains("a node that no earlier entry made"));
    CHECK_THROWS_WITH(specdec::tree_shape::from_children({}), contains("has no node"));
}

TEST_CASE("expected_tree_tokens: the tree planner's formula on uniform shapes, Eq. 1 on chains, and a sum over nodes",
          "[tree][shape]") {
    const std::vector<double> a{0.7, 0.4, 0.2};
    const double p1 = 0.7, p2 = 1.0 - 0.3 * 0.6, p3 = 1.0 - 0.3 * 0.6 * 0.8;
    CHECK(specdec::expected_tree_tokens({.branching = {2, 2, 1, 1}}, a) ==
          Approx(1 + p2 + p2 * p2 + p2 * p2 * p1 + p2 * p2 * p1 * p1).epsilon(1e-12));
    CHECK(specdec::expected_tree_tokens({.branching = {3, 1}}, a) == Approx(1 + p3 + p3 * p1).epsilon(1e-12));
    CHECK(specdec::expected_tree_tokens({.branching = {1, 1, 1}}, a) == Approx(1 + 0.7 + 0.49 + 0.343).epsilon(1e-12));
    // The same tree listed node by node has the same value.
    CHECK(specdec::expected_tree_tokens(specdec::tree_shape::from_children({2, 2, 2, 1, 1, 1, 1}), a) ==
          Approx(specdec::expected_tree_tokens({.branching = {2, 2, 1}}, a)).epsilon(1e-12));
    // {2, 1}: the first child (accepted with 0.7) has a child, the second (0.3 · 0.4) none.
    CHECK(specdec::expected_tree_tokens(specdec::tree_shape::from_children({2, 1}), a) ==
          Approx(1 + 0.7 + 0.12 + 0.7 * 0.7).epsilon(1e-12));
    // max_nodes counts nodes breadth first.
    CHECK(specdec::expected_tree_tokens({.branching = {2, 2}, .max_nodes = 3}, a) ==
          Approx(1 + 0.7 + 0.12 + 0.7 * 0.7).epsilon(1e-12));
    // Ranks past the list are never accepted.
    CHECK(specdec::expected_tree_tokens({.branching = {4}}, std::vector<double>{0.5}) == Approx(1.5));
    CHECK_THROWS_WITH(specdec::expected_tree_tokens({.branching = {2}}, std::vector<double>{0.5, 1.5}),
                      contains("specdec::expected_tree_tokens") &&
                          contains("sibling_acceptance[1] = 1.5"));
}

TEST_CASE("best_tree is the best tree of its node budget and widths (Sequoia's dynamic program against every tree)",
          "[tree][shape]") {
    const std::vector<std::vector<double>> acceptances{
        {0.7, 0.4, 0.2}, {0.9, 0.5}, {0.3, 0.3, 0.3, 0.3}, {0.5, 0.0, 0.6}, {1.0, 0.5}, {0.05}};
    const std::vector<std::vector<std::size_t>> widths{{3, 2, 2, 1, 1}, {1, 1, 1, 1, 1, 1}, {4, 4}, {2, 3, 1}};
    std::size_t cases = 0, branchy = 0;
    for (const auto& a : acceptances)
        for (const auto& widest : widths)
            for (std::size_t n = 1; n <= 7; ++n) {
                INFO("acceptance " << a[0] << " ..., widths " << widest[0] << " x " << widest.size() << ", " << n
                                   << " nodes");
                double best = 0.0;
                for_each_children_list(widest, n, [&](const std::vector<std::size_t>& children) {
                    best = std::max(best, specdec::expected_tree_tokens(specdec::tree_shape::from_children(children), a));
                });
                const auto t = specdec::best_tree(a, n, widest);
                CHECK(specdec::expected_tree_tokens(t, a) == Approx(best).epsilon(1e-12));
                CHECK(t.nodes() <= n);
                CHECK(t.depth() <= widest.size());
                for (std::size_t d = 0; d < t.branching.size(); ++d) CHECK(t.branching[d] <= widest[d]);
                ++cases;
                // Trees that are not uniform per depth: the list differs from every uniform one.
                branchy += t.children.size() > 1 && t.branching[0] > 1 &&
                           specdec::expected_tree_tokens({.branching = t.branching, .max_nodes = n}, a) <
                               specdec::expected_tree_tokens(t, a) - 1e-12;
            }
    CHECK(cases == 6 * 4 * 7);
    CHECK(branchy > 10);  // the best tree is often not a uniform one
    CHECK_THROWS_WITH(specdec::best_tree(std::vector<double>{0.5}, 0, std::vector<std::size_t>{2}),
                      contains("specdec::best_tree: max_nodes = 0"));
    CHECK_THROWS_WITH(specdec::best_tree(std::vector<double>{0.5}, 4, std::vector<std::size_t>{2, 0}),
                      contains("widest[1] = 0"));
    CHECK_THROWS_WITH(specdec::best_tree(std::vector<double>{-0.5}, 4, std::vector<std::size_t>{2}),
                      contains("sibling_acceptance[0] = -0.5"));
}

TEST_CASE("Model-drafted trees of a shape from children have that shape, also when a group runs out of mass",
          "[tree][shape]") {
    auto draft = markov_model::random(6, 2, 171);
    std::mt19937_64 rng(5);
    specdec::uniform_source uniforms(rng);
    specdec::draft_tree tree;
    std::vector<token_id> path;
    Eigen::VectorXf logits, q, scratch;
    specdec::sampling_workspace sws;
    const auto shape = specdec::tree_shape::from_children({3, 1, 2, 0, 1, 0, 1});
    // The children of each drafted node, breadth first.
    const auto counts = [&tree] {
        std::vector<std::size_t> c(tree.size() + 1, 0);
        for (std::size_t i = 0; i < tree.size(); ++i) ++c[static_cast<std::size_t>(tree.parents[i] + 1)];
        return c;
    };
    for (int rep = 0; rep < 50; ++rep) {
        specdec::draft_tree_from_model(draft, std::vector<token_id>{1}, shape, {}, uniforms, tree, path, logits, q,
                                       scratch, sws);
        REQUIRE(tree.size() == 8);
        CHECK(counts() == std::vector<std::size_t>{3, 1, 2, 0, 1, 0, 1, 0, 0});
        CHECK(tree.model_calls == 5);  // one call per node with children (the root included)
        CHECK_NOTHROW(specdec::validate(tree, 6));
    }
    // Top-k 2: the root keeps two of its three children (the third has none in the shape); the
    // nodes after it keep their own children.
    specdec::draft_tree_from_model(draft, std::vector<token_id>{1}, shape, {.top_k = 2}, uniforms, tree, path, logits,
                                   q, scratch, sws);
    CHECK(counts() == std::vector<std::size_t>{2, 1, 2, 1, 0, 1, 0, 0});
    // One score_tree call per level, for a model that scores trees.
    tree_markov scorer{&draft};
    Eigen::MatrixXf level;
    specdec::draft_tree_from_model(scorer, std::vector<token_id>{1}, shape, {}, uniforms, tree, path, logits, q,
                                   scratch, sws, &level);
    CHECK(counts() == std::vector<std::size_t>{3, 1, 2, 0, 1, 0, 1, 0, 0});
    CHECK(tree.model_calls == 3);
    specdec::tree_shape bad = shape;
    bad.children = {1, 0, 1};
    CHECK_THROWS_WITH(specdec::draft_tree_from_model(draft, std::vector<token_id>{1}, bad, {}, uniforms, tree, path,
                                                     logits, q, scratch, sws),
                      contains("specdec::draft_tree_from_model: shape.children: an entry gives"));
}

TEST_CASE("At temperature 0 decoding with a shape from children (and best_tree's) is greedy decoding, and a shape "
          "whose branching is not its children's widths is refused by name",
          "[tree][shape]") {
    auto target = markov_model::random(6, 2, 51);
    auto near = target;
    for (std::size_t i = 0; i < near.table.size(); i += 5) near.table[i] += 0.8f;
    const std::vector<token_id> prompt{0, 3};
    const specdec::sampling_config greedy{.temperature = 0.0f};
    std::mt19937_64 ar_rng(1);
    const auto expected =
        specdec::autoregressive_decode(target, prompt, {.sampling = greedy, .budget = {.max_new_tokens = 40}}, ar_rng)
            .tokens;
    tree_markov verifier{&target};
    const std::vector<double> a{0.6, 0.3};
    const std::vector<std::size_t> widest{3, 2, 2, 1};
    for (const auto& shape : {specdec::tree_shape::from_children({2, 2, 1, 1, 0, 1}),
                              specdec::best_tree(a, 9, widest, sibling_draws::iid)})
        for (const auto scheme : kTreeSchemes)
            for (const bool adaptive : {false, true}) {
                INFO(name(scheme) << ", " << name(shape.draws) << (adaptive ? ", adaptive" : ""));
                std::mt19937_64 rng(7);
                specdec::decode_options o{.step = specdec::tree{.shape = shape, .scheme = scheme},
                                          .sampling = greedy,
                                          .budget = {.max_new_tokens = 40}};
                if (adaptive) o.length = {.policy = specdec::gamma_policy::adaptive, .adaptive = known_costs()};
                CHECK(specdec::speculative_decode(near, verifier, prompt, o, rng).tokens == expected);
            }
    // A children list whose max_nodes is 0 (none): the planner plans within its node count, and
    // each step's shape is capped at it (review finding).
    specdec::tree_shape uncapped = specdec::tree_shape::from_children({2, 1});
    uncapped.max_nodes = 0;
    specdec::decode_options planned{.step = specdec::tree{.shape = uncapped},
                                    .length = {.policy = specdec::gamma_policy::adaptive, .adaptive = known_costs()},
                                    .budget = {.max_new_tokens = 60}};
    CHECK(specdec::make_controller(planned).tree_limits().max_nodes == 3);
    std::size_t largest = 0;
    planned.on_step = [&largest](const specdec::step_event& e) {
        if (e.tree != nullptr) largest = std::max(largest, e.tree->size());
    };
    std::mt19937_64 planned_rng(3);
    (void)specdec::speculative_decode(near, verifier, prompt, planned, planned_rng);
    CHECK(largest > 0);
    CHECK(largest <= 3);
    specdec::tree_shape cut;
    uncapped.cut(2, cut);
    CHECK(cut.max_nodes == 3);  // a drafter that reads only branching and max_nodes stays within it
    specdec::tree_shape wrong{.children = {2, 2, 1}};  // branching keeps its default {2, 2, 1, 1}
    std::mt19937_64 rng(1);
    CHECK_THROWS_WITH(specdec::speculative_decode(near, verifier, prompt, {.step = specdec::tree{.shape = wrong}}, rng),
                      contains("specdec::speculative_decode: step.shape.children is set, and "
                                                "step.shape.branching is not the widest node"));
    wrong.children = {1, 0, 1};
    CHECK_THROWS_WITH(specdec::speculative_decode(near, verifier, prompt, {.step = specdec::tree{.shape = wrong}}, rng),
                      contains("step.shape.children: an entry gives children"));
}
