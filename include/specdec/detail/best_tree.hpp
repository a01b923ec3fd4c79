#pragma once
/// \file
/// Sequoia's dynamic program (Chen et al. 2024, §3.1) for the tree with the most expected
/// tokens among those of at most n nodes within per-depth widths, shared by specdec::best_tree
/// (tree.hpp) and the tree planner (adaptive_gamma.hpp). No Eigen: the planner includes it.

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace specdec::detail {

/// True when every level of a tree shape has one child per node (a chain; also the empty
/// shape, a plain step).
[[nodiscard]] inline bool is_chain_shape(std::span<const std::size_t> branching) noexcept {
    return std::all_of(branching.begin(), branching.end(), [](std::size_t b) { return b == 1; });
}

/// The model: the r-th child drawn under any node (r from 0 here) is the one verification
/// accepts with probability w[r] = a_{r+1} Π_{k<=r} (1 − a_k), given that the node was reached
/// and accepted. A subtree's expected accepted tokens then depend only on its root's depth and
/// its node count: f(d, n), the best below a node of depth d with at most n nodes under it, is
/// the best split of n among the ranks, each child of rank r taking 1 + m nodes and adding
/// w[r] (1 + f(d + 1, m)). Ranks are contiguous from the first (a node's children are its first
/// k draws). O(depth · width · n_max²) time; the tables are kept, so refilling one of the same
/// size allocates nothing.
class best_tree_table {
public:
    /// Fills the table for widths `widest` (a node at depth d has at most widest[d] children;
    /// the depth is widest.size()) and at most n_max nodes. `w` holds the rank weights; ranks
    /// past its end add nothing.
    void compute(std::span<const double> w, std::span<const std::size_t> widest, std::size_t n_max) {
        depth_ = widest.size();
        n_max_ = n_max;
        width_ = 0;
        for (const std::size_t b : widest) width_ = std::max(width_, std::min(b, n_max));
        widest_.assign(widest.begin(), widest.end());
        const std::size_t row = n_max + 1;
        f_.assign((depth_ + 1) * row, 0.0);
        choice_.assign(depth_ * width_ * row, -1);
        h_.assign(row, 0.0);
        h_next_.assign(row, 0.0);
        for (std::size_t d = depth_; d-- > 0;) {
            const std::size_t width = std::min(widest[d], n_max);
            const double* below = f_.data() + (d + 1) * row;
            std::fill(h_next_.begin(), h_next_.end(), 0.0);  // no rank past the widest
            for (std::size_t r = width; r-- > 0;) {
                const double wr = r < w.size() ? w[r] : 0.0;
                std::ptrdiff_t* pick = choice_.data() + (d * width_ + r) * row;
                for (std::size_t n = 0; n <= n_max; ++n) {
                    double best = 0.0;  // rank r gets no child (nor do the later ranks)
                    for (std::size_t m = 0; m < n; ++m) {
                        const double v = wr * (1.0 + below[m]) + h_next_[n - 1 - m];
                        if (v > best) {
                            best = v;
                            pick[n] = static_cast<std::ptrdiff_t>(m);
                        }
                    }
                    h_[n] = best;
                }
                h_.swap(h_next_);
            }
            std::copy(h_next_.begin(), h_next_.end(), f_.begin() + static_cast<std::ptrdiff_t>(d * row));
        }
    }

    /// E[tokens] of the best tree of at most n nodes: the accepted path, and one token more.
    [[nodiscard]] double tokens(std::size_t n) const { return 1.0 + f_[std::min(n, n_max_)]; }

    /// The best tree of at most n nodes as a children list (tree_shape::children: breadth first,
    /// the root 0, no trailing zeros; empty when no node adds anything).
    void tree(std::size_t n, std::vector<std::size_t>& children) {
        children.clear();
        queue_.clear();
        queue_.emplace_back(0, std::min(n, n_max_));
        const std::size_t row = n_max_ + 1;
        for (std::size_t i = 0; i < queue_.size(); ++i) {
            const auto [d, budget] = queue_[i];
            std::size_t k = 0, left = budget;
            if (d < depth_)
                for (std::size_t r = 0; r < std::min(widest_[d], n_max_) && left > 0; ++r) {
                    const std::ptrdiff_t m = choice_[(d * width_ + r) * row + left];
                    if (m < 0) break;
                    queue_.emplace_back(d + 1, static_cast<std::size_t>(m));
                    left -= 1 + static_cast<std::size_t>(m);
                    ++k;
                }
            children.push_back(k);
        }
        while (!children.empty() && children.back() == 0) children.pop_back();
    }

private:
    std::size_t depth_ = 0, n_max_ = 0, width_ = 0;
    std::vector<std::size_t> widest_;
    std::vector<double> f_;              // f(d, n) at d * (n_max + 1) + n
    std::vector<std::ptrdiff_t> choice_;  // (d, r, n): the nodes under rank r's child; −1: none
    std::vector<double> h_, h_next_;
    std::vector<std::pair<std::size_t, std::size_t>> queue_;  // (depth, nodes under it), breadth first
};

/// The rank weights w[r] = a_{r+1} Π_{k<=r} (1 − a_k) of `ranks` ranks from per-rank acceptances
/// a(k), k from 1 (a callable), into `w`.
template <class A>
void rank_weights_of(A&& a, std::size_t ranks, std::vector<double>& w) {
    w.assign(ranks, 0.0);
    double none_yet = 1.0;
    for (std::size_t r = 0; r < ranks; ++r) {
        const double ak = a(r + 1);
        w[r] = none_yet * ak;
        none_yet *= 1.0 - ak;
    }
}

}  // namespace specdec::detail
