// Control: valid models through the same command line compile (so the other cases fail for
// the reason their messages name, not for a broken include path).
// (no expect line: this one must compile)
#include <specdec/batch_decoder.hpp>
#include <specdec/speculative_decode.hpp>
#include <specdec/tree_verify.hpp>
#include <specdec/verify.hpp>

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
    // verify and verify_tree with valid arguments reach the real overloads, not the fallbacks
    // that diagnose wrong ones (and are not ambiguous with them).
    const Eigen::MatrixXf logits = Eigen::MatrixXf::Zero(4, 3), probs = Eigen::MatrixXf::Constant(4, 2, 0.25f);
    const std::vector<specdec::token_id> tokens{1, 2};
    const std::vector<float> scales{1.0f, 1.0f};
    specdec::verify_workspace vws;
    (void)specdec::verify(logits, tokens, probs, {.temperature = 0.8f}, rng, vws);
    (void)specdec::verify(logits, tokens, probs, {}, std::mt19937_64(2), vws, {});
    (void)specdec::verify(logits.leftCols(3), std::span<const specdec::token_id>(tokens), probs, scales, {}, rng, vws);
    (void)specdec::verify(logits, tokens, specdec::point_mass, {}, rng, vws);
    (void)specdec::verify(logits.leftCols(1), {}, specdec::point_mass, {}, rng, vws, {});
    specdec::tree_verify_workspace tws;
    (void)specdec::verify_tree(logits.leftCols(1), specdec::draft_tree{}, {}, rng, tws);
}
