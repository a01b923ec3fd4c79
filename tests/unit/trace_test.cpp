// The step recorder (trace.hpp) and the step timing it records: what it keeps adds up to the
// run's output and statistics, for chains, trees, plain steps and a batch; the origin of each
// step's last token is right; its capacity drops whole steps and counts them. (That recording
// allocates nothing per step is in batch_allocation_test.cpp.)

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_markov.hpp"

#include <specdec/batch_decoder.hpp>
#include <specdec/engine_profile.hpp>
#include <specdec/speculative_decode.hpp>
#include <specdec/trace.hpp>

#include <functional>
#include <random>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {

/// The recorded steps of sequence `id`, with the checks every recorded step must pass.
std::vector<specdec::recorded_step> steps_of(const specdec::step_recorder& r, std::size_t id) {
    std::vector<specdec::recorded_step> out;
    double last_start = 0.0;
    for (const auto& s : r.steps()) {
        CHECK(s.start_seconds >= last_start);  // reported in order
        last_start = s.start_seconds;
        CHECK(s.draft_seconds >= 0.0);
        CHECK(s.target_seconds >= 0.0);
        CHECK(s.library_seconds >= 0.0);
        CHECK(s.accepted <= s.drafted);
        if (s.sequence == id) out.push_back(s);
    }
    return out;
}

}  // namespace

TEST_CASE("A recorded chain run adds up to its output and statistics", "[trace]") {
    auto target = markov_model::random(12, 2, 1);
    auto draft = markov_model::random(12, 2, 2);
    for (const bool adaptive : {false, true}) {
        INFO("adaptive " << adaptive);
        specdec::step_recorder trace;
        const specdec::decode_options o{
            .step = specdec::chain{.gamma = 4, .estimate_acceptance = true},
            .length = {.policy = adaptive ? specdec::gamma_policy::adaptive : specdec::gamma_policy::fixed},
            .sampling = {.temperature = 1.0f},
            .budget = {.max_new_tokens = 300},
            .on_step = std::ref(trace)};
        // Planned from a fixed profile (a cheap draft), so the steps do not depend on timings.
        specdec::decode_options planned = o;
        planned.length.adaptive.profile =
            specdec::engine_profile{.target_pass = {1.0, 1.0, 1.0, 1.0, 1.0}, .draft_step = {0.05, 0.05}};
        std::mt19937_64 rng(7);
        const auto out = specdec::speculative_decode(draft, target, {1, 2}, planned, rng);
        const auto steps = steps_of(trace, 0);
        REQUIRE(steps.size() == out.stats.steps);
        std::vector<token_id> tokens;
        std::size_t accepted = 0, drafted = 0, chains = 0;
        double draft_time = 0.0, target_time = 0.0;
        for (const auto& s : steps) {
            const auto t = trace.tokens(s);
            tokens.insert(tokens.end(), t.begin(), t.end());
            accepted += s.accepted;
            drafted += s.drafted;
            draft_time += s.draft_seconds;
            target_time += s.target_seconds;
            CHECK(s.kind != specdec::step_kind::tree);
            if (s.kind == specdec::step_kind::chain) {
                ++chains;
                CHECK(s.gamma >= 1);
                // β of every tested position: the accepted ones and the rejected one.
                CHECK(trace.acceptance(s).size() == std::min(s.drafted, s.accepted + 1));
                CHECK(s.origin == (s.accepted == s.drafted ? specdec::next_token_origin::bonus
                                                           : specdec::next_token_origin::correction));
            } else {
                CHECK(s.gamma == 0);
                CHECK(s.origin == specdec::next_token_origin::target);
            }
            if (t.size() == s.accepted + 1) CHECK(s.next_token == t.back());  // (unless cut at the budget)
        }
        CHECK(tokens == out.tokens);
        CHECK(accepted == out.stats.accepted_tokens);
        CHECK(drafted == out.stats.drafted_tokens);
        CHECK(chains > 10);
        CHECK(draft_time > 0.0);  // the steps were timed
        CHECK(target_time > 0.0);
        CHECK(trace.dropped() == 0);
    }
}

TEST_CASE("A recorded tree run adds up to its output, with the origin of each last token", "[trace][tree]") {
    auto target = markov_model::random(10, 2, 3);
    auto draft = markov_model::random(10, 2, 4);
    specdec::step_recorder trace;
    const specdec::decode_options o{
        .step = specdec::tree{.shape = {.branching = {2, 2, 1}}, .estimate_sibling_acceptance = true},
        .sampling = {.temperature = 1.0f},
        .budget = {.max_new_tokens = 300},
        .on_step = std::ref(trace)};
    std::mt19937_64 rng(11);
    const auto out = specdec::speculative_decode(draft, target, {1, 2}, o, rng);
    const auto steps = steps_of(trace, 0);
    REQUIRE(steps.size() == out.stats.steps);
    std::vector<token_id> tokens;
    std::size_t bonus = 0, correction = 0, accepted = 0;
    for (const auto& s : steps) {
        const auto t = trace.tokens(s);
        tokens.insert(tokens.end(), t.begin(), t.end());
        accepted += s.accepted;
        REQUIRE(s.kind == specdec::step_kind::tree);
        if (s.gamma == 3) CHECK(s.drafted == 2 + 4 + 4);  // the full 2,2,1 tree: 2 + 2·2 + 4·1 nodes
        CHECK(!trace.sibling_acceptance(s).empty());
        // A path as deep as the tree ends at a leaf: its next token is a bonus; a shorter path
        // stopped because every child was rejected: a correction.
        const auto expected = s.accepted == s.gamma ? specdec::next_token_origin::bonus : specdec::next_token_origin::correction;
        CHECK(s.origin == expected);
        (s.origin == specdec::next_token_origin::bonus ? bonus : correction) += 1;
    }
    CHECK(tokens == out.tokens);
    CHECK(accepted == out.stats.accepted_tokens);
    CHECK(bonus > 0);
    CHECK(correction > 0);
}

TEST_CASE("The plain steps of a planned tree run are recorded as plain", "[trace][tree]") {
    auto target = markov_model::random(10, 2, 3);
    auto draft = markov_model::random(10, 2, 4);
    // A draft that costs ten target steps: the planner soon stops drafting.
    specdec::engine_profile costly{.target_pass = {1.0, 1.0}, .draft_step = {10.0, 10.0}};
    specdec::step_recorder trace;
    specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {2, 1}}},
                              .length = {.policy = specdec::gamma_policy::adaptive},
                              .budget = {.max_new_tokens = 100},
                              .on_step = std::ref(trace)};
    o.length.adaptive.profile = costly;
    std::mt19937_64 rng(2);
    const auto out = specdec::speculative_decode(draft, target, {1, 2}, o, rng);
    std::size_t plain = 0;
    for (const auto& s : trace.steps()) {
        if (s.gamma != 0) continue;
        ++plain;
        CHECK(s.kind == specdec::step_kind::plain);
        CHECK(s.origin == specdec::next_token_origin::target);
        CHECK(s.drafted == 0);
    }
    CHECK(plain > 50);
    CHECK(trace.steps().size() == out.stats.steps);
}

TEST_CASE("A recorded batch keeps every sequence's steps, sharing the batch step's times", "[trace][multi]") {
    const auto target = markov_model::random(16, 2, 5);
    const auto draft = markov_model::random(16, 2, 6);
    multi_markov_verifier v{&target};
    multi_markov_drafter d{&draft};
    specdec::step_recorder trace;
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(
        d, v, {.step = specdec::chain{.gamma = 3}, .sampling = {.temperature = 1.0f}, .on_step = std::ref(trace)});
    std::vector<std::size_t> ids;
    for (token_id p = 0; p < 3; ++p)
        ids.push_back(dec.add(std::vector<token_id>{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p)),
                              {.max_new_tokens = 40u + 20u * static_cast<std::size_t>(p)}));
    dec.run();
    for (const auto id : ids) {
        const auto steps = steps_of(trace, id);
        std::vector<token_id> tokens;
        for (const auto& s : steps) {
            const auto t = trace.tokens(s);
            tokens.insert(tokens.end(), t.begin(), t.end());
        }
        CHECK(steps.size() == dec.stats(id).steps);
        const auto generated = dec.generated(id);
        CHECK(tokens == std::vector<token_id>(generated.begin(), generated.end()));
    }
    // The sequences of one batch step report the same start and times.
    const auto all = trace.steps();
    REQUIRE(all.size() >= 2);
    CHECK(all[0].start_seconds == all[1].start_seconds);
    CHECK(all[0].target_seconds == all[1].target_seconds);
}

TEST_CASE("A recorded plain run: every step is the target's own", "[trace]") {
    auto target = markov_model::random(12, 2, 1);
    specdec::step_recorder trace;
    std::mt19937_64 rng(3);
    const auto out = specdec::autoregressive_decode(
        target, {1, 2}, {.sampling = {.temperature = 1.0f}, .budget = {.max_new_tokens = 50}, .on_step = std::ref(trace)},
        rng);
    REQUIRE(trace.steps().size() == 50);
    for (std::size_t i = 0; i < 50; ++i) {
        const auto& s = trace.steps()[i];
        CHECK(s.kind == specdec::step_kind::plain);
        CHECK(s.origin == specdec::next_token_origin::target);
        CHECK(s.drafted == 0);
        CHECK(trace.tokens(s).size() == 1);
        CHECK(trace.tokens(s)[0] == out.tokens[i]);
    }
}

TEST_CASE("A full step recorder drops whole steps and counts them", "[trace]") {
    auto target = markov_model::random(12, 2, 1);
    auto draft = markov_model::random(12, 2, 2);
    std::mt19937_64 rng(5);
    SECTION("by steps") {
        specdec::step_recorder trace(specdec::step_recorder::capacity{.steps = 7});
        const auto out = specdec::speculative_decode(
            draft, target, {1, 2}, {.budget = {.max_new_tokens = 100}, .on_step = std::ref(trace)}, rng);
        CHECK(trace.steps().size() == 7);
        CHECK(trace.dropped() == out.stats.steps - 7);
    }
    SECTION("by tokens: a step that does not fit whole is not kept") {
        specdec::step_recorder trace(specdec::step_recorder::capacity{.tokens = 10});
        const auto out = specdec::speculative_decode(
            draft, target, {1, 2}, {.budget = {.max_new_tokens = 100}, .on_step = std::ref(trace)}, rng);
        std::size_t kept = 0;
        for (const auto& s : trace.steps()) kept += trace.tokens(s).size();
        CHECK(kept <= 10);
        CHECK(trace.steps().size() + trace.dropped() == out.stats.steps);
        CHECK(trace.dropped() > 0);
        trace.clear();
        CHECK(trace.steps().empty());
        CHECK(trace.dropped() == 0);
    }
}
