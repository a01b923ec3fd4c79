#pragma once
// Drafting near the end of a model's context window.
//
// The pair in this example has different context limits (the draft 256 tokens, the target
// 512). Policy: the draft model drafts while context + draft fits its window and proposes
// fewer tokens, then none, as the window fills; from then on each step is one target token
// (an empty draft), so generation goes on up to the target's own limit, where the engine
// throws std::length_error. The output distribution is unaffected: the number of drafted
// tokens may vary from step to step.

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cstddef>
#include <span>

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

}  // namespace llama2
