#pragma once
// Double-precision references for tree verification: enumeration of every tree a model drafter
// can propose (with its probability), the exact expected accepted length of recursive rejection
// sampling and of traversal verification on a given tree, the exact law of block verification on
// a chain (Sun et al. 2024, Alg. 2, transcribed independently), and a plain recursive rejection
// sampler with a deliberately wrong variant for the negative controls. Also small tree-capable
// test doubles.

#include <specdec/tree.hpp>
#include <specdec/tree_verify.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "markov.hpp"
#include "reference_decode.hpp"

namespace specdec_test {

using dvec = std::vector<double>;

/// The markov model as a TreeVerifier: one score_tree call fills every column (counted in passes).
struct tree_markov {
    markov_model* model;
    std::size_t passes = 0;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    /// Also a plain model (forwards, not counted in passes): chain steps are scored by it, tree
    /// steps by score_tree (a TreeVerifier is preferred; the tree tests check `passes`). Needed
    /// too because at 92bcf29 the static check of speculative_decode and batch_decoder refuses
    /// a TreeVerifier that has neither score() nor next_logits() (diagnostics.hpp,
    /// detail::diagnose_decoder_call instantiates diagnose_verifier<V> for it).
    Eigen::VectorXf next_logits(std::span<const token_id> context) { return model->next_logits(context); }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        ++passes;
        out.resize(model->vocab, static_cast<Eigen::Index>(tree.size() + 1));
        std::vector<token_id> path;
        for (std::size_t c = 0; c <= tree.size(); ++c) {
            specdec::path_tokens(tree, static_cast<std::int32_t>(c) - 1, path);
            path.insert(path.begin(), context.begin(), context.end());
            out.col(static_cast<Eigen::Index>(c)) = model->next_logits(path);
        }
    }
};

/// WORKAROUND, to be removed with tree_markov::next_logits: a pure TreeDrafter made also a
/// plain model for the static check of speculative_decode at 92bcf29. Tree steps draft with
/// propose_tree (a TreeDrafter is preferred): this throws if called.
template <class D>
struct also_plain : D {
    Eigen::VectorXf next_logits(std::span<const token_id>) {
        throw std::logic_error("also_plain::next_logits: a tree step drafts with propose_tree");
    }
};

/// The tree after the draft-side stop, built independently of the library: a node stays when
/// its parent stayed and the parent's draft probability q(token) (its column at its token) is
/// at least `stop_below`; the order, tokens, draws and columns of the nodes that stay are kept.
/// With `drop_low` it is WRONG on purpose (a negative control): a node whose own q(token) is
/// below `stop_below` is dropped with its subtree, instead of kept without children.
inline specdec::draft_tree ref_prune(const specdec::draft_tree& t, float stop_below, bool drop_low = false) {
    if (!(stop_below > 0.0f) || !t.has_distributions()) return t;
    specdec::draft_tree out;
    std::vector<std::int32_t> to(t.size(), -1);
    std::vector<Eigen::Index> cols;
    const auto q_of = [&t](std::size_t i) { return t.probs(t.tokens[i], static_cast<Eigen::Index>(i)); };
    for (std::size_t i = 0; i < t.size(); ++i) {
        const std::int32_t p = t.parents[i];
        if (p >= 0) {
            const auto pu = static_cast<std::size_t>(p);
            if (to[pu] < 0 || (!drop_low && q_of(pu) < stop_below)) continue;
        }
        if (drop_low && q_of(i) < stop_below) continue;
        to[i] = out.add(p < 0 ? -1 : to[static_cast<std::size_t>(p)], t.tokens[i], t.draws_of(i));
        cols.push_back(static_cast<Eigen::Index>(i));
    }
    out.resize_probs(t.probs.rows(), static_cast<Eigen::Index>(cols.size()));
    for (std::size_t j = 0; j < cols.size(); ++j) out.probs.col(static_cast<Eigen::Index>(j)) = t.probs.col(cols[j]);
    out.standardized = t.standardized;
    out.model_calls = t.model_calls;
    return out;
}

/// True when no node of `t` hangs below a node whose draft probability is below `stop_below`.
inline bool respects_stop(const specdec::draft_tree& t, float stop_below) {
    if (!t.has_distributions()) return true;
    for (std::size_t i = 0; i < t.size(); ++i) {
        const std::int32_t p = t.parents[i];
        if (p >= 0 && t.probs(t.tokens[static_cast<std::size_t>(p)], p) < stop_below) return false;
    }
    return true;
}

/// Target logits for every column of `tree` after `context`.
inline Eigen::MatrixXf tree_logits(markov_model& target, std::span<const token_id> context,
                                   const specdec::draft_tree& tree) {
    tree_markov v{&target};
    Eigen::MatrixXf out;
    v.score_tree(context, tree, out);
    return out;
}

/// Every children list (tree_shape::children: breadth first, the root first) of a tree of
/// 1..max_nodes nodes that gives a node at depth d at most widest[d] children, to f.
template <class F>
void for_each_children_list(std::span<const std::size_t> widest, std::size_t max_nodes, F&& f) {
    std::vector<std::size_t> children, depth_of{0};
    // Node i (of depth depth_of[i]) gets k children; then the next node, while nodes remain.
    auto rec = [&](auto&& self, std::size_t i, std::size_t made) -> void {
        if (i > made) {  // every node has its entry
            if (made > 0) f(children);
            return;
        }
        const std::size_t d = depth_of[i];
        const std::size_t most = d < widest.size() ? std::min(widest[d], max_nodes - made) : 0;
        for (std::size_t k = 0; k <= most; ++k) {
            children.push_back(k);
            for (std::size_t r = 0; r < k; ++r) depth_of.push_back(d + 1);
            self(self, i + 1, made + k);
            depth_of.resize(depth_of.size() - k);
            children.pop_back();
        }
    };
    rec(rec, 0, 0);
}

/// Parents, in breadth-first order, of a full tree of `branching` (what draft_tree_from_model
/// builds when no sibling group runs out of mass).
inline std::vector<std::int32_t> bfs_parents(const std::vector<std::size_t>& branching) {
    std::vector<std::int32_t> parents;
    std::vector<std::int32_t> level{-1};
    for (std::size_t k : branching) {
        std::vector<std::int32_t> next;
        for (std::int32_t par : level)
            for (std::size_t j = 0; j < k; ++j) {
                parents.push_back(par);
                next.push_back(static_cast<std::int32_t>(parents.size() - 1));
            }
        level = next;
    }
    return parents;
}

/// q_j(·) of node c of `tree` given its earlier siblings, from its column (double).
inline dvec ref_draft_dist(const specdec::draft_tree& tree, std::size_t c) {
    const auto V = static_cast<std::size_t>(tree.probs.rows());
    dvec q(V);
    for (std::size_t x = 0; x < V; ++x) q[x] = tree.probs(static_cast<Eigen::Index>(x), static_cast<Eigen::Index>(c));
    if (tree.draws_of(c) == specdec::sibling_draws::without_replacement) {
        for (std::size_t s = 0; s < c; ++s)
            if (tree.parents[s] == tree.parents[c]) q[static_cast<std::size_t>(tree.tokens[s])] = 0.0;
        double t = 0.0;
        for (double x : q) t += x;
        for (double& x : q) x /= t;
    }
    return q;
}

/// Calls f(tree, probability) for every tree draft_tree_from_model can draw after `context`
/// with `branching`, `how` and `s` (breadth first; a group drawn without replacement ends early
/// when no mass is left), with the draft's q from ref_standardize in the columns.
inline void enumerate_trees(markov_model& draft, const std::vector<token_id>& context,
                            const std::vector<std::size_t>& branching, specdec::sibling_draws how,
                            const specdec::sampling_config& s,
                            const std::function<void(const specdec::draft_tree&, double)>& f) {
    const auto V = static_cast<std::size_t>(draft.vocab);
    std::size_t total_nodes = 0, level_size = 1;
    for (std::size_t k : branching) total_nodes += (level_size *= k);
    specdec::draft_tree tree;
    tree.resize_probs(draft.vocab, static_cast<Eigen::Index>(total_nodes));
    auto finish = [&](double prob) {
        specdec::draft_tree t = tree;
        Eigen::MatrixXf cols = tree.probs.leftCols(static_cast<Eigen::Index>(tree.size()));
        t.probs = cols;
        f(t, prob);
    };
    using ivec = std::vector<std::int32_t>;
    auto rec = [&](auto&& self, const ivec& level, std::size_t pi, std::size_t j, const ivec& next, std::size_t d,
                   double prob) -> void {
        if (d == branching.size()) return finish(prob);
        if (pi == level.size()) {
            if (next.empty()) return finish(prob);
            return self(self, next, 0, 0, ivec{}, d + 1, prob);
        }
        if (j == branching[d]) return self(self, level, pi + 1, 0, next, d, prob);
        const std::int32_t parent = level[pi];
        std::vector<token_id> path;
        specdec::path_tokens(tree, parent, path);
        path.insert(path.begin(), context.begin(), context.end());
        const dvec q = ref_standardize(draft.next_logits(path), s);
        dvec w = q;
        const std::size_t n0 = tree.size();
        double left = 1.0;
        if (how == specdec::sibling_draws::without_replacement)
            for (std::size_t i = 0; i < n0; ++i)
                if (tree.parents[i] == parent) {
                    left -= w[static_cast<std::size_t>(tree.tokens[i])];
                    w[static_cast<std::size_t>(tree.tokens[i])] = 0.0;
                }
        double total = 0.0, top = 0.0;
        for (double x : w) {
            total += x;
            top = std::max(top, x);
        }
        if (how == specdec::sibling_draws::without_replacement && j > 0 && !(left > 1e-7 && top > 0.0))
            return self(self, level, pi + 1, 0, next, d, prob);  // the group ran out of mass
        for (std::size_t x = 0; x < V; ++x) {
            if (w[x] <= 0.0) continue;
            tree.tokens.resize(n0);
            tree.parents.resize(n0);
            tree.depths.resize(n0);
            tree.draws.resize(n0);
            const std::int32_t node = tree.add(parent, static_cast<token_id>(x), how);
            for (std::size_t y = 0; y < V; ++y)
                tree.probs(static_cast<Eigen::Index>(y), node) = static_cast<float>(q[y]);
            ivec next2 = next;
            next2.push_back(node);
            self(self, level, pi, j + 1, next2, d, prob * w[x] / total);
        }
    };
    rec(rec, ivec{-1}, 0, 0, ivec{}, 0, 1.0);
}

/// Exact E[accepted tokens] of recursive rejection sampling on `tree` (Miao et al. 2024).
inline double ref_rrs_expected(const specdec::draft_tree& tree, const Eigen::MatrixXf& logits,
                               const specdec::sampling_config& s, std::int32_t u = -1) {
    dvec r = ref_standardize(logits.col(u + 1), s);
    double reach = 1.0, e = 0.0;
    for (std::size_t c = 0; c < tree.size(); ++c) {
        if (tree.parents[c] != u) continue;
        const dvec q = ref_draft_dist(tree, c);
        const auto x = static_cast<std::size_t>(tree.tokens[c]);
        const double a = std::min(1.0, r[x] / q[x]);
        e += reach * a * (1.0 + ref_rrs_expected(tree, logits, s, static_cast<std::int32_t>(c)));
        reach *= 1.0 - a;
        double t = 0.0;
        for (std::size_t y = 0; y < r.size(); ++y) t += (r[y] = std::max(0.0, r[y] - q[y]));
        if (t <= 0.0) break;
        for (double& y : r) y /= t;
    }
    return e;
}

/// Exact E[accepted tokens below u, on acceptance] of traversal verification visiting u with
/// weight w (the recursion of tree_verify.hpp, in double).
inline double ref_tv_expected(const specdec::draft_tree& tree, const Eigen::MatrixXf& logits,
                              const specdec::sampling_config& s, std::int32_t u = -1, double w = 1.0) {
    dvec mu = ref_standardize(logits.col(u + 1), s);
    for (double& y : mu) y *= w;
    double reach = 1.0, e = 0.0;
    for (std::size_t c = 0; c < tree.size(); ++c) {
        if (tree.parents[c] != u) continue;
        const dvec q = ref_draft_dist(tree, c);
        const auto x = static_cast<std::size_t>(tree.tokens[c]);
        const double wc = std::min(1.0, mu[x] / q[x]);
        if (wc > 0.0) e += reach * (wc + ref_tv_expected(tree, logits, s, static_cast<std::int32_t>(c), wc));
        // Given this tree the visit fails with probability 1 − wc; the measure left is divided
        // by F, the failure probability averaged over the child's draw (what keeps it
        // independent of the draw).
        reach *= 1.0 - wc;
        double sm = 0.0;
        for (std::size_t y = 0; y < mu.size(); ++y) sm += std::min(q[y], mu[y]);
        const double f = 1.0 - sm;
        if (f <= 1e-15) break;
        for (std::size_t y = 0; y < mu.size(); ++y) mu[y] = std::max(0.0, mu[y] - q[y]) / f;
    }
    return e;
}

/// Exact law of the accepted count of block verification (Sun et al. 2024, Alg. 2) on a chain
/// x_1..x_g with target rows p_0..p_g and draft rows q_1..q_g: P(τ = i) for i = 0..g.
inline dvec ref_block_law(const std::vector<dvec>& p, const std::vector<dvec>& q, const std::vector<std::size_t>& x) {
    const std::size_t g = x.size();
    dvec pw(g + 1, 1.0), h(g + 1, 0.0);
    for (std::size_t i = 1; i <= g; ++i) pw[i] = std::min(1.0, pw[i - 1] * p[i - 1][x[i - 1]] / q[i - 1][x[i - 1]]);
    for (std::size_t i = 1; i < g; ++i) {
        double res = 0.0;
        for (std::size_t y = 0; y < p[i].size(); ++y) res += std::max(0.0, pw[i] * p[i][y] - q[i][y]);
        h[i] = res / (res + 1.0 - pw[i]);
    }
    if (g > 0) h[g] = pw[g];
    // τ is the largest i with η_i <= h_i (0 when none).
    dvec law(g + 1, 0.0);
    double none_above = 1.0;
    for (std::size_t i = g; i >= 1; --i) {
        law[i] = none_above * h[i];
        none_above *= 1.0 - h[i];
    }
    law[0] = none_above;
    return law;
}

/// A plain recursive rejection sampler over a tree (Miao et al. 2024, Alg. 2) in double;
/// with update_residual = false it is WRONG (siblings all tested against p_u, and the token
/// after all rejections drawn from max(0, p_u − q_last)): a negative control.
inline std::pair<std::int32_t, token_id> ref_rrs_sample(const specdec::draft_tree& tree, const Eigen::MatrixXf& logits,
                                                        const specdec::sampling_config& s, std::mt19937_64& rng,
                                                        bool update_residual) {
    std::uniform_real_distribution<double> unif(0.0, 1.0);  // test code only
    std::int32_t u = -1;
    for (;;) {
        const dvec p = ref_standardize(logits.col(u + 1), s);
        dvec r = p;
        std::int32_t next = -1;
        for (std::size_t c = 0; c < tree.size() && next < 0; ++c) {
            if (tree.parents[c] != u) continue;
            const dvec q = ref_draft_dist(tree, c);
            const auto x = static_cast<std::size_t>(tree.tokens[c]);
            if (unif(rng) < r[x] / q[x]) {
                next = static_cast<std::int32_t>(c);
                break;
            }
            dvec base = update_residual ? r : p;
            double t = 0.0;
            for (std::size_t y = 0; y < r.size(); ++y) t += (base[y] = std::max(0.0, base[y] - q[y]));
            if (t > 0.0) {
                for (double& y : base) y /= t;
                r = base;
            }
        }
        if (next < 0) return {u, static_cast<token_id>(sample_ref(r, unif(rng)))};
        u = next;
    }
}

}  // namespace specdec_test
