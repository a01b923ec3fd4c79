#include "support/catch.hpp"
#include "support/markov.hpp"

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {
std::vector<token_id> draft_once(auto& drafter, const std::vector<token_id>& context, std::size_t gamma,
                                 specdec::draft_block& block) {
    std::mt19937_64 rng(1);
    specdec::uniform_source u(rng);
    drafter.draft(context, gamma, {}, u, block);
    return block.tokens;
}
}  // namespace

TEST_CASE("The unigram model's probabilities are the smoothed token frequencies", "[drafters]") {
    specdec::ngram_model m(4, 1, false, 0.5f);
    const std::vector<token_id> corpus{0, 1, 1, 2, 1, 1};
    m.fit(corpus);
    const std::vector<token_id> ctx{3};
    const Eigen::VectorXf z = m.next_logits(ctx);
    const Eigen::VectorXf p = z.array().exp() / z.array().exp().sum();
    // counts (1, 4, 1, 0) + 0.5, total 8
    CHECK(p[1] == Approx(4.5 / 8.0));
    CHECK(p[3] == Approx(0.5 / 8.0));
}

TEST_CASE("The bigram model conditions on the last token and learns from the context, undoing rolled-back drafts",
          "[drafters]") {
    specdec::ngram_model learned(5, 2, true);
    specdec::ngram_model fresh(5, 2, false);
    const std::vector<token_id> a{1, 2, 1, 2, 1, 3, 1};
    const std::vector<token_id> b{1, 2, 1, 2, 4, 4, 1};  // diverges from a after 4 tokens
    (void)learned.next_logits(a);
    const Eigen::VectorXf after_rollback = learned.next_logits(b);
    fresh.fit(b);
    CHECK((after_rollback - fresh.next_logits(b)).cwiseAbs().maxCoeff() < 1e-5f);
    // After "1" the counted successors are 2 (twice) and 1... the most likely is 2.
    Eigen::Index best = 0;
    after_rollback.maxCoeff(&best);
    CHECK(best == 2);
    CHECK_THROWS_AS(specdec::ngram_model(5, 3), std::invalid_argument);
    CHECK_THROWS_WITH(fresh.fit(std::vector<token_id>{7}), contains("token 7 is out of range"));
}

TEST_CASE("The n-gram model rejects bad input whole and keeps exact counts", "[drafters][errors]") {
    specdec::ngram_model m(4, 2, false);
    const std::vector<token_id> ctx{1};
    const Eigen::VectorXf before = m.next_logits(ctx);
    // A corpus with a bad token adds nothing, not even the tokens before it.
    CHECK_THROWS_WITH(m.fit(std::vector<token_id>{1, 3, 1, 3, 9}), contains("token 9 is out of range"));
    CHECK((m.next_logits(ctx) - before).cwiseAbs().maxCoeff() == 0.0f);
    CHECK_THROWS_WITH(specdec::ngram_model(4, 1, true, std::numeric_limits<float>::infinity()),
                      contains("must be positive and finite"));
    // Counts past 2^24, where a float count no longer grows by 1: a context learned and rolled
    // back leaves them as they were (float counts would lose its 2000 tokens).
    specdec::ngram_model big(2, 1, true);
    big.fit(std::vector<token_id>(std::size_t{1} << 24, 0));
    const std::vector<token_id> none, context(2000, 0);
    const Eigen::VectorXf fitted = big.next_logits(none);
    (void)big.next_logits(context);  // counts the 2000 tokens...
    CHECK(big.next_logits(none) == fitted);  // ... and rolls them back
}

TEST_CASE("Prompt lookup continues the most recent earlier occurrence of the last n-gram", "[drafters]") {
    specdec::prompt_lookup_drafter d(10, 3, 1);
    specdec::draft_block block;
    // ... 5 6 7 8 9 ... 5 6 7 | -> propose 8 9 (and what followed)
    CHECK(draft_once(d, {5, 6, 7, 8, 9, 1, 5, 6, 7}, 3, block) == std::vector<token_id>{8, 9, 1});
    CHECK(block.probs.cols() == 0);  // point masses
    // The most recent occurrence wins.
    CHECK(draft_once(d, {4, 2, 4, 3, 4}, 1, block) == std::vector<token_id>{3});
    // Falls back to shorter n-grams, and proposes nothing when nothing recurs.
    CHECK(draft_once(d, {1, 2, 3, 9, 2, 3}, 2, block) == std::vector<token_id>{9, 2});
    CHECK(draft_once(d, {1, 2, 3}, 2, block).empty());
    CHECK_THROWS_AS(specdec::prompt_lookup_drafter(10, 1, 2), std::invalid_argument);
}

TEST_CASE("model_drafter samples its columns with standardize_weights_and_sample and says so", "[drafters]") {
    auto model = markov_model::random(10, 2, 4);
    specdec::model_drafter<markov_model> drafter(model);
    specdec::draft_block block;
    CHECK(draft_once(drafter, {1, 2}, 3, block).size() == 3);
    CHECK(block.standardized);
    REQUIRE(block.scales.size() == 3);
    for (Eigen::Index i = 0; i < 3; ++i)
        CHECK(std::abs(block.scales[static_cast<std::size_t>(i)] * block.probs.col(i).sum() - 1.0f) < 1e-5f);
}

TEST_CASE("A fallback chain uses the first drafter that proposes something", "[drafters]") {
    auto model = markov_model::random(10, 2, 4);
    specdec::prompt_lookup_drafter lookup(10, 2, 2);
    specdec::fallback_drafter chain(lookup, model);
    specdec::draft_block block;
    CHECK(draft_once(chain, {1, 2, 7, 1, 2}, 2, block) == std::vector<token_id>{7, 1});
    CHECK(chain.last_used() == 0);
    CHECK(block.model_calls == 0);
    CHECK_FALSE(block.standardized);
    CHECK(draft_once(chain, {1, 2, 3}, 2, block).size() == 2);
    CHECK(chain.last_used() == 1);
    CHECK(block.probs.cols() == 2);
    CHECK(block.model_calls == 2);
    CHECK(block.standardized);  // the model's columns come from standardize_weights_and_sample
    // Lookup again into the same block: the model's flag (and scales) must not carry over.
    CHECK(draft_once(chain, {1, 2, 7, 1, 2}, 2, block) == std::vector<token_id>{7, 1});
    CHECK_FALSE(block.standardized);
    CHECK(block.scales.empty());
    auto other = markov_model::random(11, 2, 4);
    CHECK_THROWS_WITH((specdec::fallback_drafter(lookup, other)), contains("different vocab_size"));
}

TEST_CASE("Speculative decoding with an empty draft block still produces one token per step", "[drafters]") {
    auto target = markov_model::random(6, 2, 9);
    specdec::prompt_lookup_drafter lookup(6, 3, 3);  // a 3-gram rarely recurs in a short context
    const std::vector<token_id> prompt{0};
    std::mt19937_64 a(2), b(2);
    const auto r = specdec::speculative_decode(lookup, target, prompt, {.step = specdec::chain{.gamma = 4}, .sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 30}}, a);
    const auto g = specdec::autoregressive_decode(target, prompt, {.sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 30}}, b);
    CHECK(r.tokens == g.tokens);
    CHECK(r.stats.steps <= 30);
}

namespace {
/// A BlockDrafter that proposes `tokens` (point masses) and reports no model calls.
struct fixed_drafter {
    int vocab;
    std::vector<token_id> tokens;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void draft(std::span<const token_id>, std::size_t gamma, const specdec::sampling_config&, specdec::uniform_source&,
               specdec::draft_block& out) {
        out.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(std::min(gamma, tokens.size())));
    }
};
}  // namespace

TEST_CASE("A fallback chain refers to lvalue drafters and owns temporaries", "[drafters]") {
    auto model = markov_model::random(10, 2, 4);
    specdec::fallback_drafter chain(specdec::prompt_lookup_drafter(10, 2, 2), model);
    static_assert(std::is_same_v<decltype(chain), specdec::fallback_drafter<specdec::prompt_lookup_drafter, markov_model&>>);
    specdec::draft_block block;
    // The owned lookup drafter works after its temporary is gone.
    CHECK(draft_once(chain, {1, 2, 7, 1, 2}, 2, block) == std::vector<token_id>{7, 1});
    CHECK(chain.last_used() == 0);
    // The model is the caller's object, not a copy: its call counter moves.
    const std::size_t before = model.calls;
    CHECK(draft_once(chain, {1, 2, 3}, 2, block).size() == 2);
    CHECK(chain.last_used() == 1);
    CHECK(model.calls == before + 2);
    // A temporary model is moved in and owned; the chain is used as a drafter like any other.
    specdec::prompt_lookup_drafter lookup(10, 2, 2);
    specdec::fallback_drafter owning(lookup, markov_model::random(10, 2, 4));
    static_assert(std::is_same_v<decltype(owning), specdec::fallback_drafter<specdec::prompt_lookup_drafter&, markov_model>>);
    CHECK(draft_once(owning, {1, 2, 3}, 3, block).size() == 3);
    CHECK(owning.vocab_size() == 10);
    auto target = markov_model::random(10, 2, 5);
    std::mt19937_64 rng(3);
    const auto r = specdec::speculative_decode(owning, target, {1, 2, 3}, {.budget = {.max_new_tokens = 20}}, rng);
    CHECK(r.tokens.size() == 20);
    CHECK_THROWS_WITH((specdec::fallback_drafter(lookup, markov_model::random(11, 2, 4))),
                      contains("different vocab_size"));
}

TEST_CASE("A fallback chain reports the model calls of the drafters it asked", "[drafters][stats]") {
    auto model = markov_model::random(10, 2, 4);
    specdec::draft_block block;
    // A drafter that reports nothing counts one call when it proposed tokens, none otherwise.
    fixed_drafter silent{10, {}}, proposing{10, {4, 5}};
    specdec::fallback_drafter a(silent, model);
    CHECK(draft_once(a, {1, 2}, 3, block).size() == 3);
    CHECK(block.model_calls == 3);  // silent proposed nothing (0) + the model's 3 passes
    specdec::fallback_drafter b(proposing, model);
    CHECK(draft_once(b, {1, 2}, 3, block) == std::vector<token_id>{4, 5});
    CHECK(block.model_calls == 1);
    // prompt lookup reports 0 model calls of its own.
    specdec::prompt_lookup_drafter lookup(10, 2, 2);
    block.clear();
    CHECK(draft_once(lookup, {1, 2, 7, 1, 2}, 2, block).size() == 2);
    CHECK(block.model_calls == 0);
    // clear() leaves the count unreported.
    block.clear();
    CHECK_FALSE(block.model_calls.has_value());
}
