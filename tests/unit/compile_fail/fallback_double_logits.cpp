// A fallback_drafter member whose next_logits returns Eigen::VectorXd (the concept accepts it,
// Eigen would fail deep inside an assignment): the chain names the scalar type.
// expect: next_logits must return an Eigen vector of float; got an Eigen object of another scalar type
// reject: YOU_MIXED_DIFFERENT_NUMERIC_TYPES
#include <specdec/drafters/fallback.hpp>
#include <specdec/drafters/prompt_lookup.hpp>

struct double_model {
    int vocab_size() const { return 4; }
    Eigen::VectorXd next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXd::Zero(4); }
};

int main() {
    double_model m;
    specdec::fallback_drafter chain(specdec::prompt_lookup_drafter(4), m);
    (void)chain.vocab_size();
}
