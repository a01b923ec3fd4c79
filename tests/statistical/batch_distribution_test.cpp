// Distribution equivalence of the batch loop: every sequence of a batch_decoder has exactly the
// target's joint distribution of its 4 generated tokens, computed by enumeration, whatever the
// other sequences of the batch do: chains with one target pass per step (a MultiSequenceDrafter
// and a MultiSequenceVerifier), under the fixed and the adaptive policy (planned from known
// costs, from an engine profile, or by a controller of the caller's kept across decoders), with
// the draft's own sampling settings (draft-side sampling) and the draft-side stop, and token
// trees (a plain drafter and a TreeVerifier, one score_tree pass per sequence and step) under
// both tree schemes, with the same options, and planned trees whose chain plans run as chain
// steps (drafted for the whole batch in one draft_batch call, verified by block verification).
// A draining batch (adaptive_gamma_options::drain: steps made plain where plain steps are
// predicted to finish the batch sooner), of chains or of the tree planner's plans, runs 24
// tokens per sequence so that each sequence's own acceptance counts; its last 4 tokens are
// tested against their exact law (a forward pass over the model's states,
// exact_window_distribution).
//
// Method (as tests/statistical/distribution_test.cpp): small random Markov models (V = 4, logits depending
// on the previous two tokens); 3 sequences per batch with different prompts, the third joining
// after the first step, so acceptance is ragged and sequences finish at different steps; each
// sequence with its own generator, seeded from the case's master generator; 60,000 batches per
// case; Pearson's chi-square test of each sequence's 4-token outputs against its exact
// distribution (cells with expected count < 5 pooled). A test fails when p < 1e-4; the
// chi-square approximation makes a correct implementation fail one such test about 1-2 times
// in 10^4 (distribution_test.cpp's simulation), so with the 72 tests below (12 cases, 2 schemes,
// 3 sequences) about 1% of runs of correct code would fail one (the seeds are fixed: a run is
// reproducible).
// The negative controls run the same tests on deliberately wrong procedures, which must fail
// (p < 1e-4): a verifier that scores every sequence against the first sequence's context (a KV
// cache of the wrong slot; the sequences whose prompt differs must be caught); a drafter that
// samples with the draft's own settings but reports q at the target's settings (draft-side
// sampling verified against the wrong q); a tree drafter whose nodes report a uniform q instead
// of the distribution they were drawn from (every sequence must be caught); the same wrong q
// in the chain plans of a tree planner, drafted for the batch with draft_batch; the wrong slot's
// context again in the last tokens of a draining batch; in a draining batch of the tree
// planner's plans, its trees scored after the context without its last token.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_markov.hpp"
#include "support/stats.hpp"
#include "support/tree_reference.hpp"

#include <specdec/batch_decoder.hpp>

#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
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

/// The drafter of the draft-side sampling control: WRONG on purpose. It samples each sequence's
/// block with the settings it is given (the draft's own), as multi_markov_drafter does, then
/// reports each column as the distribution at `reported` (the target's settings): q is not
/// the distribution the token was drawn from.
struct wrong_q_drafter {
    multi_markov_drafter inner;
    specdec::sampling_config reported{};
    std::vector<token_id> seq{};
    Eigen::VectorXf logits{}, q{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return inner.vocab_size(); }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& sampling) {
        inner.draft_batch(batch, sampling);
        const markov_model& m = *inner.model;
        q.resize(m.vocab);
        for (auto& r : batch) {
            seq.assign(r.context.begin(), r.context.end());
            for (std::size_t i = 0; i < r.out->tokens.size(); ++i) {
                const std::size_t row = m.row_of(seq) * static_cast<std::size_t>(m.vocab);
                logits = Eigen::Map<const Eigen::VectorXf>(m.table.data() + row, m.vocab);
                specdec::standardize(logits, reported, q, sws);
                r.out->probs.col(static_cast<Eigen::Index>(i)) = q;
                r.out->scales[i] = 1.0f;
                seq.push_back(r.out->tokens[i]);
            }
        }
    }
};

/// A drafter of both kinds: a MultiSequenceDrafter (draft_batch) and a plain model
/// (next_logits, which drafts trees one parent at a time). Under the tree planner, batch_decoder
/// runs the steps planned as chains as chain steps (draft_batch, for every sequence at once) and
/// the others as trees. `Chains` is multi_markov_drafter, or the wrong_q_drafter of the control.
template <class Chains>
struct chain_and_tree_drafter {
    Chains chains;
    markov_model* model = nullptr;
    std::size_t tree_calls = 0;  // next_logits calls: tree plans
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        ++tree_calls;
        return model->next_logits(context);
    }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& sampling) {
        chains.draft_batch(batch, sampling);
    }
};

/// A verifier of both kinds: a MultiSequenceVerifier (score_batch: the chain steps of every
/// sequence in one pass) and a TreeVerifier (score_tree), so that a tree planner's chain plans
/// run as chain steps.
struct chain_and_tree_verifier {
    multi_markov_verifier chains;
    tree_markov trees;
    std::ptrdiff_t vocab_size() const { return trees.vocab_size(); }
    void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
        chains.score_batch(batch, out);
    }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        trees.score_tree(context, tree, out);
    }
};

/// The tree drafter of the tree control: WRONG on purpose. It draws its tree from the model as
/// a plain drafter does, then reports a uniform q for every node.
struct uniform_q_tree_drafter {
    markov_model* model = nullptr;
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& u, specdec::draft_tree& out) {
        specdec::draft_tree_from_model(*model, context, shape, s, u, out, path, logits, q, scratch, sws);
        out.probs.setConstant(1.0f / static_cast<float>(model->vocab));
        out.standardized = false;
    }
};

struct batch_case {
    std::size_t gamma = 3;
    specdec::sampling_config sampling{};
    specdec::gamma_policy policy = specdec::gamma_policy::fixed;
    std::uint64_t seed = 1;
    /// The draft's own sampling settings (draft-side sampling); unset: the target's.
    std::optional<specdec::sampling_config> draft_sampling{};
    /// Tree steps of this shape instead of chains of gamma.
    std::optional<specdec::tree_shape> tree{};
    /// The adaptive policy plans from this engine profile instead of the cost callbacks.
    std::optional<specdec::engine_profile> profile{};
    /// The draft-side stop (draft_settings::stop_below); 0: off.
    float stop_below = 0.0f;
    /// The adaptive policy with a controller of the caller's (draft_length::controller), kept
    /// across decoders: a fresh batch_decoder every 250 batches reuses its estimates.
    bool own_controller = false;
};

/// Decodes `samples` batches and returns, per sequence, the test of its outputs against its
/// exact distribution; counts rejections per draft position or tree depth (all sequences) in
/// `rejected_at`. `scheme` is a verification_scheme for chains, a tree_verification_scheme for
/// trees.
template <class D, class V, class Scheme>
std::vector<gof_result> run_case(const markov_model& target, D& drafter, V& verifier, const batch_case& c,
                                 Scheme scheme, std::size_t samples, std::vector<std::size_t>& rejected_at) {
    const int vocab = target.vocab;
    std::vector<std::vector<std::size_t>> counts(kPrompts.size());
    std::vector<std::vector<double>> exact;
    for (std::size_t k = 0; k < kPrompts.size(); ++k) {
        exact.push_back(exact_sequence_distribution(target, kPrompts[k], kLength, c.sampling));
        counts[k].assign(exact[k].size(), 0);
    }
    specdec::decode_options o{.sampling = c.sampling,
                              .draft = {.sampling = c.draft_sampling, .stop_below = c.stop_below},
                              .budget = {.max_new_tokens = kLength}};
    std::size_t longest = c.gamma;
    if constexpr (std::is_same_v<Scheme, specdec::tree_verification_scheme>) {
        o.step = specdec::tree{.shape = c.tree.value(), .scheme = scheme};
        longest = c.tree->depth();
    } else {
        o.step = specdec::chain{.gamma = c.gamma, .scheme = scheme};
    }
    o.length.policy = c.policy;
    // Known costs for the adaptive policy: deterministic choices, several γ in use.
    o.length.adaptive.draft_cost = [](std::size_t n) { return 0.02 * static_cast<double>(n); };
    o.length.adaptive.pass_cost = [](std::size_t m) { return 1.0 + 0.02 * static_cast<double>(m); };
    o.length.adaptive.explore_every = 2;
    if (c.profile) {
        o.length.adaptive.draft_cost = {};
        o.length.adaptive.pass_cost = {};
        o.length.adaptive.profile = c.profile;
    }
    rejected_at.assign(longest, 0);
    o.on_step = [&](const specdec::step_event& e) {
        // Chains: the proposed block; trees (every leaf at full depth, no draft-side stop):
        // the accepted path, shorter than the tree's depth after a rejection.
        const std::size_t drafted = e.tree ? static_cast<std::size_t>(e.tree->max_depth()) : e.draft.size();
        if (e.accepted < drafted) ++rejected_at[e.accepted];
    };
    std::optional<specdec::gamma_controller> own;
    if (c.own_controller) {
        own.emplace(specdec::make_controller(o));
        o.length.controller = &*own;
    }
    using decoder = decltype(specdec::batch_decoder(drafter, verifier, o));
    std::optional<decoder> decoders;
    std::mt19937_64 master(c.seed);
    std::vector<std::size_t> ids(kPrompts.size());
    for (std::size_t s = 0; s < samples; ++s) {
        if (!decoders || (c.own_controller && s % 250 == 0)) decoders.emplace(drafter, verifier, o);
        decoder& dec = *decoders;
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
constexpr specdec::tree_verification_scheme kTreeSchemes[] = {specdec::tree_verification_scheme::traversal,
                                                               specdec::tree_verification_scheme::recursive_rejection};

const char* name(specdec::verification_scheme s) {
    return s == specdec::verification_scheme::token ? "token verification" : "block verification";
}
const char* name(specdec::tree_verification_scheme s) {
    return s == specdec::tree_verification_scheme::traversal ? "traversal verification" : "recursive rejection sampling";
}

/// The tests of one case's sequences, and the rejections seen at every draft position (or
/// tree depth) but the last.
void check_results(const std::vector<gof_result>& results, const std::vector<std::size_t>& rejected_at) {
    for (std::size_t k = 0; k < results.size(); ++k) {
        INFO("sequence " << k << ": " << describe(results[k]));
        CHECK(results[k].p_value >= kFalseAlarm);
    }
    for (std::size_t i = 0; i + 1 < rejected_at.size(); ++i) {
        INFO("rejections at draft position " << i);
        CHECK(rejected_at[i] > 0);
    }
}

/// Chains (one target pass per step for the batch) or, for a case with a tree, trees (a plain
/// drafter, a TreeVerifier) under every scheme.
void check_case(const batch_case& c) {
    auto target = markov_model::random(4, 2, 21);
    auto draft = markov_model::random(4, 2, 22);
    std::vector<std::size_t> rejected_at;
    if (c.tree) {
        for (const auto scheme : kTreeSchemes) {
            INFO(name(scheme));
            markov_model drafter = draft;
            tree_markov verifier{&target};
            check_results(run_case(target, drafter, verifier, c, scheme, samples_per_case(), rejected_at), rejected_at);
        }
        return;
    }
    for (const auto scheme : kSchemes) {
        INFO(name(scheme));
        multi_markov_drafter drafter{&draft};
        multi_markov_verifier verifier{&target};
        check_results(run_case(target, drafter, verifier, c, scheme, samples_per_case(), rejected_at), rejected_at);
    }
}

/// A negative control's tests: every sequence from `first` on must be caught.
void check_caught(const std::vector<gof_result>& results, std::size_t first) {
    for (std::size_t k = first; k < results.size(); ++k) {
        INFO("sequence " << k << ": " << describe(results[k]));
        CHECK(results[k].p_value < kFalseAlarm);
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

TEST_CASE("Every sequence of a multi-sequence batch has the target's distribution when an engine profile plans each "
          "step for the batch's size",
          "[statistical][batch][multi][adaptive][profile]") {
    // A pass flat up to 6 positions, then steep: 2 sequences speculate longer than 3 do, so the
    // plan changes as the third sequence joins and as sequences finish.
    const specdec::engine_profile profile{.target_pass = {1, 1, 1, 1, 1, 1, 1.6, 2.2, 2.8}, .draft_step = {0.05}};
    check_case({.gamma = 3, .sampling = {.temperature = 1.0f}, .policy = specdec::gamma_policy::adaptive, .seed = 35,
                .profile = profile});
}

namespace {

/// Tokens per sequence in the draining batch cases: long enough for each sequence's own
/// acceptance estimate to count (ragged plans shrink it with 8 pseudo-observations of the
/// batch's); the test reads the last kLength of them.
constexpr int kDrainLength = 24;

/// A CPU-like profile: a pass of m positions costs 0.5 + per_position · m, a draft call `draft`.
specdec::engine_profile linear_profile(double per_position, double draft) {
    specdec::engine_profile profile{.draft_step = {draft}};
    for (std::size_t m = 1; m <= 32; ++m) profile.target_pass.push_back(0.5 + per_position * static_cast<double>(m));
    return profile;
}

/// The draining tree cases' engine: a position costs 0.1, a draft call 0.01 (the tree planner
/// mostly plans chains here, which run as chain steps, and trees now and then).
const specdec::engine_profile kTreeDrainProfile = linear_profile(0.1, 0.01);

/// Steps the drain rule made plain, over a draining case's controllers; tree_steps: those
/// whose plan was a tree (not a chain).
struct drain_counts {
    std::size_t steps = 0, tree_steps = 0;
    void add(const specdec::gamma_controller& c) {
        steps += c.drained_steps();
        tree_steps += c.drained_tree_steps();
    }
};

/// The draining batch cases: 3 sequences of kDrainLength tokens (the third joining after the
/// first step), the adaptive policy planning from `profile` (a CPU-like one: a pass's positions
/// cost) with a controller kept for 250 batches: chains of up to 3 with ragged plans, or, for a
/// tree_verification_scheme, the tree planner within 2,1,1. Returns, per sequence, the test of
/// its last kLength tokens against their exact law (exact_window_distribution); adds the steps
/// the drain rule made plain to `drained`, and counts rejections per draft position or tree
/// depth in `rejected_at`.
template <class D, class V, class Scheme>
std::vector<gof_result> run_drain_case(const markov_model& target, D& drafter, V& verifier, Scheme scheme,
                                       const specdec::engine_profile& profile, std::uint64_t seed, std::size_t samples,
                                       drain_counts& drained, std::vector<std::size_t>& rejected_at) {
    const specdec::sampling_config sampling{.temperature = 1.0f};
    specdec::decode_options o{.length = {.policy = specdec::gamma_policy::adaptive},
                              .sampling = sampling,
                              .budget = {.max_new_tokens = kDrainLength}};
    if constexpr (std::is_same_v<Scheme, specdec::tree_verification_scheme>)
        o.step = specdec::tree{.shape = {.branching = {2, 1, 1}}, .scheme = scheme};
    else
        o.step = specdec::chain{.gamma = 3, .scheme = scheme};
    o.length.adaptive.profile = profile;
    rejected_at.assign(3, 0);
    o.on_step = [&](const specdec::step_event& e) {
        const std::size_t drafted = e.tree ? static_cast<std::size_t>(e.tree->max_depth()) : e.draft.size();
        if (e.accepted < drafted) ++rejected_at[e.accepted];
    };
    std::optional<specdec::gamma_controller> own;
    using decoder = decltype(specdec::batch_decoder(drafter, verifier, o));
    std::optional<decoder> dec;
    const int vocab = target.vocab;
    std::vector<std::vector<std::size_t>> counts(kPrompts.size());
    std::vector<std::vector<double>> exact;
    for (std::size_t k = 0; k < kPrompts.size(); ++k) {
        exact.push_back(exact_window_distribution(target, kPrompts[k], kDrainLength, kLength, sampling));
        counts[k].assign(exact[k].size(), 0);
    }
    std::mt19937_64 master(seed);
    std::vector<std::size_t> ids(kPrompts.size());
    for (std::size_t s = 0; s < samples; ++s) {
        if (s % 250 == 0) {
            if (own) drained.add(*own);
            own.emplace(specdec::make_controller(o));
            o.length.controller = &*own;
            dec.emplace(drafter, verifier, o);
        }
        ids[0] = dec->add(kPrompts[0], std::mt19937_64(master()));
        ids[1] = dec->add(kPrompts[1], std::mt19937_64(master()));
        dec->step();
        ids[2] = dec->add(kPrompts[2], std::mt19937_64(master()));  // joins a running batch
        dec->run();
        for (std::size_t k = 0; k < kPrompts.size(); ++k) {
            const auto r = dec->take(ids[k]);
            REQUIRE(r.tokens.size() == static_cast<std::size_t>(kDrainLength));
            ++counts[k][encode(std::span(r.tokens).last(static_cast<std::size_t>(kLength)), vocab)];
        }
    }
    if (own) drained.add(*own);
    std::vector<gof_result> out;
    for (std::size_t k = 0; k < kPrompts.size(); ++k) out.push_back(chi_square_test(counts[k], exact[k]));
    return out;
}

/// A draft that disagrees with `target`: its logits negated (an acceptance of about 0.3).
markov_model poor_draft(const markov_model& target) {
    markov_model m = target;
    for (auto& x : m.table) x = -x;
    return m;
}

/// The first two prompts' sequences drafted by the target itself (every draft accepted), the
/// third (the one that joins late) by the draft model: sequences whose acceptance differs, as
/// the drain rule weighs it.
struct prompt_split_drafter {
    multi_markov_drafter exact, other;
    std::ptrdiff_t vocab_size() const { return other.vocab_size(); }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& s) {
        for (auto& r : batch) (r.context.front() != kPrompts[2].front() ? exact : other).draft_batch(std::span(&r, 1), s);
    }
};

/// The target's table plus noise (N(0, 1) per logit): a draft accepted about half the time.
markov_model near_draft(const markov_model& target) {
    markov_model m = target;
    std::mt19937_64 g(7);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    for (auto& x : m.table) x += noise(g);
    return m;
}

/// prompt_split_drafter that also drafts trees (next_logits, one parent at a time) from the
/// same split: `model` for the first two prompts, `other` for the third. Under the tree
/// planner, the plans that are chains run as chain steps for the batch (draft_batch).
struct split_chain_and_tree_drafter : chain_and_tree_drafter<prompt_split_drafter> {
    markov_model* other = nullptr;
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        ++tree_calls;
        return (context.front() != kPrompts[2].front() ? model : other)->next_logits(context);
    }
};

/// The verifier of the draining tree control: WRONG on purpose. It scores each tree after the
/// context without its last token (a cache one token behind); chain steps are scored right.
struct stale_tree_verifier : chain_and_tree_verifier {
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        trees.score_tree(context.first(context.size() - 1), tree, out);
    }
};

}  // namespace

TEST_CASE("Every sequence of a draining multi-sequence batch has the target's distribution when steps are made plain",
          "[statistical][batch][multi][adaptive][profile][drain]") {
    // Two sequences drafted perfectly, the late one poorly: whether plain steps finish the batch
    // sooner (adaptive_gamma_options::drain) turns on the sequences' own acceptance so far and
    // the tokens each still needs, so steps are made plain at changing points of a few batches.
    auto target = markov_model::random(4, 2, 21);
    auto draft = poor_draft(target);
    for (const auto scheme : kSchemes) {
        INFO(name(scheme));
        prompt_split_drafter drafter{{&target}, {&draft}};
        multi_markov_verifier verifier{&target};
        drain_counts drained;
        std::vector<std::size_t> rejected_at;
        const auto results =
            run_drain_case(target, drafter, verifier, scheme, linear_profile(0.3, 0.05), 39, samples_per_case(),
                           drained, rejected_at);
        INFO("steps made plain for the draining batch: " << drained.steps << " (" << drained.tree_steps
                                                         << " with a tree plan) in " << samples_per_case() << " batches");
        INFO("rejections at draft positions 1, 2, 3: " << rejected_at[0] << ", " << rejected_at[1] << ", " << rejected_at[2]);
        check_results(results, {});
        // The rule binds where speculation barely pays and the batch is uneven: here about 1,500
        // steps of 60,000 batches (the test's log), each changing how the rest of its batch runs.
        CHECK(drained.steps > samples_per_case() / 100);
        CHECK(rejected_at[0] > samples_per_case() / 100);  // steps speculate too
    }
}

TEST_CASE("Negative control: scoring against another sequence's context is detected in the last tokens of a draining "
          "batch",
          "[statistical][batch][multi][adaptive][drain][negative]") {
    auto target = markov_model::random(4, 2, 21);
    auto draft = poor_draft(target);
    prompt_split_drafter drafter{{&target}, {&draft}};
    wrong_slot_verifier verifier{{&target}};
    drain_counts drained;
    std::vector<std::size_t> rejected_at;
    const auto results = run_drain_case(target, drafter, verifier, specdec::verification_scheme::block,
                                        linear_profile(0.3, 0.05), 41, samples_per_case(), drained, rejected_at);
    check_caught(results, 1);
}

TEST_CASE("Every sequence of a draining batch of planned token trees has the target's distribution when steps are "
          "made plain",
          "[statistical][batch][tree][adaptive][profile][drain]") {
    // The tree planner within 2,1,1 on a CPU-like engine, the first two prompts drafted by a
    // draft accepted about half the time, the late one poorly: whether plain steps finish the
    // batch sooner turns on each sequence's own acceptance by sibling rank and the tokens it
    // still needs (for the chains the planner plans too: a chain is a tree of one child per
    // node). Trees are drafted now and then (about 0.2 drafting calls per batch).
    auto target = markov_model::random(4, 2, 21);
    auto draft = poor_draft(target);
    auto near = near_draft(target);
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        split_chain_and_tree_drafter drafter{{{{&near}, {&draft}}, &near}, &draft};
        chain_and_tree_verifier verifier{multi_markov_verifier{&target}, tree_markov{&target}};
        drain_counts drained;
        std::vector<std::size_t> rejected_at;
        const auto results = run_drain_case(target, drafter, verifier, scheme, kTreeDrainProfile, 43,
                                            samples_per_case(), drained, rejected_at);
        INFO("steps made plain for the draining batch: " << drained.steps << " (" << drained.tree_steps
                                                         << " with a tree plan) in " << samples_per_case() << " batches");
        INFO("tree drafting calls: " << drafter.tree_calls << "; chain steps' draft_batch calls: "
                                     << drafter.chains.exact.calls + drafter.chains.other.calls);
        INFO("rejections at depths 1, 2, 3: " << rejected_at[0] << ", " << rejected_at[1] << ", " << rejected_at[2]);
        check_results(results, {});
        CHECK(drained.steps > samples_per_case() / 100);
        CHECK(drafter.tree_calls > samples_per_case() / 20);  // trees are drafted, not only chains
        // The steps made plain here had chain plans (the log: 0 of about 43,000 with a tree
        // plan, and none either with a position at 0.03, 0.06 or 0.08): a tree pays where a
        // position is cheap, draining where it is not. Exactness does not depend on which plan
        // a plain step replaced (the rule reads the past only); the rule's tree path (each
        // sequence's own tree tokens, trees cut at the tokens left) is checked at exact values
        // in engine_profile_test.cpp.
    }
}

TEST_CASE("Negative control: trees scored after a stale context are detected in the last tokens of a draining batch "
          "of planned token trees",
          "[statistical][batch][tree][adaptive][drain][negative]") {
    // Only the tree steps are wrong. The two sequences drafted about half right get trees
    // planned now and then, and must be caught (the run's log: p of about 1e-17 and 1e-181);
    // the poorly drafted one mostly runs chains and plain steps, and is not tested here.
    auto target = markov_model::random(4, 2, 21);
    auto draft = poor_draft(target);
    auto near = near_draft(target);
    split_chain_and_tree_drafter drafter{{{{&near}, {&draft}}, &near}, &draft};
    stale_tree_verifier verifier{{multi_markov_verifier{&target}, tree_markov{&target}}};
    drain_counts drained;
    std::vector<std::size_t> rejected_at;
    auto results = run_drain_case(target, drafter, verifier, specdec::tree_verification_scheme::traversal,
                                  kTreeDrainProfile, 44, samples_per_case(), drained, rejected_at);
    results.pop_back();
    check_caught(results, 0);
}

TEST_CASE("Every sequence of a multi-sequence batch has the target's distribution with draft-side sampling",
          "[statistical][batch][multi][draft_sampling]") {
    // The draft samples at another temperature and top-k than the target (q of zero mass on
    // one token of four); verification takes q from the distributions actually sampled.
    check_case({.gamma = 3,
                .sampling = {.temperature = 0.9f},
                .seed = 35,
                .draft_sampling = specdec::sampling_config{.temperature = 1.6f, .top_k = 3}});
}

TEST_CASE("Every sequence of a multi-sequence batch has the target's distribution with the draft-side stop and a "
          "caller's controller kept across decoders",
          "[statistical][batch][multi][adaptive][stop]") {
    // Blocks end after a draft token of q below 0.3 (where they end depends on draft values
    // only); the caller's controller plans every decoder's steps from the estimates of the
    // earlier ones.
    check_case({.gamma = 3,
                .sampling = {.temperature = 1.0f},
                .policy = specdec::gamma_policy::adaptive,
                .seed = 40,
                .stop_below = 0.3f,
                .own_controller = true});
}

TEST_CASE("Every sequence of a batch of token trees has the target's distribution", "[statistical][batch][tree]") {
    check_case({.sampling = {.temperature = 1.0f}, .seed = 36, .tree = specdec::tree_shape{.branching = {2, 1, 1}}});
}

TEST_CASE("Every sequence of a batch of token trees has the target's distribution with draft-side sampling and the "
          "adaptive depth",
          "[statistical][batch][tree][draft_sampling][adaptive]") {
    check_case({.sampling = {.temperature = 0.8f},
                .policy = specdec::gamma_policy::adaptive,
                .seed = 39,
                .draft_sampling = specdec::sampling_config{.temperature = 1.5f, .top_k = 3},
                .tree = specdec::tree_shape{.branching = {2, 2, 1}}});
}

TEST_CASE("Every sequence of a batch of token trees has the target's distribution with the draft-side stop and a "
          "caller's tree planner kept across decoders",
          "[statistical][batch][tree][adaptive][stop]") {
    check_case({.sampling = {.temperature = 1.0f},
                .policy = specdec::gamma_policy::adaptive,
                .seed = 41,
                .tree = specdec::tree_shape{.branching = {2, 2, 1}},
                .stop_below = 0.3f,
                .own_controller = true});
}

TEST_CASE("Every sequence of a batch of planned token trees has the target's distribution when the steps planned as "
          "chains run as chain steps drafted for the whole batch in one call",
          "[statistical][batch][tree][adaptive][profile]") {
    // The tree planner within 2,1,1, from a profile whose pass is flat up to 6 positions: chains
    // for the batch (draft_batch), trees now and then (next_logits per parent), with draft-side
    // sampling; the case fails unless both kinds of plan were drafted.
    auto target = markov_model::random(4, 2, 21);
    auto draft = markov_model::random(4, 2, 22);
    const batch_case c{.sampling = {.temperature = 1.0f},
                       .policy = specdec::gamma_policy::adaptive,
                       .seed = 42,
                       .draft_sampling = specdec::sampling_config{.temperature = 1.4f},
                       .tree = specdec::tree_shape{.branching = {2, 1, 1}},
                       .profile = specdec::engine_profile{.target_pass = {1, 1, 1, 1, 1, 1, 1.6, 2.2, 2.8},
                                                          .draft_step = {0.05}}};
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        chain_and_tree_drafter<multi_markov_drafter> drafter{multi_markov_drafter{&draft}, &draft};
        chain_and_tree_verifier verifier{multi_markov_verifier{&target}, tree_markov{&target}};
        std::vector<std::size_t> rejected_at;
        const auto results = run_case(target, drafter, verifier, c, scheme, samples_per_case(), rejected_at);
        CHECK(drafter.chains.calls > 0);
        CHECK(drafter.tree_calls > 0);
        for (std::size_t k = 0; k < results.size(); ++k) {
            INFO("sequence " << k << ": " << describe(results[k]));
            CHECK(results[k].p_value >= kFalseAlarm);
        }
    }
}

TEST_CASE("Negative control: a wrong q in the steps a tree planner runs as chains for the batch is detected",
          "[statistical][batch][tree][adaptive][negative]") {
    if (samples_per_case() < 60000) return;
    auto target = markov_model::random(4, 2, 21);
    auto draft = markov_model::random(4, 2, 22);
    // Within 1,1,1 every plan is a chain or a plain step: every draft goes through draft_batch.
    const batch_case c{.sampling = {.temperature = 0.9f},
                       .policy = specdec::gamma_policy::adaptive,
                       .seed = 43,
                       .draft_sampling = specdec::sampling_config{.temperature = 1.6f, .top_k = 3},
                       .tree = specdec::tree_shape{.branching = {1, 1, 1}},
                       .profile = specdec::engine_profile{.target_pass = {1, 1, 1, 1, 1, 1, 1.6, 2.2, 2.8},
                                                          .draft_step = {0.05}}};
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        chain_and_tree_drafter<wrong_q_drafter> drafter{wrong_q_drafter{multi_markov_drafter{&draft}, c.sampling},
                                                        &draft};
        chain_and_tree_verifier verifier{multi_markov_verifier{&target}, tree_markov{&target}};
        std::vector<std::size_t> rejected_at;
        check_caught(run_case(target, drafter, verifier, c, scheme, 60000, rejected_at), 0);
        CHECK(drafter.tree_calls == 0);
    }
}

TEST_CASE("Negative control: scoring against another sequence's context is detected", "[statistical][batch][multi]") {
    if (samples_per_case() < 60000) return;  // reduced suites lack the power (as distribution_test.cpp)
    const auto target = markov_model::random(4, 2, 21);
    const auto draft = markov_model::random(4, 2, 22);
    for (const auto scheme : kSchemes) {
        INFO(name(scheme));
        multi_markov_drafter drafter{&draft};
        wrong_slot_verifier verifier{multi_markov_verifier{&target}};
        std::vector<std::size_t> rejected_at;
        const auto results = run_case(target, drafter, verifier, {.gamma = 3, .seed = 34}, scheme, 60000, rejected_at);
        // Sequence 0 is scored against its own context; the others must be caught.
        check_caught(results, 1);
    }
}

TEST_CASE("Negative control: draft-side sampling verified against the q of the target's settings is detected",
          "[statistical][batch][multi][draft_sampling][negative]") {
    if (samples_per_case() < 60000) return;
    const auto target = markov_model::random(4, 2, 21);
    const auto draft = markov_model::random(4, 2, 22);
    const batch_case c{.gamma = 3,
                       .sampling = {.temperature = 0.9f},
                       .seed = 37,
                       .draft_sampling = specdec::sampling_config{.temperature = 1.6f, .top_k = 3}};
    for (const auto scheme : kSchemes) {
        INFO(name(scheme));
        wrong_q_drafter drafter{multi_markov_drafter{&draft}, c.sampling};
        multi_markov_verifier verifier{&target};
        std::vector<std::size_t> rejected_at;
        check_caught(run_case(target, drafter, verifier, c, scheme, 60000, rejected_at), 0);
    }
}

TEST_CASE("Negative control: a tree drafter that reports a wrong q is detected in a batch",
          "[statistical][batch][tree][negative]") {
    if (samples_per_case() < 60000) return;
    auto target = markov_model::random(4, 2, 21);
    auto draft = markov_model::random(4, 2, 22);
    const batch_case c{.sampling = {.temperature = 1.0f}, .seed = 38, .tree = specdec::tree_shape{.branching = {2, 1, 1}}};
    for (const auto scheme : kTreeSchemes) {
        INFO(name(scheme));
        uniform_q_tree_drafter drafter{&draft};
        tree_markov verifier{&target};
        std::vector<std::size_t> rejected_at;
        check_caught(run_case(target, drafter, verifier, c, scheme, 60000, rejected_at), 0);
    }
}
