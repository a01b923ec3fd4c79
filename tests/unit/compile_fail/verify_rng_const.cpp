// verify() with a const generator.
// expect: rng is const: the library draws from it
// reject: uniform_source::uniform_source|discards qualifiers
#include <specdec/verify.hpp>

#include <random>

int main() {
    const Eigen::MatrixXf logits = Eigen::MatrixXf::Zero(4, 2);
    const specdec::token_id tokens[] = {1};
    const std::mt19937_64 rng(1);
    specdec::verify_workspace ws;
    (void)specdec::verify(logits, tokens, specdec::point_mass, {}, rng, ws);
}
