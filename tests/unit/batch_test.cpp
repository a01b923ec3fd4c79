#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_markov.hpp"

#include <specdec/batch.hpp>
#include <specdec/batch_decoder.hpp>
#include <specdec/speculative_decode.hpp>

#include <random>
#include <stdexcept>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {
/// A shared model behind a per-sequence handle (what a real engine with per-sequence KV
/// caches and shared weights looks like).
struct handle {
    markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> c) const {
        const std::size_t row = model->row_of(c) * static_cast<std::size_t>(model->vocab);
        return Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, model->vocab);
    }
};
}  // namespace

TEST_CASE("A batch step gives each sequence what separate runs with the same seeds give", "[batch]") {
    auto target = markov_model::random(16, 2, 1);
    auto draft = markov_model::random(16, 2, 2);
    constexpr std::size_t batch = 7, steps = 30;
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        const specdec::step_options opts{.gamma = 4, .sampling = {.temperature = 0.9f}, .scheme = scheme};
        // Separate runs.
        std::vector<std::vector<token_id>> expected(batch);
        std::vector<specdec::decode_stats> expected_stats(batch);
        for (std::size_t b = 0; b < batch; ++b) {
            handle d{&draft}, t{&target};
            std::mt19937_64 rng(100 + b);
            specdec::step_workspace ws;
            expected[b] = {static_cast<token_id>(b % 16)};
            for (std::size_t s = 0; s < steps; ++s)
                specdec::speculative_step(d, t, expected[b], expected_stats[b], opts, rng, ws);
        }
        for (std::size_t threads : {1u, 2u, 3u}) {
            std::vector<handle> drafters(batch, handle{&draft}), verifiers(batch, handle{&target});
            std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
            for (std::size_t b = 0; b < batch; ++b)
                seqs.push_back({{static_cast<token_id>(b % 16)}, {}, std::mt19937_64(100 + b)});
            specdec::batch_workspace ws(threads);
            for (std::size_t s = 0; s < steps; ++s) {
                if (s % 2 == 0)
                    specdec::detail::speculative_step_batch(std::span(drafters), std::span(verifiers), std::span(seqs), opts,
                                                    ws);
                else  // the overload for vectors is the same call
                    specdec::detail::speculative_step_batch(drafters, verifiers, seqs, opts, ws);
            }
            std::size_t ragged = 0;
            for (std::size_t b = 0; b < batch; ++b) {
                INFO("threads " << threads << " sequence " << b);
                CHECK(seqs[b].tokens == expected[b]);
                CHECK(seqs[b].stats.accepted_tokens == expected_stats[b].accepted_tokens);
                if (seqs[b].tokens.size() != seqs[0].tokens.size()) ++ragged;
            }
            CHECK(ragged > 0);  // acceptance really was ragged
        }
    }
}

TEST_CASE("A failing sequence in a batch is reported and left unchanged, the others step", "[batch][errors]") {
    auto target = markov_model::random(8, 2, 1);
    struct failing {
        std::ptrdiff_t vocab_size() const { return 8; }
        Eigen::VectorXf next_logits(std::span<const token_id>) const { throw std::runtime_error("engine failure"); }
    };
    // Sequence 1 has a draft model of another vocabulary: an invalid_argument from its step.
    // The sequences after it still step, on one thread as on two.
    auto small = markov_model::random(6, 2, 3);
    std::vector<markov_model> drafters{target, small, target};
    std::vector<markov_model> verifiers{target, target, target};
    std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
    for (const std::size_t threads : {1u, 2u}) {
        INFO("threads " << threads);
        seqs.assign(3, {{0}, {}, std::mt19937_64(1)});
        specdec::batch_workspace one_or_two(threads);
        CHECK_THROWS_WITH(specdec::detail::speculative_step_batch(drafters, verifiers, seqs, {.gamma = 2}, one_or_two),
                          contains("vocab_size"));
        CHECK(seqs[1].tokens.size() == 1);
        CHECK(seqs[0].tokens.size() > 1);
        CHECK(seqs[2].tokens.size() > 1);
    }
    specdec::batch_workspace ws(2);
    std::vector<failing> bad(3);
    CHECK_THROWS_WITH(specdec::detail::speculative_step_batch(std::span(drafters), std::span(bad), std::span(seqs), {.gamma = 2}, ws),
                      contains("engine failure"));
    std::vector<markov_model> two{target, target};
    CHECK_THROWS_WITH(specdec::detail::speculative_step_batch(std::span(two), std::span(verifiers), std::span(seqs), {.gamma = 2}, ws),
                      contains("one of each per sequence"));
    // A sequence holding a token outside the vocabulary fails alone, before its models see it.
    std::vector<specdec::batch_sequence<std::mt19937_64>> with_bad(2, {{0}, {}, std::mt19937_64(1)});
    with_bad[1].tokens = {0, 8};
    std::vector<markov_model> pair{target, target};
    CHECK_THROWS_WITH(specdec::detail::speculative_step_batch(std::span(pair), std::span(pair), std::span(with_bad),
                                                      {.gamma = 2}, ws),
                      contains("sequence tokens[1] = 8 is out of range"));
    CHECK(with_bad[0].tokens.size() > 1);
    CHECK(with_bad[1].tokens == std::vector<token_id>{0, 8});
    CHECK(pair[0].calls + pair[1].calls > 0);
    CHECK_THROWS_AS(specdec::batch_workspace(0), std::invalid_argument);
}

TEST_CASE("A batch step honours draft_sampling and rejects an empty sequence", "[batch]") {
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    const specdec::step_options opts{.gamma = 3,
                                     .sampling = {.temperature = 0.9f},
                                     .draft_sampling = specdec::sampling_config{.temperature = 0.5f, .top_k = 3}};
    // What separate steps with the same settings and seeds give.
    std::vector<std::vector<token_id>> expected(2);
    for (std::size_t b = 0; b < 2; ++b) {
        handle d{&draft}, t{&target};
        std::mt19937_64 rng(30 + b);
        specdec::step_workspace ws;
        specdec::decode_stats stats;
        expected[b] = {static_cast<token_id>(b)};
        for (int s = 0; s < 10; ++s) specdec::speculative_step(d, t, expected[b], stats, opts, rng, ws);
    }
    std::vector<handle> drafters(2, handle{&draft}), verifiers(2, handle{&target});
    std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
    for (std::size_t b = 0; b < 2; ++b) seqs.push_back({{static_cast<token_id>(b)}, {}, std::mt19937_64(30 + b)});
    specdec::batch_workspace ws(2);
    for (int s = 0; s < 10; ++s) specdec::detail::speculative_step_batch(drafters, verifiers, seqs, opts, ws);
    CHECK(seqs[0].tokens == expected[0]);
    CHECK(seqs[1].tokens == expected[1]);
    // Without draft_sampling the output differs (the draft's proposals change).
    std::vector<specdec::batch_sequence<std::mt19937_64>> plain;
    for (std::size_t b = 0; b < 2; ++b) plain.push_back({{static_cast<token_id>(b)}, {}, std::mt19937_64(30 + b)});
    specdec::step_options same_as_target = opts;
    same_as_target.draft_sampling.reset();
    for (int s = 0; s < 10; ++s) specdec::detail::speculative_step_batch(drafters, verifiers, plain, same_as_target, ws);
    CHECK((plain[0].tokens != expected[0] || plain[1].tokens != expected[1]));
    // An empty sequence fails alone, before its models see it.
    std::vector<specdec::batch_sequence<std::mt19937_64>> with_empty(2, {{0}, {}, std::mt19937_64(1)});
    with_empty[1].tokens.clear();
    CHECK_THROWS_WITH(specdec::detail::speculative_step_batch(drafters, verifiers, with_empty, opts, ws),
                      contains("sequence 1 has no tokens"));
    CHECK(with_empty[0].tokens.size() > 1);
    CHECK(with_empty[1].tokens.empty());
}

TEST_CASE("The multi-sequence path honours draft-side sampling: each sequence gets what a separate run gives",
          "[batch][multi]") {
    // (It used to refuse draft_sampling.) Each sequence of a batch_decoder with the draft's own
    // sampling settings equals a separate speculative_decode run with the same seed, prompt and
    // options, whether the drafts come from one draft_batch call or from a shared plain drafter,
    // and whether the sequence joined at the start or later.
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    const std::vector<std::vector<token_id>> prompts{{0}, {1, 2}, {3}, {5, 5, 6}};
    const std::size_t join[] = {0, 0, 2, 3};
    const specdec::decode_options opts{.step = specdec::chain{.gamma = 3},
                                       .sampling = {.temperature = 0.9f},
                                       .draft = {.sampling = specdec::sampling_config{.temperature = 0.5f, .top_k = 3}},
                                       .budget = {.max_new_tokens = 25, .stop_tokens = {7}}};
    std::vector<specdec::decode_result> expected;
    for (std::size_t b = 0; b < prompts.size(); ++b) {
        markov_model d = draft, t = target;
        std::mt19937_64 rng(30 + b);
        expected.push_back(specdec::speculative_decode(d, t, prompts[b], opts, rng));
    }
    // The decoder's loop over sequences that join at join[b]; returns each one's result.
    auto run = [&](auto& drafter, const specdec::decode_options& o) {
        multi_markov_verifier verifier{&target};
        specdec::batch_decoder dec(drafter, verifier, o, 2);
        std::vector<std::size_t> ids(prompts.size());
        for (std::size_t step = 0; step < 4 || dec.active() != 0; ++step) {
            for (std::size_t b = 0; b < prompts.size(); ++b)
                if (join[b] == step) ids[b] = dec.add(prompts[b], std::mt19937_64(30 + b));
            dec.step();
        }
        CHECK(verifier.passes > 0);
        std::vector<specdec::decode_result> out;
        for (const auto id : ids) out.push_back(dec.take(id));
        return out;
    };
    multi_markov_drafter multi{&draft};
    markov_model shared = draft;  // a plain drafter shared by every sequence
    const auto from_multi = run(multi, opts);
    const auto from_shared = run(shared, opts);
    CHECK(multi.calls > 0);
    for (std::size_t b = 0; b < prompts.size(); ++b) {
        INFO("sequence " << b);
        CHECK(from_multi[b].tokens == expected[b].tokens);
        CHECK(from_multi[b].stop == expected[b].stop);
        CHECK(from_multi[b].stats.accepted_tokens == expected[b].stats.accepted_tokens);
        CHECK(from_multi[b].stats.steps == expected[b].stats.steps);
        CHECK(from_shared[b].tokens == expected[b].tokens);
        CHECK(from_shared[b].stats.accepted_tokens == expected[b].stats.accepted_tokens);
    }
    // The draft's settings were used: without them (the target's for the draft) the output differs.
    specdec::decode_options same_as_target = opts;
    same_as_target.draft.sampling.reset();
    multi_markov_drafter multi2{&draft};
    const auto plain = run(multi2, same_as_target);
    bool differs = false;
    for (std::size_t b = 0; b < prompts.size(); ++b) differs = differs || plain[b].tokens != expected[b].tokens;
    CHECK(differs);
}
