// The batch loop (batch_decoder) allocates nothing per step after warm-up: the packed scores,
// the requests and the per-sequence buffers are reused, on the multi-sequence path (with the
// target's sampling for the draft, and with the draft's own), and for token trees once their
// shape repeats (counted with support/allocation_counter.hpp, as allocation_test.cpp does; it
// replaces the global allocation functions, so this file is its own test executable).
#include "support/allocation_counter.hpp"

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/skip.hpp"

#include <specdec/batch_decoder.hpp>
#include <specdec/trace.hpp>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using specdec::token_id;
using specdec_test::allocations_during;
using specdec_test::markov_model;

/// The logits row of an order-2 Markov model after `context` + `extra` (no allocation).
Eigen::Map<const Eigen::VectorXf> row_after(const markov_model& m, std::span<const token_id> context,
                                            std::span<const token_id> extra) {
    token_id last[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
        const auto from_end = static_cast<std::size_t>(k);  // 0: the last token
        token_id t = 0;
        if (from_end < extra.size()) t = extra[extra.size() - 1 - from_end];
        else if (from_end - extra.size() < context.size()) t = context[context.size() - 1 - (from_end - extra.size())];
        last[1 - k] = t;
    }
    const std::size_t row = m.row_of(std::span<const token_id>(last, 2)) * static_cast<std::size_t>(m.vocab);
    return {m.table.data() + row, m.vocab};
}

struct quiet_verifier {  // a MultiSequenceVerifier that allocates nothing
    const markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
        for (std::size_t i = 0; i < batch.size(); ++i) {
            auto cols = out.sequence(i);
            for (std::size_t j = 0; j <= batch[i].draft.size(); ++j)
                cols.col(static_cast<Eigen::Index>(j)) = row_after(*model, batch[i].context, batch[i].draft.first(j));
        }
    }
};

struct quiet_drafter {  // a MultiSequenceDrafter that allocates nothing after warm-up
    const markov_model* model;
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& s) {
        for (auto& r : batch) {
            r.out->resize_probs(model->vocab, static_cast<Eigen::Index>(r.gamma));
            for (std::size_t i = 0; i < r.gamma; ++i) {
                auto q = r.out->probs.col(static_cast<Eigen::Index>(i));
                const auto d = specdec::standardize_weights_and_sample(
                    row_after(*model, r.context, std::span<const token_id>(r.out->tokens)), s, q, r.uniforms(), sws);
                r.out->scales.push_back(d.scale);
                r.out->tokens.push_back(d.token);
            }
            r.out->standardized = true;
        }
    }
};

/// Context + the path to node `node` of `tree` (−1: the root), cut to its last two tokens (what
/// an order-2 model reads; no allocation).
std::array<token_id, 2> last_two(std::span<const token_id> context, const specdec::draft_tree& tree,
                                 std::int32_t node) {
    std::array<token_id, 2> last{0, 0};  // a missing token reads as 0, as markov_model::row_of does
    std::size_t have = 0;
    for (std::int32_t n = node; n >= 0 && have < 2; n = tree.parents[static_cast<std::size_t>(n)])
        last[1 - have++] = tree.tokens[static_cast<std::size_t>(n)];
    for (std::size_t k = context.size(); k > 0 && have < 2; --k) last[1 - have++] = context[k - 1];
    return last;
}

struct quiet_tree_verifier {  // a TreeVerifier that allocates nothing once the tree's size repeats
    const markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        out.resize(model->vocab, static_cast<Eigen::Index>(tree.size() + 1));
        for (std::size_t c = 0; c <= tree.size(); ++c) {
            const auto last = last_two(context, tree, static_cast<std::int32_t>(c) - 1);
            out.col(static_cast<Eigen::Index>(c)) = row_after(*model, std::span<const token_id>(last), {});
        }
    }
};

struct quiet_tree_drafter {  // a TreeDrafter that allocates nothing once the tree's shape repeats
    const markov_model* model;
    Eigen::VectorXf q{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& uniforms, specdec::draft_tree& out) {
        out.clear();
        out.resize_probs(model->vocab, static_cast<Eigen::Index>(shape.nodes()));
        if (q.size() != model->vocab) q.resize(model->vocab);
        std::size_t begin = 0, end = 0;
        for (std::size_t d = 0; d < shape.depth(); ++d) {  // breadth first, i.i.d. siblings
            const std::size_t parents_here = d == 0 ? 1 : end - begin;
            for (std::size_t i = 0; i < parents_here; ++i) {
                const std::int32_t parent = d == 0 ? -1 : static_cast<std::int32_t>(begin + i);
                const auto last = last_two(context, out, parent);
                specdec::standardize(row_after(*model, std::span<const token_id>(last), {}), s, q, sws);
                for (std::size_t j = 0; j < shape.branching[d]; ++j) {
                    const std::int32_t node = out.add(parent, specdec::sample_from_weights(q, uniforms(), sws));
                    out.probs.col(node) = q;
                }
            }
            begin = d == 0 ? 0 : end;
            end = out.size();
        }
        out.standardized = true;
    }
};

struct quiet_model {  // a plain LanguageModel drafter whose logits are a view (no allocation)
    const markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::Map<const Eigen::VectorXf> next_logits(std::span<const token_id> context) const {
        return row_after(*model, context, {});
    }
};

/// Steps until every buffer has reached its largest size: 20 steps, and until each of the `n`
/// sequences has accepted a whole path of the shape's depth 3 (its accepted-path buffer then
/// holds 3 tokens).
template <class Decoder>
void warm_up_trees(Decoder& dec, std::size_t n) {
    auto whole_paths = [&] {
        for (std::size_t id = 0; id < n; ++id) {
            const auto& at = dec.stats(id).accepted_at_position;
            if (at.size() < 3 || at[2] == 0) return false;
        }
        return true;
    };
    for (int s = 0; s < 20 || (s < 1000 && !whole_paths()); ++s) dec.step();
    REQUIRE(whole_paths());
}

}  // namespace

TEST_CASE("A multi-sequence batch step allocates nothing after warm-up", "[batch][multi][allocation]") {
    if (!specdec_test::counting_available()) return;
    const auto target = markov_model::random(32, 2, 1);
    const auto draft = markov_model::random(32, 2, 2);
    quiet_drafter d{&draft};
    quiet_verifier v{&target};
    for (const std::size_t threads : {1u, 2u}) {
        INFO("threads " << threads);
        specdec::batch_decoder<quiet_drafter, quiet_verifier, std::mt19937_64> dec(
            d, v, {.step = specdec::chain{.gamma = 3}, .sampling = {.temperature = 1.0f}, .budget = {.max_new_tokens = 3000}}, threads);
        for (token_id p = 0; p < 5; ++p) (void)dec.add(std::vector<token_id>{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p)));
        for (int s = 0; s < 20; ++s) dec.step();  // warm-up
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) dec.step();
              }) == 0);
        CHECK(dec.active() == 5);

        // The draft's own sampling settings (draft-side sampling): the same.
        specdec::batch_decoder<quiet_drafter, quiet_verifier, std::mt19937_64> own(
            d, v,
            {.step = specdec::chain{.gamma = 3},
             .sampling = {.temperature = 1.0f},
             .draft = {.sampling = specdec::sampling_config{.temperature = 0.7f, .top_k = 8}},
             .budget = {.max_new_tokens = 3000}},
            threads);
        for (token_id p = 0; p < 5; ++p) (void)own.add(std::vector<token_id>{p, 2}, std::mt19937_64(static_cast<std::uint64_t>(p)));
        for (int s = 0; s < 20; ++s) own.step();  // warm-up
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) own.step();
              }) == 0);
        CHECK(own.active() == 5);

        // A step recorder as on_step (trace.hpp): timed steps, recorded without allocating.
        specdec::step_recorder trace(specdec::step_recorder::capacity{.steps = 1000, .tokens = 10000, .values = 10000});
        specdec::batch_decoder<quiet_drafter, quiet_verifier, std::mt19937_64> traced(
            d, v,
            {.step = specdec::chain{.gamma = 3, .estimate_acceptance = true},
             .sampling = {.temperature = 1.0f},
             .budget = {.max_new_tokens = 3000},
             .on_step = std::ref(trace)},
            threads);
        for (token_id p = 0; p < 5; ++p) (void)traced.add(std::vector<token_id>{p, 2}, std::mt19937_64(static_cast<std::uint64_t>(p)));
        for (int s = 0; s < 20; ++s) traced.step();  // warm-up
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) traced.step();
              }) == 0);
        CHECK(trace.steps().size() == 70 * 5);
        CHECK(trace.dropped() == 0);
    }
}

TEST_CASE("A batch of token trees allocates nothing per step once the tree's shape repeats", "[batch][tree][allocation]") {
    if (!specdec_test::counting_available()) return;
    const auto target = markov_model::random(32, 2, 3);
    const auto draft = markov_model::random(32, 2, 4);
    quiet_tree_drafter d{&draft};
    quiet_tree_verifier v{&target};
    // A full tree of the shape at every step (the budget never cuts the depth), so every buffer
    // keeps its size from step to step.
    for (const std::size_t threads : {1u, 2u}) {
        INFO("threads " << threads);
        specdec::batch_decoder<quiet_tree_drafter, quiet_tree_verifier, std::mt19937_64> dec(
            d, v,
            {.step = specdec::tree{.shape = {.branching = {2, 2, 1}}},
             .sampling = {.temperature = 1.0f},
             .draft = {.sampling = specdec::sampling_config{.temperature = 0.8f}},
             .budget = {.max_new_tokens = 3000}},
            threads);
        for (token_id p = 0; p < 4; ++p) (void)dec.add(std::vector<token_id>{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p)));
        warm_up_trees(dec, 4);
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) dec.step();
              }) == 0);
        CHECK(dec.active() == 4);
    }
}

TEST_CASE("A batch of token trees drafted by a plain model allocates only as its contexts double",
          "[batch][tree][allocation]") {
    // The drafter's path buffer holds the context, which grows every step: it is reserved
    // geometrically, so over these 50 steps (the contexts grow from about 40 to about 170 tokens)
    // each of the 4 sequences' buffers doubles at most twice. (Regression: it grew to exactly the
    // context's size, reallocating about once per sequence and step: 305 allocations here.)
    if (!specdec_test::counting_available()) return;
    const auto target = markov_model::random(32, 2, 3);
    const auto draft = markov_model::random(32, 2, 4);
    quiet_model d{&draft};  // 32 tokens: a sibling group drawn without replacement never runs out of mass
    quiet_tree_verifier v{&target};
    specdec::batch_decoder<quiet_model, quiet_tree_verifier, std::mt19937_64> dec(
        d, v,
        {.step = specdec::tree{.shape = {.branching = {2, 2, 1}}},
         .sampling = {.temperature = 1.0f},
         .draft = {.sampling = specdec::sampling_config{.temperature = 0.8f}},
         .budget = {.max_new_tokens = 3000}});
    for (token_id p = 0; p < 4; ++p) (void)dec.add(std::vector<token_id>{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p)));
    warm_up_trees(dec, 4);
    const std::size_t allocations = allocations_during([&] {
        for (int s = 0; s < 50; ++s) dec.step();
    });
    CHECK(allocations <= 2 * 4);
    CHECK(dec.active() == 4);
}
