// The llama2 engine's multi-sequence tree pass (batch_transformer::score_tree_batch): one pass
// over the draft trees of several sequences must give each sequence, bit for bit, what its own
// transformer's score_tree gives (irregular trees, empty trees, contexts that grow and share a
// prefix, slots reused); and batch_decoder with trees through it must give each sequence exactly
// what a separate speculative_decode run with the per-sequence engine gives, with the same seed.
// Small random models: no model files needed.

#include "support/catch.hpp"
#include "support/tiny_llama.hpp"

#include <specdec/specdec.hpp>

#include "llama2/batch_transformer.hpp"
#include "llama2/checkpoint.hpp"
#include "llama2/transformer.hpp"

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

static_assert(specdec::MultiSequenceTreeVerifier<llama2::batch_transformer>);
static_assert(specdec::MultiSequenceVerifier<llama2::batch_transformer>);

namespace {

using tokens = std::vector<specdec::token_id>;

std::shared_ptr<const llama2::checkpoint> tiny_model(std::uint64_t seed) {
    return specdec_test::tiny_llama(seed, "random-tree-batch", {.seq_len = 128});
}

}  // namespace

TEST_CASE("llama2 score_tree_batch: each sequence's columns are its own score_tree's, bit for bit",
          "[tree][llama2][batch]") {
    const auto model = tiny_model(7);
    llama2::batch_transformer batch(model);
    llama2::transformer drafter(model, 1);  // the first block only: a cheap, different draft
    std::mt19937_64 rng(3);
    specdec::uniform_source uniforms(rng);
    std::vector<tokens> contexts{{1, 17, 250, 3}, {1, 17, 250, 9, 9}, {1, 42}};  // two share a prefix
    std::vector<specdec::draft_tree> trees(3);
    tokens path;
    Eigen::VectorXf logits, q, scratch;
    specdec::sampling_workspace sws;
    specdec::packed_logits out;
    Eigen::MatrixXf own;
    const std::vector<std::vector<std::size_t>> shapes{{3, 2, 1, 1}, {2, 2}, {1, 1, 1}, {4}, {}};
    for (int round = 0; round < 9; ++round) {
        std::vector<specdec::tree_score_request> requests;
        for (std::size_t i = 0; i < contexts.size(); ++i) {
            const auto& shape = shapes[(static_cast<std::size_t>(round) + i) % shapes.size()];
            trees[i].clear();
            if (!shape.empty())
                specdec::draft_tree_from_model(drafter, contexts[i], {.branching = shape}, {.temperature = 1.5f},
                                               uniforms, trees[i], path, logits, q, scratch, sws);
            // Slots permute between rounds: a slot's cache must never leak into another sequence.
            requests.push_back({(i + static_cast<std::size_t>(round)) % 4, contexts[i], &trees[i]});
        }
        out.shape(300, std::span<const specdec::tree_score_request>(requests));
        batch.score_tree_batch(requests, out);
        for (std::size_t i = 0; i < contexts.size(); ++i) {
            INFO("round " << round << ", sequence " << i << ", " << trees[i].size() << " nodes");
            llama2::transformer alone(model);
            alone.score_tree(contexts[i], trees[i], own);
            const auto mine = out.sequence(i);
            REQUIRE(mine.cols() == own.cols());
            CHECK((mine.array() == own.array()).all());
        }
        // Each sequence accepts a path (the first node's, if any) and one more token.
        for (std::size_t i = 0; i < contexts.size(); ++i) {
            if (!trees[i].tokens.empty()) contexts[i].push_back(trees[i].tokens[0]);
            contexts[i].push_back(static_cast<specdec::token_id>((round * 31 + static_cast<int>(i) * 7) % 300));
        }
    }
}

TEST_CASE("llama2 score_tree_batch: the accepted path's keys and values are reused by the slot's next pass, "
          "bit for bit",
          "[tree][llama2][batch]") {
    const auto model = tiny_model(9);
    llama2::batch_transformer batch(model);
    llama2::transformer drafter(model, 1);
    std::mt19937_64 rng(5);
    specdec::uniform_source uniforms(rng);
    std::vector<tokens> contexts{{1, 17, 250, 3}, {1, 42}};
    std::vector<specdec::draft_tree> trees(2);
    tokens path;
    Eigen::VectorXf logits, q, scratch;
    specdec::sampling_workspace sws;
    specdec::packed_logits out;
    Eigen::MatrixXf own;
    std::vector<std::size_t> accepted(2, 0);  // the path length each sequence accepted last round
    std::size_t reused = 0;                   // passes that took a path's rows from the last tree
    for (int round = 0; round < 12; ++round) {
        // Every third round a chain (score_batch) on the same slots, the others trees.
        const bool chain = round % 3 == 2;
        std::vector<std::uint64_t> before;
        std::vector<std::ptrdiff_t> capacity;
        for (std::size_t i = 0; i < contexts.size(); ++i) {
            before.push_back(batch.sequence(i).positions_computed());
            capacity.push_back(batch.sequence(i).cache_capacity());
        }
        std::vector<specdec::tree_score_request> tree_requests;
        std::vector<specdec::score_request> chain_requests;
        const tokens chain_draft{7, 8};
        for (std::size_t i = 0; i < contexts.size(); ++i) {
            trees[i].clear();
            specdec::draft_tree_from_model(drafter, contexts[i], {.branching = {2, 2, 1}}, {.temperature = 1.5f},
                                           uniforms, trees[i], path, logits, q, scratch, sws);
            tree_requests.push_back({i, contexts[i], &trees[i]});  // slot i every round
            chain_requests.push_back({i, contexts[i], chain_draft});
        }
        if (chain) {
            out.shape(300, std::span<const specdec::score_request>(chain_requests));
            batch.score_batch(chain_requests, out);
        } else {
            out.shape(300, std::span<const specdec::tree_score_request>(tree_requests));
            batch.score_tree_batch(tree_requests, out);
        }
        for (std::size_t i = 0; i < contexts.size(); ++i) {
            INFO("round " << round << ", sequence " << i << ", accepted " << accepted[i] << " last round");
            llama2::transformer alone(model);
            if (chain) alone.score_into(contexts[i], chain_draft, own);
            else alone.score_tree(contexts[i], trees[i], own);
            const auto mine = out.sequence(i);
            REQUIRE(mine.cols() == own.cols());
            CHECK((mine.array() == own.array()).all());
            // After a tree round, the path accepted then was not recomputed: only the one token
            // after it and this round's draft were (unless the cache had to grow: it then keeps
            // the context only, and the path is recomputed).
            const std::size_t drafted = chain ? chain_draft.size() : trees[i].size();
            const std::uint64_t computed = batch.sequence(i).positions_computed() - before[i];
            if (round > 0 && (round - 1) % 3 != 2) {
                if (batch.sequence(i).cache_capacity() == capacity[i]) {
                    CHECK(computed == 1 + drafted);
                    ++reused;
                } else {
                    CHECK(computed == 1 + accepted[i] + drafted);
                }
            }
        }
        // Accept a path of first children (round-dependent length, up to the tree's depth) and
        // one more token; after a chain round, the chain's first token.
        for (std::size_t i = 0; i < contexts.size(); ++i) {
            accepted[i] = 0;
            if (chain) {
                contexts[i].push_back(chain_draft[0]);
                accepted[i] = 1;
            } else {
                std::int32_t parent = -1;
                const std::size_t want = (static_cast<std::size_t>(round) + i) % 4;
                for (std::size_t d = 0; d < want; ++d) {
                    std::int32_t child = -1;
                    for (std::size_t k = 0; k < trees[i].size() && child < 0; ++k)
                        if (trees[i].parents[k] == parent) child = static_cast<std::int32_t>(k);
                    if (child < 0) break;
                    contexts[i].push_back(trees[i].tokens[static_cast<std::size_t>(child)]);
                    parent = child;
                    ++accepted[i];
                }
            }
            contexts[i].push_back(static_cast<specdec::token_id>((round * 37 + static_cast<int>(i) * 11) % 300));
        }
    }
    CHECK(reused >= 10);
}

TEST_CASE("llama2 score_tree_batch: a tree beyond seq_len and a malformed tree are refused before any change",
          "[tree][llama2][batch][errors]") {
    const auto model = tiny_model(8);
    llama2::batch_transformer batch(model);
    specdec::draft_tree tree;
    const auto a = tree.add(-1, 5);
    tree.add(a, 6);
    tokens long_context(127, 1);
    std::vector<specdec::tree_score_request> requests{{0, long_context, &tree}};
    specdec::packed_logits out;
    out.shape(300, std::span<const specdec::tree_score_request>(requests));
    CHECK_THROWS_AS(batch.score_tree_batch(requests, out), std::length_error);  // 127 + 2 nodes > 128
    specdec::draft_tree bad = tree;
    bad.depths[1] = 5;
    const tokens context{1, 2};
    requests = {{0, context, &bad}};
    out.shape(300, std::span<const specdec::tree_score_request>(requests));
    CHECK_THROWS_AS(batch.score_tree_batch(requests, out), std::invalid_argument);
}

TEST_CASE("batch_decoder with trees through score_tree_batch equals separate runs with the engine's score_tree",
          "[tree][llama2][batch][decode]") {
    const auto model = tiny_model(11);
    llama2::batch_transformer batch(model);
    llama2::transformer draft(model, 1);
    for (const auto scheme : {specdec::tree_verification_scheme::traversal,
                              specdec::tree_verification_scheme::recursive_rejection}) {
        INFO("scheme " << static_cast<int>(scheme));
        const specdec::decode_options opts{
            .step = specdec::tree{.shape = {.branching = {2, 2, 1}}, .scheme = scheme},
            .sampling = {.temperature = 1.0f},
            .draft = {.sampling = specdec::sampling_config{.temperature = 1.3f}, .stop_below = 0.02f},
            .budget = {.max_new_tokens = 24}};
        const std::vector<tokens> prompts{{1, 5, 9}, {1, 5, 9, 12}, {1, 200}};
        specdec::batch_decoder dec(draft, batch, opts);
        std::vector<std::size_t> ids;
        for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(dec.add(prompts[i], std::mt19937_64(40 + i)));
        dec.run();
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            INFO("sequence " << i);
            const auto together = dec.take(ids[i]);
            llama2::transformer target_alone(model), draft_alone(model, 1);
            std::mt19937_64 rng(40 + i);
            const auto alone = specdec::speculative_decode(draft_alone, target_alone, prompts[i], opts, rng);
            CHECK(together.tokens == alone.tokens);
            CHECK(together.stats.accepted_tokens == alone.stats.accepted_tokens);
            CHECK(together.stats.target_calls == together.stats.steps);  // one pass per step
        }
    }
}
