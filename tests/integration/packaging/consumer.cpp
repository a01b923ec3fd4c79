// A minimal downstream program: a custom model type, speculative decoding at temperature 0,
// checked against the autoregressive baseline.
#include <specdec/specdec.hpp>

#include <cstdio>
#include <random>
#include <vector>

namespace {
struct cyclic_model {
    int shift;
    std::ptrdiff_t vocab_size() const { return 16; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id> context) const {
        Eigen::VectorXf z = Eigen::VectorXf::Zero(16);
        z[(context.back() + shift) % 16] = 1.0f;
        return z;
    }
};
}  // namespace

int main() {
    cyclic_model target{3}, draft{3};
    const std::vector<specdec::token_id> prompt{1};
    std::mt19937_64 rng(7);
    const auto spec = specdec::speculative_decode(draft, target, prompt, {.step = specdec::chain{.gamma = 3},
                                                                         .sampling = {.temperature = 0.0f},
                                                                         .budget = {.max_new_tokens = 10}}, rng);
    const auto base = specdec::autoregressive_decode(target, prompt, {.sampling = {.temperature = 0.0f},
                                                                      .budget = {.max_new_tokens = 10}}, rng);
    if (spec.tokens != base.tokens || spec.tokens.size() != 10) {
        std::puts("consumer: speculative and autoregressive outputs differ");
        return 1;
    }
    std::printf("consumer: specdec %d.%d.%d ok\n", SPECDEC_VERSION_MAJOR, SPECDEC_VERSION_MINOR, SPECDEC_VERSION_PATCH);
    return 0;
}
