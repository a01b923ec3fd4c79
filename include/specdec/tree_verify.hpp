#pragma once
/// \file
/// Exact verification of a draft tree against the target's logits at the root and at every
/// node (one pass of a TreeVerifier). Two schemes, both exact for i.i.d. siblings and for
/// siblings drawn without replacement (the tree says which, per node):
///
///  - recursive rejection sampling, top-down (SpecInfer's multi-step speculative sampling,
///    Miao et al. 2024, Sec. 4.2, Alg. 2; its without-replacement form, Jeon et al. 2024,
///    "Recursive Speculative Decoding", Sec. 3.2). At a node with target distribution r = p_u,
///    its children x_1..x_k are tested in order: x_j is accepted with probability
///    min(1, r(x_j) / q_j(x_j)) and verification moves down to it; after a rejection
///    r ← norm(max(0, r − q_j)). q_j is the draft distribution x_j was drawn from given the
///    earlier siblings: its column for i.i.d. siblings, the column with the earlier siblings
///    removed and renormalized without replacement. When all are rejected, the next token is
///    drawn from r; at a leaf, from p_leaf. Each test is the speculative-sampling lemma
///    (Leviathan et al. 2023, App. A.1) with target r; conditional on the past, x_j ~ q_j, and
///    the residual does not depend on x_j, so by induction the token after u has law p_u.
///
///  - traversal verification, leaf to root (Weng et al. 2025, "Traversal Verification for
///    Speculative Tree Decoding", Sec. 3), in the recursive form below. Each node is visited
///    with a weight w in [0, 1] (the root with 1) and a measure μ = w · p_u. Its children are
///    tried in order: child j gets the weight w_j = min(1, μ(x_j) / q_j(x_j)) (the sequence-
///    level acceptance of Sun et al. 2024's block verification) and is visited with it, its own
///    subtree first; if that visit fails, with S = Σ_x min(q_j(x), μ(x)) and F = 1 − S, the node
///    continues with μ ← max(0, μ − q_j) / F and W ← (W − S) / F. After the last child the node
///    itself is accepted with probability W (one uniform), the next token drawn from μ / W;
///    otherwise the visit fails and its parent continues. The root always accepts (W = 1 there).
///    Invariant (induction over the subtree): a visit with weight w accepts with probability w
///    and, when it does, the token after u is y with probability p_u(y) and what follows it is
///    exact. Child j accepts with first token y with probability q_j(y)·w_j(y) = min(q_j, μ)(y);
///    conditional on its failure the remaining measure max(0, μ − q_j) / F does not depend on
///    x_j, so the next sibling (drawn from q_j+1 given the past) faces the same problem with a
///    smaller measure, and the stop with probability W emits exactly what is left. On a chain
///    it is block verification (Sun et al. 2024, Alg. 2): w_j is their p_i and W after the child
///    their h_i. Subtrees visited with weight 0 are skipped (they fail with certainty), so no row
///    below them is read.
///
/// Where it runs: on the verification core (detail/tree_verification.inc, compiled per instruction
/// set beside block verification and dispatched as it is). Each visited node's target row is
/// read once, by the exp pass of the bound; a child's weight is then one multiplication; only a
/// rejected child costs another pass (over the level's weights and its draft column), and the
/// division by F is a factor, not a pass. The last child of a node is decided without that pass
/// whenever its uniform lies above the node's weight W (W' <= W). A chain-shaped tree under
/// traversal verification goes through the core's block scheme, its equal in law.
///
/// Which is the default: traversal. On every case of the enumeration in tests/unit/tree_test.cpp
/// (several model pairs, temperatures, truncations, shapes, i.i.d. and without-replacement
/// siblings) its exact expected accepted length is at least recursive rejection sampling's,
/// equal on trees of depth 1 (where the two coincide), and strictly larger on most deeper trees.

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "detail/argument_diagnostics.hpp"
#include "detail/buffers.hpp"
#include "detail/verify_core.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "tree.hpp"
#include "types.hpp"
#include "verify_types.hpp"

namespace specdec {

/// Settings of verify_tree().
struct tree_verify_options {
    tree_verification_scheme scheme = tree_verification_scheme::traversal;  ///< traversal (the default) or recursive rejection
    /// Check that the tree's columns are distributions (skipped when tree.standardized).
    bool check_draft_distributions = true;
    /// Compute the acceptance of each child of the root that was tested, given that the earlier
    /// ones were not accepted (tree_verify_result::sibling_acceptance). Costs one pass over the
    /// vocabulary per tested child of the root; does not change the result.
    bool estimate_sibling_acceptance = false;
};

/// Outcome of verify_tree().
struct tree_verify_result {
    std::size_t accepted = 0;      ///< depth of the accepted node: tokens accepted
    std::int32_t last_node = -1;   ///< the accepted node (−1: none, the root); its path is the accepted tokens
    token_id next_token = 0;       ///< the token drawn after the accepted path
    /// With tree_verify_options::estimate_sibling_acceptance: for each child k of the root that
    /// was tested (in the order drawn; child k is tested only when children 1..k−1 were not
    /// accepted), a_k = Σ_x min(r_k(x), q_k(x)), where r_k is the target's distribution at the
    /// root with the earlier children's mass removed (the residual norm(max(0, r_{k−1} − q_{k−1})),
    /// r_1 = p) and q_k the distribution child k was drawn from given the earlier ones: the
    /// probability that child k is accepted given everything before it, under either scheme (at
    /// the root traversal verification's weight is 1, so both test child k alike). The
    /// acceptance by sibling rank that Sequoia's tree construction takes as input (Chen et al.
    /// 2024, §3.1), estimated, as β is for chains, from what verification computes anyway; its
    /// mean over steps that reached rank k is P(child k accepted | children 1..k−1 not).
    /// Valid until the workspace's next use; empty otherwise.
    std::span<const float> sibling_acceptance{};
};

/// Reusable buffers for verify_tree(): nothing is allocated once the vocabulary, the node count
/// and the depth repeat. Contents private.
class tree_verify_workspace {
public:
    /// Rows of the target read (standardized) by the last verification: how many columns the
    /// algorithm needed.
    [[nodiscard]] std::size_t rows_read() const noexcept { return buffers_.rows_read; }

private:
    friend struct detail::buffers_access;
    detail::tree_buffers buffers_;
};

namespace detail {

/// The tree's children lists in index order (the order siblings were drawn), each node's draft
/// factor (1, or 1 / the mass left after its earlier siblings when drawn without replacement:
/// ws.q_scale holds those masses, from check_tree, on entry), and the buffers of `levels`
/// levels of V floats.
inline void prepare_tree_buffers(tree_buffers& ws, const draft_tree& tree, Eigen::Index vocab, Eigen::Index levels) {
    const std::size_t n = tree.size();
    ws.first_child.assign(n + 1, -1);
    ws.next_sibling.assign(n + 1, -1);
    for (std::size_t i = n; i-- > 0;) {
        const auto slot = static_cast<std::size_t>(tree.parents[i] + 1);
        ws.next_sibling[i + 1] = ws.first_child[slot];
        ws.first_child[slot] = static_cast<std::int32_t>(i);
    }
    // ws.q_scale holds the masses left after earlier siblings where check_tree summed them (0
    // elsewhere: the core sums them when it needs them, see tree_run::q_scale): without
    // replacement (Jeon et al. 2024, Sec. 3.2) q_c is the column with the earlier siblings'
    // tokens removed, renormalized by the sum of what is left of it, as the drafter's draw from
    // the remaining weights did (not by 1 − the removed mass: a column sums to 1 only up to
    // rounding, which matters when little mass is left; see mass_left_after_siblings).
    ws.excludes_earlier.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t first = ws.first_child[static_cast<std::size_t>(tree.parents[i] + 1)];
        const bool excludes = tree.has_distributions() && tree.draws_of(i) == sibling_draws::without_replacement &&
                              first != static_cast<std::int32_t>(i);
        ws.excludes_earlier[i] = excludes ? 1 : 0;
        ws.q_scale[i] = !excludes ? 1.0 : ws.q_scale[i] > 0.0 ? 1.0 / ws.q_scale[i] : 0.0;  // 0: the core sums it when needed
    }
    if (ws.levels.rows() != vocab || ws.levels.cols() < levels) {
        Eigen::MatrixXf fresh(vocab, std::max(levels, ws.levels.cols()));
        ws.levels.swap(fresh);
    }
    const auto cols = static_cast<std::size_t>(ws.levels.cols());
    ws.block_sums.resize(cols * static_cast<std::size_t>(blocks_of(vocab)));
    ws.block_factors.resize(ws.block_sums.size());
    ws.level_scale.resize(cols);
    ws.level_sum.resize(cols);
}

/// True when every node's parent is the node before it: a chain, node i at depth i + 1 (at
/// least one node: an empty tree is a plain step, which the tree scheme does in one pass).
inline bool is_chain(const draft_tree& tree) {
    if (tree.size() == 0) return false;
    for (std::size_t i = 0; i < tree.size(); ++i)
        if (tree.parents[i] != static_cast<std::int32_t>(i) - 1) return false;
    return true;
}

/// Traversal verification of a chain (checked already): on a chain it is block verification
/// (Weng et al. 2025, Sec. 3; Sun et al. 2024, Alg. 2: w_j is their p_i, W after the child
/// their h_i; tests/unit/tree_test.cpp compares the two laws exactly), so the chain goes through
/// the core's block scheme, which decides most of its tests from bounds, without the passes over
/// the rows that the residual masses need.
inline tree_verify_result verify_chain_tree(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                                            const draft_tree& tree, const sampling_config& sampling,
                                            uniform_source& rng, tree_buffers& b, const char* where) {
    const Eigen::Ref<const Eigen::MatrixXf> q(tree.probs);
    const verify_options opts{.check_draft_distributions = false, .scheme = verification_scheme::block};
    const verify_call call{target_logits, tree.tokens, tree.has_distributions() ? &q : nullptr, nullptr, sampling, opts,
                           where};
    b.chain.rows_prepared = 0;
    const verify_result r = run_verify_core(call, rng, b.chain);
    b.rows_read = b.chain.rows_prepared;
    b.siblings.clear();
    return {r.accepted, static_cast<std::int32_t>(r.accepted) - 1, r.next_token, b.siblings};
}

SPECDEC_DETAIL_CORE_BEGIN
/// verify_tree, its errors naming `where` (the call the user made: a decoding loop's). Inline,
/// or in compiled mode defined once in the library (SPECDEC_COMPILED, detail/isa_config.hpp).
SPECDEC_DETAIL_CORE_ENTRY tree_verify_result verify_tree_for(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                                                             const draft_tree& tree, const sampling_config& sampling,
                                                             uniform_source& rng, tree_verify_workspace& ws,
                                                             const tree_verify_options& opts, const char* where);

#if !SPECDEC_DETAIL_CORE_DECLARED_ONLY
SPECDEC_DETAIL_CORE_ENTRY tree_verify_result verify_tree_for(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                                                             const draft_tree& tree, const sampling_config& sampling,
                                                             uniform_source& rng, tree_verify_workspace& ws,
                                                             const tree_verify_options& opts, const char* where) {
    validate(sampling, where);
    const auto vocab = target_logits.rows();
    if (vocab <= 0) fail_invalid(where, ": target_logits has ", vocab, " rows; one per token is needed");
    check_tree(tree, vocab, opts.check_draft_distributions && !tree.standardized, where, &buffers_access::of(ws).q_scale);
    const std::size_t n = tree.size();
    if (target_logits.cols() != static_cast<Eigen::Index>(n + 1))
        fail_invalid(where, ": target_logits has ", target_logits.cols(),
                             " columns; expected one for the root and one per node = ", n + 1);
    const bool traversal = opts.scheme == tree_verification_scheme::traversal;
    tree_buffers& b = buffers_access::of(ws);
    if (traversal && !opts.estimate_sibling_acceptance && is_chain(tree)) return verify_chain_tree(target_logits, tree, sampling, rng, b, where);
    prepare_tree_buffers(b, tree, vocab, traversal ? tree.max_depth() + 1 : 1);
    const tree_call call{target_logits, tree.tokens.data(), tree.parents.data(), b.first_child.data(),
                         b.next_sibling.data(), tree.has_distributions() ? &tree.probs : nullptr, sampling, traversal, opts.estimate_sibling_acceptance, where};
    run_tree_core(call, rng, b);
    const std::int32_t last = b.last_node;
    return {last < 0 ? 0 : static_cast<std::size_t>(tree.depths[static_cast<std::size_t>(last)]), last, b.next_token,
            b.siblings};
}
#endif  // !SPECDEC_DETAIL_CORE_DECLARED_ONLY
SPECDEC_DETAIL_CORE_END

}  // namespace detail

/// Verifies a draft tree against the target's logits at the root and at every node, and draws
/// the token after the accepted path. The accepted path and the token together have exactly
/// the target's distribution, under either scheme (see the file comment for the algorithms and
/// their proofs), for i.i.d. siblings, siblings drawn without replacement, and point masses.
///
/// Randomness, all from `rng` through uniform01: recursive rejection, one uniform per tested
/// node, then one for the token; traversal, one per node whose acceptance is decided (never for
/// the root, nor below a node of weight 0), then one for the token.
///
/// \param target_logits V x (nodes + 1): column 0 after the context, column i + 1 after node i's
///                      path (TreeVerifier's orientation).
/// \param tree          the draft tree (see draft_tree); point masses when it has no columns.
/// \param sampling      standardized sampling, applied to the target's rows (the draft's columns
///                      must come from the same settings for good acceptance, not for exactness).
/// \throws std::invalid_argument for a malformed tree (see validate(const draft_tree&, ...)),
///         logits of the wrong shape, invalid sampling settings, or a row of NaN/+Inf/all −Inf.
///
/// \code
/// specdec::tree_verify_workspace ws;
/// auto r = specdec::verify_tree(scores, tree, {.temperature = 0.7f}, rng, ws);
/// // append the tokens on the path to r.last_node (specdec::path_tokens), then r.next_token
/// \endcode
template <random_generator G>
tree_verify_result verify_tree(const Eigen::Ref<const Eigen::MatrixXf>& target_logits, const draft_tree& tree,
                               const sampling_config& sampling, G&& rng, tree_verify_workspace& ws,
                               const tree_verify_options& opts = {}) {
    if constexpr (std::is_same_v<std::remove_cvref_t<G>, uniform_source>) {
        return detail::verify_tree_for(target_logits, tree, sampling, rng, ws, opts, "specdec::verify_tree");
    } else {
        uniform_source uniforms(rng);
        return detail::verify_tree_for(target_logits, tree, sampling, uniforms, ws, opts, "specdec::verify_tree");
    }
}

/// Chosen only when an argument of the overload above has the wrong type (target_logits not an
/// Eigen matrix of float, rng not a generator): reports which one, and the fix, in a
/// static_assert (see detail/argument_diagnostics.hpp). Never viable together with the overload
/// above.
template <class L, class G>
    requires(!detail::verify_tree_arguments<L, G>)
tree_verify_result verify_tree(L&&, const draft_tree&, const sampling_config&, G&&, tree_verify_workspace&,
                               const tree_verify_options& = {}) {
    detail::reject_verify_tree_call<L, G>();
    return {};
}

}  // namespace specdec
