// A model with next_logits() and a draft() that lacks the draft_block to fill: decoding would
// sample from next_logits and never call draft(), so it is refused by name.
// expect: the drafter has next_logits\(\) and a draft\(\) that is not a BlockDrafter's, so decoding would silently ignore draft\(\)
#include <specdec/speculative_decode.hpp>

#include <random>
#include <vector>

struct drafter_model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
    std::vector<specdec::token_id> draft(std::span<const specdec::token_id>, std::size_t) { return {}; }
};
struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    drafter_model draft;
    model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
