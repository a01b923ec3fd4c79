// The conformance kit (specdec/testing.hpp), part 2 of 3: adapters with the bugs real ones have,
// where it must fail with a message that points at the bug.
//
// False alarms: see conformance_test.cpp (part 1), whose count covers all three parts.

#include "support/catch.hpp"
#include "support/conformance_adapters.hpp"
#include "support/markov.hpp"
#include "support/multi_cached.hpp"
#include "support/multi_markov.hpp"
#include "support/skip.hpp"
#include "support/stats.hpp"

#include "char_ngram_model.hpp"
#include "llama2/batch_transformer.hpp"
#include "llama2/checkpoint.hpp"
#include "llama2/context_limit.hpp"
#include "llama2/transformer.hpp"

#include <specdec/specdec.hpp>
#include <specdec/testing.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

using namespace specdec_test::conformance;

// ---- broken adapters are caught, each with a message that points at the bug ----

TEST_CASE("a score_tree whose attention mask lets a node see other branches is flagged", "[conformance]") {
    tree_cached_model broken(5, 11, true);
    const auto r = kit::check_contract(broken, small_tree_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "score_tree("));
    CHECK(contains(r.failure, "not its ancestors"));
    CHECK(contains(r.failure, "attention mask"));
    // The sequence-level test sees it too (negative control of the equivalence check on trees).
    cached_model draft(5, 12);
    const auto e = kit::check_equivalence(draft, broken, small_tree_options());
    INFO(e);
    CHECK_FALSE(e);
    CHECK(contains(e.failure, "tree 2,2,1 (10 nodes)"));
    CHECK(contains(e.failure, "law of the first 5 tokens differs"));
    // The same engine with a correct mask passes the contract.
    tree_cached_model good(5, 11);
    const auto g = kit::check_contract(good, small_tree_options());
    INFO(g);
    CHECK(g);
    // Beside a drafter of trees only, run_conformance under chain options decodes trees, and its
    // contract of the target scores trees too (it used to take the options' chain step and never
    // call score_tree).
    auto draft_model = specdec_test::markov_model::random(5, 2, 13);
    markov_tree_drafter trees{&draft_model};
    auto chain_options = small_options();
    chain_options.samples = 2000;  // the contract decides; the statistical checks only need to run
    const auto all = kit::run_conformance(trees, broken, chain_options);
    INFO(all);
    REQUIRE_FALSE(all.checks.empty());
    CHECK(all.checks[0].check == "adapter contract (target)");
    CHECK_FALSE(all.checks[0]);
    CHECK(contains(all.checks[0].failure, "score_tree("));
}

namespace {
/// model_drafter's blocks with a spare column of probs after the drafted ones: the test of each
/// token could read its column, but decoding refuses the block (probs must have one column per
/// drafted token unless the draft-side stop ended the block early).
struct spare_column_drafter {
    specdec_test::markov_model* model;
    specdec::model_drafter<specdec_test::markov_model> inner{*model};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        inner.draft(context, gamma, s, u, out);
        if (!out.has_distributions()) return;
        const Eigen::MatrixXf drafted = out.probs;
        out.resize_probs(drafted.rows(), drafted.cols() + 1);
        out.probs.leftCols(drafted.cols()) = drafted;
        out.probs.rightCols(1) = drafted.col(0);
    }
};
}  // namespace

TEST_CASE("the draft check refuses a block that decoding would refuse, quoting decoding's error (review finding)",
          "[conformance]") {
    auto m = specdec_test::markov_model::random(5, 2, 21);
    spare_column_drafter spare{&m};
    const auto r = kit::check_draft_consistency(spare, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "decoding would refuse this block"));
    CHECK(contains(r.failure, "probs is 5 x 4"));
    // The control: the same drafter without the spare column passes.
    specdec::model_drafter<specdec_test::markov_model> plain{m};
    const auto ok = kit::check_draft_consistency(plain, small_options());
    INFO(ok);
    CHECK(ok);
}

TEST_CASE("a target of trees only goes through the kit: its contract through chains of score_tree, its decoding "
          "through tree steps (review finding)",
          "[conformance][statistical]") {
    // Decoding accepts a target with score_tree alone (tree steps); the kit used to refuse it.
    // Under chain options the default tree is used, as decoding such a target needs.
    tree_only<tree_cached_model> broken{tree_cached_model(5, 11, true)};
    const auto r = kit::check_contract(broken, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.ran, "a target of trees only"));
    CHECK(contains(r.failure, "score_tree("));
    CHECK(contains(r.failure, "attention mask"));
    tree_only<tree_cached_model> good{tree_cached_model(5, 11)};
    const auto g = kit::check_contract(good, small_tree_options());
    INFO(g);
    CHECK(g);
    CHECK(contains(g.ran, "tree steps"));
    // The whole kit beside a chain drafter under chain options: tree steps throughout.
    cached_model draft(5, 12);
    auto o = small_options();
    o.samples = 4000;
    const auto all = kit::run_conformance(draft, good, o);
    INFO(all);
    CHECK(all);
    const auto named = [](const kit::conformance_report& rep, const std::string& check) {
        for (const auto& c : rep.checks)
            if (c.check == check) return c;
        FAIL("no check named " << check);
        return kit::report{};
    };
    CHECK(named(all, "adapter contract (target)").passed);
    CHECK(contains(named(all, "sequence-level equivalence").ran, "tree "));
    // The negative control through run_conformance: the mask bug fails the target's contract
    // and the sequence-level test.
    const auto bad = kit::run_conformance(draft, broken, o);
    INFO(bad);
    CHECK_FALSE(named(bad, "adapter contract (target)").passed);
    CHECK_FALSE(named(bad, "sequence-level equivalence").passed);
}

TEST_CASE("a tree drafter that draws at another temperature than it reports is flagged", "[conformance][statistical]") {
    auto target = specdec_test::markov_model::random(5, 2, 31);
    auto draft_model = specdec_test::markov_model::random(5, 2, 32);
    markov_tree_drafter broken{&draft_model, true};
    auto more = small_tree_options();
    more.draft_blocks = 4000;
    const auto r = kit::check_draft_consistency(broken, more);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "tree depth 1"));
    CHECK(contains(r.failure, "not distributed as the reported q"));
    CHECK(contains(r.failure, "lower temperature"));
    CHECK(contains(r.failure, "temperature 0.6"));
    CHECK(r.p_value < 1e-4);
    // The output is no longer the target's (both schemes of the tree).
    for (const auto scheme :
         {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection}) {
        const auto e = kit::check_equivalence(broken, target, small_tree_options(scheme));
        INFO(e);
        CHECK_FALSE(e);
        CHECK(contains(e.failure, "temperature 0.6"));
    }
    // The correct drafter with the same model passes.
    markov_tree_drafter good{&draft_model};
    const auto g = kit::check_draft_consistency(good, more);
    INFO(g);
    CHECK(g);
}

TEST_CASE("a KV cache that ignores rollback is flagged as such", "[conformance]") {
    cached_model broken(5, 11, bug::ignores_rollback);
    const auto r = kit::check_contract(broken, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "as after a rejected draft"));
    CHECK(contains(r.failure, "roll back"));
    CHECK(r.max_error > 0.0);
}

TEST_CASE("a correct engine whose batched pass rounds like bf16 is told about tolerance, and passes with it "
          "(outside finding)",
          "[conformance]") {
    cached_model rounding(5, 11, bug::reduced_precision);
    const auto r = kit::check_contract(rounding, small_options());
    INFO(r);
    CHECK_FALSE(r);  // at the default tolerance of 1e-4
    CHECK(contains(r.failure, "reduced-precision arithmetic"));
    CHECK(contains(r.failure, "conformance_options::tolerance"));
    CHECK(r.max_error < 0.05);
    auto o = small_options();
    o.tolerance = 0.05;
    const auto relaxed = kit::check_contract(rounding, o);
    INFO(relaxed);
    CHECK(relaxed);
    // A real bug is not mistaken for rounding.
    cached_model broken(5, 11, bug::ignores_rollback);
    const auto b = kit::check_contract(broken, small_options());
    CHECK_FALSE(contains(b.failure, "reduced-precision"));
}

TEST_CASE("scores shifted by one position are flagged as such", "[conformance]") {
    cached_model broken(5, 11, bug::shifted_scores);
    const auto r = kit::check_contract(broken, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "fresh model"));
    CHECK(contains(r.failure, "shifted by one position"));
    // The sequence-level test sees it too (negative control of the equivalence check).
    cached_model draft(5, 12);
    const auto e = kit::check_equivalence(draft, broken, small_options());
    INFO(e);
    CHECK_FALSE(e);
    CHECK(contains(e.failure, "law of the first 5 tokens differs"));
}

namespace {
/// A target whose batched pass allows token 0 where its next_logits (what plain sampling reads)
/// never gives it: speculative decoding then emits sequences of probability 0 under the target.
struct forbids_token_zero_when_plain {
    cached_model model{5, 11};
    std::ptrdiff_t vocab_size() const { return model.vocab_size(); }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        Eigen::VectorXf z = model.next_logits(context);
        z[0] = -std::numeric_limits<float>::infinity();
        return z;
    }
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        return model.score(context, draft);
    }
};
}  // namespace

TEST_CASE("a sequence the target never generates fails the equivalence check with an infinite statistic",
          "[conformance]") {
    forbids_token_zero_when_plain broken;
    cached_model draft(5, 12);
    const auto e = kit::check_equivalence(draft, broken, small_options());
    INFO(e);
    CHECK_FALSE(e);
    CHECK(contains(e.failure, "never generates (probability 0)"));
    CHECK(std::isinf(e.statistic));
    CHECK(e.p_value == 0.0);
    CHECK(contains(e.ran, "of probability 0 under the target"));
}

TEST_CASE("copies that share their cache are flagged as such", "[conformance]") {
    cached_model broken(5, 11, bug::shared_cache);
    const auto r = kit::check_contract(broken, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "share mutable state"));
    // Through a factory (independent models, as from a loader), the copies of the last
    // scenario are where it shows.
    const auto f = kit::check_contract_with([] { return cached_model(5, 11, bug::shared_cache); }, small_options());
    INFO(f);
    CHECK_FALSE(f);
    CHECK(contains(f.failure, "share"));
}

TEST_CASE("a draft sampled at another temperature than the one it reports is flagged", "[conformance][statistical]") {
    auto target = specdec_test::markov_model::random(5, 2, 31);
    auto draft_model = specdec_test::markov_model::random(5, 2, 32);
    tempered_drafter broken{&draft_model};
    auto more = small_options();
    more.draft_blocks = 4000;  // with 5 tokens, T = 0.6 against 0.36 needs a few thousand draws
    const auto r = kit::check_draft_consistency(broken, more);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "not distributed as the reported q"));
    CHECK(contains(r.failure, "lower temperature"));
    CHECK(contains(r.failure, "temperature 0.6"));
    CHECK(r.p_value < 1e-4);
    // The output is no longer the target's (negative control of the equivalence check, both
    // by enumeration and by the two-sample test).
    auto o = small_options();
    const auto e = kit::check_equivalence(broken, target, o);
    INFO(e);
    CHECK_FALSE(e);
    o.two_sample = true;
    const auto two = kit::check_equivalence(broken, target, o);
    INFO(two);
    CHECK_FALSE(two);
    // The correct drafter with the same model passes.
    const auto good = kit::check_draft_consistency(draft_model, more);
    INFO(good);
    CHECK(good);
}

TEST_CASE("a drafter that reuses one uniform for a whole block is flagged by the joint law of its positions, naming "
          "the drafter",
          "[conformance][statistical]") {
    // A context-free draft model (order 0: the same q at every position), so the reused uniform
    // makes every position repeat the first token: each position alone follows q, and the
    // positions are as dependent as can be (the output is no longer the target's).
    auto draft_model = specdec_test::markov_model::random(5, 0, 43);
    same_uniform_drafter broken{&draft_model};
    const auto r = kit::check_draft_consistency(broken, small_options());
    INFO(r);
    CHECK_FALSE(r);
    // Each position alone follows its q: the failure is the joint test's.
    CHECK(contains(r.failure, "draft positions 0 and 1"));
    CHECK(contains(r.failure, "not drawn independently"));
    CHECK(contains(r.failure, "the fault is the drafter's"));
    // The correct drafter with the same model passes, joint test included.
    const auto good = kit::check_draft_consistency(draft_model, small_options());
    INFO(good);
    CHECK(good);
    CHECK(contains(good.ran, "of consecutive positions' joint law"));
}

TEST_CASE("a drafter wrong only where it is confident is flagged on contexts from its own samples, and on random "
          "ones only by the likeliest token's frequency",
          "[conformance][statistical]") {
    auto draft_model = confident_on_own_path();
    confident_greedy_drafter broken{&draft_model};
    auto o = small_options();
    o.prompt = {0};
    const auto r = kit::check_draft_consistency(broken, o);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "more concentrated on the likely tokens"));
    // With random contexts only (the check before contexts from the drafter's own samples), the
    // binned PIT values miss the fault (the draft is confident after 4 of 64 tokens); the test of
    // how often the likeliest token is drawn still sees it, later (after more draws).
    o.draft_own_contexts = false;
    const auto random_only = kit::check_draft_consistency(broken, o);
    INFO(random_only);
    CHECK_FALSE(random_only);
    CHECK(contains(random_only.failure, "the drafted token is the likeliest of its reported q"));
    CHECK(contains(random_only.failure, "too many draws of the likeliest token"));
    // The correct drafter passes with both.
    o.draft_own_contexts = true;
    const auto good = kit::check_draft_consistency(draft_model, o);
    INFO(good);
    CHECK(good);
}

TEST_CASE("draft columns shifted against their tokens are flagged", "[conformance][statistical]") {
    auto draft_model = specdec_test::markov_model::random(5, 2, 41);
    shifted_columns_drafter broken{&draft_model};
    const auto r = kit::check_draft_consistency(broken, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "draft position 1"));  // position 0 is right
}

TEST_CASE("hidden randomness is flagged by the determinism check", "[conformance]") {
    auto target = specdec_test::markov_model::random(5, 2, 51);
    auto draft_model = specdec_test::markov_model::random(5, 2, 52);
    own_rng_drafter broken{&draft_model};
    const auto r = kit::check_determinism(broken, target, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "hidden randomness"));
    CHECK(kit::check_determinism(draft_model, target, small_options()));
}

TEST_CASE("an adapter that throws fails the check with its message", "[conformance]") {
    auto inner = specdec_test::markov_model::random(5, 2, 61);
    specdec_test::throwing_model<specdec_test::markov_model> throwing{&inner, 7, 0};
    const auto r = kit::check_contract(throwing, small_options());
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "an exception was thrown: adapter failure"));
}

TEST_CASE("a report prints as one line", "[conformance]") {
    cached_model broken(5, 11, bug::ignores_rollback);
    const auto r = kit::check_contract(broken, small_options());
    std::ostringstream os;
    os << r;
    CHECK(os.str().rfind("FAIL adapter contract: ", 0) == 0);
    CHECK(os.str().find('\n') == std::string::npos);
    CHECK(contains(os.str(), "ran: "));
}

namespace {
/// The number of blocks a draft check report says it drew (its description starts with it).
std::size_t blocks_drawn(const kit::report& r) { return std::stoul(r.ran.substr(0, r.ran.find(' '))); }

/// A drafter that draws each token after moving `moved` of q's mass from its likeliest token to
/// the second likeliest, and reports q itself (0: a right drafter).
struct mass_moving_drafter {
    specdec_test::markov_model* model;
    double moved;
    specdec::sampling_workspace ws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        Eigen::VectorXf law(model->vocab);
        draft_positions(*model, context, gamma, out, [&](std::size_t, const Eigen::VectorXf& z, auto col) {
            specdec::standardize(z, s, col, ws);
            law = col;
            Eigen::Index first = 0, second = 0;
            const float top = law.maxCoeff(&first);
            law[first] = -1.0f;
            law.maxCoeff(&second);
            law[first] = top - static_cast<float>(moved);
            law[second] += static_cast<float>(moved);
            const double v = u();
            double below = 0.0;
            for (Eigen::Index y = 0; y < law.size(); ++y) {
                below += std::max(0.0f, law[y]);
                if (v < below) return static_cast<token_id>(y);
            }
            return static_cast<token_id>(first);
        });
    }
};
}  // namespace

TEST_CASE("draft consistency stops at the first look that fails and tests a borderline sample further",
          "[conformance][statistical]") {
    auto draft_model = specdec_test::markov_model::random(5, 2, 41);
    shifted_columns_drafter broken{&draft_model};
    auto o = small_options();
    o.samplings = {specdec::sampling_config{}};
    // A clear failure: found after a quarter of the budget.
    const auto r = kit::check_draft_consistency(broken, o);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(blocks_drawn(r) == o.draft_blocks / 4);
    CHECK(contains(r.failure, "over 5 sequential looks"));
    // Not sequential: the whole budget, then one test at the significance.
    o.sequential = false;
    const auto once = kit::check_draft_consistency(broken, o);
    INFO(once);
    CHECK_FALSE(once);
    CHECK(blocks_drawn(once) == o.draft_blocks);
    CHECK_FALSE(contains(once.failure, "sequential"));
    // A right drafter: the budget, more only when the last p-value was borderline (below 0.01).
    // Its 7 tests per config fail it with probability at most 7e-4 (measured over 30,000 seeds:
    // 6.0e-4 sequentially, 6.3e-4 in one look), so one alarm in 20 runs happens (seed 19 is one:
    // p = 1.2e-5 at the first look) and two have probability below 1e-4.
    o.sequential = true;
    std::size_t extended = 0, alarms = 0;
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        o.seed = seed;
        const auto good = kit::check_draft_consistency(draft_model, o);
        INFO(good);
        if (!good) {
            ++alarms;
            continue;
        }
        CHECK((blocks_drawn(good) == o.draft_blocks || blocks_drawn(good) == 2 * o.draft_blocks ||
               blocks_drawn(good) == 4 * o.draft_blocks));
        extended += blocks_drawn(good) > o.draft_blocks;
    }
    CHECK(alarms <= 1);
    CHECK(extended <= 5);  // about 7% of runs have a p-value below 0.01 among their 7 tests
}

TEST_CASE("a drafter that moves a few percent of q's mass between its two likeliest tokens is flagged by the "
          "likeliest token's frequency",
          "[conformance][statistical]") {
    auto draft_model = specdec_test::markov_model::random(8, 2, 43);
    auto o = small_options();
    o.samplings = {specdec::sampling_config{}};
    o.draft_blocks = 4000;
    mass_moving_drafter broken{&draft_model, 0.03};
    const auto r = kit::check_draft_consistency(broken, o);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "the drafted token is the likeliest of its reported q"));
    CHECK(contains(r.failure, "too few draws of the likeliest token"));
    // The same drafter without the move is a right one.
    mass_moving_drafter right{&draft_model, 0.0};
    const auto good = kit::check_draft_consistency(right, o);
    INFO(good);
    CHECK(good);
    CHECK(contains(good.ran, "of the likeliest token's frequency"));
}

TEST_CASE("the thorough budget raises the draft, sample and context budgets and keeps larger ones", "[conformance]") {
    const kit::conformance_options d{};
    const auto t = kit::thorough();
    CHECK(t.draft_blocks == 16 * d.draft_blocks);
    CHECK(t.samples == 8 * d.samples);
    CHECK(t.draft_contexts == 4 * d.draft_contexts);
    CHECK(t.significance == d.significance);
    const auto more = kit::thorough({.prompt = {1}, .samples = 1000000});
    CHECK(more.samples == 1000000);
    CHECK(more.prompt == std::vector<token_id>{1});
}

namespace {
/// The llama2 engine with the attention-mask bug of a chain used for a tree: node i is scored
/// after the context and every node before it in index order, not after its own path.
struct llama2_chain_mask_tree {
    llama2::transformer engine;
    std::ptrdiff_t vocab_size() const { return engine.vocab_size(); }
    Eigen::VectorXf next_logits(std::span<const token_id> context) { return engine.next_logits(context); }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        out.resize(vocab_size(), static_cast<Eigen::Index>(tree.size() + 1));
        std::vector<token_id> seq(context.begin(), context.end());
        out.col(0) = engine.next_logits(seq);
        for (std::size_t i = 0; i < tree.size(); ++i) {
            seq.push_back(tree.tokens[i]);  // the bug: every earlier node, as if on the path
            out.col(static_cast<Eigen::Index>(i + 1)) = engine.next_logits(seq);
        }
    }
};
}  // namespace

TEST_CASE("a score_tree with a chain's attention mask is flagged on the llama2 pair", "[conformance][llama2]") {
    const auto dir = models_dir();
    if (!dir) return;
    llama2_chain_mask_tree broken{llama2::transformer(*dir / "stories260K.bin")};
    auto o = small_tree_options();
    o.prompt = {1, 403, 407};
    const auto r = kit::check_contract(broken, o);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "score_tree("));
    CHECK(contains(r.failure, "attention mask"));
    // The engine's own score_tree passes the same check.
    llama2::transformer good(*dir / "stories260K.bin");
    const auto g = kit::check_contract(good, o);
    INFO(g);
    CHECK(g);
}
