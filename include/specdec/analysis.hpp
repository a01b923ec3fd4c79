#pragma once
/// \file
/// The analysis of Leviathan et al. 2023, Sec. 3, as functions: how well a draft matches
/// the target (D_LK, β), and what to expect for a given acceptance rate α, draft length γ
/// and cost coefficient c.
///
/// Worked example: α = 0.8, c = 0.05 →
/// optimal_gamma(0.8, 0.05) = 8 (Sec. 3.5; there the improvement is 3.09); and at γ = 4:
/// expected_tokens_per_step(0.8, 4) = 3.36 (Eq. 1),
/// expected_walltime_improvement(0.8, 4, 0.05) = 2.80 (Thm. 3.8),
/// expected_operations_factor(0.8, 4, 0.05) = 1.55 (Thm. 3.11),
/// oracle_bound(0.8) = 5 (Sec. 3.5, an oracle choosing γ per step).

#include <Eigen/Core>

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "error.hpp"

namespace specdec {

namespace detail {

inline void check_alpha(double alpha, const char* where) {
    if (!(alpha >= 0.0 && alpha <= 1.0)) fail_invalid(where, ": alpha = ", alpha, " must lie in [0, 1]");
}
inline void check_gamma(std::size_t gamma, const char* where) {
    if (gamma == 0) fail_invalid(where, ": gamma = 0 must be >= 1");
}
inline void check_cost(double c, const char* name, const char* where) {
    if (!(c >= 0.0) || !std::isfinite(c)) fail_invalid(where, ": ", name, " = ", c, " must be finite and >= 0");
}

/// Allowed |Σ p − 1| for the distributions the analysis functions take: the tolerance verify
/// allows a draft column (draft_probability_tolerance), so that rows standardize() wrote in
/// float, whose sums over 100k+ tokens miss 1 by a few 1e-6, are accepted.
inline constexpr double analysis_sum_tolerance = 1e-3;

inline void check_distributions(const Eigen::VectorXd& p, const Eigen::VectorXd& q, const char* where) {
    if (p.size() != q.size())
        fail_invalid(where, ": p has ", p.size(), " entries and q has ", q.size(), "; they must match");
    for (const auto* v : {&p, &q}) {
        const char* name = (v == &p) ? "p" : "q";
        if (((v->array() < 0.0) || !v->array().isFinite()).any())
            fail_invalid(where, ": ", name, " has a negative or non-finite entry");
        if (!(std::abs(v->sum() - 1.0) <= analysis_sum_tolerance))
            fail_invalid(where, ": ", name, " sums to ", v->sum(), ", not 1 (within ", analysis_sum_tolerance, ")");
    }
}

/// A probability vector of any real scalar type (a float row of standardize() as well as an
/// Eigen::VectorXd, an expression, a row or a column) as a column of doubles.
template <class Derived>
Eigen::VectorXd as_double_vector(const Eigen::MatrixBase<Derived>& v, const char* name, const char* where) {
    static_assert(std::is_floating_point_v<typename Derived::Scalar>,
                  "specdec: the analysis functions take vectors of float or double probabilities");
    if (v.rows() != 1 && v.cols() != 1)
        fail_invalid(where, ": ", name, " is a ", v.rows(), " x ", v.cols(), " matrix; a vector is needed");
    return v.template cast<double>().reshaped();
}

/// Eq. 1 without checks: (1 − α^{γ+1}) / (1 − α), as −expm1((γ+1) log α) / (1 − α), which
/// keeps its precision as α approaches 1 (1 − α^{γ+1} would cancel); γ + 1 at α = 1.
inline double tokens_per_step(double alpha, std::size_t gamma) {
    const double n = static_cast<double>(gamma) + 1.0;  // (gamma + 1 would wrap at SIZE_MAX)
    if (alpha == 1.0) return n;
    if (alpha == 0.0) return 1.0;
    return -std::expm1(n * std::log(alpha)) / (1.0 - alpha);
}

}  // namespace detail

/// β = Σ_x min(p(x), q(x)): the probability that speculative sampling accepts a draft token
/// drawn from q when the target is p (Leviathan et al. Def. 3.1, Thm. 3.5).
/// \throws std::invalid_argument if p, q differ in size or are not probability vectors
///         (entries finite and >= 0, summing to 1 within detail::analysis_sum_tolerance = 1e-3).
///
/// p and q are Eigen vectors of float or double (Eigen::VectorXf, Eigen::VectorXd, a row, a
/// column of a matrix or an expression), computed in double; they may differ in scalar type.
template <class P, class Q>
[[nodiscard]] double acceptance_probability(const Eigen::MatrixBase<P>& p, const Eigen::MatrixBase<Q>& q) {
    constexpr const char* where = "specdec::acceptance_probability";
    const Eigen::VectorXd pd = detail::as_double_vector(p, "p", where), qd = detail::as_double_vector(q, "q", where);
    detail::check_distributions(pd, qd, where);
    return pd.cwiseMin(qd).sum();
}

/// D_LK(p, q) = Σ_x |p(x) − M(x)| with M = (p + q)/2, which equals 1 − Σ min(p, q)
/// (Def. 3.2, Lemma 3.3): a symmetric divergence in [0, 1], 0 iff p = q, 1 iff the supports
/// are disjoint.
/// \throws std::invalid_argument if p, q differ in size or are not probability vectors
///         (entries finite and >= 0, summing to 1 within detail::analysis_sum_tolerance = 1e-3).
///
/// p and q are Eigen vectors of float or double, as for acceptance_probability().
template <class P, class Q>
[[nodiscard]] double d_lk(const Eigen::MatrixBase<P>& p, const Eigen::MatrixBase<Q>& q) {
    constexpr const char* where = "specdec::d_lk";
    const Eigen::VectorXd pd = detail::as_double_vector(p, "p", where), qd = detail::as_double_vector(q, "q", where);
    detail::check_distributions(pd, qd, where);
    return 0.5 * (pd - qd).cwiseAbs().sum();
}

/// Expected tokens per step (per target call), Eq. 1: (1 − α^{γ+1}) / (1 − α), assuming
/// i.i.d. acceptances with rate α; γ + 1 when α = 1.
[[nodiscard]] inline double expected_tokens_per_step(double alpha, std::size_t gamma) {
    constexpr const char* where = "specdec::expected_tokens_per_step";
    detail::check_alpha(alpha, where);
    detail::check_gamma(gamma, where);
    return detail::tokens_per_step(alpha, gamma);
}

/// Expected walltime improvement over autoregressive decoding, Thm. 3.8:
/// (1 − α^{γ+1}) / ((1 − α)(γc + 1)), where c is the cost of one draft step relative to one
/// target step.
[[nodiscard]] inline double expected_walltime_improvement(double alpha, std::size_t gamma, double c) {
    constexpr const char* where = "specdec::expected_walltime_improvement";
    detail::check_alpha(alpha, where);
    detail::check_gamma(gamma, where);
    detail::check_cost(c, "c", where);
    return detail::tokens_per_step(alpha, gamma) / (static_cast<double>(gamma) * c + 1.0);
}

/// Expected factor of increase in total arithmetic operations, Thm. 3.11:
/// (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1}), where ĉ is the draft's operations per token relative
/// to the target's.
[[nodiscard]] inline double expected_operations_factor(double alpha, std::size_t gamma, double c_hat) {
    constexpr const char* where = "specdec::expected_operations_factor";
    detail::check_alpha(alpha, where);
    detail::check_gamma(gamma, where);
    detail::check_cost(c_hat, "c_hat", where);
    const double g = static_cast<double>(gamma);
    return (g * c_hat + g + 1.0) / detail::tokens_per_step(alpha, gamma);
}

/// Cor. 3.9: if α > c, some γ gives an improvement, and γ = 1 already gives at least
/// (1 + α)/(1 + c). Returns whether α > c.
[[nodiscard]] inline bool improvement_possible(double alpha, double c) {
    detail::check_alpha(alpha, "specdec::improvement_possible");
    detail::check_cost(c, "c", "specdec::improvement_possible");
    return alpha > c;
}

/// The improvement with γ = 1, (1 + α)/(1 + c): Cor. 3.9's lower bound on the improvement
/// of the best γ (when α > c).
[[nodiscard]] inline double guaranteed_improvement(double alpha, double c) {
    detail::check_alpha(alpha, "specdec::guaranteed_improvement");
    detail::check_cost(c, "c", "specdec::guaranteed_improvement");
    return (1.0 + alpha) / (1.0 + c);
}

/// The γ that maximizes Thm. 3.8's improvement for given α and c (Sec. 3.5), searched over
/// 1..max_gamma; the smallest such γ on ties. With c = 0 (a draft that costs nothing) and
/// α > 0 the improvement grows with every γ, towards 1/(1 − α), so the answer is max_gamma.
[[nodiscard]] inline std::size_t optimal_gamma(double alpha, double c, std::size_t max_gamma = 128) {
    constexpr const char* where = "specdec::optimal_gamma";
    detail::check_alpha(alpha, where);
    detail::check_cost(c, "c", where);
    if (max_gamma == 0) detail::fail_invalid(where, ": max_gamma = 0 must be >= 1");
    // (Without this, the search would stop where the growing improvement saturates a double.)
    if (c == 0.0 && alpha > 0.0) return max_gamma;
    const auto improvement = [&](std::size_t g) {
        return detail::tokens_per_step(alpha, g) / (static_cast<double>(g) * c + 1.0);
    };
    std::size_t best = 1;
    double best_value = improvement(1);
    for (std::size_t g = 2; g <= max_gamma; ++g) {
        const double v = improvement(g);
        if (v > best_value) {
            best_value = v;
            best = g;
        }
    }
    return best;
}

/// Expected tokens per step with an oracle that picks γ per step, 1 / (1 − α) (Sec. 3.5):
/// an upper bound for any fixed γ. Infinite for α = 1.
[[nodiscard]] inline double oracle_bound(double alpha) {
    detail::check_alpha(alpha, "specdec::oracle_bound");
    return 1.0 / (1.0 - alpha);
}

}  // namespace specdec
