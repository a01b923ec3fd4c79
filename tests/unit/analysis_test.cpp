#include "support/catch.hpp"

#include <specdec/analysis.hpp>
#include <specdec/sampling.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>

using specdec_test::contains;

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
    CHECK_FALSE(specdec::improvement_possible(0.3, 0.3));  // alpha = c: W(gamma = 1) = 1, and never more
    CHECK(specdec::guaranteed_improvement(0.5, 0.25) == Approx(1.2));
    for (double alpha : {0.2, 0.3, 0.5, 0.9})
        for (double c : {0.0, 0.05, 0.1, 0.3, 0.6}) {
            INFO("alpha = " << alpha << ", c = " << c);
            const double best = specdec::expected_walltime_improvement(alpha, specdec::optimal_gamma(alpha, c), c);
            // The corollary, both ways: a speedup exists exactly when alpha > c, and then the
            // best gamma achieves at least the guaranteed improvement.
            CHECK(specdec::improvement_possible(alpha, c) == (best > 1.0 + 1e-12));
            if (specdec::improvement_possible(alpha, c))
                CHECK(best >= specdec::guaranteed_improvement(alpha, c) - 1e-12);
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
    // Ties go to the smallest gamma: at alpha = 0 every gamma gives 1 / (gamma c + 1) <= 1.
    CHECK(specdec::optimal_gamma(0.0, 0.0) == 1);
    // A free draft (c = 0) gains with every gamma: the search bound is the answer.
    for (double alpha : {0.3, 0.5, 0.9, 1.0}) CHECK(specdec::optimal_gamma(alpha, 0.0, 200) == 200);
    // The oracle bound is 1/(1 - alpha), the limit of Eq. 1 as gamma grows.
    CHECK(specdec::oracle_bound(0.8) == Approx(5.0));
    CHECK(specdec::oracle_bound(0.0) == 1.0);
    CHECK(std::isinf(specdec::oracle_bound(1.0)));
    CHECK(specdec::expected_tokens_per_step(0.8, 200) == Approx(specdec::oracle_bound(0.8)));
}

TEST_CASE("Eq. 1 keeps its precision near alpha = 1 and for any gamma", "[analysis]") {
    // 1 - alpha^(gamma+1) cancels near alpha = 1; the exact value of sum_{k=0..gamma} alpha^k,
    // summed term by term (no cancellation), is the reference.
    for (double alpha : {0.999999, 1.0 - 1e-9, 0.3}) {
        double sum = 0.0, term = 1.0;
        for (int k = 0; k <= 20; ++k, term *= alpha) sum += term;
        INFO("alpha = " << alpha);
        CHECK(std::abs(specdec::expected_tokens_per_step(alpha, 20) - sum) <= 1e-14 * sum);
    }
    const std::size_t huge = std::numeric_limits<std::size_t>::max();  // gamma + 1 wraps in size_t
    CHECK(specdec::expected_tokens_per_step(0.5, huge) == Approx(2.0));
    CHECK(specdec::expected_tokens_per_step(1.0, huge) == Approx(static_cast<double>(huge) + 1.0));
    CHECK(specdec::expected_operations_factor(1.0, huge, 0.0) == Approx(1.0));
    // Theorem 3.8 and 3.11 at alpha = 1: gamma + 1 tokens per step.
    CHECK(specdec::expected_walltime_improvement(1.0, 4, 0.25) == Approx(2.5));
    CHECK(specdec::expected_operations_factor(1.0, 4, 0.25) == Approx(1.2));
}

TEST_CASE("D_LK accepts distributions whose sums miss 1 as float rows over 100k tokens do", "[analysis]") {
    // standardize() writes float rows; over 32k-131k tokens their sums, widened to double, miss
    // 1 by up to a few 1e-6. Such a row must be accepted.
    const Eigen::Index n = 131072;
    const Eigen::VectorXd u = Eigen::VectorXd::Constant(n, 1.0 / static_cast<double>(n));
    Eigen::VectorXd p = u;
    p.head(n / 2) *= 1.5;
    p.tail(n / 2) *= 0.5 * (1.0 + 8e-6);  // sums to 1 + 4e-6
    CHECK(specdec::d_lk(p, u) == Approx(0.25));
    CHECK(specdec::acceptance_probability(p, u) == Approx(0.75));
}

TEST_CASE("The analysis functions reject out-of-range arguments", "[analysis][errors]") {
    CHECK_THROWS_AS(specdec::expected_tokens_per_step(1.5, 3), std::invalid_argument);
    CHECK_THROWS_AS(specdec::expected_tokens_per_step(0.5, 0), std::invalid_argument);
    CHECK_THROWS_AS(specdec::expected_walltime_improvement(0.5, 3, -0.1), std::invalid_argument);
    CHECK_THROWS_AS(specdec::expected_operations_factor(0.5, 3, std::nan("")), std::invalid_argument);
    CHECK_THROWS_AS(specdec::oracle_bound(-0.1), std::invalid_argument);
    // Each function names itself.
    CHECK_THROWS_WITH(specdec::optimal_gamma(1.5, 0.1), contains("specdec::optimal_gamma: alpha = 1.5"));
    CHECK_THROWS_WITH(specdec::optimal_gamma(0.5, -1.0), contains("specdec::optimal_gamma: c = -1"));
    CHECK_THROWS_WITH(specdec::optimal_gamma(0.5, 0.1, 0), contains("max_gamma = 0"));
    CHECK_THROWS_WITH(specdec::expected_operations_factor(0.5, 0, 0.1),
                      contains("specdec::expected_operations_factor: gamma = 0"));
    CHECK_THROWS_WITH(specdec::expected_walltime_improvement(2.0, 3, 0.1),
                      contains("specdec::expected_walltime_improvement: alpha = 2"));
    CHECK_THROWS_WITH(specdec::improvement_possible(0.5, -0.1), contains("specdec::improvement_possible"));
    CHECK_THROWS_WITH(specdec::guaranteed_improvement(-0.5, 0.1), contains("specdec::guaranteed_improvement"));
    Eigen::VectorXd p = Eigen::VectorXd::Constant(4, 0.25), q = p;
    q[0] += 2e-3;  // sums to 1.002
    CHECK_THROWS_WITH(specdec::d_lk(p, q), contains("q sums to"));
}

TEST_CASE("D_LK and beta take float vectors, expressions and rows as well as Eigen::VectorXd", "[analysis]") {
    Eigen::VectorXd pd(4), qd(4);
    pd << 0.1, 0.2, 0.3, 0.4;
    qd << 0.25, 0.25, 0.25, 0.25;
    const Eigen::VectorXf pf = pd.cast<float>(), qf = qd.cast<float>();
    const double expected = specdec::d_lk(pd, qd);
    CHECK(expected == Approx(0.2));
    CHECK(specdec::d_lk(pf, qf) == Approx(expected).epsilon(1e-6));
    CHECK(specdec::d_lk(pf, qd) == Approx(expected).epsilon(1e-6));  // mixed scalar types
    CHECK(specdec::acceptance_probability(pf, qf) == Approx(1.0 - expected).epsilon(1e-6));
    // An expression, a matrix column and a row vector.
    const Eigen::VectorXf twice = 2.0f * pf;
    CHECK(specdec::d_lk(0.5f * twice, qf) == Approx(expected).epsilon(1e-6));
    Eigen::MatrixXf m(4, 2);
    m.col(0) = pf;
    m.col(1) = qf;
    CHECK(specdec::acceptance_probability(m.col(0), m.col(1)) == Approx(1.0 - expected).epsilon(1e-6));
    CHECK(specdec::d_lk(pf.transpose(), qf.transpose()) == Approx(expected).epsilon(1e-6));
    // standardize()'s output can be passed as it is.
    Eigen::VectorXf z(4), p(4), q(4);
    z << 1.0f, 2.0f, 0.5f, -1.0f;
    specdec::sampling_workspace ws;
    specdec::standardize(z, {}, p, ws);
    specdec::standardize(z, {.temperature = 2.0f}, q, ws);
    CHECK(specdec::acceptance_probability(p, q) == Approx(p.cwiseMin(q).cast<double>().sum()).epsilon(1e-6));
    // A matrix is not a distribution.
    CHECK_THROWS_WITH(specdec::d_lk(m, m), contains("specdec::d_lk: p is a 4 x 2 matrix; a vector is needed"));
    const Eigen::VectorXf bad = Eigen::VectorXf::Constant(4, 0.5f);
    CHECK_THROWS_WITH(specdec::acceptance_probability(pf, bad), contains("q sums to 2"));
}
