// batch_decoder with a multi-sequence verifier whose score_batch takes a std::vector of
// requests: the message names score_batch and the signature needed.
// expect: the verifier's score_batch has the wrong signature; a MultiSequenceVerifier needs `void score_batch\(std::span<const specdec::score_request> requests, specdec::packed_logits& out\)`
// reject: cannot convert|no matching function|no match for|has neither
#include <specdec/batch_decoder.hpp>

#include <random>
#include <vector>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct vector_batch_verifier {
    int vocab_size() const { return 4; }
    void score_batch(const std::vector<specdec::score_request>&, specdec::packed_logits&) {}
};

int main() {
    model draft;
    vector_batch_verifier target;
    specdec::batch_decoder dec(draft, target);
    (void)dec.add(std::vector<specdec::token_id>{1, 2}, std::mt19937_64(1));
    dec.run();
}
