#pragma once
/// \file
/// Speculative decoding with draft trees: each step drafts a tree of the requested shape,
/// scores the root and every node with the target (one pass with a TreeVerifier), verifies it
/// exactly (tree_verify.hpp) and appends the accepted path and one more token.

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "adapters.hpp"
#include "concepts.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "speculative_decode.hpp"
#include "tree.hpp"
#include "tree_verify.hpp"
#include "types.hpp"

namespace specdec {

/// What the per-step callback of speculative_decode_tree sees (valid during the call only).
struct tree_step_event {
    const draft_tree* tree = nullptr;      ///< the tree the drafter proposed
    std::size_t accepted = 0;              ///< tokens of the tree accepted (the depth of last_node)
    std::int32_t last_node = -1;           ///< the accepted node (−1: none)
    token_id next_token = 0;               ///< the token drawn after the accepted path
    std::span<const token_id> emitted;     ///< what this step appended (cut after a stop token)
    std::size_t target_passes = 0;         ///< target passes this step cost
    std::size_t depth = 0;                 ///< the depth this step asked for (the tree may be shallower)
};

/// Settings of speculative_decode_tree. Aggregate: `{.shape = {.branching = {3, 2, 1, 1}}}`.
struct tree_decode_options {
    /// Branching per depth and an optional node cap (see tree_shape). Each step asks for at
    /// most (tokens still needed − 1) levels, so no draft work is wasted at the end.
    tree_shape shape{};
    /// Traversal verification (the default) or recursive rejection sampling; both exact.
    tree_verification_scheme scheme = tree_verification_scheme::traversal;
    /// Exactly this many tokens are generated, unless a stop token ends the run earlier.
    std::size_t max_new_tokens = 128;
    /// Generating any of these ends the run; the stop token is included in the output.
    std::vector<token_id> stop_tokens{};
    /// Standardized sampling, applied identically to target and draft.
    sampling_config sampling{};
    /// Called after every step (for streaming); may be empty.
    std::function<void(const tree_step_event&)> on_step{};
};

/// Anything speculative_decode_tree can draft with: a TreeDrafter; a BlockDrafter (its block
/// becomes a chain as deep as the shape); or a plain LanguageModel (branching[d] siblings per
/// node at depth d, sampled from its standardized q as shape.draws says, one next_logits call
/// per node that has children, or one score_tree call per level when it is also a TreeVerifier).
template <class D>
concept AnyTreeDrafter = TreeDrafter<D> || BlockDrafter<D> || LanguageModel<D>;

/// Anything speculative_decode_tree can verify with: a TreeVerifier (one pass per step), or a
/// Verifier without score_tree(): a BatchVerifier then scores each root-to-leaf path (one
/// score() per leaf), a plain LanguageModel each node (nodes + 1 next_logits calls). Correct,
/// and slower; decode_stats::target_calls counts those passes.
template <class V>
concept AnyTreeVerifier = TreeVerifier<V> || Verifier<V>;

/// Reusable state of speculative_decode_tree (one per run; nothing allocated per step once the
/// shapes repeat).
struct tree_step_workspace {
    draft_tree tree;
    draft_block block;
    Eigen::MatrixXf scores;
    std::vector<Eigen::MatrixXf> draft_scores;  // one per level (see draft_tree_from_model)
    tree_verify_workspace verify;
    tree_shape shape;
    std::vector<token_id> path;
    std::vector<char> is_leaf;
    Eigen::VectorXf logits, q, scratch;
    sampling_workspace sampling;
};

namespace detail {

/// One step's draft: a tree of ws.shape (the first `depth` levels of the run's shape) into
/// ws.tree, from whichever kind of drafter D is (an empty tree when depth is 0).
template <class D>
void draft_tree_step(D& drafter, std::span<const token_id> context, std::size_t depth, const sampling_config& sampling,
                     uniform_source& uniforms, tree_step_workspace& ws, std::ptrdiff_t vocab, const char* where) {
    ws.tree.clear();
    if (depth > 0) {
        if constexpr (TreeDrafter<D>) {
            drafter.propose_tree(context, ws.shape, sampling, uniforms, ws.tree);
            if (ws.tree.size() > ws.shape.nodes() || static_cast<std::size_t>(ws.tree.max_depth()) > depth)
                fail_invalid(where, ": the drafter proposed ", ws.tree.size(), " nodes of depth up to ",
                                     ws.tree.max_depth(), "; at most ", ws.shape.nodes(), " of depth ", depth,
                                     " were asked for");
        } else if constexpr (BlockDrafter<D>) {
            ws.block.clear();
            drafter.draft(context, depth, sampling, uniforms, ws.block);
            // Checked as a chain's block is (length, token range, the sizes of probs and scales,
            // the scales' values) before tree_from_block reads its columns; a block that ends at
            // its own draft-side stop (draft_block::stop_below) keeps the tokens up to it.
            ws.block.tokens.resize(check_draft(ws.block, depth, vocab, where));
            tree_from_block(ws.block, ws.tree);
        } else {
            // Sampled from the model's own checked rows: in range and well formed by construction.
            draft_tree_from_model(drafter, context, ws.shape, sampling, uniforms, ws.tree, ws.path,
                                  ws.logits, ws.q, ws.scratch, ws.sampling, ws.draft_scores);
            return;
        }
        // What a drafter proposed is checked before the target sees any of it (a token out of
        // range must never reach the verifier's model); verify_tree checks the columns.
        check_tree_structure(ws.tree, vocab, where);
    }
}

/// Scores ws.tree after `context` into ws.scores (one score_tree pass, or path by path) and
/// checks the shape of what came back. Returns the target passes it took.
template <class V>
std::size_t score_tree_step(V& verifier, std::span<const token_id> context, tree_step_workspace& ws,
                            std::ptrdiff_t vocab, const char* where) {
    std::size_t passes = 1;
    if constexpr (TreeVerifier<V>) {
        verifier.score_tree(context, ws.tree, ws.scores);
    } else {
        passes = score_tree_by_paths(verifier, context, ws.tree, ws.scores, ws.path, ws.is_leaf, ws.logits, where);
    }
    if (ws.scores.rows() != vocab || ws.scores.cols() != static_cast<Eigen::Index>(ws.tree.size() + 1))
        fail_invalid(where, ": the target's scores are ", ws.scores.rows(), " x ", ws.scores.cols(),
                     "; expected vocab_size x (nodes + 1) = ", vocab, " x ", ws.tree.size() + 1);
    return passes;
}

/// Adds one tree step to the statistics: per depth, as decode_stats counts a chain's positions,
/// the tree's own depth (the drafter may propose fewer levels than asked), and a rejection
/// (and a reached position below the accepted path) only where the accepted node has children,
/// which were then tested and failed; an accepted leaf, however shallow, had nothing below it
/// to test. steps_at_gamma counts the depth asked.
inline void count_tree_step(decode_stats& st, const tree_verify_result& r, const draft_tree& tree, std::size_t depth,
                            std::size_t passes) {
    st.steps += 1;
    st.target_calls += passes;
    st.draft_calls += tree.model_calls;
    st.drafted_tokens += tree.size();
    st.accepted_tokens += r.accepted;
    const auto tree_depth = static_cast<std::size_t>(tree.max_depth());
    const bool tested_below = std::find(tree.parents.begin(), tree.parents.end(), r.last_node) != tree.parents.end();
    if (tested_below) st.rejected_tokens += 1;
    if (st.accepted_at_position.size() < tree_depth) {
        st.accepted_at_position.resize(tree_depth, 0);
        st.reached_at_position.resize(tree_depth, 0);
    }
    for (std::size_t i = 0; i < r.accepted; ++i) ++st.accepted_at_position[i];
    for (std::size_t i = 0; i < r.accepted + (tested_below ? 1 : 0); ++i) ++st.reached_at_position[i];
    if (st.steps_at_gamma.size() <= depth) st.steps_at_gamma.resize(depth + 1, 0);
    ++st.steps_at_gamma[depth];
}

}  // namespace detail

/// Generates up to options.max_new_tokens tokens after `prompt`, drafting trees.
///
/// The output has exactly the distribution of sampling from the target alone with the same
/// sampling settings, whatever the drafter (see verify_tree). decode_stats counts steps,
/// target passes, draft calls, drafted nodes (drafted_tokens) and accepted tokens;
/// tokens_per_step() is the mean tokens per target pass for a TreeVerifier.
///
/// \throws std::invalid_argument for invalid options (an empty shape), a vocabulary mismatch,
///         a prompt or stop token out of range, or a malformed tree or score; whatever an
///         adapter throws, unchanged.
///
/// \code
/// auto out = specdec::speculative_decode_tree(draft, target, prompt,
///     {.shape = {.branching = {2, 2, 1, 1}}, .max_new_tokens = 64, .sampling = {.temperature = 1.0f}}, rng);
/// \endcode
template <AnyTreeDrafter D, AnyTreeVerifier V, random_generator G>
decode_result speculative_decode_tree(D& drafter, V& verifier, std::span<const token_id> prompt,
                                      const tree_decode_options& options, G&& rng) {
    constexpr const char* where = "specdec::speculative_decode_tree";
    validate(options.sampling, where);
    if (options.shape.depth() == 0)
        detail::fail_invalid(where, ": shape.branching = {", options.shape.branching.empty() ? "" : "...",
                             "} has depth 0; at least one level with a positive branching is needed");
    const auto vd = static_cast<std::ptrdiff_t>(drafter.vocab_size());
    const auto vocab = static_cast<std::ptrdiff_t>(verifier.vocab_size());
    if (vd != vocab)
        detail::fail_invalid(where, ": draft vocab_size() = ", vd, " differs from target vocab_size() = ", vocab);
    if (vocab <= 0) detail::fail_invalid(where, ": vocab_size() = ", vocab, " must be positive");
    detail::check_prompt_and_stop_tokens(prompt, options.stop_tokens, vocab, where);

    decode_result result;
    std::vector<token_id> sequence(prompt.begin(), prompt.end());
    const std::size_t depth_max = options.shape.depth();
    sequence.reserve(prompt.size() + std::min(options.max_new_tokens, detail::initial_reserve) + depth_max + 1);
    tree_step_workspace ws;
    ws.shape = options.shape;
    ws.shape.branching.resize(depth_max);
    std::size_t generated = 0;
    const tree_verify_options vopts{.scheme = options.scheme};
    while (generated < options.max_new_tokens) {
        const std::size_t remaining = options.max_new_tokens - generated;
        const std::size_t depth = std::min(depth_max, remaining - 1);
        // The step's shape: the first `depth` levels (no allocation: the vector only shrinks and
        // regrows within its capacity).
        ws.shape.branching.assign(options.shape.branching.begin(),
                                  options.shape.branching.begin() + static_cast<std::ptrdiff_t>(depth));
        const std::span<const token_id> context(sequence);
        uniform_source uniforms(rng);
        detail::draft_tree_step(drafter, context, depth, options.sampling, uniforms, ws, vocab, where);
        const std::size_t passes = detail::score_tree_step(verifier, context, ws, vocab, where);
        const tree_verify_result r = verify_tree(ws.scores, ws.tree, options.sampling, rng, ws.verify, vopts);

        // Commit: the accepted path, then the drawn token.
        const std::size_t before = sequence.size();
        sequence.resize(before + r.accepted);
        {
            std::size_t k = before + r.accepted;
            for (std::int32_t v = r.last_node; v >= 0; v = ws.tree.parents[static_cast<std::size_t>(v)])
                sequence[--k] = ws.tree.tokens[static_cast<std::size_t>(v)];
        }
        sequence.push_back(r.next_token);
        detail::count_tree_step(result.stats, r, ws.tree, depth, passes);
        const bool stopped = detail::cut_at_stop(sequence, r.accepted + 1, options.stop_tokens);
        const std::size_t appended = sequence.size() - prompt.size() - generated;
        generated += appended;
        if (options.on_step)
            options.on_step(tree_step_event{&ws.tree, r.accepted, r.last_node, r.next_token,
                                            std::span<const token_id>(sequence).last(appended), passes, depth});
        if (stopped) {
            result.stop = stop_reason::stop_token;
            break;
        }
    }
    if (sequence.size() - prompt.size() > options.max_new_tokens) sequence.resize(prompt.size() + options.max_new_tokens);
    result.tokens.assign(sequence.begin() + static_cast<std::ptrdiff_t>(prompt.size()), sequence.end());
    return result;
}

namespace detail {

template <class D, class V, class G>
decode_result decode_with_trees(D& drafter, V& verifier, std::span<const token_id> prompt,
                                const decode_options& options, G&& rng) {
    constexpr const char* where = "specdec::speculative_decode";
    const auto chains_only = [&](const char* field, const char* why) {
        fail_invalid(where, ": options.tree is set, and options.", field, " applies to chains only (", why,
                     "); leave it at its default with trees");
    };
    if (options.policy != gamma_policy::fixed || options.controller != nullptr)
        chains_only("policy", "the adaptive policy chooses chain lengths; the tree's shape fixes its depth");
    if (options.estimate_acceptance) chains_only("estimate_acceptance", "per-position acceptance of a chain");
    if (options.draft_stop_below != 0.0f) chains_only("draft_stop_below", "it ends a chain's draft early");
    if (options.draft_sampling) chains_only("draft_sampling", "trees are drafted with options.sampling");
    if (options.lenience != 1.0f) chains_only("lenience", "trees are verified exactly only");
    if (options.scheme != verification_scheme::block)
        chains_only("scheme", "trees are verified with options.tree_scheme");
    tree_decode_options t{.shape = *options.tree,
                          .scheme = options.tree_scheme,
                          .max_new_tokens = options.max_new_tokens,
                          .stop_tokens = options.stop_tokens,
                          .sampling = options.sampling,
                          .on_step = {}};
    std::vector<token_id> path;  // the accepted path, for step_event::draft
    if (options.on_step) {
        t.on_step = [&options, &path](const tree_step_event& e) {
            path_tokens(*e.tree, e.last_node, path);
            options.on_step(step_event{.draft = path,
                                       .accepted = e.accepted,
                                       .next_token = e.next_token,
                                       .emitted = e.emitted,
                                       .acceptance = {},
                                       .gamma = e.depth});
        };
    }
    return speculative_decode_tree(drafter, verifier, prompt, t, rng);
}

}  // namespace detail

}  // namespace specdec
