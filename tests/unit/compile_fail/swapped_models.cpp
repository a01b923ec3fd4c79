// speculative_decode with the target first and a block drafter (draft() only) second: the
// message says the verifier looks like a drafter and gives the order of the arguments.
// expect: the verifier has draft\(\) but neither score\(\) nor next_logits\(\): it looks like a drafter; the target comes second: speculative_decode\(drafter, verifier, prompt, options, rng\)
// reject: cannot convert|no matching function|no match for
#include <specdec/speculative_decode.hpp>

#include <random>

struct block_drafter {
    int vocab_size() const { return 4; }
    void draft(std::span<const specdec::token_id>, std::size_t, const specdec::sampling_config&,
               specdec::uniform_source&, specdec::draft_block&) {}
};
struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    block_drafter draft;
    model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(target, draft, {1, 2}, {}, rng);
}
