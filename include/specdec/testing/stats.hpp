#pragma once
/// \file
/// Goodness-of-fit statistics for distribution tests: Pearson's chi-square test of observed
/// counts against exact probabilities, and the chi-square test of homogeneity of two samples,
/// with p-values from the regularized upper incomplete gamma function Q(k/2, x/2).
///
/// The one implementation shared by the conformance kit (specdec/testing.hpp) and specdec's own
/// distribution suite. Not included by specdec/specdec.hpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "../error.hpp"

namespace specdec::detail {

/// `total` plus the sum of `counts`, exactly, in a std::size_t.
/// \throws std::invalid_argument naming `where` and `what` when the sum does not fit (a
///         std::size_t would wrap silently, and a double total converted back is undefined
///         behaviour from 2^64 on).
inline std::size_t add_counts(std::size_t total, const std::vector<std::size_t>& counts, const char* where,
                              const char* what) {
    constexpr std::size_t most = std::numeric_limits<std::size_t>::max();
    for (const std::size_t c : counts) {
        if (c > most - total)
            fail_invalid(where, ": ", what, " sum to more than a std::size_t holds (", most,
                         "); the test needs the number of samples");
        total += c;
    }
    return total;
}

/// log(1 − p + p·e^t), the cumulant generating function of one Bernoulli(p) draw at t, without
/// overflow for large |t|.
inline double bernoulli_cgf(double p, double t) {
    return t > 0.0 ? t + std::log(p + (1.0 - p) * std::exp(-t)) : std::log1p(p * std::expm1(t));
}
/// Its first derivative, p·e^t / (1 − p + p·e^t), the tilted success probability.
inline double bernoulli_tilted(double p, double t) {
    return t > 0.0 ? p / (p + (1.0 - p) * std::exp(-t)) : p * std::exp(t) / (1.0 - p + p * std::exp(t));
}

/// P(S >= k) for S = Σ_i Bernoulli(probs[i]) (independent), k an integer: the saddlepoint
/// approximation of Lugannani and Rice (1980) with Daniels' (1987) second continuity correction
/// for lattice laws: with K the cumulant generating function of S, t solving K'(t) = k − 1/2,
/// w = sign(t)·sqrt(2(t(k − 1/2) − K(t))) and u = 2 sinh(t/2)·sqrt(K''(t)),
/// P(S >= k) ≈ 1 − Φ(w) − φ(w)(1/w − 1/u). Its relative error stays small far into the tail,
/// where the normal approximation's does not: the skewness of a sum of rare events.
inline double poisson_binomial_upper(const std::vector<double>& probs, double k) {
    double lowest = 0.0, highest = 0.0, mean = 0.0, variance = 0.0;  // S's support and moments
    for (const double p : probs) {
        lowest += p >= 1.0 ? 1.0 : 0.0;
        highest += p > 0.0 ? 1.0 : 0.0;
        mean += p;
        variance += p * (1.0 - p);
    }
    if (k <= lowest) return 1.0;
    if (k > highest) return 0.0;
    const double x = k - 0.5;
    const double sd = std::sqrt(variance);
    // Near the mean the approximation's two terms cancel (t → 0): the normal tail serves there,
    // where the p-value is far from any level a test uses.
    if (std::abs(x - mean) < 0.05 * sd) return 0.5 * std::erfc((x - mean) / (sd * std::sqrt(2.0)));
    const auto slope = [&](double t, double& curvature) {  // K'(t), and K''(t) into curvature
        double d1 = 0.0;
        curvature = 0.0;
        for (const double p : probs) {
            const double a = bernoulli_tilted(p, t);
            d1 += a;
            curvature += a * (1.0 - a);
        }
        return d1;
    };
    // K' increases from `lowest` to `highest`: Newton's method kept inside a bracket of the root.
    double lo = -1.0, hi = 1.0, curvature = 0.0;
    while (slope(lo, curvature) > x && lo > -700.0) lo *= 2.0;
    while (slope(hi, curvature) < x && hi < 700.0) hi *= 2.0;
    double t = x > mean ? hi / 2.0 : lo / 2.0;
    for (int i = 0; i < 200; ++i) {
        const double f = slope(t, curvature) - x;
        if (f > 0.0) hi = t;
        else lo = t;
        double next = curvature > 0.0 ? t - f / curvature : 0.5 * (lo + hi);
        if (!(next > lo && next < hi)) next = 0.5 * (lo + hi);
        if (std::abs(next - t) <= 1e-12 * std::max(1.0, std::abs(t))) {
            t = next;
            break;
        }
        t = next;
    }
    (void)slope(t, curvature);
    double cgf = 0.0;
    for (const double p : probs) cgf += bernoulli_cgf(p, t);
    const double w = std::copysign(std::sqrt(std::max(0.0, 2.0 * (t * x - cgf))), t);
    const double u = 2.0 * std::sinh(0.5 * t) * std::sqrt(curvature);
    constexpr double inv_sqrt_2pi = 0.39894228040143267794;
    const double tail = 0.5 * std::erfc(w / std::sqrt(2.0)) - inv_sqrt_2pi * std::exp(-0.5 * w * w) * (1.0 / w - 1.0 / u);
    return std::clamp(tail, 0.0, 1.0);
}

}  // namespace specdec::detail

namespace specdec::testing {

/// Regularized lower incomplete gamma P(a, x) by its power series (accurate for x < a + 1).
/// \pre a > 0, x >= 0.
[[nodiscard]] inline double gamma_p_series(double a, double x) {
    if (x <= 0.0) return 0.0;
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 100000; ++n) {
        term *= x / (a + n);
        sum += term;
        if (std::abs(term) < std::abs(sum) * 1e-16) break;
    }
    return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

/// Regularized upper incomplete gamma Q(a, x) by its continued fraction, evaluated with the
/// modified Lentz method (accurate for x >= a + 1). \pre a > 0, x > 0.
[[nodiscard]] inline double gamma_q_fraction(double a, double x) {
    constexpr double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 100000; ++i) {
        const double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (std::abs(d) < tiny) d = tiny;
        c = b + an / c;
        if (std::abs(c) < tiny) c = tiny;
        d = 1.0 / d;
        const double delta = d * c;
        h *= delta;
        if (std::abs(delta - 1.0) < 1e-16) break;
    }
    return std::exp(-x + a * std::log(x) - std::lgamma(a)) * h;
}

/// Survival function of the chi-square distribution with k degrees of freedom at x:
/// P(X >= x) = Q(k/2, x/2). \pre k > 0.
[[nodiscard]] inline double chi_square_sf(double x, double k) {
    if (x <= 0.0) return 1.0;
    if (x == std::numeric_limits<double>::infinity()) return 0.0;
    const double a = k / 2.0, y = x / 2.0;
    return y < a + 1.0 ? 1.0 - gamma_p_series(a, y) : gamma_q_fraction(a, y);
}

/// Outcome of a chi-square test.
struct gof_result {
    double statistic = 0.0;              ///< Pearson's X^2
    std::size_t degrees_of_freedom = 0;  ///< cells after pooling, minus one
    double p_value = 1.0;                ///< P(X^2 >= statistic) under the null hypothesis
    std::size_t samples = 0;             ///< observations (both samples, for a two-sample test)
};

/// Two-sided exact p-value of `observed` events where a Poisson law expects `expected` > 0:
/// 2 · min(P(X >= observed), P(X <= observed)), at most 1.
[[nodiscard]] inline double poisson_two_sided_p(double observed, double expected) {
    // P(X >= o) = P(o, λ) (o >= 1), P(X <= o) = Q(o + 1, λ), the regularized incomplete gammas.
    const double upper = observed <= 0.0 ? 1.0
                         : expected < observed + 1.0 ? gamma_p_series(observed, expected)
                                                     : 1.0 - gamma_q_fraction(observed, expected);
    const double lower = chi_square_sf(2.0 * expected, 2.0 * (observed + 1.0));
    return std::min(1.0, 2.0 * std::min(upper, lower));
}

/// Two-sided p-value of `hits` successes in independent Bernoulli trials of success
/// probabilities `probs`: twice the tail on the side of the mean the count lies, at most 1. The
/// tails are saddlepoint approximations (specdec::detail::poisson_binomial_upper), accurate where the
/// normal approximation of the count is not: with a variance of 25 and rare successes, a z-test
/// at level 2e-5 alarms 2 to 4 times as often as its level says (tests/statistical/
/// conformance_test.cpp measures both against the exact binomial law).
[[nodiscard]] inline double poisson_binomial_two_sided_p(const std::vector<double>& probs, double hits) {
    double mean = 0.0;
    for (const double p : probs) mean += p;
    if (hits >= mean) return std::min(1.0, 2.0 * specdec::detail::poisson_binomial_upper(probs, hits));
    // P(S <= k) = P(S' >= n − k), S' counting the failures.
    std::vector<double> failures(probs.size());
    for (std::size_t i = 0; i < probs.size(); ++i) failures[i] = 1.0 - probs[i];
    return std::min(1.0, 2.0 * specdec::detail::poisson_binomial_upper(failures, static_cast<double>(probs.size()) - hits));
}

/// Pearson chi-square test of `counts` against `probs`. Cells whose expected count is below
/// `min_expected` (5 by default) are pooled, so that the chi-square approximation holds:
///  - a pool expected at least `min_expected` times is one more cell of the test;
///  - a smaller pool (rare tokens only) is tested on its own, exactly: its count against a
///    Poisson law, two-sided; the other cells by chi-square given their total (their
///    expected counts scaled to what the pool left); the p-value is twice the smaller of the
///    two (Bonferroni), so the false-alarm rate stays at most the level. A rare token seen far
///    too often is still caught, and one legitimate draw of a token expected 0.02 times no
///    longer adds about 50 to the statistic. `statistic` and `degrees_of_freedom` are then
///    those of the chi-square part.
/// A count in a cell of probability 0 makes the statistic infinite and the p-value 0.
/// \throws std::invalid_argument when the two vectors differ in size, or the counts sum to
///         more than a std::size_t holds.
[[nodiscard]] inline gof_result chi_square_test(const std::vector<std::size_t>& counts,
                                                const std::vector<double>& probs, double min_expected = 5.0) {
    constexpr const char* where = "specdec::testing::chi_square_test";
    if (counts.size() != probs.size())
        specdec::detail::fail_invalid(where, ": counts has ", counts.size(), " cells but probs has ", probs.size());
    gof_result r;
    r.samples = specdec::detail::add_counts(0, counts, where, "the counts");
    const double n = static_cast<double>(r.samples);
    double pooled_expected = 0.0, pooled_observed = 0.0, pooled_prob = 0.0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
        if (probs[i] == 0.0) {
            if (counts[i] != 0) {
                r.statistic = std::numeric_limits<double>::infinity();
                r.p_value = 0.0;
                return r;
            }
            continue;
        }
        if (probs[i] * n < min_expected) {
            pooled_expected += probs[i] * n;
            pooled_observed += static_cast<double>(counts[i]);
            pooled_prob += probs[i];
        }
    }
    const bool pool_alone = pooled_expected > 0.0 && pooled_expected < min_expected;
    // The other cells: against n · p_i, or, beside a pool tested alone, given their total.
    const double scale = pool_alone && pooled_prob < 1.0 ? (n - pooled_observed) / (n * (1.0 - pooled_prob)) : 1.0;
    std::size_t cells = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
        if (probs[i] == 0.0 || probs[i] * n < min_expected) continue;
        const double e = probs[i] * n * scale, o = static_cast<double>(counts[i]);
        if (e > 0.0) r.statistic += (o - e) * (o - e) / e;
        ++cells;
    }
    if (pooled_expected > 0.0 && !pool_alone) {
        r.statistic += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
        ++cells;
    }
    r.degrees_of_freedom = cells > 0 ? cells - 1 : 0;
    r.p_value = r.degrees_of_freedom == 0 ? 1.0 : chi_square_sf(r.statistic, static_cast<double>(r.degrees_of_freedom));
    if (pool_alone) {
        const double pool_p = poisson_two_sided_p(pooled_observed, pooled_expected);
        r.p_value = r.degrees_of_freedom == 0 ? pool_p : std::min(1.0, 2.0 * std::min(r.p_value, pool_p));
    }
    return r;
}

/// Chi-square test of homogeneity: were the counts `a` and `b` (same cells) drawn from one
/// distribution? The 2 x K contingency table test; cells whose expected count in the smaller
/// sample is below `min_expected` are pooled into one cell, and cells empty in both samples are
/// ignored. Degrees of freedom: the cells left, minus one.
/// \throws std::invalid_argument when the two vectors differ in size, or the counts of both
///         samples sum to more than a std::size_t holds.
[[nodiscard]] inline gof_result chi_square_two_sample_test(const std::vector<std::size_t>& a,
                                                           const std::vector<std::size_t>& b,
                                                           double min_expected = 5.0) {
    constexpr const char* where = "specdec::testing::chi_square_two_sample_test";
    if (a.size() != b.size())
        specdec::detail::fail_invalid(where, ": a has ", a.size(), " cells but b has ", b.size());
    gof_result r;
    // Counted exactly in integers (a double total converted back is undefined from 2^64 on,
    // and rounds up to 2^64 just below it).
    r.samples = specdec::detail::add_counts(specdec::detail::add_counts(0, a, where, "the counts of a and b"), b,
                                            where, "the counts of a and b");
    double na = 0.0, nb = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        na += static_cast<double>(a[i]);
        nb += static_cast<double>(b[i]);
    }
    if (na == 0.0 || nb == 0.0) return r;
    const double n = na + nb, small = std::min(na, nb);
    double statistic = 0.0, pa = 0.0, pb = 0.0;
    std::size_t cells = 0;
    // One cell's contribution: sum over both rows of (observed - expected)^2 / expected.
    auto cell = [&](double x, double y) {
        const double t = x + y, ea = t * na / n, eb = t * nb / n;
        statistic += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
        ++cells;
    };
    for (std::size_t i = 0; i < a.size(); ++i) {
        const auto x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
        if (x + y == 0.0) continue;
        if ((x + y) * small / n < min_expected) {
            pa += x;
            pb += y;
            continue;
        }
        cell(x, y);
    }
    if (pa + pb > 0.0) cell(pa, pb);
    r.statistic = statistic;
    r.degrees_of_freedom = cells > 0 ? cells - 1 : 0;
    r.p_value = r.degrees_of_freedom == 0 ? 1.0 : chi_square_sf(r.statistic, static_cast<double>(r.degrees_of_freedom));
    return r;
}

}  // namespace specdec::testing
