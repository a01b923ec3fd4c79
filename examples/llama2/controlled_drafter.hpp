#pragma once
/// \file
/// A drafter whose acceptance rate is set by hand, for measuring speculative decoding on models
/// that agree with nothing (random weights at a real model's shape).
///
/// At temperature 0 each sequence's output is the target's greedy continuation of its prompt,
/// which the caller computes once (e.g. by batched autoregressive decoding) and hands over. The
/// drafter first runs the draft model's real multi-sequence draft pass over every request (one
/// pass per draft position, so drafting costs what that model costs), then throws its tokens away
/// and proposes, at each output position, the target's greedy token with probability α and
/// another token otherwise, as point masses. Whether a position is drafted right is a coin that is
/// a fixed function of (sequence, position) (splitmix64), so every run sees the same positions
/// drafted right and wrong, whatever γ or the step boundaries. Acceptance is then α per position,
/// independently: the model of Leviathan, Kalman & Matias 2023, §3.1 (i.i.d. β with mean α).
///
/// Example code, single-threaded, not thread-safe.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <specdec/multi_sequence.hpp>
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

/// A uniform number in [0, 1) that is a fixed function of (sequence, position): splitmix64's
/// finalizer over a mix of the two.
[[nodiscard]] inline double controlled_coin(std::size_t sequence, std::size_t position) noexcept {
    std::uint64_t z = std::uint64_t(sequence) * 0x9E3779B97F4A7C15ull + std::uint64_t(position) * 0xBF58476D1CE4E5B9ull +
                      0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
}

/// The controlled-acceptance drafter (see the file comment), a specdec MultiSequenceDrafter.
///
/// \tparam Model a MultiSequenceDrafter run for its cost (llama2::batch_transformer, or a wrapper
///         that times it); its proposals are discarded.
///
/// `greedy[s]` is the target's greedy continuation of sequence (slot) s's prompt, without the
/// prompt; every prompt is `prompt_length` tokens long. Past the end of a continuation the
/// "right" token is 0. The drafter keeps references to `model` and `greedy`: both must outlive it.
template <class Model>
class controlled_drafter {
public:
    /// \throws std::invalid_argument for α outside [0, 1].
    controlled_drafter(Model& model, std::span<const std::vector<specdec::token_id>> greedy, std::size_t prompt_length,
                       double alpha)
        : model_(&model), greedy_(greedy), prompt_length_(prompt_length), alpha_(alpha) {
        if (!(alpha >= 0.0 && alpha <= 1.0))
            throw std::invalid_argument("llama2::controlled_drafter: alpha = " + std::to_string(alpha) +
                                        " is not in [0, 1]");
    }

    [[nodiscard]] std::ptrdiff_t vocab_size() const { return model_->vocab_size(); }
    [[nodiscard]] double alpha() const noexcept { return alpha_; }

    /// The draft model's pass over every request (its cost), then point masses: for output
    /// position k of sequence s, greedy[s][k] when controlled_coin(s, k) < α, else the next token
    /// id after it (mod the vocabulary), which the target at temperature 0 rejects.
    /// \throws std::out_of_range for a slot without a greedy continuation, std::invalid_argument
    ///         for a context shorter than the prompt; and whatever the model's draft_batch throws.
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling) {
        for (const auto& r : requests) {
            if (r.slot >= greedy_.size())
                throw std::out_of_range("llama2::controlled_drafter: slot " + std::to_string(r.slot) + " has no greedy " +
                                        "continuation (" + std::to_string(greedy_.size()) + " given)");
            if (r.context.size() < prompt_length_)
                throw std::invalid_argument("llama2::controlled_drafter: a context of " +
                                            std::to_string(r.context.size()) + " tokens is shorter than the prompt (" +
                                            std::to_string(prompt_length_) + ")");
        }
        model_->draft_batch(requests, sampling);
        const auto vocab = static_cast<specdec::token_id>(vocab_size());
        for (auto& r : requests) {
            const std::size_t n = r.out->tokens.size(), first = r.context.size() - prompt_length_;
            const auto& g = greedy_[r.slot];
            r.out->clear();  // point masses
            r.out->model_calls = n;
            for (std::size_t i = 0; i < n; ++i) {
                const std::size_t k = first + i;
                const specdec::token_id right = k < g.size() ? g[k] : 0;
                r.out->tokens.push_back(controlled_coin(r.slot, k) < alpha_ ? right : (right + 1) % vocab);
            }
        }
    }

private:
    Model* model_;
    std::span<const std::vector<specdec::token_id>> greedy_;
    std::size_t prompt_length_;
    double alpha_;
};

}  // namespace llama2
