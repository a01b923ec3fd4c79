// A BatchVerifier whose score_tree() takes no output matrix: decoding would score trees path by
// path through score() and never call score_tree(), so it is refused by name.
// expect: the verifier's score_tree has the wrong signature; a TreeVerifier needs
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct target_model {
    int vocab_size() const { return 4; }
    Eigen::MatrixXf score(std::span<const specdec::token_id>, std::span<const specdec::token_id> draft) {
        return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(draft.size() + 1));
    }
    Eigen::MatrixXf score_tree(std::span<const specdec::token_id>, const specdec::draft_tree& tree) {
        return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(tree.size() + 1));
    }
};

int main() {
    model draft;
    target_model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
