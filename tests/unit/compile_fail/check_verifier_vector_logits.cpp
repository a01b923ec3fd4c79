// specdec::check_verifier in a user's own static_assert, on a model whose next_logits returns
// std::vector<float>: the same message as the entry points, not only "static assertion failed".
// expect: next_logits must return an Eigen vector of float \(Eigen::VectorXf or an expression of it\); got std::vector
#include <specdec/diagnostics.hpp>

#include <vector>

struct vector_model {
    int vocab_size() const { return 4; }
    std::vector<float> next_logits(std::span<const specdec::token_id>) { return std::vector<float>(4, 0.0f); }
};

static_assert(specdec::check_verifier<vector_model>());

int main() {}
