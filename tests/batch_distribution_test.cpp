// Distribution equivalence of the multi-sequence path: every sequence of a batch decoded with
// one target pass per step (batch_decoder over a MultiSequenceDrafter and a
// MultiSequenceVerifier) has exactly the target's joint distribution of its 4 generated tokens,
// computed by enumeration, whatever the other sequences of the batch do.
//
// Method (as tests/distribution_test.cpp): small random Markov models (V = 4, logits depending
// on the previous two tokens); 3 sequences per batch with different prompts, the third joining
// after the first step, so acceptance is ragged and sequences finish at different steps; each
// sequence with its own generator, seeded from the case's master generator; 60,000 batches per
// case; Pearson's chi-square test of each sequence's 4-token outputs against its exact
// distribution (cells with expected count < 5 pooled). A test fails when p < 1e-4; the
// chi-square approximation makes a correct implementation fail one such test about 1-2 times
// in 10^4 (distribution_test.cpp's simulation), so with the 18 tests below about 0.3% of runs
// of correct code would fail one (the seeds are fixed: a run is reproducible).
// The negative control runs the same test with a verifier that scores every sequence against
// the first sequence's context (a KV cache of the wrong slot), which must fail (p < 1e-4) for
// the sequences whose prompt differs.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_markov.hpp"
#include "support/stats.hpp"

#include <specdec/batch_decode.hpp>

#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {

std::size_t samples_per_case() {
    if (const char* env = std::getenv("SPECDEC_DISTRIBUTION_SAMPLES"); env != nullptr && *env != '\0') {
        const long long n = std::atoll(env);
        if (n >= 1000) return static_cast<std::size_t>(n);
    }
    return 60000;
}
constexpr int kLength = 4;
constexpr double kFalseAlarm = 1e-4;
const std::vector<std::vector<token_id>> kPrompts{{0}, {1, 2}, {3, 1, 1}};

/// The verifier of the negative control: each sequence's draft is scored after the first
/// request's context instead of its own.
struct wrong_slot_verifier {
    multi_markov_verifier inner;
    std::vector<specdec::score_request> moved{};
    std::ptrdiff_t vocab_size() const { return inner.vocab_size(); }
    void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
        moved.assign(batch.begin(), batch.end());
        for (auto& r : moved) r.context = batch[0].context;
        inner.score_batch(moved, out);
    }
};

std::size_t encode(std::span<const token_id> tokens, int vocab) {
    std::size_t index = 0;
    for (token_id t : tokens) index = index * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(t);
    return index;
}

struct batch_case {
    std::size_t gamma = 3;
    specdec::sampling_config sampling{};
    specdec::gamma_policy policy = specdec::gamma_policy::fixed;
    std::uint64_t seed = 1;
};

/// Decodes `samples` batches and returns, per sequence, the test of its outputs against its
/// exact distribution; counts rejections per draft position (all sequences) in `rejected_at`.
template <class V>
std::vector<gof_result> run_case(const markov_model& target, const markov_model& draft, V& verifier,
                                 const batch_case& c, specdec::verification_scheme scheme, std::size_t samples,
                                 std::vector<std::size_t>& rejected_at) {
    const int vocab = target.vocab;
    std::vector<std::vector<std::size_t>> counts(kPrompts.size());
    std::vector<std::vector<double>> exact;
    for (std::size_t k = 0; k < kPrompts.size(); ++k) {
        exact.push_back(exact_sequence_distribution(target, kPrompts[k], kLength, c.sampling));
        counts[k].assign(exact[k].size(), 0);
    }
    multi_markov_drafter drafter{&draft};
    specdec::batch_decode_options o{.gamma = c.gamma, .policy = c.policy, .sampling = c.sampling, .scheme = scheme,
                                    .max_new_tokens = kLength};
    // Known costs for the adaptive policy: deterministic choices, several γ in use.
    o.adaptive.draft_cost = [](std::size_t n) { return 0.02 * static_cast<double>(n); };
    o.adaptive.pass_cost = [](std::size_t m) { return 1.0 + 0.02 * static_cast<double>(m); };
    o.adaptive.explore_every = 2;
    rejected_at.assign(c.gamma, 0);
    o.on_step = [&](std::size_t, const specdec::step_event& e) {
        if (e.accepted < e.draft.size()) ++rejected_at[e.accepted];
    };
    specdec::batch_decoder<multi_markov_drafter, V, std::mt19937_64> dec(drafter, verifier, o);
    std::mt19937_64 master(c.seed);
    std::vector<std::size_t> ids(kPrompts.size());
    for (std::size_t s = 0; s < samples; ++s) {
        ids[0] = dec.add(kPrompts[0], std::mt19937_64(master()));
        ids[1] = dec.add(kPrompts[1], std::mt19937_64(master()));
        dec.step();
        ids[2] = dec.add(kPrompts[2], std::mt19937_64(master()));  // joins a running batch
        dec.run();
        for (std::size_t k = 0; k < kPrompts.size(); ++k) {
            const auto r = dec.take(ids[k]);
            REQUIRE(r.tokens.size() == static_cast<std::size_t>(kLength));
            ++counts[k][encode(r.tokens, vocab)];
        }
    }
    std::vector<gof_result> out;
    for (std::size_t k = 0; k < kPrompts.size(); ++k) out.push_back(chi_square_test(counts[k], exact[k]));
    return out;
}

std::string describe(const gof_result& r) {
    std::ostringstream os;
    os << "chi2 = " << r.statistic << ", df = " << r.degrees_of_freedom << ", p = " << r.p_value << ", n = " << r.samples;
    return os.str();
}

constexpr specdec::verification_scheme kSchemes[] = {specdec::verification_scheme::token,
                                                      specdec::verification_scheme::block};

void check_case(const batch_case& c) {
    const auto target = markov_model::random(4, 2, 21);
    const auto draft = markov_model::random(4, 2, 22);
    for (const auto scheme : kSchemes) {
        INFO((scheme == specdec::verification_scheme::token ? "token verification" : "block verification"));
        multi_markov_verifier verifier{&target};
        std::vector<std::size_t> rejected_at;
        const auto results = run_case(target, draft, verifier, c, scheme, samples_per_case(), rejected_at);
        for (std::size_t k = 0; k < results.size(); ++k) {
            INFO("sequence " << k << ": " << describe(results[k]));
            CHECK(results[k].p_value >= kFalseAlarm);
        }
        for (std::size_t i = 0; i + 1 < rejected_at.size(); ++i) {
            INFO("rejections at draft position " << i);
            CHECK(rejected_at[i] > 0);
        }
    }
}

}  // namespace

TEST_CASE("Every sequence of a multi-sequence batch has the target's distribution", "[statistical][batch][multi]") {
    check_case({.gamma = 3, .sampling = {.temperature = 1.0f}, .seed = 31});
}

TEST_CASE("Every sequence of a multi-sequence batch has the target's distribution, with top-k and temperature",
          "[statistical][batch][multi]") {
    check_case({.gamma = 2, .sampling = {.temperature = 0.7f, .top_k = 3}, .seed = 32});
}

TEST_CASE("Every sequence of a multi-sequence batch has the target's distribution under the adaptive policy",
          "[statistical][batch][multi][adaptive]") {
    check_case({.gamma = 3, .sampling = {.temperature = 1.0f}, .policy = specdec::gamma_policy::adaptive, .seed = 33});
}

TEST_CASE("Negative control: scoring against another sequence's context is detected", "[statistical][batch][multi]") {
    if (samples_per_case() < 60000) return;  // reduced suites lack the power (as distribution_test.cpp)
    const auto target = markov_model::random(4, 2, 21);
    const auto draft = markov_model::random(4, 2, 22);
    for (const auto scheme : kSchemes) {
        INFO((scheme == specdec::verification_scheme::token ? "token verification" : "block verification"));
        wrong_slot_verifier verifier{multi_markov_verifier{&target}};
        std::vector<std::size_t> rejected_at;
        const auto results = run_case(target, draft, verifier, {.gamma = 3, .seed = 34}, scheme, 60000, rejected_at);
        // Sequence 0 is scored against its own context; the others must be caught.
        for (std::size_t k = 1; k < results.size(); ++k) {
            INFO("sequence " << k << ": " << describe(results[k]));
            CHECK(results[k].p_value < kFalseAlarm);
        }
    }
}
