// Distribution equivalence, the heart of the suite: whole generated sequences from
// speculative decoding have exactly the target's joint distribution, computed by
// enumeration (Leviathan et al. 2023, App. A.1, applied step after step).
//
// Method: small random Markov models (V <= 5, logits depending on the previous two tokens)
// as draft and target; 100,000 sequences of 4 tokens per case (several steps, every
// rejection position exercised, which each case asserts); Pearson's chi-square test against
// the exact target distribution of the 4-token sequences (cells with expected count < 5
// pooled). A case fails when p < 1e-4. The chi-square distribution only approximates the
// statistic's: simulated from each case's exact distribution (10^6 samples of the test), a
// correct implementation fails a given case 1-2 times in 10^4 runs, so about 0.9% of runs
// would fail one of the suite's sixty-odd chi-square tests of correct code (the seeds are fixed, so
// a run is reproducible). The negative controls run the same test on deliberately wrong
// algorithms and require p < 1e-4.
// Every case runs under token verification and under block verification.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/reference_decode.hpp"
#include "support/stats.hpp"

#include <specdec/specdec.hpp>

#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {

/// Sequences per case: 100,000, or SPECDEC_DISTRIBUTION_SAMPLES (the sanitizer builds run a
/// reduced suite: same false-alarm rate, less power, so they skip the negative controls).
std::size_t samples_per_case() {
    if (const char* env = std::getenv("SPECDEC_DISTRIBUTION_SAMPLES"); env != nullptr && *env != '\0') {
        const long long n = std::atoll(env);
        if (n >= 1000) return static_cast<std::size_t>(n);
    }
    return 100000;
}
const std::size_t kSamples = samples_per_case();
constexpr int kLength = 4;
constexpr double kFalseAlarm = 1e-4;

std::size_t encode(const std::vector<token_id>& tokens, int vocab) {
    std::size_t index = 0;
    for (token_id t : tokens) index = index * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(t);
    return index;
}

/// Draws `samples` sequences (default kSamples) with `sample` and tests them against `exact`.
gof_result sequence_test(const std::function<std::vector<token_id>(std::mt19937_64&)>& sample,
                         const std::vector<double>& exact, int vocab, std::uint64_t seed,
                         std::size_t samples = kSamples) {
    std::mt19937_64 rng(seed);
    std::vector<std::size_t> counts(exact.size(), 0);
    for (std::size_t s = 0; s < samples; ++s) {
        const auto tokens = sample(rng);
        REQUIRE(tokens.size() == static_cast<std::size_t>(kLength));
        ++counts[encode(tokens, vocab)];
    }
    return chi_square_test(counts, exact);
}

std::string describe(const gof_result& r) {
    std::ostringstream os;
    os << "chi2 = " << r.statistic << ", df = " << r.degrees_of_freedom << ", p = " << r.p_value
       << ", n = " << r.samples;
    return os.str();
}

struct equivalence_case {
    int vocab = 4;
    std::size_t gamma = 3;
    specdec::sampling_config sampling{};
    std::uint64_t target_seed = 11;
    std::uint64_t draft_seed = 12;
};

/// Runs speculative_decode with drafter `d` and verifier `v` and tests the result; also
/// checks that every draft position saw a rejection (up to `rejection_positions`).
constexpr specdec::verification_scheme kSchemes[] = {specdec::verification_scheme::token,
                                                      specdec::verification_scheme::block};

const char* name(specdec::verification_scheme s) {
    return s == specdec::verification_scheme::token ? "token verification" : "block verification";
}

/// Runs speculative_decode with drafter `d` and verifier `v` from `prompt`, under token and
/// under block verification, and tests the result (after `to_model`, which maps emitted ids to
/// the target's, `samples` sequences); also checks that every draft position below
/// `rejection_positions` saw a rejection (the accepted prefix ended there).
/// `customize` may change the options (policy, draft-side stop) before each scheme's run.
template <class D, class V, class Map>
void check_equivalence(D& drafter, V& verifier, const markov_model& target, const equivalence_case& c,
                       std::size_t rejection_positions, const std::vector<token_id>& prompt, Map to_model,
                       std::uint64_t seed, std::size_t samples,
                       const std::function<void(specdec::decode_options&)>& customize = {}) {
    std::vector<token_id> model_prompt;
    for (token_id t : prompt) model_prompt.push_back(to_model(t));
    const auto exact = exact_sequence_distribution(target, model_prompt, kLength, c.sampling);
    for (const auto scheme : kSchemes) {
        INFO(name(scheme));
        std::vector<std::size_t> rejected_at(c.gamma, 0);
        specdec::decode_options opts{.step = specdec::chain{.gamma = c.gamma, .scheme = scheme}, .sampling = c.sampling, .budget = {.max_new_tokens = kLength}};
        opts.on_step = [&](const specdec::step_event& e) {
            if (e.accepted < e.draft.size()) ++rejected_at[e.accepted];
        };
        if (customize) customize(opts);
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) {
                auto tokens = specdec::speculative_decode(drafter, verifier, prompt, opts, rng).tokens;
                for (auto& t : tokens) t = to_model(t);
                return tokens;
            },
            exact, c.vocab, seed, samples);
        INFO(describe(r));
        CHECK(r.p_value >= kFalseAlarm);
        for (std::size_t i = 0; i < rejection_positions; ++i) {
            INFO("rejections at draft position " << i << ": " << rejected_at[i]);
            CHECK(rejected_at[i] > 0);
        }
    }
}

/// The same for models over the target's own vocabulary, from the prompt {0}.
template <class D, class V>
void check_equivalence(D& drafter, V& verifier, const markov_model& target, const equivalence_case& c,
                       std::size_t rejection_positions) {
    check_equivalence(drafter, verifier, target, c, rejection_positions, {0}, [](token_id t) { return t; },
                      1000 + c.target_seed, kSamples);
}

void check_model_pair(const equivalence_case& c) {
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    // Rejections can happen at every position that a 4-token run drafts (γ_eff <= 3).
    check_equivalence(draft, target, target, c, std::min<std::size_t>(c.gamma, kLength - 1));
}

}  // namespace

TEST_CASE("Speculative decoding samples whole sequences from the target distribution at temperature 1",
          "[statistical][distribution]") {
    check_model_pair({});
}

TEST_CASE("Speculative decoding matches the target distribution at temperature 0.6", "[statistical][distribution]") {
    check_model_pair({.sampling = {.temperature = 0.6f}, .target_seed = 21, .draft_seed = 22});
}

TEST_CASE("Speculative decoding matches the target distribution under top-k", "[statistical][distribution]") {
    check_model_pair({.vocab = 5, .sampling = {.top_k = 3}, .target_seed = 31, .draft_seed = 32});
}

TEST_CASE("Speculative decoding matches the target distribution under top-p", "[statistical][distribution]") {
    check_model_pair({.vocab = 5, .sampling = {.top_p = 0.9f}, .target_seed = 43, .draft_seed = 44});
}

TEST_CASE("Speculative decoding matches the target distribution under min-p and temperature",
          "[statistical][distribution]") {
    check_model_pair({.vocab = 5, .sampling = {.temperature = 0.8f, .min_p = 0.1f}, .target_seed = 51, .draft_seed = 52});
}

TEST_CASE("Speculative decoding matches the target distribution for gamma 1 and for gamma beyond the length",
          "[statistical][distribution]") {
    SECTION("gamma = 1") { check_model_pair({.gamma = 1, .target_seed = 61, .draft_seed = 62}); }
    SECTION("gamma = 7") { check_model_pair({.gamma = 7, .target_seed = 63, .draft_seed = 64}); }
}

TEST_CASE("Speculative decoding with a batched score() verifier matches the target distribution",
          "[statistical][distribution]") {
    const equivalence_case c{.target_seed = 71, .draft_seed = 72};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    batched_markov verifier{&target};
    check_equivalence(draft, verifier, target, c, 3);
}

TEST_CASE("A caller's own loop of speculative_step keeps the target distribution",
          "[statistical][distribution][step]") {
    // The low-level entry point as a user drives it: one workspace and one statistics object for
    // the whole run, steps until the sequence holds the prompt and kLength tokens, the last
    // step's extra tokens cut (a prefix of an exact sample is an exact sample of the prefix);
    // under both schemes, with the target's settings and with draft-side sampling.
    const equivalence_case c{.target_seed = 131, .draft_seed = 132};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    const std::vector<token_id> prompt{0};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, c.sampling);
    for (const auto scheme : kSchemes)
        for (const bool draft_side : {false, true}) {
            INFO(name(scheme) << (draft_side ? ", draft-side sampling" : ""));
            specdec::step_options o{.gamma = c.gamma, .sampling = c.sampling, .scheme = scheme};
            if (draft_side) o.draft_sampling = specdec::sampling_config{.temperature = 1.5f, .top_k = 3};
            specdec::step_workspace ws;
            specdec::decode_stats stats;
            const auto r = sequence_test(
                [&](std::mt19937_64& rng) {
                    std::vector<token_id> seq = prompt;
                    while (seq.size() < prompt.size() + kLength)
                        (void)specdec::speculative_step(draft, target, seq, stats, o, rng, ws);
                    const auto first = seq.begin() + static_cast<std::ptrdiff_t>(prompt.size());
                    return std::vector<token_id>(first, first + kLength);
                },
                exact, c.vocab, 1000 + c.target_seed, kSamples);
            INFO(describe(r));
            CHECK(r.p_value >= kFalseAlarm);
            CHECK(stats.rejected_tokens > 0);
        }
}

TEST_CASE("Point-mass drafts keep the target distribution", "[statistical][distribution]") {
    const equivalence_case c{.target_seed = 81};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    shift_drafter drafter{c.vocab, 1};
    check_equivalence(drafter, target, target, c, 3);
}

TEST_CASE("Prompt-lookup, n-gram and fallback drafters keep the target distribution", "[statistical][distribution]") {
    const equivalence_case c{.target_seed = 111};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    specdec::prompt_lookup_drafter lookup(c.vocab, 2, 1);
    check_equivalence(lookup, target, target, c, 0);
    specdec::ngram_model bigram(c.vocab, 2);
    check_equivalence(bigram, target, target, c, 3);
    specdec::fallback_drafter chain(lookup, bigram);
    check_equivalence(chain, target, target, c, 3);
}

TEST_CASE("Hierarchical drafting (a draft model sped up by its own drafter) keeps the target distribution",
          "[statistical][distribution][hierarchical]") {
    // Leviathan et al. 2023, §6: the draft model runs speculative decoding with a bigram table
    // (point masses) or a smaller Markov model (distributions) below it; the block and its
    // columns are the draft model's own, so the outer verification stays exact. The draft at
    // another temperature than the target too (its columns are then the draft's law).
    const equivalence_case c{.target_seed = 121, .draft_seed = 122};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    auto tiny = markov_model::random(c.vocab, 1, 123);
    specdec::ngram_model bigram(c.vocab, 2);
    specdec::hierarchical_drafter over_table(bigram, draft, {.gamma = 2});
    check_equivalence(over_table, target, target, c, 3);
    specdec::hierarchical_drafter over_model(tiny, draft, {.gamma = 3, .scheme = specdec::verification_scheme::token});
    check_equivalence(over_model, target, target, c, 3);
    CHECK(over_model.inner_stats().rejected_tokens > 0);  // the inner loop really rejected and resampled
    CHECK(over_model.inner_stats().accepted_tokens > 0);
    check_equivalence(over_model, target, target, c, 3, {0}, [](token_id t) { return t; }, 1000 + c.target_seed,
                      kSamples, [](specdec::decode_options& o) { o.draft.sampling = specdec::sampling_config{.temperature = 1.6f}; });
}

namespace {

/// Wrong on purpose: a hierarchical drafter that reports as q the inner drafter's distributions
/// (the law its proposals were drawn from) instead of the draft model's, which the block's
/// tokens follow after the inner verification.
struct inner_q_hierarchical {
    markov_model* inner;
    markov_model* model;
    specdec::hierarchical_drafter<markov_model&, markov_model&> real{*inner, *model, {.gamma = 3}};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        real.draft(context, gamma, s, u, out);
        std::vector<token_id> prefix(context.begin(), context.end());
        out.standardized = false;
        for (std::size_t i = 0; i < out.tokens.size(); ++i) {
            const auto q = ref_standardize(inner->next_logits(prefix), s);
            for (std::size_t x = 0; x < q.size(); ++x)
                out.probs(static_cast<Eigen::Index>(x), static_cast<Eigen::Index>(i)) = static_cast<float>(q[x]);
            prefix.push_back(out.tokens[i]);
        }
    }
};

}  // namespace

TEST_CASE("Negative control: a hierarchical drafter reporting the inner drafter's q is detected",
          "[statistical][negative-control][hierarchical]") {
    auto target = markov_model::random(4, 2, 121);
    auto draft = markov_model::random(4, 2, 122);
    auto tiny = markov_model::random(4, 1, 123);
    inner_q_hierarchical d{&tiny, &draft};
    const std::vector<token_id> prompt{0};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, {});
    for (const auto scheme : kSchemes) {
        const specdec::decode_options opts{.step = specdec::chain{.gamma = 3, .scheme = scheme},
                                           .budget = {.max_new_tokens = kLength}};
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) { return specdec::speculative_decode(d, target, prompt, opts, rng).tokens; },
            exact, 4, 5252);
        INFO(name(scheme) << ": " << describe(r));
        CHECK(r.p_value < kFalseAlarm);
    }
}

namespace {

/// The draft with sampling settings of its own (decode_options::draft.sampling): the output
/// must still have the target's distribution under the target's settings.
void check_draft_settings(const equivalence_case& c, const specdec::sampling_config& draft_sampling,
                          std::size_t rejection_positions = 3) {
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    std::size_t steps = 0;
    check_equivalence(draft, target, target, c, rejection_positions, {0}, [](token_id t) { return t; },
                      1000 + c.target_seed, kSamples, [&](specdec::decode_options& o) {
                          o.draft.sampling = draft_sampling;
                          auto count = o.on_step;
                          o.on_step = [&steps, count](const specdec::step_event& e) {
                              ++steps;
                              count(e);
                          };
                      });
    CHECK(steps > 0);
}

/// Wrong on purpose: samples its tokens with `actual` settings, but reports as q the draft
/// model's distributions under the settings it was given (the target's): q is then not the
/// distribution the tokens were drawn from.
struct misreported_q_drafter {
    markov_model* model;
    specdec::sampling_config actual;
    specdec::model_drafter<markov_model> inner{*model};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        inner.draft(context, gamma, actual, u, out);
        std::vector<token_id> prefix(context.begin(), context.end());
        out.scales.clear();
        out.standardized = false;
        for (std::size_t i = 0; i < out.tokens.size(); ++i) {
            const auto q = ref_standardize(model->next_logits(prefix), s);
            for (std::size_t x = 0; x < q.size(); ++x)
                out.probs(static_cast<Eigen::Index>(x), static_cast<Eigen::Index>(i)) = static_cast<float>(q[x]);
            prefix.push_back(out.tokens[i]);
        }
    }
};

}  // namespace

TEST_CASE("A draft at another temperature than the target keeps the target distribution",
          "[statistical][distribution][draft-sampling]") {
    SECTION("draft at temperature 0.5, target at 1") {
        check_draft_settings({.target_seed = 151, .draft_seed = 152}, {.temperature = 0.5f});
    }
    SECTION("draft at temperature 1.5 with top-p 0.9, target at 0.8 with top-k 3") {
        check_draft_settings({.vocab = 5, .sampling = {.temperature = 0.8f, .top_k = 3}, .target_seed = 153,
                              .draft_seed = 154},
                             {.temperature = 1.5f, .top_p = 0.9f});
    }
    SECTION("greedy draft (temperature 0), target at 1") {
        check_draft_settings({.target_seed = 155, .draft_seed = 156}, {.temperature = 0.0f});
    }
}

TEST_CASE("A draft with another top-k than the target keeps the target distribution",
          "[statistical][distribution][draft-sampling]") {
    SECTION("draft top-k 2, target unfiltered at 0.8") {
        check_draft_settings({.vocab = 5, .sampling = {.temperature = 0.8f}, .target_seed = 161, .draft_seed = 162},
                             {.temperature = 0.8f, .top_k = 2});
    }
    SECTION("draft unfiltered, target top-k 2 with min-p 0.1") {
        check_draft_settings({.vocab = 5, .sampling = {.top_k = 2, .min_p = 0.1f}, .target_seed = 163,
                              .draft_seed = 164},
                             {});
    }
}

TEST_CASE("Negative control: reporting the target's settings as q while sampling the draft with others is detected",
          "[statistical][negative-control][draft-sampling]") {
    auto target = markov_model::random(4, 2, 151);
    auto draft = markov_model::random(4, 2, 152);
    misreported_q_drafter d{&draft, {.temperature = 0.4f}};
    const std::vector<token_id> prompt{0};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, {});
    for (const auto scheme : kSchemes) {
        const specdec::decode_options opts{.step = specdec::chain{.gamma = 3, .scheme = scheme}, .budget = {.max_new_tokens = kLength}};
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) { return specdec::speculative_decode(d, target, prompt, opts, rng).tokens; },
            exact, 4, 5151);
        INFO(name(scheme) << ": " << describe(r));
        CHECK(r.p_value < kFalseAlarm);
    }
}

namespace {

/// A small model embedded in a vocabulary of 7000 tokens (four 2048-token blocks): its tokens
/// sit at spread-out ids in blocks 0, 1 and 3, every other logit is -Inf. Exercises what rows
/// of one block cannot: several blocks with different maxima, an all -Inf block, the partial
/// last block, draws that cross blocks.
struct sparse_model {
    static constexpr Eigen::Index big_vocab = 7000;
    static constexpr token_id ids[] = {5, 2047, 2048, 6500, 6999};
    markov_model* inner = nullptr;

    static token_id small_of(token_id big) {
        for (token_id t = 0; t < 5; ++t)
            if (ids[t] == big) return t;
        throw std::logic_error("sparse_model: token outside the embedded vocabulary");
    }
    std::ptrdiff_t vocab_size() const { return big_vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        std::vector<token_id> small;
        for (token_id t : context) small.push_back(small_of(t));
        const Eigen::VectorXf z = inner->next_logits(small);
        Eigen::VectorXf out = Eigen::VectorXf::Constant(big_vocab, -std::numeric_limits<float>::infinity());
        for (token_id t = 0; t < 5; ++t) out[ids[t]] = z[t];
        return out;
    }
};

}  // namespace

TEST_CASE("Speculative decoding over a sparse 7000-token vocabulary (several blocks) matches the target distribution",
          "[statistical][distribution]") {
    const equivalence_case c{.vocab = 5, .sampling = {.temperature = 0.8f}, .target_seed = 121, .draft_seed = 122};
    auto target_small = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft_small = markov_model::random(c.vocab, 2, c.draft_seed);
    sparse_model target{&target_small}, draft{&draft_small};
    // 7000-logit rows: fewer sequences, same false-alarm rate.
    check_equivalence(draft, target, target_small, c, 3, {sparse_model::ids[0]}, sparse_model::small_of, 1121,
                      kSamples / 5);
}

TEST_CASE("A draft equal to the target is always accepted and keeps the target distribution",
          "[statistical][distribution]") {
    const equivalence_case c{.sampling = {.temperature = 0.9f}, .target_seed = 91};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = target;
    const std::vector<token_id> prompt{0};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, c.sampling);
    for (const auto scheme : kSchemes) {
    INFO(name(scheme));
    specdec::decode_stats total;
    const specdec::decode_options opts{.step = specdec::chain{.gamma = c.gamma, .scheme = scheme}, .sampling = c.sampling, .budget = {.max_new_tokens = kLength}};
    const auto r = sequence_test(
        [&](std::mt19937_64& rng) {
            auto out = specdec::speculative_decode(draft, target, prompt, opts, rng);
            total.accepted_tokens += out.stats.accepted_tokens;
            total.rejected_tokens += out.stats.rejected_tokens;
            return out.tokens;
        },
        exact, c.vocab, 1091);
    INFO(describe(r));
    CHECK(r.p_value >= kFalseAlarm);
    CHECK(total.rejected_tokens == 0);
    CHECK(total.accepted_tokens > 0);
    }
}

TEST_CASE("A draft with support disjoint from the target's is always rejected and the output is still exact",
          "[statistical][distribution]") {
    const equivalence_case c{.vocab = 5, .target_seed = 101, .draft_seed = 102};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    target.forbid(0);  // the target never emits token 0 ...
    for (token_id t = 1; t < c.vocab; ++t) draft.forbid(t);  // ... which is all the draft can emit
    const std::vector<token_id> prompt{0};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, c.sampling);
    for (const auto scheme : kSchemes) {
    INFO(name(scheme));
    std::size_t accepted = 0;
    const specdec::decode_options opts{.step = specdec::chain{.gamma = c.gamma, .scheme = scheme}, .sampling = c.sampling, .budget = {.max_new_tokens = kLength}};
    const auto r = sequence_test(
        [&](std::mt19937_64& rng) {
            auto out = specdec::speculative_decode(draft, target, prompt, opts, rng);
            accepted += out.stats.accepted_tokens;
            return out.tokens;
        },
        exact, c.vocab, 1101);
    INFO(describe(r));
    CHECK(r.p_value >= kFalseAlarm);
    CHECK(accepted == 0);
    }
}

namespace {

/// The adaptive γ policy with known costs chosen so that it keeps changing γ: draft tokens cost
/// 0.01 of a pass, a pass 1 + 0.02 per extra position (the best γ is then 1 to 3 at these
/// models' acceptance, and flips as the estimates move), and it explores every other step.
/// One controller per scheme, kept across the 100,000 runs, so each run's γ depends on
/// everything before it.
struct adaptive_setup {
    specdec::gamma_controller token_ctl, block_ctl;
    std::vector<std::size_t> used;  // steps by γ over all runs
    explicit adaptive_setup(std::size_t gamma_max)
        : token_ctl(gamma_max, options()), block_ctl(gamma_max, options()), used(gamma_max + 1, 0) {}
    static specdec::adaptive_gamma_options options() {
        specdec::adaptive_gamma_options o;
        o.draft_cost = [](std::size_t n) { return 0.01 * static_cast<double>(n); };
        o.pass_cost = [](std::size_t m) { return 1.0 + 0.02 * static_cast<double>(m - 1); };
        o.explore_every = 2;
        o.max_explore_every = 2;
        o.explore_budget = 1.0;
        o.window = 8;
        return o;
    }
    std::function<void(specdec::decode_options&)> customize() {
        return [this](specdec::decode_options& o) {
            o.length.policy = specdec::gamma_policy::adaptive;
            o.length.controller =
                std::get<specdec::chain>(o.step).scheme == specdec::verification_scheme::token ? &token_ctl : &block_ctl;
            auto count = o.on_step;
            o.on_step = [this, count](const specdec::step_event& e) {
                ++used[e.gamma];
                count(e);
            };
        };
    }
    std::size_t distinct() const {
        std::size_t k = 0;
        for (std::size_t n : used) k += n != 0;
        return k;
    }
};

}  // namespace

TEST_CASE("The adaptive gamma policy keeps the target distribution", "[statistical][distribution][adaptive]") {
    for (const equivalence_case c : {equivalence_case{.target_seed = 131, .draft_seed = 132},
                                     equivalence_case{.vocab = 5, .sampling = {.temperature = 0.7f, .top_k = 3},
                                                      .target_seed = 133, .draft_seed = 134}}) {
        auto target = markov_model::random(c.vocab, 2, c.target_seed);
        auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
        adaptive_setup setup(c.gamma);
        check_equivalence(draft, target, target, c, 3, {0}, [](token_id t) { return t; }, 1000 + c.target_seed,
                          kSamples, setup.customize());
        INFO("steps by gamma: " << setup.used[0] << ", " << setup.used[1] << ", " << setup.used[2] << ", "
                                << setup.used[3]);
        CHECK(setup.distinct() == 4);
    }
}

TEST_CASE("The draft-side stop keeps the target distribution", "[statistical][distribution][adaptive]") {
    const equivalence_case c{.vocab = 4, .target_seed = 141, .draft_seed = 142};
    auto target = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
    std::size_t short_blocks = 0;
    check_equivalence(draft, target, target, c, 2, {0}, [](token_id t) { return t; }, 1141, kSamples,
                      [&](specdec::decode_options& o) {
                          o.draft.stop_below = 0.4f;
                          auto count = o.on_step;
                          o.on_step = [&short_blocks, count](const specdec::step_event& e) {
                              short_blocks += e.draft.size() < e.gamma;
                              count(e);
                          };
                      });
    CHECK(short_blocks > kSamples / 10);
    // And with the adaptive policy on top.
    adaptive_setup setup(c.gamma);
    const auto adaptive = setup.customize();
    check_equivalence(draft, target, target, c, 2, {0}, [](token_id t) { return t; }, 2141, kSamples,
                      [&](specdec::decode_options& o) {
                          adaptive(o);
                          o.draft.stop_below = 0.4f;
                      });
}

namespace {

/// Wrong on purpose: a drafter whose block length depends on something other than draft values.
/// `drop_low`: a draft-side stop that drops the token below the threshold instead of keeping it
/// (the kept tokens are then drawn from q conditioned on q >= threshold, not from q).
/// Otherwise: the block is emptied when the target would likely reject its first token
/// (p_1(x_1) < q_1(x_1)), a length chosen from the target's values.
struct biased_length_drafter {
    markov_model* draft_model;
    markov_model* target_model;
    bool drop_low;
    specdec::model_drafter<markov_model> inner{*draft_model};
    std::ptrdiff_t vocab_size() const { return draft_model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        inner.draft(context, gamma, s, u, out);
        const auto q_of = [&](std::size_t i) {
            return static_cast<double>(out.scales[i]) *
                   static_cast<double>(out.probs(out.tokens[i], static_cast<Eigen::Index>(i)));
        };
        std::size_t keep = out.tokens.size();
        if (drop_low) {
            for (std::size_t i = 0; i < out.tokens.size(); ++i)
                if (q_of(i) < 0.4) {
                    keep = i;
                    break;
                }
        } else if (!out.tokens.empty()) {
            const auto p = ref_standardize(target_model->next_logits(context), s);
            if (p[static_cast<std::size_t>(out.tokens[0])] < q_of(0)) keep = 0;
        }
        if (keep == out.tokens.size()) return;
        out.tokens.resize(keep);
        out.scales.resize(keep);
        Eigen::MatrixXf kept = out.probs.leftCols(static_cast<Eigen::Index>(keep));
        out.probs = kept;
    }
};

gof_result biased_length_test(bool drop_low, specdec::verification_scheme scheme) {
    auto target = markov_model::random(4, 2, 141);
    auto draft = markov_model::random(4, 2, 142);
    biased_length_drafter d{&draft, &target, drop_low};
    const std::vector<token_id> prompt{0};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, {});
    const specdec::decode_options opts{.step = specdec::chain{.gamma = 3, .scheme = scheme}, .budget = {.max_new_tokens = kLength}};
    return sequence_test(
        [&](std::mt19937_64& rng) { return specdec::speculative_decode(d, target, prompt, opts, rng).tokens; },
        exact, 4, drop_low ? 3141 : 4141);
}

}  // namespace

TEST_CASE("Negative control: a draft-side stop that drops the unlikely token is detected",
          "[statistical][negative-control][adaptive]") {
    for (const auto scheme : kSchemes) {
        const auto r = biased_length_test(true, scheme);
        INFO(name(scheme) << ": " << describe(r));
        CHECK(r.p_value < kFalseAlarm);
    }
}

TEST_CASE("Negative control: a draft length chosen from the target's values is detected",
          "[statistical][negative-control][adaptive]") {
    for (const auto scheme : kSchemes) {
        const auto r = biased_length_test(false, scheme);
        INFO(name(scheme) << ": " << describe(r));
        CHECK(r.p_value < kFalseAlarm);
    }
}

// ---- Negative controls: the same test must reject wrong algorithms. ----

namespace {
gof_result reference_variant_test(variant v) {
    auto target = markov_model::random(4, 2, 11);
    auto draft = markov_model::random(4, 2, 12);
    const std::vector<token_id> prompt{0};
    const specdec::sampling_config s{};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, s);
    return sequence_test(
        [&](std::mt19937_64& rng) { return reference_decode(v, draft, target, prompt, kLength, 3, s, rng); }, exact,
        4, 2024);
}
}  // namespace

TEST_CASE("The reference transcription of Algorithm 1 passes the same test", "[statistical][negative-control]") {
    const auto r = reference_variant_test(variant::correct);
    INFO(describe(r));
    CHECK(r.p_value >= kFalseAlarm);
}

TEST_CASE("Negative control: resampling from p instead of the residual is detected",
          "[statistical][negative-control]") {
    const auto r = reference_variant_test(variant::resample_from_p);
    INFO(describe(r));
    CHECK(r.p_value < kFalseAlarm);
}

TEST_CASE("Negative control: accepting drafts without the ratio test is detected", "[statistical][negative-control]") {
    const auto r = reference_variant_test(variant::no_ratio_test);
    INFO(describe(r));
    CHECK(r.p_value < kFalseAlarm);
}

TEST_CASE("The reference transcription of block verification passes the same test",
          "[statistical][negative-control][block]") {
    const auto r = reference_variant_test(variant::block_correct);
    INFO(describe(r));
    CHECK(r.p_value >= kFalseAlarm);
}

TEST_CASE("Negative control: block verification with an unweighted residual is detected",
          "[statistical][negative-control][block]") {
    const auto r = reference_variant_test(variant::block_unweighted_residual);
    INFO(describe(r));
    CHECK(r.p_value < kFalseAlarm);
}

TEST_CASE("Negative control: block verification keeping the first failure instead of the last success is detected",
          "[statistical][negative-control][block]") {
    const auto r = reference_variant_test(variant::block_first_failure);
    INFO(describe(r));
    CHECK(r.p_value < kFalseAlarm);
}

TEST_CASE("Negative control: lenience below 1 changes the distribution, and the test sees it",
          "[statistical][negative-control]") {
    auto target = markov_model::random(4, 2, 11);
    auto draft = markov_model::random(4, 2, 12);
    const std::vector<token_id> prompt{0};
    const auto exact = exact_sequence_distribution(target, prompt, kLength, {});
    const specdec::decode_options opts{.step = specdec::chain{.gamma = 3, .scheme = specdec::verification_scheme::token, .lenience = 0.3f}, .budget = {.max_new_tokens = kLength}};
    const auto r = sequence_test(
        [&](std::mt19937_64& rng) { return specdec::speculative_decode(draft, target, prompt, opts, rng).tokens; },
        exact, 4, 3031);
    INFO(describe(r));
    CHECK(r.p_value < kFalseAlarm);
}

TEST_CASE("Negative control: lenience 0.3 is detected under each sampling configuration tested above",
          "[statistical][negative-control]") {
    // The controls above use temperature 1; this shows that the test has power under each of
    // the other configurations too (same models, seeds and sample sizes as their cases): the
    // library's own lenient sampling, whose distribution is not the target's, must fail.
    const auto lenient = [](const equivalence_case& c) {
        return specdec::decode_options{.step = specdec::chain{.gamma = c.gamma, .scheme = specdec::verification_scheme::token, .lenience = 0.3f}, .sampling = c.sampling, .budget = {.max_new_tokens = kLength}};
    };
    const equivalence_case cases[] = {
        {.sampling = {.temperature = 0.6f}, .target_seed = 21, .draft_seed = 22},
        {.vocab = 5, .sampling = {.top_k = 3}, .target_seed = 31, .draft_seed = 32},
        {.vocab = 5, .sampling = {.top_p = 0.9f}, .target_seed = 43, .draft_seed = 44},
        {.vocab = 5, .sampling = {.temperature = 0.8f, .min_p = 0.1f}, .target_seed = 51, .draft_seed = 52}};
    for (const auto& c : cases) {
        auto target = markov_model::random(c.vocab, 2, c.target_seed);
        auto draft = markov_model::random(c.vocab, 2, c.draft_seed);
        const std::vector<token_id> prompt{0};
        const auto exact = exact_sequence_distribution(target, prompt, kLength, c.sampling);
        const auto opts = lenient(c);
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) { return specdec::speculative_decode(draft, target, prompt, opts, rng).tokens; },
            exact, c.vocab, 1000 + c.target_seed);
        INFO("seeds " << c.target_seed << ", " << c.draft_seed << ": " << describe(r));
        CHECK(r.p_value < kFalseAlarm);
    }
    // The sparse 7000-token vocabulary, with its smaller sample.
    const equivalence_case c{.vocab = 5, .sampling = {.temperature = 0.8f}, .target_seed = 121, .draft_seed = 122};
    auto target_small = markov_model::random(c.vocab, 2, c.target_seed);
    auto draft_small = markov_model::random(c.vocab, 2, c.draft_seed);
    sparse_model target{&target_small}, draft{&draft_small};
    const std::vector<token_id> prompt{sparse_model::ids[0]}, model_prompt{0};
    const auto exact = exact_sequence_distribution(target_small, model_prompt, kLength, c.sampling);
    const auto opts = lenient(c);
    const auto r = sequence_test(
        [&](std::mt19937_64& rng) {
            auto tokens = specdec::speculative_decode(draft, target, prompt, opts, rng).tokens;
            for (auto& t : tokens) t = sparse_model::small_of(t);
            return tokens;
        },
        exact, c.vocab, 1121, kSamples / 5);
    INFO("sparse vocabulary: " << describe(r));
    CHECK(r.p_value < kFalseAlarm);
}
