#pragma once
/// \file
/// A drafter whose acceptance rate is set by hand, for measuring speculative decoding on models
/// that agree with nothing (random weights at a real model's shape).
///
/// At temperature 0 each sequence's output is the target's greedy continuation of its prompt,
/// which the caller computes once (e.g. by batched autoregressive decoding) and hands over. The
/// drafter runs the draft model's real pass for its cost, then throws its tokens away and
/// proposes point masses: at each output position the target's greedy token with a set
/// probability, another token otherwise. Whether a proposal is right is a coin that is a fixed
/// function of (sequence, position, sibling rank) (splitmix64), so every run sees the same
/// positions drafted right and wrong, whatever γ, the tree's shape or the step boundaries.
///
///  - Chains (draft_batch, a MultiSequenceDrafter): one multi-sequence draft pass per draft
///    position; position k is right when coin(s, k, 0) < α₀. Acceptance is then α₀ per
///    position, independently: the model of Leviathan, Kalman & Matias 2023, §3.1.
///  - Trees (propose_tree, a TreeDrafter, for one sequence at a time): the draft model's pass
///    over the sequence for one position per level (what a chain of the tree's depth costs; a
///    level's nodes would share that pass on a draft engine with tree attention, and at widths
///    of a few nodes this model's pass is bound by reading its weights, so the figures favour
///    trees a little). Below the node on the greedy path, child r (in sibling order) is the
///    greedy token when no earlier sibling is and coin(s, k, r) < α_r, so α_r is the acceptance
///    of the r-th sibling given that the earlier ones were rejected (the quantity the tree
///    planner estimates); the other children get distinct wrong tokens. Rank 0 uses the chain's
///    coin, so a chain and a tree see the same first choices. A tree's sequence is recognized by
///    its prompt (the context's first tokens), so prompts must be distinct.
///
/// Example code, single-threaded, not thread-safe.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <specdec/multi_sequence.hpp>
#include <specdec/tree.hpp>
#include <specdec/types.hpp>

#include "batch_transformer.hpp"
#include "checkpoint.hpp"

namespace llama2 {

/// A checkpoint with random weights at the shape of `preset` (preset_config, random_weights), as
/// the benchmarks and specdec-random-pair make them; named "random-<preset>".
[[nodiscard]] inline std::shared_ptr<const checkpoint> random_checkpoint(const char* preset, std::uint64_t seed) {
    auto ck = std::make_shared<checkpoint>();
    ck->name = std::string("random-") + preset;
    ck->cfg = *preset_config(preset);
    ck->w = random_weights(ck->cfg, seed);
    return ck;
}

/// `batch` prompts of `length` tokens: BOS, then tokens in [3, 30003) from a fixed seed.
[[nodiscard]] inline std::vector<std::vector<specdec::token_id>> random_prompts(std::size_t batch, std::size_t length) {
    std::mt19937 rng(7);
    std::vector<std::vector<specdec::token_id>> p(batch);
    for (auto& x : p) {
        x.push_back(1);
        for (std::size_t i = 1; i < length; ++i) x.push_back(static_cast<specdec::token_id>(3 + rng() % 30000));
    }
    return p;
}

/// Runs every prompt but its last token through the model's slots (slot i: prompt i), as a
/// serving engine's prefill does when a request arrives, so that timed steps measure decoding.
inline void prefill(batch_transformer& m, const std::vector<std::vector<specdec::token_id>>& prompts) {
    std::vector<specdec::score_request> requests;
    for (std::size_t i = 0; i < prompts.size(); ++i)
        requests.push_back({i, std::span<const specdec::token_id>(prompts[i]).first(prompts[i].size() - 1), {}});
    specdec::packed_logits out;
    out.shape(m.vocab_size(), requests);
    m.score_batch(requests, out);
}

/// A uniform number in [0, 1) that is a fixed function of (sequence, position, rank):
/// splitmix64's finalizer over a mix of the three (rank 0 adds nothing to the mix).
[[nodiscard]] inline double controlled_coin(std::size_t sequence, std::size_t position, std::size_t rank = 0) noexcept {
    std::uint64_t z = std::uint64_t(sequence) * 0x9E3779B97F4A7C15ull + std::uint64_t(position) * 0xBF58476D1CE4E5B9ull +
                      std::uint64_t(rank) * 0xD6E8FEB86659FD93ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
}

/// The controlled-acceptance drafter (see the file comment): a MultiSequenceDrafter for chains
/// and a TreeDrafter for trees.
///
/// \tparam Model a MultiSequenceDrafter run for its cost (llama2::batch_transformer, or a wrapper
///         that times it); its proposals are discarded.
///
/// Sequence (slot) s has the prompt `prompts[s]` (all of one length, all distinct) and the
/// target's greedy continuation `greedy[s]`, without the prompt. Past the end of a continuation
/// the "right" token is 0. `alpha[r]` is the acceptance of a rank-r sibling given that the
/// earlier ones were rejected (α₀ alone for chains); ranks past the end take the last value.
/// The drafter keeps references to `model`, `prompts` and `greedy`: all must outlive it.
template <class Model>
class controlled_drafter {
public:
    /// \throws std::invalid_argument for no prompts, prompts of different lengths or two equal
    ///         prompts, a greedy continuation count that differs from the prompts', or an empty
    ///         `alpha` or a value outside [0, 1].
    controlled_drafter(Model& model, std::span<const std::vector<specdec::token_id>> prompts,
                       std::span<const std::vector<specdec::token_id>> greedy, std::vector<double> alpha)
        : model_(&model), prompts_(prompts), greedy_(greedy), alpha_(std::move(alpha)) {
        const std::string where = "llama2::controlled_drafter: ";
        if (prompts.empty() || prompts.front().empty())
            throw std::invalid_argument(where + "no prompts (or an empty one) given");
        prompt_length_ = prompts.front().size();
        for (std::size_t s = 0; s < prompts.size(); ++s) {
            if (prompts[s].size() != prompt_length_)
                throw std::invalid_argument(where + "prompt " + std::to_string(s) + " has " +
                                            std::to_string(prompts[s].size()) + " tokens, prompt 0 has " +
                                            std::to_string(prompt_length_) + "; all must be of one length");
            for (std::size_t t = 0; t < s; ++t)
                if (prompts[t] == prompts[s])
                    throw std::invalid_argument(where + "prompts " + std::to_string(t) + " and " + std::to_string(s) +
                                                " are equal; trees recognize a sequence by its prompt");
        }
        if (greedy.size() != prompts.size())
            throw std::invalid_argument(where + std::to_string(greedy.size()) + " greedy continuations for " +
                                        std::to_string(prompts.size()) + " prompts");
        if (alpha_.empty()) throw std::invalid_argument(where + "alpha is empty; give at least the first child's");
        for (std::size_t r = 0; r < alpha_.size(); ++r)
            if (!(alpha_[r] >= 0.0 && alpha_[r] <= 1.0))
                throw std::invalid_argument(where + "alpha[" + std::to_string(r) + "] = " + std::to_string(alpha_[r]) +
                                            " is not in [0, 1]");
    }

    [[nodiscard]] std::ptrdiff_t vocab_size() const { return model_->vocab_size(); }
    /// The acceptance of a rank-r sibling given that the earlier ones were rejected.
    [[nodiscard]] double alpha(std::size_t rank = 0) const noexcept { return alpha_[std::min(rank, alpha_.size() - 1)]; }

    /// The draft model's pass over every request (its cost), then point masses: for output
    /// position k of sequence s, greedy[s][k] when controlled_coin(s, k) < α₀, else the next
    /// token id after it (mod the vocabulary), which the target at temperature 0 rejects.
    /// \throws std::out_of_range for a slot without a prompt, std::invalid_argument for a
    ///         context shorter than the prompt; and whatever the model's draft_batch throws.
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling) {
        for (const auto& r : requests) {
            if (r.slot >= greedy_.size())
                throw std::out_of_range("llama2::controlled_drafter: slot " + std::to_string(r.slot) + " has no greedy " +
                                        "continuation (" + std::to_string(greedy_.size()) + " given)");
            (void)first_position(r.context);
        }
        model_->draft_batch(requests, sampling);
        const auto vocab = static_cast<specdec::token_id>(vocab_size());
        for (auto& r : requests) {
            const std::size_t n = r.out->tokens.size(), first = r.context.size() - prompt_length_;
            r.out->clear();  // point masses
            r.out->model_calls = n;
            for (std::size_t i = 0; i < n; ++i) {
                const specdec::token_id right = right_token(r.slot, first + i);
                r.out->tokens.push_back(controlled_coin(r.slot, first + i) < alpha_[0] ? right : (right + 1) % vocab);
            }
        }
    }

    /// The draft model's pass over this sequence for one position per level (its cost; see the
    /// file comment), then a tree of `shape` (breadth first, capped by shape.max_nodes) of
    /// point masses: below the greedy path's node, child r is the greedy token when no earlier
    /// sibling is and controlled_coin(s, k, r) < α_r, else greedy + 1 + r (mod the vocabulary);
    /// below any other node, child r is its parent's token + 1 + r. Siblings are distinct.
    /// \throws std::invalid_argument for a context that starts with none of the prompts or is
    ///         shorter than one; and whatever the model's draft_batch throws.
    void propose_tree(std::span<const specdec::token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& sampling, specdec::uniform_source& uniforms,
                      specdec::draft_tree& out) {
        const std::size_t first = first_position(context), s = sequence_of(context), depth = shape.depth();
        if (depth > 0) {
            specdec::draft_request request{s, context, depth, uniforms, &scratch_};
            scratch_.clear();
            model_->draft_batch(std::span<specdec::draft_request>(&request, 1), sampling);
        }
        const auto vocab = static_cast<specdec::token_id>(vocab_size());
        const std::size_t cap = shape.max_nodes == 0 ? std::numeric_limits<std::size_t>::max() : shape.max_nodes;
        out.clear();
        on_path_.assign(1, true);  // the root
        std::size_t level_begin = 0, level_end = 0;  // nodes of the previous level (none: the root)
        for (std::size_t d = 0; d < depth && out.size() < cap; ++d) {
            const std::size_t k = first + d;
            const specdec::token_id right = right_token(s, k);
            const std::int32_t parents_begin = d == 0 ? -1 : static_cast<std::int32_t>(level_begin);
            const std::int32_t parents_end = d == 0 ? 0 : static_cast<std::int32_t>(level_end);
            const std::size_t next_begin = out.size();
            for (std::int32_t p = parents_begin; p < parents_end && out.size() < cap; ++p) {
                const bool parent_right = on_path_[static_cast<std::size_t>(p + 1)];
                bool found = false;
                for (std::size_t r = 0; r < shape.branching[d] && out.size() < cap; ++r) {
                    specdec::token_id t;
                    bool hit = false;
                    if (parent_right) {
                        hit = !found && controlled_coin(s, k, r) < alpha(r);
                        t = hit ? right : static_cast<specdec::token_id>((right + 1 + static_cast<specdec::token_id>(r)) % vocab);
                        found = found || hit;
                    } else {
                        const specdec::token_id above = out.tokens[static_cast<std::size_t>(p)];
                        t = static_cast<specdec::token_id>((above + 1 + static_cast<specdec::token_id>(r)) % vocab);
                    }
                    out.add(p, t, specdec::sibling_draws::without_replacement);
                    on_path_.push_back(hit);
                }
            }
            level_begin = next_begin;
            level_end = out.size();
        }
        out.model_calls = depth;
    }

private:
    [[nodiscard]] std::size_t first_position(std::span<const specdec::token_id> context) const {
        if (context.size() < prompt_length_)
            throw std::invalid_argument("llama2::controlled_drafter: a context of " + std::to_string(context.size()) +
                                        " tokens is shorter than the prompt (" + std::to_string(prompt_length_) + ")");
        return context.size() - prompt_length_;
    }
    [[nodiscard]] std::size_t sequence_of(std::span<const specdec::token_id> context) const {
        for (std::size_t s = 0; s < prompts_.size(); ++s)
            if (std::equal(prompts_[s].begin(), prompts_[s].end(), context.begin())) return s;
        throw std::invalid_argument("llama2::controlled_drafter::propose_tree: the context starts with none of the " +
                                    std::to_string(prompts_.size()) + " prompts");
    }
    [[nodiscard]] specdec::token_id right_token(std::size_t s, std::size_t k) const {
        const auto& g = greedy_[s];
        return k < g.size() ? g[k] : 0;
    }

    Model* model_;
    std::span<const std::vector<specdec::token_id>> prompts_;
    std::span<const std::vector<specdec::token_id>> greedy_;
    std::size_t prompt_length_ = 0;
    std::vector<double> alpha_;
    specdec::draft_block scratch_;
    std::vector<bool> on_path_;  // per node + 1 (entry 0: the root)
};

}  // namespace llama2
