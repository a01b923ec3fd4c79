// Compile-only checks of the concepts: what models them and what does not. This file is
// compiled, never run; a failing static_assert fails the build.
#include <specdec/specdec.hpp>

#include <Eigen/Core>

#include <random>
#include <span>
#include <vector>

namespace {
using specdec::token_id;

struct plain_model {
    std::ptrdiff_t vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const token_id>) { return Eigen::VectorXf::Zero(4); }
};
struct expression_model {  // returns an Eigen expression, not a VectorXf
    std::ptrdiff_t vocab_size() const { return 4; }
    auto next_logits(std::span<const token_id>) const { return Eigen::VectorXf::Zero(4) * 2.0f; }
};
struct batched_only {
    int vocab_size() const { return 4; }
    Eigen::MatrixXf score(std::span<const token_id>, std::span<const token_id> d) const {
        return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(d.size() + 1));
    }
};
struct block_drafter {
    std::size_t vocab_size() const { return 4; }
    void draft(std::span<const token_id>, std::size_t, const specdec::sampling_config&, specdec::uniform_source&,
               specdec::draft_block&) {}
};
struct no_vocab {
    Eigen::VectorXf next_logits(std::span<const token_id>) { return {}; }
};
struct std_vector_logits {  // std::vector is not convertible to Eigen::VectorXf
    int vocab_size() const { return 4; }
    std::vector<float> next_logits(std::span<const token_id>) { return {}; }
};
struct wrong_context_type {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(const std::vector<token_id>&) { return {}; }
};
struct draft_without_block {
    int vocab_size() const { return 4; }
    void draft(std::span<const token_id>, std::size_t) {}
};

static_assert(specdec::LanguageModel<plain_model>);
static_assert(specdec::LanguageModel<expression_model>);
static_assert(specdec::Drafter<plain_model> && specdec::Verifier<plain_model>);
static_assert(specdec::Drafter<expression_model> && specdec::Verifier<expression_model>);
static_assert(specdec::BatchVerifier<batched_only> && specdec::Verifier<batched_only>);
static_assert(!specdec::Drafter<batched_only>);
static_assert(specdec::BlockDrafter<block_drafter> && specdec::Drafter<block_drafter>);
static_assert(!specdec::Verifier<block_drafter>);
static_assert(!specdec::LanguageModel<no_vocab>);
static_assert(!specdec::LanguageModel<std_vector_logits>);
static_assert(!specdec::LanguageModel<wrong_context_type>);
static_assert(!specdec::Drafter<draft_without_block>);
static_assert(!specdec::Drafter<int> && !specdec::Verifier<int>);

// The adapters turn a plain model into the block interfaces.
static_assert(specdec::BlockDrafter<specdec::model_drafter<plain_model>>);
static_assert(specdec::BatchVerifier<specdec::model_verifier<plain_model>>);
static_assert(requires(const specdec::model_verifier<plain_model>& v) {
    { v.calls_per_score(4) } -> std::same_as<std::size_t>;
});

// Generators: any std::uniform_random_bit_generator, passed as lvalue.
static_assert(specdec::random_generator<std::mt19937_64&>);
static_assert(specdec::random_generator<std::mt19937>);
static_assert(!specdec::random_generator<int>);
// specdec::uniform_bit_generator restates the standard concept: they agree on the standard
// engines and on near misses (signed result, no min/max, min() == max()).
struct signed_result {
    static constexpr int min() { return 0; }
    static constexpr int max() { return 9; }
    int operator()() { return 1; }
};
struct no_range {
    unsigned operator()() { return 1; }
};
struct empty_range {
    static constexpr unsigned min() { return 3; }
    static constexpr unsigned max() { return 3; }
    unsigned operator()() { return 3; }
};
template <class G>
constexpr bool same_verdict = specdec::uniform_bit_generator<G> == std::uniform_random_bit_generator<G>;
static_assert(same_verdict<std::mt19937> && same_verdict<std::mt19937_64> && same_verdict<std::minstd_rand> &&
              same_verdict<std::ranlux48> && same_verdict<std::knuth_b>);
static_assert(specdec::uniform_bit_generator<std::minstd_rand>);
static_assert(same_verdict<signed_result> && same_verdict<no_range> && same_verdict<empty_range> && same_verdict<int>);
static_assert(!specdec::uniform_bit_generator<signed_result> && !specdec::uniform_bit_generator<empty_range>);

// A fallback chain refers to lvalue members and owns rvalue ones; either way it is a BlockDrafter.
static_assert(specdec::BlockDrafter<specdec::fallback_drafter<specdec::prompt_lookup_drafter, plain_model&>>);
static_assert(specdec::BlockDrafter<specdec::fallback_drafter<block_drafter&, plain_model>>);

// The entry points' diagnosis finds nothing wrong with valid arguments (the messages for
// invalid ones are tested by the compile-fail tests in compile_fail/).
static_assert(!specdec::detail::diagnose_speculative_call<plain_model, expression_model, std::mt19937_64&>());
static_assert(!specdec::detail::diagnose_speculative_call<block_drafter, batched_only, std::mt19937>());
static_assert(!specdec::detail::diagnose_autoregressive_call<const batched_only, std::mt19937&>());
}  // namespace
