// specdec::verify_tree with the target's logits in a std::vector<float>: one error that names
// target_logits and the fix.
// expect: target_logits must be an Eigen matrix of float, vocab_size rows and one column per position \(Eigen::MatrixXf, a block of one, or an Eigen::Map\); got std::vector: pass Eigen::Map<const Eigen::MatrixXf>
// reject: no matching function|could not convert|cannot convert
#include <specdec/tree_verify.hpp>

#include <random>
#include <vector>

int main() {
    specdec::draft_tree tree;
    const std::vector<float> target_logits(4, 0.0f);  // vocab 4, the root's column only
    specdec::tree_verify_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::verify_tree(target_logits, tree, {}, rng, ws);
}
