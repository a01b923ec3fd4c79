// A tree drafter whose propose_tree lacks the sampling settings and the uniforms: the message
// names propose_tree and the signature needed.
// expect: the drafter's propose_tree has the wrong signature; a TreeDrafter needs `void propose_tree\(std::span<const specdec::token_id> context, const specdec::tree_shape& shape, const specdec::sampling_config& sampling, specdec::uniform_source& uniforms, specdec::draft_tree& out\)`
// reject: cannot convert|no matching function|no match for|has neither
#include <specdec/speculative_decode.hpp>

#include <random>

struct no_uniforms_tree_drafter {
    int vocab_size() const { return 4; }
    void propose_tree(std::span<const specdec::token_id>, const specdec::tree_shape&, specdec::draft_tree&) {}
};
struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    no_uniforms_tree_drafter draft;
    model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {.step = specdec::tree{.shape = {.branching = {2, 1}}}},
                                      rng);
}
