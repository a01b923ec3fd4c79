// A const target whose next_logits is not a const member function.
// expect: the model is const: next_logits \(or score\) and vocab_size must be const member functions, or pass a non-const model
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    model draft;
    const model target{};
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
