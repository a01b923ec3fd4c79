#pragma once
/// \file
/// Choosing γ from measurements: the draft length that maximizes expected tokens per unit of
/// time, from online estimates of the acceptance at each draft position and of what a draft
/// token and a target pass cost (Leviathan et al. 2023, §3.5 and Thm. 3.8, with α allowed to
/// vary with the position). γ = 0 is a plain target step, so speculation that does not pay
/// is switched off.
///
/// Exactness: the controller sees only what earlier steps produced (their acceptance
/// estimates and timings), never the rows of the step it chooses for, so each step is an
/// ordinary exact step with a γ fixed in advance, and the output keeps the target's
/// distribution (tests/distribution_test.cpp covers it under both schemes).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "error.hpp"

namespace specdec {

/// How speculative_decode chooses γ for each step.
enum class gamma_policy {
    /// decode_options::gamma at every step (the default; no timing, no estimates).
    fixed,
    /// Before each step, the γ in [0, decode_options::gamma] that maximizes expected tokens
    /// per unit of time, from the estimates of a gamma_controller.
    adaptive,
};

/// Settings of the adaptive policy.
struct adaptive_gamma_options {
    /// Exploration: after this many steps at the chosen γ, one step uses a neighbouring γ
    /// (one more, or one less at the top of the range), so that the estimates of lengths not
    /// in use stay fresh. Each time such a step leaves the choice unchanged the interval
    /// doubles, up to max_explore_every; a change of the choice resets it. 0: never explore.
    std::size_t explore_every = 16;
    /// The longest interval between exploring steps.
    std::size_t max_explore_every = 256;
    /// Exploring costs time: a step at a γ other than the best one makes fewer tokens per
    /// unit of time, and a draft model idle during plain target steps (γ = 0) must first
    /// catch up on the tokens it missed (about one draft step each). A step explores only
    /// while the predicted cost of all exploring steps so far, this one included, stays
    /// within this fraction of the predicted cost of all steps. So a pair for which
    /// speculation does not pay, with a draft as slow as its target, soon stops exploring
    /// and decodes at about the target's speed, while a cheap drafter keeps being tried.
    double explore_budget = 0.05;
    /// Estimates are running means of their first `window` observations, then exponential
    /// moving averages with weight 1 / window, so that they follow a text whose
    /// predictability changes. A time above 3x its estimate (after 4 observations) counts as
    /// 3x: a step that another process preempted does not swing the estimates. \pre window >= 1.
    std::size_t window = 32;
    /// The choice shrinks each position's acceptance estimate with this many
    /// pseudo-observations, (n·α̂ + w·prior) / (n + w) after n observations, where the prior is
    /// 1/2 for the first draft position and the (shrunk) estimate of the position before for
    /// the others. So the first few steps cannot switch speculation off for good (two rejected
    /// warm-up drafts would otherwise estimate α = 0, and a policy at γ = 0 observes no more
    /// drafts), and a deep position seen a few times leans on the shallower ones. 0: none.
    double prior_weight = 2.0;
    /// Cost of drafting n tokens, in any unit (the same as pass_cost's). Set both pass_cost
    /// and draft_cost to use known costs; then nothing is timed. Empty: measured with a steady
    /// clock around the drafter's calls (seconds).
    std::function<double(std::size_t drafted)> draft_cost{};
    /// Cost of one target pass over m positions (m = γ + 1), same unit as draft_cost. Empty:
    /// measured with a steady clock around the verifier's calls.
    std::function<double(std::size_t positions)> pass_cost{};
};

namespace detail {

/// A running mean over the last `window` observations (all of them until there are that many).
struct running_estimate {
    double value = 0.0;
    std::size_t count = 0;
    /// A time: after a few observations, one above 3x a positive estimate counts as 3x, so that
    /// a step another process preempted does not swing the estimate. (An estimate of 0, as
    /// from a few steps that cost nothing extra, caps nothing: 3x 0 would hold it at 0 forever.)
    void add_time(double x, std::size_t window) {
        if (count >= 4 && value > 0.0) x = std::min(x, 3.0 * value);
        add(x, window);
    }
    void add(double x, std::size_t window) {
        ++count;
        const double w = 1.0 / static_cast<double>(std::min(count, window));
        value += w * (x - value);
    }
};

}  // namespace detail

/// Estimates and choice of the adaptive γ policy. speculative_decode makes one per call;
/// pass your own through decode_options::controller to keep its estimates across calls
/// (successive requests of one model pair, say). Not thread-safe: one controller per
/// decoding loop.
///
/// The model (Leviathan et al. 2023, Eq. 1 generalized): with α_i the acceptance at draft
/// position i, E[tokens | γ] = Σ_{k=0..γ} Π_{i=1..k} α_i, and a step costs
/// γ·t_draft + t_pass(γ+1) + t_step (verification and the library's own work). α_i is
/// estimated from β_i = Σ_x min(p_i(x), q_i(x)) (Def. 3.1) of every row verification tested,
/// which has far less variance than counting accepts and is valid under both schemes; the
/// formula is token verification's, so under block verification (which accepts at least as
/// many tokens) it is conservative. A position never observed takes the estimate of the
/// deepest one observed. t_pass at a length not measured is interpolated linearly between
/// measured lengths (extrapolated with the slope of the nearest two; proportionally to m from
/// a single one).
class gamma_controller {
public:
    /// \param gamma_max  the longest draft to consider (>= 1)
    /// \throws std::invalid_argument for gamma_max = 0, window = 0, or only one of the two
    ///         cost callbacks set.
    explicit gamma_controller(std::size_t gamma_max, adaptive_gamma_options options = {})
        : options_(std::move(options)), gamma_max_(gamma_max), explore_interval_(options_.explore_every) {
        constexpr const char* where = "specdec::gamma_controller";
        if (gamma_max == 0) detail::fail_invalid(where, ": gamma_max = 0; at least 1 is needed");
        if (options_.window == 0) detail::fail_invalid(where, ": window = 0; at least 1 is needed");
        if (!(options_.prior_weight >= 0.0 && std::isfinite(options_.prior_weight)))
            detail::fail_invalid(where, ": prior_weight = ", options_.prior_weight, " must be finite and >= 0");
        if (!(options_.explore_budget >= 0.0 && options_.explore_budget <= 1.0))
            detail::fail_invalid(where, ": explore_budget = ", options_.explore_budget, " must lie in [0, 1]");
        if (static_cast<bool>(options_.draft_cost) != static_cast<bool>(options_.pass_cost))
            detail::fail_invalid(where, ": set both draft_cost and pass_cost (known costs), or neither (measured)");
        alpha_.assign(gamma_max_, estimate{});
        pass_.assign(gamma_max_ + 1, estimate{});
        chosen_.assign(gamma_max_ + 1, 0);
    }

    /// The longest draft considered.
    [[nodiscard]] std::size_t gamma_max() const noexcept { return gamma_max_; }
    /// True when costs are measured (no cost callbacks were given).
    [[nodiscard]] bool measures_time() const noexcept { return !options_.pass_cost; }

    /// The γ for the next step, at most `limit` (the tokens still needed minus one).
    /// Warm-up when costs are measured: γ = 1 until a draft token and a 2-position pass are
    /// timed (twice: a decoding call's first step also reads the prompt, and is not timed), then
    /// γ = 0 once; with known costs, γ = 1 once (a first α_1). Afterwards the best γ, or a
    /// neighbour on exploring steps.
    std::size_t choose(std::size_t limit = std::numeric_limits<std::size_t>::max()) {
        const std::size_t top = std::min(gamma_max_, limit);
        std::size_t g;
        if (top == 0) {
            g = 0;
        } else if (alpha_[0].count == 0 || (measures_time() && (draft_.count == 0 || pass_[1].count == 0) &&
                                            drafted_steps_ < 4)) {
            g = 1;  // nothing known about acceptance yet, or no clean timing of a draft token
        } else if (measures_time() && pass_[0].count == 0) {
            g = 0;
        } else {
            std::size_t best = best_gamma(top);
            // A draft model idle during plain steps first catches up on the tokens it missed:
            // resume speculating only if that pays within the tokens still to be generated.
            if (best > 0 && lag_ > 0 && measures_time()) {
                const double left = static_cast<double>(limit) + 1.0;
                const double resume = static_cast<double>(lag_) * catch_up_per_token() +
                                      left * expected_cost(best) / expected_tokens(best);
                if (resume >= left * expected_cost(0)) best = 0;
            }
            if (best != last_best_) {
                explore_interval_ = options_.explore_every;
                since_explore_ = 0;
                last_best_ = best;
            }
            g = best;
            if (options_.explore_every != 0 && ++since_explore_ >= explore_interval_) {
                const std::size_t other = best < top ? best + 1 : best - 1;
                const double extra = exploring_cost(other, best);
                if (explored_ + extra <= options_.explore_budget * (total_ + extra)) {
                    since_explore_ = 0;
                    explore_interval_ = std::min(std::max<std::size_t>(1, 2 * explore_interval_),
                                                 std::max(options_.max_explore_every, options_.explore_every));
                    explored_ += extra;
                    g = other;
                }
            }
        }
        ++chosen_[g];
        return g;
    }

    /// What one step did, for observe(). Times are in seconds, negative when not measured.
    struct step_observation {
        std::size_t gamma = 0;                ///< the γ the step asked for
        std::size_t drafted = 0;              ///< the tokens the drafter proposed
        std::size_t emitted = 0;              ///< the tokens the step appended
        std::span<const float> acceptance{};  ///< β of the tested draft positions (0-based)
        double draft_seconds = -1.0;          ///< the drafter's call
        double pass_seconds = -1.0;           ///< the target pass (over drafted + 1 positions)
        double step_seconds = -1.0;           ///< the whole step
        /// The first step of a decoding call: its times include reading the prompt (the models'
        /// prefill), so they are not used as estimates.
        bool first = false;
    };

    /// Updates the estimates with what a step did.
    void observe(const step_observation& o) {
        for (std::size_t i = 0; i < o.acceptance.size() && i < alpha_.size(); ++i)
            alpha_[i].add(std::clamp(static_cast<double>(o.acceptance[i]), 0.0, 1.0), options_.window);
        if (o.gamma > 0) {
            // A draft token's time only from a drafter that ran in the step before too: one
            // idle during plain steps (or new to the prompt) spends this call catching up.
            if (!o.first && o.drafted > 0 && lag_ == 0 && drafted_steps_ > 0 && o.draft_seconds >= 0 &&
                std::isfinite(o.draft_seconds))
                draft_.add_time(o.draft_seconds / static_cast<double>(o.drafted), options_.window);
            // After plain steps: what catching up cost per missed token, beyond the drafted ones.
            if (!o.first && o.drafted > 0 && lag_ > 0 && draft_.count != 0 && o.draft_seconds >= 0 &&
                std::isfinite(o.draft_seconds))
                catch_up_.add_time(std::max(0.0, o.draft_seconds - static_cast<double>(o.drafted) * draft_.value) /
                                  static_cast<double>(lag_),
                              options_.window);
            ++drafted_steps_;
            lag_ = 0;
        } else {
            lag_ += o.emitted;
        }
        const std::size_t positions = o.drafted + 1;
        if (!o.first && positions <= pass_.size() && o.pass_seconds >= 0 && std::isfinite(o.pass_seconds))
            pass_[positions - 1].add_time(o.pass_seconds, options_.window);
        if (!o.first && o.step_seconds >= 0 && o.draft_seconds >= 0 && o.pass_seconds >= 0) {
            const double rest = o.step_seconds - o.draft_seconds - o.pass_seconds;
            if (std::isfinite(rest)) overhead_.add_time(std::max(0.0, rest), options_.window);
        }
        total_ += expected_cost(std::min(o.gamma, gamma_max_));
    }

    /// The estimate of α_i (i = 1..gamma_max, the acceptance at draft position i);
    /// unobserved positions take the deepest observed estimate; 0 before any observation.
    [[nodiscard]] double acceptance(std::size_t i) const {
        if (i == 0 || i > alpha_.size()) return 0.0;
        for (std::size_t k = i; k-- > 0;)
            if (alpha_[k].count != 0) return alpha_[k].value;
        return 0.0;
    }
    /// E[tokens | γ] = Σ_{k=0..γ} Π_{i=1..k} α_i, with the α_i the choice uses (acceptance()
    /// shrunk towards 1/2 by prior_weight pseudo-observations).
    [[nodiscard]] double expected_tokens(std::size_t gamma) const {
        double total = 1.0, run = 1.0;
        for (std::size_t i = 1; i <= gamma && i <= gamma_max_; ++i) {
            run *= shrunk_acceptance(i);
            total += run;
        }
        return total;
    }
    /// Expected cost of a step with γ draft tokens, in the cost unit (seconds when measured).
    [[nodiscard]] double expected_cost(std::size_t gamma) const {
        if (!measures_time()) return options_.draft_cost(gamma) + options_.pass_cost(gamma + 1);
        return static_cast<double>(gamma) * draft_.value + pass_time(gamma + 1) + overhead_.value;
    }
    /// The γ in [0, limit] (limit <= gamma_max) with the most expected tokens per unit of
    /// cost; ties go to the shorter draft.
    [[nodiscard]] std::size_t best_gamma(std::size_t limit) const {
        limit = std::min(limit, gamma_max_);
        std::size_t best = 0;
        double best_rate = -1.0;
        for (std::size_t g = 0; g <= limit; ++g) {
            const double cost = expected_cost(g);
            const double rate = cost > 0 ? expected_tokens(g) / cost : std::numeric_limits<double>::infinity();
            if (rate > best_rate * (1 + 1e-9)) {
                best_rate = rate;
                best = g;
            }
        }
        return best;
    }
    /// How many times choose() returned each γ (index γ).
    [[nodiscard]] std::span<const std::size_t> choices() const noexcept { return chosen_; }

private:
    using estimate = detail::running_estimate;

    /// The predicted time an exploring step at γ = `other` loses against one at `best`: its
    /// cost beyond what `best` needs for as many expected tokens, plus a draft model's catch-up
    /// on the tokens of the plain steps since it last ran (about one draft step each).
    [[nodiscard]] double exploring_cost(std::size_t other, std::size_t best) const {
        const double per_token = expected_cost(best) / expected_tokens(best);
        double extra = std::max(0.0, expected_cost(other) - expected_tokens(other) * per_token);
        if (other > 0 && measures_time()) extra += static_cast<double>(lag_) * catch_up_per_token();
        return extra;
    }

    /// A draft model's cost per token it catches up on: measured after plain steps; until then
    /// a draft step's (an engine that reads missed tokens in one batched pass pays less).
    [[nodiscard]] double catch_up_per_token() const { return catch_up_.count != 0 ? catch_up_.value : draft_.value; }

    /// The acceptance the choice uses at position i: position 1's estimate shrunk towards 1/2,
    /// each deeper one's towards the position before it (prior_weight pseudo-observations
    /// each), so that a deep position seen only a few times neither drags a high acceptance
    /// down to 1/2 nor stands on a lucky run; an unseen one takes the position before it.
    [[nodiscard]] double shrunk_acceptance(std::size_t i) const {
        if (i == 0 || i > alpha_.size()) return 0.0;
        const double w = options_.prior_weight;
        double prior = 0.5;
        for (std::size_t k = 0; k < i; ++k) {
            if (alpha_[k].count == 0) continue;  // unseen: the position before it
            const auto n = static_cast<double>(alpha_[k].count);
            prior = (n * alpha_[k].value + w * prior) / (n + w);
        }
        return prior;
    }

    /// t_pass(m) from the measured lengths (see the class comment).
    [[nodiscard]] double pass_time(std::size_t m) const {
        const std::size_t k = m - 1;
        if (pass_[k].count != 0) return pass_[k].value;
        std::size_t lo = k, hi = k;
        bool has_lo = false, has_hi = false;
        for (std::size_t j = k; j-- > 0;)
            if (pass_[j].count != 0) { lo = j; has_lo = true; break; }
        for (std::size_t j = k + 1; j < pass_.size(); ++j)
            if (pass_[j].count != 0) { hi = j; has_hi = true; break; }
        const auto at = [&](std::size_t j) { return pass_[j].value; };
        const auto line = [&](std::size_t a, std::size_t b) {  // through the lengths a < b, at k
            const double slope = (at(b) - at(a)) / static_cast<double>(b - a);
            return std::max(0.0, at(a) + slope * (static_cast<double>(k) - static_cast<double>(a)));
        };
        if (has_lo && has_hi) return line(lo, hi);
        if (!has_lo && !has_hi) return 0.0;
        // One side only: the nearest two measured lengths on that side, else proportional.
        const std::size_t near = has_lo ? lo : hi;
        std::size_t second = near;
        bool has_second = false;
        if (has_lo) {
            for (std::size_t j = near; j-- > 0;)
                if (pass_[j].count != 0) { second = j; has_second = true; break; }
        } else {
            for (std::size_t j = near + 1; j < pass_.size(); ++j)
                if (pass_[j].count != 0) { second = j; has_second = true; break; }
        }
        if (has_second) return line(std::min(near, second), std::max(near, second));
        return at(near) * static_cast<double>(k + 1) / static_cast<double>(near + 1);
    }

    adaptive_gamma_options options_;
    std::size_t gamma_max_;
    std::vector<estimate> alpha_;  // by draft position (0-based)
    std::vector<estimate> pass_;   // by positions − 1
    estimate draft_, overhead_, catch_up_;
    std::vector<std::size_t> chosen_;
    std::size_t last_best_ = std::numeric_limits<std::size_t>::max();
    std::size_t explore_interval_;
    std::size_t since_explore_ = 0;
    std::size_t drafted_steps_ = 0;  // steps that asked for a draft
    std::size_t lag_ = 0;            // tokens appended since the drafter last ran
    double total_ = 0.0;             // predicted cost of all steps so far
    double explored_ = 0.0;          // predicted loss of the exploring steps so far
};

}  // namespace specdec
