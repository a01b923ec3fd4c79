// A batched verifier whose score() takes the context only.
// expect: the verifier's score has the wrong signature; a BatchVerifier needs `Eigen::MatrixXf score\(std::span<const specdec::token_id> context, std::span<const specdec::token_id> draft\)`
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct one_argument_verifier {
    int vocab_size() const { return 4; }
    Eigen::MatrixXf score(std::span<const specdec::token_id>) { return Eigen::MatrixXf::Zero(4, 1); }
};

int main() {
    model draft;
    one_argument_verifier target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
