// specdec::verify_tree with a seed passed where the generator belongs: the message names rng.
// expect: rng must be a random generator object, not a number
// reject: no matching function|could not convert|cannot convert
#include <specdec/tree_verify.hpp>

int main() {
    specdec::draft_tree tree;
    const Eigen::MatrixXf target_logits = Eigen::MatrixXf::Zero(4, 1);
    specdec::tree_verify_workspace ws;
    (void)specdec::verify_tree(target_logits, tree, {}, 42, ws);
}
