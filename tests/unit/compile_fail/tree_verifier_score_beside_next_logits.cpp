// A target with next_logits() and a right score_tree() (a LanguageModel and a TreeVerifier) whose
// score() takes the context only: chain steps would call next_logits and never score(), so it is
// refused by name.
// expect: the verifier has next_logits\(\) and a score\(\) that is not a BatchVerifier's
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
    void score_tree(std::span<const specdec::token_id>, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        out = Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(tree.size() + 1));
    }
};

int main() {
    model draft;
    target_model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
