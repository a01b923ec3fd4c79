// A block drafter whose draft() lacks the draft_block to fill.
// expect: the drafter's draft has the wrong signature; a BlockDrafter needs `void draft\(std::span<const specdec::token_id> context
#include <specdec/speculative_decode.hpp>

#include <random>
#include <vector>

struct short_drafter {
    int vocab_size() const { return 4; }
    std::vector<specdec::token_id> draft(std::span<const specdec::token_id>, std::size_t) { return {}; }
};
struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    short_drafter draft;
    model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
