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
/// distribution (tests/statistical/distribution_test.cpp covers it under both schemes).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "detail/best_tree.hpp"
#include "engine_profile.hpp"
#include "error.hpp"

namespace specdec {

/// How speculative_decode chooses γ for each step.
enum class gamma_policy {
    /// The step's own length at every step (chain::gamma, or the tree's shape; the default; no
    /// timing, no estimates).
    fixed,
    /// Before each step, the γ in [0, chain::gamma] (for a tree: the shape within the tree's
    /// limits) that maximizes expected tokens per unit of time, from the estimates of a
    /// gamma_controller.
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
    /// catch up on the tokens it missed (measured, or from the profile's draft_catch_up; else
    /// about one draft step each). A step explores only
    /// while the predicted loss of all exploring steps so far (each one's predicted cost beyond
    /// what the best plan would take for its expected tokens, and the draft model's catch-up),
    /// this one included, stays within this fraction of the predicted cost of all steps. So a pair for which
    /// speculation does not pay, with a draft as slow as its target, soon stops exploring
    /// and decodes at about the target's speed, while a cheap drafter keeps being tried.
    double explore_budget = 0.02;
    /// Estimates are running means of their first `window` observations, then exponential
    /// moving averages with weight 1 / window, so that they follow a text whose
    /// predictability changes. A time above 3x its estimate (after 4 observations) counts as
    /// 3x: a step that another process preempted does not swing the estimates. \pre window >= 1.
    std::size_t window = 32;
    /// The choice shrinks each position's acceptance estimate with this many
    /// pseudo-observations, (n·α̂ + w·prior) / (n + w) after n observations, where the prior is
    /// 1/2 for the first draft position and the (shrunk) estimate of the position before for
    /// the others. So one rejected warm-up draft does not estimate α = 0, and a deep position
    /// seen a few times leans on the shallower ones. 0: none. (Where early drafts are all
    /// rejected and the plan turns plain, exploring steps retry speculation: explore_every.)
    /// Each observation is an expected acceptance (β, or a_k at the root), not a 0/1 outcome,
    /// so a few carry much of what many outcomes would: with a weight of 2 a fresh planner
    /// spent the first half of a 128-token generation below a high acceptance (planner_bench,
    /// 32 batches: 0.92x the best fixed tree at draft noise 0.5, B = 1; 0.98x with 0.5 and the
    /// first step planned from the prior, see choose()).
    double prior_weight = 0.5;
    /// The acceptance known before the first step, e.g. from an earlier run of the pair: for a
    /// chain controller α_i by draft position (entry i − 1: decode_stats::estimated_acceptance
    /// per position), for a tree planner a_k by sibling rank (entry k − 1:
    /// decode_stats::estimated_sibling_acceptance(k − 1)); positions or ranks past the end take
    /// the last entry. Each replaces the prior above (prior_weight pseudo-observations of it), and
    /// the first step plans from it instead of a warm-up step (with measured costs the timing
    /// warm-up still runs), so with known costs a fresh planner is right from its first step.
    /// Empty: none. \pre every entry in [0, 1].
    std::vector<double> acceptance_prior{};
    /// Cost of drafting n tokens, in any unit (the same as pass_cost's). Set both pass_cost
    /// and draft_cost to use known costs; then nothing is timed. Empty: measured with a steady
    /// clock around the drafter's calls (seconds). In a batch, the sequences draft together
    /// (one batched call per draft position), so a step costs draft_cost(γ) whatever the
    /// number of sequences; give a profile to model a drafter whose cost grows with them.
    std::function<double(std::size_t drafted)> draft_cost{};
    /// Cost of one target pass over m positions in total (one sequence: m = γ + 1; a batch of
    /// B sequences: m = B(γ + 1)), same unit as draft_cost. Empty: measured with a steady
    /// clock around the verifier's calls.
    std::function<double(std::size_t positions)> pass_cost{};
    /// Cost of one tree pass (the verifier's tree call) over m positions in total, same unit;
    /// the tree planner costs its tree steps with it. Optional, only beside pass_cost: empty,
    /// a tree pass costs pass_cost's.
    std::function<double(std::size_t positions)> tree_pass_cost{};
    /// The engine's costs, measured once (engine_profile.hpp): a step of γ drafted tokens for
    /// B sequences costs γ·profile.draft_cost(B) + profile.pass_cost(B(γ + 1)) (a tree step's
    /// pass, profile.tree_pass_cost). Set, nothing
    /// is timed and the plan depends only on counts, so the same seed gives the same tokens
    /// (like the cost callbacks, which must then be empty). Unset: the callbacks, or timing.
    std::optional<engine_profile> profile{};
    /// Ragged plans: in a batch of chain steps, when the policy chooses to speculate, give each
    /// sequence its own draft length in [1, γ_max] from its own acceptance so far
    /// (gamma_controller::plan_sequences): the positions least likely to be accepted are left
    /// out while that raises the batch's expected tokens per unit of cost. Exact either way
    /// (the lengths depend on the past only). false: every sequence drafts the chosen γ.
    bool per_sequence = true;
    /// A batch that drains: batch_decoder's sequences run to their token budgets and are not
    /// replaced as they finish. In a batch, a step that would speculate (a chain, ragged or
    /// not, or a tree planner's tree) is made a plain step for every sequence when plain steps
    /// are predicted to finish the batch sooner than its plan held to the end
    /// (gamma_controller::drain_to_plain):
    /// speculation lets well drafted sequences finish first, and the rest then share each
    /// pass's fixed cost among fewer sequences. Exact either way (the choice depends on the
    /// past and the budgets only). false: each step maximizes the batch's tokens per unit of
    /// time, what a serving loop that adds a sequence whenever one finishes needs (also where
    /// sequences mostly end at stop tokens long before their budgets).
    bool drain = true;
};

namespace detail {

/// A running mean of the first `window` observations, then an exponential moving average with
/// weight 1 / window (adaptive_gamma_options::window).
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

/// How many draft calls a tree costs the drafter, for the tree planner's cost model.
enum class tree_draft_calls {
    /// One call per level (calls = depth): a draft model that scores a whole level in one
    /// pass (one with score_tree), a TreeDrafter, or a BlockDrafter's chain.
    per_level,
    /// One call per node that gets children (calls = 1 + the nodes above the last level): a
    /// plain next_logits drafter.
    per_parent,
};

/// The largest tree a planning controller may choose (see gamma_controller's tree constructor):
/// branching per depth (the shape's, e.g. {3, 2, 1, 1}), an optional node budget, and how the
/// drafter's calls grow with the tree.
struct tree_plan_limits {
    std::vector<std::size_t> branching{};  ///< children per node at each depth, e.g. {3, 2, 1, 1}
    std::size_t max_nodes = 0;  ///< 0: no budget beyond the branching
    tree_draft_calls draft_calls = tree_draft_calls::per_level;  ///< how the drafter's calls grow with the tree
    /// How the drafter's calls grow with the batch. true (the default): a call drafts one
    /// sequence's tree, as batch_decoder drafts trees (one sequence at a time), so a step of B
    /// sequences costs B times one sequence's draft calls, each at a single sequence's cost
    /// (profile.draft_cost(1)). false: a call drafts a level of every sequence's tree together
    /// (a draft engine batched across sequences), so the step costs one sequence's calls, each
    /// at profile.draft_cost(B). Only plans for B > 1 depend on it.
    bool drafts_per_sequence = true;
    /// A plan that is a chain (every branching 1) is drafted for every sequence of the batch in
    /// one call per position: batch_decoder runs such a plan as a chain step when both models
    /// have chain calls, and its own planner sets this when the drafter's chain call is
    /// draft_batch (a MultiSequenceDrafter). Such plans then cost one sequence's calls at
    /// profile.draft_cost(B), whatever drafts_per_sequence says.
    bool chains_batched = false;
    /// A plan that is a chain (or the plain step) runs as a chain step, its pass a chain pass
    /// (costed with pass_cost), as batch_decoder runs it when the drafter has a chain call and
    /// the verifier scores a chain in one call; its own planner sets it then. false: such plans
    /// run as tree steps and are costed with the tree pass's cost, as every other plan is.
    bool chains_as_chain_steps = false;
    /// Besides the shapes uniform per depth, plan the best tree of each node count (2 to
    /// max_nodes, at most best_tree_node_cap) and each depth: Sequoia's dynamic program
    /// (best_tree(), Chen et al. 2024, §3.1) on the current sibling acceptance, whose nodes of
    /// one depth may differ (the first-drawn child carries the deeper subtree). Such a plan is
    /// drafted from its children list (tree_shape::children).
    bool best_trees = true;
};

/// Estimates and choice of the adaptive γ policy. speculative_decode makes one per call;
/// pass your own through decode_options' length.controller (draft_length::controller) to keep
/// its estimates across calls (successive requests of one model pair, say). Not thread-safe:
/// one controller per decoding loop.
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
    /// \throws std::invalid_argument for gamma_max = 0, window = 0, only one of the two cost
    ///         callbacks set, tree_pass_cost without them, a profile beside them or an invalid
    ///         profile, a prior_weight that is negative or not finite, an acceptance_prior entry
    ///         outside [0, 1], or an explore_budget outside [0, 1].
    explicit gamma_controller(std::size_t gamma_max, adaptive_gamma_options options = {})
        : options_(std::move(options)), gamma_max_(gamma_max), explore_interval_(options_.explore_every) {
        constexpr const char* where = "specdec::gamma_controller";
        if (gamma_max == 0) detail::fail_invalid(where, ": gamma_max = 0; at least 1 is needed");
        if (options_.window == 0) detail::fail_invalid(where, ": window = 0; at least 1 is needed");
        if (!(options_.prior_weight >= 0.0 && std::isfinite(options_.prior_weight)))
            detail::fail_invalid(where, ": prior_weight = ", options_.prior_weight, " must be finite and >= 0");
        for (std::size_t i = 0; i < options_.acceptance_prior.size(); ++i)
            if (!(options_.acceptance_prior[i] >= 0.0 && options_.acceptance_prior[i] <= 1.0))
                detail::fail_invalid(where, ": acceptance_prior[", i, "] = ", options_.acceptance_prior[i],
                                     " is not a probability in [0, 1]");
        if (!(options_.explore_budget >= 0.0 && options_.explore_budget <= 1.0))
            detail::fail_invalid(where, ": explore_budget = ", options_.explore_budget, " must lie in [0, 1]");
        if (static_cast<bool>(options_.draft_cost) != static_cast<bool>(options_.pass_cost))
            detail::fail_invalid(where, ": set both draft_cost and pass_cost (known costs), or neither (measured)");
        if (options_.tree_pass_cost && !options_.pass_cost)
            detail::fail_invalid(where, ": tree_pass_cost is set without pass_cost and draft_cost; it refines known "
                                        "costs (for a profile, use engine_profile::tree_pass)");
        if (options_.profile) {
            if (options_.pass_cost)
                detail::fail_invalid(where, ": set a profile or the cost callbacks draft_cost and pass_cost, not both");
            validate(*options_.profile, "specdec::gamma_controller: adaptive_gamma_options::profile");
        }
        alpha_.assign(gamma_max_, estimate{});
        pass_.assign(gamma_max_ + 1, estimate{});  // grows with the batch's positions
        chosen_.assign(gamma_max_ + 1, 0);
    }

    /// A controller that plans each step's tree (the planner of a tree step, `decode_options`'
    /// `step = tree{shape}` under the adaptive policy): before each step it chooses, among every
    /// shape within `limits` (branching b_d in [1, limits.branching[d]] per depth, any depth up
    /// to the full one, at most max_nodes nodes) and the plain step, the one with the most
    /// expected tokens per unit of cost. A shape with every b_d = 1 is a chain. The model is
    /// Sequoia's (Chen et al. 2024, §3.1): the k-th child of a node is accepted, given that the
    /// earlier ones were not, with a probability a_k that depends on k only, estimated from
    /// tree_verify_result::sibling_acceptance at the root of every tree step; a level of b
    /// children then lets the path go on with P(b) = 1 − Π_{k≤b} (1 − a_k), and a shape
    /// b_1..b_D yields E[tokens] = 1 + Σ_d Π_{i≤d} P(b_i). A step of N nodes, drafted level by
    /// level (one draft call per level, or per node with children: limits.draft_calls), costs
    /// that many draft steps and a target pass over N + 1 positions per sequence.
    /// \throws std::invalid_argument as the chain constructor, and for an empty branching or
    ///         one with a 0 entry.
    gamma_controller(tree_plan_limits limits, adaptive_gamma_options options = {})
        : gamma_controller(checked_depth(limits), std::move(options)) {
        constexpr const char* where = "specdec::gamma_controller";
        for (std::size_t d = 0; d < limits.branching.size(); ++d)
            if (limits.branching[d] == 0)
                detail::fail_invalid(where, ": tree_plan_limits.branching[", d, "] = 0; every level needs a child");
        tree_ = std::move(limits);
        enumerate_shapes();
        // One estimate per sibling rank a plan can have: the widest node of the shapes and, with
        // best trees, of at most max_nodes and best_tree_node_cap nodes. (Not the branching's own widest entry,
        // which may be far larger than any plan: the shapes are capped by max_nodes and in number.)
        std::size_t widest = 1;
        for (const auto& shape : shapes_)
            for (const std::size_t b : shape) widest = std::max(widest, b);
        if (tree_.best_trees) {
            const std::size_t raw = *std::max_element(tree_.branching.begin(), tree_.branching.end());
            const std::size_t nodes = tree_.max_nodes == 0 ? best_tree_node_cap : std::min(tree_.max_nodes, best_tree_node_cap);
            widest = std::max(widest, std::min(raw, nodes));
        }
        sibling_.assign(widest, estimate{});
        refresh_best_trees();
    }

    /// The most nodes of a tree planner's best trees (tree_plan_limits::best_trees): the
    /// dynamic program runs before every step, in O(depth² · width · nodes²) time.
    static constexpr std::size_t best_tree_node_cap = 64;

    /// The settings it was made with.
    [[nodiscard]] const adaptive_gamma_options& options() const noexcept { return options_; }
    /// The longest draft considered (for a tree planner: the full tree's depth).
    [[nodiscard]] std::size_t gamma_max() const noexcept { return gamma_max_; }
    /// True for a tree planner (made with tree_plan_limits).
    [[nodiscard]] bool plans_trees() const noexcept { return !tree_.branching.empty(); }
    /// A tree planner's limits (empty branching for a chain controller).
    [[nodiscard]] const tree_plan_limits& tree_limits() const noexcept { return tree_; }
    /// A tree planner's choice at the last choose(): the branching per depth of the step's
    /// tree (empty: a plain step); for a best tree (planned_children() not empty), its widest
    /// node per depth. For a chain controller: empty.
    [[nodiscard]] std::span<const std::size_t> planned_shape() const noexcept {
        if (!plans_trees()) return {};
        if (is_best(planned_)) return planned_best_.widest;
        return shapes_[planned_];
    }
    /// A tree planner's choice at the last choose() when it is a best tree
    /// (tree_plan_limits::best_trees): its children list (tree_shape::children); empty for a
    /// shape uniform per depth (planned_shape()), a plain step, or a chain controller.
    [[nodiscard]] std::span<const std::size_t> planned_children() const noexcept {
        if (!plans_trees() || !is_best(planned_)) return {};
        return planned_best_.children;
    }
    /// True when costs are measured (neither cost callbacks nor a profile were given): then the
    /// choices depend on timings, and the same seed need not give the same tokens.
    [[nodiscard]] bool measures_time() const noexcept { return !options_.pass_cost && !options_.profile; }

    /// Sets how the models of the decoder that uses it draft and score a tree planner's plans
    /// (tree_plan_limits::draft_calls, chains_batched and chains_as_chain_steps: facts about the
    /// models, not choices): batch_decoder calls it on a caller's planner, so that a planner
    /// made by make_controller(options) costs any pair's steps as they run. A planner is meant
    /// for one pair of models. No effect on a chain controller.
    void describe_models(tree_draft_calls draft_calls, bool chains_batched, bool chains_as_chain_steps) noexcept {
        if (!plans_trees()) return;
        tree_.draft_calls = draft_calls;
        tree_.chains_batched = chains_batched;
        tree_.chains_as_chain_steps = chains_as_chain_steps;
    }

    /// A new decoding call begins (batch_decoder calls it before a step whose every sequence is
    /// at its first step): the draft model reads the new prompt whatever it missed before, so
    /// the tokens of the plain steps since it last drafted are no longer charged to resuming
    /// speculation (a kept controller would otherwise carry them from call to call).
    void new_call() noexcept { lag_ = 0; }

    /// The γ for the next step, at most `limit` (the tokens still needed minus one).
    /// Warm-up when costs are measured: γ = 1 until a draft token and a 2-position pass are
    /// timed (twice: a decoding call's first step also reads the prompt, and is not timed), then
    /// γ = 0 once. With known costs (a profile or the cost callbacks) the first step is the best
    /// plan under the priors (acceptance_prior, else 1/2), or γ = 1 (a tree planner: one level
    /// of two children) when that plan is a plain step, so that a first α_1 is seen. Afterwards
    /// the best γ, or a neighbour on exploring steps.
    /// `sequences`: how many sequences the step drafts for (a batch_decoder's active ones); the
    /// pass's cost is taken at their total positions, so a batch whose pass grows with its
    /// positions speculates less than one sequence would.
    std::size_t choose(std::size_t limit = std::numeric_limits<std::size_t>::max(), std::size_t sequences = 1) {
        sequences_ = std::max<std::size_t>(sequences, 1);
        exploring_ = false;
        const std::size_t top = std::min(gamma_max_, limit);
        const std::size_t warm = warm_plan();
        const bool known_acceptance = !options_.acceptance_prior.empty() ||
                                      (plans_trees() ? sibling_[0].count != 0 : alpha_[0].count != 0);
        std::size_t g;
        if (top == 0) {
            g = 0;
        } else if (!known_acceptance ||
                   (measures_time() &&
                    (draft_.count == 0 || !pass_measured(plan_positions(warm, sequences_), plan_tree_pass(warm))) &&
                    drafted_steps_ < 4)) {
            g = warm;  // nothing known about acceptance yet, or no clean timing of a draft token
            // Known costs: the best plan under the priors pays more than the warm-up's short
            // draft where speculation pays (docs/adaptive-gamma.md, planning trees); the
            // warm-up only where that plan would not draft, so that acceptance is seen, or
            // where the draft model has plain steps' tokens to catch up on (the warm-up's short
            // draft then costs least).
            if (!measures_time() && lag_ == 0) {
                const std::size_t from_prior = best_plan(top, sequences_);
                if (from_prior != 0) g = from_prior;
            }
            exploring_ = true;  // nothing known yet: the step is there to be observed, drain_to_plain keeps it
        } else if (measures_time() && !pass_measured(sequences_, plan_tree_pass(0))) {
            g = 0;
        } else {
            std::size_t best = best_plan(top, sequences_);
            // A draft model idle during plain steps first catches up on the tokens it missed:
            // resume speculating only if that pays within the tokens still to be generated.
            if (best > 0 && lag_ > 0) {
                const double left = static_cast<double>(limit) + 1.0;
                const double resume = catch_up_cost() + left * plan_cost(best, sequences_) / plan_tokens(best);
                if (resume >= left * plan_cost(0, sequences_)) best = 0;
            }
            if (best != last_best_) {
                explore_interval_ = options_.explore_every;
                since_explore_ = 0;
                last_best_ = best;
            }
            g = best;
            if (options_.explore_every != 0 && ++since_explore_ >= explore_interval_) {
                const std::size_t other = neighbour(best, top);
                const double extra = exploring_cost(other, best);
                if (other != best && std::isfinite(extra) &&
                    explored_ + extra <= options_.explore_budget * (total_ + extra)) {
                    since_explore_ = 0;
                    explore_interval_ = std::min(std::max<std::size_t>(1, 2 * explore_interval_),
                                                 std::max(options_.max_explore_every, options_.explore_every));
                    explored_ += extra;
                    g = other;
                    exploring_ = true;
                }
            }
        }
        planned_ = g;
        if (is_best(g) && plans_trees()) {  // kept as chosen: observe() rebuilds the best trees
            const best_plan_tree& t = best_[g - shapes_.size()];
            planned_best_.children.assign(t.children.begin(), t.children.end());
            planned_best_.widest.assign(t.widest.begin(), t.widest.end());
            planned_best_.nodes = t.nodes;
            planned_best_.parents = t.parents;
            planned_best_.depth = t.depth;
            planned_best_.chain = t.chain;
            planned_best_.tokens = t.tokens;
        }
        const std::size_t depth = plan_depth(g);
        ++chosen_[depth];
        return depth;
    }

    /// What one step did, for observe(). Times are in seconds, negative when not measured.
    struct step_observation {
        std::size_t gamma = 0;                ///< the γ the step asked for
        std::size_t drafted = 0;              ///< the tokens the drafter proposed
        std::size_t emitted = 0;              ///< the tokens the step appended
        std::span<const float> acceptance{};  ///< β of the tested draft positions (0-based)
        /// Tree steps: a_k of the root's tested children (tree_verify_result::sibling_acceptance).
        std::span<const float> sibling_acceptance{};
        double draft_seconds = -1.0;          ///< the drafter's call
        double pass_seconds = -1.0;           ///< the target pass
        double step_seconds = -1.0;           ///< the whole step
        /// The positions the target pass held, over all sequences; 0: drafted + 1 (one sequence).
        std::size_t positions = 0;
        /// The pass went through the verifier's tree call (a tree step): its time is kept apart
        /// from chain passes', for the tree planner's tree plans.
        bool tree_pass = false;
        /// The first step of a decoding call: its times include reading the prompt (the models'
        /// prefill), so they are not used as estimates.
        bool first = false;
    };

    /// Updates the estimates with what a step did.
    void observe(const step_observation& o) {
        // (A value that is not a number is skipped: it would stay in the moving average for good.)
        for (std::size_t i = 0; i < o.acceptance.size() && i < alpha_.size(); ++i)
            if (!std::isnan(o.acceptance[i]))
                alpha_[i].add(std::clamp(static_cast<double>(o.acceptance[i]), 0.0, 1.0), options_.window);
        for (std::size_t k = 0; k < o.sibling_acceptance.size() && k < sibling_.size(); ++k)
            if (!std::isnan(o.sibling_acceptance[k]))
                sibling_[k].add(std::clamp(static_cast<double>(o.sibling_acceptance[k]), 0.0, 1.0), options_.window);
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
        const std::size_t positions = o.positions != 0 ? o.positions : o.drafted + 1;
        if (!o.first && positions <= detail::max_profile_entries && o.pass_seconds >= 0 &&
            std::isfinite(o.pass_seconds)) {
            auto& table = o.tree_pass ? tree_pass_ : pass_;
            if (positions > table.size()) table.resize(positions);
            table[positions - 1].add_time(o.pass_seconds, options_.window);
            tree_pass_timed_ = tree_pass_timed_ || o.tree_pass;
        }
        if (!o.first && o.step_seconds >= 0 && o.draft_seconds >= 0 && o.pass_seconds >= 0) {
            const double rest = o.step_seconds - o.draft_seconds - o.pass_seconds;
            if (std::isfinite(rest)) overhead_.add_time(std::max(0.0, rest), options_.window);
        }
        total_ += plans_trees() ? plan_cost(planned_, sequences_)
                                : expected_cost(std::min(o.gamma, gamma_max_), sequences_);
        if (plans_trees() && !o.sibling_acceptance.empty()) refresh_best_trees();
    }

    /// A tree planner's estimate of a_k (k = 1.., the acceptance of a node's k-th child given
    /// that the earlier ones were not accepted); an unobserved rank takes the one before it; 0
    /// before any observation or for a chain controller.
    [[nodiscard]] double sibling_acceptance(std::size_t k) const {
        if (k == 0) return 0.0;
        for (std::size_t j = std::min(k, sibling_.size()); j-- > 0;)
            if (sibling_[j].count != 0) return sibling_[j].value;
        return 0.0;
    }
    /// A tree planner's E[tokens] of a step of the shape `branching` (empty: a plain step, 1):
    /// 1 + Σ_d Π_{i≤d} P(b_i), with the a_k the choice uses (shrunk by prior_weight).
    [[nodiscard]] double expected_tokens(std::span<const std::size_t> branching) const {
        double total = 1.0, run = 1.0;
        for (const std::size_t b : branching) {
            double fail = 1.0;
            for (std::size_t k = 1; k <= b; ++k) fail *= 1.0 - shrunk_sibling(k);
            run *= 1.0 - fail;
            total += run;
        }
        return total;
    }
    /// A tree planner's expected cost of a step of the shape `branching` for `sequences`
    /// sequences (see the tree constructor).
    [[nodiscard]] double expected_cost(std::span<const std::size_t> branching, std::size_t sequences = 1) const {
        std::size_t nodes = 0, parents = branching.empty() ? 0 : 1, level = 1;
        for (std::size_t d = 0; d < branching.size(); ++d) {
            level *= branching[d];
            nodes += level;
            if (d + 1 < branching.size()) parents += level;
        }
        const bool chain = detail::is_chain_shape(branching);
        return tree_cost(nodes, parents, branching.size(), chain, sequences);
    }
    /// A tree planner's expected cost of a step of a tree of `nodes` nodes, `parents` of them
    /// (the root included) with children, of depth `depth` (a chain when `chain`), for
    /// `sequences` sequences (see the tree constructor).
    [[nodiscard]] double tree_cost(std::size_t nodes, std::size_t parents, std::size_t depth, bool chain,
                                   std::size_t sequences = 1) const {
        const std::size_t b = std::max<std::size_t>(sequences, 1);
        const std::size_t calls = tree_.draft_calls == tree_draft_calls::per_level ? depth : parents;
        const bool tree_pass = !(chain && tree_.chains_as_chain_steps);
        if (tree_.drafts_per_sequence && b > 1 && !(chain && tree_.chains_batched))
            return tree_cost_per_sequence(calls, b * (nodes + 1), b, tree_pass);
        return cost_of(calls, b * (nodes + 1), b, tree_pass);
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
    /// Expected cost of a step with γ draft tokens for `sequences` sequences together, in the
    /// cost unit (seconds when measured): from the profile, the callbacks (see
    /// adaptive_gamma_options), or the measurements (a draft step's time, the pass's time at
    /// the total positions, and the library's own time per step).
    [[nodiscard]] double expected_cost(std::size_t gamma, std::size_t sequences = 1) const {
        const std::size_t b = std::max<std::size_t>(sequences, 1);
        return cost_of(gamma, b * (gamma + 1), b);
    }
    /// The predicted speedup of γ over plain steps (γ = 0) for `sequences` sequences: expected
    /// tokens per unit of cost at γ over that at 0 (Leviathan et al. 2023, Thm. 3.8 with the
    /// costs above). NaN while a plain step's cost is unknown.
    [[nodiscard]] double predicted_speedup(std::size_t gamma, std::size_t sequences = 1) const {
        const double plain = expected_cost(0, sequences), cost = expected_cost(gamma, sequences);
        if (!(plain > 0.0) || !(cost > 0.0)) return std::numeric_limits<double>::quiet_NaN();
        return expected_tokens(gamma) / cost * plain;
    }
    /// The γ in [0, limit] (limit <= gamma_max) with the most expected tokens per unit of
    /// cost for `sequences` sequences; ties go to the shorter draft.
    /// (A tree planner: the depth of its best plan of depth at most `limit`.)
    [[nodiscard]] std::size_t best_gamma(std::size_t limit, std::size_t sequences = 1) const {
        return plan_depth(best_plan(std::min(limit, gamma_max_), std::max<std::size_t>(sequences, 1)));
    }
    /// One line saying what the policy would choose now for `sequences` sequences and why,
    /// from its estimates: "gamma 3 for 1 sequence: predicted 1.72x plain steps (acceptance
    /// 0.81 0.77 0.70; a draft step costs 0.12 plain steps; costs from the profile)", or
    /// "speculation off for 8 sequences: a draft step costs 0.31 plain steps; best predicted
    /// 0.93x (gamma 1)". Uses the acceptance the choice uses (acceptance() shrunk by
    /// prior_weight).
    [[nodiscard]] std::string explain(std::size_t sequences = 1) const {
        const std::size_t b = std::max<std::size_t>(sequences, 1);
        if (plans_trees()) return explain_tree(b);
        const std::size_t best = best_gamma(gamma_max_, b);
        std::size_t runner = 1;  // the best speculating length, for the "off" case
        for (std::size_t g = 1; g <= gamma_max_; ++g)
            if (predicted_speedup(g, b) > predicted_speedup(runner, b)) runner = g;
        const double plain = expected_cost(0, b);
        const double c = plain > 0 ? (expected_cost(1, b) - expected_cost(0, b) - (pass_of(2 * b) - pass_of(b))) / plain
                                   : std::numeric_limits<double>::quiet_NaN();
        const char* source = options_.profile ? "costs from the profile"
                             : options_.pass_cost ? "costs from the callbacks"
                                                  : "costs as timed";
        char buf[160];
        std::string out;
        const std::string who = std::to_string(b) + (b == 1 ? " sequence" : " sequences");
        if (best == 0) {
            std::snprintf(buf, sizeof buf, "speculation off for %s: a draft step costs %.2f plain steps; best predicted %.2fx (gamma %zu); %s",
                          who.c_str(), c, predicted_speedup(runner, b), runner, source);
            return std::string(buf) + explain_drain();
        }
        std::snprintf(buf, sizeof buf, "gamma %zu for %s: predicted %.2fx plain steps (acceptance", best, who.c_str(),
                      predicted_speedup(best, b));
        out = buf;
        for (std::size_t i = 1; i <= best; ++i) {
            std::snprintf(buf, sizeof buf, " %.2f", shrunk_acceptance(i));
            out += buf;
        }
        std::snprintf(buf, sizeof buf, "; a draft step costs %.2f plain steps; %s)", c, source);
        return out + buf + explain_drain();
    }
    /// How many times choose() returned each γ (index γ).
    [[nodiscard]] std::span<const std::size_t> choices() const noexcept { return chosen_; }

    /// What plan_sequences() knows of one sequence: its own acceptance so far, as
    /// decode_stats keeps it (expected_accepted_at_position: Σ β at each draft position;
    /// reached_at_position: how many steps tested it), and the longest draft it may take.
    struct sequence_acceptance {
        std::span<const double> expected{};      ///< Σ β at each draft position (0-based)
        std::span<const std::size_t> reached{};  ///< steps that tested each draft position
        std::size_t limit = 0;                   ///< the longest draft this sequence may take
        /// The tokens this sequence still needs to reach its budget (drain_to_plain()); 0: unknown.
        std::size_t remaining = 0;
        /// A tree planner's drain_to_plain(): the sequence's own acceptance by sibling rank, as
        /// decode_stats keeps it (expected_accepted_at_sibling, reached_at_sibling).
        std::span<const double> sibling_expected{};
        std::span<const std::size_t> sibling_reached{};  ///< see sibling_expected
    };

    /// Ragged plans: a draft length γ_i in [1, min(gamma, limit_i)] for each sequence of a chain
    /// step of at most `gamma` draft tokens (0 gives every sequence 0; batch_decoder passes
    /// gamma_max when choose() chose to speculate), into `out` (one per sequence). Sequence i's acceptance at position k is its own estimate
    /// shrunk towards the batch's (acceptance() as the choice uses it) with
    /// per_sequence_prior pseudo-observations; E_i(γ_i) = Σ_{m≤γ_i} Π_{k≤m} α_{i,k} (Leviathan et
    /// al. 2023, Eq. 1 per sequence). Starting from γ_i = min(gamma, limit_i), it removes the
    /// deepest position of one sequence, or of every sequence at the longest length (which also
    /// saves a draft call), whichever most raises Σ_i E_i(γ_i) / cost, where the cost is that of
    /// a step of max γ_i draft calls and a pass over Σ (γ_i + 1) positions, while that ratio
    /// rises. So where a pass costs the same over more positions (a GPU at a
    /// small batch) nothing is removed, and where each position costs, the sequences the draft
    /// predicts poorly draft less. Never below 1 while gamma >= 1 (a sequence keeps being
    /// tested, so its estimate keeps learning). Depends only on the estimates (the past).
    /// `uniform`, when not 0: the plan every sequence would get otherwise (choose()'s γ); the
    /// result is the ragged plan or that one, whichever the estimates favour, so a ragged plan
    /// is taken only where the model predicts it pays. One sequence gets its own plan too (the
    /// batch's estimates may come from other sequences: batch_decoder plans the last sequence
    /// left of a batch this way). After an exploring or warm-up choice (choose() tried a plan
    /// to observe it), every sequence gets `uniform` when it is not 0: a ragged plan from the
    /// current estimates would undo what the step is there to measure.
    void plan_sequences(std::size_t gamma, std::span<const sequence_acceptance> sequences, std::span<std::size_t> out,
                        std::size_t uniform = 0) const {
        const std::size_t n = std::min(sequences.size(), out.size());
        if (exploring_ && uniform != 0) {
            for (std::size_t i = 0; i < n; ++i) out[i] = std::min({uniform, gamma, sequences[i].limit});
            return;
        }
        for (std::size_t i = 0; i < n; ++i) out[i] = std::min(gamma, sequences[i].limit);
        if (gamma == 0 || n < 1 || plans_trees()) return;
        fill_sequence_acceptance(gamma, sequences.first(n));
        // reach(i, g): Π_{k≤g} α_{i,k}, the expected tokens position g adds for sequence i.
        const auto reach = [&](std::size_t i, std::size_t g) {
            double r = 1.0;
            for (std::size_t k = 0; k < g; ++k) r *= ragged_alpha_[i * gamma + k];
            return r;
        };
        double tokens = 0.0;
        std::size_t positions = 0;
        for (std::size_t i = 0; i < n; ++i) {
            for (std::size_t g = 0; g <= out[i]; ++g) tokens += reach(i, g);
            positions += out[i] + 1;
        }
        const auto longest = [&] {
            std::size_t m = 0;
            for (std::size_t i = 0; i < n; ++i) m = std::max(m, out[i]);
            return m;
        };
        double value = tokens / cost_of(longest(), positions, n);
        for (;;) {
            // Candidates: one sequence's deepest position (i < n), or every sequence at the
            // deepest length at once (i = n: that also saves a draft call).
            std::size_t best = n + 1;
            double best_value = value;
            const std::size_t top = longest();
            for (std::size_t i = 0; i <= n; ++i) {
                double lost = 0.0;
                std::size_t removed = 0;
                if (i < n) {
                    if (out[i] <= 1) continue;
                    lost = reach(i, out[i]);
                    removed = 1;
                    --out[i];
                    const double v = (tokens - lost) / cost_of(longest(), positions - removed, n);
                    ++out[i];
                    if (v > best_value * (1.0 + 1e-12)) best_value = v, best = i;
                } else {
                    if (top <= 1) continue;
                    for (std::size_t j = 0; j < n; ++j)
                        if (out[j] == top) lost += reach(j, top), ++removed;
                    const double v = (tokens - lost) / cost_of(top - 1, positions - removed, n);
                    if (v > best_value * (1.0 + 1e-12)) best_value = v, best = n;
                }
            }
            if (best > n) break;
            if (best < n) {
                tokens -= reach(best, out[best]);
                --out[best];
                --positions;
            } else {
                for (std::size_t j = 0; j < n; ++j)
                    if (out[j] == top) tokens -= reach(j, top), --out[j], --positions;
            }
            value = best_value;
        }
        if (uniform == 0) return;
        double u_tokens = 0.0;
        std::size_t u_positions = 0, u_longest = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t g = std::min({uniform, gamma, sequences[i].limit});
            for (std::size_t m = 0; m <= g; ++m) u_tokens += reach(i, m);
            u_positions += g + 1;
            u_longest = std::max(u_longest, g);
        }
        if (u_tokens / cost_of(u_longest, u_positions, n) >= value)
            for (std::size_t i = 0; i < n; ++i) out[i] = std::min({uniform, gamma, sequences[i].limit});
    }

    /// Draining (adaptive_gamma_options::drain): whether plain steps for every sequence are
    /// predicted to finish the batch sooner than the step's plan held until each sequence
    /// reaches its budget; if so, records the step as a plain one (choices(), and for the
    /// estimates) and returns true: the caller then runs a plain step. Call it after choose()
    /// and before observe() (batch_decoder does so). The plan: for a chain controller, `plan`
    /// (γ_i per sequence, e.g. plan_sequences()' ragged plan); for a tree planner, the tree
    /// choose() chose, the same for every sequence (`plan` is not read). Sequence i needs r_i =
    /// sequences[i].remaining tokens and makes E_i per step (a chain: Eq. 1 with its own
    /// acceptance, as plan_sequences() estimates it; a tree: planned_tree_tokens(), from its
    /// own acceptance by sibling rank; 1 for a plain step), so it finishes after r_i / E_i
    /// steps; between two finishes, each step costs what a step of the sequences still running
    /// costs (a chain: max γ_i draft calls, a pass over Σ(γ_i + 1) positions; a tree: each
    /// sequence's tree cut at depth sequences[i].limit, as the step cuts it, with its nodes +
    /// 1 positions and its draft calls, summed when trees are drafted one sequence at a time,
    /// the most of them otherwise). The plan also pays the draft model's catch-up after plain
    /// steps. The batch's time is the sum (drain_prediction()). False, and nothing recorded
    /// (drain_prediction() is NaN), when the option is off, on an exploring or warm-up step
    /// (they are there to be observed), when a remaining count is unknown (0) or when the
    /// plan drafts nothing.
    /// Depends on the past and the budgets only, so exactness holds either way. O(n²) in the n
    /// sequences, no allocation once its scratch has grown.
    bool drain_to_plain(std::span<const sequence_acceptance> sequences, std::span<const std::size_t> plan) {
        const bool trees = plans_trees();
        const std::size_t n = trees ? sequences.size() : std::min(sequences.size(), plan.size());
        drain_last_ = {};
        if (!options_.drain || exploring_ || n == 0 || planned_ == 0) return false;
        std::size_t gamma = 0;
        for (std::size_t i = 0; i < n; ++i) {
            if (sequences[i].remaining == 0) return false;
            if (!trees) gamma = std::max(gamma, plan[i]);
        }
        if (!trees && gamma == 0) return false;
        if (!trees) fill_sequence_acceptance(gamma, sequences.first(n));
        drain_order_.clear();
        drain_cut_.clear();
        for (std::size_t i = 0; i < n; ++i) {
            double tokens = 0.0, reach = 1.0;
            if (trees) {
                drain_cut_.push_back(cut_planned_tree(sequences[i]));
                tokens = drain_cut_.back().tokens;
            } else {
                for (std::size_t g = 0; g <= plan[i]; ++g) {
                    if (g > 0) reach *= ragged_alpha_[i * gamma + g - 1];
                    tokens += reach;
                }
            }
            drain_order_.push_back({static_cast<double>(sequences[i].remaining) / tokens, i});
        }
        // Time to drain: segments between finishes, in order of the finishing step.
        const auto drain_time = [&](bool speculate) {
            if (!speculate)
                for (auto& [finish, i] : drain_order_) finish = static_cast<double>(sequences[i].remaining);
            std::sort(drain_order_.begin(), drain_order_.end());
            double time = 0.0, done = 0.0;
            for (std::size_t k = 0; k < n; ++k) {
                double cost;
                if (trees && speculate) {
                    cost = cut_trees_cost(k, n);
                } else if (trees) {
                    cost = plan_cost(0, n - k);
                } else {
                    std::size_t calls = 0, positions = 0;
                    for (std::size_t j = k; j < n; ++j) {
                        const std::size_t g = speculate ? plan[drain_order_[j].second] : 0;
                        calls = std::max(calls, g);
                        positions += g + 1;
                    }
                    cost = cost_of(calls, positions, n - k);
                }
                time += (drain_order_[k].first - done) * cost;
                done = drain_order_[k].first;
            }
            return time;
        };
        const double speculating = catch_up_cost() + drain_time(true);
        const double plain = drain_time(false);
        drain_last_ = {plain, speculating};
        if (!(plain < speculating)) return false;  // (a cost that is not a number: keep the plan)
        drain_plain_ = plain;
        drain_plan_ = speculating;
        if (trees && !planned_is_chain()) ++drained_trees_;
        --chosen_[trees && is_best(planned_) ? planned_best_.depth : plan_depth(planned_)];
        ++chosen_[0];
        planned_ = 0;
        ++drained_;
        return true;
    }
    /// A tree planner's expected tokens of the plan chosen at the last choose() for one
    /// sequence of a batch, from the sequence's own acceptance by sibling rank: a_{i,k} =
    /// (sibling_expected[k − 1] + w · a_k) / (sibling_reached[k − 1] + w), its own estimate
    /// shrunk towards the batch's a_k (shrunk_sibling(k), as the choice uses it) with w =
    /// per_sequence_prior pseudo-observations (as plan_sequences() shrinks β for chains). Then,
    /// for a shape uniform per depth, 1 + Σ_d Π_{j≤d} P(b_j) (expected_tokens(branching)); for a
    /// best tree, 1 + the summed probabilities of reaching and accepting each node under the
    /// rank weights (as best trees' E[tokens] is computed). Only depths up to `q.limit` count
    /// (the longest draft the sequence may take: a step cuts its tree there, so 0 gives 1
    /// token). A sequence with no observation of its own gets the batch's estimate. 0 for a
    /// chain controller; 1 for a plain plan. drain_to_plain() weighs these.
    [[nodiscard]] double planned_tree_tokens(const sequence_acceptance& q) const {
        if (!plans_trees()) return 0.0;
        return cut_planned_tree(q).tokens;
    }
    /// Predicted times to finish a draining batch, in the cost unit (drain_prediction()).
    struct drain_times {
        double plain = std::numeric_limits<double>::quiet_NaN();  ///< with plain steps for every sequence
        double plan = std::numeric_limits<double>::quiet_NaN();   ///< with the step's plan held to the end
    };
    /// drain_to_plain()'s last comparison, whether or not it made the step plain (NaN before any).
    [[nodiscard]] drain_times drain_prediction() const noexcept { return drain_last_; }
    /// How many steps drain_to_plain() made plain steps (they count as γ = 0 in choices()).
    [[nodiscard]] std::size_t drained_steps() const noexcept { return drained_; }
    /// Of drained_steps(), those whose plan was a tree with a node of several children (a
    /// tree planner's; the others were chains).
    [[nodiscard]] std::size_t drained_tree_steps() const noexcept { return drained_trees_; }
    /// explain()'s clause on drain_to_plain(): empty until it made a step plain, then how many
    /// and the last one's predicted times to finish the batch (plain steps against the plan).
    [[nodiscard]] std::string explain_drain() const {
        if (drained_ == 0) return {};
        char trees_clause[48] = "";
        if (plans_trees())
            std::snprintf(trees_clause, sizeof trees_clause, ", %zu of them with a tree plan", drained_trees_);
        char buf[260];
        std::snprintf(buf, sizeof buf,
                      "; %zu step%s made plain for a draining batch%s (the last: plain steps predicted to finish it "
                      "in %.3g, the plan in %.3g)",
                      drained_, drained_ == 1 ? "" : "s", trees_clause, drain_plain_, drain_plan_);
        return buf;
    }

    /// Pseudo-observations of the batch's acceptance in the per-sequence estimates of
    /// plan_sequences(), drain_to_plain() and planned_tree_tokens().
    static constexpr double per_sequence_prior = 8.0;

private:
    using estimate = detail::running_estimate;

    /// A sequence's own estimate from `sum` over `count` observations, shrunk towards the batch's
    /// `pooled` with per_sequence_prior pseudo-observations, within [0, 1]; a sum that is not a
    /// number gives `pooled`.
    [[nodiscard]] static double own_estimate(double sum, double count, double pooled) {
        const double v = (sum + per_sequence_prior * pooled) / (count + per_sequence_prior);
        return std::isnan(v) ? pooled : std::clamp(v, 0.0, 1.0);
    }

    /// ragged_alpha_[i · gamma + k − 1]: sequence i's acceptance at draft position k = 1..gamma,
    /// its own estimate shrunk towards the batch's (plan_sequences()).
    void fill_sequence_acceptance(std::size_t gamma, std::span<const sequence_acceptance> sequences) const {
        ragged_alpha_.assign(sequences.size() * gamma, 0.0);
        for (std::size_t i = 0; i < sequences.size(); ++i) {
            const auto& q = sequences[i];
            for (std::size_t k = 0; k < gamma; ++k) {
                const double pooled = shrunk_acceptance(k + 1);
                const double sum = k < q.expected.size() ? q.expected[k] : 0.0;
                const double count = k < q.reached.size() ? static_cast<double>(q.reached[k]) : 0.0;
                ragged_alpha_[i * gamma + k] = own_estimate(sum, count, pooled);
            }
        }
    }

    static std::size_t checked_depth(const tree_plan_limits& limits) {
        if (limits.branching.empty())
            detail::fail_invalid("specdec::gamma_controller: tree_plan_limits.branching is empty; a tree needs a level");
        return limits.branching.size();
    }

    /// A step of `calls` draft calls (draft steps) and a pass over `positions` positions in
    /// total (a tree pass when `tree_pass`), for `b` sequences, in the cost unit.
    [[nodiscard]] double cost_of(std::size_t calls, std::size_t positions, std::size_t b, bool tree_pass = false) const {
        if (options_.profile)
            return static_cast<double>(calls) * options_.profile->draft_cost(b) + any_pass_of(positions, tree_pass);
        if (options_.pass_cost) return options_.draft_cost(calls) + any_pass_of(positions, tree_pass);
        return static_cast<double>(calls) * draft_.value + any_pass_of(positions, tree_pass) + overhead_.value;
    }

    /// A tree step of `b` sequences drafted one sequence at a time (`calls` draft calls each,
    /// each at one sequence's cost) and a pass over `positions` positions in total.
    [[nodiscard]] double tree_cost_per_sequence(std::size_t calls, std::size_t positions, std::size_t b,
                                                bool tree_pass) const {
        const double sequences = static_cast<double>(b);
        if (options_.profile)
            return sequences * static_cast<double>(calls) * options_.profile->draft_cost(1) +
                   any_pass_of(positions, tree_pass);
        if (options_.pass_cost) return sequences * options_.draft_cost(calls) + any_pass_of(positions, tree_pass);
        return sequences * static_cast<double>(calls) * draft_.value + any_pass_of(positions, tree_pass) +
               overhead_.value;
    }

    /// Whether the plan's pass goes through the tree call (see tree_plan_limits::chains_as_chain_steps).
    [[nodiscard]] bool plan_tree_pass(std::size_t p) const {
        if (!plans_trees()) return false;
        if (is_best(p)) return !(tree_.chains_as_chain_steps && best_[p - shapes_.size()].chain);
        const auto& v = shapes_[p];
        return !(tree_.chains_as_chain_steps && detail::is_chain_shape(v));
    }

    // Plans: for a chain controller, plan g is γ = g; for a tree planner, plan i is shapes_[i]
    // (shapes_[0] the plain step), in order of depth then nodes, then the best trees best_[i −
    // shapes_.size()] (tree_plan_limits::best_trees).
    [[nodiscard]] bool is_best(std::size_t p) const noexcept { return p >= shapes_.size(); }
    [[nodiscard]] std::size_t plan_count() const {
        return plans_trees() ? shapes_.size() + best_.size() : gamma_max_ + 1;
    }
    [[nodiscard]] std::size_t plan_depth(std::size_t p) const {
        if (!plans_trees()) return p;
        return is_best(p) ? best_[p - shapes_.size()].depth : shapes_[p].size();
    }
    [[nodiscard]] double plan_tokens(std::size_t p) const {
        if (!plans_trees()) return expected_tokens(p);
        return is_best(p) ? best_[p - shapes_.size()].tokens : expected_tokens(std::span<const std::size_t>(shapes_[p]));
    }
    [[nodiscard]] double plan_cost(std::size_t p, std::size_t b) const {
        if (!plans_trees()) return expected_cost(p, b);
        if (is_best(p)) {
            const best_plan_tree& t = best_[p - shapes_.size()];
            return tree_cost(t.nodes, t.parents, t.depth, t.chain, b);
        }
        return expected_cost(std::span<const std::size_t>(shapes_[p]), b);
    }
    /// The plan chosen at the last choose() (a tree planner's) for one sequence, cut at depth
    /// q.limit: its expected tokens (planned_tree_tokens()), nodes, nodes with children (the
    /// root included when it has any) and depth.
    struct cut_tree {
        double tokens = 1.0;
        std::size_t nodes = 0, parents = 0, depth = 0;
    };
    [[nodiscard]] cut_tree cut_planned_tree(const sequence_acceptance& q) const {
        cut_tree out;
        if (planned_ == 0) return out;
        const auto a = [&](std::size_t k) {
            const double pooled = shrunk_sibling(k);
            const double sum = k - 1 < q.sibling_expected.size() ? q.sibling_expected[k - 1] : 0.0;
            const double count = k - 1 < q.sibling_reached.size() ? static_cast<double>(q.sibling_reached[k - 1]) : 0.0;
            return own_estimate(sum, count, pooled);
        };
        if (!is_best(planned_)) {
            double run = 1.0;
            std::size_t level = 1;
            const auto& shape = shapes_[planned_];
            for (std::size_t d = 0; d < shape.size() && d < q.limit; ++d) {
                double fail = 1.0;
                for (std::size_t k = 1; k <= shape[d] && k <= sibling_.size(); ++k) fail *= 1.0 - a(k);
                run *= 1.0 - fail;
                out.tokens += run;
                out.parents += level;
                level *= shape[d];
                out.nodes += level;
                out.depth = d + 1;
            }
            return out;
        }
        detail::rank_weights_of(a, sibling_.size(), drain_weights_);
        // (probability of reaching and accepting the node, its depth), breadth first
        drain_reach_.assign(1, {1.0, 0});
        const auto& children = planned_best_.children;
        for (std::size_t i = 0; i < children.size() && i < drain_reach_.size(); ++i) {
            const auto [reach, depth] = drain_reach_[i];
            if (children[i] != 0 && depth < q.limit) ++out.parents;
            for (std::size_t r = 0; r < children[i]; ++r) {
                const double p = reach * (r < drain_weights_.size() ? drain_weights_[r] : 0.0);
                drain_reach_.push_back({p, depth + 1});
                if (depth + 1 <= q.limit) {
                    out.tokens += p;
                    ++out.nodes;
                    out.depth = std::max(out.depth, depth + 1);
                }
            }
        }
        return out;
    }
    /// Whether the plan chosen at the last choose() (a tree planner's) has one child per node.
    [[nodiscard]] bool planned_is_chain() const {
        if (is_best(planned_)) return planned_best_.chain;
        return detail::is_chain_shape(shapes_[planned_]);
    }
    /// drain_to_plain()'s cost of a step of the planned trees of the sequences
    /// drain_order_[k..n) (their cuts in drain_cut_), as tree_cost() charges a whole tree.
    [[nodiscard]] double cut_trees_cost(std::size_t k, std::size_t n) const {
        const bool chain = planned_is_chain();
        const bool tree_pass = !(chain && tree_.chains_as_chain_steps);
        std::size_t positions = 0, calls_sum = 0, calls_max = 0;
        for (std::size_t j = k; j < n; ++j) {
            const cut_tree& t = drain_cut_[drain_order_[j].second];
            const std::size_t calls = tree_.draft_calls == tree_draft_calls::per_level ? t.depth : t.parents;
            positions += t.nodes + 1;
            calls_sum += calls;
            calls_max = std::max(calls_max, calls);
        }
        const std::size_t b = n - k;
        if (tree_.drafts_per_sequence && b > 1 && !(chain && tree_.chains_batched))
            return tree_cost_per_sequence(calls_sum, positions, 1, tree_pass);
        return cost_of(calls_max, positions, b, tree_pass);
    }
    [[nodiscard]] std::size_t plan_positions(std::size_t p, std::size_t b) const {
        if (!plans_trees()) return b * (p + 1);
        if (is_best(p)) return b * (best_[p - shapes_.size()].nodes + 1);
        std::size_t nodes = 0, level = 1;
        for (const std::size_t x : shapes_[p]) nodes += level *= x;
        return b * (nodes + 1);
    }
    /// The first plan when nothing is known and costs are measured (with known costs: when the
    /// best plan under the priors is a plain step): γ = 1, or a tree of one level of (up to) two
    /// children, so that a_1 and a_2 are seen.
    [[nodiscard]] std::size_t warm_plan() const {
        if (!plans_trees()) return 1;
        for (std::size_t i = 1; i < shapes_.size(); ++i)
            if (shapes_[i].size() == 1 && shapes_[i][0] == std::min<std::size_t>(2, tree_.branching[0])) return i;
        return 1;
    }
    /// The plan with the most expected tokens per unit of cost among those of depth <= top;
    /// ties go to the earlier plan (shorter, then fewer nodes).
    [[nodiscard]] std::size_t best_plan(std::size_t top, std::size_t b) const {
        std::size_t best = 0;
        double best_rate = -1.0;
        for (std::size_t p = 0; p < plan_count(); ++p) {
            if (plan_depth(p) > top) continue;
            const double cost = plan_cost(p, b);
            const double rate = cost > 0 ? plan_tokens(p) / cost : std::numeric_limits<double>::infinity();
            if (rate > best_rate * (1 + 1e-9)) {
                best_rate = rate;
                best = p;
            }
        }
        return best;
    }
    /// The plan an exploring step tries beside `best`: γ ± 1 for chains; for trees, the best
    /// shape with one more child at the first level (so that the next sibling rank is seen),
    /// else one level deeper, else one level shallower.
    [[nodiscard]] std::size_t neighbour(std::size_t best, std::size_t top) const {
        if (!plans_trees()) return best < top ? best + 1 : best - 1;
        if (is_best(best)) {  // the best tree of one node more of the same depth limit, else one less
            const std::size_t j = best - shapes_.size(), per_depth = best_tree_nodes_ - 1;
            const std::size_t n = j % per_depth;  // (n + 2 nodes)
            if (n + 1 < per_depth && best_[j + 1].depth <= top) return best + 1;
            if (n > 0 && best_[j - 1].depth <= top) return best - 1;
            return best;
        }
        std::vector<std::size_t> v = shapes_[best];
        const auto find = [&](const std::vector<std::size_t>& w) {
            for (std::size_t i = 0; i < shapes_.size(); ++i)
                if (shapes_[i] == w && w.size() <= top) return i;
            return shapes_.size();
        };
        if (!v.empty() && v[0] < tree_.branching[0]) {
            ++v[0];
            if (const std::size_t i = find(v); i < shapes_.size()) return i;
            --v[0];
        }
        if (v.size() < tree_.branching.size()) {
            v.push_back(1);
            if (const std::size_t i = find(v); i < shapes_.size()) return i;
            v.pop_back();
        }
        if (!v.empty()) {
            v.pop_back();
            if (const std::size_t i = find(v); i < shapes_.size()) return i;
        }
        return best;
    }
    /// Every shape within the limits (and the plain step first), by depth then nodes; at most
    /// max_shapes of them: where the limits allow more, every shape of at most n nodes for the
    /// largest n that fits, so that the small shapes (the warm-up's one level of two, a second
    /// child at the root) are always among them.
    void enumerate_shapes() {
        constexpr std::size_t max_shapes = 4096;  // a planner's choice stays cheap per step
        shapes_.assign(1, {});
        std::vector<std::size_t> v;
        const auto nodes_of = [](const std::vector<std::size_t>& w) {
            std::size_t n = 0, level = 1;
            for (const std::size_t x : w) n += level *= x;
            return n;
        };
        // Visits the shapes of at most `limit` nodes depth first (b_d ascending; a shape's nodes
        // grow with each b_d and each level, so the walk stops at the first that exceeds the
        // limit), while `visit` returns true.
        const auto walk = [&](std::size_t limit, auto&& visit) {
            const auto go = [&](auto&& self, std::size_t nodes, std::size_t level) -> bool {
                if (v.size() == tree_.branching.size()) return true;
                for (std::size_t b = 1; b <= tree_.branching[v.size()]; ++b) {
                    if (b > (limit - nodes) / level) break;  // nodes + level·b > limit (no overflow)
                    v.push_back(b);
                    const bool more = visit() && self(self, nodes + level * b, level * b);
                    v.pop_back();
                    if (!more) return false;
                }
                return true;
            };
            v.clear();
            (void)go(go, 0, 1);
        };
        const auto count_within = [&](std::size_t limit) {  // up to max_shapes + 1
            std::size_t count = 0;
            walk(limit, [&] { return ++count <= max_shapes; });
            return count;
        };
        std::size_t limit = tree_.max_nodes != 0 ? tree_.max_nodes : std::numeric_limits<std::size_t>::max();
        if (count_within(limit) > max_shapes) {
            std::size_t lo = 1, hi = limit;  // count_within(lo) <= max_shapes < count_within(hi)
            while (hi - lo > 1) {
                const std::size_t mid = lo + (hi - lo) / 2;
                (count_within(mid) <= max_shapes ? lo : hi) = mid;
            }
            limit = lo;
        }
        walk(limit, [&] {
            shapes_.push_back(v);
            return true;
        });
        std::stable_sort(shapes_.begin(), shapes_.end(), [&](const auto& a, const auto& c) {
            return a.size() != c.size() ? a.size() < c.size() : nodes_of(a) < nodes_of(c);
        });
    }
    /// The best trees (tree_plan_limits::best_trees) for the current sibling acceptance: for each
    /// depth limit L (1 to the limits' depth, at most best_tree_nodes_) and node count n (2 to
    /// best_tree_nodes_), the best tree of at most n nodes and depth L, at
    /// best_[(L − 1) · (best_tree_nodes_ − 1) + n − 2].
    /// Reuses its storage: no allocation once the trees have held as many entries. A tree's cost
    /// depends on its node count, its depth and, with a draft call per node with children
    /// (tree_draft_calls::per_parent), on how many nodes have children, which the program does
    /// not weigh (a draft call's cost does not scale with the probability that verification
    /// reaches the node, so it does not fit the recursion): there the plan can be a tree of as
    /// many tokens that costs a draft call more than the best (engine_profile_test: within 3% of
    /// the best rate of every tree; with one call per level, the best).
    void refresh_best_trees() {
        if (!tree_.best_trees) return;
        if (best_tree_nodes_ == 0) {
            std::size_t full = 0, level = 1;
            for (const std::size_t b : tree_.branching) {
                level = std::min(level * b, best_tree_node_cap);
                full = std::min(full + level, best_tree_node_cap);
            }
            best_tree_nodes_ = std::min(full, tree_.max_nodes == 0 ? best_tree_node_cap : tree_.max_nodes);
            if (best_tree_nodes_ < 2) {
                best_tree_nodes_ = 1;  // nothing beyond the uniform shapes
                return;
            }
            // Depth limits past the node count give the trees of that limit: not planned twice.
            best_depths_ = std::min(tree_.branching.size(), best_tree_nodes_);
            best_.resize(best_depths_ * (best_tree_nodes_ - 1));
            for (std::size_t j = 0; j < best_.size(); ++j) {  // the most each can hold: no allocation later
                best_[j].children.reserve(j % (best_tree_nodes_ - 1) + 3);
                best_[j].widest.reserve(j / (best_tree_nodes_ - 1) + 1);
            }
            planned_best_.children.reserve(best_tree_nodes_ + 1);
            planned_best_.widest.reserve(best_depths_);
            reach_.reserve(best_tree_nodes_ + 1);
            drain_reach_.reserve(best_tree_nodes_ + 1);
        }
        if (best_.empty()) return;
        detail::rank_weights_of([this](std::size_t k) { return shrunk_sibling(k); }, sibling_.size(), rank_weights_);
        for (std::size_t depth = 1; depth <= best_depths_; ++depth) {
            table_.compute(rank_weights_, std::span<const std::size_t>(tree_.branching).first(depth), best_tree_nodes_);
            for (std::size_t n = 2; n <= best_tree_nodes_; ++n) {
                best_plan_tree& t = best_[(depth - 1) * (best_tree_nodes_ - 1) + n - 2];
                table_.tree(n, t.children);
                if (t.children.empty()) t.children.push_back(1);
                // Its E[tokens] (the probability of reaching and accepting each node, summed), node
                // count, nodes with children, depth and widest node per depth.
                reach_.assign(1, 1.0);
                t.tokens = 1.0;
                for (std::size_t i = 0; i < t.children.size(); ++i)
                    for (std::size_t r = 0; r < t.children[i]; ++r) {
                        const double p = reach_[i] * (r < rank_weights_.size() ? rank_weights_[r] : 0.0);
                        reach_.push_back(p);
                        t.tokens += p;
                    }
                t.nodes = 0;
                t.parents = 0;
                t.chain = true;
                t.widest.clear();
                std::size_t level_begin = 0, level_end = 1, d = 0;
                while (level_begin < level_end && level_begin < t.children.size()) {
                    std::size_t next_end = level_end;
                    for (std::size_t i = level_begin; i < level_end && i < t.children.size(); ++i) {
                        const std::size_t k = t.children[i];
                        if (k == 0) continue;
                        if (t.widest.size() <= d) t.widest.resize(d + 1, 0);
                        t.widest[d] = std::max(t.widest[d], k);
                        t.nodes += k;
                        ++t.parents;
                        t.chain = t.chain && k == 1;
                        next_end += k;
                    }
                    level_begin = level_end;
                    level_end = next_end;
                    ++d;
                }
                t.depth = t.widest.size();
            }
        }
    }

    /// A sibling rank never tested yet is taken as this fraction of the rank before it. Later
    /// siblings are accepted less often (each is tested against what the earlier ones left of the
    /// target's mass, and is drawn from what they left of the draft's), and a rank is tested only
    /// when every earlier one was rejected, so it can stay unseen for many steps; taking it equal
    /// to the rank before made a fresh planner's first trees too wide (planner_bench, draft noise
    /// 1.0, B = 1: 0.960x the best fixed shape; with 0.5, 1.012x, and every cell >= 0.979x;
    /// measured then over 8 batches, with prior_weight 2 and before best trees). The shipped
    /// pair's a_2 / a_1 is about 0.5 too (docs/trees.md: 0.372 / 0.696 at T = 0.7).
    static constexpr double unseen_rank_ratio = 0.5;
    /// a_k as the choice uses it: a_1 shrunk towards 1/2, each later rank towards the one before
    /// (prior_weight pseudo-observations), so that a rank seen a few times leans on the others;
    /// a rank never tested, unseen_rank_ratio times the one before.
    [[nodiscard]] double shrunk_sibling(std::size_t k) const {
        if (k == 0 || sibling_.empty()) return 0.0;
        const double w = options_.prior_weight;
        const auto& given = options_.acceptance_prior;
        double prior = 0.5;
        // Ranks past sibling_ are wider than any plan, so never tested: their prior, or
        // unseen_rank_ratio per rank times the last one kept.
        if (k > sibling_.size() && !given.empty()) return given[std::min(k - 1, given.size() - 1)];
        const std::size_t kept = std::min(k, sibling_.size());
        for (std::size_t j = 0; j < kept; ++j) {
            if (!given.empty()) prior = given[std::min(j, given.size() - 1)];
            if (sibling_[j].count == 0) {  // never tested: its prior, or a fraction of the rank before
                if (j > 0 && given.empty()) prior *= unseen_rank_ratio;
                continue;
            }
            const auto n = static_cast<double>(sibling_[j].count);
            prior = (n * sibling_[j].value + w * prior) / (n + w);
        }
        if (k > kept) prior *= std::pow(unseen_rank_ratio, static_cast<double>(k - kept));
        return prior;
    }
    [[nodiscard]] std::string explain_tree(std::size_t b) const {
        const std::size_t best = best_plan(gamma_max_, b);
        const std::string who = std::to_string(b) + (b == 1 ? " sequence" : " sequences");
        const char* source = options_.profile ? "costs from the profile"
                             : options_.pass_cost ? "costs from the callbacks"
                                                  : "costs as timed";
        const auto speedup = [&](std::size_t p) { return plan_tokens(p) / plan_cost(p, b) * plan_cost(0, b); };
        const auto name = [&](std::size_t p) {
            std::string n;
            if (is_best(p)) {
                const best_plan_tree& t = best_[p - shapes_.size()];
                if (t.chain) return "chain of " + std::to_string(t.depth);
                n = "best tree of " + std::to_string(t.nodes) + " nodes (children";
                for (std::size_t i = 0; i < t.children.size(); ++i) n += (i ? "," : " ") + std::to_string(t.children[i]);
                return n + ")";
            }
            bool chain = true;
            for (const std::size_t x : shapes_[p]) chain = chain && x == 1;
            if (chain) return "chain of " + std::to_string(shapes_[p].size());
            n = "tree";
            for (std::size_t d = 0; d < shapes_[p].size(); ++d) n += (d ? "," : " ") + std::to_string(shapes_[p][d]);
            return n;
        };
        char buf[600];  // (a best tree's name lists its children: up to about 200 characters)
        std::string ranks;
        for (std::size_t k = 1; k <= sibling_.size(); ++k) {
            std::snprintf(buf, sizeof buf, "%s%.2f", k == 1 ? "" : " ", shrunk_sibling(k));
            ranks += buf;
        }
        if (best == 0) {
            std::size_t runner = 1;
            for (std::size_t p = 1; p < plan_count(); ++p)
                if (speedup(p) > speedup(runner)) runner = p;
            std::snprintf(buf, sizeof buf, "speculation off for %s: best predicted %.2fx (%s); sibling acceptance ",
                          who.c_str(), speedup(runner), name(runner).c_str());
            return buf + ranks + "; " + source + explain_drain();
        }
        std::snprintf(buf, sizeof buf, "%s for %s: predicted %.2fx plain steps (sibling acceptance ", name(best).c_str(),
                      who.c_str(), speedup(best));
        return buf + ranks + "; " + source + ")" + explain_drain();
    }

    /// The predicted time an exploring step at γ = `other` loses against one at `best`: its
    /// cost beyond what `best` needs for as many expected tokens, plus a draft model's catch-up
    /// on the tokens of the plain steps since it last ran (catch_up_cost()).
    [[nodiscard]] double exploring_cost(std::size_t other, std::size_t best) const {
        const double per_token = plan_cost(best, sequences_) / plan_tokens(best);
        double extra = std::max(0.0, plan_cost(other, sequences_) - plan_tokens(other) * per_token);
        if (other > 0) extra += catch_up_cost();
        return extra;
    }

    /// What the draft model pays to catch up on the lag_ tokens of the plain steps since it last
    /// drafted, when it drafts again. With a profile: engine_profile::catch_up_cost (its
    /// draft_catch_up table when measured, else a draft step per token: a conservative guess, so
    /// that a plan from known costs does not switch a slow draft model back on for a gain its
    /// catch-up eats); with cost callbacks, a drafted token's cost per token; measured: the
    /// catch-up's own time per token once seen, until then a draft token's.
    [[nodiscard]] double catch_up_cost() const {
        if (lag_ == 0) return 0.0;
        if (options_.profile) return options_.profile->catch_up_cost(lag_, sequences_);
        const double per_token = options_.pass_cost ? options_.draft_cost(1) - options_.draft_cost(0)
                                 : catch_up_.count != 0 ? catch_up_.value
                                                        : draft_.value;
        return static_cast<double>(lag_) * per_token;
    }

    /// The acceptance the choice uses at position i: position 1's estimate shrunk towards 1/2,
    /// each deeper one's towards the position before it (prior_weight pseudo-observations
    /// each), so that a deep position seen only a few times neither drags a high acceptance
    /// down to 1/2 nor stands on a lucky run; an unseen one takes the position before it.
    [[nodiscard]] double shrunk_acceptance(std::size_t i) const {
        if (i == 0 || i > alpha_.size()) return 0.0;
        const double w = options_.prior_weight;
        const auto& given = options_.acceptance_prior;
        double prior = 0.5;
        for (std::size_t k = 0; k < i; ++k) {
            if (!given.empty()) prior = given[std::min(k, given.size() - 1)];
            if (alpha_[k].count == 0) continue;  // unseen: its prior, or the position before it
            const auto n = static_cast<double>(alpha_[k].count);
            prior = (n * alpha_[k].value + w * prior) / (n + w);
        }
        return prior;
    }

    /// Whether a pass over m positions (a tree pass when `tree`) has been timed.
    [[nodiscard]] bool pass_measured(std::size_t m, bool tree = false) const {
        const auto& table = tree ? tree_pass_ : pass_;
        return m - 1 < table.size() && table[m - 1].count != 0;
    }

    /// The pass's cost at m positions in the cost unit (what expected_cost adds for the pass).
    [[nodiscard]] double pass_of(std::size_t m) const { return any_pass_of(m, false); }

    /// The cost of a chain pass or (`tree`) a tree pass over m positions: from the profile, the
    /// callbacks (tree_pass_cost, else pass_cost), or the measurements (a tree pass from the
    /// timed tree passes; until one is timed, as a chain pass).
    [[nodiscard]] double any_pass_of(std::size_t m, bool tree) const {
        if (options_.profile) return tree ? options_.profile->tree_pass_cost(m) : options_.profile->pass_cost(m);
        if (options_.pass_cost) return tree && options_.tree_pass_cost ? options_.tree_pass_cost(m) : options_.pass_cost(m);
        if (tree && tree_pass_timed_) return pass_time(m, tree_pass_);
        return pass_time(m, pass_);
    }

    /// t_pass(m) from the measured lengths of `pass_` (see the class comment), or of another table.
    [[nodiscard]] double pass_time(std::size_t m) const { return pass_time(m, pass_); }
    [[nodiscard]] static double pass_time(std::size_t m, const std::vector<estimate>& table) {
        const std::size_t k = m - 1;
        if (k < table.size() && table[k].count != 0) return table[k].value;
        std::size_t lo = k, hi = k;
        bool has_lo = false, has_hi = false;
        for (std::size_t j = std::min(k, table.size()); j-- > 0;)
            if (table[j].count != 0) { lo = j; has_lo = true; break; }
        for (std::size_t j = k + 1; j < table.size(); ++j)
            if (table[j].count != 0) { hi = j; has_hi = true; break; }
        const auto at = [&](std::size_t j) { return table[j].value; };
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
                if (table[j].count != 0) { second = j; has_second = true; break; }
        } else {
            for (std::size_t j = near + 1; j < table.size(); ++j)
                if (table[j].count != 0) { second = j; has_second = true; break; }
        }
        if (has_second) return line(std::min(near, second), std::max(near, second));
        return at(near) * static_cast<double>(k + 1) / static_cast<double>(near + 1);
    }

    adaptive_gamma_options options_;
    std::size_t gamma_max_;
    std::vector<estimate> alpha_;  // by draft position (0-based)
    std::vector<estimate> pass_;   // by positions − 1 (over all sequences of the pass)
    std::vector<estimate> tree_pass_;  // the same for tree passes (a tree planner's tree steps)
    bool tree_pass_timed_ = false;     // tree_pass_ holds an observation
    estimate draft_, overhead_, catch_up_;
    std::vector<std::size_t> chosen_;
    std::size_t last_best_ = std::numeric_limits<std::size_t>::max();
    std::size_t explore_interval_;
    std::size_t since_explore_ = 0;
    std::size_t drafted_steps_ = 0;  // steps that asked for a draft
    std::size_t lag_ = 0;            // tokens appended since the drafter last ran
    double total_ = 0.0;             // predicted cost of all steps so far
    double explored_ = 0.0;          // predicted loss of the exploring steps so far
    std::size_t sequences_ = 1;      // the sequences of the step being planned
    tree_plan_limits tree_{};        // a tree planner's limits (empty: chains)
    std::vector<std::vector<std::size_t>> shapes_{};  // a tree planner's plans (0: plain)
    /// A best tree (refresh_best_trees): its children list, widest node per depth, node count,
    /// nodes with children (the root included), depth, whether it is a chain, and E[tokens].
    struct best_plan_tree {
        std::vector<std::size_t> children{}, widest{};
        std::size_t nodes = 0, parents = 0, depth = 0;
        bool chain = false;
        double tokens = 1.0;
    };
    std::vector<best_plan_tree> best_{};   // a tree planner's best trees, after shapes_ as plans
    best_plan_tree planned_best_{};        // the best tree of the last choose(), as chosen
    std::size_t best_tree_nodes_ = 0;      // their largest node count (0: not sized yet)
    std::size_t best_depths_ = 0;          // their depth limits, 1 to this
    detail::best_tree_table table_{};      // refresh_best_trees' scratch
    std::vector<double> rank_weights_{}, reach_{};
    // planned_tree_tokens()' scratch: rank weights; each node's probability and depth
    mutable std::vector<double> drain_weights_{};
    mutable std::vector<std::pair<double, std::size_t>> drain_reach_{};
    drain_times drain_last_{};  // drain_to_plain()'s last comparison
    std::vector<cut_tree> drain_cut_{};  // drain_to_plain's: each sequence's cut tree
    std::vector<estimate> sibling_{};                 // a_k by sibling rank (0-based)
    std::size_t planned_ = 0;        // the plan of the last choose()
    mutable std::vector<double> ragged_alpha_{};      // plan_sequences' scratch
    std::vector<std::pair<double, std::size_t>> drain_order_{};  // drain_to_plain's: finishing step, sequence
    bool exploring_ = false;                           // the last choose() chose an exploring or warm-up step
    std::size_t drained_ = 0;                          // steps drain_to_plain() made plain
    std::size_t drained_trees_ = 0;                    // those whose plan was a tree (not a chain)
    double drain_plain_ = 0.0, drain_plan_ = 0.0;      // its last predicted times to finish: plain, the plan
};

}  // namespace specdec
