// Block verification (Sun et al. 2024): expected accepted tokens by exact enumeration, the
// comparison with token verification, and gamma = 1 equivalence. Exactness of the output
// distribution is tested in distribution_test.cpp for both schemes.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/stats.hpp"

#include <specdec/specdec.hpp>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

using namespace specdec_test;
using specdec::token_id;
using specdec::verification_scheme;

namespace {

/// Exact E[accepted draft tokens] of one step from `context`, by enumerating every draft
/// block x_1..x_gamma (probability prod q_i(x_i)) and, for it, the law of the number accepted:
///  token: P(n >= k) = prod_{i<=k} min(1, p_i/q_i);
///  block: tau = the last i with eta_i < h_i, so P(tau = i) = h_i prod_{j>i} (1 - h_j).
double exact_expected_accepted(markov_model draft, markov_model target, std::vector<token_id> context,
                               std::size_t gamma, const specdec::sampling_config& s, verification_scheme scheme) {
    const int vocab = target.vocab;
    double expected = 0.0;
    std::vector<token_id> x(gamma, 0);
    std::size_t blocks = 1;
    for (std::size_t i = 0; i < gamma; ++i) blocks *= static_cast<std::size_t>(vocab);
    for (std::size_t b = 0; b < blocks; ++b) {
        std::size_t code = b;
        for (std::size_t i = 0; i < gamma; ++i) {
            x[gamma - 1 - i] = static_cast<token_id>(code % static_cast<std::size_t>(vocab));
            code /= static_cast<std::size_t>(vocab);
        }
        std::vector<std::vector<double>> p, q;
        std::vector<token_id> ctx = context;
        double prob = 1.0;
        for (std::size_t i = 0; i <= gamma; ++i) {
            p.push_back(ref_standardize(target.next_logits(ctx), s));
            if (i < gamma) {
                q.push_back(ref_standardize(draft.next_logits(ctx), s));
                prob *= q[i][static_cast<std::size_t>(x[i])];
                ctx.push_back(x[i]);
            }
        }
        if (prob == 0.0) continue;
        double mean = 0.0;
        if (scheme == verification_scheme::token) {
            double reach = 1.0;
            for (std::size_t i = 0; i < gamma; ++i) {
                const auto xi = static_cast<std::size_t>(x[i]);
                reach *= std::min(1.0, p[i][xi] / q[i][xi]);
                mean += reach;
            }
        } else {
            std::vector<double> h(gamma);
            double w = 1.0;
            for (std::size_t i = 0; i < gamma; ++i) {
                const auto xi = static_cast<std::size_t>(x[i]);
                w = std::min(1.0, w * p[i][xi] / q[i][xi]);
                if (i + 1 < gamma) {
                    double big_r = 0.0;
                    for (int k = 0; k < vocab; ++k)
                        big_r += std::max(0.0, w * p[i + 1][static_cast<std::size_t>(k)] - q[i + 1][static_cast<std::size_t>(k)]);
                    h[i] = big_r > 0.0 ? big_r / (big_r + 1.0 - w) : 0.0;
                } else {
                    h[i] = w;
                }
            }
            for (std::size_t i = 0; i < gamma; ++i) {
                double pi = h[i];
                for (std::size_t j = i + 1; j < gamma; ++j) pi *= 1.0 - h[j];
                mean += static_cast<double>(i + 1) * pi;
            }
        }
        expected += prob * mean;
    }
    return expected;
}

struct step_sample {
    double mean = 0.0;
    double se = 0.0;
};

/// Mean accepted tokens of `trials` steps from a fixed context; trial t uses seed t.
step_sample measure(markov_model& draft, markov_model& target, const std::vector<token_id>& context,
                    std::size_t gamma, const specdec::sampling_config& s, verification_scheme scheme,
                    std::size_t trials, std::vector<double>* per_trial = nullptr) {
    specdec::step_workspace ws;
    double sum = 0.0, sum2 = 0.0;
    for (std::size_t t = 0; t < trials; ++t) {
        std::vector<token_id> seq = context;
        specdec::decode_stats stats;
        std::mt19937_64 rng(t);
        const auto r = specdec::speculative_step(draft, target, seq, stats,
                                                 {.gamma = gamma, .sampling = s, .scheme = scheme}, rng, ws);
        const auto a = static_cast<double>(r.accepted);
        sum += a;
        sum2 += a * a;
        if (per_trial) per_trial->push_back(a);
    }
    const double n = static_cast<double>(trials);
    const double mean = sum / n;
    return {mean, std::sqrt(std::max(0.0, sum2 / n - mean * mean) / n)};
}

}  // namespace

TEST_CASE("Mean accepted tokens per step equals the exact expectation by enumeration, for both schemes",
          "[block][statistical]") {
    // 5 standard errors: a false alarm below 6e-7 per comparison.
    const std::vector<token_id> context{0, 2};
    for (std::uint64_t seed : {1u, 2u, 3u}) {
        auto target = markov_model::random(4, 2, 500 + seed);
        auto draft = markov_model::random(4, 2, 600 + seed);
        for (const specdec::sampling_config s : {specdec::sampling_config{}, specdec::sampling_config{.temperature = 0.7f}}) {
            for (std::size_t gamma : {2u, 3u}) {
                for (const auto scheme : {verification_scheme::token, verification_scheme::block}) {
                    const double exact = exact_expected_accepted(draft, target, context, gamma, s, scheme);
                    const auto m = measure(draft, target, context, gamma, s, scheme, 40000);
                    INFO("seed " << seed << " T " << s.temperature << " gamma " << gamma << " scheme "
                                 << (scheme == verification_scheme::token ? "token" : "block") << ": exact " << exact
                                 << ", measured " << m.mean << " +- " << m.se);
                    CHECK(std::abs(m.mean - exact) < 5.0 * m.se + 1e-12);
                }
            }
        }
    }
}

TEST_CASE("Block verification never expects fewer accepted tokens than token verification", "[block]") {
    // Exact, by enumeration, over 48 random model pairs and settings.
    const std::vector<token_id> context{1, 3};
    int cases = 0, strictly_better = 0;
    for (std::uint64_t seed = 0; seed < 12; ++seed) {
        auto target = markov_model::random(4, 2, 700 + seed, 1.0f + 0.25f * static_cast<float>(seed % 4));
        auto draft = markov_model::random(4, 2, 800 + seed);
        for (const specdec::sampling_config s : {specdec::sampling_config{}, specdec::sampling_config{.temperature = 0.6f}}) {
            for (std::size_t gamma : {2u, 3u}) {
                const double token = exact_expected_accepted(draft, target, context, gamma, s, verification_scheme::token);
                const double block = exact_expected_accepted(draft, target, context, gamma, s, verification_scheme::block);
                INFO("seed " << seed << " gamma " << gamma << ": token " << token << ", block " << block);
                CHECK(block >= token - 1e-12);
                ++cases;
                strictly_better += block > token + 1e-9 ? 1 : 0;
            }
        }
    }
    CHECK(cases == 48);
    CHECK(strictly_better > 0);
}

TEST_CASE("On the same drafts and seeds, block verification accepts at least as many tokens as token verification",
          "[block][statistical]") {
    auto target = markov_model::random(5, 2, 901);
    auto draft = markov_model::random(5, 2, 902);
    const std::vector<token_id> context{0, 1};
    const std::size_t gamma = 4, trials = 40000;
    std::vector<double> token_trials, block_trials;
    measure(draft, target, context, gamma, {}, verification_scheme::token, trials, &token_trials);
    measure(draft, target, context, gamma, {}, verification_scheme::block, trials, &block_trials);
    // Paired differences: trial t drafts the same block under both schemes (same seed).
    double sum = 0.0, sum2 = 0.0;
    for (std::size_t t = 0; t < trials; ++t) {
        const double d = block_trials[t] - token_trials[t];
        sum += d;
        sum2 += d * d;
    }
    const double mean = sum / trials;
    const double se = std::sqrt((sum2 / trials - mean * mean) / trials);
    const double exact_gain = exact_expected_accepted(draft, target, context, gamma, {}, verification_scheme::block) -
                              exact_expected_accepted(draft, target, context, gamma, {}, verification_scheme::token);
    INFO("mean gain " << mean << " +- " << se << ", exact gain " << exact_gain);
    CHECK(exact_gain > 0.0);
    // One-sided, 4 standard errors below zero would be needed to fail (false alarm ~3e-5).
    CHECK(mean > -4.0 * se);
    CHECK(std::abs(mean - exact_gain) < 5.0 * se);
}

TEST_CASE("With gamma = 1 block verification is token verification, draw for draw", "[block]") {
    auto target = markov_model::random(8, 2, 31);
    auto draft = markov_model::random(8, 2, 32);
    const std::vector<token_id> prompt{0};
    for (const specdec::sampling_config s : {specdec::sampling_config{}, specdec::sampling_config{.temperature = 0.5f},
                                             specdec::sampling_config{.top_p = 0.8f}}) {
        for (std::uint64_t seed = 0; seed < 20; ++seed) {
            std::mt19937_64 a(seed), b(seed);
            const auto token = specdec::speculative_decode(
                draft, target, prompt, {.step = specdec::chain{.gamma = 1, .scheme = verification_scheme::token}, .sampling = s, .budget = {.max_new_tokens = 40}}, a);
            const auto block = specdec::speculative_decode(
                draft, target, prompt, {.step = specdec::chain{.gamma = 1, .scheme = verification_scheme::block}, .sampling = s, .budget = {.max_new_tokens = 40}}, b);
            CHECK(token.tokens == block.tokens);
            CHECK(token.stats.accepted_tokens == block.stats.accepted_tokens);
            CHECK(a() == b());  // the generators advanced identically
        }
    }
}

TEST_CASE("Block verification with point-mass drafts and at temperature 0 matches greedy decoding", "[block]") {
    auto target = markov_model::random(12, 2, 41);
    auto draft = markov_model::random(12, 2, 42);
    shift_drafter shift{12, 1};
    const std::vector<token_id> prompt{0, 5};
    std::mt19937_64 g(1);
    const auto greedy = specdec::autoregressive_decode(target, prompt, {.sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 50}}, g);
    for (std::size_t gamma = 1; gamma <= 8; ++gamma) {
        const specdec::decode_options opts{.step = specdec::chain{.gamma = gamma}, .sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 50}};
        CHECK(specdec::speculative_decode(draft, target, prompt, opts, g).tokens == greedy.tokens);
        CHECK(specdec::speculative_decode(shift, target, prompt, opts, g).tokens == greedy.tokens);
    }
}

TEST_CASE("Block verification with one workspace across draft lengths matches fresh workspaces", "[block]") {
    // The workspace keeps per-position scratch from longer drafts; a shorter one after them must
    // decide exactly as with a fresh workspace (same seed, same outcome, same generator state).
    const int vocab = 50;
    std::mt19937_64 g(61);
    std::normal_distribution<float> n(0.0f, 2.0f);
    specdec::verify_workspace shared;
    specdec::sampling_workspace sampling_ws;
    const specdec::sampling_config s{};
    for (const std::size_t gamma : {6u, 2u, 5u, 1u, 3u, 6u}) {
        Eigen::MatrixXf z(vocab, static_cast<Eigen::Index>(gamma) + 1);
        Eigen::MatrixXf q(vocab, static_cast<Eigen::Index>(gamma));
        std::vector<token_id> x(gamma);
        for (Eigen::Index k = 0; k < z.size(); ++k) z.data()[k] = n(g);
        for (std::size_t i = 0; i < gamma; ++i) {
            Eigen::VectorXf logits = z.col(static_cast<Eigen::Index>(i));
            for (Eigen::Index k = 0; k < vocab; ++k) logits[k] += n(g);  // a draft near the target
            Eigen::VectorXf qi(vocab);
            specdec::standardize(logits, s, qi, sampling_ws);
            q.col(static_cast<Eigen::Index>(i)) = qi;
            x[i] = static_cast<token_id>(std::uniform_int_distribution<int>(0, vocab - 1)(g));
        }
        for (std::uint64_t seed = 0; seed < 20; ++seed) {
            std::mt19937_64 a(seed), b(seed);
            specdec::verify_workspace fresh;
            const auto r_shared = specdec::verify(z, x, q, s, a, shared);
            const auto r_fresh = specdec::verify(z, x, q, s, b, fresh);
            INFO("gamma " << gamma << ", seed " << seed);
            CHECK(r_shared.accepted == r_fresh.accepted);
            CHECK(r_shared.next_token == r_fresh.next_token);
            CHECK(a() == b());
        }
    }
}

namespace {

/// P(τ = 0..γ) of block verification for fixed rows p_1..p_{γ+1} (double), draft columns q and
/// tokens x (Sun et al. 2024): h_i = R_i / (R_i + 1 − w_i), h_γ = w_γ, P(τ = i) = h_i Π_{j>i} (1 − h_j).
/// `weight_residual` = false gives the law of a plausible bug (R_i without the factor w_i).
std::vector<double> block_tau_law(const std::vector<std::vector<double>>& p, const Eigen::MatrixXf& q,
                                  const std::vector<token_id>& x, bool weight_residual = true) {
    const std::size_t gamma = x.size();
    std::vector<double> h(gamma), law(gamma + 1, 0.0);
    double w = 1.0;
    for (std::size_t i = 0; i < gamma; ++i) {
        const auto xi = static_cast<std::size_t>(x[i]);
        w = std::min(1.0, w * p[i][xi] / static_cast<double>(q(x[i], static_cast<Eigen::Index>(i))));
        if (i + 1 == gamma) {
            h[i] = w;
            break;
        }
        double big_r = 0.0;
        const double factor = weight_residual ? w : 1.0;
        for (std::size_t k = 0; k < p[i + 1].size(); ++k) {
            const double qk = static_cast<double>(q(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(i + 1)));
            big_r += std::max(0.0, factor * p[i + 1][k] - qk);
        }
        h[i] = big_r / (big_r + 1.0 - w);
    }
    double none = 1.0;
    for (std::size_t i = gamma; i >= 1; --i) {
        law[i] = none * h[i - 1];
        none *= 1.0 - h[i - 1];
    }
    law[0] = none;
    return law;
}

/// The draft token of column i: a token the draft plausibly samples (q >= 1e-4) whose ratio
/// p_i(x) / q_i(x) is closest to `want`, which it must match within 10% (in log).
token_id token_with_ratio(const std::vector<double>& p, const Eigen::MatrixXf& q, Eigen::Index col, double want) {
    token_id x = 0;
    double best = 1e9;
    for (Eigen::Index k = 0; k < q.rows(); ++k) {
        const double qk = static_cast<double>(q(k, col)), pk = p[static_cast<std::size_t>(k)];
        if (qk < 1e-4) continue;
        if (const double miss = std::abs(std::log(pk / qk / want)); miss < best) {
            best = miss;
            x = static_cast<token_id>(k);
        }
    }
    REQUIRE(best < 0.1);
    return x;
}

/// 30000 block verifications of (z, x, q), one seed each: Pearson's chi-square of the accepted
/// length τ = 0..γ against its exact law, at false-alarm rate 1e-4, and the negative control
/// (the law with R_i missing its factor w_i) must fail. Positions 1 and 2 must matter (P > 0.02).
void check_tau_law(const Eigen::MatrixXf& z, const Eigen::MatrixXf& q, const std::vector<token_id>& x,
                   const std::vector<std::vector<double>>& p) {
    constexpr double kFalseAlarm = 1e-4;
    const std::vector<double> law = block_tau_law(p, q, x), wrong = block_tau_law(p, q, x, false);
    INFO("P(tau = 0..3): " << law[0] << " " << law[1] << " " << law[2] << " " << law[3]);
    REQUIRE(law[1] > 0.02);  // positions 1 and 2, which coins (or the pass) decide, matter
    REQUIRE(law[2] > 0.02);
    std::vector<std::size_t> counts(x.size() + 1, 0);
    specdec::verify_workspace ws;
    for (std::uint64_t seed = 0; seed < 30000; ++seed) {
        std::mt19937_64 rng(seed);
        ++counts[specdec::verify(z, x, q, {}, rng, ws).accepted];
    }
    const auto ok = chi_square_test(counts, law);
    INFO("counts " << counts[0] << " " << counts[1] << " " << counts[2] << " " << counts[3] << ": chi2 = "
                   << ok.statistic << ", p = " << ok.p_value);
    CHECK(ok.p_value >= kFalseAlarm);
    const auto control = chi_square_test(counts, wrong);
    INFO("negative control (R_i without w_i): chi2 = " << control.statistic << ", p = " << control.p_value);
    CHECK(control.p_value < kFalseAlarm);
}

/// Target logits of V x (γ + 1), i.i.d. N(0, 2²) from seed 71, and their distributions.
std::pair<Eigen::MatrixXf, std::vector<std::vector<double>>> random_target(Eigen::Index vocab, std::size_t gamma,
                                                                           std::mt19937_64& g) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    Eigen::MatrixXf z(vocab, static_cast<Eigen::Index>(gamma) + 1);
    for (Eigen::Index k = 0; k < z.size(); ++k) z.data()[k] = normal(g);
    std::vector<std::vector<double>> p;
    for (Eigen::Index j = 0; j <= static_cast<Eigen::Index>(gamma); ++j) p.push_back(ref_standardize(z.col(j), {}));
    return {z, p};
}

/// Wanted ratios p_i(x_i) / q_i(x_i): w_1 = 0.55, w_2 = w_1 · 1.3, w_3 = w_2 · 0.8.
constexpr double kWantedRatios[] = {0.55, 1.3, 0.8};

}  // namespace

TEST_CASE("Block verification on long rows has the exact law of the accepted length where only coins decide",
          "[block][statistical]") {
    // Rows of 6000 and 10000 tokens (three and five 2048-token blocks: the rows keep no
    // exponentials). Each draft column is its target row with every pair of tokens 16 apart
    // inside a 256-token chunk swapped: a permutation inside each 16-token lane of the
    // normalizing pass, so that the lane sums of q equal those of p, the lane-level lower bound
    // on R_i is (about) 0, and every test η_i < h_i (i < γ) with η_i < w_i is left open by the
    // bounds. With w_i in [0.4, 0.8] the coins run (at most 1 / (w (1 − w)) <= 5 rounds expected,
    // within budgets of 5 and 9); about 1% of them exhaust the budget of 5, and the pass over
    // the row decides those. Pearson's chi-square over τ = 0..γ at false-alarm rate 1e-4 per
    // size; a negative control (R_i without its factor w_i) must fail.
    const std::size_t gamma = 3;
    for (const Eigen::Index vocab : {6000, 10000}) {
        INFO("V = " << vocab);
        std::mt19937_64 g(71);
        const auto [z, p] = random_target(vocab, gamma, g);
        Eigen::MatrixXf q(vocab, static_cast<Eigen::Index>(gamma));
        auto partner = [](Eigen::Index k) {  // k <-> k ± 16 inside its chunk of 256
            return (k % 256) / 16 % 2 == 0 ? k + 16 : k - 16;
        };
        std::vector<token_id> x(gamma);
        for (std::size_t i = 0; i < gamma; ++i) {
            const auto col = static_cast<Eigen::Index>(i);
            for (Eigen::Index k = 0; k < vocab; ++k) {
                const Eigen::Index other = partner(k);
                q(k, col) = other < vocab ? static_cast<float>(p[i][static_cast<std::size_t>(other)]) : 0.0f;
            }
            q.col(col) /= q.col(col).sum();  // (tokens without a partner at the end lose their mass)
            x[i] = token_with_ratio(p[i], q, col, kWantedRatios[i]);
        }
        check_tau_law(z, q, x, p);
    }
}

TEST_CASE("Block verification on long rows has the exact law of the accepted length with realistic drafts",
          "[block][statistical]") {
    // The case above makes the lane-level lower bound L on R_i zero, so every coin's second
    // event covers its whole excess. Here each draft row is its target row plus N(0, s^2) noise
    // (s = 0.3 and 1.0), as a draft model's would be: lanes differ, L > 0, and the coins must
    // split each token's excess by lane_excess_fraction. (Deciding a coin by the whole excess
    // shifts P(tau = 0) by several points: chi-square in the hundreds at this sample size.)
    // Rows of 6000 tokens, Pearson's chi-square over tau = 0..3 at false-alarm rate 1e-4 per
    // noise level; the negative control (R_i without its factor w_i) must fail.
    const std::size_t gamma = 3;
    const Eigen::Index vocab = 6000;
    for (const float noise : {0.3f, 1.0f}) {
        INFO("noise " << noise);
        std::mt19937_64 g(71);
        const auto [z, p] = random_target(vocab, gamma, g);
        std::normal_distribution<float> normal(0.0f, 2.0f);
        Eigen::MatrixXf q(vocab, static_cast<Eigen::Index>(gamma));
        std::vector<token_id> x(gamma);
        for (std::size_t i = 0; i < gamma; ++i) {
            const auto col = static_cast<Eigen::Index>(i);
            Eigen::VectorXf draft_logits = z.col(col);
            for (Eigen::Index k = 0; k < vocab; ++k) draft_logits[k] += noise * normal(g);
            const std::vector<double> qd = ref_standardize(draft_logits, {});
            for (Eigen::Index k = 0; k < vocab; ++k) q(k, col) = static_cast<float>(qd[static_cast<std::size_t>(k)]);
            x[i] = token_with_ratio(p[i], q, col, kWantedRatios[i]);
        }
        check_tau_law(z, q, x, p);
    }
}

TEST_CASE("Lenience with block verification is rejected with a clear error", "[block][errors]") {
    auto target = markov_model::random(4, 2, 1);
    const std::vector<token_id> prompt{0};
    std::mt19937_64 rng(1);
    CHECK_THROWS_WITH(specdec::speculative_decode(target, target, prompt, {.step = specdec::chain{.lenience = 0.5f}}, rng),
                      contains("token verification only"));
    CHECK_NOTHROW(specdec::speculative_decode(target, target, prompt,
                                              {.step = specdec::chain{.scheme = verification_scheme::token, .lenience = 0.5f}}, rng));
}
