// A fallback_drafter member that is no drafter at all (a verifier's score() only): the chain
// names what a drafter needs, as speculative_decode does.
// expect: the drafter has score\(\) but neither draft\(\) nor next_logits\(\)
// reject: constraints not satisfied
#include <specdec/drafters/fallback.hpp>
#include <specdec/drafters/prompt_lookup.hpp>

struct scorer {
    int vocab_size() const { return 4; }
    Eigen::MatrixXf score(std::span<const specdec::token_id>, std::span<const specdec::token_id> draft) {
        return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(draft.size()) + 1);
    }
};

int main() {
    scorer s;
    specdec::fallback_drafter chain(specdec::prompt_lookup_drafter(4), s);
    (void)chain.vocab_size();
}
