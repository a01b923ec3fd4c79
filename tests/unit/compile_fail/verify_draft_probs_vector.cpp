// specdec::verify with the draft distributions in a std::vector<float>: one error that names
// draft_probs and the fix (an Eigen::Map, or point_mass).
// expect: draft_probs must be an Eigen matrix of float, one draft distribution per column \(Eigen::MatrixXf, a block of one, or an Eigen::Map\); got std::vector
// reject: no matching function|could not convert|cannot convert
#include <specdec/verify.hpp>

#include <random>
#include <vector>

int main() {
    const Eigen::MatrixXf target_logits = Eigen::MatrixXf::Zero(4, 3);  // vocab 4, gamma 2
    const std::vector<specdec::token_id> draft_tokens{1, 2};
    const std::vector<float> draft_probs(4 * 2, 0.25f);
    specdec::verify_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::verify(target_logits, draft_tokens, draft_probs, {.temperature = 0.8f}, rng, ws);
}
