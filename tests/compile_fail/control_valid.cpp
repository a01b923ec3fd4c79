// Control: valid models through the same command line compile (so the other cases fail for
// the reason their messages name, not for a broken include path).
// (no expect line: this one must compile)
#include <specdec/batch.hpp>
#include <specdec/speculative_decode.hpp>

#include <random>
#include <vector>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    model draft, target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
    (void)specdec::autoregressive_decode(target, {1, 2}, {}, rng);
    std::vector<specdec::token_id> sequence{1};
    specdec::decode_stats stats;
    specdec::step_workspace sws;
    (void)specdec::speculative_step(draft, target, sequence, stats, {}, rng, sws);
    std::vector<model> drafters(2), verifiers(2);
    std::vector<specdec::batch_sequence<std::mt19937_64>> sequences(2);
    specdec::batch_workspace ws;
    specdec::speculative_step_batch(drafters, verifiers, sequences, {}, ws);
}
