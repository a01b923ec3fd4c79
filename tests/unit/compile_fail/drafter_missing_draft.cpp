// A drafter with vocab_size() but neither draft() nor next_logits().
// expect: the drafter has neither `draft\(context, gamma, sampling, uniforms, out\)` \(a BlockDrafter\) nor `next_logits\(context\)`
#include <specdec/speculative_decode.hpp>

#include <random>

struct no_draft {
    int vocab_size() const { return 4; }
};
struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    no_draft draft;
    model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
