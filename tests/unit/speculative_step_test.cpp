#include "support/catch.hpp"
#include "support/markov.hpp"

#include <specdec/speculative_step.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

TEST_CASE("A step appends the accepted drafts and one more token, and counts its work", "[step]") {
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    std::vector<token_id> seq{0, 3};
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    std::mt19937_64 rng(4);
    for (int i = 0; i < 50; ++i) {
        const auto before = seq.size();
        const auto r = specdec::speculative_step(draft, target, seq, stats, {.gamma = 4}, rng, ws);
        REQUIRE(r.draft.size() == 4);
        REQUIRE(seq.size() == before + r.accepted + 1);
        for (std::size_t k = 0; k < r.accepted; ++k) CHECK(seq[before + k] == r.draft[k]);
        CHECK(seq.back() == r.next_token);
    }
    CHECK(stats.steps == 50);
    CHECK(stats.drafted_tokens == 200);
    CHECK(stats.draft_calls == 200);
    CHECK(stats.target_calls == 250);  // plain model as target: gamma + 1 calls per step
    CHECK(stats.accepted_tokens + stats.steps == seq.size() - 2);
    CHECK(stats.accepted_at_position.size() == 4);
    CHECK(stats.reached_at_position[0] == 50);
    CHECK(stats.accepted_at_position[0] == stats.reached_at_position[1]);
    CHECK(stats.rejected_tokens == 50 - stats.accepted_at_position[3]);
}

namespace {
/// Ten steps with gamma 3 on a fresh sequence; returns the statistics.
template <class V>
specdec::decode_stats ten_steps(markov_model& draft, V& verifier) {
    std::vector<token_id> seq{0};
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    std::mt19937_64 rng(4);
    for (int i = 0; i < 10; ++i) specdec::speculative_step(draft, verifier, seq, stats, {.gamma = 3}, rng, ws);
    return stats;
}
}  // namespace

TEST_CASE("A target with score() is called once per step", "[step]") {
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    batched_markov verifier{&target};
    CHECK(ten_steps(draft, verifier).target_calls == 10);
    CHECK(verifier.passes == 10);
}

TEST_CASE("A model_verifier over a plain model counts one target call per position", "[step]") {
    // It is a BatchVerifier, but its score() calls next_logits once per position; the
    // statistics must count those calls, not one per step.
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    specdec::model_verifier<markov_model> verifier(target);
    CHECK(ten_steps(draft, verifier).target_calls == 40);
    CHECK(target.calls == 40);
}

TEST_CASE("An adapter that throws mid-step leaves the caller's sequence and statistics unchanged", "[step][errors]") {
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    std::mt19937_64 rng(4);
    specdec::step_workspace ws;
    std::vector<token_id> seq{0, 1, 2};
    specdec::decode_stats stats;
    // Warm up so the statistics are non-trivial.
    specdec::speculative_step(draft, target, seq, stats, {.gamma = 3}, rng, ws);
    const auto seq_before = seq;
    const auto stats_before = stats;
    auto same_stats = [&] {
        return stats.steps == stats_before.steps && stats.target_calls == stats_before.target_calls &&
               stats.draft_calls == stats_before.draft_calls && stats.drafted_tokens == stats_before.drafted_tokens &&
               stats.accepted_tokens == stats_before.accepted_tokens &&
               stats.rejected_tokens == stats_before.rejected_tokens &&
               stats.accepted_at_position == stats_before.accepted_at_position &&
               stats.reached_at_position == stats_before.reached_at_position;
    };
    SECTION("the drafter throws on its second call") {
        throwing_model<markov_model> bad{&draft, 2};
        CHECK_THROWS_AS(specdec::speculative_step(bad, target, seq, stats, {.gamma = 3}, rng, ws), std::runtime_error);
    }
    SECTION("the target throws on its third call") {
        throwing_model<markov_model> bad{&target, 3};
        CHECK_THROWS_AS(specdec::speculative_step(draft, bad, seq, stats, {.gamma = 3}, rng, ws), std::runtime_error);
    }
    CHECK(seq == seq_before);
    CHECK(same_stats());
}

TEST_CASE("A drafter gets an empty block: nothing of an earlier step's block reaches its draft", "[step]") {
    // A drafter that writes only tokens proposes point masses, also when the workspace's block
    // held another drafter's columns, scales and flag the step before.
    auto target = markov_model::random(8, 2, 1);
    auto draft = markov_model::random(8, 2, 2);
    struct tokens_only_drafter {
        std::size_t seen_columns = 0, seen_tokens = 0, seen_scales = 0, seen_flags = 0;
        std::ptrdiff_t vocab_size() const { return 8; }
        void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config&,
                   specdec::uniform_source&, specdec::draft_block& out) {
            seen_columns += static_cast<std::size_t>(out.probs.cols());
            seen_tokens += out.tokens.size();
            seen_scales += out.scales.size();
            seen_flags += out.standardized;
            for (std::size_t i = 0; i < gamma; ++i)
                out.tokens.push_back((context.back() + 3 + static_cast<token_id>(i)) % 8);
        }
    } shared_user, fresh_user;
    // top_k = 6 makes the model's columns normalized, so stale ones would pass the check unnoticed.
    const specdec::step_options opts{.gamma = 3, .sampling = {.top_k = 6}};
    std::vector<token_id> model_seq{0}, shared_seq{0}, fresh_seq{0};
    specdec::decode_stats stats;
    specdec::step_workspace shared_ws, fresh_ws;
    std::mt19937_64 model_rng(1), shared_rng(2), fresh_rng(2);
    for (int i = 0; i < 200; ++i) {
        specdec::speculative_step(draft, target, model_seq, stats, opts, model_rng, shared_ws);
        specdec::speculative_step(shared_user, target, shared_seq, stats, opts, shared_rng, shared_ws);
        specdec::speculative_step(fresh_user, target, fresh_seq, stats, opts, fresh_rng, fresh_ws);
    }
    CHECK(shared_user.seen_columns + shared_user.seen_tokens + shared_user.seen_scales + shared_user.seen_flags == 0);
    CHECK(shared_seq == fresh_seq);  // point masses in both, so the same tokens from the same seed
    CHECK(shared_seq.size() > 201);  // some drafts were accepted (201: one token a step)
}

TEST_CASE("speculative_step rejects bad options, mismatched vocabularies and malformed blocks", "[step][errors]") {
    auto target = markov_model::random(8, 2, 1);
    auto small = markov_model::random(6, 2, 2);
    std::vector<token_id> seq{0};
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    std::mt19937_64 rng(4);
    CHECK_THROWS_WITH(specdec::speculative_step(small, target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("draft vocab_size() = 6 differs from target vocab_size() = 8"));
    CHECK_THROWS_WITH(specdec::speculative_step(target, target, seq, stats, {.gamma = 0}, rng, ws), contains("gamma = 0"));
    CHECK_THROWS_WITH(specdec::speculative_step(target, target, seq, stats, {.gamma = 2, .lenience = 2.0f}, rng, ws),
                      contains("lenience"));

    // A gamma whose draft block cannot be counted in Eigen::Index entries (the model drafter
    // sizes V x gamma columns): an error, with the sequence as it was.
    const std::size_t huge = std::size_t{1} << 62;
    CHECK_THROWS_WITH(specdec::speculative_step(target, target, seq, stats, {.gamma = huge}, rng, ws),
                      contains("gamma = 4611686018427387904 draft columns of vocab_size = 8"));
    CHECK(seq == std::vector<token_id>{0});
    specdec::draft_block block;
    CHECK_THROWS_WITH(block.resize_probs(-1, 2), contains("-1 x 2 is not a valid size"));
    CHECK_THROWS_WITH(block.resize_probs(std::numeric_limits<Eigen::Index>::max(), 2), contains("is not a valid size"));
    CHECK(block.resize_probs(3, 2).size() == 6);

    struct long_drafter {
        std::ptrdiff_t vocab_size() const { return 8; }
        void draft(std::span<const token_id>, std::size_t gamma, const specdec::sampling_config&,
                   specdec::uniform_source&, specdec::draft_block& out) const {
            out.tokens.assign(gamma + 1, 0);
            out.probs.resize(0, 0);
        }
    } too_long;
    CHECK_THROWS_WITH(specdec::speculative_step(too_long, target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("proposed 3 tokens"));

    struct out_of_range_drafter {
        std::ptrdiff_t vocab_size() const { return 8; }
        void draft(std::span<const token_id>, std::size_t, const specdec::sampling_config&, specdec::uniform_source&,
                   specdec::draft_block& out) const {
            out.tokens.assign(1, 9);
            out.probs.resize(0, 0);
        }
    } out_of_range;
    // Caught before the target sees the token (a real engine would index its embedding table).
    batched_markov counting_target{&target};
    CHECK_THROWS_WITH(specdec::speculative_step(out_of_range, counting_target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("the drafter's tokens[0] = 9 is out of range [0, vocab_size = 8)"));
    CHECK(counting_target.passes == 0);

    // So is a token of the caller's sequence.
    std::vector<token_id> bad_seq{0, 8, 1};
    CHECK_THROWS_WITH(specdec::speculative_step(target, counting_target, bad_seq, stats, {.gamma = 2}, rng, ws),
                      contains("sequence[1] = 8 is out of range [0, vocab_size = 8)"));
    CHECK(counting_target.passes == 0);
    CHECK(bad_seq == std::vector<token_id>{0, 8, 1});

    struct bad_probs_drafter {
        std::ptrdiff_t vocab_size() const { return 8; }
        void draft(std::span<const token_id>, std::size_t, const specdec::sampling_config&, specdec::uniform_source&,
                   specdec::draft_block& out) const {
            out.tokens.assign(1, 2);
            out.probs = Eigen::MatrixXf::Constant(8, 1, 0.5f);  // sums to 4
        }
    } bad_probs;
    CHECK_THROWS_WITH(specdec::speculative_step(bad_probs, target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("sums to"));

    // Scales: one positive factor per column, q_i = scales[i] · column i.
    struct scaled_drafter {
        std::vector<float> scales;
        Eigen::Index columns = 1;
        std::ptrdiff_t vocab_size() const { return 8; }
        void draft(std::span<const token_id>, std::size_t, const specdec::sampling_config&, specdec::uniform_source&,
                   specdec::draft_block& out) const {
            out.tokens.assign(static_cast<std::size_t>(columns), 2);
            out.probs = Eigen::MatrixXf::Constant(8, columns, 0.5f);  // sums to 4: right with a scale of 1/4
            out.scales = scales;
        }
    };
    scaled_drafter scaled{{0.25f}};
    CHECK_NOTHROW(specdec::speculative_step(scaled, target, seq, stats, {.gamma = 2}, rng, ws));
    seq = {0};
    stats = {};
    scaled.scales = {0.5f};
    CHECK_THROWS_WITH(specdec::speculative_step(scaled, target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("times draft_scales[0] = 0.5 sums to 2"));
    scaled.scales = {0.25f, 0.25f};
    CHECK_THROWS_WITH(specdec::speculative_step(scaled, target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("the drafter's scales has 2 entries"));
    for (const float bad : {0.0f, -0.25f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
        scaled.scales = {bad};
        CHECK_THROWS_WITH(specdec::speculative_step(scaled, target, seq, stats, {.gamma = 2}, rng, ws),
                          contains("the drafter's scales[0] = ") && contains("finite and positive"));
    }
    scaled.scales = {0.25f};
    scaled.columns = 0;  // point masses with a scale: contradictory
    CHECK_THROWS_WITH(specdec::speculative_step(scaled, target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("the drafter's scales has 1 entries"));

    // A drafter that says its columns come from standardize() is not checked (its documented
    // contract): the same bad column passes.
    struct claims_standardized_drafter {
        std::ptrdiff_t vocab_size() const { return 8; }
        void draft(std::span<const token_id>, std::size_t, const specdec::sampling_config&, specdec::uniform_source&,
                   specdec::draft_block& out) const {
            out.tokens.assign(1, 2);
            out.probs = Eigen::MatrixXf::Constant(8, 1, 0.5f);  // sums to 4
            out.standardized = true;
        }
    } claims_standardized;
    seq = {0};
    stats = {};
    CHECK_NOTHROW(specdec::speculative_step(claims_standardized, target, seq, stats, {.gamma = 2}, rng, ws));
    seq = {0};
    stats = {};
    // ... and the flag does not outlive its step: the bad drafter above, run with the same
    // workspace next, is checked again.
    CHECK_THROWS_WITH(specdec::speculative_step(bad_probs, target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("sums to"));

    struct wrong_shape_verifier {
        std::ptrdiff_t vocab_size() const { return 8; }
        Eigen::MatrixXf score(std::span<const token_id>, std::span<const token_id> draft) const {
            return Eigen::MatrixXf::Zero(8, static_cast<Eigen::Index>(draft.size()));  // one column short
        }
    } wrong_shape;
    CHECK_THROWS_WITH(specdec::speculative_step(target, wrong_shape, seq, stats, {.gamma = 2}, rng, ws),
                      contains("score() returned 8 x 2"));

    struct nan_model {
        std::ptrdiff_t vocab_size() const { return 8; }
        Eigen::VectorXf next_logits(std::span<const token_id>) const {
            return Eigen::VectorXf::Constant(8, std::nanf(""));
        }
    } nan_target;
    CHECK_THROWS_WITH(specdec::speculative_step(target, nan_target, seq, stats, {.gamma = 2}, rng, ws), contains("NaN"));

    struct short_model {
        std::ptrdiff_t vocab_size() const { return 8; }
        Eigen::VectorXf next_logits(std::span<const token_id>) const { return Eigen::VectorXf::Zero(7); }
    } short_target;
    CHECK_THROWS_WITH(specdec::speculative_step(target, short_target, seq, stats, {.gamma = 2}, rng, ws),
                      contains("returned 7 logits"));
    CHECK(seq == std::vector<token_id>{0});
    CHECK(stats.steps == 0);
}
