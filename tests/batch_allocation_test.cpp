// The multi-sequence path allocates nothing per step after warm-up: the packed scores, the
// requests and the per-sequence buffers are reused (counted with support/allocation_counter.hpp,
// as allocation_test.cpp does; it replaces the global allocation functions, so this file is its
// own test executable).
#include "support/allocation_counter.hpp"

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/skip.hpp"

#include <specdec/batch_decode.hpp>

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
            d, v, {.gamma = 3, .sampling = {.temperature = 1.0f}, .max_new_tokens = 3000}, threads);
        for (token_id p = 0; p < 5; ++p) (void)dec.add(std::vector<token_id>{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p)));
        for (int s = 0; s < 20; ++s) dec.step();  // warm-up
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) dec.step();
              }) == 0);
        CHECK(dec.active() == 5);

        std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
        for (token_id p = 0; p < 5; ++p) {
            seqs.push_back({{p, 2}, {}, std::mt19937_64(static_cast<std::uint64_t>(p))});
            seqs.back().tokens.reserve(1000);
        }
        specdec::batch_workspace ws(threads);
        for (int s = 0; s < 20; ++s) specdec::speculative_step_batch(d, v, std::span(seqs), {.gamma = 3}, ws);
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) specdec::speculative_step_batch(d, v, std::span(seqs), {.gamma = 3}, ws);
              }) == 0);
    }
}
