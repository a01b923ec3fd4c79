#pragma once
/// \file
/// The settings of every decoding entry point, built from independent parts, the same for one
/// sequence (speculative_decode) and for many (batch_decoder); the one event every step
/// reports; and the result of a run.
///
/// | part                 | what it says                                                        |
/// |----------------------|---------------------------------------------------------------------|
/// | `step`               | the step's shape: a `chain` of γ tokens, or a `tree`                 |
/// | `length`             | fixed, or adaptive (γ or the tree's depth chosen per step)           |
/// | `sampling`           | the target's sampling settings: the output's distribution            |
/// | `draft`              | the draft's own sampling settings and the draft-side stop            |
/// | `budget`             | how many tokens, and which tokens end a sequence                     |
/// | `on_step`            | a callback after every step of every sequence                        |
///
/// \code
/// specdec::decode_options chain_opts{.step = specdec::chain{.gamma = 4},
///                                    .sampling = {.temperature = 0.7f},
///                                    .budget = {.max_new_tokens = 64, .stop_tokens = {2}}};
/// specdec::decode_options tree_opts{.step = specdec::tree{.shape = {.branching = {2, 2, 1, 1}}},
///                                   .length = {.policy = specdec::gamma_policy::adaptive}};
/// \endcode

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "adaptive_gamma.hpp"
#include "tree.hpp"
#include "types.hpp"
#include "verify_types.hpp"

namespace specdec {

/// A step that drafts a chain of γ tokens and verifies it (Leviathan et al. 2023, Alg. 1).
struct chain {
    /// γ, draft tokens per step (each step asks for at most its tokens still needed − 1, so no
    /// draft work is wasted at the end). 0: no drafts, a plain target step per token (a
    /// baseline). Under the adaptive policy, the longest draft it may choose (then >= 1).
    std::size_t gamma = 4;
    /// Token or block verification; block (Sun et al. 2024) is the default. Both are exact.
    verification_scheme scheme = verification_scheme::block;
    /// Lenience l in (0, 1]. **l < 1 changes the output distribution** (Leviathan et al.
    /// App. A.5; see verify_options::lenience); 1, the default, is exact. Needs
    /// scheme = verification_scheme::token.
    float lenience = 1.0f;
    /// Compute β_i = Σ min(p_i, q_i) of every tested draft position, into
    /// decode_stats::expected_accepted_at_position and step_event::acceptance (always on
    /// under the adaptive policy). Costs one standardization of each tested target row; does
    /// not change the output.
    bool estimate_acceptance = false;
};

/// A step that drafts a token tree and verifies it exactly (tree_verify.hpp): a plain
/// LanguageModel drafter samples shape.branching[d] siblings per node at depth d; a
/// TreeDrafter proposes its own tree of at most that shape; a BlockDrafter's block is a chain
/// as deep as the shape. The target scores the root and every node in one score_tree pass (a
/// TreeVerifier), or one pass per root-to-leaf path.
struct tree {
    /// Branching per depth and an optional node budget, e.g. `{.branching = {2, 2, 1, 1}}` or
    /// `{.branching = {4, 4, 2, 1}, .max_nodes = 16}`. Under the adaptive policy these are the
    /// limits within which the tree planner chooses each step's shape (a tree, a chain or a
    /// plain step; make_controller()).
    tree_shape shape{};
    /// Traversal verification (the default) or recursive rejection sampling; both exact.
    tree_verification_scheme scheme = tree_verification_scheme::traversal;
    /// Compute the acceptance by sibling rank at each step's root (tree_verify_result::
    /// sibling_acceptance) into decode_stats::expected_accepted_at_sibling and
    /// step_event::sibling_acceptance (always on under the adaptive policy, which plans from
    /// it). One pass over the vocabulary per tested child of the root; does not change the
    /// output.
    bool estimate_sibling_acceptance = false;
};

/// The shape of every step: a chain (the default) or a tree.
using step_shape = std::variant<chain, tree>;

/// How long each step's draft is: the chain's γ or the tree's depth.
struct draft_length {
    /// Fixed (the step's γ or tree at every step) or adaptive: before each step, the plan with
    /// the most expected tokens per unit of time, from what earlier steps measured
    /// (gamma_controller): for a chain, γ in [0, longest]; for a tree, any shape within the
    /// step's (branching b_d up to the shape's per depth, any depth up to its own, within its
    /// node budget; all b_d = 1 is a chain), or a plain step. A plain step (γ = 0) means a pair
    /// for which speculation does not pay decodes at about the target's own speed. Exact either
    /// way: the choice depends on the past only.
    gamma_policy policy = gamma_policy::fixed;
    /// Settings of the adaptive policy (exploration, smoothing, known costs). Unless a profile
    /// or both cost callbacks are set, each draft call and target pass is timed with a steady
    /// clock, and the choice (so the tokens) then depends on timings: give a profile
    /// (measure_engine_profile) or the cost callbacks for runs that a seed reproduces.
    adaptive_gamma_options adaptive{};
    /// The adaptive policy's estimates, kept across calls (successive requests of one model
    /// pair, or a batch_decoder's steps): a controller of your own, made as make_controller()
    /// makes it (gamma_max equal to the chain's γ; for a tree, the tree planner with the shape's
    /// limits); `adaptive` is then unused. Null (the default): a
    /// fresh one per speculative_decode call or per batch_decoder. Must outlive the call or
    /// the decoder.
    gamma_controller* controller = nullptr;
};

/// The draft's side of each step.
struct draft_settings {
    /// The draft's own sampling settings: when set, the drafter samples its proposals with
    /// these (a plain LanguageModel drafter standardizes its logits with them; a BlockDrafter
    /// or TreeDrafter receives them as its `sampling` argument), e.g. a draft at another
    /// temperature or top-k than the target. Unset (the default): the target's `sampling`,
    /// which usually gives the most accepted tokens. Exact either way: verification takes q
    /// from the distributions the draft tokens were actually sampled from (Leviathan et al.
    /// 2023, App. A.1 holds for any q). \pre valid settings, as validate() checks.
    std::optional<sampling_config> sampling{};
    /// The draft-side stop: a chain's block ends after the first token x_i whose draft
    /// probability q_i(x_i) is below this; in a tree, such a node gets no children. 0 (the
    /// default) turns it off. llama.cpp's p_min idea made exact: the low token is kept and
    /// verified as usual, and since where the draft ends depends on draft values only, the
    /// output keeps the target's distribution. A tree is pruned after it is drafted: the stop
    /// saves target positions there, not draft calls (a chain's model drafter stops drafting).
    /// \pre 0 <= stop_below <= 1.
    float stop_below = 0.0f;
};

/// How many tokens a sequence may generate and which tokens end it.
struct decode_budget {
    /// Exactly this many tokens are generated, unless a stop token ends the run earlier.
    std::size_t max_new_tokens = 128;
    /// Generating any of these ends the sequence; the stop token is included in the output.
    std::vector<token_id> stop_tokens{};
};

/// Where a step's time went, measured when the decoding call has an on_step callback (a few
/// clock reads per step; nothing when it has none). In a batch the three parts are those of the
/// batch's step, which all its sequences share: one drafting phase, one target pass, then the
/// library's own work for all of them.
struct step_timing {
    /// When the step began.
    std::chrono::steady_clock::time_point start{};
    /// Drafting (all sequences of the batch); 0 for a plain target step.
    double draft_seconds = 0.0;
    /// The target pass (all sequences of the batch).
    double target_seconds = 0.0;
    /// The rest of the step: verification, commit, statistics and the adaptive policy's plan.
    double library_seconds = 0.0;
};

/// What the per-step callback sees, for every step of every sequence, chain or tree. Spans and
/// the tree pointer are valid during the call only.
struct step_event {
    /// The sequence: batch_decoder's id (0 in speculative_decode).
    std::size_t sequence = 0;
    /// A chain step: the block the drafter proposed. A tree step: the accepted path. Empty for
    /// a plain target step.
    std::span<const token_id> draft{};
    /// How many draft tokens were accepted (by verification: a stop token among them still
    /// cuts the output, see `emitted`).
    std::size_t accepted = 0;
    /// The token the target added: a correction after a rejection, a bonus otherwise (not in
    /// the output when a stop token came before it).
    token_id next_token = 0;
    /// The tokens appended to the output by this step (the accepted tokens, then next_token,
    /// cut after a stop token and at the budget). Stream these.
    std::span<const token_id> emitted{};
    /// β of each chain draft position the step tested (see step_result::acceptance); empty
    /// unless acceptance is estimated, and for tree steps.
    std::span<const float> acceptance{};
    /// A tree step: a_k of each child of the root it tested (tree_verify_result::
    /// sibling_acceptance); empty unless sibling acceptance is estimated, and for chains.
    std::span<const float> sibling_acceptance{};
    /// The γ (chain) or depth (tree) this step asked for: the adaptive policy's choice; 0 for
    /// a plain target step. The drafter may have proposed fewer.
    std::size_t gamma = 0;
    /// A tree step: the tree the drafter proposed (after the draft-side stop); null for chains.
    const draft_tree* tree = nullptr;
    /// A tree step: the accepted node (−1: none); its path is `draft`.
    std::int32_t last_node = -1;
    /// Target passes this step cost this sequence (one per step with a batched or tree
    /// verifier; more when a plain model scores position by position or path by path).
    std::size_t target_passes = 0;
    /// Where the step's time went (see step_timing).
    step_timing timing{};
};

/// Settings of a decoding run: speculative_decode for one sequence, batch_decoder for many.
/// Aggregate of independent parts (see the file comment); designated initializers must follow
/// this order: step, length, sampling, draft, budget, on_step.
struct decode_options {
    /// A chain of γ (the default, γ = 4) or a tree.
    step_shape step = chain{};
    /// Fixed or adaptive γ (or tree depth).
    draft_length length{};
    /// Standardized sampling of the target: the output's distribution. The draft's too,
    /// unless draft.sampling is set.
    sampling_config sampling{};
    /// The draft's own sampling and the draft-side stop.
    draft_settings draft{};
    /// Token budget and stop tokens (in batch_decoder, those of sequences added without their own).
    decode_budget budget{};
    /// Called after every step of every sequence with what it produced (for streaming), on
    /// the calling thread; may be empty.
    std::function<void(const step_event&)> on_step{};
};

/// The controller a decoding call makes for the adaptive policy of `o`: a chain's (gamma_max =
/// the chain's γ) or a tree planner (the tree's shape as its limits), with o.length.adaptive.
/// Make your own this way to keep its estimates across calls (o.length.controller).
/// \throws std::invalid_argument as gamma_controller's constructors, and for a tree shape whose
///         children list is not a tree (tree_shape::children_problem).
/// `draft_calls`: how the tree drafter's calls grow with the tree (a decoder makes its own
/// controller with the value that fits its drafter: per_parent for a plain next_logits model,
/// per_level otherwise); `chains_batched` and `chains_as_chain_steps`: the fields of
/// tree_plan_limits (batch_decoder's own planner sets the latter when the drafter has a chain
/// call and the verifier scores a chain in one call, and the former when that chain call is
/// draft_batch). All three unused for chains, and set by batch_decoder on a caller's planner
/// to what its models do (gamma_controller::describe_models): a planner made by
/// make_controller(options) serves any pair.
[[nodiscard]] inline gamma_controller make_controller(const decode_options& o,
                                                      tree_draft_calls draft_calls = tree_draft_calls::per_level,
                                                      bool chains_batched = false, bool chains_as_chain_steps = false) {
    if (const auto* t = std::get_if<tree>(&o.step)) {
        const std::size_t depth = t->shape.depth();
        std::vector<std::size_t> branching;  // a children list's widest node per depth
        if (!t->shape.children.empty()) {
            if (const char* problem = t->shape.children_problem())
                detail::fail_invalid("specdec::make_controller: options.step.shape.children: ", problem);
            branching = t->shape.widest_per_depth();
        } else {
            branching.assign(t->shape.branching.begin(), t->shape.branching.begin() + static_cast<std::ptrdiff_t>(depth));
        }
        return gamma_controller(
            tree_plan_limits{.branching = std::move(branching),
                             // (a children list: its node count, at most max_nodes)
                             .max_nodes = t->shape.children.empty() ? t->shape.max_nodes : t->shape.nodes(),
                             .draft_calls = draft_calls,
                             .chains_batched = chains_batched,
                             .chains_as_chain_steps = chains_as_chain_steps},
            o.length.adaptive);
    }
    return gamma_controller(std::get<chain>(o.step).gamma, o.length.adaptive);
}

/// Outcome of a decoding run (or of one sequence of a batch_decoder).
struct decode_result {
    std::vector<token_id> tokens;                  ///< generated tokens, prompt excluded
    /// Work done: counts every verified token, also those after a stop token that `tokens`
    /// does not hold, so tokens_per_step() can exceed what the output gained per step.
    decode_stats stats;
    stop_reason stop = stop_reason::max_new_tokens;  ///< why the run ended
};

}  // namespace specdec
