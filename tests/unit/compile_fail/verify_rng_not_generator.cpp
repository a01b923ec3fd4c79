// specdec::verify (point-mass drafts) with a distribution passed where the generator belongs:
// the message names rng and the requirement.
// expect: rng must satisfy std::uniform_random_bit_generator \(e.g. std::mt19937_64\)
// reject: no matching function|could not convert|cannot convert
#include <specdec/verify.hpp>

#include <random>
#include <vector>

int main() {
    const Eigen::MatrixXf target_logits = Eigen::MatrixXf::Zero(4, 3);
    const std::vector<specdec::token_id> draft_tokens{1, 2};
    specdec::verify_workspace ws;
    std::uniform_real_distribution<double> uniforms(0.0, 1.0);
    (void)specdec::verify(target_logits, draft_tokens, specdec::point_mass, {}, uniforms, ws);
}
