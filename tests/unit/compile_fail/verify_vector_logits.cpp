// specdec::verify with the target's logits in a std::vector<float>: one error that names
// target_logits and the fix (not "no matching function" and the list of candidates).
// expect: target_logits must be an Eigen matrix of float, vocab_size rows and one column per position \(Eigen::MatrixXf, a block of one, or an Eigen::Map\); got std::vector: pass Eigen::Map<const Eigen::MatrixXf>
// reject: no matching function|could not convert|cannot convert
#include <specdec/verify.hpp>

#include <random>
#include <vector>

int main() {
    const std::vector<float> target_logits(4 * 3, 0.0f);  // vocab 4, gamma 2, column-major
    const std::vector<specdec::token_id> draft_tokens{1, 2};
    const Eigen::MatrixXf draft_probs = Eigen::MatrixXf::Constant(4, 2, 0.25f);
    specdec::verify_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::verify(target_logits, draft_tokens, draft_probs, {.temperature = 0.8f}, rng, ws);
}
