// speculative_decode with trees and a tree-only verifier whose score_tree returns its scores
// instead of filling the caller's matrix: the message names score_tree and the signature needed.
// expect: the verifier's score_tree has the wrong signature; a TreeVerifier needs `void score_tree\(std::span<const specdec::token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out\)`
// reject: cannot convert|no matching function|no match for|has neither
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct returning_tree_verifier {
    int vocab_size() const { return 4; }
    Eigen::MatrixXf score_tree(std::span<const specdec::token_id>, const specdec::draft_tree& tree) {
        return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(tree.size() + 1));
    }
};

int main() {
    model draft;
    returning_tree_verifier target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {.step = specdec::tree{.shape = {.branching = {2, 1}}}},
                                      rng);
}
