// The engine profile (engine_profile.hpp) and the plan it gives the adaptive policy: storing and
// loading it (the text is untrusted input), the cost model at a batch's total positions, the
// choice against a brute-force search, the explanation, and reproducibility (with a profile the
// same seed gives the same tokens whatever the timings). Exactness of the planned steps is in
// batch_distribution_test.cpp (a profile case) and distribution_test.cpp.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_markov.hpp"
#include "support/tree_reference.hpp"

#include <specdec/batch_decoder.hpp>
#include <specdec/engine_profile.hpp>
#include <specdec/measure_profile.hpp>
#include <specdec/speculative_decode.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {

/// A GPU-like engine: a target pass is flat up to `flat` positions (reading the weights
/// dominates), then grows linearly; a draft step costs `draft` target passes at any batch.
specdec::engine_profile gpu_like(std::size_t flat = 64, double slope = 1.0 / 64.0, double draft = 0.05) {
    specdec::engine_profile p;
    for (std::size_t m = 1; m <= flat + 1; ++m)
        p.target_pass.push_back(m <= flat ? 1.0 : 1.0 + slope * static_cast<double>(m - flat));
    p.draft_step = {draft};
    p.draft_step.push_back(draft);
    return p;
}

/// Feeds `steps` observations of β = alpha at every position up to gamma_max.
void feed(specdec::gamma_controller& c, double alpha, std::size_t steps = 1) {
    const std::vector<float> beta(c.gamma_max(), static_cast<float>(alpha));
    for (std::size_t s = 0; s < steps; ++s)
        c.observe({.gamma = c.gamma_max(), .drafted = c.gamma_max(), .emitted = 1, .acceptance = beta});
}

std::string error_of(std::string_view text) {
    try {
        (void)specdec::parse_engine_profile(text);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("An engine profile is stored and loaded exactly", "[profile]") {
    const specdec::engine_profile p{.target_pass = {0.0123456789012345678, 1e-9, 3.25, 0.0},
                                    .draft_step = {0.001, 0.0015}};
    const std::string text = specdec::to_text(p);
    CHECK(text.rfind("specdec-engine-profile 1\n", 0) == 0);
    const auto q = specdec::parse_engine_profile(text);
    CHECK(q.target_pass == p.target_pass);  // 17 significant digits: the same doubles
    CHECK(q.draft_step == p.draft_step);
    // Comments, blank lines, tabs, Windows line ends, either table order.
    const auto r = specdec::parse_engine_profile(
        "# measured on a test machine\r\n\r\nspecdec-engine-profile 1\r\ndraft_step\t0.5\r\n  target_pass 2 3 4\r\n");
    CHECK(r.target_pass == std::vector<double>{2, 3, 4});
    CHECK(r.draft_step == std::vector<double>{0.5});
}

TEST_CASE("A malformed profile text is refused with an error naming the line", "[profile][errors]") {
    CHECK_THAT(error_of(""), Catch::Contains("empty") && Catch::Contains("specdec::parse_engine_profile"));
    CHECK_THAT(error_of("target_pass 1\n"), Catch::Contains("line 1") && Catch::Contains("header"));
    CHECK_THAT(error_of("specdec-engine-profile 2\n"), Catch::Contains("line 1") && Catch::Contains("version '2'"));
    const std::string head = "specdec-engine-profile 1\n";
    CHECK_THAT(error_of(head + "target_pass 1\ndraft_steps 1\n"),
               Catch::Contains("line 3") && Catch::Contains("unknown table 'draft_steps'"));
    CHECK_THAT(error_of(head + "target_pass 1\ntarget_pass 2\ndraft_step 1\n"),
               Catch::Contains("line 3") && Catch::Contains("twice"));
    CHECK_THAT(error_of(head + "target_pass 1 abc\ndraft_step 1\n"),
               Catch::Contains("line 2") && Catch::Contains("entry 2") && Catch::Contains("'abc'"));
    for (const char* bad : {"nan", "inf", "-1", "0x10", "1.5.2", "2,5"}) {
        INFO(bad);
        CHECK_THAT(error_of(head + "target_pass " + bad + "\ndraft_step 1\n"),
                   Catch::Contains("line 2") && Catch::Contains("not a finite number >= 0"));
    }
    for (const char* far : {"1e999", "1e-400"}) {  // a number, but not one a double holds
        INFO(far);
        CHECK_THAT(error_of(head + "target_pass 1\ndraft_step " + far + "\n"),
                   Catch::Contains("line 3") && Catch::Contains("out of the range of a double"));
    }
    CHECK_THAT(error_of(head + "draft_step 1\n"), Catch::Contains("no target_pass"));
    CHECK_THAT(error_of(head + "target_pass 1\n"), Catch::Contains("no draft_step"));
    CHECK_THAT(error_of(head + "target_pass\ndraft_step 1\n"),
               Catch::Contains("line 2") && Catch::Contains("target_pass has no entries"));
    CHECK_THAT(error_of(head + "target_pass 1\ndraft_step\n"),
               Catch::Contains("line 3") && Catch::Contains("draft_step has no entries"));
    CHECK_THAT(error_of(head + "target_pass 0 1\ndraft_step 1\n"), Catch::Contains("target_pass[0] = 0"));
    // A line of more entries than a table may have is refused as the entry past the limit is
    // read (its words are never all split up at once).
    {
        std::string many = head + "target_pass";
        for (std::size_t i = 0; i <= specdec::detail::max_profile_entries; ++i) many += " 1";
        CHECK_THAT(error_of(many + "\ndraft_step 1\n"),
                   Catch::Contains("line 2") && Catch::Contains("target_pass has more than 1048576 entries"));
    }
    CHECK_THAT(error_of("specdec-engine-profile 1 extra\n"), Catch::Contains("line 1") && Catch::Contains("expected the header"));
    CHECK_THAT(error_of("specdec-engine-profile\n"), Catch::Contains("line 1") && Catch::Contains("expected the header"));
    // An overlong word is cut in the message.
    const std::string long_word(5000, '7');
    const std::string msg = error_of(head + "target_pass x" + long_word + "\ndraft_step 1\n");
    CHECK_THAT(msg, Catch::Contains("..."));
    CHECK(msg.size() < 300);
    // to_text refuses what validate refuses.
    CHECK_THROWS_WITH(specdec::to_text(specdec::engine_profile{.target_pass = {1.0}, .draft_step = {-1.0}}),
                      Catch::Contains("draft_step[0] = -1"));
    // A finite entry so large that the planner's sums would overflow: refused, read or built.
    CHECK_THAT(error_of(head + "target_pass 1 1e31\ndraft_step 1\n"),
               Catch::Contains("target_pass[1] = 1e+31") && Catch::Contains("at most 1e30"));
    CHECK_THROWS_WITH(specdec::to_text(specdec::engine_profile{.target_pass = {1.0}, .draft_step = {1e300}}),
                      Catch::Contains("draft_step[0] = 1e+300") && Catch::Contains("at most 1e30"));
    CHECK_NOTHROW(specdec::to_text(specdec::engine_profile{.target_pass = {1e30}, .draft_step = {1.0}}));
}

TEST_CASE("A profile's costs: the table, then the slope of its last two entries", "[profile]") {
    const specdec::engine_profile p{.target_pass = {1.0, 1.0, 1.5, 2.0}, .draft_step = {0.2}};
    CHECK(p.pass_cost(1) == 1.0);
    CHECK(p.pass_cost(4) == 2.0);
    CHECK(p.pass_cost(6) == Approx(3.0));      // 2 + 0.5 · 2
    CHECK(p.draft_cost(3) == Approx(0.6));     // one entry: proportional
    const specdec::engine_profile falling{.target_pass = {2.0, 1.0}, .draft_step = {0.1, 0.1}};
    CHECK(falling.pass_cost(10) == 1.0);       // never decreasing beyond the table
    CHECK(falling.draft_cost(50) == Approx(0.1));
}

TEST_CASE("With a profile the policy plans for the batch: the best gamma of a brute-force search at the batch's "
          "total positions",
          "[profile][adaptive]") {
    specdec::adaptive_gamma_options o;
    o.prior_weight = 0.0;
    o.profile = gpu_like();
    specdec::gamma_controller c(8, o);
    CHECK_FALSE(c.measures_time());
    feed(c, 0.8, 4);
    for (const std::size_t batch : {1u, 2u, 4u, 8u, 16u, 32u, 64u}) {
        INFO("batch " << batch);
        // Brute force: tokens per cost for every γ, the pass at batch·(γ+1) positions.
        std::size_t best = 0;
        double best_rate = 0;
        for (std::size_t g = 0; g <= 8; ++g) {
            const double tokens = (1 - std::pow(0.8, static_cast<double>(g + 1))) / 0.2;
            const double cost = static_cast<double>(g) * 0.05 + o.profile->pass_cost(batch * (g + 1));
            if (tokens / cost > best_rate * (1 + 1e-9)) best_rate = tokens / cost, best = g;
        }
        CHECK(c.best_gamma(8, batch) == best);
        CHECK(c.predicted_speedup(best, batch) == Approx(best_rate * o.profile->pass_cost(batch)));
    }
    // Flat to 64 positions: one sequence speculates long, 64 sequences not at all.
    CHECK(c.best_gamma(8, 1) >= 6);
    CHECK(c.best_gamma(8, 64) == 0);
    CHECK(c.best_gamma(8, 16) < c.best_gamma(8, 1));
    // choose() plans for the sequences it is told of.
    CHECK(c.choose(8, 64) == 0);
    CHECK(c.choose(8, 1) == c.best_gamma(8, 1));
}

TEST_CASE("The policy says why it chose what it chose", "[profile][adaptive]") {
    specdec::adaptive_gamma_options o;
    o.prior_weight = 0.0;
    o.profile = gpu_like();
    specdec::gamma_controller c(4, o);
    feed(c, 0.8, 4);
    const std::string one = c.explain(1);
    INFO(one);
    CHECK_THAT(one, Catch::StartsWith("gamma 4 for 1 sequence: predicted ") && Catch::Contains("0.80 0.80 0.80 0.80") &&
                        Catch::Contains("a draft step costs 0.05 plain steps") &&
                        Catch::Contains("costs from the profile"));
    char expect[32];
    std::snprintf(expect, sizeof expect, "predicted %.2fx", c.predicted_speedup(4, 1));
    CHECK_THAT(one, Catch::Contains(expect));
    const std::string many = c.explain(64);
    INFO(many);
    CHECK_THAT(many, Catch::StartsWith("speculation off for 64 sequences: a draft step costs 0.05 plain steps; best "
                                       "predicted 0."));
    // Draft as costly as the target: off for one sequence too.
    specdec::adaptive_gamma_options slow;
    slow.prior_weight = 0.0;
    slow.profile = specdec::engine_profile{.target_pass = {1.0, 1.0, 1.0, 1.0, 1.0}, .draft_step = {1.0}};
    specdec::gamma_controller s(4, slow);
    feed(s, 0.5, 4);
    CHECK_THAT(s.explain(), Catch::StartsWith("speculation off for 1 sequence: a draft step costs 1.00 plain steps"));
}

TEST_CASE("A profile and the cost callbacks together, or a bad profile, are refused by name", "[profile][errors]") {
    specdec::adaptive_gamma_options o;
    o.profile = gpu_like();
    o.draft_cost = [](std::size_t n) { return static_cast<double>(n); };
    o.pass_cost = [](std::size_t) { return 1.0; };
    CHECK_THROWS_WITH(specdec::gamma_controller(4, o), Catch::Contains("a profile or the cost callbacks"));
    specdec::adaptive_gamma_options bad;
    bad.profile = specdec::engine_profile{.target_pass = {1.0, NAN}, .draft_step = {0.1}};
    CHECK_THROWS_WITH(specdec::gamma_controller(4, bad),
                      Catch::Contains("specdec::gamma_controller") && Catch::Contains("target_pass[1] = nan"));
    bad.profile = specdec::engine_profile{.target_pass = {1.0}, .draft_step = {}};
    CHECK_THROWS_WITH(specdec::gamma_controller(4, bad), Catch::Contains("draft_step is empty"));
}

TEST_CASE("Measured costs in a batch: passes are indexed by the batch's total positions", "[adaptive][batch]") {
    specdec::adaptive_gamma_options o;
    o.prior_weight = 0.0;
    specdec::gamma_controller c(2, o);
    const std::vector<float> beta{0.9f, 0.9f};
    // 4 sequences: passes over 4, 8 and 12 positions; a draft step 0.1 s.
    for (int i = 0; i < 6; ++i) {
        c.observe({.gamma = 0, .drafted = 0, .emitted = 1, .pass_seconds = 1.0, .step_seconds = 1.0, .positions = 4});
        c.observe({.gamma = 1, .drafted = 1, .emitted = 2, .acceptance = std::span(beta).first(1), .draft_seconds = 0.1,
                   .pass_seconds = 2.0, .step_seconds = 2.1, .positions = 8});
        c.observe({.gamma = 2, .drafted = 2, .emitted = 3, .acceptance = beta, .draft_seconds = 0.2,
                   .pass_seconds = 3.0, .step_seconds = 3.2, .positions = 12});
    }
    CHECK(c.expected_cost(0, 4) == Approx(1.0));
    CHECK(c.expected_cost(1, 4) == Approx(2.1));
    CHECK(c.expected_cost(2, 4) == Approx(3.2));
    CHECK(c.expected_cost(3, 4) == Approx(4.3));  // 16 positions: extrapolated along the line
    // Linear in the positions: speculation does not pay for 4 sequences.
    CHECK(c.best_gamma(2, 4) == 0);
}

TEST_CASE("With a profile the same seed gives the same tokens, whatever the timings", "[profile][adaptive][batch]") {
    const auto target = markov_model::random(12, 2, 5);
    const auto draft = markov_model::random(12, 2, 6);
    // A verifier whose passes take a random time (0 to 300 us): measured costs would follow it.
    struct jittery_verifier : multi_markov_verifier {
        std::mt19937 jitter{std::random_device{}()};
        void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
            std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 300)(jitter)));
            multi_markov_verifier::score_batch(batch, out);
        }
    };
    specdec::decode_options o{.step = specdec::chain{.gamma = 4},
                              .length = {.policy = specdec::gamma_policy::adaptive},
                              .budget = {.max_new_tokens = 40}};
    o.length.adaptive.profile = gpu_like(6, 0.5, 0.1);  // flat to 6 positions: the batch size matters
    o.length.adaptive.explore_every = 3;
    const auto run = [&](std::uint64_t seed) {
        multi_markov_drafter d{&draft};
        jittery_verifier v{{&target}};
        specdec::batch_decoder dec(d, v, o);
        std::mt19937_64 master(seed);
        std::vector<std::size_t> ids;
        for (token_id t = 0; t < 3; ++t) ids.push_back(dec.add(std::vector<token_id>{t}, std::mt19937_64(master())));
        dec.step();
        ids.push_back(dec.add(std::vector<token_id>{5}, std::mt19937_64(master())));  // joins: 4 sequences
        dec.run();
        std::vector<std::vector<token_id>> out;
        for (const auto id : ids) out.push_back(dec.take(id).tokens);
        std::vector<std::size_t> choices(dec.controller()->choices().begin(), dec.controller()->choices().end());
        return std::pair(out, choices);
    };
    std::size_t identical = 0, several_lengths = 0;
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        const auto a = run(seed), b = run(seed);
        if (a == b) ++identical;
        std::size_t used = 0;
        for (const auto n : a.second)
            if (n != 0) ++used;
        if (used >= 2) ++several_lengths;
    }
    CHECK(identical == 20);
    CHECK(several_lengths == 20);  // the plan really varied (not a fixed gamma in disguise)
}

TEST_CASE("measure_engine_profile times the pair's real calls: a draft token, and passes over 1 to max_positions",
          "[profile]") {
    auto target = markov_model::random(8, 2, 7);
    auto draft = markov_model::random(8, 2, 8);
    // A verifier that takes at least 300 us per position it scores (a pass linear in positions).
    struct slow_verifier {
        markov_model* model;
        std::ptrdiff_t vocab_size() const { return model->vocab; }
        Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> d) {
            std::this_thread::sleep_for(std::chrono::microseconds(300 * (d.size() + 1)));
            Eigen::MatrixXf out(model->vocab, static_cast<Eigen::Index>(d.size() + 1));
            std::vector<token_id> seq(context.begin(), context.end());
            for (std::size_t j = 0; j <= d.size(); ++j) {
                out.col(static_cast<Eigen::Index>(j)) = model->next_logits(seq);
                if (j < d.size()) seq.push_back(d[j]);
            }
            return out;
        }
    } v{&target};
    const std::vector<token_id> prompt{1, 2, 3};
    const auto p = specdec::measure_engine_profile(draft, v, prompt, {.max_positions = 5, .repeats = 3});
    REQUIRE(p.target_pass.size() == 5);
    REQUIRE(p.draft_step.size() == 1);
    CHECK(p.target_pass[0] >= 300e-6);
    CHECK(p.target_pass[4] >= 1500e-6);
    CHECK(p.target_pass[4] > p.target_pass[0]);
    CHECK(p.draft_step[0] > 0.0);
    REQUIRE(p.draft_catch_up.size() == 64);  // catching up on 1 .. 64 tokens (the default)
    for (const double t : p.draft_catch_up) CHECK(t > 0.0);
    CHECK_NOTHROW(specdec::validate(p));
    // The planner takes it as it is.
    specdec::adaptive_gamma_options o;
    o.profile = p;
    CHECK_NOTHROW(specdec::gamma_controller(4, o));

    CHECK_THROWS_WITH(specdec::measure_engine_profile(draft, v, std::vector<token_id>{}),
                      Catch::Contains("specdec::measure_engine_profile") && Catch::Contains("context is empty"));
    CHECK_THROWS_WITH(specdec::measure_engine_profile(draft, v, prompt, {.max_positions = 1}),
                      Catch::Contains("max_positions = 1"));
    CHECK_THROWS_WITH(specdec::measure_engine_profile(draft, v, prompt, {.repeats = 0}), Catch::Contains("repeats = 0"));
    CHECK_THROWS_WITH(specdec::measure_engine_profile(draft, v, std::vector<token_id>{1, 99}),
                      Catch::Contains("specdec::measure_engine_profile") && Catch::Contains("99"));
}

TEST_CASE("measure_batch_profile times a multi-sequence pair's real calls: drafts by sequences, passes by total positions",
          "[profile][multi]") {
    auto target = markov_model::random(8, 2, 7);
    auto draft = markov_model::random(8, 2, 8);
    // A verifier that takes at least 200 us per position of a pass, all sequences together, and
    // records each pass's sequences and positions.
    struct slow_multi_verifier : multi_markov_verifier {
        std::vector<std::size_t> totals{}, sizes{};
        void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
            std::size_t positions = 0;
            for (const auto& r : batch) positions += r.draft.size() + 1;
            std::this_thread::sleep_for(std::chrono::microseconds(200 * positions));
            totals.push_back(positions);
            sizes.push_back(batch.size());
            multi_markov_verifier::score_batch(batch, out);
        }
    } v{{&target}};
    multi_markov_drafter d{&draft};
    const std::vector<std::vector<token_id>> prompts{{1, 2, 3}, {4, 5}};
    const auto p = specdec::measure_batch_profile(d, v, prompts,
                                                  {.max_positions = 20,
                                                   .max_sequences = 3,
                                                   .draft_tokens = 2,
                                                   .repeats = 2,
                                                   .catch_up_tokens = 3});
    REQUIRE(p.target_pass.size() == 20);
    REQUIRE(p.draft_step.size() == 3);
    REQUIRE(p.draft_catch_up.size() == 3);
    CHECK_NOTHROW(specdec::validate(p));
    // The passes, in order (totals; each pass at the grid holds min(total, 3) sequences):
    // - before each draft call (a draft is timed after a pass, as in decoding) of n = 1, 2, 3
    //   sequences of one position each: a first round untimed, then two rounds in which each
    //   timed call follows an untimed call and a pass for the same sequences (the call before
    //   was for others);
    // - at the grid 1, 2, 3, 4, 6, 8, 12, 16, 20: once untimed at each point, then two rounds
    //   timing one pass at each point in turn, after an untimed one where the pass before held
    //   another number of sequences (1, 2 and 3 after 3, 1 and 2);
    // - before each timed catch-up call (n = 1, 2, 3, in two rounds), one sequence's one position.
    const std::vector<std::size_t> grid{1, 2, 3, 4, 6, 8, 12, 16, 20};
    std::vector<std::size_t> expected{1, 2, 3};
    for (std::size_t r = 0; r < 2; ++r)
        for (std::size_t n = 1; n <= 3; ++n) expected.insert(expected.end(), {n, n});
    expected.insert(expected.end(), grid.begin(), grid.end());
    for (std::size_t r = 0; r < 2; ++r) {
        expected.insert(expected.end(), {1, 1, 2, 2, 3, 3});
        expected.insert(expected.end(), grid.begin() + 3, grid.end());
    }
    expected.insert(expected.end(), 3 * 2, 1);
    CHECK(v.totals == expected);
    for (std::size_t k = 0; k < v.totals.size(); ++k) CHECK(v.sizes[k] == std::min<std::size_t>(v.totals[k], 3));
    // Drafts for n = 1, 2, 3 sequences: a first untimed round, then two rounds of an untimed and a
    // timed call each; then each catch-up call's two (back to the context, then the timed one).
    CHECK(d.calls == 3 + 2 * 3 * 2 + 3 * 2 * 2);
    // Timed entries at least the sleep, and between grid points on the line joining them.
    CHECK(p.target_pass[0] >= 200e-6);
    CHECK(p.target_pass[19] >= 20 * 200e-6);
    CHECK(p.target_pass[19] > p.target_pass[0]);
    CHECK(p.target_pass[8] == Approx(p.target_pass[7] + (p.target_pass[11] - p.target_pass[7]) / 4));
    for (const double t : p.draft_step) CHECK(t > 0.0);
    // The planner takes it, and it survives storing and loading.
    specdec::adaptive_gamma_options o;
    o.profile = p;
    CHECK_NOTHROW(specdec::gamma_controller(4, o));
    CHECK(specdec::parse_engine_profile(specdec::to_text(p)).target_pass == p.target_pass);

    CHECK_THROWS_WITH(specdec::measure_batch_profile(d, v, std::vector<std::vector<token_id>>{}),
                      Catch::Contains("specdec::measure_batch_profile") && Catch::Contains("no context"));
    CHECK_THROWS_WITH(specdec::measure_batch_profile(d, v, std::vector<std::vector<token_id>>{{1}, {}}),
                      Catch::Contains("a context is empty"));
    CHECK_THROWS_WITH(specdec::measure_batch_profile(d, v, prompts, {.repeats = 0}), Catch::Contains("repeats = 0"));
    CHECK_THROWS_WITH(specdec::measure_batch_profile(d, v, std::vector<std::vector<token_id>>{{1, 99}}),
                      Catch::Contains("specdec::measure_batch_profile") && Catch::Contains("99"));
    // What an adapter throws reaches the caller as it is.
    v.fail = true;
    CHECK_THROWS_WITH(specdec::measure_batch_profile(d, v, prompts, {.max_positions = 4, .max_sequences = 2}),
                      "multi-sequence pass failed");
}

namespace {

/// Feeds a tree planner `steps` observations of the acceptance a_k by sibling rank.
void feed_siblings(specdec::gamma_controller& c, const std::vector<float>& a, std::size_t steps = 1) {
    for (std::size_t s = 0; s < steps; ++s)
        c.observe({.gamma = 1, .drafted = 1, .emitted = 1, .sibling_acceptance = a});
}

/// The test's own model of a shape (Sequoia's, by sibling rank): E[tokens] and its cost under
/// a profile for b sequences, and the best shape within `full` by brute force.
struct brute_force {
    std::vector<double> a;
    specdec::engine_profile prof;
    std::size_t b = 1;
    bool per_sequence = true;  // tree_plan_limits::drafts_per_sequence
    bool chains_as_chain_steps = false;  // tree_plan_limits::chains_as_chain_steps
    double tokens(const std::vector<std::size_t>& v) const {
        double total = 1, run = 1;
        for (const auto x : v) {
            double fail = 1;
            for (std::size_t k = 0; k < x; ++k) fail *= 1 - (k < a.size() ? a[k] : a.back());
            run *= 1 - fail;
            total += run;
        }
        return total;
    }
    double cost(const std::vector<std::size_t>& v) const {
        std::size_t nodes = 0, level = 1, calls = v.empty() ? 0 : 1;
        for (std::size_t d = 0; d < v.size(); ++d) {
            level *= v[d];
            nodes += level;
            if (d + 1 < v.size()) calls += level;
        }
        const double drafting = per_sequence ? static_cast<double>(b * calls) * prof.draft_cost(1)
                                             : static_cast<double>(calls) * prof.draft_cost(b);
        const bool chain = std::all_of(v.begin(), v.end(), [](std::size_t x) { return x == 1; });
        const std::size_t m = b * (nodes + 1);
        return drafting + (chain && chains_as_chain_steps ? prof.pass_cost(m) : prof.tree_pass_cost(m));
    }
    std::vector<std::size_t> best(const std::vector<std::size_t>& full) const {
        std::vector<std::size_t> v, winner;
        double best_rate = tokens({}) / cost({});
        const auto visit = [&](auto&& self) -> void {
            if (!v.empty() && tokens(v) / cost(v) > best_rate * (1 + 1e-9)) best_rate = tokens(v) / cost(v), winner = v;
            if (v.size() == full.size()) return;
            for (std::size_t x = 1; x <= full[v.size()]; ++x) {
                v.push_back(x);
                self(self);
                v.pop_back();
            }
        };
        visit(visit);
        return winner;
    }
};

}  // namespace

TEST_CASE("The tree planner chooses a tree, a chain or a plain step: the best of a brute-force search over the "
          "shapes within the tree's",
          "[profile][adaptive][tree]") {
    const std::vector<std::size_t> full{3, 2, 2, 1};
    struct scenario {
        const char* name;
        std::vector<float> a;  // acceptance by sibling rank
        specdec::engine_profile prof;
        std::size_t batch;
        const char* expect;    // what explain() starts with
    };
    const std::vector<scenario> scenarios{
        // A flat pass and cheap drafts: later siblings still accepted often, so a wide tree pays.
        {"flat pass, siblings pay", {0.55f, 0.45f, 0.35f}, gpu_like(64, 1.0 / 64, 0.02), 1, "tree "},
        // Later siblings almost never accepted: width buys nothing, a chain wins.
        {"flat pass, siblings do not pay", {0.8f, 0.01f, 0.01f}, gpu_like(64, 1.0 / 64, 0.02), 1, "chain of "},
        // Drafts as costly as the target: a plain step.
        {"costly drafts", {0.6f, 0.3f, 0.2f}, gpu_like(64, 1.0 / 64, 1.0), 1, "speculation off"},
        // A pass linear in positions and a large batch: every extra node costs a full position.
        {"linear pass, batch of 32", {0.55f, 0.45f, 0.35f},
         specdec::engine_profile{.target_pass = {1.0, 2.0}, .draft_step = {0.02}}, 32, "speculation off"},
    };
    for (const auto& sc : scenarios)
    for (const bool per_sequence : {true, false}) {
        INFO(sc.name << (per_sequence ? ", drafts per sequence" : ", drafts batched across sequences"));
        specdec::adaptive_gamma_options o;
        o.prior_weight = 0.0;
        o.profile = sc.prof;
        // (Among the shapes uniform per depth only: the next test adds best_tree's trees.)
        specdec::gamma_controller c(specdec::tree_plan_limits{.branching = full,
                                                              .draft_calls = specdec::tree_draft_calls::per_parent,
                                                              .drafts_per_sequence = per_sequence,
                                                              .best_trees = false},
                                    o);
        REQUIRE(c.plans_trees());
        feed_siblings(c, sc.a, 4);
        const brute_force bf{{sc.a.begin(), sc.a.end()}, sc.prof, sc.batch, per_sequence};
        const auto expect = bf.best(full);
        const std::size_t depth = c.choose(100, sc.batch);
        const auto planned = c.planned_shape();
        CHECK(std::vector<std::size_t>(planned.begin(), planned.end()) == expect);
        CHECK(depth == expect.size());
        const std::string why = c.explain(sc.batch);
        INFO(why);
        CHECK_THAT(why, Catch::StartsWith(sc.expect));
        CHECK_THAT(why, Catch::Contains("costs from the profile"));
        if (!expect.empty()) {
            CHECK(c.expected_tokens(planned) == Approx(bf.tokens(expect)));
            CHECK(c.expected_cost(planned, sc.batch) == Approx(bf.cost(expect)));
        }
    }
    // A drafter that drafts a level per call: a level's width costs no draft time, only positions.
    {
        specdec::adaptive_gamma_options o;
        o.prior_weight = 0.0;
        o.profile = gpu_like(64, 1.0 / 64, 0.02);
        specdec::gamma_controller level(specdec::tree_plan_limits{.branching = full}, o);
        const std::vector<std::size_t> wide{3, 2, 2, 1}, chain{1, 1, 1, 1};
        // 4 calls either way; the pass is flat: the same cost.
        CHECK(level.expected_cost(std::span<const std::size_t>(wide)) ==
              Approx(level.expected_cost(std::span<const std::size_t>(chain))));
        CHECK(level.expected_cost(std::span<const std::size_t>(wide)) == Approx(4 * 0.02 + 1.0));
        // A batch of 8: drafted one sequence at a time (as batch_decoder drafts trees), 8 x 4
        // calls at one sequence's cost; batched across sequences, 4 calls at 8 sequences' cost.
        o.profile->draft_step = {0.02, 0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.055};
        specdec::gamma_controller per_sequence(specdec::tree_plan_limits{.branching = full}, o);
        specdec::gamma_controller batched(
            specdec::tree_plan_limits{.branching = full, .drafts_per_sequence = false}, o);
        const double pass = o.profile->pass_cost(8 * (3 + 6 + 12 + 12 + 1));
        CHECK(per_sequence.expected_cost(std::span<const std::size_t>(wide), 8) == Approx(8 * 4 * 0.02 + pass));
        CHECK(batched.expected_cost(std::span<const std::size_t>(wide), 8) == Approx(4 * 0.055 + pass));
        CHECK(per_sequence.expected_cost(std::span<const std::size_t>(wide), 1) ==
              Approx(batched.expected_cost(std::span<const std::size_t>(wide), 1)));
        // Chains batched (a drafter with draft_batch under batch_decoder's planner): a chain plan
        // costs 4 calls at 8 sequences' cost, a tree plan still 8 x 4 single calls.
        specdec::gamma_controller chains(specdec::tree_plan_limits{.branching = full, .chains_batched = true}, o);
        CHECK(chains.expected_cost(std::span<const std::size_t>(chain), 8) ==
              Approx(4 * 0.055 + o.profile->pass_cost(8 * 5)));
        CHECK(per_sequence.expected_cost(std::span<const std::size_t>(chain), 8) ==
              Approx(8 * 4 * 0.02 + o.profile->pass_cost(8 * 5)));
        CHECK(chains.expected_cost(std::span<const std::size_t>(wide), 8) == Approx(8 * 4 * 0.02 + pass));
    }
    // A node budget: no plan beyond it.
    specdec::adaptive_gamma_options o;
    o.prior_weight = 0.0;
    o.profile = gpu_like(64, 1.0 / 64, 0.001);
    specdec::gamma_controller c(specdec::tree_plan_limits{.branching = full, .max_nodes = 5, .best_trees = false},
                                o);  // a level per call
    feed_siblings(c, {0.6f, 0.5f, 0.4f}, 4);
    (void)c.choose(100, 1);
    std::size_t nodes = 0, level = 1;
    for (const auto x : c.planned_shape()) nodes += level *= x;
    CHECK(nodes <= 5);
    CHECK(nodes >= 4);  // with nearly free drafts and a flat pass it fills the budget
    // Errors name the field.
    CHECK_THROWS_WITH(specdec::gamma_controller(specdec::tree_plan_limits{}), Catch::Contains("branching is empty"));
    CHECK_THROWS_WITH(specdec::gamma_controller(specdec::tree_plan_limits{.branching = {2, 0, 1}}),
                      Catch::Contains("tree_plan_limits.branching[1] = 0"));
}

namespace {

/// The test's own model of any tree: E[tokens] (Sequoia's, by sibling rank) and its cost under
/// a profile for one sequence, a draft call per node with children or per level.
struct any_tree_model {
    std::vector<double> a;
    specdec::engine_profile prof;
    bool per_parent = true;
    double tokens(const std::vector<std::size_t>& children) const {
        std::vector<double> reach{1.0};
        double e = 1.0;
        for (std::size_t i = 0; i < children.size(); ++i) {
            double none = 1.0;
            for (std::size_t r = 0; r < children[i]; ++r) {
                const double ar = r < a.size() ? a[r] : 0.0;
                reach.push_back(reach[i] * none * ar);
                e += reach.back();
                none *= 1.0 - ar;
            }
        }
        return e;
    }
    double cost(const std::vector<std::size_t>& children) const {
        if (children.empty()) return prof.pass_cost(1);
        const auto shape = specdec::tree_shape::from_children(children);
        std::size_t parents = 0;
        for (const std::size_t k : children) parents += k > 0;
        const std::size_t calls = per_parent ? parents : shape.depth();
        return static_cast<double>(calls) * prof.draft_cost(1) + prof.tree_pass_cost(shape.nodes() + 1);
    }
    double rate(const std::vector<std::size_t>& children) const { return tokens(children) / cost(children); }
};

}  // namespace

TEST_CASE("The tree planner with best trees: the best rate of every tree within the shape (brute force), trees "
          "that are not uniform per depth among its plans, named by explain()",
          "[profile][adaptive][tree]") {
    const std::vector<std::size_t> full{3, 2, 1};
    const std::vector<std::vector<float>> acceptances{{0.55f, 0.45f, 0.35f}, {0.8f, 0.3f, 0.1f}, {0.9f, 0.05f, 0.01f}};
    std::size_t best_trees = 0;
    for (const auto& a : acceptances)
        for (const double draft : {0.001, 0.05, 0.3})
            for (const bool per_parent : {false, true}) {
                INFO("a_1 " << a[0] << ", draft call " << draft << (per_parent ? ", per parent" : ", per level"));
                specdec::adaptive_gamma_options o;
                o.prior_weight = 0.0;
                o.profile = gpu_like(64, 1.0 / 64, draft);
                specdec::gamma_controller c(
                    specdec::tree_plan_limits{.branching = full,
                                              .draft_calls = per_parent ? specdec::tree_draft_calls::per_parent
                                                                        : specdec::tree_draft_calls::per_level},
                    o);
                feed_siblings(c, a, 4);
                const any_tree_model m{{a.begin(), a.end()}, *o.profile, per_parent};
                double brute = m.rate({});
                for_each_children_list(full, 15, [&](const std::vector<std::size_t>& children) {
                    brute = std::max(brute, m.rate(children));
                });
                (void)c.choose(100, 1);
                std::vector<std::size_t> planned(c.planned_children().begin(), c.planned_children().end());
                if (planned.empty()) {  // a uniform shape: its children list
                    const auto shape = c.planned_shape();
                    std::size_t level = 1;
                    for (const std::size_t b : shape) {
                        for (std::size_t i = 0; i < level; ++i) planned.push_back(b);
                        level *= b;
                    }
                } else {
                    ++best_trees;
                    const std::string why = c.explain(1);
                    INFO(why);
                    CHECK_THAT(why, Catch::StartsWith("best tree of ") || Catch::StartsWith("chain of "));
                    // The plan stays the one chosen after observe() rebuilds the best trees (review finding).
                    const std::vector<float> other{0.1f, 0.1f};
                    c.observe({.gamma = 1, .drafted = 1, .emitted = 1, .sibling_acceptance = other});
                    CHECK(std::vector<std::size_t>(c.planned_children().begin(), c.planned_children().end()) == planned);
                }
                INFO("planned rate " << m.rate(planned) << ", best of every tree " << brute);
                // A draft call per level: the best of every tree. Per parent the dynamic program
                // does not weigh the nodes with children (the draft calls): within a small margin.
                if (per_parent) CHECK(m.rate(planned) >= 0.97 * brute);
                else CHECK(m.rate(planned) == Approx(brute).epsilon(1e-9));
                // Its own E[tokens] and cost of the plan are the model's.
                const auto shape = specdec::tree_shape::from_children(planned.empty() ? std::vector<std::size_t>{1} : planned);
                if (!planned.empty())
                    CHECK(specdec::expected_tree_tokens(shape, std::vector<double>(a.begin(), a.end())) ==
                          Approx(m.tokens(planned)));
            }
    CHECK(best_trees > 0);
    // Off: only uniform shapes are planned.
    specdec::adaptive_gamma_options o;
    o.prior_weight = 0.0;
    o.profile = gpu_like(64, 1.0 / 64, 0.001);
    specdec::gamma_controller uniform(specdec::tree_plan_limits{.branching = full, .best_trees = false}, o);
    feed_siblings(uniform, {0.55f, 0.45f, 0.35f}, 4);
    (void)uniform.choose(100, 1);
    CHECK(uniform.planned_children().empty());
}

TEST_CASE("An acceptance prior: the first step is planned from it, as from as many observations, and a bad prior is "
          "refused by name",
          "[profile][adaptive][tree]") {
    const std::vector<float> a{0.8f, 0.4f, 0.2f};
    specdec::adaptive_gamma_options told;
    told.profile = gpu_like(64, 1.0 / 64, 0.02);
    told.acceptance_prior = {0.8, 0.4, 0.2};
    specdec::adaptive_gamma_options fed = told;
    fed.acceptance_prior.clear();
    fed.prior_weight = 0.0;
    const std::vector<std::size_t> full{4, 2, 2, 1, 1};
    specdec::gamma_controller t(specdec::tree_plan_limits{.branching = full}, told), f(specdec::tree_plan_limits{.branching = full}, fed);
    feed_siblings(f, a, 1);
    const std::size_t dt = t.choose(100, 1), df = f.choose(100, 1);
    CHECK(dt == df);
    CHECK(std::vector<std::size_t>(t.planned_shape().begin(), t.planned_shape().end()) ==
          std::vector<std::size_t>(f.planned_shape().begin(), f.planned_shape().end()));
    CHECK(std::vector<std::size_t>(t.planned_children().begin(), t.planned_children().end()) ==
          std::vector<std::size_t>(f.planned_children().begin(), f.planned_children().end()));
    CHECK(dt > 1);  // not the warm-up's one level of two
    // A chain controller: α_i by position; the last entry for deeper positions.
    specdec::adaptive_gamma_options chain_told;
    chain_told.profile = gpu_like(64, 1.0 / 64, 0.02);
    chain_told.acceptance_prior = {0.9};
    specdec::gamma_controller chain(8, chain_told);
    CHECK(chain.choose(100, 1) == chain.best_gamma(8, 1));
    CHECK(chain.best_gamma(8, 1) >= 6);  // α = 0.9 at every position, drafts nearly free
    // Each entry must be a probability.
    chain_told.acceptance_prior = {0.9, 1.5};
    CHECK_THROWS_WITH(specdec::gamma_controller(8, chain_told),
                      Catch::Contains("specdec::gamma_controller: acceptance_prior[1] = 1.5"));
}

TEST_CASE("The tree planner in a decoder: several shapes and chains in use, the sibling statistics filled, and a "
          "seed reproduces the run",
          "[profile][adaptive][tree][batch]") {
    auto target = markov_model::random(10, 2, 31);
    auto draft = markov_model::random(10, 2, 32);
    specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {3, 2, 1, 1}}},
                              .length = {.policy = specdec::gamma_policy::adaptive},
                              .budget = {.max_new_tokens = 64}};
    o.length.adaptive.profile = gpu_like(64, 1.0 / 64, 0.05);
    o.length.adaptive.explore_every = 2;
    const auto run = [&](std::uint64_t seed) {
        markov_model d = draft, t = target;
        specdec::gamma_controller planner = specdec::make_controller(o, specdec::tree_draft_calls::per_parent);
        auto opts = o;
        opts.length.controller = &planner;
        std::vector<std::vector<std::size_t>> shapes;
        opts.on_step = [&](const specdec::step_event& e) {
            if (e.tree) {
                CHECK(!e.sibling_acceptance.empty());
                CHECK(e.sibling_acceptance.size() <= 3);
            }
        };
        std::mt19937_64 rng(seed);
        const auto r = specdec::speculative_decode(d, t, std::vector<token_id>{1, 2}, opts, rng);
        return std::tuple(r.tokens, r.stats, planner.explain());
    };
    const auto [tokens, stats, why] = run(5);
    CHECK(tokens.size() == 64);
    REQUIRE(stats.reached_at_sibling.size() >= 2);
    CHECK(stats.reached_at_sibling[0] > 0);
    CHECK(stats.estimated_sibling_acceptance(0) > 0.0);
    CHECK(stats.estimated_sibling_acceptance(0) <= 1.0);
    const auto [tokens2, stats2, why2] = run(5);
    CHECK(tokens == tokens2);
    CHECK(why == why2);
    INFO(why);
    CHECK_THAT(why, Catch::Contains("for 1 sequence"));
}

namespace {

/// A TreeVerifier that also scores a chain in one call (score()), counting both kinds of pass.
struct counting_tree_verifier {
    specdec::model_verifier<markov_model> chains;
    tree_markov trees;
    std::size_t tree_passes = 0, chain_passes = 0;
    int tree_pass_sleep_us = 0;  // > 0: a tree pass takes at least this long
    std::ptrdiff_t vocab_size() const { return trees.vocab_size(); }
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        ++chain_passes;
        return chains.score(context, draft);
    }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        ++tree_passes;
        if (tree_pass_sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(tree_pass_sleep_us));
        trees.score_tree(context, tree, out);
    }
};

}  // namespace

TEST_CASE("The tree planner runs the steps it plans as chains as chain steps, and learns a_1 from them",
          "[profile][adaptive][tree][batch]") {
    // (With a verifier that scores a chain in one call; a plain next_logits model with
    // score_tree keeps its one tree pass: tree_test.cpp's planner cases.)
    auto target = markov_model::random(10, 2, 33);
    auto draft = markov_model::random(10, 2, 34);
    for (const bool wide : {false, true}) {
        INFO((wide ? "within 3,2,1,1" : "within 1,1,1,1: every plan a chain or a plain step"));
        specdec::decode_options o{
            .step = specdec::tree{.shape = {.branching = wide ? std::vector<std::size_t>{3, 2, 1, 1}
                                                              : std::vector<std::size_t>{1, 1, 1, 1}}},
            .length = {.policy = specdec::gamma_policy::adaptive},
            .budget = {.max_new_tokens = 96}};
        o.length.adaptive.profile = gpu_like(64, 1.0 / 64, 0.05);
        o.length.adaptive.explore_every = 2;
        specdec::gamma_controller planner = specdec::make_controller(o, specdec::tree_draft_calls::per_parent);
        o.length.controller = &planner;
        counting_tree_verifier verifier{specdec::model_verifier<markov_model>(target), tree_markov{&target}};
        std::size_t tree_steps = 0, chain_steps = 0, plain_steps = 0;
        bool shapes_match = true;
        o.on_step = [&](const specdec::step_event& e) {
            const auto shape = planner.planned_shape();
            const bool chain_plan = std::all_of(shape.begin(), shape.end(), [](std::size_t b) { return b == 1; });
            if (e.tree != nullptr) {
                ++tree_steps;
                shapes_match = shapes_match && !chain_plan;
            } else {
                (e.draft.empty() ? plain_steps : chain_steps) += 1;
                shapes_match = shapes_match && chain_plan;
                if (!e.draft.empty()) CHECK(!e.acceptance.empty());  // β estimated: the planner's a_1
            }
        };
        std::mt19937_64 rng(7);
        const auto r = specdec::speculative_decode(draft, verifier, std::vector<token_id>{1, 2}, o, rng);
        CHECK(r.tokens.size() == 96);
        CHECK(shapes_match);
        CHECK(planner.sibling_acceptance(1) > 0.0);
        CHECK(verifier.chain_passes == chain_steps + plain_steps);
        // Their β at the first position counts as a_1 in the sibling statistics, beside the
        // tree steps' (never in the per-position β, which trees do not fill).
        CHECK(r.stats.expected_accepted_at_position.empty());
        REQUIRE(!r.stats.reached_at_sibling.empty());
        if (!wide) CHECK(r.stats.reached_at_sibling[0] == chain_steps);
        CHECK(r.stats.estimated_sibling_acceptance(0) > 0.0);
        if (wide) {
            CHECK(tree_steps > 0);
            CHECK(verifier.tree_passes == tree_steps);
        } else {
            // No tree machinery at all: every pass is a chain pass.
            CHECK(chain_steps > 0);
            CHECK(tree_steps == 0);
            CHECK(verifier.tree_passes == 0);
        }
    }
}

TEST_CASE("A decoder times its tree passes apart from its chain passes, for the planner's tree plans",
          "[adaptive][tree][batch]") {
    // Costs measured (no profile): tree passes take at least 20 ms, chain passes microseconds.
    // The planner's tree plans must then be costed with the tree passes' times, and its chains
    // (run as chain steps) with the chain passes'.
    auto target = markov_model::random(10, 2, 33);
    auto draft = markov_model::random(10, 2, 34);
    specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {2, 1}}},
                              .length = {.policy = specdec::gamma_policy::adaptive},
                              .budget = {.max_new_tokens = 24}};
    o.length.adaptive.explore_every = 2;
    specdec::gamma_controller planner =
        specdec::make_controller(o, specdec::tree_draft_calls::per_parent, false, true);
    REQUIRE(planner.measures_time());
    o.length.controller = &planner;
    counting_tree_verifier verifier{specdec::model_verifier<markov_model>(target), tree_markov{&target}};
    verifier.tree_pass_sleep_us = 20000;
    std::mt19937_64 rng(7);
    const auto r = specdec::speculative_decode(draft, verifier, std::vector<token_id>{1, 2}, o, rng);
    CHECK(r.tokens.size() == 24);
    REQUIRE(verifier.tree_passes >= 2);  // the warm-up plan is a tree of two children
    REQUIRE(verifier.chain_passes >= 1);
    const std::vector<std::size_t> wide{2}, chain{1, 1};  // both a pass over 3 positions
    INFO("tree {2}: " << planner.expected_cost(wide, 1) << ", chain of 2: " << planner.expected_cost(chain, 1));
    CHECK(planner.expected_cost(wide, 1) >= 0.02);
    CHECK(planner.expected_cost(chain, 1) < planner.expected_cost(wide, 1) / 2);  // (no bound on a chain pass's own time)
}

TEST_CASE("Ragged plans: sequences the draft predicts poorly draft less where positions cost", "[profile][ragged]") {
    // Acceptance by sequence: 0.9 at every position for sequence 0, 0.1 for sequence 1, each
    // seen 40 times; the batch's estimate in between.
    const std::vector<double> good_sum(4, 0.9 * 40), bad_sum(4, 0.1 * 40);
    const std::vector<std::size_t> seen(4, 40);
    const specdec::gamma_controller::sequence_acceptance seqs[] = {
        {.expected = good_sum, .reached = seen, .limit = 4}, {.expected = bad_sum, .reached = seen, .limit = 4}};
    std::vector<std::size_t> gammas(2);

    // A CPU-like engine: a pass costs a fixed part and a quarter of it per position.
    specdec::engine_profile linear;
    for (std::size_t m = 1; m <= 16; ++m) linear.target_pass.push_back(1.0 + 0.25 * static_cast<double>(m));
    linear.draft_step = {0.05, 0.05};
    specdec::gamma_controller cpu(4, {.profile = linear});
    feed(cpu, 0.5, 50);
    cpu.plan_sequences(4, seqs, gammas);
    CHECK(gammas[1] == 1);  // the poorly predicted sequence keeps only the position it is tested at
    CHECK(gammas[0] > gammas[1]);

    // A GPU-like engine: the pass costs the same up to 64 positions; no position is saved.
    specdec::gamma_controller gpu(4, {.profile = gpu_like()});
    feed(gpu, 0.5, 50);
    gpu.plan_sequences(4, seqs, gammas);
    CHECK(gammas[0] == 4);
    CHECK(gammas[1] == 4);

    // Each sequence's limit holds, a plan of 0 is 0 for all, and one sequence keeps the plan.
    const specdec::gamma_controller::sequence_acceptance limited[] = {
        {.expected = good_sum, .reached = seen, .limit = 2}, {.expected = good_sum, .reached = seen, .limit = 0}};
    gpu.plan_sequences(4, limited, gammas);
    CHECK(gammas[0] == 2);
    CHECK(gammas[1] == 0);
    cpu.plan_sequences(0, seqs, gammas);
    CHECK(gammas[0] == 0);
    CHECK(gammas[1] == 0);
    std::vector<std::size_t> one(1);
    cpu.plan_sequences(3, std::span(seqs).first(1), one);
    CHECK(one[0] == 3);
}

namespace {

/// A per-slot drafter: slot 0 drafts from the target, the others from `other`.
struct split_drafter {
    markov_model* target;
    markov_model* other;
    multi_markov_drafter a{target}, b{other};
    std::ptrdiff_t vocab_size() const { return target->vocab; }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& s) {
        for (auto& r : batch) (r.slot == 0 ? a : b).draft_batch(std::span(&r, 1), s);
    }
};

/// A pass of a fixed part (1) and a part per position (`per_position`, up to 16 positions):
/// speculation pays, and each position costs. A draft step costs 0.05.
specdec::engine_profile linear_profile(double per_position) {
    specdec::engine_profile p;
    for (std::size_t m = 1; m <= 16; ++m) p.target_pass.push_back(1.0 + per_position * static_cast<double>(m));
    p.draft_step = {0.05, 0.05};
    return p;
}

/// Chains of up to `gamma` tokens at temperature 1 under the adaptive policy, planned from
/// `profile`, each sequence by its own acceptance when `per_sequence`, each step by its own
/// plan (no drain rule: it has its own tests below).
specdec::decode_options ragged_options(std::size_t gamma, const specdec::engine_profile& profile, bool per_sequence,
                                       std::size_t max_new_tokens) {
    specdec::decode_options o{.step = specdec::chain{.gamma = gamma},
                              .length = {.policy = specdec::gamma_policy::adaptive},
                              .sampling = {.temperature = 1.0f},
                              .budget = {.max_new_tokens = max_new_tokens}};
    o.length.adaptive.profile = profile;
    o.length.adaptive.per_sequence = per_sequence;
    o.length.adaptive.drain = false;
    return o;
}

}  // namespace

TEST_CASE("Ragged plans in a batch: each sequence drafts by its own acceptance, reproducibly", "[profile][ragged][multi]") {
    // Sequence 0's draft is the target itself (every token accepted); sequence 1's draft is
    // another model. With a pass whose every position costs, sequence 1 soon drafts less.
    auto target = markov_model::random(16, 2, 41);
    auto other = markov_model::random(16, 2, 42);
    multi_markov_verifier v{&target};
    const specdec::engine_profile linear = linear_profile(0.25);
    auto run = [&](bool ragged) {
        split_drafter d{&target, &other};
        const specdec::decode_options o = ragged_options(4, linear, ragged, 200);
        specdec::batch_decoder<split_drafter, multi_markov_verifier, std::mt19937_64> dec(d, v, o);
        const auto a = dec.add(std::vector<token_id>{1, 2}, std::mt19937_64(1));
        const auto b = dec.add(std::vector<token_id>{3, 4}, std::mt19937_64(2));
        dec.run();
        return std::pair{dec.take(a), dec.take(b)};
    };
    const auto [good, bad] = run(true);
    // Mean γ asked per step.
    const auto mean_gamma = [](const specdec::decode_stats& s) {
        double sum = 0;
        for (std::size_t g = 0; g < s.steps_at_gamma.size(); ++g) sum += static_cast<double>(g * s.steps_at_gamma[g]);
        return sum / static_cast<double>(s.steps);
    };
    INFO("mean gamma: good " << mean_gamma(good.stats) << ", bad " << mean_gamma(bad.stats));
    CHECK(mean_gamma(bad.stats) < mean_gamma(good.stats));
    const auto [good_again, bad_again] = run(true);  // from counts and a fixed profile: reproducible
    CHECK(good_again.tokens == good.tokens);
    CHECK(bad_again.tokens == bad.tokens);
    const auto [good_even, bad_even] = run(false);  // not ragged: the poorly drafted one asks for more
    INFO("not ragged: good " << mean_gamma(good_even.stats) << ", bad " << mean_gamma(bad_even.stats));
    CHECK(mean_gamma(bad_even.stats) > mean_gamma(bad.stats));
}

TEST_CASE("Ragged plans: the last sequence left of a batch plans from its own acceptance", "[profile][ragged][multi]") {
    // Sequence 0 is drafted by the target itself and finishes after 60 tokens; sequence 1, drafted
    // by another model, goes on alone to 300. The controller's estimates are the batch's, mostly
    // sequence 0's: alone, sequence 1 must still draft by its own (poor) acceptance.
    auto target = markov_model::random(16, 2, 41);
    auto other = markov_model::random(16, 2, 42);
    multi_markov_verifier v{&target};
    specdec::engine_profile linear;  // each position costs a tenth of a pass's fixed part
    for (std::size_t m = 1; m <= 16; ++m) linear.target_pass.push_back(1.0 + 0.1 * static_cast<double>(m));
    linear.draft_step = {0.02, 0.02};
    const auto lone_mean_gamma = [&](bool ragged) {
        split_drafter d{&target, &other};
        specdec::decode_options o{.step = specdec::chain{.gamma = 6},
                                  .length = {.policy = specdec::gamma_policy::adaptive},
                                  .sampling = {.temperature = 1.0f}};
        o.length.adaptive.profile = linear;
        o.length.adaptive.explore_every = 0;
        o.length.adaptive.window = 100000;  // running means: the batch's estimates keep sequence 0's steps
        o.length.adaptive.per_sequence = ragged;
        o.length.adaptive.drain = false;  // each step's own plan (the drain rule has its own tests)
        std::size_t steps = 0, asked = 0;
        bool alone = false;
        o.on_step = [&](const specdec::step_event& e) {
            if (alone && e.sequence == 1) ++steps, asked += e.gamma;
        };
        specdec::batch_decoder<split_drafter, multi_markov_verifier, std::mt19937_64> dec(d, v, o);
        (void)dec.add(std::vector<token_id>{1, 2}, std::mt19937_64(1), {.max_new_tokens = 60});
        (void)dec.add(std::vector<token_id>{3, 4}, std::mt19937_64(2), {.max_new_tokens = 300});
        while (dec.step() != 0) alone = dec.active() == 1;
        REQUIRE(steps > 20);
        return static_cast<double>(asked) / static_cast<double>(steps);
    };
    const double ragged = lone_mean_gamma(true), uniform = lone_mean_gamma(false);
    INFO("sequence 1 alone, mean gamma asked: ragged plans " << ragged << ", one gamma " << uniform);
    CHECK(ragged < uniform - 0.5);
}

TEST_CASE("Ragged plans: positions only a longer-drafting sequence tested reach the estimates", "[profile][ragged][multi]") {
    // A ragged plan may give a sequence more than the batch's γ (choose()'s). The acceptance it
    // measures there must reach the controller: sequence 0 is drafted by the target itself
    // (β = 1 at every position), sequence 1 by another model. In a step where sequence 0 drafts
    // L tokens, more than the batch's γ and than sequence 1, the estimate at L moves towards 1.
    auto target = markov_model::random(16, 2, 41);
    auto other = markov_model::random(16, 2, 42);
    multi_markov_verifier v{&target};
    const specdec::engine_profile linear = linear_profile(0.6);
    std::size_t cases = 0;
    const auto run = [&](std::uint64_t seed) {
        split_drafter d{&target, &other};
        specdec::decode_options o = ragged_options(6, linear, true, 400);
        o.length.adaptive.window = 8;  // each observation moves the estimate visibly
        std::size_t drafted[2] = {0, 0};  // this step's draft lengths
        o.on_step = [&](const specdec::step_event& e) { drafted[e.sequence] = e.draft.size(); };
        specdec::batch_decoder<split_drafter, multi_markov_verifier, std::mt19937_64> dec(d, v, o);
        (void)dec.add(std::vector<token_id>{1, 2}, std::mt19937_64(seed));
        (void)dec.add(std::vector<token_id>{3, 4}, std::mt19937_64(seed + 1));
        const specdec::gamma_controller& c = *dec.controller();
        std::vector<std::size_t> before(c.choices().begin(), c.choices().end());
        std::vector<double> estimate(7);
        while (dec.active() == 2) {
            for (std::size_t l = 1; l <= 6; ++l) estimate[l] = c.acceptance(l);
            drafted[0] = drafted[1] = 0;
            if (dec.step() == 0) break;
            std::size_t batch_gamma = 0;  // choose()'s γ for this step: the count that grew
            for (std::size_t g = 0; g < c.choices().size(); ++g)
                if (g >= before.size() || c.choices()[g] != before[g]) batch_gamma = g;
            before.assign(c.choices().begin(), c.choices().end());
            const std::size_t l = drafted[0];
            if (l > std::max(batch_gamma, drafted[1]) && estimate[l] < 0.999) {
                ++cases;
                INFO("seed " << seed << ": sequence 0 drafted " << l << " (the batch's gamma " << batch_gamma
                             << ", sequence 1 drafted " << drafted[1] << "): acceptance at " << l << " "
                             << estimate[l] << " -> " << c.acceptance(l));
                // Observed, the estimate moves towards sequence 0's 1; unobserved, it would stay
                // where it was or, never observed, fall back to the one before it (which holds
                // sequence 1's acceptance).
                CHECK(c.acceptance(l) > estimate[l]);
                CHECK(c.acceptance(l) > c.acceptance(l - 1));
            }
        }
    };
    for (std::uint64_t seed = 1; seed <= 8; seed += 2) run(seed);
    INFO(cases << " steps where sequence 0 alone drafted past the batch's gamma");
    REQUIRE(cases >= 3);
}

namespace {

/// A CPU-like engine (planner_bench's): a pass over m positions costs 0.5 + 0.05 m, a draft call
/// 0.05 at any batch.
specdec::engine_profile cpu_like() {
    specdec::engine_profile p;
    for (std::size_t m = 1; m <= 64; ++m) p.target_pass.push_back(0.5 + 0.05 * static_cast<double>(m));
    p.draft_step = {0.05, 0.05};
    return p;
}

/// A multi_markov_verifier that adds what each pass would cost on `profile` (its pass over the
/// batch's positions and a draft call per position of the longest draft) to `time`.
struct costed_verifier {
    multi_markov_verifier inner;
    const specdec::engine_profile* profile;
    double time = 0.0;
    std::ptrdiff_t vocab_size() const { return inner.vocab_size(); }
    void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
        std::size_t positions = 0, longest = 0;
        for (const auto& r : batch) positions += r.draft.size() + 1, longest = std::max(longest, r.draft.size());
        time += profile->pass_cost(positions) + static_cast<double>(longest) * profile->draft_cost(batch.size());
        inner.score_batch(batch, out);
    }
};

}  // namespace

namespace {
/// Two sequences' own acceptance at four positions, each seen 40 times: one drafted well (α =
/// 0.9 at every position), one poorly (0.1).
struct good_and_bad {
    std::vector<double> good_sum = std::vector<double>(4, 0.9 * 40), bad_sum = std::vector<double>(4, 0.1 * 40);
    std::vector<std::size_t> seen = std::vector<std::size_t>(4, 40);
    /// A sequence drafted well or poorly, with its limit and the tokens it has to go (0: unknown).
    specdec::gamma_controller::sequence_acceptance of(bool good, std::size_t limit = 4, std::size_t remaining = 100) const {
        return {.expected = good ? good_sum : bad_sum, .reached = seen, .limit = limit, .remaining = remaining};
    }
};
}  // namespace

TEST_CASE("A draining batch: plain steps where they finish the batch sooner than speculation", "[profile][ragged][drain]") {
    // Sequence 0 is drafted well (α = 0.9 at every position, seen 40 times), sequence 1 poorly
    // (0.1), 100 tokens to go each, on a CPU-like engine (the figures below take 0.9 and 0.1;
    // shrunk towards the batch's 0.5 they are about 0.83 and 0.17, to the same conclusion). Per step, speculating pays (chain of 4 and of 1:
    // 5.2 expected tokens for 0.5 + 0.05·7 + 4·0.05 = 1.05 units, 4.95 per unit, against 2 for
    // 0.6, 3.33 per unit); but sequence 0 would finish after about 24 such steps and sequence 1
    // would then go on alone for about 67 more at 0.65 each: 69 units in all, against 100 plain
    // steps of both at 0.6, 60 units.
    using acceptance = specdec::gamma_controller::sequence_acceptance;
    const good_and_bad seqs;
    const acceptance mixed[] = {seqs.of(true), seqs.of(false)};
    std::vector<std::size_t> gammas(2);
    specdec::gamma_controller c(4, {.explore_every = 0, .profile = cpu_like()});
    feed(c, 0.5, 50);
    REQUIRE(c.choose(99, 2) > 0);  // per step, speculating pays
    c.plan_sequences(4, mixed, gammas, 0);
    INFO("ragged plan " << gammas[0] << ", " << gammas[1]);
    REQUIRE(gammas[0] > gammas[1]);
    const auto before = c.choices()[0];
    CHECK(c.explain(2).find("draining") == std::string::npos);
    CHECK(c.drain_to_plain(mixed, gammas));
    CHECK(c.drained_steps() == 1);
    CHECK(c.choices()[0] == before + 1);  // recorded as a plain step
    CHECK_FALSE(c.drain_to_plain(mixed, gammas));  // the step is plain now: counted once
    CHECK(c.drained_steps() == 1);
    CHECK(c.choices()[0] == before + 1);
    // explain() says so, with the predicted times to finish (about 60 and 69 units, above).
    INFO(c.explain(2));
    CHECK(c.explain(2).find("1 step made plain for a draining batch (the last: plain steps predicted to finish it in ") !=
          std::string::npos);

    // Both drafted well: they finish together, and speculating is faster to the end too.
    const acceptance both_good[] = {seqs.of(true), seqs.of(true)};
    REQUIRE(c.choose(99, 2) > 0);
    c.plan_sequences(4, both_good, gammas, 0);
    CHECK_FALSE(c.drain_to_plain(both_good, gammas));
    // The poorly drafted sequence almost done: it holds up nothing.
    const acceptance bad_almost_done[] = {seqs.of(true), seqs.of(false, 1, 2)};
    REQUIRE(c.choose(99, 2) > 0);
    c.plan_sequences(4, bad_almost_done, gammas, 0);
    CHECK_FALSE(c.drain_to_plain(bad_almost_done, gammas));
    // A remaining count not known, or a plan of 0: nothing to decide.
    const acceptance unknown[] = {seqs.of(true, 4, 0), seqs.of(false)};
    const std::vector<std::size_t> plan{4, 1}, none{0, 0};
    CHECK_FALSE(c.drain_to_plain(unknown, plan));
    CHECK_FALSE(c.drain_to_plain(mixed, none));
    CHECK(c.drained_steps() == 1);
    // The option off.
    specdec::gamma_controller off(4, {.explore_every = 0, .profile = cpu_like(), .drain = false});
    feed(off, 0.5, 50);
    REQUIRE(off.choose(99, 2) > 0);
    CHECK_FALSE(off.drain_to_plain(mixed, plan));
    CHECK(off.drained_steps() == 0);
}

TEST_CASE("A draining batch of a tree planner: plain steps where they finish the batch sooner than its trees",
          "[profile][tree][drain]") {
    // The tree planner's plan is one tree for every sequence; whether it finishes the batch
    // sooner than plain steps turns on each sequence's own acceptance by sibling rank
    // (decode_stats' reached_at_sibling, expected_accepted_at_sibling). Sequence 0 accepts the
    // first child 9 times in 10, sequence 1 once in 10 (and a second child as rarely), 100
    // tokens to go each, on an engine whose pass costs 0.5 and 0.02 per position (a draft call
    // 0.05), where a tree of two children pays for the batch's acceptance.
    specdec::engine_profile engine{.draft_step = {0.05}};
    for (std::size_t m = 1; m <= 64; ++m) engine.target_pass.push_back(0.5 + 0.02 * static_cast<double>(m));
    const std::vector<double> good_sum{0.9 * 40, 0.5 * 4}, bad_sum{0.1 * 40, 0.1 * 36};
    const std::vector<std::size_t> good_seen{40, 4}, bad_seen{40, 36};
    using acceptance = specdec::gamma_controller::sequence_acceptance;
    const auto sequence = [](const std::vector<double>& sum, const std::vector<std::size_t>& seen, std::size_t left) {
        return acceptance{.limit = 4, .remaining = left, .sibling_expected = sum, .sibling_reached = seen};
    };
    const acceptance mixed[] = {sequence(good_sum, good_seen, 100), sequence(bad_sum, bad_seen, 100)};
    specdec::adaptive_gamma_options o{.explore_every = 0, .profile = engine};
    for (const bool best_trees : {true, false}) {
        INFO((best_trees ? "best trees" : "shapes uniform per depth"));
        specdec::gamma_controller c(specdec::tree_plan_limits{.branching = {2, 1, 1, 1}, .best_trees = best_trees}, o);
        feed_siblings(c, {0.6f, 0.3f}, 50);
        REQUIRE(c.choose(99, 2) > 0);  // per step, the batch's acceptance pays for a tree
        INFO(c.explain(2));
        REQUIRE(c.planned_shape().front() == 2);
        // Each sequence's expected tokens of the plan, by hand: the batch's a_1, a_2 as the
        // choice uses them (from its own E[tokens] of a chain of 1 and of two children), each
        // sequence's own shrunk towards them with per_sequence_prior pseudo-observations.
        const double w = specdec::gamma_controller::per_sequence_prior;
        const double a1 = c.expected_tokens(std::vector<std::size_t>{1}) - 1.0;
        const double a2 = 1.0 - (2.0 - c.expected_tokens(std::vector<std::size_t>{2})) / (1.0 - a1);
        const auto tokens = [&](const std::vector<double>& sum, const std::vector<std::size_t>& seen, std::size_t depth) {
            const double s1 = (sum[0] + w * a1) / (static_cast<double>(seen[0]) + w);
            const double s2 = (sum[1] + w * a2) / (static_cast<double>(seen[1]) + w);
            const double w1 = s1, w2 = (1.0 - s1) * s2;  // the rank weights
            if (best_trees) {  // children 2,1: two children of the root, one under the first
                REQUIRE(std::vector<std::size_t>(c.planned_children().begin(), c.planned_children().end()) ==
                        std::vector<std::size_t>{2, 1});
                return 1.0 + w1 + w2 + (depth > 1 ? w1 * w1 : 0.0);
            }
            REQUIRE(std::vector<std::size_t>(c.planned_shape().begin(), c.planned_shape().end()) ==
                    std::vector<std::size_t>{2, 1});
            const double p2 = w1 + w2;  // one of two children accepted
            return 1.0 + p2 + (depth > 1 ? p2 * s1 : 0.0);
        };
        const double good = tokens(good_sum, good_seen, 4), bad = tokens(bad_sum, bad_seen, 4);
        CHECK(c.planned_tree_tokens(mixed[0]) == Approx(good).epsilon(1e-12));
        CHECK(c.planned_tree_tokens(mixed[1]) == Approx(bad).epsilon(1e-12));
        // A step cuts the tree at the tokens the sequence still needs.
        acceptance one_deep = mixed[0];
        one_deep.limit = 1;
        CHECK(c.planned_tree_tokens(one_deep) == Approx(tokens(good_sum, good_seen, 1)).epsilon(1e-12));
        one_deep.limit = 0;  // one token left: the step drafts nothing for it
        CHECK(c.planned_tree_tokens(one_deep) == 1.0);
        // No observation of its own: the batch's estimate, as the choice has it.
        CHECK(c.planned_tree_tokens({.limit = 4}) ==
              Approx(best_trees ? 1.0 + a1 + (1.0 - a1) * a2 + a1 * a1
                                : c.expected_tokens(std::vector<std::size_t>{2, 1}))
                  .epsilon(1e-12));
        const auto before = c.choices()[0];
        CHECK(c.drain_to_plain(mixed, {}));
        CHECK(c.drained_steps() == 1);
        // The predicted times, by hand: plain steps of both, 100 at a pass over 2 positions;
        // the plan, both until the good one is done (100 / E_good steps), then the poor one
        // alone (100 / E_bad − 100 / E_good steps at one sequence's cost of the tree).
        const auto plan_cost = [&](std::size_t b) {
            return best_trees ? c.tree_cost(3, 2, 2, false, b) : c.expected_cost(std::vector<std::size_t>{2, 1}, b);
        };
        REQUIRE(good > bad);
        CHECK(c.drain_prediction().plain == Approx(100.0 * engine.pass_cost(2)).epsilon(1e-12));
        CHECK(c.drain_prediction().plan ==
              Approx(100.0 / good * plan_cost(2) + (100.0 / bad - 100.0 / good) * plan_cost(1)).epsilon(1e-12));
        CHECK(c.choices()[0] == before + 1);
        CHECK(c.explain(2).find("1 step made plain for a draining batch, 1 of them with a tree plan") !=
              std::string::npos);
        CHECK(c.drained_tree_steps() == 1);
        // Both drafted well: speculating is faster to the end too.
        const acceptance both_good[] = {sequence(good_sum, good_seen, 100), sequence(good_sum, good_seen, 100)};
        REQUIRE(c.choose(99, 2) > 0);
        CHECK_FALSE(c.drain_to_plain(both_good, {}));
        // The poorly drafted sequence almost done: it holds up nothing.
        acceptance bad_almost_done[] = {sequence(good_sum, good_seen, 100), sequence(bad_sum, bad_seen, 2)};
        bad_almost_done[1].limit = 1;  // as batch_decoder passes it: the tokens left minus one
        REQUIRE(c.choose(99, 2) > 0);
        CHECK_FALSE(c.drain_to_plain(bad_almost_done, {}));
        // Its tree is cut at depth 1 (the root's two children), in tokens and in cost: while
        // both run, a step drafts the good one's two levels and the cut tree's one (a draft call
        // per level, one sequence at a time, at 0.05 each) and scores both trees in one pass;
        // then the good one runs alone, at the whole tree's cost.
        const std::size_t full_nodes = best_trees ? 3 : 4;
        REQUIRE(plan_cost(1) == Approx(2 * 0.05 + engine.pass_cost(full_nodes + 1)));
        const double bad1 = tokens(bad_sum, bad_seen, 1);
        const double both = 3 * 0.05 + engine.pass_cost(full_nodes + 1 + 3);
        REQUIRE(2.0 / bad1 < 100.0 / good);
        CHECK(c.drain_prediction().plan ==
              Approx(2.0 / bad1 * both + (100.0 / good - 2.0 / bad1) * plan_cost(1)).epsilon(1e-12));
        CHECK(c.drain_prediction().plain ==
              Approx(2.0 * engine.pass_cost(2) + 98.0 * engine.pass_cost(1)).epsilon(1e-12));
        // The sequences' own acceptance is what decides: without it (the batch's for both,
        // equal budgets) they would finish together, and per step the tree pays.
        const acceptance no_own[] = {{.limit = 4, .remaining = 100}, {.limit = 4, .remaining = 100}};
        CHECK_FALSE(c.drain_to_plain(no_own, {}));
        CHECK(c.drained_steps() == 1);
        // A plain plan, or the option off: nothing to decide.
        specdec::gamma_controller off(specdec::tree_plan_limits{.branching = {2, 1, 1, 1}, .best_trees = best_trees},
                                      {.explore_every = 0, .profile = engine, .drain = false});
        feed_siblings(off, {0.6f, 0.3f}, 50);
        REQUIRE(off.choose(99, 2) > 0);
        CHECK_FALSE(off.drain_to_plain(mixed, {}));
        REQUIRE(c.choose(0, 2) == 0);
        CHECK_FALSE(c.drain_to_plain(mixed, {}));
        CHECK(std::isnan(c.drain_prediction().plan));  // nothing compared
        CHECK(std::isnan(c.drain_prediction().plain));
    }
}

namespace {

/// A per-slot drafter: even slots draft from `good`, odd ones from `poor`. When `time` is set,
/// adds a draft model's catch-up to it as the profile prices it (a draft step per token it has
/// not read, for the call's longest lag): the tokens a sequence gained since its last draft
/// call beyond what that call proposed and the bonus token, i.e. its plain steps' tokens.
struct parity_drafter {
    markov_model* good;
    markov_model* poor;
    multi_markov_drafter a{good}, b{poor};
    double* time = nullptr;
    const specdec::engine_profile* profile = nullptr;
    std::map<std::size_t, std::size_t> seen{};  // slot: the context length its last call left read
    std::ptrdiff_t vocab_size() const { return good->vocab; }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& s) {
        std::size_t lag = 0;
        for (auto& r : batch) {
            if (const auto it = seen.find(r.slot); it != seen.end() && r.context.size() > it->second)
                lag = std::max(lag, r.context.size() - it->second);
            (r.slot % 2 == 0 ? a : b).draft_batch(std::span(&r, 1), s);
            seen[r.slot] = r.context.size() + r.out->tokens.size() + 1;
        }
        if (time != nullptr) *time += profile->catch_up_cost(lag, batch.size());
    }
};

}  // namespace

TEST_CASE("A draining batch finishes sooner on a CPU-like engine, reproducibly", "[profile][ragged][drain][multi]") {
    // Eight sequences, 128 tokens each: four drafted by the target's table plus a little noise,
    // four by the table plus much noise (planner_bench's ragged batch, on its CPU-like engine). The verifier
    // adds up what each step costs on the engine. Per step, speculating pays while the batch is
    // full; held to the end it leaves the poorly drafted pair to finish alone.
    auto target = markov_model::random(16, 2, 41);
    auto near = target;
    std::mt19937_64 g(5);
    std::normal_distribution<float> noise(0.0f, 0.5f);
    std::normal_distribution<float> much(0.0f, 3.0f);
    auto other = target;
    for (auto& x : near.table) x += noise(g);
    for (auto& x : other.table) x += much(g);
    const specdec::engine_profile cpu = cpu_like();
    const auto run = [&](bool drain, bool ragged, std::uint64_t seed) {
        costed_verifier v{{&target}, &cpu};
        parity_drafter d{&near, &other, {&near}, {&other}, &v.time, &cpu};
        specdec::decode_options o{.step = specdec::chain{.gamma = 4},
                                  .length = {.policy = specdec::gamma_policy::adaptive},
                                  .sampling = {.temperature = 1.0f},
                                  .budget = {.max_new_tokens = 128}};
        o.length.adaptive.profile = cpu;
        o.length.adaptive.drain = drain;
        o.length.adaptive.per_sequence = ragged;
        specdec::gamma_controller controller = specdec::make_controller(o);
        o.length.controller = &controller;
        specdec::batch_decoder<parity_drafter, costed_verifier, std::mt19937_64> dec(d, v, o);
        std::vector<std::size_t> ids;
        for (token_id t = 0; t < 8; ++t) ids.push_back(dec.add(std::vector<token_id>{t, 1}, std::mt19937_64(seed + static_cast<std::uint64_t>(t))));
        dec.run();
        struct out {
            double time;
            std::size_t drained;
            std::vector<std::vector<token_id>> tokens;
        };
        out r{v.time, controller.drained_steps(), {}};
        for (const auto id : ids) r.tokens.push_back(dec.take(id).tokens);
        return r;
    };
    for (const bool ragged : {true, false}) {
        double drained_time = 0.0, per_step_time = 0.0;
        std::size_t drained_steps = 0;
        for (std::uint64_t seed = 1; seed <= 40; seed += 4) {
            const auto drained = run(true, ragged, seed), per_step = run(false, ragged, seed);
            drained_time += drained.time;
            per_step_time += per_step.time;
            drained_steps += drained.drained;
            CHECK(per_step.drained == 0);
            if (seed == 1) CHECK(run(true, ragged, seed).tokens == drained.tokens);  // counts, budgets, a fixed profile
        }
        INFO((ragged ? "ragged plans" : "one gamma") << ": time draining " << drained_time << " (" << drained_steps
                                                     << " steps made plain), per step " << per_step_time
                                                     << ", plain steps " << 10 * 128 * cpu.pass_cost(8));
        CHECK(drained_steps > 0);
        CHECK(drained_time < per_step_time);
    }
}

TEST_CASE("The tree planner takes a sibling rank never tested as half the rank before it", "[adaptive][tree]") {
    specdec::adaptive_gamma_options o;
    o.prior_weight = 0.0;  // seen ranks exactly as observed
    o.profile = gpu_like();
    specdec::gamma_controller c(specdec::tree_plan_limits{.branching = {3, 1}}, o);
    feed_siblings(c, {0.8f}, 4);  // only the first child was ever tested
    const std::vector<std::size_t> two{2}, three{3};
    // P(2) = 1 - (1 - 0.8)(1 - 0.4); P(3) = 1 - (1 - 0.8)(1 - 0.4)(1 - 0.2).
    CHECK(c.expected_tokens(two) == Approx(1.0 + (1.0 - 0.2 * 0.6)));
    CHECK(c.expected_tokens(three) == Approx(1.0 + (1.0 - 0.2 * 0.6 * 0.8)));
    // Once rank 2 is seen, its own estimate (0.3) counts, and rank 3 is half of it.
    feed_siblings(c, {0.8f, 0.3f}, 4);
    CHECK(c.expected_tokens(three) == Approx(1.0 + (1.0 - 0.2 * 0.7 * 0.85)));
}

TEST_CASE("measure_engine_profile times a draft model's catch-up on tokens it has not read", "[profile]") {
    auto target = markov_model::random(8, 2, 7);
    auto draft = markov_model::random(8, 2, 8);
    // A draft model with a cache: a call reads the tokens beyond the longest common prefix of
    // its context and the previous call's, 400 us each (one forward over them).
    struct cached_draft {
        markov_model* model;
        std::vector<token_id> seen;
        std::vector<std::size_t> read;  // tokens read per call
        std::ptrdiff_t vocab_size() const { return model->vocab; }
        Eigen::VectorXf next_logits(std::span<const token_id> context) {
            std::size_t common = 0;
            while (common < seen.size() && common < context.size() && seen[common] == context[common]) ++common;
            const std::size_t fresh = context.size() - common;
            read.push_back(fresh);
            std::this_thread::sleep_for(std::chrono::microseconds(400 * fresh));
            seen.assign(context.begin(), context.end());
            return model->next_logits(context);
        }
    } d{&draft, {}, {}};
    const std::vector<token_id> prompt{1, 2, 3};
    const auto p =
        specdec::measure_engine_profile(d, target, prompt, {.max_positions = 5, .repeats = 3, .catch_up_tokens = 4});
    REQUIRE(p.draft_catch_up.size() == 4);
    for (std::size_t n = 1; n <= 4; ++n) CHECK(p.draft_catch_up[n - 1] >= 400e-6 * static_cast<double>(n));
    CHECK(p.draft_catch_up[3] > p.draft_catch_up[0]);
    // Each timed catch-up call read exactly its n tokens: the calls after the draft steps read,
    // in pairs per repetition, 0 (back to the prompt, cached) then n.
    const std::size_t steps = d.read.size() - 4 * 3 * 2;  // (in rounds over n = 1 .. 4)
    for (std::size_t n = 1; n <= 4; ++n)
        for (std::size_t r = 0; r < 3; ++r) {
            const std::size_t at = steps + 2 * (4 * r + (n - 1));
            CHECK(d.read[at] == 0);
            CHECK(d.read[at + 1] == n);
        }

    // Beyond the draft's tokens (repeated), at the grid 1, 2, 3, 4, 6, 8, 12, linear between.
    d.read.clear();
    const auto q =
        specdec::measure_engine_profile(d, target, prompt, {.max_positions = 3, .repeats = 3, .catch_up_tokens = 12});
    REQUIRE(q.draft_catch_up.size() == 12);
    const std::vector<std::size_t> grid{1, 2, 3, 4, 6, 8, 12};
    const std::size_t first = d.read.size() - grid.size() * 3 * 2;
    for (std::size_t r = 0; r < 3; ++r)
        for (std::size_t g = 0; g < grid.size(); ++g) {
            CHECK(d.read[first + 2 * (grid.size() * r + g)] == 0);
            CHECK(d.read[first + 2 * (grid.size() * r + g) + 1] == grid[g]);
        }
    CHECK(q.draft_catch_up[11] >= 400e-6 * 12);
    CHECK(q.draft_catch_up[4] == Approx((q.draft_catch_up[3] + q.draft_catch_up[5]) / 2));
    CHECK(q.draft_catch_up[9] == Approx(q.draft_catch_up[7] + (q.draft_catch_up[11] - q.draft_catch_up[7]) / 2));
    CHECK_THROWS_WITH(specdec::measure_engine_profile(d, target, prompt, {.catch_up_tokens = (std::size_t{1} << 20) + 1}),
                      Catch::Contains("catch_up_tokens = 1048577"));
}

TEST_CASE("measure_batch_profile times a draft model's catch-up on tokens it has not read, through draft_batch",
          "[profile][multi]") {
    auto target = markov_model::random(8, 2, 7);
    auto draft = markov_model::random(8, 2, 8);
    // A multi-sequence draft model with a cache per slot: a call reads, for each request, the
    // tokens beyond the longest common prefix of its context and that slot's previous context,
    // 400 us each (one forward over them), and it proposes nothing once a context is longer
    // than `window` tokens (a context window reached).
    struct cached_multi_draft : multi_markov_drafter {
        std::map<std::size_t, std::vector<token_id>> seen{};
        std::vector<std::size_t> read{};  // tokens read per request, in call order
        std::size_t window = 1000;
        void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& sampling) {
            std::size_t fresh_total = 0;
            for (const auto& r : batch) {
                auto& cached = seen[r.slot];
                std::size_t common = 0;
                while (common < cached.size() && common < r.context.size() && cached[common] == r.context[common])
                    ++common;
                read.push_back(r.context.size() - common);
                fresh_total += r.context.size() - common;
                cached.assign(r.context.begin(), r.context.end());
            }
            std::this_thread::sleep_for(std::chrono::microseconds(400 * fresh_total));
            multi_markov_drafter::draft_batch(batch, sampling);
            for (auto& r : batch)
                if (r.context.size() > window) r.out->clear();
        }
    } d{{&draft}};
    multi_markov_verifier v{&target};
    const std::vector<std::vector<token_id>> prompts{{1, 2, 3}, {4, 5}};
    const specdec::batch_profile_measurement m{
        .max_positions = 4, .max_sequences = 2, .draft_tokens = 2, .repeats = 3, .catch_up_tokens = 5};
    const auto p = specdec::measure_batch_profile(d, v, prompts, m);
    REQUIRE(p.draft_catch_up.size() == 5);
    for (std::size_t n = 1; n <= 5; ++n) CHECK(p.draft_catch_up[n - 1] >= 400e-6 * static_cast<double>(n));
    // (No upper bound or order between entries: under the sanitizers a one-token entry has
    // measured above the four-token one. What each entry timed is checked by its reads.)
    // Each timed catch-up call read exactly its n tokens, for sequence 0 alone: the last calls
    // read, in pairs per repetition, 0 (back to the prompt, cached) then n.
    const std::size_t before = d.read.size() - 5 * 3 * 2;  // (in rounds over n = 1 .. 5)
    for (std::size_t n = 1; n <= 5; ++n)
        for (std::size_t r = 0; r < 3; ++r) {
            const std::size_t at = before + 2 * (5 * r + (n - 1));
            CHECK(d.read[at] == 0);
            CHECK(d.read[at + 1] == n);
        }
    // The planner charges it: catching up on 3 tokens of 2 sequences costs twice one's (never
    // below 0: a slow timing of the one-token entry can put it above the four-token one).
    CHECK(p.catch_up_cost(3, 2) == Approx(2 * std::max(0.0, p.draft_catch_up[3] - p.draft_catch_up[0])));

    // A drafter that proposes nothing beyond a context of 5 tokens: the table ends before the
    // first n that drafted nothing (the prompt {1, 2, 3} plus 3 tokens is 6).
    cached_multi_draft windowed{{&draft}};
    windowed.window = 5;
    CHECK(specdec::measure_batch_profile(windowed, v, prompts, m).draft_catch_up.size() == 2);
    // catch_up_tokens = 0: no table, and a draft step per missed token.
    cached_multi_draft plain{{&draft}};
    auto none = m;
    none.catch_up_tokens = 0;
    const auto q = specdec::measure_batch_profile(plain, v, prompts, none);
    CHECK(q.draft_catch_up.empty());
    CHECK(q.catch_up_cost(3, 2) == Approx(3 * q.draft_cost(2)));
}

TEST_CASE("measure_batch_profile times no call that follows a change of sequences, and stops a catch-up table "
          "at a later round's failure",
          "[profile][multi]") {
    auto target = markov_model::random(8, 2, 7);
    auto draft = markov_model::random(8, 2, 8);
    // Adapters that pay 30 ms whenever a call's sequences differ from the call before (an
    // engine that releases a sequence a call leaves out and reads its context again when it
    // returns), and 200 us per position (a pass) or per call (a draft) otherwise.
    struct prefilling_verifier : multi_markov_verifier {
        std::size_t held = 0;
        void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
            std::size_t positions = 0;
            for (const auto& r : batch) positions += r.draft.size() + 1;
            std::this_thread::sleep_for(std::chrono::microseconds(200 * positions + (batch.size() != held ? 30000 : 0)));
            held = batch.size();
            multi_markov_verifier::score_batch(batch, out);
        }
    } v{{&target}};
    struct prefilling_drafter : multi_markov_drafter {
        std::size_t held = 0;
        std::size_t window = 1000, window_from_call = 0;  // no tokens beyond `window` from that call on
        void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& sampling) {
            std::this_thread::sleep_for(std::chrono::microseconds(200 + (batch.size() != held ? 30000 : 0)));
            held = batch.size();
            multi_markov_drafter::draft_batch(batch, sampling);
            if (calls > window_from_call)
                for (auto& r : batch)
                    if (r.context.size() > window) r.out->clear();
        }
    } d{{&draft}};
    const std::vector<std::vector<token_id>> prompts{{1, 2, 3}, {4, 5}};
    const specdec::batch_profile_measurement m{
        .max_positions = 8, .max_sequences = 3, .draft_tokens = 2, .repeats = 3, .catch_up_tokens = 3};
    const auto p = specdec::measure_batch_profile(d, v, prompts, m);
    // Every entry is far below the 30 ms of a call after a change (a timed call that followed one
    // would put its point's median above it: each point has one call after a change per round).
    REQUIRE(p.target_pass.size() == 8);
    for (const double t : p.target_pass) CHECK(t < 0.015);
    REQUIRE(p.draft_step.size() == 3);
    for (const double t : p.draft_step) CHECK(t < 0.0075);  // (a draft step is the call / 2 tokens)
    REQUIRE(p.draft_catch_up.size() == 3);
    for (const double t : p.draft_catch_up) CHECK(t < 0.015);

    // One sequence: no call is added for a change of sequences (there is none). Drafts: one
    // untimed and 3 timed; catch-up: 3 rounds of 3, two calls each.
    prefilling_drafter one{{&draft}};
    auto single = m;
    single.max_sequences = 1;
    (void)specdec::measure_batch_profile(one, v, prompts, single);
    CHECK(one.calls == 1 + 3 + 3 * 3 * 2);

    // A drafter that proposes nothing beyond a context of 5 tokens only after its 14th call: the
    // first catch-up round (calls 5-10, after 4 draft calls; two calls per n) drafts at every n,
    // the second fails at n = 3 (call 16, at the prompt {1, 2, 3} plus 3 tokens): the table keeps
    // n = 1, 2, each the median of its three rounds.
    prefilling_drafter late{{&draft}};
    late.window = 5;
    late.window_from_call = 4 + 3 * 2 + 2 * 2;
    const auto q = specdec::measure_batch_profile(late, v, prompts, single);
    CHECK(q.draft_catch_up.size() == 2);
    for (const double t : q.draft_catch_up) CHECK(t < 0.015);
}

TEST_CASE("A profile's catch-up table: stored and loaded, optional, checked, and what the planner charges",
          "[profile][adaptive]") {
    const specdec::engine_profile p{.target_pass = {1.0}, .draft_step = {0.3}, .draft_catch_up = {0.3, 0.31, 0.32}};
    const std::string text = specdec::to_text(p);
    CHECK_THAT(text, Catch::Contains("\ndraft_catch_up 0.3 0.31 0.32\n"));  // the shortest text of each double
    CHECK(specdec::parse_engine_profile(text).draft_catch_up == p.draft_catch_up);
    // Beyond a draft step: catching up on 2 tokens reads 3, 0.32 - 0.3 per sequence; beyond the
    // table along its last slope (0.01 per token).
    CHECK(p.catch_up_cost(0, 1) == 0.0);
    CHECK(p.catch_up_cost(2, 1) == Approx(0.02));
    CHECK(p.catch_up_cost(2, 4) == Approx(0.08));
    CHECK(p.catch_up_cost(20, 1) == Approx(0.20));
    // Without the table: a draft step per missed token, and no line in the text.
    const specdec::engine_profile plain{.target_pass = {1.0}, .draft_step = {0.3, 0.4}};
    CHECK(plain.catch_up_cost(5, 2) == Approx(5 * 0.4));
    CHECK_THAT(specdec::to_text(plain), !Catch::Contains("draft_catch_up"));
    CHECK(specdec::parse_engine_profile(specdec::to_text(plain)).draft_catch_up.empty());
    // A one-entry table extends in proportion: a missed token costs that entry.
    const specdec::engine_profile one{.target_pass = {1.0}, .draft_step = {0.3}, .draft_catch_up = {0.25}};
    CHECK(one.catch_up_cost(4, 1) == Approx(1.0));
    // Malformed lines, each named.
    const std::string head = "specdec-engine-profile 1\ntarget_pass 1\ndraft_step 1\n";
    CHECK_THAT(error_of(head + "draft_catch_up 1\ndraft_catch_up 2\n"),
               Catch::Contains("line 5") && Catch::Contains("draft_catch_up appears twice"));
    CHECK_THAT(error_of(head + "draft_catch_up\n"), Catch::Contains("line 4") && Catch::Contains("no entries"));
    CHECK_THAT(error_of(head + "draft_catch_up 1 nan\n"), Catch::Contains("line 4") && Catch::Contains("entry 2"));
    CHECK_THAT(error_of(head + "catch_up 1\n"), Catch::Contains("draft_catch_up") && Catch::Contains("catch_up"));
    CHECK_THROWS_WITH(specdec::validate(specdec::engine_profile{.target_pass = {1.0}, .draft_step = {0.1},
                                                                .draft_catch_up = {-1.0}}),
                      Catch::Contains("draft_catch_up[0] = -1"));

    // The planner: after 20 plain steps, with 20 tokens left, speculating again (γ = 1 at α 0.6:
    // 1.6 tokens for 1.3 units) saves 0.1875 units per token, 3.9 in all. Catching up as 20 draft
    // steps (6 units) eats it, so the plan stays plain; as the table says (0.2 units), it resumes.
    const auto after_plain_steps = [](const specdec::engine_profile& prof) {
        specdec::adaptive_gamma_options o;
        o.profile = prof;
        o.acceptance_prior = {0.6};
        o.explore_every = 0;
        specdec::gamma_controller c(4, o);
        for (int i = 0; i < 20; ++i) c.observe({.gamma = 0, .drafted = 0, .emitted = 1});
        return c.choose(20);
    };
    const specdec::engine_profile flat{.target_pass = {1.0, 1.0, 1.0, 1.0, 1.0}, .draft_step = {0.3}};
    specdec::engine_profile flat_catch_up = flat;
    flat_catch_up.draft_catch_up = {0.3, 0.31};
    CHECK(after_plain_steps(flat) == 0);
    CHECK(after_plain_steps(flat_catch_up) == 1);
    // A table whose catch-up eats the gain (0.25 per missed token: 5.0 units) keeps it plain.
    specdec::engine_profile steep_catch_up = flat;
    steep_catch_up.draft_catch_up = {0.3, 0.55};
    CHECK(after_plain_steps(steep_catch_up) == 0);
}

TEST_CASE("A profile's tree passes: stored and loaded, optional, checked, and extended like the others",
          "[profile][tree]") {
    const specdec::engine_profile p{.target_pass = {1.0, 1.0, 1.5}, .draft_step = {0.2}, .tree_pass = {1.25, 1.5, 2.5}};
    const std::string text = specdec::to_text(p);
    CHECK_THAT(text, Catch::Contains("\ntree_pass 1.25 1.5 2.5\n"));
    CHECK(specdec::parse_engine_profile(text).tree_pass == p.tree_pass);
    CHECK(p.tree_pass_cost(2) == 1.5);
    CHECK(p.tree_pass_cost(5) == Approx(4.5));  // 2.5 + 1.0 · 2 beyond the table
    // Without the table a tree pass costs a chain pass's, and the text has no tree_pass line.
    const specdec::engine_profile chains_only{.target_pass = {1.0, 1.0, 1.5}, .draft_step = {0.2}};
    CHECK(chains_only.tree_pass_cost(3) == chains_only.pass_cost(3));
    CHECK(chains_only.tree_pass_cost(7) == chains_only.pass_cost(7));
    CHECK_THAT(specdec::to_text(chains_only), !Catch::Contains("tree_pass"));
    CHECK(specdec::parse_engine_profile(specdec::to_text(chains_only)).tree_pass.empty());
    // Malformed tree_pass lines, each named.
    const std::string head = "specdec-engine-profile 1\ntarget_pass 1\ndraft_step 1\n";
    CHECK_THAT(error_of(head + "tree_pass 1\ntree_pass 2\n"), Catch::Contains("line 5") && Catch::Contains("twice"));
    CHECK_THAT(error_of(head + "tree_pass\n"), Catch::Contains("line 4") && Catch::Contains("tree_pass has no entries"));
    CHECK_THAT(error_of(head + "tree_pass 1 -2\n"), Catch::Contains("line 4") && Catch::Contains("entry 2"));
    CHECK_THAT(error_of(head + "tree_pass 0 1\n"), Catch::Contains("tree_pass[0] = 0"));
    CHECK_THROWS_WITH(specdec::validate(specdec::engine_profile{.target_pass = {1.0}, .draft_step = {0.1},
                                                                .tree_pass = {1.0, NAN}}),
                      Catch::Contains("tree_pass[1] = nan"));
}

TEST_CASE("The tree planner weighs tree steps with the tree pass's cost, and chains run as chain steps with the "
          "chain pass's",
          "[profile][adaptive][tree]") {
    const std::vector<std::size_t> full{3, 2, 2, 1};
    const std::vector<float> a{0.55f, 0.45f, 0.35f};
    // A flat pass and cheap drafts, where a wide tree pays (the first scenario of the case above).
    specdec::engine_profile flat = gpu_like(64, 1.0 / 64, 0.02);
    specdec::engine_profile costly_trees = flat;
    costly_trees.tree_pass.assign(flat.target_pass.size(), 2.0);  // a tree pass costs two chain passes
    const auto plan = [&](const specdec::engine_profile& prof, bool chains_as_chain_steps) {
        specdec::adaptive_gamma_options o;
        o.prior_weight = 0.0;
        o.profile = prof;
        specdec::gamma_controller c(specdec::tree_plan_limits{.branching = full,
                                                              .draft_calls = specdec::tree_draft_calls::per_parent,
                                                              .chains_as_chain_steps = chains_as_chain_steps,
                                                              .best_trees = false},  // (uniform shapes)
                                    o);
        feed_siblings(c, a, 4);
        (void)c.choose(100, 1);
        const brute_force bf{{a.begin(), a.end()}, prof, 1, true, chains_as_chain_steps};
        const auto planned = c.planned_shape();
        const std::vector<std::size_t> got(planned.begin(), planned.end());
        CHECK(got == bf.best(full));
        if (!got.empty()) CHECK(c.expected_cost(planned, 1) == Approx(bf.cost(got)));
        return got;
    };
    const auto is_chain = [](const std::vector<std::size_t>& v) {
        return !v.empty() && std::all_of(v.begin(), v.end(), [](std::size_t x) { return x == 1; });
    };
    // Tree passes as cheap as chain passes: a tree.
    CHECK_FALSE(is_chain(plan(flat, true)));
    // Tree passes twice as costly, chains run as chain steps: a chain.
    CHECK(is_chain(plan(costly_trees, true)));
    // Tree passes twice as costly, and chains run as tree steps too: every plan pays the tree
    // pass, and the tree's extra tokens win again.
    CHECK_FALSE(is_chain(plan(costly_trees, false)));

    // The cost callbacks: tree_pass_cost beside the other two gives the same plans.
    {
        specdec::adaptive_gamma_options o;
        o.prior_weight = 0.0;
        o.draft_cost = [](std::size_t n) { return 0.02 * static_cast<double>(n); };
        o.pass_cost = [](std::size_t) { return 1.0; };
        o.tree_pass_cost = [](std::size_t) { return 2.0; };
        specdec::gamma_controller c(specdec::tree_plan_limits{.branching = full,
                                                              .draft_calls = specdec::tree_draft_calls::per_parent,
                                                              .chains_as_chain_steps = true},
                                    o);
        feed_siblings(c, a, 4);
        (void)c.choose(100, 1);
        const auto planned = c.planned_shape();
        CHECK(is_chain(std::vector<std::size_t>(planned.begin(), planned.end())));
        const std::vector<std::size_t> wide{2};
        CHECK(c.expected_cost(wide, 1) == Approx(0.02 + 2.0));
        const std::vector<std::size_t> chain{1};
        CHECK(c.expected_cost(chain, 1) == Approx(0.02 + 1.0));
    }
    specdec::adaptive_gamma_options alone;
    alone.tree_pass_cost = [](std::size_t) { return 2.0; };
    CHECK_THROWS_WITH(specdec::gamma_controller(4, alone),
                      Catch::Contains("specdec::gamma_controller") && Catch::Contains("tree_pass_cost is set without pass_cost"));
    {
        specdec::adaptive_gamma_options o;
        o.profile = specdec::engine_profile{.target_pass = {1.0}, .draft_step = {0.1}, .tree_pass = {0.0}};
        CHECK_THROWS_WITH(specdec::gamma_controller(4, o), Catch::Contains("tree_pass[0] = 0"));
    }
}

TEST_CASE("Measured costs: tree passes are timed apart from chain passes", "[adaptive][tree]") {
    specdec::gamma_controller c(specdec::tree_plan_limits{.branching = {2, 2}, .chains_as_chain_steps = true});
    REQUIRE(c.measures_time());
    const std::vector<std::size_t> wide{2}, chain{1, 1};  // both a pass over 3 positions
    // Chain passes at 1 ms over 1 to 4 positions (no draft or step time measured: only passes count).
    for (std::size_t m = 1; m <= 4; ++m)
        for (int r = 0; r < 2; ++r) c.observe({.gamma = m - 1, .drafted = m - 1, .emitted = 1, .pass_seconds = 1e-3});
    // Until a tree pass is timed, a tree pass costs a chain pass's.
    CHECK(c.expected_cost(wide, 1) == Approx(1e-3));
    for (int r = 0; r < 2; ++r)
        c.observe({.gamma = 1, .drafted = 1, .emitted = 1, .pass_seconds = 3e-3, .positions = 3, .tree_pass = true});
    CHECK(c.expected_cost(wide, 1) == Approx(3e-3));
    CHECK(c.expected_cost(chain, 1) == Approx(1e-3));  // chain passes keep their own estimate
    // A tree of another size: from the tree passes timed (one length: in proportion to positions).
    const std::vector<std::size_t> wider{2, 2};  // 6 nodes, 7 positions
    CHECK(c.expected_cost(wider, 1) == Approx(3e-3 * 7.0 / 3.0));
}

TEST_CASE("measure_engine_profile and measure_batch_profile time tree passes when the verifier has a tree call",
          "[profile][tree]") {
    auto target = markov_model::random(8, 2, 7);
    auto draft = markov_model::random(8, 2, 8);
    // score_tree at 400 us per position (chain passes at none): tree passes cost more.
    struct tree_timed : tree_markov {
        std::vector<std::size_t> nodes{};
        std::vector<std::int32_t> last_parents{};
        Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> d) {
            return specdec::model_verifier<markov_model>(*model).score(context, d);
        }
        void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
            std::this_thread::sleep_for(std::chrono::microseconds(400 * (tree.size() + 1)));
            nodes.push_back(tree.size());
            last_parents = tree.parents;
            tree_markov::score_tree(context, tree, out);
        }
    } v{{&target}};
    const std::vector<token_id> prompt{1, 2, 3};
    const auto p = specdec::measure_engine_profile(draft, v, prompt, {.max_positions = 5, .repeats = 3});
    REQUIRE(p.tree_pass.size() == 5);
    // One untimed call, then 3 rounds timing one call at each of 0 .. 4 nodes in turn.
    REQUIRE(v.nodes.size() == 1 + 5 * 3);
    CHECK(v.nodes[0] == 0);
    for (std::size_t r = 0; r < 3; ++r)
        for (std::size_t k = 0; k < 5; ++k) CHECK(v.nodes[1 + 5 * r + k] == k);
    CHECK(v.last_parents == std::vector<std::int32_t>{-1, -1, 0, 1});  // two branches below the root
    CHECK(p.tree_pass[0] >= 400e-6);
    CHECK(p.tree_pass[4] >= 5 * 400e-6);
    CHECK(p.tree_pass[4] > p.target_pass[4]);
    CHECK(specdec::parse_engine_profile(specdec::to_text(p)).tree_pass == p.tree_pass);

    // The verifier of one sequence without a tree call: no tree_pass.
    CHECK(specdec::measure_engine_profile(draft, target, prompt, {.max_positions = 3, .repeats = 1}).tree_pass.empty());

    // Many sequences: score_tree_batch at 300 us per position of the pass.
    struct multi_tree_timed : multi_markov_verifier {
        std::vector<std::size_t> totals{};
        void score_tree_batch(std::span<const specdec::tree_score_request> batch, specdec::packed_logits& out) {
            std::size_t positions = 0;
            for (const auto& r : batch) positions += r.tree->size() + 1;
            std::this_thread::sleep_for(std::chrono::microseconds(300 * positions));
            totals.push_back(positions);
            std::vector<token_id> path;
            for (std::size_t i = 0; i < batch.size(); ++i) {
                auto cols = out.sequence(i);
                for (std::size_t c = 0; c <= batch[i].tree->size(); ++c) {
                    specdec::path_tokens(*batch[i].tree, static_cast<std::int32_t>(c) - 1, path);
                    path.insert(path.begin(), batch[i].context.begin(), batch[i].context.end());
                    const std::size_t row = model->row_of(path) * static_cast<std::size_t>(model->vocab);
                    cols.col(static_cast<Eigen::Index>(c)) =
                        Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, model->vocab);
                }
            }
        }
    } mv{{&target}};
    multi_markov_drafter d{&draft};
    const std::vector<std::vector<token_id>> prompts{{1, 2, 3}, {4, 5}};
    const auto q = specdec::measure_batch_profile(d, mv, prompts,
                                                  {.max_positions = 8, .max_sequences = 2, .draft_tokens = 2, .repeats = 2});
    REQUIRE(q.tree_pass.size() == 8);
    const std::vector<std::size_t> grid{1, 2, 3, 4, 6, 8};
    // Each point once untimed, then two rounds timing one call at each point in turn, after an
    // untimed one where the pass before held another number of sequences (at 1 and 2 positions).
    std::vector<std::size_t> expected(grid.begin(), grid.end());
    for (std::size_t r = 0; r < 2; ++r) {
        expected.insert(expected.end(), {1, 1, 2, 2});
        expected.insert(expected.end(), grid.begin() + 2, grid.end());
    }
    CHECK(mv.totals == expected);
    CHECK(q.tree_pass[7] >= 8 * 300e-6);
    CHECK(q.tree_pass[4] == Approx(q.tree_pass[3] + (q.tree_pass[5] - q.tree_pass[3]) / 2));
    // Without score_tree_batch: no tree_pass.
    multi_markov_verifier plain{&target};
    CHECK(specdec::measure_batch_profile(d, plain, prompts, {.max_positions = 4, .max_sequences = 2, .repeats = 1})
              .tree_pass.empty());
}

TEST_CASE("A tree planner's storage follows its plans, not a far wider branching, and ranks past them keep their "
          "priors (review finding)",
          "[adaptive][tree]") {
    // A branching of a billion children at the root once sized one estimate per rank (tens of
    // GB); max_nodes caps every plan at 8 nodes, and the shapes are capped in number anyway.
    specdec::gamma_controller huge(specdec::tree_plan_limits{.branching = {1'000'000'000, 2}, .max_nodes = 8});
    CHECK(huge.gamma_max() == 2);
    CHECK(huge.expected_tokens(std::vector<std::size_t>{2, 2}) > 1.0);
    specdec::gamma_controller uncapped(specdec::tree_plan_limits{.branching = {1'000'000'000}});
    CHECK(uncapped.expected_tokens(std::vector<std::size_t>{3}) > 1.0);

    // Ranks a planner never plans take the priors a planner that plans them gives: unseen
    // ranks unseen_rank_ratio times the one before, or the given prior, after the same
    // observations of the ranks both plan.
    for (const bool given : {false, true}) {
        INFO("acceptance_prior given: " << given);
        specdec::adaptive_gamma_options o;
        if (given) o.acceptance_prior = {0.7, 0.4, 0.3};
        specdec::gamma_controller wide(specdec::tree_plan_limits{.branching = {6}}, o);
        specdec::gamma_controller narrow(specdec::tree_plan_limits{.branching = {6}, .max_nodes = 2}, o);
        const std::vector<std::size_t> six{6};
        CHECK(wide.expected_tokens(six) == Approx(narrow.expected_tokens(six)).epsilon(1e-12));
        feed_siblings(wide, {0.6f, 0.3f}, 5);
        feed_siblings(narrow, {0.6f, 0.3f}, 5);
        CHECK(wide.expected_tokens(six) == Approx(narrow.expected_tokens(six)).epsilon(1e-12));
        CHECK(wide.sibling_acceptance(5) == Approx(narrow.sibling_acceptance(5)));
    }
}

TEST_CASE("An exploring step's plan is not overridden by a ragged plan (review finding)", "[profile][ragged]") {
    // The acceptance of the draining test above: sequence 0 drafted well, sequence 1 poorly.
    using acceptance = specdec::gamma_controller::sequence_acceptance;
    const good_and_bad seqs;
    const acceptance mixed[] = {seqs.of(true), seqs.of(false)};
    std::vector<std::size_t> gammas(2);
    // A step that does not explore: the ragged plan, each sequence its own length.
    specdec::gamma_controller steady(4, {.explore_every = 0, .profile = cpu_like()});
    feed(steady, 0.5, 50);
    const std::size_t best = steady.choose(99, 2);
    REQUIRE(best > 0);
    steady.plan_sequences(4, mixed, gammas, best);
    INFO("ragged plan " << gammas[0] << ", " << gammas[1]);
    REQUIRE(gammas[0] != gammas[1]);
    // A controller that explores at every step: its choice is a neighbour of the best, and
    // every sequence drafts it (the ragged plan used to replace it, so the neighbour was never
    // observed).
    specdec::gamma_controller exploring(
        4, {.explore_every = 1, .max_explore_every = 1, .explore_budget = 1.0, .profile = cpu_like()});
    feed(exploring, 0.5, 50);
    const std::size_t tried = exploring.choose(99, 2);
    REQUIRE(tried != best);
    exploring.plan_sequences(4, mixed, gammas, tried);
    CHECK(gammas[0] == tried);
    CHECK(gammas[1] == tried);
    // Limits still cap it.
    const acceptance capped[] = {seqs.of(true, 1), seqs.of(false)};
    exploring.plan_sequences(4, capped, gammas, tried);
    CHECK(gammas[0] == std::min<std::size_t>(tried, 1));
    CHECK(gammas[1] == tried);
}
