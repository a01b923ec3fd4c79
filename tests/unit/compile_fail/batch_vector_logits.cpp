// batch_decoder with a model whose next_logits returns std::vector<float>: one error that names
// next_logits and the fix (not a cascade ending in "cannot convert ... to int").
// expect: next_logits must return an Eigen vector of float \(Eigen::VectorXf or an expression of it\); got std::vector: return an Eigen::VectorXf, or an Eigen::Map<const Eigen::VectorXf>
// reject: cannot convert|no matching function|no match for
#include <specdec/batch_decoder.hpp>

#include <random>
#include <vector>

struct vector_model {
    int vocab_size() const { return 4; }
    std::vector<float> next_logits(std::span<const specdec::token_id>) { return std::vector<float>(4, 0.0f); }
};

int main() {
    vector_model draft, target;
    specdec::batch_decoder dec(draft, target, {.budget = {.max_new_tokens = 8}});
    (void)dec.add(std::vector<specdec::token_id>{1, 2}, std::mt19937_64(1));
    dec.run();
    (void)dec.take(0);
}
