#pragma once
// Lines of specdec-generate's summary that interpret a run's statistics: acceptance rates only
// where enough draft positions were tested to mean something, and, when the adaptive policy
// kept speculation off for most steps, why (the measured costs against Leviathan et al. 2023,
// Eq. 1 and Thm. 3.8).

#include <specdec/adaptive_gamma.hpp>
#include <specdec/analysis.hpp>
#include <specdec/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>

namespace llama2 {

/// Fewer tested draft positions than this, and an acceptance rate is not shown: with 30
/// Bernoulli trials at α = 0.7 its standard error is already 0.08.
inline constexpr std::size_t min_positions_for_alpha = 30;

/// Draft positions that acceptance tests were made on (what decode_stats::acceptance_rate()
/// divides by).
[[nodiscard]] inline std::size_t tested_positions(const specdec::decode_stats& st) noexcept {
    return st.accepted_tokens + st.rejected_tokens;
}

/// Draft positions with a β estimate (what decode_stats::estimated_acceptance() divides by).
[[nodiscard]] inline std::size_t estimated_positions(const specdec::decode_stats& st) noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < st.expected_accepted_at_position.size() && i < st.reached_at_position.size(); ++i)
        n += st.reached_at_position[i];
    return n;
}

/// "0.712", or "n/a (only N positions tested)" when fewer than min_positions_for_alpha were.
[[nodiscard]] inline std::string alpha_text(double alpha, std::size_t tested) {
    char buf[64];
    if (tested < min_positions_for_alpha)
        std::snprintf(buf, sizeof buf, "n/a (only %zu position%s tested)", tested, tested == 1 ? "" : "s");
    else
        std::snprintf(buf, sizeof buf, "%.3f", alpha);
    return buf;
}

/// When the adaptive policy chose γ = 0 (a plain target step) for more than half of the steps,
/// one line saying why, from the controller that made the choices:
/// - c, what one drafted token adds to a step against a plain target step (its draft call and
///   one more position in the target's pass): (cost(γ = 1) − cost(γ = 0)) / cost(γ = 0), Thm.
///   3.8's c under its own cost model (a step of γ drafted tokens costs γc + 1 target steps);
/// - the best speedup Eq. 1 / Thm. 3.8 predict over γ = 1..gamma_max,
///   (1 − α^{γ+1}) / (1 − α) / (γc + 1), at the α estimated from the run when enough positions
///   were tested, otherwise at the α the policy itself used (its estimate of the first
///   position, weighted towards 1/2 while seen few times).
/// std::nullopt otherwise, or when the controller has no cost for a plain step.
[[nodiscard]] inline std::optional<std::string> speculation_off_reason(const specdec::decode_stats& st,
                                                                       const specdec::gamma_controller& controller) {
    const std::size_t off = st.steps_at_gamma.empty() ? 0 : st.steps_at_gamma[0];
    if (st.steps == 0 || 2 * off <= st.steps) return std::nullopt;
    const double plain = controller.expected_cost(0), one = controller.expected_cost(1);
    if (!(plain > 0.0) || !std::isfinite(one)) return std::nullopt;
    const double c = std::max(0.0, (one - plain) / plain);
    const std::size_t positions = estimated_positions(st);
    const bool alpha_known = positions >= min_positions_for_alpha;
    // (expected_tokens(1) = 1 + the policy's α at the first draft position.)
    const double alpha =
        std::clamp(alpha_known ? st.estimated_acceptance() : controller.expected_tokens(1) - 1.0, 0.0, 1.0);
    const std::size_t best = specdec::optimal_gamma(alpha, c, controller.gamma_max());
    const double speedup = specdec::expected_walltime_improvement(alpha, best, c);

    std::string line = "speculation off in " + std::to_string(off) + " of " + std::to_string(st.steps) + " steps: ";
    char buf[512];
    if (controller.measures_time())
        std::snprintf(buf, sizeof buf,
                      "a drafted token costs c = %.2f target steps (as the policy timed it: %.1f us more than a "
                      "%.1f us plain target step, for its draft call and one more position in the target's pass); ",
                      c, (one - plain) * 1e6, plain * 1e6);
    else
        std::snprintf(buf, sizeof buf, "a drafted token costs c = %.2f target steps; ", c);
    line += buf;
    if (alpha_known)
        std::snprintf(buf, sizeof buf, "at alpha %.3f, Eq. 1 / Thm 3.8 predict at best %.2fx (gamma %zu)", alpha,
                      speedup, best);
    else
        std::snprintf(buf, sizeof buf,
                      "alpha %s; at the policy's %.2f (weighted towards 1/2 while seen few times), Eq. 1 / Thm 3.8 "
                      "predict at best %.2fx (gamma %zu)",
                      alpha_text(0.0, positions).c_str(), alpha, speedup, best);
    line += buf;
    line += speedup < 1.005 ? ", so drafting does not pay"
                           : "; the policy also counts what the draft model pays to catch up on the tokens of the "
                             "plain steps before it drafts again";
    return line;
}

}  // namespace llama2
