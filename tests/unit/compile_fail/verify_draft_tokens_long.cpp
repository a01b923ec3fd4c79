// specdec::verify with the draft tokens in a std::vector<long>: one error that names draft_tokens
// and the fix (not "no matching function" and the list of candidates).
// expect: draft_tokens must be a contiguous range of specdec::token_id \(convertible to std::span<const specdec::token_id>
// reject: no matching function|could not convert|cannot convert
#include <specdec/verify.hpp>

#include <random>
#include <vector>

int main() {
    const Eigen::MatrixXf target_logits = Eigen::MatrixXf::Zero(4, 3);  // vocab 4, gamma 2
    const std::vector<long> draft_tokens{1, 2};
    const Eigen::MatrixXf draft_probs = Eigen::MatrixXf::Constant(4, 2, 0.25f);
    specdec::verify_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::verify(target_logits, draft_tokens, draft_probs, {.temperature = 0.8f}, rng, ws);
}
