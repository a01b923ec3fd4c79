#include "support/catch.hpp"

#include <specdec/analysis.hpp>

#include <cmath>
#include <stdexcept>

namespace {
double round_to(double x, int digits) {
    const double s = std::pow(10.0, digits);
    return std::round(x * s) / s;
}
}  // namespace

TEST_CASE("The analysis reproduces Table 1 of Leviathan et al. (c = c_hat = 0)", "[analysis]") {
    struct row {
        double alpha;
        std::size_t gamma;
        double operations, speed;
    };
    // Leviathan et al. 2023, Table 1 (printed to two decimals).
    const row table1[] = {{0.6, 2, 1.53, 1.96}, {0.7, 3, 1.58, 2.53}, {0.8, 2, 1.23, 2.44},
                          {0.8, 5, 1.63, 3.69}, {0.9, 2, 1.11, 2.71}, {0.9, 10, 1.60, 6.86}};
    for (const auto& r : table1) {
        INFO("alpha = " << r.alpha << ", gamma = " << r.gamma);
        CHECK(round_to(specdec::expected_operations_factor(r.alpha, r.gamma, 0.0), 2) == Approx(r.operations));
        CHECK(round_to(specdec::expected_walltime_improvement(r.alpha, r.gamma, 0.0), 2) == Approx(r.speed));
    }
}

TEST_CASE("The analysis reproduces the EXP column of Table 4 of Leviathan et al.", "[analysis]") {
    struct row {
        std::size_t gamma;
        double alpha, c, expected;
    };
    // Leviathan et al. 2023, Table 4: gamma, alpha, c, EXP (one decimal).
    const row table4[] = {{7, 0.75, 0.02, 3.2}, {7, 0.8, 0.04, 3.3},  {7, 0.82, 0.11, 2.5}, {7, 0.62, 0.02, 2.3},
                          {5, 0.68, 0.04, 2.4}, {3, 0.71, 0.11, 2.0}, {5, 0.65, 0.02, 2.4}, {5, 0.73, 0.04, 2.6},
                          {3, 0.74, 0.11, 2.0}, {5, 0.53, 0.02, 1.9}, {3, 0.55, 0.04, 1.8}, {3, 0.56, 0.11, 1.6}};
    // The paper prints alpha and c to two decimals and EXP to one. Reproducing EXP means: the
    // printed EXP lies within 0.05 of Thm. 3.8 evaluated somewhere in the rounding box
    // alpha +- 0.005, c +- 0.005 (the formula is increasing in alpha and decreasing in c).
    for (const auto& r : table4) {
        INFO("alpha = " << r.alpha << ", gamma = " << r.gamma << ", c = " << r.c);
        const double lo = specdec::expected_walltime_improvement(r.alpha - 0.005, r.gamma, r.c + 0.005);
        const double hi = specdec::expected_walltime_improvement(r.alpha + 0.005, r.gamma, r.c - 0.005);
        CHECK(r.expected >= lo - 0.05);
        CHECK(r.expected <= hi + 0.05);
        // And at the printed values themselves the formula is within 0.07 of EXP.
        CHECK(std::abs(specdec::expected_walltime_improvement(r.alpha, r.gamma, r.c) - r.expected) < 0.07);
    }
}

TEST_CASE("Eq. 1 has its limits: one token at alpha 0, gamma + 1 at alpha 1", "[analysis]") {
    CHECK(specdec::expected_tokens_per_step(0.0, 5) == Approx(1.0));
    CHECK(specdec::expected_tokens_per_step(1.0, 5) == Approx(6.0));
    CHECK(specdec::expected_tokens_per_step(0.8, 5) == Approx(3.68928));
    CHECK(specdec::expected_tokens_per_step(0.999999, 5) == Approx(6.0).epsilon(1e-4));
}

TEST_CASE("D_LK and beta: symmetric, 0 for equal distributions, 1 for disjoint supports", "[analysis]") {
    Eigen::VectorXd p(4), q(4), r(4);
    p << 0.5, 0.5, 0.0, 0.0;
    q << 0.0, 0.0, 0.25, 0.75;
    r << 0.25, 0.25, 0.25, 0.25;
    CHECK(specdec::d_lk(p, p) == Approx(0.0));
    CHECK(specdec::d_lk(p, q) == Approx(1.0));
    CHECK(specdec::d_lk(p, r) == Approx(specdec::d_lk(r, p)));
    CHECK(specdec::d_lk(p, r) == Approx(0.5));
    // Lemma 3.3 / Thm. 3.5: beta = 1 - D_LK.
    CHECK(specdec::acceptance_probability(p, r) == Approx(1.0 - specdec::d_lk(p, r)));
    CHECK(specdec::acceptance_probability(q, r) == Approx(0.5));
    Eigen::VectorXd bad(4);
    bad << 0.5, 0.6, 0.0, 0.0;
    CHECK_THROWS_AS(specdec::d_lk(p, bad), std::invalid_argument);
    CHECK_THROWS_AS(specdec::acceptance_probability(p, Eigen::VectorXd::Constant(3, 1.0 / 3)), std::invalid_argument);
}

TEST_CASE("Corollary 3.9: alpha > c admits a speedup, at least (1 + alpha)/(1 + c) with gamma 1", "[analysis]") {
    CHECK(specdec::improvement_possible(0.5, 0.1));
    CHECK_FALSE(specdec::improvement_possible(0.1, 0.5));
    for (double alpha : {0.2, 0.5, 0.9})
        for (double c : {0.0, 0.05, 0.1}) {
            if (!specdec::improvement_possible(alpha, c)) continue;
            CHECK(specdec::expected_walltime_improvement(alpha, 1, c) >= specdec::guaranteed_improvement(alpha, c) - 1e-12);
            CHECK(specdec::expected_walltime_improvement(alpha, specdec::optimal_gamma(alpha, c), c) > 1.0);
        }
}

TEST_CASE("The optimal gamma maximizes Theorem 3.8 and the oracle bound exceeds every gamma", "[analysis]") {
    // Sec. 3.5 / Figure 3: optimal gamma grows with alpha and shrinks with c.
    CHECK(specdec::optimal_gamma(0.8, 0.05) == 8);
    CHECK(specdec::expected_walltime_improvement(0.8, 8, 0.05) == Approx(3.092).epsilon(1e-3));
    for (double alpha : {0.5, 0.7, 0.9})
        for (double c : {0.01, 0.05, 0.2}) {
            const std::size_t g = specdec::optimal_gamma(alpha, c);
            for (std::size_t k = 1; k <= 40; ++k)
                CHECK(specdec::expected_walltime_improvement(alpha, k, c) <=
                      specdec::expected_walltime_improvement(alpha, g, c) + 1e-12);
            CHECK(specdec::oracle_bound(alpha) > specdec::expected_tokens_per_step(alpha, g));
        }
    CHECK(specdec::optimal_gamma(0.9, 0.01) > specdec::optimal_gamma(0.6, 0.01));
    CHECK(specdec::optimal_gamma(0.8, 0.01) >= specdec::optimal_gamma(0.8, 0.2));
}

TEST_CASE("The analysis functions reject out-of-range arguments", "[analysis][errors]") {
    CHECK_THROWS_AS(specdec::expected_tokens_per_step(1.5, 3), std::invalid_argument);
    CHECK_THROWS_AS(specdec::expected_tokens_per_step(0.5, 0), std::invalid_argument);
    CHECK_THROWS_AS(specdec::expected_walltime_improvement(0.5, 3, -0.1), std::invalid_argument);
    CHECK_THROWS_AS(specdec::expected_operations_factor(0.5, 3, std::nan("")), std::invalid_argument);
    CHECK_THROWS_AS(specdec::oracle_bound(-0.1), std::invalid_argument);
}
