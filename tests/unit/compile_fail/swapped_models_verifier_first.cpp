// speculative_decode with a batched verifier (score() only) first and the draft model second:
// the message says the drafter looks like a verifier and gives the order of the arguments.
// expect: the drafter has score\(\) but neither draft\(\) nor next_logits\(\): it looks like a verifier; the drafter comes first: speculative_decode\(drafter, verifier, prompt, options, rng\)
// reject: cannot convert|no matching function|no match for
#include <specdec/speculative_decode.hpp>

#include <random>

struct batch_verifier {
    int vocab_size() const { return 4; }
    Eigen::MatrixXf score(std::span<const specdec::token_id>, std::span<const specdec::token_id> draft) {
        return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(draft.size() + 1));
    }
};
struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    model draft;
    batch_verifier target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(target, draft, {1, 2}, {}, rng);
}
