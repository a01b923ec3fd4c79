// measure_batch_profile with one-sequence models: the message says which adapters it needs and
// points to measure_engine_profile.
// expect: measure_batch_profile times multi-sequence calls: the drafter must be a MultiSequenceDrafter
// reject: no matching function|has no member named
#include <specdec/measure_profile.hpp>

#include <vector>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    model draft, target;
    const std::vector<std::vector<specdec::token_id>> prompts{{1}};
    (void)specdec::measure_batch_profile(draft, target, prompts);
}
