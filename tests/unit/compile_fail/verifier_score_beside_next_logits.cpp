// A model with next_logits() and a score() meant as the batched pass but declared with the
// context only: decoding would call next_logits and never score(), so it is refused by name.
// expect: the verifier has next_logits\(\) and a score\(\) that is not a BatchVerifier's, so decoding would silently ignore score\(\)
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct target_model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
    Eigen::MatrixXf score(std::span<const specdec::token_id>) { return Eigen::MatrixXf::Zero(4, 1); }
};

int main() {
    model draft;
    target_model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
