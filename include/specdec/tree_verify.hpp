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

#include "detail/reshape.hpp"
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

namespace detail {
struct tree_verification_run;
}  // namespace detail

/// Reusable buffers for verify_tree(): nothing is allocated once the vocabulary, the node count
/// and the depth repeat. Contents private.
class tree_verify_workspace {
public:
    /// Rows of the target read (standardized) by the last verification: how many columns the
    /// algorithm needed.
    [[nodiscard]] std::size_t rows_read() const noexcept { return rows_read_; }

private:
    friend struct detail::tree_verification_run;
    std::vector<std::int32_t> first_child_, next_sibling_;  // indexed by node + 1 (0: the root)
    Eigen::MatrixXf mu_;                                    // V x (depth + 1): μ (or r) per level
    Eigen::VectorXf q_;                                     // q_j of the sibling being handled
    std::vector<float> siblings_;                           // a_k of the root's tested children
    sampling_workspace sampling_;
    std::size_t rows_read_ = 0;
};

namespace detail {

/// One verification (use verify_tree). Not a template: every generator reaches it through a
/// uniform_source (which draws exactly what uniform01 of the generator draws), so it is compiled
/// once per translation unit, or once per program in compiled mode.
struct tree_verification_run {
    const Eigen::Ref<const Eigen::MatrixXf>& logits;
    const draft_tree& tree;
    const sampling_config& sampling;
    uniform_source& rng;
    tree_verify_workspace& ws;
    const char* where;
    bool estimate_siblings = false;
    tree_verify_result result{};

    /// Children lists in index order (the order siblings were drawn), and buffers for `levels`
    /// levels of V entries.
    static void prepare(tree_verify_workspace& ws, const draft_tree& tree, Eigen::Index vocab, Eigen::Index levels) {
        const std::size_t n = tree.size();
        ws.first_child_.assign(n + 1, -1);
        ws.next_sibling_.assign(n + 1, -1);
        for (std::size_t i = n; i-- > 0;) {
            const auto slot = static_cast<std::size_t>(tree.parents[i] + 1);
            ws.next_sibling_[i + 1] = ws.first_child_[slot];
            ws.first_child_[slot] = static_cast<std::int32_t>(i);
        }
        if (ws.mu_.rows() != vocab || ws.mu_.cols() < levels) ws.mu_.resize(vocab, std::max(levels, ws.mu_.cols()));
        detail::reshape(ws.q_, vocab);
        ws.rows_read_ = 0;
        ws.siblings_.clear();
    }

    /// Level d of the per-level buffer (μ or r).
    Eigen::MatrixXf::ColXpr level(std::int32_t d) { return ws.mu_.col(d); }

    /// The result, with the sibling acceptance recorded (if asked for).
    tree_verify_result finish() {
        result.sibling_acceptance = ws.siblings_;
        return result;
    }

    /// At the root (level 0 holds the residual r_k, a distribution): records
    /// a_k = Σ min(r_k, q_k) of child c before it is tested.
    void record_sibling(std::int32_t c) {
        if (!estimate_siblings) return;
        if (!tree.has_distributions()) {
            ws.siblings_.push_back(std::min(1.0f, level(0)[tree.tokens[static_cast<std::size_t>(c)]]));
            return;
        }
        draft_prob(c, true);
        ws.siblings_.push_back(static_cast<float>(
            std::min(1.0, detail::sum_min_in_double(level(0).data(), ws.q_.data(), ws.q_.size()))));
    }


    /// Standardized target distribution at `node` (−1: root) into level d.
    void load_target(std::int32_t node, std::int32_t d) {
        standardize(logits.col(node + 1), sampling, level(d), ws.sampling_, where);
        ++ws.rows_read_;
    }

    /// Draft probability q_j(x_j) of node c given its earlier siblings, and (when `fill`) q_j
    /// into ws.q_. For point masses q_j = δ(x_j): returns 1 and fills nothing.
    double draft_prob(std::int32_t c, bool fill) {
        const auto ci = static_cast<std::size_t>(c);
        if (!tree.has_distributions()) return 1.0;
        const auto col = tree.probs.col(c);
        const token_id x = tree.tokens[ci];
        if (tree.draws_of(ci) != sibling_draws::without_replacement) {  // i.i.d. (check_tree refuses other values)
            if (fill) ws.q_ = col;
            return col[x];
        }
        // Without replacement: the column with the earlier siblings' tokens removed, renormalized
        // (Jeon et al. 2024, Sec. 3.2) by the sum of what is left of the column, as the drafter's
        // draw from the remaining weights did (not by 1 − the removed mass: a column sums to 1
        // only up to rounding, which would matter when little mass is left), summed over the
        // entries left as check_tree sums it (see mass_left_after_siblings: the column's sum
        // minus the removed entries cancels to 0 when almost nothing is left).
        const std::int32_t par = tree.parents[ci];
        const std::int32_t first = ws.first_child_[static_cast<std::size_t>(par + 1)];
        if (first == c) {
            if (fill) ws.q_ = col;
            return col[x];
        }
        const double left = detail::mass_left_after_siblings(tree, ci, static_cast<std::size_t>(first));
        if (fill) {
            const double scale = 1.0 / left;
            if (scale <= static_cast<double>(std::numeric_limits<float>::max())) ws.q_ = col * static_cast<float>(scale);
            else ws.q_ = (col.cast<double>() * scale).cast<float>();  // so little left that 1 / left overflows a float
            for (std::int32_t s = first; s != c; s = ws.next_sibling_[static_cast<std::size_t>(s + 1)])
                ws.q_[tree.tokens[static_cast<std::size_t>(s)]] = 0.0f;
        }
        return col[x] / left;
    }

    /// μ ← max(0, μ − q_j) / F at level d after child c was rejected; returns S = Σ min(q_j, μ).
    /// With `normalize`, divides by the residual's own sum instead (recursive rejection).
    double subtract(std::int32_t c, std::int32_t d) {
        auto m = level(d).array();
        if (!tree.has_distributions()) {
            const token_id x = tree.tokens[static_cast<std::size_t>(c)];
            const double s = std::min(1.0f, m[x]);
            m[x] = 0.0f;
            return s;
        }
        draft_prob(c, true);
        const double s = detail::sum_min_in_double(level(d).data(), ws.q_.data(), ws.q_.size());
        m = (m - ws.q_.array()).max(0.0f);
        return s;
    }

    void emit(std::int32_t node, std::int32_t d) {
        auto m = level(d);
        if (!(detail::sum_in_double(m.data(), m.size()) > residual_mass_floor)) load_target(node, d);  // only through rounding
        result.next_token = static_cast<token_id>(sample_from_weights(m, uniform01(rng), ws.sampling_, where));
        result.last_node = node;
        result.accepted = node < 0 ? 0 : static_cast<std::size_t>(tree.depths[static_cast<std::size_t>(node)]);
    }

    /// Recursive rejection sampling from the root down (Miao et al. 2024, Alg. 2).
    void recursive_rejection() {
        std::int32_t u = -1;
        for (;;) {
            load_target(u, 0);
            std::int32_t next = -1;
            for (std::int32_t c = ws.first_child_[static_cast<std::size_t>(u + 1)]; c >= 0;
                 c = ws.next_sibling_[static_cast<std::size_t>(c + 1)]) {
                if (u < 0) record_sibling(c);
                const double q = draft_prob(c, false);
                const double r = level(0)[tree.tokens[static_cast<std::size_t>(c)]];
                if (uniform01(rng) < r / q) {  // accept with min(1, r / q)
                    next = c;
                    break;
                }
                subtract(c, 0);
                const double mass = detail::sum_in_double(level(0).data(), level(0).size());
                if (mass > residual_mass_floor) level(0) *= static_cast<float>(1.0 / mass);
                else load_target(u, 0);  // r ≈ q_j: reached through rounding only
            }
            if (next < 0) return emit(u, 0);
            u = next;
        }
    }

    /// Traversal verification of the subtree below `u` (depth d) with weight w (see the file
    /// comment). Returns true when it accepted (result filled).
    bool traverse(std::int32_t u, std::int32_t d, double w) {
        load_target(u, d);
        if (w < 1.0) level(d) *= static_cast<float>(w);
        double big_w = w;
        for (std::int32_t c = ws.first_child_[static_cast<std::size_t>(u + 1)]; c >= 0;
             c = ws.next_sibling_[static_cast<std::size_t>(c + 1)]) {
            if (u < 0) record_sibling(c);
            const double q = draft_prob(c, false);
            const double wc = std::min(1.0, static_cast<double>(level(d)[tree.tokens[static_cast<std::size_t>(c)]]) / q);
            if (wc > 0.0 && traverse(c, d + 1, wc)) return true;
            const double s = subtract(c, d);
            const double f = 1.0 - s;
            if (f > 0.0) {
                level(d) *= static_cast<float>(1.0 / f);
                big_w = std::clamp((big_w - s) / f, 0.0, 1.0);
            } else {
                big_w = 0.0;  // the child could not fail: reached through rounding only
            }
        }
        // Weng et al. 2025: accept the path to u with the probability left (always at the root).
        if (u >= 0 && !(uniform01(rng) < big_w)) return false;
        emit(u, d);
        return true;
    }
};

}  // namespace detail

namespace detail {

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
    check_tree(tree, vocab, opts.check_draft_distributions && !tree.standardized, where);
    const std::size_t n = tree.size();
    if (target_logits.cols() != static_cast<Eigen::Index>(n + 1))
        fail_invalid(where, ": target_logits has ", target_logits.cols(),
                             " columns; expected one for the root and one per node = ", n + 1);
    const auto levels = static_cast<Eigen::Index>(
        opts.scheme == tree_verification_scheme::traversal ? tree.max_depth() + 1 : 1);
    tree_verification_run::prepare(ws, tree, vocab, levels);
    tree_verification_run run{target_logits, tree, sampling, rng, ws, where, opts.estimate_sibling_acceptance};
    if (opts.scheme == tree_verification_scheme::traversal) run.traverse(-1, 0, 1.0);
    else run.recursive_rejection();
    return run.finish();
}
#endif  // !SPECDEC_DETAIL_CORE_DECLARED_ONLY

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

}  // namespace specdec
