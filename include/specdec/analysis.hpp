#pragma once
/// \file
/// The analysis of Leviathan et al. 2023, Sec. 3, as functions: how well a draft matches
/// the target (D_LK, β), and what to expect for a given acceptance rate α, draft length γ
/// and cost coefficient c.
///
/// Worked example: α = 0.8, c = 0.05 →
/// optimal_gamma(0.8, 0.05) = 4 (Sec. 3.5),
/// expected_tokens_per_step(0.8, 4) = 3.36 (Eq. 1),
/// expected_walltime_improvement(0.8, 4, 0.05) = 2.80 (Thm. 3.8),
/// expected_operations_factor(0.8, 4, 0.05) = 1.55 (Thm. 3.11),
/// oracle_bound(0.8) = 5 (Sec. 3.5, an oracle choosing γ per step).

#include <Eigen/Core>

#include <cmath>
#include <cstddef>

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

inline void check_distributions(const Eigen::Ref<const Eigen::VectorXd>& p, const Eigen::Ref<const Eigen::VectorXd>& q,
                                const char* where) {
    if (p.size() != q.size())
        fail_invalid(where, ": p has ", p.size(), " entries and q has ", q.size(), "; they must match");
    for (const auto* v : {&p, &q}) {
        const char* name = (v == &p) ? "p" : "q";
        if (((v->array() < 0.0) || !v->array().isFinite()).any())
            fail_invalid(where, ": ", name, " has a negative or non-finite entry");
        if (std::abs(v->sum() - 1.0) > 1e-6) fail_invalid(where, ": ", name, " sums to ", v->sum(), ", not 1");
    }
}

}  // namespace detail

/// β = Σ_x min(p(x), q(x)): the probability that speculative sampling accepts a draft token
/// drawn from q when the target is p (Leviathan et al. Def. 3.1, Thm. 3.5).
/// \throws std::invalid_argument if p, q differ in size or are not probability vectors.
[[nodiscard]] inline double acceptance_probability(const Eigen::Ref<const Eigen::VectorXd>& p,
                                                   const Eigen::Ref<const Eigen::VectorXd>& q) {
    detail::check_distributions(p, q, "specdec::acceptance_probability");
    return p.cwiseMin(q).sum();
}

/// D_LK(p, q) = Σ_x |p(x) − M(x)| with M = (p + q)/2, which equals 1 − Σ min(p, q)
/// (Def. 3.2, Lemma 3.3): a symmetric divergence in [0, 1], 0 iff p = q, 1 iff the supports
/// are disjoint.
/// \throws std::invalid_argument if p, q differ in size or are not probability vectors.
[[nodiscard]] inline double d_lk(const Eigen::Ref<const Eigen::VectorXd>& p, const Eigen::Ref<const Eigen::VectorXd>& q) {
    detail::check_distributions(p, q, "specdec::d_lk");
    return 0.5 * (p - q).cwiseAbs().sum();
}

/// Expected tokens per step (per target call), Eq. 1: (1 − α^{γ+1}) / (1 − α), assuming
/// i.i.d. acceptances with rate α; γ + 1 when α = 1.
[[nodiscard]] inline double expected_tokens_per_step(double alpha, std::size_t gamma) {
    constexpr const char* where = "specdec::expected_tokens_per_step";
    detail::check_alpha(alpha, where);
    detail::check_gamma(gamma, where);
    if (alpha == 1.0) return static_cast<double>(gamma + 1);
    return (1.0 - std::pow(alpha, static_cast<double>(gamma + 1))) / (1.0 - alpha);
}

/// Expected walltime improvement over autoregressive decoding, Thm. 3.8:
/// (1 − α^{γ+1}) / ((1 − α)(γc + 1)), where c is the cost of one draft step relative to one
/// target step.
[[nodiscard]] inline double expected_walltime_improvement(double alpha, std::size_t gamma, double c) {
    detail::check_cost(c, "c", "specdec::expected_walltime_improvement");
    return expected_tokens_per_step(alpha, gamma) / (static_cast<double>(gamma) * c + 1.0);
}

/// Expected factor of increase in total arithmetic operations, Thm. 3.11:
/// (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1}), where ĉ is the draft's operations per token relative
/// to the target's.
[[nodiscard]] inline double expected_operations_factor(double alpha, std::size_t gamma, double c_hat) {
    detail::check_cost(c_hat, "c_hat", "specdec::expected_operations_factor");
    const double g = static_cast<double>(gamma);
    return (g * c_hat + g + 1.0) / expected_tokens_per_step(alpha, gamma);
}

/// Cor. 3.9: if α > c, some γ gives an improvement, and γ = 1 already gives at least
/// (1 + α)/(1 + c). Returns whether α > c.
[[nodiscard]] inline bool improvement_possible(double alpha, double c) {
    detail::check_alpha(alpha, "specdec::improvement_possible");
    detail::check_cost(c, "c", "specdec::improvement_possible");
    return alpha > c;
}

/// The lower bound of Cor. 3.9 on the improvement with γ = 1: (1 + α)/(1 + c).
[[nodiscard]] inline double guaranteed_improvement(double alpha, double c) {
    detail::check_alpha(alpha, "specdec::guaranteed_improvement");
    detail::check_cost(c, "c", "specdec::guaranteed_improvement");
    return (1.0 + alpha) / (1.0 + c);
}

/// The γ that maximizes Thm. 3.8's improvement for given α and c (Sec. 3.5), searched over
/// 1..max_gamma; the smallest such γ on ties.
[[nodiscard]] inline std::size_t optimal_gamma(double alpha, double c, std::size_t max_gamma = 128) {
    detail::check_gamma(max_gamma, "specdec::optimal_gamma");
    std::size_t best = 1;
    double best_value = expected_walltime_improvement(alpha, 1, c);
    for (std::size_t g = 2; g <= max_gamma; ++g) {
        const double v = expected_walltime_improvement(alpha, g, c);
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
