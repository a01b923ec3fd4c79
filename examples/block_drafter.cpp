// A block drafter of one's own, complete: the README's example, built and run by ctest.
//
// The drafter proposes γ tokens from a small model, sampling each token from exactly the
// distribution it records for verification (the contract of specdec::BlockDrafter). The
// program decodes with it at temperature 0.8 and at temperature 0, and checks the latter
// against greedy decoding with the target alone (speculative decoding at temperature 0 is
// greedy decoding, token for token).
//
//   specdec_block_drafter   (no options; exit status 1 if the check fails)

#include <specdec/specdec.hpp>

#include <cstdio>
#include <random>
#include <span>
#include <vector>

namespace {

/// A toy model over V = 64 tokens: logits favour (last token + step) mod V, less so after a
/// multiple of `weak`. The target and the draft below differ in `weak`, so they disagree on
/// some contexts and some drafts are rejected.
struct toy_model {
    int step, weak;
    std::ptrdiff_t vocab_size() const { return 64; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id> context) const {
        Eigen::VectorXf z = Eigen::VectorXf::LinSpaced(64, 0.0f, 1.0f);
        const specdec::token_id last = context.back();
        z[(last + step) % 64] += last % weak == 0 ? 1.0f : 4.0f;
        z[(last + 1) % 64] += 2.0f;
        return z;
    }
};

/// The block drafter: γ tokens from a model, each sampled from the column it writes.
template <specdec::LanguageModel M>
class sampling_drafter {
public:
    explicit sampling_drafter(M& model) : model_(&model) {}

    std::ptrdiff_t vocab_size() const { return model_->vocab_size(); }

    /// Called once per step with the whole context; `out` arrives empty.
    void draft(std::span<const specdec::token_id> context, std::size_t gamma, const specdec::sampling_config& sampling,
               specdec::uniform_source& uniforms, specdec::draft_block& out) {
        context_.assign(context.begin(), context.end());
        // V x γ columns, reusing the storage of earlier steps (no allocation after warm-up).
        Eigen::MatrixXf& q = out.resize_probs(vocab_size(), static_cast<Eigen::Index>(gamma));
        for (std::size_t i = 0; i < gamma; ++i) {
            const Eigen::VectorXf logits = model_->next_logits(context_);
            // Writes q_i (standardized with the step's sampling settings) and draws x_i from it
            // with one uniform from the caller's generator: no hidden randomness.
            const specdec::token_id x = specdec::standardize_and_sample(
                logits, sampling, q.col(static_cast<Eigen::Index>(i)), uniforms(), workspace_);
            out.tokens.push_back(x);
            context_.push_back(x);
        }
        out.standardized = true;  // the columns come from standardize_and_sample: no need to check them
        out.model_calls = gamma;  // one forward pass per token, for decode_stats::draft_calls
    }

private:
    M* model_;
    specdec::sampling_workspace workspace_;      // scratch for top-k / top-p, reused
    std::vector<specdec::token_id> context_;      // the context extended by the block so far
};

}  // namespace

int main() {
    static_assert(specdec::BlockDrafter<sampling_drafter<toy_model>>);
    toy_model target_model{3, 5}, draft_model{3, 7};
    sampling_drafter drafter(draft_model);
    const std::vector<specdec::token_id> prompt{1, 2, 3};

    std::mt19937_64 rng(7);
    const specdec::decode_result out = specdec::speculative_decode(
        drafter, target_model, prompt,
        {.step = specdec::chain{.gamma = 4}, .sampling = {.temperature = 0.8f}, .budget = {.max_new_tokens = 64}}, rng);
    std::printf("temperature 0.8: %zu tokens in %zu steps, %zu draft calls, acceptance rate %.2f\n",
                out.tokens.size(), out.stats.steps, out.stats.draft_calls, out.stats.acceptance_rate());

    const specdec::decode_options greedy{.step = specdec::chain{.gamma = 4},
                                         .sampling = {.temperature = 0.0f},
                                         .budget = {.max_new_tokens = 64}};
    const auto spec = specdec::speculative_decode(drafter, target_model, prompt, greedy, rng);
    const auto base = specdec::autoregressive_decode(target_model, prompt, greedy, rng);
    if (spec.tokens != base.tokens) {
        std::puts("error: at temperature 0 speculative decoding differs from greedy decoding");
        return 1;
    }
    std::printf("temperature 0: identical to greedy decoding (%zu tokens, %.2f tokens per target call)\n",
                spec.tokens.size(), spec.stats.tokens_per_step());
    return 0;
}
