// The adaptive γ policy (gamma_controller) and the acceptance estimates it learns from:
// its choice against Leviathan et al.'s Thm. 3.8, the warm-up and exploration schedule,
// β_i = Σ min(p_i, q_i) against an independent computation, the draft-side stop, errors.
// Its exactness is in distribution_test.cpp.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/stats.hpp"

#include <specdec/specdec.hpp>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {

/// Known costs: c per draft token, a target pass over m positions costs 1 + slope·(m − 1);
/// no prior on the acceptance (the tests set it exactly).
specdec::adaptive_gamma_options known_costs(double c, double slope = 0.0) {
    specdec::adaptive_gamma_options o;
    o.prior_weight = 0.0;
    o.draft_cost = [c](std::size_t n) { return c * static_cast<double>(n); };
    o.pass_cost = [slope](std::size_t m) { return 1.0 + slope * static_cast<double>(m - 1); };
    return o;
}

/// Feeds `steps` observations of β = alpha at every position up to gamma_max.
void feed(specdec::gamma_controller& c, double alpha, std::size_t steps = 1) {
    const std::vector<float> beta(c.gamma_max(), static_cast<float>(alpha));
    for (std::size_t s = 0; s < steps; ++s)
        c.observe({.gamma = c.gamma_max(), .drafted = c.gamma_max(), .emitted = 1, .acceptance = beta});
}

/// Σ_x min(p(x), q(x)) of two standardized rows, computed in double by the test's own reference.
double overlap(const Eigen::VectorXf& target_logits, const Eigen::VectorXf& draft_logits,
               const specdec::sampling_config& s) {
    const auto p = ref_standardize(target_logits, s), q = ref_standardize(draft_logits, s);
    double sum = 0;
    for (std::size_t i = 0; i < p.size(); ++i) sum += std::min(p[i], q[i]);
    return sum;
}

}  // namespace

TEST_CASE("The adaptive policy picks Thm. 3.8's best gamma under Leviathan's cost model", "[adaptive]") {
    // A pass over γ+1 positions costs one target step (Leviathan et al. §3.5); a draft token
    // costs c. Then tokens per unit of cost is Thm. 3.8's improvement factor, and the best γ
    // is its argmax over [0, 8].
    for (const double alpha : {0.2, 0.5, 0.7, 0.8, 0.9, 0.95}) {
        for (const double c : {0.01, 0.05, 0.2, 0.5, 1.0}) {
            specdec::gamma_controller ctl(8, known_costs(c));
            feed(ctl, alpha);
            std::size_t best = 0;
            double best_value = 1.0;  // γ = 0: plain decoding, factor 1
            for (std::size_t g = 1; g <= 8; ++g) {
                const double v = specdec::expected_walltime_improvement(alpha, g, c);
                if (v > best_value * (1 + 1e-9)) {
                    best_value = v;
                    best = g;
                }
            }
            INFO("alpha " << alpha << ", c " << c << ", best gamma " << best);
            // (β is observed as a float, so exact ties such as α = 0.2, c = 0.2 at γ = 0 and 1
            // may go either way: compare the factor reached.)
            const std::size_t chosen = ctl.best_gamma(8);
            const double reached = chosen == 0 ? 1.0 : specdec::expected_walltime_improvement(alpha, chosen, c);
            CHECK(reached == Approx(best_value).epsilon(1e-6));
            CHECK(ctl.expected_tokens(3) == Approx((1 - std::pow(alpha, 4)) / (1 - alpha)));
        }
    }
}

TEST_CASE("The adaptive policy never speculates when the draft costs as much as the target", "[adaptive]") {
    // c = 1 (the shipped pair's regime): (1 − α^{γ+1}) / ((1 − α)(γ + 1)) < 1 for every γ >= 1.
    specdec::gamma_controller ctl(6, known_costs(1.0));
    feed(ctl, 0.7);
    CHECK(ctl.best_gamma(6) == 0);
    // With positions that are not free (a pass over m positions costs 1 + 0.9 (m − 1), as on a
    // compute-bound CPU engine) even a free drafter does not pay at α = 0.6 ...
    specdec::gamma_controller cpu(6, known_costs(0.0, 0.9));
    feed(cpu, 0.6);
    CHECK(cpu.best_gamma(6) == 0);
    // ... and does at α = 0.95 with free positions.
    specdec::gamma_controller gpu(6, known_costs(0.0, 0.0));
    feed(gpu, 0.95);
    CHECK(gpu.best_gamma(6) == 6);
    CHECK(gpu.best_gamma(2) == 2);  // the limit (tokens still needed) caps it
}

TEST_CASE("The adaptive policy uses per-position acceptance (Eq. 1 generalized)", "[adaptive]") {
    // α_1 = 0.9, then 0.1: the second draft token is rarely worth it.
    specdec::gamma_controller ctl(4, known_costs(0.1));
    const std::vector<float> beta{0.9f, 0.1f, 0.1f, 0.1f};
    ctl.observe({.gamma = 4, .drafted = 4, .emitted = 1, .acceptance = beta});
    CHECK(ctl.acceptance(1) == Approx(0.9));
    CHECK(ctl.acceptance(2) == Approx(0.1));
    CHECK(ctl.expected_tokens(2) == Approx(1 + 0.9 + 0.09));
    CHECK(ctl.best_gamma(4) == 1);
    // A position never observed takes the deepest observed estimate.
    specdec::gamma_controller shallow(4, known_costs(0.1));
    const std::vector<float> one{0.8f};
    shallow.observe({.gamma = 1, .drafted = 1, .emitted = 2, .acceptance = one});
    CHECK(shallow.acceptance(3) == Approx(0.8));
    CHECK(shallow.acceptance(0) == 0.0);
}

TEST_CASE("Estimates are running means, then moving averages that follow a change", "[adaptive]") {
    specdec::adaptive_gamma_options o = known_costs(0.1);
    o.window = 4;
    specdec::gamma_controller ctl(2, o);
    const std::vector<float> a{0.2f}, b{0.6f};
    ctl.observe({.gamma = 1, .drafted = 1, .acceptance = a});
    ctl.observe({.gamma = 1, .drafted = 1, .acceptance = b});
    CHECK(ctl.acceptance(1) == Approx(0.4));  // mean of two
    for (int i = 0; i < 40; ++i) ctl.observe({.gamma = 1, .drafted = 1, .acceptance = b});
    CHECK(ctl.acceptance(1) == Approx(0.6).margin(1e-4));  // the old value has decayed
}

TEST_CASE("Warm-up, then exploration at a doubling interval within the budget", "[adaptive]") {
    SECTION("known costs: one warm-up step at gamma 1, then the best") {
        specdec::adaptive_gamma_options o = known_costs(1.0);
        o.explore_every = 4;
        o.max_explore_every = 16;
        o.explore_budget = 1.0;  // no budget limit here
        specdec::gamma_controller ctl(3, o);
        CHECK(ctl.choose() == 1);
        const std::vector<float> beta{0.5f};
        std::vector<std::size_t> choices;
        ctl.observe({.gamma = 1, .drafted = 1, .emitted = 1, .acceptance = beta});
        for (int s = 0; s < 60; ++s) {
            const std::size_t g = ctl.choose();
            choices.push_back(g);
            ctl.observe({.gamma = g, .drafted = g, .emitted = 1, .acceptance = std::span(beta).first(std::min<std::size_t>(g, 1))});
        }
        // Best is 0 (c = 1); exploring steps (γ = 1) after 4, 8, 16, 16, ... plain steps.
        std::vector<std::size_t> explored;
        for (std::size_t s = 0; s < choices.size(); ++s)
            if (choices[s] != 0) explored.push_back(s);
        CHECK(explored == std::vector<std::size_t>{3, 11, 27, 43, 59});
        CHECK(ctl.choices()[1] == 1 + explored.size());
    }
    SECTION("the exploration budget stops exploring when a step cannot pay") {
        specdec::adaptive_gamma_options o = known_costs(1.0);
        o.explore_every = 2;
        o.max_explore_every = 2;  // an exploring step every other step, but for the budget
        o.explore_budget = 0.05;
        const std::vector<float> beta{0.5f};
        const auto explore_count = [&](const specdec::adaptive_gamma_options& opts) {
            specdec::gamma_controller ctl(3, opts);
            std::size_t explored = 0;
            (void)ctl.choose();
            ctl.observe({.gamma = 1, .drafted = 1, .emitted = 1, .acceptance = beta});
            for (int s = 0; s < 400; ++s) {
                const std::size_t g = ctl.choose();
                explored += g != 0;
                ctl.observe({.gamma = g, .drafted = g, .emitted = 1});
            }
            return explored;
        };
        // A drafter with no model (free drafts, nothing to catch up on) and a pass linear in its
        // positions: a γ = 1 step costs 2 for 1.5 expected tokens, losing 0.5 of a step against
        // the best, γ = 0. After k exploring steps of 400 the predicted total is 400 + k, and
        // 0.5 k <= 0.05 (400 + k) allows k <= 44 of the 200 the interval alone would make.
        specdec::adaptive_gamma_options free_drafts = o;
        free_drafts.draft_cost = [](std::size_t) { return 0.0; };
        free_drafts.pass_cost = [](std::size_t m) { return static_cast<double>(m); };
        const std::size_t k = explore_count(free_drafts);
        CHECK(k >= 40);
        CHECK(k <= 45);
        // A draft model as costly as the target (c = 1): an exploring step would also pay its
        // catch-up on every token since it last ran (a draft step each, with known costs), which
        // grows as fast as the budget: it never explores.
        CHECK(explore_count(o) == 0);
    }
    SECTION("measured costs: gamma 1 twice, then gamma 0, then the best") {
        specdec::gamma_controller ctl(4, {.prior_weight = 0.0});
        CHECK(ctl.measures_time());
        const std::vector<float> beta{0.6f};
        CHECK(ctl.choose() == 1);
        ctl.observe({.gamma = 1, .drafted = 1, .emitted = 2, .acceptance = beta, .draft_seconds = 5.0,
                     .pass_seconds = 9.0, .step_seconds = 14.1, .first = true});
        CHECK(ctl.choose() == 1);  // the first step read the prompt too: not a clean timing
        ctl.observe({.gamma = 1, .drafted = 1, .emitted = 2, .acceptance = beta, .draft_seconds = 0.05,
                     .pass_seconds = 1.2, .step_seconds = 1.3});
        CHECK(ctl.choose() == 0);
        ctl.observe({.gamma = 0, .drafted = 0, .emitted = 1, .draft_seconds = 0, .pass_seconds = 1.0,
                     .step_seconds = 1.05});
        // t_draft = 0.05, t_pass(1) = 1, t_pass(2) = 1.2 (3 and up extrapolated), overhead 0.05.
        CHECK(ctl.expected_cost(0) == Approx(1.05));
        CHECK(ctl.expected_cost(1) == Approx(0.05 + 1.2 + 0.05));
        CHECK(ctl.expected_cost(3) == Approx(0.15 + 1.6 + 0.05));
        // Tokens per unit: γ = 0: 1/1.05, 1: 1.6/1.3, 2: 1.96/1.55, 3: 2.176/1.8.
        CHECK(ctl.best_gamma(4) == 2);
        CHECK(ctl.choose() == 2);
    }
}

TEST_CASE("A draft model idle during plain steps must pay its catch-up before speculation resumes", "[adaptive]") {
    // Measured costs where γ = 1 is slightly better per token, but the draft model has fallen
    // 300 tokens behind: resuming pays only if enough tokens are left to recoup the catch-up.
    specdec::gamma_controller ctl(1, {.explore_every = 0, .prior_weight = 0.0});
    const std::vector<float> beta{0.95f};
    (void)ctl.choose();
    ctl.observe({.gamma = 1, .drafted = 1, .emitted = 2, .acceptance = beta, .draft_seconds = 0.3,
                 .pass_seconds = 1.1, .step_seconds = 1.4});
    (void)ctl.choose();
    ctl.observe({.gamma = 1, .drafted = 1, .emitted = 2, .acceptance = beta, .draft_seconds = 0.3,
                 .pass_seconds = 1.1, .step_seconds = 1.4});
    (void)ctl.choose();
    for (int s = 0; s < 300; ++s)
        ctl.observe({.gamma = 0, .drafted = 0, .emitted = 1, .draft_seconds = 0, .pass_seconds = 1.0,
                     .step_seconds = 1.0});
    // rate(1) = 1.95 / 1.4 > rate(0) = 1: better per step ...
    REQUIRE(ctl.best_gamma(1) == 1);
    // ... but 300 · 0.3 of catch-up is recouped only over about 90 / (1 − 1.4/1.95) = 319 tokens.
    CHECK(ctl.choose(100) == 0);
    CHECK(ctl.choose(10000) == 1);
    // A new call (a kept controller's next request): the draft model reads the new prompt
    // anyway, so the last call's 300 tokens are no longer charged.
    ctl.new_call();
    CHECK(ctl.choose(100) == 1);
}

TEST_CASE("A kept controller's next call does not pay the last call's catch-up", "[adaptive]") {
    // The batch loop calls new_call() before a step whose every sequence is new: a call that
    // ended with plain steps leaves its draft model's lag behind, and the next call, whose
    // prompt the draft model reads anyway, speculates from its first planned step.
    specdec::adaptive_gamma_options o;
    o.explore_every = 0;
    o.prior_weight = 0.0;
    o.pass_cost = [](std::size_t m) { return 1.0 + 0.05 * static_cast<double>(m); };
    o.draft_cost = [](std::size_t n) { return 0.3 * static_cast<double>(n); };
    specdec::gamma_controller ctl(1, o);
    const std::vector<float> good{0.95f};
    (void)ctl.choose();
    ctl.observe({.gamma = 1, .drafted = 1, .emitted = 2, .acceptance = good});
    for (int s = 0; s < 300; ++s) {  // the end of a call: plain steps (as if acceptance had dropped)
        (void)ctl.choose(0);
        ctl.observe({.gamma = 0, .drafted = 0, .emitted = 1});
    }
    REQUIRE(ctl.best_gamma(1) == 1);
    REQUIRE(ctl.choose(100) == 0);  // resuming within the call does not pay for 300 tokens of catch-up
    ctl.new_call();
    CHECK(ctl.choose(100) == 1);
}

TEST_CASE("With known costs and no acceptance seen, the first step is the best plan under the prior", "[adaptive]") {
    // Cheap drafts and a flat pass: under the prior 1/2 the best chain is long, not the warm-up's
    // gamma = 1. The default prior weight (no observation yet: the estimate is the prior).
    specdec::adaptive_gamma_options o = known_costs(0.05);
    o.prior_weight = specdec::adaptive_gamma_options{}.prior_weight;
    specdec::gamma_controller chain(6, o);
    const std::size_t first = chain.choose();
    CHECK(first == chain.best_gamma(6));
    CHECK(first > 1);
    // A tree planner: its first plan is its best plan, not one level of two children.
    specdec::gamma_controller tree(specdec::tree_plan_limits{.branching = {3, 2, 2, 1}}, o);
    const std::size_t depth = tree.choose();
    CHECK(depth > 1);
    CHECK(tree.planned_shape().size() == depth);
    // Where the best plan under the prior is a plain step (drafting costs as much as a pass),
    // the warm-up still runs: gamma = 1, so that acceptance is seen.
    specdec::adaptive_gamma_options dear = known_costs(1.0);
    dear.prior_weight = o.prior_weight;
    specdec::gamma_controller slow(6, dear);
    CHECK(slow.best_gamma(6) == 0);
    CHECK(slow.choose() == 1);
}

TEST_CASE("A prior of two pseudo-observations keeps two rejected warm-up drafts from switching speculation off",
          "[adaptive]") {
    // Free drafting, passes cost 1 + 0.1 per extra position. Two β = 0 observations: without a
    // prior α̂ = 0 and γ = 0 is best for good; with a prior of 2 pseudo-observations at 1/2
    // the estimate used is 0.25 and γ = 1 still pays, so more drafts are observed. (The default,
    // 0.5 pseudo-observations, gives 0.1 here: exploring steps then retry speculation.)
    auto o = known_costs(0.0, 0.1);
    specdec::gamma_controller bare(4, o);
    o.prior_weight = 2.0;
    specdec::gamma_controller prior(4, o);
    const std::vector<float> zero{0.0f};
    for (auto* c : {&bare, &prior})
        for (int i = 0; i < 2; ++i) c->observe({.gamma = 1, .drafted = 1, .emitted = 1, .acceptance = zero});
    CHECK(bare.best_gamma(4) == 0);
    CHECK(prior.acceptance(1) == 0.0);  // the estimate itself is reported as observed
    CHECK(prior.expected_tokens(1) == Approx(1.25));
    CHECK(prior.best_gamma(4) == 1);
    // Many observations outweigh the prior.
    for (int i = 0; i < 200; ++i) prior.observe({.gamma = 1, .drafted = 1, .emitted = 1, .acceptance = zero});
    CHECK(prior.best_gamma(4) == 0);
}

TEST_CASE("gamma_controller and the adaptive options reject invalid settings with a clear error", "[adaptive][errors]") {
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(specdec::gamma_controller(0), Contains("gamma_max = 0"));
    CHECK_THROWS_WITH(specdec::gamma_controller(4, {.window = 0}), Contains("window = 0"));
    CHECK_THROWS_WITH(specdec::gamma_controller(4, {.explore_budget = 1.5}), Contains("explore_budget"));
    CHECK_THROWS_WITH(specdec::gamma_controller(4, {.prior_weight = -1.0}), Contains("prior_weight"));
    specdec::adaptive_gamma_options half;
    half.pass_cost = [](std::size_t) { return 1.0; };
    CHECK_THROWS_WITH(specdec::gamma_controller(4, half), Contains("both draft_cost and pass_cost"));

    auto target = markov_model::random(4, 2, 1);
    auto draft = markov_model::random(4, 2, 2);
    std::mt19937_64 rng(1);
    specdec::gamma_controller three(3);
    specdec::decode_options o{.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = 8}};
    o.length.policy = specdec::gamma_policy::adaptive;
    o.length.controller = &three;
    const std::vector<token_id> prompt{0};
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt, o, rng), Contains("gamma_max() = 3"));
    o.length.controller = nullptr;
    o.draft.stop_below = -0.5f;
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt, o, rng), Contains("draft.stop_below"));
}

TEST_CASE("Acceptance estimates: each reported beta is sum min(p, q) of the tested row", "[adaptive]") {
    // Models with 4 tokens; every step's β against the test's own double-precision computation.
    for (const specdec::sampling_config s : {specdec::sampling_config{}, specdec::sampling_config{.temperature = 0.7f},
                                             specdec::sampling_config{.top_k = 2}}) {
        auto target = markov_model::random(4, 2, 5);
        auto draft = markov_model::random(4, 2, 6);
        for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
            std::size_t checked = 0;
            std::vector<token_id> context{0};
            specdec::decode_options o{.step = specdec::chain{.gamma = 3, .scheme = scheme}, .sampling = s, .budget = {.max_new_tokens = 40}};
            std::get<specdec::chain>(o.step).estimate_acceptance = true;
            o.on_step = [&](const specdec::step_event& e) {
                REQUIRE(e.acceptance.size() == std::min(e.draft.size(), e.accepted + 1));
                std::vector<token_id> prefix = context;
                for (std::size_t i = 0; i < e.acceptance.size(); ++i) {
                    const double expected = overlap(target.next_logits(prefix), draft.next_logits(prefix), s);
                    CHECK(e.acceptance[i] == Approx(expected).margin(1e-5));
                    prefix.push_back(e.draft[i]);
                    ++checked;
                }
                context.insert(context.end(), e.emitted.begin(), e.emitted.end());
            };
            std::mt19937_64 rng(9);
            const auto r = specdec::speculative_decode(draft, target, context, o, rng);
            CHECK(checked > 10);
            double sum = 0;
            for (double b : r.stats.expected_accepted_at_position) sum += b;
            CHECK(r.stats.expected_accepted_at_position.size() == r.stats.reached_at_position.size());
            CHECK(r.stats.estimated_acceptance() > 0);
            CHECK(sum > 0);
        }
    }
    SECTION("point-mass drafts: beta is p(x)") {
        auto target = markov_model::random(4, 2, 7);
        shift_drafter drafter{4, 1};
        std::vector<token_id> context{0};
        specdec::decode_options o{.step = specdec::chain{.gamma = 2}, .budget = {.max_new_tokens = 30}};
        std::get<specdec::chain>(o.step).estimate_acceptance = true;
        std::size_t checked = 0;
        o.on_step = [&](const specdec::step_event& e) {
            std::vector<token_id> prefix = context;
            for (std::size_t i = 0; i < e.acceptance.size(); ++i) {
                const auto p = ref_standardize(target.next_logits(prefix), {});
                CHECK(e.acceptance[i] == Approx(p[static_cast<std::size_t>(e.draft[i])]).margin(1e-5));
                prefix.push_back(e.draft[i]);
                ++checked;
            }
            context.insert(context.end(), e.emitted.begin(), e.emitted.end());
        };
        std::mt19937_64 rng(3);
        (void)specdec::speculative_decode(drafter, target, context, o, rng);
        CHECK(checked > 10);
    }
    SECTION("off by default") {
        auto target = markov_model::random(4, 2, 7);
        auto draft = markov_model::random(4, 2, 8);
        std::mt19937_64 rng(3);
        const std::vector<token_id> prompt{0};
        const auto r = specdec::speculative_decode(draft, target, prompt, {.step = specdec::chain{.gamma = 2}, .budget = {.max_new_tokens = 20}}, rng);
        CHECK(r.stats.expected_accepted_at_position.empty());
        CHECK(r.stats.estimated_acceptance() == 0.0);
    }
}

TEST_CASE("The mean beta estimates the acceptance rate of token verification", "[adaptive][statistical]") {
    // Under token verification each tested position is accepted with probability β_i given
    // the past, so Σ accepts − Σ β over n tested positions has mean 0 and variance
    // Σ β(1 − β) <= n/4. Fails when |Σ accepts − Σ β| > 4.9 sd (false alarm about 1e-6).
    auto target = markov_model::random(4, 2, 41);
    auto draft = markov_model::random(4, 2, 42);
    specdec::decode_options o{.step = specdec::chain{.gamma = 3, .scheme = specdec::verification_scheme::token}, .budget = {.max_new_tokens = 20000}};
    std::get<specdec::chain>(o.step).estimate_acceptance = true;
    double var = 0;
    o.on_step = [&](const specdec::step_event& e) {
        for (float b : e.acceptance) var += static_cast<double>(b) * (1.0 - static_cast<double>(b));
    };
    std::mt19937_64 rng(77);
    const std::vector<token_id> prompt{0};
    const auto r = specdec::speculative_decode(draft, target, prompt, o, rng);
    double expected = 0;
    for (double b : r.stats.expected_accepted_at_position) expected += b;
    const double accepted = static_cast<double>(r.stats.accepted_tokens);
    INFO("accepted " << accepted << ", sum of beta " << expected << ", sd " << std::sqrt(var));
    CHECK(std::abs(accepted - expected) < 4.9 * std::sqrt(var));
    CHECK(r.stats.estimated_acceptance() == Approx(r.stats.acceptance_rate()).margin(0.02));
}

TEST_CASE("The draft-side stop ends each block after the first token below the threshold", "[adaptive]") {
    auto target = markov_model::random(4, 2, 51);
    auto draft = markov_model::random(4, 2, 52);
    const float threshold = 0.35f;
    for (const bool block_drafter : {false, true}) {
        INFO((block_drafter ? "model_drafter (stops drafting itself)" : "plain model drafter"));
        std::vector<token_id> context{0};
        std::size_t stopped = 0, full = 0;
        specdec::decode_options o{.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = 400}};
        o.draft.stop_below = threshold;
        o.on_step = [&](const specdec::step_event& e) {
            std::vector<token_id> prefix = context;
            for (std::size_t i = 0; i < e.draft.size(); ++i) {
                const auto q = ref_standardize(draft.next_logits(prefix), {});
                const bool low = q[static_cast<std::size_t>(e.draft[i])] < threshold;
                // Only the last token of a block may be below the threshold.
                if (i + 1 < e.draft.size()) CHECK_FALSE(low);
                else if (low) ++stopped;
                prefix.push_back(e.draft[i]);
            }
            full += e.draft.size() == 4;
            context.insert(context.end(), e.emitted.begin(), e.emitted.end());
        };
        std::mt19937_64 rng(5);
        specdec::decode_result r;
        if (block_drafter) {
            specdec::model_drafter<markov_model> d(draft);
            r = specdec::speculative_decode(d, target, context, o, rng);
        } else {
            r = specdec::speculative_decode(draft, target, context, o, rng);
        }
        CHECK(stopped > 10);
        CHECK(full > 0);
        // The model calls after a stop are spared.
        CHECK(r.stats.draft_calls == r.stats.drafted_tokens);
    }
}

TEST_CASE("Adaptive decoding at temperature 0 is greedy decoding, token for token", "[adaptive]") {
    auto target = markov_model::random(5, 2, 61);
    auto draft = markov_model::random(5, 2, 62);
    const specdec::sampling_config greedy{.temperature = 0.0f};
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        specdec::decode_options o{.step = specdec::chain{.gamma = 5, .scheme = scheme}, .sampling = greedy, .budget = {.max_new_tokens = 200}};
        o.length.policy = specdec::gamma_policy::adaptive;
        o.length.adaptive = known_costs(0.05);
        o.length.adaptive.explore_every = 3;
        o.draft.stop_below = 0.5f;
        std::mt19937_64 a(1), b(2);
        const std::vector<token_id> prompt{0, 3};
        const auto spec = specdec::speculative_decode(draft, target, prompt, o, a);
        const auto base = specdec::autoregressive_decode(target, prompt, o, b);
        CHECK(spec.tokens == base.tokens);
        // The policy did vary γ.
        std::size_t used = 0;
        for (std::size_t n : spec.stats.steps_at_gamma) used += n != 0;
        CHECK(used >= 2);
    }
}

TEST_CASE("A time estimate of 0 does not cap later times at 0 (review finding)", "[adaptive]") {
    // The catch-up cost of a draft model is often measured as 0 for a few steps (cheap, or timing
    // noise clamped at 0). The cap of 3x the estimate against preempted steps then held it at 0
    // for good, and the controller ignored the catch-up cost when resuming speculation.
    specdec::detail::running_estimate e;
    for (int i = 0; i < 4; ++i) e.add_time(0.0, 32);
    CHECK(e.value == 0.0);
    for (int i = 0; i < 50; ++i) e.add_time(1.0, 32);
    CHECK(e.value > 0.5);
    // A positive estimate still caps an outlier at 3x.
    specdec::detail::running_estimate f;
    for (int i = 0; i < 4; ++i) f.add_time(1.0, 4);
    f.add_time(100.0, 4);
    CHECK(f.value == Approx(1.0 + (3.0 - 1.0) / 4.0));
}

TEST_CASE("A tree planner whose limits allow more than 4096 shapes keeps the smallest ones", "[adaptive][tree]") {
    // {8, 8, 8, 8, 8} allows 37,448 shapes, {3}^8 9,840: the planner keeps every shape up to the
    // node count where 4096 are reached, so the warm-up's one level of two children is there
    // (a cut in depth-first order kept only shapes with one child at the root).
    for (const std::vector<std::size_t>& branching :
         {std::vector<std::size_t>{8, 8, 8, 8, 8}, std::vector<std::size_t>(8, 3)}) {
        specdec::gamma_controller planner(specdec::tree_plan_limits{.branching = branching, .best_trees = false});
        (void)planner.choose();  // measured costs, nothing known: the warm-up plan
        const auto shape = planner.planned_shape();
        REQUIRE(shape.size() == 1);
        CHECK(shape[0] == 2);
    }
}
