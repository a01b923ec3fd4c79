#pragma once
/// \file
/// Draft trees: many candidate continuations of one context, scored by the target in one pass
/// and verified exactly (see tree_verify.hpp). The data (`draft_tree`), the shape a drafter is
/// asked for (`tree_shape`), the two concepts (`TreeDrafter`, `TreeVerifier`), and the
/// adapters that make a plain model, a BlockDrafter and a chain verifier work with trees.
///
/// | concept      | member function it needs                                    |
/// |--------------|-------------------------------------------------------------|
/// | TreeDrafter  | `vocab_size()`, `propose_tree(context, shape, sampling, uniforms, out)` |
/// | TreeVerifier | `vocab_size()`, `score_tree(context, tree, out)`            |
///
/// A node's index is its position in the arrays; the root (the context itself) is not a node
/// and is written as parent −1. Nodes are stored parents first (parent[i] < i), and the
/// children of one node, in index order, are its sibling group in the order they were drawn.

#include <Eigen/Core>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "adapters.hpp"
#include "concepts.hpp"
#include "detail/best_tree.hpp"
#include "detail/reshape.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "types.hpp"

namespace specdec {

/// How a node was drawn relative to its earlier siblings (the children of the same parent
/// with smaller indices).
enum class sibling_draws : std::uint8_t {
    /// Independently from its column q: siblings are i.i.d. draws when their columns agree
    /// (SpecInfer, Miao et al. 2024, Sec. 4.2).
    iid,
    /// From its column q with the tokens of all earlier siblings removed and the rest
    /// renormalized: siblings are draws without replacement (Jeon et al. 2024, "Recursive
    /// Speculative Decoding", Sec. 3), so they are distinct tokens.
    without_replacement,
};

namespace detail {
/// True for the two enumerators of sibling_draws; a value cast from any other number is
/// neither, and is refused wherever a tree or a shape is checked (one reader taking it for
/// i.i.d. and another for without replacement would break exactness).
constexpr bool known_draws(sibling_draws d) noexcept {
    return d == sibling_draws::iid || d == sibling_draws::without_replacement;
}
}  // namespace detail

/// A tree of draft tokens after a context (the root).
///
/// Node i holds `tokens[i]`, its parent `parents[i]` (−1: a child of the root; otherwise a
/// node with a smaller index) and `depths[i]` (1 for children of the root, parent's depth + 1
/// otherwise). Either `probs` has 0 columns (point masses: every node is a deterministic
/// function of the context, as an n-gram drafter proposes them), or vocab_size() rows and one
/// column per node: column i is the distribution q node i was drawn from, the draft
/// distribution at its parent's path, before the removal of earlier siblings when
/// `draws[i]` is without_replacement. `draws` has one entry per node, or is empty (all i.i.d.).
///
/// Build one with add() (which keeps depths and draws consistent) after clear(); clear() keeps
/// the storage, so a drafter that refills the same tree allocates nothing once shapes repeat.
struct draft_tree : detail::draft_columns {
    std::vector<token_id> tokens;       ///< token of each node
    std::vector<std::int32_t> parents;  ///< parent of each node, −1 for the root
    std::vector<std::int32_t> depths;   ///< 1 + the parent's depth (the root's is 0)
    std::vector<sibling_draws> draws;   ///< per node, or empty: all i.i.d.
    /// V x nodes draft distributions (see above), or 0 columns for point masses. Size it with
    /// resize_probs() so that storage is reused. (Declared in detail::draft_columns.)
    using detail::draft_columns::probs;
    /// True when every column was written by standardize() or a sampling variant: then
    /// verification does not check that the columns are distributions.
    bool standardized = false;
    /// Forward passes of the draft model this tree cost (for statistics).
    std::size_t model_calls = 0;

    /// Number of draft nodes (the root not counted).
    [[nodiscard]] std::size_t size() const noexcept { return tokens.size(); }
    /// The largest depth (0 for an empty tree).
    [[nodiscard]] std::int32_t max_depth() const noexcept {
        std::int32_t d = 0;
        for (auto x : depths) d = std::max(d, x);
        return d;
    }
    /// How node i was drawn (iid when `draws` is empty).
    [[nodiscard]] sibling_draws draws_of(std::size_t i) const noexcept {
        return draws.empty() ? sibling_draws::iid : draws[i];
    }

    /// Appends a node below `parent` (−1 for the root) and returns its index.
    /// \throws std::invalid_argument when parent is not −1 or an existing node, or `how` is
    ///         neither enumerator of sibling_draws.
    std::int32_t add(std::int32_t parent, token_id token, sibling_draws how = sibling_draws::iid) {
        if (parent < -1 || parent >= static_cast<std::int32_t>(tokens.size()))
            detail::fail_invalid("specdec::draft_tree::add: parent = ", parent, " is neither -1 (the root) nor one of the ",
                                 tokens.size(), " nodes");
        if (!detail::known_draws(how))
            detail::fail_invalid("specdec::draft_tree::add: how = ", static_cast<unsigned>(how),
                                 " is neither sibling_draws::iid nor sibling_draws::without_replacement");
        if (draws.size() < tokens.size()) draws.resize(tokens.size(), sibling_draws::iid);
        tokens.push_back(token);
        parents.push_back(parent);
        depths.push_back(parent < 0 ? 1 : depths[static_cast<std::size_t>(parent)] + 1);
        draws.push_back(how);
        return static_cast<std::int32_t>(tokens.size() - 1);
    }

    /// An empty tree; the storage of every array is kept.
    void clear() {
        tokens.clear();
        parents.clear();
        depths.clear();
        draws.clear();
        clear_columns();
        standardized = false;
        model_calls = 0;
    }
};

/// Writes the tokens on the path from the root to `node` (−1: none) into `out`, root first.
inline void path_tokens(const draft_tree& tree, std::int32_t node, std::vector<token_id>& out) {
    out.clear();
    for (std::int32_t v = node; v >= 0; v = tree.parents[static_cast<std::size_t>(v)]) out.push_back(tree.tokens[static_cast<std::size_t>(v)]);
    std::reverse(out.begin(), out.end());
}

/// How a draft tree is verified. Both are exact.
enum class tree_verification_scheme {
    /// Top-down recursive rejection sampling (SpecInfer; without replacement: RSD).
    recursive_rejection,
    /// Leaf-to-root traversal verification (Weng et al. 2025): block verification on a chain,
    /// never fewer expected accepted tokens than recursive rejection on the enumerated cases.
    /// The default.
    traversal,
};

/// The shape a tree drafter is asked for: `branching[d]` children for every node at depth d
/// (the root is depth 0), so {3, 2, 1, 1} is a tree of depth 4 with 3 + 6 + 6 + 6 = 21 nodes, and
/// {1, 1, 1, 1} is a chain of 4. `max_nodes` (0: none) caps the count; nodes are then kept
/// breadth first, earlier siblings before later ones.
///
/// A tree whose nodes of one depth differ (the best tree for a node budget, best_tree() below,
/// where the first-drawn child carries a deeper subtree than its later siblings, as in Sequoia,
/// Chen et al. 2024, §3.1) lists its nodes' children in `children`; make it with
/// from_children(), which also sets `branching` to the widest node of each depth and `max_nodes`
/// to the node count, so that a drafter that reads only those two proposes a tree within the
/// list's widths and node count (decoding checks that `branching` is the list's widths).
struct tree_shape {
    std::vector<std::size_t> branching{2, 2, 1, 1};  ///< children per node at each depth
    std::size_t max_nodes = 0;                       ///< cap on the node count (0: none)
    /// How siblings are drawn by a model drafter (without replacement: distinct candidates).
    sibling_draws draws = sibling_draws::without_replacement;
    /// Empty: every node at depth d has branching[d] children. Otherwise children[i] is the
    /// number of children of node i, numbered breadth first with the root as 0 and siblings in
    /// draw order (entries past the end: 0), e.g. {3, 2, 1, 0, 1} is a root with three children,
    /// of which the first has two and the second one, and the first grandchild one more.
    std::vector<std::size_t> children{};

    /// The shape of the tree `children` lists (see the field), drawn as `draws` says.
    /// \throws std::invalid_argument when an entry gives children to a node that does not exist
    ///         (an index past the nodes the entries before it made) or the tree has no node.
    [[nodiscard]] static tree_shape from_children(std::vector<std::size_t> children,
                                                  sibling_draws draws = sibling_draws::without_replacement) {
        tree_shape s{.branching = {}, .max_nodes = 0, .draws = draws, .children = std::move(children)};
        if (const char* problem = s.children_problem())
            detail::fail_invalid("specdec::tree_shape::from_children: ", problem);
        s.branching = s.widest_per_depth();
        s.max_nodes = s.listed_nodes();
        return s;
    }

    /// The depth of the tree (entries of branching before the first 0; with `children`, its
    /// deepest node's depth).
    [[nodiscard]] std::size_t depth() const noexcept {
        if (!children.empty()) return deepest_listed();
        std::size_t d = 0;
        while (d < branching.size() && branching[d] > 0) ++d;
        return d;
    }
    /// Nodes of a full tree of this shape, capped by max_nodes.
    [[nodiscard]] std::size_t nodes() const noexcept {
        std::size_t total = 0;
        if (!children.empty()) {
            total = listed_nodes();
        } else {
            std::size_t level = 1;
            for (std::size_t d = 0; d < depth(); ++d) {
                level *= branching[d];
                total += level;
            }
        }
        return max_nodes == 0 ? total : std::min(total, max_nodes);
    }
    /// Children of node i (breadth first, the root 0) at depth d of the full shape.
    [[nodiscard]] std::size_t children_of(std::size_t i, std::size_t d) const noexcept {
        if (!children.empty()) return i < children.size() ? children[i] : 0;
        return d < branching.size() ? branching[d] : 0;
    }

    /// This shape cut to its first `levels` levels (the nodes of depth <= levels), written into
    /// `out` (which may be *this), which keeps its vectors' capacity: no allocation once it has
    /// held a shape this large.
    void cut(std::size_t levels, tree_shape& out) const {
        std::size_t listed = 0;  // nodes of depth < levels are a prefix of the breadth-first numbering
        for_each_listed([&listed, levels](std::size_t i, std::size_t d, std::size_t) {
            if (d < levels) listed = i + 1;
        });
        const std::size_t kept = std::min(levels, branching.size());
        if (&out == this) {
            out.branching.resize(kept);
            if (!out.children.empty()) out.children.resize(std::min(listed, out.children.size()));
        } else {
            out.branching.assign(branching.begin(), branching.begin() + static_cast<std::ptrdiff_t>(kept));
            out.children.assign(children.begin(),
                                children.begin() + static_cast<std::ptrdiff_t>(std::min(listed, children.size())));
            out.max_nodes = max_nodes;
            out.draws = draws;
        }
        // A children list's cap is its node count (at most max_nodes), as from_children sets it:
        // a drafter that reads only branching and max_nodes stays within it.
        if (!out.children.empty()) out.max_nodes = out.nodes();
    }

    /// With `children`: the first problem of the list (null: none), in words.
    [[nodiscard]] const char* children_problem() const noexcept {
        std::size_t made = 0;  // nodes the entries so far made (node i exists iff i <= made)
        for (std::size_t i = 0; i < children.size(); ++i) {
            if (children[i] > 0 && i > made) return "an entry gives children to a node that no earlier entry made";
            made += children[i];
        }
        return made == 0 ? "the tree has no node (children[0] = 0 or the list is empty)" : nullptr;
    }
    /// With `children`: the widest node of each depth (what `branching` holds for it).
    [[nodiscard]] std::vector<std::size_t> widest_per_depth() const {
        std::vector<std::size_t> widest;
        for_each_listed([&widest](std::size_t, std::size_t d, std::size_t k) {
            if (widest.size() <= d) widest.resize(d + 1, 0);
            widest[d] = std::max(widest[d], k);
        });
        while (!widest.empty() && widest.back() == 0) widest.pop_back();
        return widest;
    }

private:
    [[nodiscard]] std::size_t listed_nodes() const noexcept {
        std::size_t total = 0;
        for (const std::size_t k : children) total += k;
        return total;
    }
    [[nodiscard]] std::size_t deepest_listed() const noexcept {
        std::size_t deepest = 0;
        for_each_listed([&deepest](std::size_t, std::size_t d, std::size_t k) {
            if (k > 0) deepest = std::max(deepest, d + 1);
        });
        return deepest;
    }
    /// f(i, depth of node i, children of node i) for the nodes the list makes, breadth first.
    template <class F>
    void for_each_listed(F&& f) const {
        // Breadth first, the nodes of one depth are contiguous: [level_begin, level_end).
        std::size_t level_begin = 0, level_end = 1, d = 0;
        while (level_begin < level_end && level_begin < children.size()) {
            std::size_t next_end = level_end;
            for (std::size_t i = level_begin; i < level_end && i < children.size(); ++i) {
                f(i, d, children[i]);
                next_end += children[i];
            }
            level_begin = level_end;
            level_end = next_end;
            ++d;
        }
    }
};

namespace detail {

/// The probability that the r-th child drawn under a node (r from 1) is the one accepted, in
/// Sequoia's model (Chen et al. 2024, §3.1): a_r Π_{k<r} (1 − a_k), a_k = acceptance[k − 1]
/// (0 past its end). Checks the values (each in [0, 1]).
inline std::vector<double> rank_weights(std::span<const double> acceptance, std::size_t ranks, const char* where) {
    std::vector<double> w(ranks, 0.0);
    double none_yet = 1.0;  // Π (1 − a_k) over the ranks before
    for (std::size_t r = 0; r < ranks && r < acceptance.size(); ++r) {
        const double a = acceptance[r];
        if (!(a >= 0.0 && a <= 1.0))
            fail_invalid(where, ": sibling_acceptance[", r, "] = ", a, " is not a probability in [0, 1]");
        w[r] = none_yet * a;
        none_yet *= 1.0 - a;
    }
    for (std::size_t r = ranks; r < acceptance.size(); ++r)
        if (!(acceptance[r] >= 0.0 && acceptance[r] <= 1.0))
            fail_invalid(where, ": sibling_acceptance[", r, "] = ", acceptance[r], " is not a probability in [0, 1]");
    return w;
}

}  // namespace detail

/// E[tokens] of one step with a tree of `shape`, in the model of Sequoia (Chen et al. 2024,
/// §3.1): the r-th child drawn under any node is accepted, given that the earlier ones were
/// not, with probability a_r = sibling_acceptance[r − 1] (0 past the end): what
/// decode_stats::estimated_sibling_acceptance(r − 1) estimates (with
/// tree{.estimate_sibling_acceptance = true}). The step yields the accepted path
/// and one token more, so E = 1 + Σ over nodes of the probability that verification reaches and
/// accepts it. For a shape uniform per depth this is 1 + Σ_d Π_{i≤d} (1 − Π_{r≤b_i} (1 − a_r)),
/// the tree planner's E[tokens]; for a chain of γ with a_1 = α, Leviathan et al.'s Eq. 1.
/// Nodes past max_nodes (breadth first) are not counted.
/// \throws std::invalid_argument for a sibling_acceptance value outside [0, 1] or a shape whose
///         `children` list is not a tree.
[[nodiscard]] inline double expected_tree_tokens(const tree_shape& shape, std::span<const double> sibling_acceptance) {
    constexpr const char* where = "specdec::expected_tree_tokens";
    if (!shape.children.empty())
        if (const char* problem = shape.children_problem()) detail::fail_invalid(where, ": shape.children: ", problem);
    const std::size_t total = shape.nodes(), depth = shape.depth();
    std::size_t widest = 0;
    for (std::size_t d = 0; d < depth; ++d) widest = std::max(widest, shape.children_of(0, d));
    if (!shape.children.empty())
        for (const std::size_t k : shape.children) widest = std::max(widest, k);
    const std::vector<double> w = detail::rank_weights(sibling_acceptance, widest, where);
    // Breadth first, one level at a time: (shape index, probability that verification reaches
    // and accepts the node) of each node; a level's children are numbered consecutively.
    std::vector<std::pair<std::size_t, double>> level{{0, 1.0}}, next;
    std::size_t next_index = 1, made = 0;
    double e = 1.0;
    for (std::size_t d = 0; d < depth && made < total; ++d) {
        next.clear();
        for (const auto& [i, reach] : level) {
            const std::size_t k = shape.children_of(i, d);
            for (std::size_t r = 0; r < k; ++r, ++next_index) {
                if (made == total) break;
                const double p = reach * w[r];
                e += p;
                next.emplace_back(next_index, p);
                ++made;
            }
        }
        level.swap(next);
    }
    return e;
}

/// The tree of at most `max_nodes` nodes with the most expected tokens (expected_tree_tokens)
/// among the trees that give a node at depth d at most widest[d] children (depth at most
/// widest.size()): Sequoia's dynamic program (Chen et al. 2024, §3.1). Under the rank-only model
/// a subtree's value depends only on its depth and its node count, so with w_r the probability
/// that the r-th child is the one accepted, f(d, n) = the best value below a node of depth d
/// with at most n nodes under it is the best split of n among the ranks r = 1, 2, ... (each
/// child taking 1 + m nodes and adding w_r (1 + f(d + 1, m))): O(depth · width · max_nodes²)
/// time. Ranks with no acceptance add nothing, so the tree may hold fewer than max_nodes nodes
/// (at least one). Returns the shape in the `children` form (tree_shape::from_children).
/// \throws std::invalid_argument for max_nodes = 0, an empty `widest` or a 0 in it, or a
///         sibling_acceptance value outside [0, 1].
[[nodiscard]] inline tree_shape best_tree(std::span<const double> sibling_acceptance, std::size_t max_nodes,
                                          std::span<const std::size_t> widest,
                                          sibling_draws draws = sibling_draws::without_replacement) {
    constexpr const char* where = "specdec::best_tree";
    if (max_nodes == 0) detail::fail_invalid(where, ": max_nodes = 0; a tree needs a node");
    if (widest.empty()) detail::fail_invalid(where, ": widest is empty; a tree needs a level");
    std::size_t ranks = 0;
    for (std::size_t d = 0; d < widest.size(); ++d) {
        if (widest[d] == 0) detail::fail_invalid(where, ": widest[", d, "] = 0; every level needs a child");
        ranks = std::max(ranks, std::min(widest[d], max_nodes));
    }
    const std::vector<double> w = detail::rank_weights(sibling_acceptance, ranks, where);
    detail::best_tree_table table;
    table.compute(w, widest, max_nodes);
    std::vector<std::size_t> children;
    table.tree(max_nodes, children);
    if (children.empty()) children.push_back(1);  // nothing is ever accepted: one node
    return tree_shape::from_children(std::move(children), draws);
}

/// A drafter that proposes a whole tree.
///
/// Syntactic requirements: `d.vocab_size()` and
/// `d.propose_tree(context, shape, sampling, uniforms, out)` with a `std::span<const token_id>`
/// context, a `const tree_shape&`, a `const sampling_config&`, a `uniform_source&` and a
/// `draft_tree&` that arrives cleared.
///
/// Semantic requirements:
///  1. `out` is a valid tree (see draft_tree) of at most shape.nodes() nodes and depth at most
///     shape.depth(), with tokens in [0, vocab_size()).
///  2. Each node with a column was drawn from it given everything drawn before, as
///     `out.draws` says (independently, or without replacement among its earlier siblings);
///     without columns, the tree is a deterministic function of the context.
///  3. No hidden randomness: every draw comes from `uniforms`.
template <class D>
concept TreeDrafter = requires(D& d, std::span<const token_id> context, const tree_shape& shape,
                               const sampling_config& sampling, uniform_source& uniforms, draft_tree& out) {
    { d.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    d.propose_tree(context, shape, sampling, uniforms, out);
};

/// A target that scores the root and every node of a tree in one pass (tree attention:
/// SpecInfer, Miao et al. 2024, Sec. 4.1).
///
/// Syntactic requirements: `v.vocab_size()` and `v.score_tree(context, tree, out)` with a
/// `std::span<const token_id>`, a `const draft_tree&` and an `Eigen::MatrixXf&`.
///
/// Semantic requirements:
///  1. `out` becomes vocab_size() x (tree.size() + 1), column-major: column 0 holds the logits
///     of the token after `context` (the root), column i + 1 the logits after context + the
///     path from the root to node i (its ancestors' tokens, then its own).
///  2. Each column equals what next_logits would return for that prefix.
///  3. No hidden randomness. A model with a cache may keep the tree's entries: the next
///     call's context is the old one, then the accepted path, then one more token.
template <class V>
concept TreeVerifier = requires(V& v, std::span<const token_id> context, const draft_tree& tree, Eigen::MatrixXf& out) {
    { v.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    v.score_tree(context, tree, out);
};

namespace detail {

/// Σ x[0..n) as a double: chunks of 256 floats summed in 16 float lanes (each lane adds 16
/// floats: a relative error of about 1e-6 of the chunk's sum, as the columns' own rounding),
/// the chunks' sums added in double. Vectorizes at any instruction set (a double accumulator per
/// element does not, and made the mass left after earlier siblings the largest cost of
/// verifying a tree drawn without replacement at V = 32000). Eigen's cast<double>().sum() is a
/// single chain of dependent scalar adds.
inline double sum_in_double(const float* x, Eigen::Index n) {
    constexpr Eigen::Index lanes = 16, chunk = 256;
    double total = 0.0;
    Eigen::Index k = 0;
    for (; k + chunk <= n; k += chunk) {
        float a[lanes] = {};
        for (Eigen::Index j = 0; j < chunk; j += lanes)
            for (Eigen::Index l = 0; l < lanes; ++l) a[l] += x[k + j + l];
        float s = 0.0f;
        for (Eigen::Index l = 0; l < lanes; ++l) s += a[l];
        total += static_cast<double>(s);
    }
    for (; k < n; ++k) total += static_cast<double>(x[k]);
    return total;
}

/// The mass of column i of tree.probs left when the tokens of node i's earlier siblings (the
/// nodes in [first_sibling, i) with its parent, each token once) are removed: the sum, in
/// double, of the entries that remain. Summed over what remains rather than computed as the
/// column's sum minus the removed entries: that subtraction of nearly equal doubles cancels
/// when the earlier siblings took nearly all the mass (q ≈ {1, 2e-19}: 1 + 2e-19 − 1 is 0 in
/// double), which refused, or would have divided by 0, a tree drawn correctly. check_tree
/// requires it to be positive and tree verification renormalizes by it, so the two agree.
/// \pre the tree's structure is checked (tokens in range) and it has columns.
inline double mass_left_after_siblings(const draft_tree& tree, std::size_t i, std::size_t first_sibling) {
    const auto col = tree.probs.col(static_cast<Eigen::Index>(i));
    const Eigen::Index v = col.size();
    const std::int32_t par = tree.parents[i];
    double left = 0.0;
    for (Eigen::Index from = 0;;) {
        Eigen::Index cut = v;  // the smallest removed token at or after `from` (v: none)
        for (std::size_t j = first_sibling; j < i; ++j)
            if (tree.parents[j] == par && tree.tokens[j] >= from && tree.tokens[j] < cut) cut = tree.tokens[j];
        left += sum_in_double(col.data() + from, cut - from);
        if (cut == v) return left;
        from = cut + 1;
    }
}

/// The structural part of check_tree: consistent array sizes, parents before children, depths
/// that follow the parents, tokens in range, each node's draws one of the two enumerators of
/// sibling_draws (what must hold before a model is shown the tree).
inline void check_tree_structure(const draft_tree& tree, std::ptrdiff_t vocab, const char* where) {
    const std::size_t n = tree.tokens.size();
    if (tree.parents.size() != n || tree.depths.size() != n || (!tree.draws.empty() && tree.draws.size() != n))
        fail_invalid(where, ": the tree's arrays disagree: ", n, " tokens, ", tree.parents.size(), " parents, ",
                     tree.depths.size(), " depths, ", tree.draws.size(), " draws (0 or one per node)");
    if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max() - 1))
        fail_invalid(where, ": the tree has ", n, " nodes, more than an index can count");
    for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t par = tree.parents[i];
        if (par < -1 || par >= static_cast<std::int32_t>(i))
            fail_invalid(where, ": node ", i, " has parent ", par,
                         "; a parent must be -1 (the root) or a node with a smaller index");
        const std::int32_t want = par < 0 ? 1 : tree.depths[static_cast<std::size_t>(par)] + 1;
        if (tree.depths[i] != want)
            fail_invalid(where, ": node ", i, " has depth ", tree.depths[i], "; its parent ", par, " makes it ", want);
        if (tree.tokens[i] < 0 || tree.tokens[i] >= vocab)
            fail_invalid(where, ": node ", i, " has token ", tree.tokens[i], ", out of range [0, vocab_size = ", vocab, ")");
        if (!known_draws(tree.draws_of(i)))
            fail_invalid(where, ": node ", i, " has draws = ", static_cast<unsigned>(tree.draws_of(i)),
                         ", neither sibling_draws::iid nor sibling_draws::without_replacement");
    }
}

/// Throws std::invalid_argument unless `tree` is well formed for a vocabulary of `vocab`:
/// consistent array sizes, parents before children, depths that follow the parents, tokens in
/// range, each node's draws iid or without_replacement, columns of the right shape; and, for
/// nodes with columns, a positive probability of its token under the distribution it was drawn
/// from (for without-replacement draws: positive mass left after removing earlier siblings,
/// summed when the columns are checked and implied by the token's own otherwise,
/// and the token not among them). When
/// `check_columns`, columns must be distributions (non-negative, summing to 1 within
/// draft_probability_tolerance = 1e-3). `masses_left`, when not null, receives per node the mass
/// left after its earlier siblings where it was summed (with `check_columns`), 1 for nodes not
/// drawn without replacement or drawn first, 0 elsewhere.
inline void check_tree(const draft_tree& tree, std::ptrdiff_t vocab, bool check_columns, const char* where,
                       std::vector<double>* masses_left = nullptr) {
    check_tree_structure(tree, vocab, where);
    const std::size_t n = tree.tokens.size();
    if (masses_left != nullptr) masses_left->assign(n, 1.0);
    if (!tree.has_distributions()) return;
    if (tree.probs.rows() != vocab || tree.probs.cols() != static_cast<Eigen::Index>(n))
        fail_invalid(where, ": the tree's probs is ", tree.probs.rows(), " x ", tree.probs.cols(),
                     "; expected vocab_size x nodes = ", vocab, " x ", n, " (or 0 columns for point masses)");
    for (std::size_t i = 0; i < n; ++i) {
        const auto col = tree.probs.col(static_cast<Eigen::Index>(i));
        if (check_columns) {
            const float lo = col.minCoeff();
            const double sum = sum_in_double(col.data(), col.size());
            if (!(lo >= 0.0f) || !(std::abs(sum - 1.0) <= 1e-3))
                fail_invalid(where, ": column ", i, " of the tree's probs is not a distribution (minimum ", lo, ", sum ",
                             sum, ")");
        }
        double mass = 1.0, own = col[tree.tokens[i]];
        std::size_t first_sibling = 0;
        while (first_sibling < i && tree.parents[first_sibling] != tree.parents[i]) ++first_sibling;
        if (tree.draws_of(i) == sibling_draws::without_replacement && first_sibling < i) {
            for (std::size_t j = first_sibling; j < i; ++j)
                if (tree.parents[j] == tree.parents[i] && tree.tokens[j] == tree.tokens[i])
                    fail_invalid(where, ": node ", i, " (token ", tree.tokens[i],
                                 ") is drawn without replacement but repeats its earlier sibling ", j);
            // Positive whenever `own` is and the column is non-negative (the remaining entries
            // include the token's own): summed here only where the column is checked anyway.
            if (check_columns) mass = mass_left_after_siblings(tree, i, first_sibling);  // what verification renormalizes by
            if (masses_left != nullptr) (*masses_left)[i] = check_columns ? mass : 0.0;
        }
        if (!(own > 0.0) || !(mass > 0.0))
            fail_invalid(where, ": node ", i, " has token ", tree.tokens[i], " of draft probability ", own,
                         " (mass left after earlier siblings ", mass,
                         "); a drawn token must have positive probability");
    }
}

}  // namespace detail

/// Checks a tree as verify_tree() does (see detail::check_tree).
/// \throws std::invalid_argument naming `where` and the first problem found.
inline void validate(const draft_tree& tree, std::ptrdiff_t vocab, const char* where = "specdec::validate") {
    detail::check_tree(tree, vocab, !tree.standardized, where);
}

namespace detail {

/// Draws up to `k` children of `parent` from the standardized distribution `q` (V entries,
/// summing to 1) into `tree`, each with column q: i.i.d., or without replacement (the drawn
/// token's weight is zeroed in `scratch`, and drawing stops early when no mass is left, as at
/// temperature 0 or under top-k). One uniform per child.
inline void draw_children(draft_tree& tree, std::int32_t parent, std::size_t k, const Eigen::VectorXf& q,
                          sibling_draws how, uniform_source& uniforms, Eigen::VectorXf& scratch,
                          sampling_workspace& sws, Eigen::Index& next_col, const char* where) {
    if (k == 0) return;
    const bool wor = how == sibling_draws::without_replacement;
    if (wor) scratch = q;
    double left = 1.0;
    for (std::size_t j = 0; j < k; ++j) {
        const Eigen::VectorXf& w = wor ? scratch : q;
        if (wor && j > 0 && !(left > 1e-7 && w.maxCoeff() > 0.0f)) break;  // nothing left to draw
        const auto x = static_cast<token_id>(sample_from_weights(w, uniforms(), sws, where));
        tree.add(parent, x, how);
        tree.probs.col(next_col++) = q;
        if (wor) {
            left -= scratch[x];
            scratch[x] = 0.0f;
        }
    }
}

}  // namespace detail

namespace detail {

/// The node of `shape` (breadth first, the root 0) that node v of `t` (−1: the root) stands
/// for, in a tree drafted breadth first from a shape with `children`: v's parent's node, and v's
/// rank among its siblings (a sibling group that ran out of mass holds fewer nodes than the
/// shape's, so drafted indices and the shape's part after it).
inline std::size_t shape_node(const tree_shape& shape, const draft_tree& t, std::int32_t v) {
    if (v < 0) return 0;
    const std::int32_t parent = t.parents[static_cast<std::size_t>(v)];
    std::int32_t first = v;  // a sibling group is contiguous
    while (first > 0 && t.parents[static_cast<std::size_t>(first - 1)] == parent) --first;
    const std::size_t of_parent = shape_node(shape, t, parent);
    std::size_t first_child = 1;
    for (std::size_t i = 0; i < of_parent; ++i) first_child += shape.children_of(i, 0);
    return first_child + static_cast<std::size_t>(v - first);
}

/// draft_tree_from_model with level_scores(d), the matrix that receives level d's score_tree
/// columns (or null: one next_logits call per node).
template <LanguageModel M, class LevelScores>
void draft_tree_levels(M& m, std::span<const token_id> context, const tree_shape& shape,
                       const sampling_config& sampling, uniform_source& uniforms, draft_tree& out,
                       std::vector<token_id>& path, Eigen::VectorXf& logits, Eigen::VectorXf& q,
                       Eigen::VectorXf& scratch, sampling_workspace& sws, const char* where,
                       LevelScores&& level_scores_of) {
    if (!known_draws(shape.draws))
        fail_invalid(where, ": shape.draws = ", static_cast<unsigned>(shape.draws),
                     " is neither sibling_draws::iid nor sibling_draws::without_replacement");
    if (!shape.children.empty())
        if (const char* problem = shape.children_problem()) fail_invalid(where, ": shape.children: ", problem);
    const auto vocab = static_cast<Eigen::Index>(m.vocab_size());
    out.clear();
    const std::size_t total = shape.nodes(), depth = shape.depth();
    if (total == 0) return;
    out.resize_probs(vocab, static_cast<Eigen::Index>(total));
    if (q.size() != vocab) q.resize(vocab);
    Eigen::Index col = 0;
    // Breadth first: the parents of level d + 1 are the nodes of level d, [begin, end); the
    // root (−1) for d = 0.
    std::size_t begin = 0, end = 0;
    std::size_t d = 0;
    // Children of drafted node `parent` (at depth d) in the shape.
    const auto children_here = [&](std::int32_t parent) {
        return shape.children.empty() ? shape.branching[d] : shape.children_of(shape_node(shape, out, parent), d);
    };
    for (; d < depth && out.size() < total; ++d) {
        const std::size_t parents_here = d == 0 ? 1 : end - begin;
        if (!shape.children.empty()) {  // no node of this level gets children: no call for the level
            bool any = false;
            for (std::size_t pi = 0; pi < parents_here && !any; ++pi)
                any = children_here(d == 0 ? -1 : static_cast<std::int32_t>(begin + pi)) > 0;
            if (!any) break;
        }
        bool level_scored = false;
        // (The root's level too: score_tree on the empty tree gives the root's column, into a
        // matrix of the caller's rather than a vector next_logits returns.)
        Eigen::MatrixXf* level_scores = level_scores_of(d);
        if constexpr (TreeVerifier<M>) {
            if (level_scores != nullptr) {
                // The columns of every node drawn so far, in one pass (one column per node + 1).
                m.score_tree(context, out, *level_scores);
                if (level_scores->rows() != vocab || level_scores->cols() != static_cast<Eigen::Index>(out.size() + 1))
                    detail::fail_invalid(where, ": score_tree returned ", level_scores->rows(), " x ", level_scores->cols(),
                                 "; expected ", vocab, " x ", out.size() + 1);
                ++out.model_calls;
                level_scored = true;
            }
        }
        for (std::size_t pi = 0; pi < parents_here && out.size() < total; ++pi) {
            const std::int32_t parent = d == 0 ? -1 : static_cast<std::int32_t>(begin + pi);
            const std::size_t k = std::min(children_here(parent), total - out.size());
            if (k == 0) continue;  // a leaf of a shape with `children`: no draft call
            if (level_scored) {
                try {
                    standardize(level_scores->col(parent + 1), sampling, q, sws, where);
                } catch (const std::invalid_argument& e) {
                    fail_draft_logits(e);
                }
            } else {
                path_tokens(out, parent, path);
                // Grown geometrically: the context grows every step, and an exact-size insert would
                // reallocate once per step.
                if (const std::size_t need = context.size() + path.size(); path.capacity() < need)
                    path.reserve(std::max(need, 2 * path.capacity()));
                path.insert(path.begin(), context.begin(), context.end());
                detail::checked_next_logits(m, std::span<const token_id>(path), vocab, logits, where,
                                            "the draft model's ");
                ++out.model_calls;
                try {
                    standardize(logits, sampling, q, sws, where);
                } catch (const std::invalid_argument& e) {
                    fail_draft_logits(e);
                }
            }
            detail::draw_children(out, parent, k, q, shape.draws, uniforms, scratch, sws, col, where);
        }
        begin = d == 0 ? 0 : end;
        end = out.size();
        if (begin == end) break;
    }
    // Fewer nodes than sized (without-replacement groups that ran out of mass): drop the rest.
    if (col != out.probs.cols()) {
        Eigen::MatrixXf kept = out.probs.leftCols(col);
        out.probs.swap(kept);
    }
    out.standardized = true;
}

}  // namespace detail

/// Builds a tree by sampling from a plain model: breadth first, for every node that gets
/// children, one next_logits call on its path, standardized with `sampling` (the q that
/// verification then uses), and shape.branching[depth] children drawn from it as shape.draws
/// says. The columns are standardized (out.standardized is set). Needs `vocab x nodes` floats.
/// Scratch: `path` (tokens), `logits`, `q`, `scratch` (vectors), `sws`. When the model is also a
/// TreeVerifier and `level_scores` is given, each level costs one score_tree call on the tree
/// drawn so far instead of one next_logits call per node (the same logits: fewer passes); the
/// one matrix then changes size from level to level, which reallocates it (the overload with
/// one matrix per level does not).
template <LanguageModel M>
void draft_tree_from_model(M& m, std::span<const token_id> context, const tree_shape& shape,
                           const sampling_config& sampling, uniform_source& uniforms, draft_tree& out,
                           std::vector<token_id>& path, Eigen::VectorXf& logits, Eigen::VectorXf& q,
                           Eigen::VectorXf& scratch, sampling_workspace& sws, Eigen::MatrixXf* level_scores = nullptr) {
    detail::draft_tree_levels(m, context, shape, sampling, uniforms, out, path, logits, q, scratch, sws,
                              "specdec::draft_tree_from_model", [level_scores](std::size_t) { return level_scores; });
}

/// draft_tree_from_model with one score_tree matrix per level, kept in `level_scores` (resized
/// to the shape's depth): once the shape repeats, drafting allocates nothing.
template <LanguageModel M>
void draft_tree_from_model(M& m, std::span<const token_id> context, const tree_shape& shape,
                           const sampling_config& sampling, uniform_source& uniforms, draft_tree& out,
                           std::vector<token_id>& path, Eigen::VectorXf& logits, Eigen::VectorXf& q,
                           Eigen::VectorXf& scratch, sampling_workspace& sws, std::vector<Eigen::MatrixXf>& level_scores) {
    if (level_scores.size() < shape.depth()) level_scores.resize(shape.depth());
    detail::draft_tree_levels(m, context, shape, sampling, uniforms, out, path, logits, q, scratch, sws,
                              "specdec::draft_tree_from_model", [&level_scores](std::size_t d) { return &level_scores[d]; });
}

/// Turns a chain (a BlockDrafter's block) into a tree: node i is the child of node i − 1.
inline void tree_from_block(const draft_block& block, draft_tree& out) {
    out.clear();
    for (std::size_t i = 0; i < block.tokens.size(); ++i)
        out.add(static_cast<std::int32_t>(i) - 1, block.tokens[i], sibling_draws::iid);
    if (block.has_distributions()) {
        const auto n = static_cast<Eigen::Index>(block.tokens.size());
        out.resize_probs(block.probs.rows(), n);
        for (Eigen::Index i = 0; i < n; ++i)
            out.probs.col(i) = (block.scales.empty() ? 1.0f : block.scales[static_cast<std::size_t>(i)]) *
                               block.probs.col(i);
        out.standardized = block.standardized;
    }
    // As decode_stats::draft_calls counts a block: its reported model calls, else one call for a
    // block that proposed tokens.
    out.model_calls = block.model_calls.value_or(block.tokens.empty() ? 0 : 1);
}

namespace detail {

/// Scores a tree with a verifier that has no score_tree(): a plain LanguageModel is called
/// once per column (tree.size() + 1 calls); a BatchVerifier once per root-to-leaf path, each
/// path's columns copied to its nodes (correct, and slower: shared prefixes are scored again).
/// Returns the number of target passes spent (a BatchVerifier's score() counts as its
/// calls_per_score() says, as in chain decoding).
template <class V>
std::size_t score_tree_by_paths(V& v, std::span<const token_id> context, const draft_tree& tree, Eigen::MatrixXf& out,
                                std::vector<token_id>& path, std::vector<char>& is_leaf, Eigen::VectorXf& logits,
                                const char* where) {
    const auto vocab = static_cast<Eigen::Index>(v.vocab_size());
    const std::size_t n = tree.size();
    if (out.rows() != vocab || out.cols() != static_cast<Eigen::Index>(n + 1)) out.resize(vocab, static_cast<Eigen::Index>(n + 1));
    if constexpr (BatchVerifier<V>) {
        is_leaf.assign(n, 1);
        for (std::size_t i = 0; i < n; ++i)
            if (tree.parents[i] >= 0) is_leaf[static_cast<std::size_t>(tree.parents[i])] = 0;
        std::size_t passes = 0;
        if (n == 0) {
            const Eigen::MatrixXf s = v.score(context, std::span<const token_id>{});
            if (s.rows() != vocab || s.cols() != 1) fail_invalid(where, ": score() returned ", s.rows(), " x ", s.cols(), "; expected ", vocab, " x 1");
            out.col(0) = s.col(0);
            return score_calls(v, 0);
        }
        for (std::size_t leaf = 0; leaf < n; ++leaf) {
            if (!is_leaf[leaf]) continue;
            path_tokens(tree, static_cast<std::int32_t>(leaf), path);
            const Eigen::MatrixXf s = v.score(context, std::span<const token_id>(path));
            passes += score_calls(v, path.size());  // as a chain's scoring counts (calls_per_score)
            if (s.rows() != vocab || s.cols() != static_cast<Eigen::Index>(path.size() + 1))
                fail_invalid(where, ": score() returned ", s.rows(), " x ", s.cols(), "; expected ", vocab, " x ",
                             path.size() + 1);
            // Column j of s follows the path's first j tokens: the root, then each ancestor.
            Eigen::Index j = static_cast<Eigen::Index>(path.size());
            for (std::int32_t u = static_cast<std::int32_t>(leaf); u >= 0; u = tree.parents[static_cast<std::size_t>(u)])
                out.col(u + 1) = s.col(j--);
            out.col(0) = s.col(0);
        }
        return passes;
    } else {
        for (std::size_t c = 0; c <= n; ++c) {
            path_tokens(tree, static_cast<std::int32_t>(c) - 1, path);
            if (const std::size_t need = context.size() + path.size(); path.capacity() < need)
                path.reserve(std::max(need, 2 * path.capacity()));  // geometric: the context grows every step
            path.insert(path.begin(), context.begin(), context.end());
            checked_next_logits(v, std::span<const token_id>(path), vocab, logits, where, "the target model's ");
            out.col(static_cast<Eigen::Index>(c)) = logits;
        }
        return n + 1;
    }
}

}  // namespace detail

}  // namespace specdec
