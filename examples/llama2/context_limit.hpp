#pragma once
// Drafting near the end of a model's context window.
//
// The pair in this example has different context limits (the draft 256 tokens, the target
// 512). Policy: the draft model drafts while context + draft fits its window and proposes
// fewer tokens, then none, as the window fills; from then on each step is one target token
// (an empty draft), so generation goes on up to the target's own limit, where the engine
// throws std::length_error. The output distribution is unaffected: the number of drafted
// tokens may vary from step to step.
//
// Trees (context_limited_tree_drafter) need more room than their depth: tree attention keeps
// every node in the KV cache, so the target scores context + all nodes in one pass, and the
// draft model, drawing level by level with score_tree, holds context + every node above the
// level it draws. Near the end of either window the tree shrinks, its nodes dropped from the
// deepest level up (the last in breadth-first order first), until both fit; then it is empty,
// and each later step is one target token, as for chains. The tree's shape depends on the
// context's length only, never on what was drawn, so the output distribution is unaffected.

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace llama2 {

/// A BlockDrafter over a model with a context limit (a LanguageModel with max_context()),
/// drafting min(gamma, room left in the model's window) tokens.
template <class M>
class context_limited_drafter {
public:
    explicit context_limited_drafter(M& model) : model_(&model) {}

    [[nodiscard]] std::ptrdiff_t vocab_size() const { return model_->vocab_size(); }

    void draft(std::span<const specdec::token_id> context, std::size_t gamma, const specdec::sampling_config& sampling,
               specdec::uniform_source& uniforms, specdec::draft_block& out) {
        // Drafting x_1..x_k feeds context + x_1..x_{k-1}, at most |context| + k − 1 tokens, to
        // the model: k <= limit − |context| + 1 (one token still fits a full window).
        const auto limit = static_cast<std::size_t>(model_->max_context());
        const std::size_t room = context.size() <= limit ? limit - context.size() + 1 : 0;
        const std::size_t k = std::min(gamma, room);
        if (k == 0) {
            out.clear();
            return;
        }
        inner_.draft(context, k, sampling, uniforms, out);
    }

private:
    M* model_;
    specdec::model_drafter<M> inner_{*model_};
};

/// A BlockDrafter whose drafting runs a model `beyond` tokens past the block it proposes (a
/// specdec::hierarchical_drafter: its inner loop scores the sequence so far plus an inner draft
/// of up to inner gamma tokens), limited to that model's window: it asks `drafter` for
/// min(gamma, room) tokens, room = window − context − beyond, and proposes none when there is
/// no room (a plain target step). The block's length depends on the context's length only.
template <class D>
class window_limited_drafter {
public:
    window_limited_drafter(D& drafter, std::size_t window, std::size_t beyond)
        : drafter_(&drafter), window_(window), beyond_(beyond) {}
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return drafter_->vocab_size(); }
    void draft(std::span<const specdec::token_id> context, std::size_t gamma, const specdec::sampling_config& sampling,
               specdec::uniform_source& uniforms, specdec::draft_block& out) {
        const std::size_t used = context.size() + beyond_;
        const std::size_t k = std::min(gamma, used < window_ ? window_ - used : 0);
        if (k == 0) {
            out.clear();
            return;
        }
        drafter_->draft(context, k, sampling, uniforms, out);
    }

private:
    D* drafter_;
    std::size_t window_, beyond_;
};

/// The largest part of `asked` that a step after `context` tokens can draft and score:
/// `asked` filled breadth first (as specdec::draft_tree_from_model fills it) up to m nodes,
/// for the largest m with
///   context + m                        <= target_window  (score_tree holds every node), and
///   context + (nodes above the deepest) <= draft_window   (drawing the deepest level scores
///                                                           the tree above it with the draft);
/// written into `out` as the first levels of the asked shape (tree_shape::cut) with max_nodes =
/// m (no levels when nothing fits: an empty tree, a plain target step). A children list is
/// counted by its widest node per depth (asked.branching), which only overstates the nodes above
/// its deepest level. Reuses out's storage.
inline void fit_tree_to_windows(const specdec::tree_shape& asked, std::size_t context, std::size_t draft_window,
                                std::size_t target_window, specdec::tree_shape& out) {
    const std::size_t depth = asked.depth();
    std::size_t levels = 0;
    // Whether m nodes fit; sets `levels` to the levels they occupy.
    const auto fits = [&](std::size_t m) {
        std::size_t used = 0, above = 0, width = 1;
        levels = 0;
        for (std::size_t d = 0; d < depth && used < m; ++d) {
            // (A level's width saturates at m, which keeps min(width, m - used) right and the
            // product from overflowing.)
            width = width > m / asked.branching[d] ? m : width * asked.branching[d];
            above = used;
            used += std::min(width, m - used);
            ++levels;
        }
        return context + above <= draft_window && context + used <= target_window;
    };
    std::size_t m = context < target_window ? std::min(asked.nodes(), target_window - context) : 0;
    while (m > 0 && !fits(m)) --m;  // (the last call, for the m kept, set `levels`)
    if (m == 0) levels = 0;
    asked.cut(levels, out);  // (a children list too: its nodes above `levels`)
    out.max_nodes = m;
}

/// A TreeDrafter over a model with a context limit (a LanguageModel and TreeVerifier with
/// max_context(), as llama2::transformer), for a target whose window is `target_window`
/// tokens: it draws trees of the asked shape cut down by fit_tree_to_windows, one score_tree
/// pass of the draft model per level.
template <class M>
class context_limited_tree_drafter {
public:
    context_limited_tree_drafter(M& model, std::size_t target_window) : model_(&model), target_window_(target_window) {}

    [[nodiscard]] std::ptrdiff_t vocab_size() const { return model_->vocab_size(); }

    void propose_tree(std::span<const specdec::token_id> context, const specdec::tree_shape& asked,
                      const specdec::sampling_config& sampling, specdec::uniform_source& uniforms,
                      specdec::draft_tree& out) {
        fit_tree_to_windows(asked, context.size(), static_cast<std::size_t>(model_->max_context()), target_window_,
                            shape_);
        if (shape_.nodes() == 0) {
            out.clear();
            return;
        }
        specdec::draft_tree_from_model(*model_, context, shape_, sampling, uniforms, out, path_, logits_, q_, scratch_,
                                       sws_, level_scores_);
    }

    /// The shape of the last tree drawn (after fit_tree_to_windows).
    [[nodiscard]] const specdec::tree_shape& last_shape() const noexcept { return shape_; }

private:
    M* model_;
    std::size_t target_window_;
    specdec::tree_shape shape_{};
    std::vector<specdec::token_id> path_{};
    Eigen::VectorXf logits_{}, q_{}, scratch_{};
    std::vector<Eigen::MatrixXf> level_scores_{};  // one score_tree matrix per level
    specdec::sampling_workspace sws_{};
};

}  // namespace llama2
