// hierarchical_drafter over a draft model whose next_logits returns std::vector<float>: the
// drafter's message names the requirement, not a failed constraint of a class template.
// expect: next_logits must return an Eigen vector of float \(Eigen::VectorXf or an expression of it\); got std::vector
#include <specdec/drafters/hierarchical.hpp>
#include <specdec/drafters/prompt_lookup.hpp>

#include <vector>

struct vector_model {
    int vocab_size() const { return 4; }
    std::vector<float> next_logits(std::span<const specdec::token_id>) { return std::vector<float>(4, 0.0f); }
};

int main() {
    specdec::prompt_lookup_drafter lookup(4);
    vector_model model;
    specdec::hierarchical_drafter layered(lookup, model);
    (void)layered;
}
