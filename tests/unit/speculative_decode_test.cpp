#include "support/catch.hpp"
#include "support/markov.hpp"

#include <specdec/speculative_decode.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {

/// A point-mass drafter that always proposes the same token.
struct constant_drafter {
    int vocab;
    token_id token;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void draft(std::span<const token_id>, std::size_t gamma, const specdec::sampling_config&, specdec::uniform_source&,
               specdec::draft_block& out) const {
        out.tokens.assign(gamma, token);
        out.probs.resize(0, 0);
    }
};

/// A drafter built so that every draft token is accepted with probability exactly alpha:
/// the target never emits token `z`, and the draft is q = alpha p + (1 - alpha) delta_z, so
/// min(p, q) sums to alpha in every context, tokens other than z are always accepted
/// (q <= p there) and z is always rejected (p(z) = 0).
struct alpha_drafter {
    markov_model* target;
    double alpha;
    token_id z;
    std::ptrdiff_t vocab_size() const { return target->vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        Eigen::VectorXf p(target->vocab);
        specdec::sampling_workspace ws;
        specdec::standardize(target->next_logits(context), {}, p, ws);
        Eigen::VectorXf logits = (p.array() * static_cast<float>(alpha)).log().matrix();
        logits[z] = static_cast<float>(std::log(1.0 - alpha));
        return logits;
    }
};

}  // namespace

TEST_CASE("At temperature 0 speculative decoding is token-identical to greedy decoding, for any drafter and gamma",
          "[decode][greedy]") {
    const int vocab = 16;
    auto target = markov_model::random(vocab, 2, 100);
    auto other = markov_model::random(vocab, 2, 200);
    auto close = target;  // a close draft: the target's table, perturbed
    {
        std::mt19937_64 g(5);
        std::normal_distribution<float> n(0.0f, 0.3f);
        for (auto& x : close.table) x += n(g);
    }
    const std::vector<token_id> prompt{1, 2, 3};
    const specdec::decode_options greedy{.sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 60}};
    std::mt19937_64 rng0(1);
    const auto baseline = specdec::autoregressive_decode(target, prompt, greedy, rng0).tokens;
    REQUIRE(baseline.size() == 60);
    shift_drafter shift{vocab, 1};
    constant_drafter constant{vocab, 7};
    batched_markov batched{&target};
    // Hierarchical drafting: the close draft sped up by the other model (at T = 0 its block is
    // the close draft's greedy continuation).
    specdec::hierarchical_drafter layered(other, close, {.gamma = 2});
    for (std::size_t gamma = 1; gamma <= 8; ++gamma) {
        INFO("gamma = " << gamma);
        auto opts = greedy;
        opts.step = specdec::chain{.gamma = gamma};
        std::mt19937_64 rng(gamma);
        CHECK(specdec::speculative_decode(other, target, prompt, opts, rng).tokens == baseline);
        CHECK(specdec::speculative_decode(close, target, prompt, opts, rng).tokens == baseline);
        CHECK(specdec::speculative_decode(target, target, prompt, opts, rng).tokens == baseline);
        CHECK(specdec::speculative_decode(shift, target, prompt, opts, rng).tokens == baseline);
        CHECK(specdec::speculative_decode(constant, batched, prompt, opts, rng).tokens == baseline);
        CHECK(specdec::speculative_decode(layered, target, prompt, opts, rng).tokens == baseline);
    }
}

TEST_CASE("At temperature 0 every composition of the one engine is token-identical to greedy decoding",
          "[decode][greedy][compose]") {
    // Chains of every length (0: plain target steps), trees under both schemes, the adaptive
    // length (known costs) for chains and trees, with a caller's controller kept across the
    // calls and decoders, and planned from an engine profile, draft-side sampling at another
    // temperature, the draft-side stop, lenience (token verification), and several sequences in
    // one batch_decoder: at T = 0 the target's distribution is a point mass (lenience included:
    // a token p gives no mass is never accepted, and the residual is p's point mass), so each
    // must reproduce greedy decoding token for token.
    const int vocab = 16;
    auto target = markov_model::random(vocab, 2, 100);
    auto close = target;
    {
        std::mt19937_64 g(9);
        std::normal_distribution<float> n(0.0f, 0.5f);
        for (auto& x : close.table) x += n(g);
    }
    const std::vector<token_id> prompt{1, 2, 3};
    const specdec::decode_options greedy{.sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 50}};
    std::mt19937_64 rng0(1);
    const auto baseline = specdec::autoregressive_decode(target, prompt, greedy, rng0).tokens;
    REQUIRE(baseline.size() == 50);
    const specdec::adaptive_gamma_options known{.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); },
                                                .pass_cost = [](std::size_t) { return 1.0; }};
    std::vector<specdec::step_shape> shapes{specdec::chain{.gamma = 0}, specdec::chain{.gamma = 1},
                                            specdec::chain{.gamma = 5, .scheme = specdec::verification_scheme::token}};
    for (auto scheme : {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection})
        for (auto branching : {std::vector<std::size_t>{1}, std::vector<std::size_t>{2, 1}, std::vector<std::size_t>{3, 2, 1}})
            for (auto draws : {specdec::sibling_draws::iid, specdec::sibling_draws::without_replacement})
                shapes.push_back(specdec::tree{.shape = {.branching = branching, .draws = draws}, .scheme = scheme});
    // A pass flat to 4 positions, then steeper (a profile that plans several lengths).
    const specdec::engine_profile profile{.target_pass = {1, 1, 1, 1, 1.5, 2.0, 2.5}, .draft_step = {0.1}};
    std::uint64_t seed = 0;
    for (const auto& shape : shapes) {
        const bool is_tree = std::holds_alternative<specdec::tree>(shape);
        const bool adaptive_ok = is_tree || std::get<specdec::chain>(shape).gamma > 0;
        // A controller of the caller's, kept across every call and decoder of this shape.
        std::optional<specdec::gamma_controller> own;
        if (adaptive_ok) {
            specdec::decode_options adaptive = greedy;
            adaptive.step = shape;
            adaptive.length = {.policy = specdec::gamma_policy::adaptive, .adaptive = known};
            own.emplace(specdec::make_controller(adaptive));
        }
        for (int variant = 0; variant < 7; ++variant) {
            INFO("shape " << shape.index() << " " << (is_tree ? std::get<specdec::tree>(shape).shape.depth() : std::get<specdec::chain>(shape).gamma)
                          << ", variant " << variant);
            specdec::decode_options opts = greedy;
            opts.step = shape;
            if (variant == 1) opts.draft.sampling = specdec::sampling_config{.temperature = 1.0f};
            if (variant == 2) opts.draft = {.sampling = specdec::sampling_config{.temperature = 0.8f}, .stop_below = 0.3f};
            if (variant >= 3 && variant <= 5 && !adaptive_ok) continue;
            if (variant == 3) opts.length = {.policy = specdec::gamma_policy::adaptive, .adaptive = known};
            if (variant == 4) opts.length = {.policy = specdec::gamma_policy::adaptive, .controller = &*own};
            if (variant == 5)
                opts.length = {.policy = specdec::gamma_policy::adaptive, .adaptive = {.profile = profile}};
            if (variant == 6) {
                if (is_tree || std::get<specdec::chain>(shape).scheme != specdec::verification_scheme::token) continue;
                std::get<specdec::chain>(opts.step).lenience = 0.5f;
            }
            std::mt19937_64 rng(++seed);
            CHECK(specdec::speculative_decode(close, target, prompt, opts, rng).tokens == baseline);
            // Three sequences in one decoder, one joining after the first step.
            specdec::batch_decoder dec(close, target, opts);
            const auto a = dec.add(prompt, std::mt19937_64(seed + 100));
            const auto b = dec.add(prompt, std::mt19937_64(seed + 200), {.max_new_tokens = 20});
            (void)dec.step();
            const auto c = dec.add(prompt, std::mt19937_64(seed + 300));
            dec.run();
            CHECK(dec.take(a).tokens == baseline);
            CHECK(dec.take(b).tokens == std::vector<token_id>(baseline.begin(), baseline.begin() + 20));
            CHECK(dec.take(c).tokens == baseline);
        }
    }
}

TEST_CASE("Eq. 1: with acceptance exactly alpha per position, mean tokens per step is (1 - a^(g+1))/(1 - a)",
          "[decode][statistical]") {
    // Tokens per step T = min(G, gamma) + 1 with G geometric; its exact mean and variance
    // give the tolerance: 5 standard errors, a false alarm below 6e-7 per case (16 cases).
    auto target = markov_model::random(6, 2, 77);
    const token_id z = 5;
    target.forbid(z);
    constexpr std::size_t steps = 20000;
    for (double alpha : {0.6, 0.7, 0.8, 0.9}) {
        for (std::size_t gamma : {2u, 3u, 5u, 7u}) {
            alpha_drafter drafter{&target, alpha, z};
            std::vector<token_id> seq{0};
            specdec::decode_stats stats;
            specdec::step_workspace ws;
            std::mt19937_64 rng(static_cast<std::uint64_t>(alpha * 100) * 31 + gamma);
            for (std::size_t s = 0; s < steps; ++s) {
                specdec::speculative_step(drafter, target, seq, stats, {.gamma = gamma}, rng, ws);
                if (seq.size() > 64) seq.erase(seq.begin(), seq.end() - 2);  // the model reads two tokens back
            }
            double mean = 0.0, second = 0.0;
            for (std::size_t k = 0; k <= gamma; ++k) {
                const double pk = k < gamma ? std::pow(alpha, static_cast<double>(k)) * (1.0 - alpha)
                                            : std::pow(alpha, static_cast<double>(gamma));
                mean += pk * static_cast<double>(k + 1);
                second += pk * static_cast<double>((k + 1) * (k + 1));
            }
            const double eq1 = specdec::expected_tokens_per_step(alpha, gamma);
            REQUIRE(mean == Approx(eq1));
            const double se = std::sqrt((second - mean * mean) / steps);
            INFO("alpha = " << alpha << ", gamma = " << gamma << ": measured " << stats.tokens_per_step()
                            << ", Eq. 1 " << eq1 << ", se " << se);
            CHECK(std::abs(stats.tokens_per_step() - eq1) < 5.0 * se);
            // The empirical acceptance rate estimates alpha (within 5 standard errors).
            const double tested = static_cast<double>(stats.accepted_tokens + stats.rejected_tokens);
            CHECK(std::abs(stats.acceptance_rate() - alpha) < 5.0 * std::sqrt(alpha * (1 - alpha) / tested));
        }
    }
}

TEST_CASE("The same seed gives the same output, different seeds give different outputs", "[decode]") {
    auto target = markov_model::random(16, 2, 3);
    auto draft = markov_model::random(16, 2, 4);
    const std::vector<token_id> prompt{0};
    const specdec::decode_options opts{.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = 64}};
    std::mt19937_64 a(42), b(42), c(43);
    const auto ra = specdec::speculative_decode(draft, target, prompt, opts, a);
    const auto rb = specdec::speculative_decode(draft, target, prompt, opts, b);
    const auto rc = specdec::speculative_decode(draft, target, prompt, opts, c);
    CHECK(ra.tokens == rb.tokens);
    CHECK(ra.stats.accepted_tokens == rb.stats.accepted_tokens);
    // 64 tokens from 16 with per-token entropy well above 1 bit: a collision has
    // probability far below 1e-10.
    CHECK(ra.tokens != rc.tokens);
}

TEST_CASE("Exactly max_new_tokens tokens are returned, and no draft work is wasted at the end", "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = target;
    const std::vector<token_id> prompt{0};
    for (std::size_t n : {1u, 2u, 5u, 17u}) {
        std::mt19937_64 rng(n);
        const auto r = specdec::speculative_decode(draft, target, prompt, {.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = n}}, rng);
        CHECK(r.tokens.size() == n);
        CHECK(r.stop == specdec::stop_reason::max_new_tokens);
        // Draft equal to target accepts everything, so every drafted token is used.
        CHECK(r.stats.accepted_tokens + r.stats.steps == n);
    }
    std::mt19937_64 rng(1);
    CHECK(specdec::speculative_decode(draft, target, prompt, {.budget = {.max_new_tokens = 0}}, rng).tokens.empty());
}

TEST_CASE("A stop token ends the run and is included", "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 9);
    const std::vector<token_id> prompt{0};
    std::size_t stopped = 0;
    for (std::uint64_t seed = 0; seed < 50; ++seed) {
        std::mt19937_64 a(seed), b(seed);
        const specdec::decode_options opts{.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 40, .stop_tokens = {5}}};
        const auto r = specdec::speculative_decode(draft, target, prompt, opts, a);
        const auto full =
            specdec::speculative_decode(draft, target, prompt, {.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 40}}, b).tokens;
        const auto first = std::find(full.begin(), full.end(), 5);
        if (first == full.end()) {
            CHECK(r.stop == specdec::stop_reason::max_new_tokens);
            CHECK(r.tokens == full);
        } else {
            ++stopped;
            CHECK(r.stop == specdec::stop_reason::stop_token);
            CHECK(r.tokens == std::vector<token_id>(full.begin(), first + 1));
        }
    }
    CHECK(stopped > 0);
}

TEST_CASE("The per-step callback streams exactly the generated tokens", "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 9);
    const std::vector<token_id> prompt{0};
    std::vector<token_id> streamed;
    std::size_t steps = 0, accepted = 0;
    specdec::decode_options opts{.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 30}};
    opts.on_step = [&](const specdec::step_event& e) {
        ++steps;
        accepted += e.accepted;
        CHECK(e.emitted.size() == e.accepted + 1);
        CHECK(e.emitted.back() == e.next_token);
        for (std::size_t i = 0; i < e.accepted; ++i) CHECK(e.emitted[i] == e.draft[i]);
        streamed.insert(streamed.end(), e.emitted.begin(), e.emitted.end());
    };
    std::mt19937_64 rng(8);
    const auto r = specdec::speculative_decode(draft, target, prompt, opts, rng);
    CHECK(streamed == r.tokens);
    CHECK(steps == r.stats.steps);
    CHECK(accepted == r.stats.accepted_tokens);
}

TEST_CASE("Autoregressive decoding samples with one uniform per token from the standardized distribution",
          "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    const std::vector<token_id> prompt{0};
    std::mt19937_64 a(5), b(5);
    const auto r = specdec::autoregressive_decode(target, prompt, {.budget = {.max_new_tokens = 20}}, a);
    std::vector<token_id> seq = prompt;
    for (std::size_t i = 0; i < 20; ++i) {
        const auto p = ref_standardize(target.next_logits(seq), {});
        double acc = 0.0;
        const double u = specdec::uniform01(b);
        std::size_t t = 0;
        for (; t < p.size(); ++t) {
            acc += p[t];
            if (acc > u) break;
        }
        seq.push_back(static_cast<token_id>(std::min(t, p.size() - 1)));
    }
    CHECK(r.tokens == std::vector<token_id>(seq.begin() + 1, seq.end()));
    CHECK(r.stats.target_calls == 20);
}

TEST_CASE("speculative_decode validates its options before any model call", "[decode][errors]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 4);
    const std::vector<token_id> prompt{0};
    std::mt19937_64 rng(1);
    CHECK_THROWS_WITH(specdec::speculative_decode(
                          draft, target, prompt,
                          {.step = specdec::chain{.gamma = 0}, .length = {.policy = specdec::gamma_policy::adaptive}}, rng),
                      contains("specdec::speculative_decode: step.gamma = 0 with the adaptive policy"));
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt,
                                                  {.step = specdec::tree{.shape = {.branching = {}}}}, rng),
                      contains("specdec::speculative_decode: options.step is a tree whose shape.branching has depth 0"));
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt, {.draft = {.stop_below = 2.0f}}, rng),
                      contains("draft.stop_below = 2"));
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt, {.sampling = {.temperature = -1.0f}}, rng),
                      contains("temperature"));
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt, {.sampling = {.top_p = 2.0f}}, rng),
                      contains("top_p"));
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt, {.step = specdec::chain{.lenience = 0.0f}}, rng), contains("lenience"));
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt, {.budget = {.stop_tokens = {8}}}, rng),
                      contains("budget.stop_tokens[0] = 8"));
    auto small = markov_model::random(4, 2, 5);
    CHECK_THROWS_WITH(specdec::speculative_decode(small, target, prompt, {}, rng), contains("vocab_size"));
    // A prompt token out of range is caught before any model sees it.
    const std::vector<token_id> bad_prompt{0, 3, 8};
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, bad_prompt, {}, rng),
                      contains("speculative_decode: prompt[2] = 8 is out of range [0, vocab_size = 8)"));
    CHECK_THROWS_WITH(specdec::autoregressive_decode(target, std::vector<token_id>{-1}, {}, rng),
                      contains("autoregressive_decode: prompt[0] = -1 is out of range"));
    CHECK(target.calls == 0);
    CHECK(draft.calls == 0);
}

TEST_CASE("A huge token budget ended by a stop token does not allocate the budget", "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 4);
    const std::vector<token_id> prompt{0};
    // Every token stops the run, so one step is taken; reserving 2^40 tokens up front would
    // throw std::bad_alloc (or abort under a sanitizer).
    specdec::decode_options opts{.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = std::size_t{1} << 40, .stop_tokens = {}}};
    for (token_id t = 0; t < 8; ++t) opts.budget.stop_tokens.push_back(t);
    std::mt19937_64 a(1), b(1);
    const auto r = specdec::speculative_decode(draft, target, prompt, opts, a);
    CHECK(r.stop == specdec::stop_reason::stop_token);
    CHECK(r.tokens.size() == 1);
    const auto base = specdec::autoregressive_decode(target, prompt, opts, b);
    CHECK(base.stop == specdec::stop_reason::stop_token);
    CHECK(base.tokens.size() == 1);
}

namespace {

/// A point-mass BlockDrafter that records the sampling settings it is given and proposes γ
/// copies of token 1; it reports its model calls when `report` is set.
struct recording_drafter {
    int vocab;
    std::optional<std::size_t> report;
    std::vector<specdec::sampling_config> seen;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void draft(std::span<const token_id>, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source&, specdec::draft_block& out) {
        seen.push_back(s);
        out.tokens.assign(gamma, 1);
        if (report) out.model_calls = *report;
    }
};

bool same_settings(const specdec::sampling_config& a, const specdec::sampling_config& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p;
}

}  // namespace

TEST_CASE("A braced prompt works as a prompt span", "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 4);
    const std::vector<token_id> prompt{0, 3, 5};
    std::mt19937_64 a(7), b(7);
    const auto braced = specdec::speculative_decode(draft, target, {0, 3, 5}, {.budget = {.max_new_tokens = 12}}, a);
    const auto spanned = specdec::speculative_decode(draft, target, prompt, {.budget = {.max_new_tokens = 12}}, b);
    CHECK(braced.tokens == spanned.tokens);
    const auto base_braced = specdec::autoregressive_decode(target, {0, 3, 5}, {.budget = {.max_new_tokens = 5}}, a);
    const auto base_spanned = specdec::autoregressive_decode(target, prompt, {.budget = {.max_new_tokens = 5}}, b);
    CHECK(base_braced.tokens == base_spanned.tokens);
}

TEST_CASE("An empty prompt is rejected before any model call", "[decode][errors]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 4);
    std::mt19937_64 rng(1);
    const std::vector<token_id> empty;
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, empty, {}, rng),
                      contains("specdec::speculative_decode: the prompt is empty"));
    CHECK_THROWS_AS(specdec::speculative_decode(draft, target, {}, {}, rng), std::invalid_argument);
    CHECK_THROWS_WITH(specdec::autoregressive_decode(target, empty, {}, rng),
                      contains("specdec::autoregressive_decode: the prompt is empty"));
    std::vector<token_id> sequence;
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    CHECK_THROWS_WITH(specdec::speculative_step(draft, target, sequence, stats, {}, rng, ws),
                      contains("specdec::speculative_step: sequence is empty"));
    CHECK(target.calls == 0);
    CHECK(draft.calls == 0);
}

TEST_CASE("The draft samples with draft_sampling when it is set, with the target's settings otherwise", "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    const std::vector<token_id> prompt{0};
    const specdec::sampling_config target_settings{.temperature = 0.7f, .top_k = 5};
    const specdec::sampling_config draft_settings{.temperature = 1.3f, .top_p = 0.8f};
    std::mt19937_64 rng(3);
    recording_drafter d{8, {}, {}};
    (void)specdec::speculative_decode(d, target, prompt, {.sampling = target_settings, .budget = {.max_new_tokens = 10}}, rng);
    REQUIRE(!d.seen.empty());
    for (const auto& s : d.seen) CHECK(same_settings(s, target_settings));
    d.seen.clear();
    (void)specdec::speculative_decode(
        d, target, prompt, {.sampling = target_settings, .draft = {.sampling = draft_settings}, .budget = {.max_new_tokens = 10}}, rng);
    REQUIRE(!d.seen.empty());
    for (const auto& s : d.seen) CHECK(same_settings(s, draft_settings));
    // speculative_step passes step_options::draft_sampling the same way.
    d.seen.clear();
    std::vector<token_id> sequence{0};
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    (void)specdec::speculative_step(d, target, sequence, stats,
                                    {.sampling = target_settings, .draft_sampling = draft_settings}, rng, ws);
    REQUIRE(d.seen.size() == 1);
    CHECK(same_settings(d.seen[0], draft_settings));
}

TEST_CASE("A plain draft model proposes from its distribution under draft_sampling", "[decode]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 4);
    const std::vector<token_id> prompt{0};
    // A greedy draft under a sampling target: each step's first draft token is the draft's
    // argmax after the context (later ones too, but the first is easy to check).
    std::vector<token_id> sequence = prompt;
    std::size_t checked = 0;
    specdec::decode_options opts{.step = specdec::chain{.gamma = 3}, .draft = {.sampling = specdec::sampling_config{.temperature = 0.0f}}, .budget = {.max_new_tokens = 40}};
    opts.on_step = [&](const specdec::step_event& e) {
        if (!e.draft.empty()) {
            auto copy = draft;
            const Eigen::VectorXf z = copy.next_logits(sequence);
            Eigen::Index best;
            z.maxCoeff(&best);
            CHECK(e.draft[0] == static_cast<token_id>(best));
            ++checked;
        }
        sequence.insert(sequence.end(), e.emitted.begin(), e.emitted.end());
    };
    std::mt19937_64 rng(11);
    const auto r = specdec::speculative_decode(draft, target, prompt, opts, rng);
    CHECK(checked > 5);
    CHECK(r.stats.rejected_tokens > 0);  // the target still samples: some greedy drafts fail
    // Setting draft_sampling to the target's own settings changes nothing.
    std::mt19937_64 a(12), b(12);
    const auto unset = specdec::speculative_decode(draft, target, prompt, {.budget = {.max_new_tokens = 30}}, a);
    const auto same = specdec::speculative_decode(
        draft, target, prompt, {.draft = {.sampling = specdec::sampling_config{}}, .budget = {.max_new_tokens = 30}}, b);
    CHECK(unset.tokens == same.tokens);
}

TEST_CASE("Invalid draft_sampling is rejected, naming the field", "[decode][errors]") {
    auto target = markov_model::random(8, 2, 3);
    auto draft = markov_model::random(8, 2, 4);
    const std::vector<token_id> prompt{0};
    std::mt19937_64 rng(1);
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, target, prompt,
                                                  {.draft = {.sampling = specdec::sampling_config{.temperature = -1.0f}}},
                                                  rng),
                      contains("specdec::speculative_decode: draft.sampling.temperature = -1"));
    std::vector<token_id> sequence{0};
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    CHECK_THROWS_WITH(specdec::speculative_step(draft, target, sequence, stats,
                                                {.draft_sampling = specdec::sampling_config{.top_k = -3}}, rng, ws),
                      contains("specdec::speculative_step: draft_sampling.top_k = -3"));
    CHECK(target.calls == 0);
    CHECK(draft.calls == 0);
}

TEST_CASE("draft_calls counts reported model calls, else one per draft() that proposed tokens", "[decode][stats]") {
    auto target = markov_model::random(8, 2, 3);
    const std::vector<token_id> prompt{0};
    std::size_t proposing_steps = 0;
    specdec::decode_options opts{.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 25}};
    opts.on_step = [&](const specdec::step_event& e) { proposing_steps += !e.draft.empty(); };
    std::mt19937_64 rng(2);
    SECTION("a BlockDrafter that does not report: one call per block it proposed") {
        recording_drafter d{8, {}, {}};
        const auto r = specdec::speculative_decode(d, target, prompt, opts, rng);
        CHECK(proposing_steps > 0);
        CHECK(r.stats.draft_calls == proposing_steps);
        CHECK(r.stats.drafted_tokens > r.stats.draft_calls);
    }
    SECTION("a BlockDrafter that reports: what it reports") {
        recording_drafter d{8, std::size_t{5}, {}};
        const auto r = specdec::speculative_decode(d, target, prompt, opts, rng);
        CHECK(r.stats.draft_calls == 5 * proposing_steps);
    }
    SECTION("a BlockDrafter that reports 0 (no model): 0") {
        recording_drafter d{8, std::size_t{0}, {}};
        CHECK(specdec::speculative_decode(d, target, prompt, opts, rng).stats.draft_calls == 0);
        specdec::prompt_lookup_drafter lookup(8);
        CHECK(specdec::speculative_decode(lookup, target, {0, 1, 0, 1, 0}, opts, rng).stats.draft_calls == 0);
    }
    SECTION("a plain draft model: one call per draft token") {
        auto draft = markov_model::random(8, 2, 4);
        const auto r = specdec::speculative_decode(draft, target, prompt, opts, rng);
        CHECK(r.stats.draft_calls == r.stats.drafted_tokens);
        CHECK(r.stats.draft_calls == draft.calls);
    }
}

namespace {

/// A plain model whose next_logits returns logits of the wrong length after `good` calls.
struct short_logits_model {
    markov_model* model;
    std::size_t good;
    std::size_t calls = 0;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        Eigen::VectorXf v = model->next_logits(context);
        if (++calls > good) v.conservativeResize(v.size() - 1);
        return v;
    }
};

/// The tokens, statistics, stop reason, events and model calls of one run, for comparing two.
struct run_record {
    specdec::decode_result result;
    std::vector<token_id> event_tokens;
    std::size_t draft_model_calls = 0, target_model_calls = 0;
};

void check_same_run(const run_record& a, const run_record& b) {
    CHECK(a.result.tokens == b.result.tokens);
    CHECK(a.result.stop == b.result.stop);
    CHECK(a.result.stats.steps == b.result.stats.steps);
    CHECK(a.result.stats.target_calls == b.result.stats.target_calls);
    CHECK(a.result.stats.draft_calls == b.result.stats.draft_calls);
    CHECK(a.result.stats.drafted_tokens == b.result.stats.drafted_tokens);
    CHECK(a.result.stats.accepted_tokens == b.result.stats.accepted_tokens);
    CHECK(a.result.stats.steps_at_gamma == b.result.stats.steps_at_gamma);
    CHECK(a.result.stats.reached_at_sibling == b.result.stats.reached_at_sibling);
    CHECK(a.event_tokens == b.event_tokens);
    CHECK(a.draft_model_calls == b.draft_model_calls);
    CHECK(a.target_model_calls == b.target_model_calls);
}

}  // namespace

TEST_CASE("The loop compiled once for plain models (compiled mode) decodes exactly as the templated loop",
          "[decode][compiled]") {
    // Compiled mode runs speculative_decode and autoregressive_decode of two plain models through
    // detail::model_ref and detail::uniform_bits, in a loop the library compiles once. Here that
    // loop (decode_models_loop) runs beside the loop instantiated for the models themselves, at
    // T = 1 over chains, trees, the adaptive policy (known costs and a profile), draft-side
    // sampling and stop, stop tokens and the callback: the same seed must give the same tokens,
    // statistics, events and model calls. (In the compiled-mode test run, speculative_decode
    // itself already goes through the library's copy.)
    const int vocab = 12;
    const std::vector<token_id> prompt{1, 2, 3};
    const specdec::adaptive_gamma_options known{.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); },
                                                .pass_cost = [](std::size_t) { return 1.0; }};
    const specdec::engine_profile profile{.target_pass = {1, 1, 1, 1, 1.5, 2.0, 2.5}, .draft_step = {0.1}};
    const specdec::decode_options base{.budget = {.max_new_tokens = 60}};
    std::vector<specdec::decode_options> cases(7, base);
    cases[1].step = specdec::chain{.gamma = 2, .scheme = specdec::verification_scheme::token};
    cases[2].step = specdec::tree{.shape = {.branching = {3, 2, 1}}};
    cases[3].step = specdec::tree{.shape = {.branching = {2, 2}, .draws = specdec::sibling_draws::without_replacement}};
    cases[4].length = {.policy = specdec::gamma_policy::adaptive, .adaptive = known};
    cases[5].step = specdec::tree{.shape = {.branching = {2, 2, 1, 1}}};
    cases[5].length.policy = specdec::gamma_policy::adaptive;
    cases[5].length.adaptive.profile = profile;
    cases[6].sampling = {.temperature = 0.8f, .top_k = 5};
    cases[6].draft.sampling = specdec::sampling_config{.temperature = 1.2f};
    cases[6].draft.stop_below = 0.2f;
    cases[6].budget = {.max_new_tokens = 200, .stop_tokens = {7}};
    auto target = markov_model::random(vocab, 2, 31);
    auto draft = markov_model::random(vocab, 2, 32);
    std::uint64_t seed = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        INFO("case " << i);
        const auto run = [&](bool erased) {
            run_record r;
            specdec::decode_options o = cases[i];
            o.on_step = [&r](const specdec::step_event& e) { r.event_tokens.push_back(e.next_token); };
            target.calls = draft.calls = 0;
            std::mt19937_64 rng(seed);
            if (erased) {
                specdec::detail::model_ref d(draft), t(target);
                specdec::uniform_source uniforms(rng);
                r.result = specdec::detail::decode_models_loop(d, t, prompt, o, uniforms);
            } else {
                r.result = specdec::speculative_decode(draft, target, prompt, o, rng);
            }
            r.draft_model_calls = draft.calls;
            r.target_model_calls = target.calls;
            return r;
        };
        ++seed;
        const auto a = run(false), b = run(true);
        CHECK((a.result.tokens.size() > 10 || a.result.stop == specdec::stop_reason::stop_token));
        check_same_run(a, b);
        // The plain baseline alike.
        std::mt19937_64 r1(seed), r2(seed);
        specdec::detail::model_ref t(target);
        specdec::uniform_source uniforms(r2);
        const auto c = specdec::autoregressive_decode(target, prompt, cases[i], r1);
        const auto d = specdec::detail::autoregressive_models_loop(t, prompt, cases[i], uniforms);
        CHECK(c.tokens == d.tokens);
        CHECK(c.stop == d.stop);
    }
    // A model's malformed output is reported alike.
    short_logits_model bad{&target, 5};
    std::string templated, erased;
    try {
        std::mt19937_64 rng(1);
        (void)specdec::speculative_decode(draft, bad, prompt, base, rng);
    } catch (const std::invalid_argument& e) { templated = e.what(); }
    bad.calls = 0;
    try {
        std::mt19937_64 rng(1);
        specdec::detail::model_ref d(draft), t(bad);
        specdec::uniform_source uniforms(rng);
        (void)specdec::detail::decode_models_loop(d, t, prompt, base, uniforms);
    } catch (const std::invalid_argument& e) { erased = e.what(); }
    CHECK_THAT(templated, contains("specdec::speculative_decode: the target model's next_logits returned 11 logits; "
                                   "the model's vocab_size() is 12"));
    CHECK(erased == templated);
}

TEST_CASE("uniform_bits hands out a uniform_source's uniforms bit for bit", "[decode][compiled][random]") {
    std::mt19937 a(7), b(7);  // a 32-bit generator: uniform01 takes two calls of it per uniform
    specdec::uniform_source source(b);
    specdec::detail::uniform_bits bits{&source};
    for (int i = 0; i < 10000; ++i) REQUIRE(specdec::uniform01(bits) == specdec::uniform01(a));
}

TEST_CASE("A plain model's malformed logits are reported naming the call the user made and the model's role",
          "[decode][errors]") {
    // Wrapped as a drafter or verifier inside the loop, a plain model's logits are checked by
    // functions the user never called (model_drafter, model_verifier, draft_tree_from_model):
    // the message names the user's entry point and which model was wrong.
    const int vocab = 12;
    auto target = markov_model::random(vocab, 2, 41);
    auto draft = markov_model::random(vocab, 2, 42);
    const std::vector<token_id> prompt{1, 2};
    for (const bool tree : {false, true}) {
        INFO((tree ? "tree" : "chain"));
        specdec::decode_options o{.budget = {.max_new_tokens = 40}};
        if (tree) o.step = specdec::tree{.shape = {.branching = {2, 1}}};
        short_logits_model bad_target{&target, 3}, bad_draft{&draft, 3};
        std::mt19937_64 rng(1);
        CHECK_THROWS_WITH(specdec::speculative_decode(draft, bad_target, prompt, o, rng),
                          contains("specdec::speculative_decode: the target model's next_logits returned 11 logits"));
        CHECK_THROWS_WITH(specdec::speculative_decode(bad_draft, target, prompt, o, rng),
                          contains("specdec::speculative_decode: the draft model's next_logits returned 11 logits"));
        bad_target.calls = 0;
        specdec::batch_decoder dec(draft, bad_target, o);
        (void)dec.add(prompt, std::mt19937_64(2));
        std::string message;
        try {
            dec.run();
        } catch (const std::invalid_argument& e) { message = e.what(); }
        CHECK_THAT(message, contains("specdec::batch_decoder") &&
                                contains("the target model's next_logits returned 11 logits"));
        // Logits of the right length that standardization rejects: the draft model is named too.
        struct nan_model {
            markov_model* model;
            std::size_t calls = 0;
            std::ptrdiff_t vocab_size() const { return model->vocab; }
            Eigen::VectorXf next_logits(std::span<const token_id> context) {
                Eigen::VectorXf v = model->next_logits(context);
                if (++calls > 3) v[2] = std::numeric_limits<float>::quiet_NaN();
                return v;
            }
        } nan_draft{&draft};
        CHECK_THROWS_WITH(specdec::speculative_decode(nan_draft, target, prompt, o, rng),
                          contains("specdec::speculative_decode: logit 2 is NaN (in the draft model's logits)"));
    }
}
