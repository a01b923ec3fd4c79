// measure_engine_profile with a target whose next_logits returns std::vector<float>: the entry
// point's message names the requirement, as speculative_decode's does.
// expect: next_logits must return an Eigen vector of float \(Eigen::VectorXf or an expression of it\); got std::vector
// reject: no matching function
#include <specdec/measure_profile.hpp>

#include <vector>

struct vector_model {
    int vocab_size() const { return 4; }
    std::vector<float> next_logits(std::span<const specdec::token_id>) { return std::vector<float>(4, 0.0f); }
};
struct good_model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    good_model draft;
    vector_model target;
    const std::vector<specdec::token_id> prompt{1};
    (void)specdec::measure_engine_profile(draft, target, prompt);
}
