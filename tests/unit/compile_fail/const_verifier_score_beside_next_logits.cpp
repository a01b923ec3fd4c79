// A const target whose next_logits() and vocab_size() are const but whose (right) score() is
// not: decoding would silently use next_logits per position, so it is refused by name.
// expect: the verifier is const, and its score\(\) is not a const member function
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct target_model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) const { return Eigen::VectorXf::Zero(4); }
    Eigen::MatrixXf score(std::span<const specdec::token_id>, std::span<const specdec::token_id> draft) {
        return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(draft.size() + 1));
    }
};

int main() {
    model draft;
    const target_model target;
    std::mt19937_64 rng(1);
    (void)specdec::speculative_decode(draft, target, {1, 2}, {}, rng);
}
