// A const generator: the library draws from it, which changes its state.
// expect: rng is const: the library draws from it
// reject: generator_ref|uniform_source::uniform_source|discards qualifiers
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    model draft, target;
    const std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
