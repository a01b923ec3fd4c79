// specdec::verify with the draft distributions in an Eigen::MatrixXd: one error that names
// draft_probs, the scalar type and the fix (.cast<float>()).
// expect: draft_probs must be an Eigen matrix of float; got an Eigen object of another scalar type \(e.g. Eigen::MatrixXd\): pass probs.cast<float>\(\)
// reject: no matching function|could not convert|cannot convert
#include <specdec/verify.hpp>

#include <random>
#include <vector>

int main() {
    const Eigen::MatrixXf target_logits = Eigen::MatrixXf::Zero(4, 3);  // vocab 4, gamma 2
    const std::vector<specdec::token_id> draft_tokens{1, 2};
    const Eigen::MatrixXd draft_probs = Eigen::MatrixXd::Constant(4, 2, 0.25);
    specdec::verify_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::verify(target_logits, draft_tokens, draft_probs, {.temperature = 0.8f}, rng, ws);
}
