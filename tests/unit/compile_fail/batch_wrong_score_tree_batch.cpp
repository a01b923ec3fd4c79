// batch_decoder with trees and a multi-sequence tree verifier whose score_tree_batch writes into
// an Eigen matrix instead of the packed scores: the message names score_tree_batch and the
// signature needed.
// expect: the verifier's score_tree_batch has the wrong signature; a MultiSequenceTreeVerifier needs `void score_tree_batch\(std::span<const specdec::tree_score_request> requests, specdec::packed_logits& out\)`
// reject: cannot convert|no matching function|no match for|has neither
#include <specdec/batch_decoder.hpp>

#include <random>
#include <vector>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct matrix_tree_batch_verifier {
    int vocab_size() const { return 4; }
    void score_tree_batch(std::span<const specdec::tree_score_request>, Eigen::MatrixXf&) {}
};

int main() {
    model draft;
    matrix_tree_batch_verifier target;
    specdec::batch_decoder dec(draft, target, {.step = specdec::tree{.shape = {.branching = {2, 1}}}});
    (void)dec.add(std::vector<specdec::token_id>{1, 2}, std::mt19937_64(1));
    dec.run();
}
