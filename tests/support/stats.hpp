#pragma once
// Goodness-of-fit machinery for the statistical tests: Pearson's chi-square test of observed
// counts against exact probabilities, with the p-value from the regularized upper incomplete
// gamma function Q(k/2, x/2).

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

namespace specdec_test {

/// Regularized lower incomplete gamma P(a, x) by its power series (good for x < a + 1).
inline double gamma_p_series(double a, double x) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 100000; ++n) {
        term *= x / (a + n);
        sum += term;
        if (std::abs(term) < std::abs(sum) * 1e-16) break;
    }
    return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

/// Regularized upper incomplete gamma Q(a, x) by its continued fraction, evaluated with the
/// modified Lentz method (good for x >= a + 1).
inline double gamma_q_fraction(double a, double x) {
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

/// Survival function of the chi-square distribution with k degrees of freedom at x.
inline double chi_square_sf(double x, double k) {
    if (x <= 0.0) return 1.0;
    const double a = k / 2.0, y = x / 2.0;
    return y < a + 1.0 ? 1.0 - gamma_p_series(a, y) : gamma_q_fraction(a, y);
}

struct gof_result {
    double statistic = 0.0;
    std::size_t degrees_of_freedom = 0;
    double p_value = 1.0;
    std::size_t samples = 0;
};

/// Pearson chi-square test of `counts` against `probs`. Cells whose expected count is below
/// 5 are pooled into one cell (so the chi-square approximation holds); a count in a cell of
/// probability 0 makes the p-value 0 at once.
inline gof_result chi_square_test(const std::vector<std::size_t>& counts, const std::vector<double>& probs) {
    if (counts.size() != probs.size()) throw std::invalid_argument("chi_square_test: size mismatch");
    gof_result r;
    for (auto c : counts) r.samples += c;
    const double n = static_cast<double>(r.samples);
    double pooled_expected = 0.0, pooled_observed = 0.0;
    std::size_t cells = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
        const double e = probs[i] * n;
        const double o = static_cast<double>(counts[i]);
        if (probs[i] == 0.0) {
            if (counts[i] != 0) {
                r.statistic = std::numeric_limits<double>::infinity();
                r.p_value = 0.0;
                return r;
            }
            continue;
        }
        if (e < 5.0) {
            pooled_expected += e;
            pooled_observed += o;
            continue;
        }
        r.statistic += (o - e) * (o - e) / e;
        ++cells;
    }
    if (pooled_expected > 0.0) {
        r.statistic += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
        ++cells;
    }
    r.degrees_of_freedom = cells > 0 ? cells - 1 : 0;
    r.p_value = r.degrees_of_freedom == 0 ? 1.0 : chi_square_sf(r.statistic, static_cast<double>(r.degrees_of_freedom));
    return r;
}

}  // namespace specdec_test
