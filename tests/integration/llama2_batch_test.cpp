// The llama2 engine for many sequences (examples/llama2/batch_transformer.hpp): one pass over
// the new positions of several sequences, each with its own KV cache, must give each sequence
// bit for bit what its own transformer gives, and speculative decoding through it must give
// each sequence what a separate run gives.

#include "support/catch.hpp"
#include "support/skip.hpp"

#include <specdec/batch_decoder.hpp>
#include <specdec/speculative_decode.hpp>

#include "llama2/batch_transformer.hpp"
#include "llama2/checkpoint.hpp"
#include "llama2/transformer.hpp"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

static_assert(specdec::MultiSequenceVerifier<llama2::batch_transformer>);
static_assert(specdec::MultiSequenceDrafter<llama2::batch_transformer>);

namespace {

namespace fs = std::filesystem;
using tokens = std::vector<std::int32_t>;

/// A small random model that exercises every code path: grouped-query attention, a separate
/// classifier (or a shared one), widths that are not multiples of the SIMD width.
std::shared_ptr<const llama2::checkpoint> small_model(std::uint64_t seed, bool shared_classifier = false) {
    auto ck = std::make_shared<llama2::checkpoint>();
    ck->name = "random-small";
    ck->cfg.dim = 60;
    ck->cfg.hidden_dim = 100;
    ck->cfg.n_layers = 3;
    ck->cfg.n_heads = 6;
    ck->cfg.n_kv_heads = 2;
    ck->cfg.vocab_size = 300;
    ck->cfg.seq_len = 64;
    ck->cfg.shared_classifier = shared_classifier;
    ck->w = llama2::random_weights(ck->cfg, seed);
    return ck;
}

tokens random_tokens(std::mt19937& rng, std::size_t n, std::int32_t vocab) {
    std::uniform_int_distribution<std::int32_t> d(3, vocab - 1);
    tokens t(n);
    for (auto& x : t) x = d(rng);
    return t;
}

/// Speculative-decoding-like traffic over `slots` sequences: each round a random subset of the
/// slots (sequences join and leave) extends, rolls back or replaces its context and asks for a
/// draft of 0..7 tokens; every sequence's columns of the packed pass must equal (bit for bit)
/// its own transformer's score() (a second instance per slot), and a cold instance's for some.
void check_batch_matches_score(const std::shared_ptr<const llama2::checkpoint>& model, int rounds, std::uint32_t seed) {
    constexpr std::size_t slots = 5;
    llama2::batch_transformer batch(model);
    std::vector<llama2::transformer> own(slots, llama2::transformer(model));
    std::vector<tokens> ctx(slots, tokens{1});
    std::vector<tokens> drafts(slots);
    std::mt19937 rng(seed);
    const auto V = std::int32_t(model->cfg.vocab_size);
    const auto limit = std::size_t(model->cfg.seq_len);
    specdec::packed_logits out;
    std::vector<specdec::score_request> requests;
    std::size_t ragged = 0, partial = 0;
    for (int round = 0; round < rounds; ++round) {
        requests.clear();
        std::vector<std::size_t> who;
        for (std::size_t s = 0; s < slots; ++s) {
            if (rng() % 4 == 0) continue;  // not in this pass
            switch (rng() % 4) {
                case 0: ctx[s].resize(1 + rng() % ctx[s].size()); break;      // roll back
                case 1: ctx[s] = tokens{1}; break;                              // a new sequence on the slot
                default: {                                                      // grow
                    const auto more = random_tokens(rng, 1 + rng() % 4, V);
                    ctx[s].insert(ctx[s].end(), more.begin(), more.end());
                }
            }
            if (ctx[s].size() + 8 > limit) ctx[s].resize(1);
            drafts[s] = random_tokens(rng, rng() % 8, V);
            requests.push_back({s, ctx[s], drafts[s]});
            who.push_back(s);
        }
        if (requests.empty()) continue;
        partial += requests.size() < slots ? 1u : 0u;
        out.shape(V, requests);
        batch.score_batch(requests, out);
        for (std::size_t i = 0; i < who.size(); ++i) {
            const std::size_t s = who[i];
            INFO("round " << round << ", slot " << s << ", context " << ctx[s].size() << ", draft " << drafts[s].size());
            const Eigen::MatrixXf want = own[s].score(ctx[s], drafts[s]);
            REQUIRE(out.columns(i) == want.cols());
            CHECK((out.sequence(i).array() == want.array()).all());  // bit for bit
            if (round % 7 == 0) {
                llama2::transformer cold(model);
                CHECK((out.sequence(i).array() == cold.score(ctx[s], drafts[s]).array()).all());
            }
            CHECK(tokens(batch.sequence(s).cached_tokens().begin(), batch.sequence(s).cached_tokens().end()) ==
                  [&] { tokens t = ctx[s]; t.insert(t.end(), drafts[s].begin(), drafts[s].end()); return t; }());
            if (drafts[s].size() != drafts[who[0]].size()) ++ragged;
        }
    }
    CHECK(ragged > 0);
    CHECK(partial > 0);
    CHECK(batch.passes() > 0);
}

}  // namespace

TEST_CASE("llama2: each sequence's logits from one packed pass equal its own score() (random model)",
          "[llama2][batch]") {
    check_batch_matches_score(small_model(42), 60, 11);
    check_batch_matches_score(small_model(43, true), 40, 12);
}

TEST_CASE("llama2: each sequence's logits from one packed pass equal its own score() (real model)",
          "[llama2][batch]") {
    const char* env = std::getenv("SPECDEC_MODELS_DIR");
    if (env == nullptr || *env == '\0') {
        specdec_test::skip("SPECDEC_MODELS_DIR is not set (it must name the folder with stories260K.bin)");
        return;
    }
    const fs::path file = fs::path(env) / "stories260K.bin";
    if (!fs::exists(file)) {
        specdec_test::skip(file.string() + " not found");
        return;
    }
    check_batch_matches_score(std::make_shared<const llama2::checkpoint>(llama2::read_checkpoint(file)), 30, 21);
}

TEST_CASE("llama2: draft_batch gives each sequence the block its own model drafter gives", "[llama2][batch]") {
    const auto model = small_model(7);
    llama2::batch_transformer batch(model);
    std::vector<llama2::transformer> own(4, llama2::transformer(model));
    const std::vector<tokens> ctx{{1, 5, 9}, {1}, {1, 200, 100, 7, 7}, {1, 3}};
    const std::size_t gammas[] = {3, 0, 5, 1};
    const specdec::sampling_config sampling{.temperature = 0.8f, .top_k = 50};
    std::vector<specdec::draft_block> blocks(4), want(4);
    std::vector<std::mt19937_64> rngs, rngs2;
    std::vector<specdec::draft_request> requests;
    for (std::size_t i = 0; i < 4; ++i) {
        rngs.emplace_back(100 + i);
        rngs2.emplace_back(100 + i);
    }
    for (std::size_t i = 0; i < 4; ++i) requests.push_back({i, ctx[i], gammas[i], specdec::uniform_source(rngs[i]), &blocks[i]});
    batch.draft_batch(requests, sampling);
    CHECK(batch.passes() == 5);  // one pass per draft position, all sequences together
    for (std::size_t i = 0; i < 4; ++i) {
        INFO("sequence " << i);
        specdec::model_drafter<llama2::transformer> alone(own[i]);
        specdec::uniform_source u(rngs2[i]);
        if (gammas[i] > 0) alone.draft(ctx[i], gammas[i], sampling, u, want[i]);
        CHECK(blocks[i].tokens == want[i].tokens);
        CHECK(blocks[i].scales == want[i].scales);
        if (gammas[i] > 0) CHECK((blocks[i].probs.array() == want[i].probs.array()).all());
        CHECK(rngs[i] == rngs2[i]);
    }
}

TEST_CASE("llama2: speculative decoding through the multi-sequence engine equals separate runs", "[llama2][batch]") {
    const auto target_w = small_model(1), draft_w = small_model(2);
    llama2::batch_transformer target(target_w), draft(draft_w);
    const std::vector<tokens> prompts{{1, 10, 20}, {1}, {1, 250, 3, 4, 5, 6}, {1, 77}};
    for (const bool draft_sampling : {false, true}) {
        INFO((draft_sampling ? "the draft's own sampling (draft_batch samples at 0.7, top-k 40)" : "one sampling"));
        specdec::decode_options o{.step = specdec::chain{.gamma = 4},
                                  .sampling = {.temperature = 1.0f},
                                  .budget = {.max_new_tokens = 30}};
        if (draft_sampling) o.draft.sampling = specdec::sampling_config{.temperature = 0.7f, .top_k = 40};
        // One batch_decoder over the engine (draft_batch and score_batch serve every sequence).
        specdec::batch_decoder dec(draft, target, o);
        std::vector<std::size_t> ids;
        for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(dec.add(prompts[i], std::mt19937_64(i + 1)));
        dec.run();
        std::vector<specdec::decode_result> out;
        for (const auto id : ids) out.push_back(dec.take(id));
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            INFO("sequence " << i);
            llama2::transformer t(target_w), d(draft_w);
            std::mt19937_64 rng(i + 1);
            const auto want = specdec::speculative_decode(d, t, prompts[i], o, rng);
            CHECK(out[i].tokens == want.tokens);
            CHECK(out[i].stats.accepted_tokens == want.stats.accepted_tokens);
        }
    }
}

TEST_CASE("llama2: multi-sequence errors name the problem and leave the caches as they were", "[llama2][batch][errors]") {
    const auto model = small_model(3);
    llama2::batch_transformer batch(model);
    const tokens a{1, 4, 5}, b{1, 6}, bad{1, 300}, draft{7};
    std::vector<specdec::score_request> requests{{0, a, draft}, {1, b, {}}};
    specdec::packed_logits out;
    out.shape(batch.vocab_size(), requests);
    batch.score_batch(requests, out);
    const tokens cached0(batch.sequence(0).cached_tokens().begin(), batch.sequence(0).cached_tokens().end());
    requests[1].slot = 0;
    CHECK_THROWS_WITH(batch.score_batch(requests, out), Catch::Contains("slot 0 is used by requests 0 and 1"));
    requests[1] = {1, bad, {}};
    CHECK_THROWS_AS(batch.score_batch(requests, out), std::out_of_range);
    CHECK(tokens(batch.sequence(0).cached_tokens().begin(), batch.sequence(0).cached_tokens().end()) == cached0);
    const std::vector<specdec::score_request> one{{0, a, {}}};
    CHECK_THROWS_WITH(batch.score_batch(one, out), Catch::Contains("packed_logits::shape"));
}

TEST_CASE("llama2: matmul_streamed_once equals detail::matmul bit for bit", "[llama2][batch]") {
    // Rows enough for several 1 MiB panels, columns not a multiple of the SIMD width, and column
    // counts below, at and above the kernel's group of 9.
    const std::ptrdiff_t rows = 1500, cols = 300;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(std::size_t(rows * cols));
    for (auto& x : w) x = u(rng);
    for (const std::ptrdiff_t k : {1, 9, 10, 23, 112}) {
        INFO("k = " << k);
        Eigen::MatrixXf x(cols, k), a(rows, k), b(rows, k);
        for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
        llama2::detail::matmul(w.data(), rows, cols, x.data(), cols, k, a.data(), rows);
        llama2::matmul_streamed_once(w.data(), rows, cols, x.data(), cols, k, b.data(), rows);
        CHECK((a.array() == b.array()).all());
    }
}
