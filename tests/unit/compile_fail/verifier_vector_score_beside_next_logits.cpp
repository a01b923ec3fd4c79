// A model with next_logits() and a batched score() that returns its logits in a std::vector:
// score() is no BatchVerifier's (its result does not convert to Eigen::MatrixXf), so decoding
// would ignore it.
// expect: score\(context, draft\) must return an Eigen matrix of float \(Eigen::MatrixXf, vocab_size\(\) rows and draft.size\(\) \+ 1 columns\); its result does not convert to Eigen::MatrixXf
#include <specdec/speculative_decode.hpp>

#include <random>
#include <vector>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct target_model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
    std::vector<float> score(std::span<const specdec::token_id>, std::span<const specdec::token_id> draft) {
        return std::vector<float>(4 * (draft.size() + 1), 0.0f);
    }
};

int main() {
    model draft;
    target_model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
