// A seed passed where the generator belongs.
// expect: rng must be a random generator object, not a number
#include <specdec/speculative_decode.hpp>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    model draft, target;
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, 42);
}
