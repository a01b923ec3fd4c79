// specdec::verify with the target's logits in an Eigen::MatrixXd: one error that names
// target_logits, the scalar type and the fix (.cast<float>()).
// expect: target_logits must be an Eigen matrix of float; got an Eigen object of another scalar type \(e.g. Eigen::MatrixXd\): pass logits.cast<float>\(\)
// reject: no matching function|could not convert|cannot convert
#include <specdec/verify.hpp>

#include <random>
#include <vector>

int main() {
    const Eigen::MatrixXd target_logits = Eigen::MatrixXd::Zero(4, 3);  // vocab 4, gamma 2
    const std::vector<specdec::token_id> draft_tokens{1, 2};
    const Eigen::MatrixXf draft_probs = Eigen::MatrixXf::Constant(4, 2, 0.25f);
    specdec::verify_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::verify(target_logits, draft_tokens, draft_probs, {.temperature = 0.8f}, rng, ws);
}
