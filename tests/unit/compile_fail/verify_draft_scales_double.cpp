// specdec::verify with weights and per-column factors, the factors in a std::vector<double):
// one error that names draft_scales and what it must be.
// expect: draft_scales must be a contiguous range of float, one factor per draft column
// reject: no matching function|could not convert|cannot convert
#include <specdec/verify.hpp>

#include <random>
#include <vector>

int main() {
    const Eigen::MatrixXf target_logits = Eigen::MatrixXf::Zero(4, 3);  // vocab 4, gamma 2
    const std::vector<specdec::token_id> draft_tokens{1, 2};
    const Eigen::MatrixXf weights = Eigen::MatrixXf::Constant(4, 2, 1.0f);
    const std::vector<double> draft_scales{0.25, 0.25};
    specdec::verify_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::verify(target_logits, draft_tokens, weights, draft_scales, {.temperature = 0.8f}, rng, ws);
}
