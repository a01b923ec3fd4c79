// A model whose next_logits returns std::vector<float>: speculative_decode must say so.
// expect: next_logits must return an Eigen vector of float \(Eigen::VectorXf or an expression of it\); got std::vector
#include <specdec/speculative_decode.hpp>

#include <random>
#include <vector>

struct vector_model {
    int vocab_size() const { return 4; }
    std::vector<float> next_logits(std::span<const specdec::token_id>) { return std::vector<float>(4, 0.0f); }
};

int main() {
    vector_model draft, target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
