// The conformance kit (specdec/testing.hpp), part 3 of 3: multi-sequence adapters (score_batch,
// score_tree_batch, draft_batch), correct and broken.
//
// False alarms: see conformance_test.cpp (part 1), whose count covers all three parts.

#include "support/catch.hpp"
#include "support/conformance_adapters.hpp"
#include "support/markov.hpp"
#include "support/multi_cached.hpp"
#include "support/multi_markov.hpp"
#include "support/skip.hpp"
#include "support/stats.hpp"
#include "support/tiny_llama.hpp"

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

// ---- multi-sequence adapters (score_batch, score_tree_batch, draft_batch) ----

namespace {

using specdec_test::multi_bug;
using specdec_test::multi_cached_model;

/// The multi-sequence contract of a broken multi_cached_model (chain γ 3, trees 2,2,1).
kit::report broken_multi(multi_bug bug) {
    multi_cached_model broken(7, 11, bug);
    return kit::check_multi_sequence_contract(broken, small_tree_options());
}

}  // namespace

static_assert(specdec::MultiSequenceVerifier<multi_cached_model> && specdec::MultiSequenceTreeVerifier<multi_cached_model> &&
              specdec::MultiSequenceDrafter<multi_cached_model> && !specdec::Verifier<multi_cached_model> &&
              !specdec::Drafter<multi_cached_model>);
static_assert(specdec::BatchVerifier<specdec_test::multi_cached_scorer>);

TEST_CASE("the multi-sequence contract passes on correct multi-sequence adapters", "[conformance]") {
    auto o = small_tree_options();
    SECTION("a compacting KV store, its references passes with one request alone, copies and a factory") {
        multi_cached_model model(7, 11);
        const auto r = kit::check_multi_sequence_contract(model, o);
        INFO(r);
        CHECK(r);
        CHECK(r.max_error == 0.0);
        CHECK(contains(r.ran, "score_batch: "));
        CHECK(contains(r.ran, "score_tree_batch: "));
        CHECK(contains(r.ran, "draft_batch: "));
        CHECK(contains(r.ran, "a fresh model's pass with the request alone"));
        const auto w = kit::check_multi_sequence_contract_with([] { return multi_cached_model(7, 11); }, o);
        INFO(w);
        CHECK(w);
    }
    SECTION("the references from the adapter's own score()") {
        specdec_test::multi_cached_scorer model(7, 12);
        const auto r = kit::check_multi_sequence_contract(model, o);
        INFO(r);
        CHECK(r);
        CHECK(contains(r.ran, "a fresh model's score() of the request alone"));
    }
    SECTION("the Markov test doubles") {
        auto target = specdec_test::markov_model::random(5, 2, 21);
        specdec_test::multi_markov_verifier v{&target};
        specdec_test::multi_markov_drafter d{&target};
        const auto rv = kit::check_multi_sequence_contract(v, [&] { return specdec_test::multi_markov_verifier{&target}; },
                                                           small_options());
        INFO(rv);
        CHECK(rv);
        const auto rd = kit::check_multi_sequence_contract(d, small_options());
        INFO(rd);
        CHECK(rd);
    }
    SECTION("no false alarm over 20 seeds, contexts and batch sizes") {
        std::size_t passed = 0;
        for (std::uint64_t seed = 1; seed <= 20; ++seed) {
            auto so = small_tree_options();
            so.seed = seed;
            so.batch = 1 + seed % 6;
            multi_cached_model model(4 + static_cast<int>(seed % 5), 100 + seed);
            const auto r = kit::check_multi_sequence_contract(model, so);
            INFO("seed " << seed << ": " << r);
            CHECK(r);
            passed += r ? 1u : 0u;
        }
        CHECK(passed == 20);
    }
}

TEST_CASE("the multi-sequence contract passes on the llama2 batch engine", "[conformance][llama2]") {
    const auto model = specdec_test::tiny_llama(5, "random-conformance", {.dim = 48, .hidden_dim = 96, .n_layers = 2,
                                                                         .vocab_size = 64, .seq_len = 64});
    llama2::batch_transformer batch(model);
    kit::conformance_options o{.prompt = {1, 7}, .gamma = 3, .max_context = 40, .contract_calls = 12};
    o.decode.step = specdec::tree{.shape = {.branching = {2, 2, 1}}};
    const auto r = kit::check_multi_sequence_contract(batch, o);
    INFO(r);
    CHECK(r);
    CHECK(r.max_error == 0.0);  // bit for bit its own pass with the request alone
    CHECK(contains(r.ran, "score_tree_batch: "));
}

TEST_CASE("run_conformance takes a multi-sequence target and drafter alone", "[conformance][statistical]") {
    multi_cached_model target(5, 11), draft(5, 12);
    SECTION("chains: score_batch and draft_batch") {
        const auto r = kit::run_conformance(draft, target, small_options());
        INFO(r);
        CHECK(r);
        REQUIRE(r.checks.size() == 5);
        CHECK(r.checks[0].check == "multi-sequence contract (target)");
        CHECK(contains(r.checks[0].ran, "score_batch: "));
        CHECK_FALSE(contains(r.checks[0].ran, "draft_batch: "));
        CHECK(r.checks[1].check == "multi-sequence contract (draft)");
        CHECK(contains(r.checks[1].ran, "draft_batch: "));
        CHECK(contains(r.checks[4].ran, "exact probabilities"));
    }
    SECTION("trees: score_tree_batch, a plain drafter") {
        cached_model plain_draft(5, 12);
        const auto r = kit::run_conformance(plain_draft, target, small_tree_options());
        INFO(r);
        CHECK(r);
        CHECK(contains(r.checks.back().ran, "tree 2,2,1 (10 nodes)"));
    }
}

TEST_CASE("a multi-sequence KV store whose slot map goes stale when rows are compacted is flagged", "[conformance]") {
    const auto r = broken_multi(multi_bug::stale_slot_map);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "score_batch, pass "));
    CHECK(contains(r.failure, "request "));
    CHECK(contains(r.failure, " in slot "));
    CHECK(contains(r.failure, "column "));
    CHECK(contains(r.failure, "differs from the logits of this request scored alone"));
    CHECK(contains(r.failure, "left slot"));
    CHECK(contains(r.failure, "reads the cache of another sequence"));
    CHECK(contains(r.failure, "map from slots to KV-cache rows"));
}

TEST_CASE("a score_batch that writes a sequence's columns at another's offset is flagged", "[conformance]") {
    const auto r = broken_multi(multi_bug::packed_offset);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "score_batch, pass "));
    CHECK(contains(r.failure, "they are the logits of request "));
    CHECK(contains(r.failure, "wrong offset in the packed scores"));
}

TEST_CASE("a score_tree_batch with an attention-mask bug in one sequence only is flagged", "[conformance]") {
    const auto r = broken_multi(multi_bug::tree_mask);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "score_tree_batch, pass "));
    CHECK(contains(r.failure, "request 1 of "));
    CHECK(contains(r.failure, "not its ancestors"));
    CHECK(contains(r.failure, "tree attention mask of this sequence"));
}

TEST_CASE("a draft_batch whose blocks depend on the other sequences is flagged", "[conformance]") {
    const auto r = broken_multi(multi_bug::shared_uniforms);
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "draft_batch, pass "));
    CHECK(contains(r.failure, "differs from drafting this request alone"));
    CHECK(contains(r.failure, "depends on the other requests of the call"));
}

TEST_CASE("the determinism check runs the batch loop: multi-sequence bugs that one sequence alone never shows fail it",
          "[conformance]") {
    // score_batch writes sequence i's columns at sequence i - 1's offset: harmless with one sequence.
    multi_cached_model draft(7, 12), offset_target(7, 11, multi_bug::packed_offset);
    const auto r = kit::check_determinism(draft, offset_target, small_options());
    INFO(r);
    CHECK_FALSE(r);
    CHECK(contains(r.failure, "batch_decoder, sequence "));
    CHECK(contains(r.failure, "differ from its own speculative_decode with the same seed"));
    CHECK(contains(r.failure, "depend on the other sequences of the batch"));
    // draft_batch draws every sequence's tokens with request 0's uniforms.
    multi_cached_model shared_draft(7, 12, multi_bug::shared_uniforms), target(7, 11);
    const auto d = kit::check_determinism(shared_draft, target, small_options());
    INFO(d);
    CHECK_FALSE(d);
    CHECK(contains(d.failure, "batch_decoder, sequence "));
    // The correct store passes, the batch runs said; a reduced-precision tolerance skips them.
    multi_cached_model good_draft(7, 12), good_target(7, 11);
    const auto g = kit::check_determinism(good_draft, good_target, small_options());
    INFO(g);
    CHECK(g);
    CHECK(contains(g.ran, "runs of the batch loop (3 sequences, one joining late)"));
    auto loose = small_options();
    loose.tolerance = 0.01;
    const auto skipped = kit::check_determinism(good_draft, good_target, loose);
    INFO(skipped);
    CHECK(skipped);
    CHECK(contains(skipped.ran, "no batch runs"));
}
