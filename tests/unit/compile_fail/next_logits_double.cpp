// A model whose next_logits returns Eigen::VectorXd (the concept accepts it, Eigen would fail
// deep inside an assignment): the entry point names the scalar type.
// expect: next_logits must return an Eigen vector of float; got an Eigen object of another scalar type
#include <specdec/speculative_decode.hpp>

#include <random>

struct double_model {
    int vocab_size() const { return 4; }
    Eigen::VectorXd next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXd::Zero(4); }
};

int main() {
    double_model target;
    std::mt19937_64 rng(1);
    (void)specdec::autoregressive_decode(target, {1, 2}, {}, rng);
}
