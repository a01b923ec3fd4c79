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

TEST_CASE("a drafter wrong only where it is confident is flagged on contexts from its own samples, and missed on "
          "random ones",
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
    // fault goes unseen: the draft is confident after 4 of 64 tokens.
    o.draft_own_contexts = false;
    const auto blind = kit::check_draft_consistency(broken, o);
    INFO(blind);
    CHECK(blind);
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
