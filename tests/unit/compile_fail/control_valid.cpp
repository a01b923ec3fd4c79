// Control: valid models through the same command line compile (so the other cases fail for
// the reason their messages name, not for a broken include path).
// (no expect line: this one must compile)
#include <specdec/batch_decoder.hpp>
#include <specdec/speculative_decode.hpp>

#include <random>
#include <vector>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

static_assert(specdec::check_verifier<model>() && specdec::check_drafter<model>());

int main() {
    model draft, target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {.step = specdec::tree{.shape = {.branching = {2, 1}}}},
                                      rng);
    (void)specdec::autoregressive_decode(target, {1, 2}, {}, rng);
    std::vector<specdec::token_id> sequence{1};
    specdec::decode_stats stats;
    specdec::step_workspace sws;
    (void)specdec::speculative_step(draft, target, sequence, stats, {}, rng, sws);
    specdec::batch_decoder dec(draft, target, {.budget = {.max_new_tokens = 8}});
    (void)dec.add(std::vector<specdec::token_id>{1, 2}, std::mt19937_64(1));
    dec.run();
    (void)dec.take(0);
    auto trees = specdec::make_batch_decoder<std::minstd_rand>(draft, target,
                                                                {.step = specdec::tree{.shape = {.branching = {2}}}});
    (void)trees.add(std::vector<specdec::token_id>{1}, std::minstd_rand(1));
    trees.run();
}
