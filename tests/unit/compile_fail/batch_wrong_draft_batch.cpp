// batch_decoder with a multi-sequence drafter whose draft_batch lacks the sampling settings: the
// message names draft_batch and the signature needed.
// expect: the drafter's draft_batch has the wrong signature; a MultiSequenceDrafter needs `void draft_batch\(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling\)`
// reject: cannot convert|no matching function|no match for|has neither
#include <specdec/batch_decoder.hpp>

#include <random>
#include <vector>

struct no_sampling_batch_drafter {
    int vocab_size() const { return 4; }
    void draft_batch(std::span<specdec::draft_request>) {}
};
struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    no_sampling_batch_drafter draft;
    model target;
    specdec::batch_decoder dec(draft, target);
    (void)dec.add(std::vector<specdec::token_id>{1, 2}, std::mt19937_64(1));
    dec.run();
}
