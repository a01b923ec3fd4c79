// Draft trees and their exact verification (tree.hpp, tree_verify.hpp, tree_decode.hpp):
// malformed trees are rejected with a message; the exact expected accepted length by
// enumeration equals the empirical mean of the library's verification; traversal verification
// is never worse than recursive rejection sampling (which is why it is the default); a chain
// under traversal verification has exactly block verification's law; temperature 0 is greedy
// decoding, token for token; a verifier without score_tree scores the same columns.
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
#include <specdec/tree_decode.hpp>

#include <algorithm>
#include <cmath>
#include <random>
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
        bad(0, 0) = std::nanf("");
        expect_invalid([&] { verify(small_tree(), bad); }, "verify_tree");
    }
    auto target = markov_model::random(4, 2, 3);
    std::vector<token_id> prompt{0};
    expect_invalid([&] { (void)specdec::speculative_decode_tree(target, target, prompt, {.shape = {.branching = {}}}, rng); },
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
        specdec::autoregressive_decode(target, prompt, {.max_new_tokens = 40, .sampling = greedy}, ar_rng).tokens;
    tree_markov verifier{&target};
    for (const auto scheme : kTreeSchemes)
        for (markov_model* d : {&draft, &near})
            for (const auto& branching : std::vector<std::vector<std::size_t>>{{3}, {1, 1, 1, 1}, {3, 2, 1, 1}}) {
                for (const auto draws : {sibling_draws::iid, sibling_draws::without_replacement}) {
                    INFO(name(scheme) << ", " << name(draws) << ", depth " << branching.size());
                    std::mt19937_64 rng(7);
                    const auto out = specdec::speculative_decode_tree(
                        *d, verifier, prompt,
                        {.shape = {.branching = branching, .draws = draws}, .scheme = scheme, .max_new_tokens = 40,
                         .sampling = greedy},
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

/// A target that scores trees in one pass and is also a plain LanguageModel, as
/// speculative_decode requires of its verifier.
struct tree_and_plain_markov : tree_markov {
    Eigen::VectorXf next_logits(std::span<const token_id> context) { return model->next_logits(context); }
};
static_assert(specdec::TreeVerifier<tree_and_plain_markov> && specdec::Verifier<tree_and_plain_markov>);

TEST_CASE("speculative_decode with options.tree decodes as speculative_decode_tree does", "[tree]") {
    auto target = markov_model::random(6, 2, 81);
    auto draft = markov_model::random(6, 2, 82);
    tree_and_plain_markov verifier{{&target}};
    const std::vector<token_id> prompt{0, 3};
    const specdec::sampling_config s{.temperature = 0.9f};
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        const specdec::tree_shape shape{.branching = {3, 2, 1}, .max_nodes = 8};
        std::mt19937_64 rng_tree(9), rng_decode(9);
        const auto want = specdec::speculative_decode_tree(
            draft, verifier, prompt, {.shape = shape, .scheme = scheme, .max_new_tokens = 60, .sampling = s}, rng_tree);
        std::size_t steps = 0, streamed = 0, path_ok = 0;
        std::vector<token_id> stream;
        const auto got = specdec::speculative_decode(
            draft, verifier, prompt,
            {.gamma = 0,  // unused with trees
             .max_new_tokens = 60,
             .sampling = s,
             .tree = shape,
             .tree_scheme = scheme,
             .on_step =
                 [&](const specdec::step_event& e) {
                     // The depth asked: the shape's 3, or one less than the tokens still needed.
                     const std::size_t asked = std::min<std::size_t>(3, 60 - streamed - 1);
                     ++steps;
                     streamed += e.emitted.size();
                     stream.insert(stream.end(), e.emitted.begin(), e.emitted.end());
                     path_ok += e.draft.size() == e.accepted && e.gamma == asked &&
                                std::equal(e.draft.begin(), e.draft.end(), e.emitted.begin());
                 }},
            rng_decode);
        CHECK(got.tokens == want.tokens);
        CHECK(got.stats.steps == want.stats.steps);
        CHECK(got.stats.accepted_tokens == want.stats.accepted_tokens);
        CHECK(got.stats.drafted_tokens == want.stats.drafted_tokens);
        CHECK(got.stats.target_calls == want.stats.target_calls);
        CHECK(steps == want.stats.steps);
        CHECK(path_ok == steps);
        CHECK(stream == got.tokens);
        CHECK(streamed == 60);
        CHECK(rng_tree() == rng_decode());  // the same uniforms were drawn
    }
}

TEST_CASE("speculative_decode with options.tree rejects the options that apply to chains only", "[tree]") {
    auto target = markov_model::random(5, 2, 83);
    auto draft = markov_model::random(5, 2, 84);
    const std::vector<token_id> prompt{0, 1};
    std::mt19937_64 rng(1);
    const specdec::tree_shape shape{.branching = {2, 1}};
    auto run = [&](specdec::decode_options o) {
        o.tree = shape;
        o.max_new_tokens = 5;
        (void)specdec::speculative_decode(draft, target, prompt, o, rng);
    };
    expect_invalid([&] { run({.policy = specdec::gamma_policy::adaptive}); }, "options.policy applies to chains only");
    expect_invalid([&] { run({.estimate_acceptance = true}); }, "options.estimate_acceptance");
    expect_invalid([&] { run({.draft_stop_below = 0.1f}); }, "options.draft_stop_below");
    expect_invalid([&] { run({.draft_sampling = specdec::sampling_config{.temperature = 0.5f}}); },
                   "options.draft_sampling");
    expect_invalid([&] { run({.lenience = 0.5f, .scheme = specdec::verification_scheme::token}); },
                   "options.lenience applies to chains only (trees are verified exactly only)");
    expect_invalid([&] { run({.scheme = specdec::verification_scheme::token}); },
                   "options.scheme applies to chains only (trees are verified with options.tree_scheme)");
    expect_invalid(
        [&] {
            (void)specdec::speculative_decode(draft, target, prompt, {.tree = specdec::tree_shape{.branching = {}}}, rng);
        },
        "depth 0");
    // A plain target without score_tree and a plain drafter: the path-by-path fallback.
    std::mt19937_64 rng2(2);
    const auto out = specdec::speculative_decode(draft, target, prompt,
                                                 {.max_new_tokens = 12, .tree = specdec::tree_shape{.branching = {2, 1}}},
                                                 rng2);
    CHECK(out.tokens.size() == 12);
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
            (void)specdec::speculative_decode_tree(drafter, verifier, prompt,
                                                   {.shape = {.branching = {1, 1, 1}}, .max_new_tokens = 8}, rng);
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
    const specdec::tree_decode_options options{.shape = {.branching = {1, 1, 1}}, .max_new_tokens = 8};
    for (int flaw = 0; flaw < 4; ++flaw) {
        INFO("flaw " << flaw);
        malformed_block_drafter drafter{5, flaw};
        std::mt19937_64 rng(1);
        expect_invalid([&] { (void)specdec::speculative_decode_tree(drafter, verifier, prompt, options, rng); },
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
    const auto out = specdec::speculative_decode_tree(
        draft, verifier, prompt, {.shape = {.branching = {2, 2}}, .max_new_tokens = 40, .sampling = {.temperature = 1.0f}},
        rng);
    CHECK(out.tokens.size() == 40);
    CHECK(target.calls > 0);
    CHECK(out.stats.target_calls == target.calls);
}

TEST_CASE("Tree statistics count a rejection only where the accepted node has children (review finding)", "[tree]") {
    // Shape {2, 1} capped at 3 nodes: the second child of the root is a leaf at depth 1. When it
    // is accepted nothing below it was tested, so the step has no rejection and reaches depth 1 only.
    auto target = markov_model::random(6, 2, 95);
    auto draft = markov_model::random(6, 2, 96);
    tree_and_plain_markov verifier{{&target}};
    const std::vector<token_id> prompt{2, 3};
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        std::size_t rejections = 0, shallow_leaves = 0;
        std::vector<std::size_t> reached;
        specdec::tree_decode_options options;
        options.shape = {.branching = {2, 1}, .max_nodes = 3};
        options.scheme = scheme;
        options.max_new_tokens = 400;
        options.sampling = {.temperature = 1.0f};
        options.on_step = [&](const specdec::tree_step_event& e) {
            const auto& parents = e.tree->parents;
            const bool has_children = std::find(parents.begin(), parents.end(), e.last_node) != parents.end();
            rejections += has_children;
            shallow_leaves += !has_children && e.accepted < static_cast<std::size_t>(e.tree->max_depth());
            const std::size_t depth_reached = e.accepted + (has_children ? 1 : 0);
            if (reached.size() < depth_reached) reached.resize(depth_reached, 0);
            for (std::size_t i = 0; i < depth_reached; ++i) ++reached[i];
        };
        std::mt19937_64 rng(7);
        const auto out = specdec::speculative_decode_tree(draft, verifier, prompt, options, rng);
        CHECK(shallow_leaves > 0);  // the case under test happened
        CHECK(out.stats.rejected_tokens == rejections);
        reached.resize(out.stats.reached_at_position.size(), 0);
        CHECK(out.stats.reached_at_position == reached);
    }
}
