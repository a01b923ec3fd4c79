// speculative_step with a const drafter.
// expect: the drafter is const
#include <specdec/speculative_step.hpp>

#include <random>
#include <vector>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    const model draft{};
    model target;
    std::vector<specdec::token_id> sequence{1};
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_step(draft, target, sequence, stats, {}, rng, ws);
}
