// speculative_step_batch with vectors of models whose next_logits returns std::vector<float>.
// expect: next_logits must return an Eigen vector of float \(Eigen::VectorXf or an expression of it\); got std::vector
#include <specdec/batch.hpp>

#include <random>
#include <vector>

struct vector_model {
    int vocab_size() const { return 4; }
    std::vector<float> next_logits(std::span<const specdec::token_id>) { return std::vector<float>(4, 0.0f); }
};

int main() {
    std::vector<vector_model> drafters(2), verifiers(2);
    std::vector<specdec::batch_sequence<std::mt19937_64>> sequences(2);
    specdec::batch_workspace ws;
    specdec::speculative_step_batch(drafters, verifiers, sequences, {}, ws);
}
