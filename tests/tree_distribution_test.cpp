// Tree speculative decoding keeps the target's distribution over whole sequences.
//
// Method (as distribution_test.cpp): random Markov models (V = 4 or 5, logits depending on the
// last two tokens) as draft and target; 100,000 sequences of 4 tokens per case, from the prompt
// {0}, drafted as trees of several shapes (depth 1 with k siblings, a pure chain, deeper
// trees), under both tree schemes; Pearson's chi-square test against the exact target
// distribution of the 4-token sequences (cells with expected count < 5 pooled). A case fails
// when p < 1e-4: one or two false alarms in 10^4 per test (the chi-square approximation, see
// distribution_test.cpp), about 40 tests here, so a correct implementation fails a run with
// probability about 0.5% (fixed seeds: a run is reproducible). Each case also checks that its
// steps both rejected at the first level and accepted whole paths, so the residual updates
// between siblings and the deep acceptances are exercised.
//
// Negative controls run the same test on deliberately wrong procedures and require p < 1e-4:
// siblings drawn without replacement but marked i.i.d.; recursive rejection sampling that does
// not update the residual between siblings. The correct form of the latter (a double-precision
// transcription) must pass the same test.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/stats.hpp"
#include "support/tree_reference.hpp"

#include <specdec/specdec.hpp>
#include <specdec/tree_decode.hpp>

#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace specdec_test;
using specdec::sibling_draws;
using specdec::token_id;
using specdec::tree_verification_scheme;

namespace {

constexpr std::size_t kSamples = 100000;
constexpr int kLength = 4;
constexpr double kFalseAlarm = 1e-4;
const std::vector<token_id> kPrompt{0};

std::size_t encode(const std::vector<token_id>& tokens, int vocab) {
    std::size_t index = 0;
    for (token_id t : tokens) index = index * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(t);
    return index;
}

gof_result sequence_test(const std::function<std::vector<token_id>(std::mt19937_64&)>& sample,
                         const std::vector<double>& exact, int vocab, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::size_t> counts(exact.size(), 0);
    for (std::size_t s = 0; s < kSamples; ++s) {
        const auto tokens = sample(rng);
        REQUIRE(tokens.size() == static_cast<std::size_t>(kLength));
        ++counts[encode(tokens, vocab)];
    }
    return chi_square_test(counts, exact);
}

std::string describe(const gof_result& r) {
    std::ostringstream os;
    os << "chi2 = " << r.statistic << ", df = " << r.degrees_of_freedom << ", p = " << r.p_value;
    return os.str();
}

const char* name(tree_verification_scheme s) {
    return s == tree_verification_scheme::traversal ? "traversal verification" : "recursive rejection sampling";
}

/// Decodes with speculative_decode_tree under both schemes and tests the sequences. With
/// `exercised`, also requires steps that accepted nothing and steps that accepted a whole
/// path of the tree's depth.
template <class D, class V>
void check_tree_case(D& drafter, V& verifier, const markov_model& target, const specdec::sampling_config& s,
                     const specdec::tree_shape& shape, std::uint64_t seed, bool exercised = true) {
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, s);
    for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
        INFO(name(scheme));
        std::size_t none = 0, full = 0;
        specdec::tree_decode_options opts{.shape = shape, .scheme = scheme, .max_new_tokens = kLength, .sampling = s};
        opts.on_step = [&](const specdec::tree_step_event& e) {
            if (e.tree->size() == 0) return;
            none += e.accepted == 0;
            full += e.accepted == static_cast<std::size_t>(e.tree->max_depth()) && e.tree->max_depth() > 1;
        };
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) {
                return specdec::speculative_decode_tree(drafter, verifier, kPrompt, opts, rng).tokens;
            },
            exact, target.vocab, seed);
        INFO(describe(r) << "; steps accepting nothing " << none << ", whole deep paths " << full);
        CHECK(r.p_value >= kFalseAlarm);
        if (exercised) {
            CHECK(none > 0);
            if (shape.depth() > 1) CHECK(full > 0);
        }
    }
}

void check_pair(int vocab, const specdec::sampling_config& s, const specdec::tree_shape& shape, std::uint64_t seed,
                bool exercised = true) {
    auto target = markov_model::random(vocab, 2, seed);
    auto draft = markov_model::random(vocab, 2, seed + 1);
    tree_markov verifier{&target};
    check_tree_case(draft, verifier, target, s, shape, 1000 + seed, exercised);
}

/// A point-mass tree drafter: below every node (and the root), the tokens last + 1, last + 2, ...
/// (mod V), as many as the shape asks; deterministic.
struct shift_tree_drafter {
    int vocab = 4;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config&, specdec::uniform_source&, specdec::draft_tree& out) const {
        out.clear();
        std::vector<std::int32_t> level{-1};
        for (std::size_t d = 0; d < shape.depth(); ++d) {
            std::vector<std::int32_t> next;
            for (std::int32_t par : level) {
                const token_id last = par < 0 ? context.back() : out.tokens[static_cast<std::size_t>(par)];
                for (std::size_t j = 0; j < shape.branching[d]; ++j)
                    next.push_back(out.add(par, static_cast<token_id>((last + 1 + static_cast<int>(j)) % vocab)));
            }
            level = next;
        }
    }
};

/// WRONG on purpose: draws siblings without replacement, then marks them i.i.d.
struct mislabeled_drafter {
    markov_model* model = nullptr;
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& u, specdec::draft_tree& out) {
        specdec::tree_shape wor = shape;
        wor.draws = sibling_draws::without_replacement;
        specdec::draft_tree_from_model(*model, context, wor, s, u, out, path, logits, q, scratch, sws);
        for (auto& d : out.draws) d = sibling_draws::iid;
    }
};

}  // namespace

TEST_CASE("Tree decoding samples whole sequences from the target at temperature 1 (without replacement)",
          "[statistical][distribution][tree]") {
    check_pair(4, {}, {.branching = {2, 2, 1}, .draws = sibling_draws::without_replacement}, 11);
}

TEST_CASE("Tree decoding with i.i.d. siblings matches the target at temperature 1", "[statistical][distribution][tree]") {
    check_pair(4, {}, {.branching = {2, 2, 1}, .draws = sibling_draws::iid}, 21);
}

TEST_CASE("Tree decoding matches the target at temperature 0.6", "[statistical][distribution][tree]") {
    check_pair(4, {.temperature = 0.6f}, {.branching = {3, 1}, .draws = sibling_draws::without_replacement}, 31);
    check_pair(4, {.temperature = 0.6f}, {.branching = {3, 1}, .draws = sibling_draws::iid}, 33);
}

TEST_CASE("Tree decoding matches the target under top-k and top-p", "[statistical][distribution][tree]") {
    check_pair(5, {.top_k = 3}, {.branching = {3, 2}, .draws = sibling_draws::without_replacement}, 41);
    check_pair(5, {.top_p = 0.9f}, {.branching = {2, 1, 1}, .draws = sibling_draws::iid}, 43);
    check_pair(5, {.temperature = 0.8f, .min_p = 0.1f}, {.branching = {2, 2}, .draws = sibling_draws::without_replacement}, 45);
}

TEST_CASE("Depth-1 trees of k siblings match the target", "[statistical][distribution][tree]") {
    // V = 4 siblings drawn without replacement cover the vocabulary: one is always accepted.
    check_pair(4, {}, {.branching = {4}, .draws = sibling_draws::without_replacement}, 51, false);
    check_pair(5, {}, {.branching = {3}, .draws = sibling_draws::without_replacement}, 55);
    check_pair(4, {}, {.branching = {3}, .draws = sibling_draws::iid}, 53);
}

TEST_CASE("A pure chain matches the target", "[statistical][distribution][tree]") {
    check_pair(4, {.temperature = 0.8f}, {.branching = {1, 1, 1}}, 61);
}

TEST_CASE("Point-mass trees keep the target distribution", "[statistical][distribution][tree]") {
    auto target = markov_model::random(4, 2, 71);
    shift_tree_drafter drafter{4};
    tree_markov verifier{&target};
    check_tree_case(drafter, verifier, target, {}, {.branching = {2, 2, 1}}, 1071);
}

TEST_CASE("A draft tree with support disjoint from the target's is always rejected, exactly",
          "[statistical][distribution][tree]") {
    auto target = markov_model::random(5, 2, 81);
    auto draft = markov_model::random(5, 2, 82);
    target.forbid(0);
    for (token_id t = 1; t < 5; ++t) draft.forbid(t);
    tree_markov verifier{&target};
    for (const auto draws : {sibling_draws::iid, sibling_draws::without_replacement}) {
        std::size_t accepted = 0;
        const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
        for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
            INFO(name(scheme));
            const auto r = sequence_test(
                [&](std::mt19937_64& rng) {
                    auto out = specdec::speculative_decode_tree(
                        draft, verifier, kPrompt,
                        {.shape = {.branching = {2, 2}, .draws = draws}, .scheme = scheme, .max_new_tokens = kLength},
                        rng);
                    accepted += out.stats.accepted_tokens;
                    return out.tokens;
                },
                exact, 5, 1081);
            INFO(describe(r));
            CHECK(r.p_value >= kFalseAlarm);
            CHECK(accepted == 0);
        }
    }
}

TEST_CASE("Verifiers without score_tree and block drafters keep the target distribution",
          "[statistical][distribution][tree]") {
    auto target = markov_model::random(4, 2, 91);
    auto draft = markov_model::random(4, 2, 92);
    batched_markov batched{&target};
    check_tree_case(draft, batched, target, {}, {.branching = {2, 1, 1}}, 1091);
    check_tree_case(draft, target, target, {}, {.branching = {2, 2}}, 1093);
    shift_drafter block{4, 1};
    tree_markov verifier{&target};
    check_tree_case(block, verifier, target, {}, {.branching = {1, 1, 1}}, 1095);
}

TEST_CASE("Negative control: siblings drawn without replacement but verified as i.i.d. are caught",
          "[statistical][distribution][tree][negative]") {
    auto target = markov_model::random(4, 2, 101);
    auto draft = markov_model::random(4, 2, 102);
    mislabeled_drafter drafter{&draft};
    tree_markov verifier{&target};
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    for (const auto scheme : {tree_verification_scheme::recursive_rejection, tree_verification_scheme::traversal}) {
        INFO(name(scheme));
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) {
                return specdec::speculative_decode_tree(drafter, verifier, kPrompt,
                                                        {.shape = {.branching = {3, 1}}, .scheme = scheme,
                                                         .max_new_tokens = kLength},
                                                        rng)
                    .tokens;
            },
            exact, 4, 1101);
        INFO(describe(r));
        CHECK(r.p_value < kFalseAlarm);
    }
}

TEST_CASE("Negative control: recursive rejection without the residual update between siblings is caught",
          "[statistical][distribution][tree][negative]") {
    auto target = markov_model::random(4, 2, 111);
    auto draft = markov_model::random(4, 2, 112);
    const auto exact = exact_sequence_distribution(target, kPrompt, kLength, {});
    for (const bool update : {true, false}) {
        INFO((update ? "correct transcription" : "WRONG: no residual update"));
        const auto r = sequence_test(
            [&](std::mt19937_64& rng) {
                std::vector<token_id> seq = kPrompt;
                specdec::uniform_source u(rng);
                specdec::draft_tree tree;
                std::vector<token_id> path;
                Eigen::VectorXf logits, q, scratch;
                specdec::sampling_workspace sws;
                while (seq.size() < kPrompt.size() + kLength) {
                    const std::size_t left = kPrompt.size() + kLength - seq.size();
                    specdec::tree_shape shape{.branching = {3, 1}, .draws = sibling_draws::iid};
                    shape.branching.resize(std::min<std::size_t>(2, left - 1));
                    if (shape.branching.empty()) tree.clear();
                    else specdec::draft_tree_from_model(draft, seq, shape, {}, u, tree, path, logits, q, scratch, sws);
                    const Eigen::MatrixXf z = tree_logits(target, seq, tree);
                    const auto [last, next] = ref_rrs_sample(tree, z, {}, rng, update);
                    specdec::path_tokens(tree, last, path);
                    seq.insert(seq.end(), path.begin(), path.end());
                    seq.push_back(next);
                }
                return std::vector<token_id>(seq.begin() + 1, seq.end());
            },
            exact, 4, 1111);
        INFO(describe(r));
        if (update) CHECK(r.p_value >= kFalseAlarm);
        else CHECK(r.p_value < kFalseAlarm);
    }
}
