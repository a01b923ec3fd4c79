// The decoding loop for many sequences, batch_decoder: one target pass for all (a
// MultiSequenceVerifier) or per sequence, chains and trees, the draft's own sampling and the
// draft-side stop, fixed and adaptive lengths (the caller's controller), sequences joining and
// leaving, caller-supplied executors, and what happens when something throws; and the
// per-model-spans step (specdec::detail::speculative_step_batch) on a caller's executor. The
// property most cases check: each sequence gets exactly what a separate speculative_decode run
// (or separate steps) with its own generator gets.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_markov.hpp"
#include "support/tree_reference.hpp"

#include <specdec/batch_decoder.hpp>
#include <specdec/speculative_decode.hpp>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

using namespace specdec_test;
using specdec::token_id;

namespace {

/// A second executor, on std::jthread: a fresh set of threads per call, which take indices
/// from a shared counter. Counts the jobs it ran.
struct jthread_executor {
    std::size_t threads = 3;
    std::atomic<std::size_t> jobs{0};
    void parallel_for(std::size_t n, const std::function<void(std::size_t)>& job) {
        std::atomic<std::size_t> next{0};
        {
            std::vector<std::jthread> pool;
            for (std::size_t t = 0; t < std::min(threads, n); ++t)
                pool.emplace_back([&] {
                    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
                        job(i);
                        ++jobs;
                    }
                });
        }  // joined here
    }
};

/// An executor that cannot start its threads.
struct failing_executor {
    void parallel_for(std::size_t, const std::function<void(std::size_t)>&) {
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "no threads");
    }
};

static_assert(specdec::BatchExecutor<specdec::batch_workspace>);
static_assert(specdec::BatchExecutor<jthread_executor>);
static_assert(!specdec::BatchExecutor<markov_model>);
static_assert(specdec::MultiSequenceVerifier<multi_markov_verifier>);
static_assert(!specdec::MultiSequenceVerifier<markov_model>);
static_assert(specdec::MultiSequenceDrafter<multi_markov_drafter>);
static_assert(!specdec::MultiSequenceDrafter<multi_markov_verifier>);

std::vector<token_id> prompt_of(std::size_t b) { return {static_cast<token_id>(b % 5), static_cast<token_id>((b * 7) % 10)}; }

/// What sequence `id` of `dec` has generated so far, as a vector.
template <class Decoder>
std::vector<token_id> generated_of(const Decoder& dec, std::size_t id) {
    const auto g = dec.generated(id);
    return {g.begin(), g.end()};
}

/// A batch_decoder run over `prompts` (each with its generator from `rngs`, which receives the
/// advanced generators), all sequences added before the first step: what the removed
/// speculative_decode_batch did.
template <class D, class V>
std::vector<specdec::decode_result> decode_all(D& drafter, V& verifier, const std::vector<std::vector<token_id>>& prompts,
                                               const specdec::decode_options& options,
                                               std::vector<std::mt19937_64>& rngs, std::size_t threads = 1) {
    specdec::batch_decoder dec(drafter, verifier, options, threads);
    std::vector<std::size_t> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(dec.add(prompts[i], rngs[i]));
    dec.run();
    std::vector<specdec::decode_result> out;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        rngs[i] = dec.rng(ids[i]);
        out.push_back(dec.take(ids[i]));
    }
    return out;
}

/// A plain drafter (a LanguageModel, for chains and trees) that fails on the contexts of one
/// sequence: those whose prompt starts with 7.
struct picky {
    markov_model m;
    std::ptrdiff_t vocab_size() const { return m.vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> c) {
        if (c.front() == 7) throw std::runtime_error("draft engine failure");
        return m.next_logits(c);
    }
};

/// A TreeVerifier whose scores are NaN.
struct nan_tree_verifier {
    markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        tree_markov{model}.score_tree(context, tree, out);
        out.setConstant(std::numeric_limits<float>::quiet_NaN());
    }
};

/// Known costs for the adaptive policy: its choices depend on the tokens only, so a seed
/// reproduces a run.
specdec::adaptive_gamma_options known_costs() {
    specdec::adaptive_gamma_options a;
    a.draft_cost = [](std::size_t n) { return 0.05 * static_cast<double>(n); };
    a.pass_cost = [](std::size_t m) { return 1.0 + 0.01 * static_cast<double>(m); };
    return a;
}

}  // namespace

TEST_CASE("A multi-sequence step gives each sequence what separate steps with the same seeds give", "[batch][multi]") {
    const auto target = markov_model::random(16, 2, 1);
    const auto draft = markov_model::random(16, 2, 2);
    constexpr std::size_t batch = 6, steps = 25;
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        const specdec::step_options opts{.gamma = 4, .sampling = {.temperature = 0.9f}, .scheme = scheme};
        std::vector<std::vector<token_id>> expected(batch);
        std::vector<specdec::decode_stats> expected_stats(batch);
        for (std::size_t b = 0; b < batch; ++b) {
            markov_model d = draft, t = target;
            std::mt19937_64 rng(100 + b);
            specdec::step_workspace ws;
            expected[b] = prompt_of(b);
            for (std::size_t s = 0; s < steps; ++s)
                specdec::speculative_step(d, t, expected[b], expected_stats[b], opts, rng, ws);
        }
        // One dec.step() is one multi-sequence step (a budget that never caps γ).
        const specdec::decode_options options{.step = specdec::chain{.gamma = 4, .scheme = scheme},
                                              .sampling = opts.sampling,
                                              .budget = {.max_new_tokens = 10000}};
        auto run = [&](auto& drafter, auto& executor, const char* what) {
            INFO(what);
            multi_markov_verifier verifier{&target};
            specdec::batch_decoder dec(drafter, verifier, options);
            std::vector<std::size_t> ids;
            for (std::size_t b = 0; b < batch; ++b) ids.push_back(dec.add(prompt_of(b), std::mt19937_64(100 + b)));
            for (std::size_t s = 0; s < steps; ++s) CHECK(dec.step(executor) == batch);
            CHECK(verifier.passes == steps);  // one target pass per step, for all sequences
            std::size_t ragged = 0;
            for (std::size_t b = 0; b < batch; ++b) {
                INFO("sequence " << b);
                std::vector<token_id> tokens = prompt_of(b);
                const auto g = dec.generated(ids[b]);
                tokens.insert(tokens.end(), g.begin(), g.end());
                CHECK(tokens == expected[b]);
                const auto& st = dec.stats(ids[b]);
                CHECK(st.accepted_tokens == expected_stats[b].accepted_tokens);
                CHECK(st.drafted_tokens == expected_stats[b].drafted_tokens);
                CHECK(st.draft_calls == expected_stats[b].draft_calls);
                CHECK(st.target_calls == steps);
                if (g.size() != dec.generated(ids[0]).size()) ++ragged;
            }
            CHECK(ragged > 0);  // acceptance really was ragged
        };
        multi_markov_drafter multi{&draft};
        markov_model plain = draft;  // a plain Drafter shared by all sequences
        specdec::batch_workspace builtin(3);
        jthread_executor jthreads;
        run(multi, builtin, "multi-sequence drafter, a batch_workspace's pool as the executor");
        CHECK(multi.calls == steps);
        run(plain, jthreads, "shared plain drafter, std::jthread executor");
        CHECK(jthreads.jobs == batch * steps);
    }
}

TEST_CASE("The batch loop gives each sequence what speculative_decode gives, as sequences join, leave and finish",
          "[batch][multi]") {
    const auto target = markov_model::random(12, 2, 5);
    const auto draft = markov_model::random(12, 2, 6);
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        INFO((scheme == specdec::verification_scheme::token ? "token" : "block"));
        const specdec::decode_options options{.step = specdec::chain{.gamma = 3, .scheme = scheme},
                                              .sampling = {.temperature = 1.0f}};
        // Sequence k: its own budget and stop tokens; joins at step join[k].
        const std::size_t n = 8;
        const std::size_t budget[n] = {40, 7, 25, 1, 60, 13, 33, 20};
        const std::size_t join[n] = {0, 0, 0, 2, 3, 3, 6, 9};
        auto stops = [](std::size_t k) { return k % 3 == 0 ? std::vector<token_id>{} : std::vector<token_id>{static_cast<token_id>(k)}; };
        auto separate = [&](std::size_t k) {
            markov_model d = draft, t = target;
            std::mt19937_64 rng(7 + k);
            specdec::decode_options o = options;
            o.budget = {.max_new_tokens = budget[k], .stop_tokens = stops(k)};
            return specdec::speculative_decode(d, t, prompt_of(k), o, rng);
        };
        multi_markov_drafter drafter{&draft};
        multi_markov_verifier verifier{&target};
        std::vector<std::size_t> events(n, 0);
        auto opts = options;
        std::vector<std::size_t> id_of(n, 0);
        std::vector<std::size_t> holder(n, n);  // holder[id]: the sequence that has the id now
        opts.on_step = [&](const specdec::step_event& e) { events[holder.at(e.sequence)] += e.emitted.size(); };
        specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(drafter, verifier, opts, 2);
        std::vector<bool> taken(n, false), added(n, false);
        std::size_t finished_early = 0, step = 0, stopped = 0;
        std::vector<specdec::decode_result> got(n);
        // Sequence 0 is removed before step 5 (leaving unfinished); the others run to the end.
        for (; step < 200; ++step) {
            for (std::size_t k = 0; k < n; ++k)
                if (!added[k] && join[k] == step) {
                    id_of[k] = dec.add(prompt_of(k), std::mt19937_64(7 + k), {budget[k], stops(k)});
                    holder.at(id_of[k]) = k;
                    added[k] = true;
                }
            if (step == 5) {
                REQUIRE(!dec.finished(id_of[0]));
                dec.remove(id_of[0]);
                taken[0] = true;
            }
            for (std::size_t k = 0; k < n; ++k)
                if (added[k] && !taken[k] && dec.finished(id_of[k])) {
                    got[k] = dec.take(id_of[k]);  // frees the id for a sequence that joins later
                    taken[k] = true;
                    if (std::count(taken.begin(), taken.end(), false) > 0) ++finished_early;
                }
            if (std::all_of(taken.begin(), taken.end(), [](bool t) { return t; })) break;
            dec.step();
        }
        CHECK(finished_early >= 3);  // sequences really did finish at different times
        for (std::size_t k = 0; k < n; ++k) {
            if (k == 0) continue;
            INFO("sequence " << k);
            const auto want = separate(k);
            CHECK(got[k].tokens == want.tokens);
            CHECK(got[k].stop == want.stop);
            CHECK(got[k].stats.accepted_tokens == want.stats.accepted_tokens);
            CHECK(got[k].stats.steps == want.stats.steps);
            CHECK(events[k] == got[k].tokens.size());
            stopped += want.stop == specdec::stop_reason::stop_token ? 1 : 0;
        }
        CHECK(stopped >= 1);
        // Ids are reused: some sequence joined on an id a finished one had held.
        std::vector<std::size_t> ids(id_of);
        std::sort(ids.begin(), ids.end());
        CHECK(std::adjacent_find(ids.begin(), ids.end()) != ids.end());
        // One pass per step for every sequence of the batch.
        CHECK(verifier.passes <= step);
    }
}

TEST_CASE("A batch_decoder run equals separate runs, and gamma = 0 is batched autoregressive decoding", "[batch][multi]") {
    const auto target = markov_model::random(10, 2, 8);
    const auto draft = markov_model::random(10, 2, 9);
    std::vector<std::vector<token_id>> prompts{{1}, {2, 3}, {4, 4, 4}, {0}};
    for (const std::size_t gamma : {0u, 2u, 5u}) {
        INFO("gamma " << gamma);
        markov_model shared_draft = draft, shared_target = target;  // plain models shared by the batch
        std::vector<std::mt19937_64> rngs{std::mt19937_64(1), std::mt19937_64(2), std::mt19937_64(3), std::mt19937_64(4)};
        const specdec::decode_options o{.step = specdec::chain{.gamma = gamma},
                                        .budget = {.max_new_tokens = 30, .stop_tokens = {9}}};
        const auto out = decode_all(shared_draft, shared_target, prompts, o, rngs, 2);
        REQUIRE(out.size() == prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            INFO("sequence " << i);
            // Alone in a batch of multi-sequence models, with a fresh generator of the same seed.
            multi_markov_drafter d{&draft};
            multi_markov_verifier v{&target};
            std::vector<std::mt19937_64> one{std::mt19937_64(i + 1)};
            const auto alone = decode_all(d, v, {prompts[i]}, o, one);
            CHECK(out[i].tokens == alone[0].tokens);
            CHECK(one[0] == rngs[i]);  // the generators advanced alike
            if (gamma == 0) {
                CHECK(out[i].stats.steps == out[i].tokens.size());
                CHECK(out[i].stats.drafted_tokens == 0);
            } else {
                markov_model sd = draft, st = target;
                std::mt19937_64 rng(i + 1);
                const auto want = specdec::speculative_decode(sd, st, prompts[i], o, rng);
                CHECK(out[i].tokens == want.tokens);
                CHECK(rng == rngs[i]);
            }
        }
    }
}

TEST_CASE("Batch loop errors name the problem and leave the sequences as they were", "[batch][multi][errors]") {
    const auto target = markov_model::random(8, 2, 1);
    const auto small = markov_model::random(6, 2, 2);
    multi_markov_verifier verifier{&target};
    multi_markov_drafter drafter{&target}, wrong{&small};
    using decoder = specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64>;
    CHECK_THROWS_WITH(decoder(wrong, verifier), contains("vocab_size") && contains("differs"));
    CHECK_THROWS_WITH(decoder(drafter, verifier,
                              {.step = specdec::chain{.gamma = 0}, .length = {.policy = specdec::gamma_policy::adaptive}}),
                      contains("gamma = 0"));
    CHECK_THROWS_WITH(decoder(drafter, verifier, {.budget = {.stop_tokens = {8}}}), contains("budget.stop_tokens[0] = 8"));
    CHECK_THROWS_WITH(decoder(drafter, verifier, {.step = specdec::chain{.lenience = 0.5f}}), contains("lenience"));
    CHECK_THROWS_AS(decoder(drafter, verifier, {}, 0), std::invalid_argument);
    // A tree needs per-sequence models: these score and draft chains of many sequences only.
    CHECK_THROWS_WITH(decoder(drafter, verifier, {.step = specdec::tree{}}), contains("options.step is a tree"));

    decoder dec(drafter, verifier, {.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 50}});
    CHECK_THROWS_WITH(dec.add(std::vector<token_id>{}, std::mt19937_64(1)), contains("empty"));
    CHECK_THROWS_WITH(dec.add(std::vector<token_id>{0, 9}, std::mt19937_64(1)), contains("prompt[1] = 9"));
    CHECK_THROWS_WITH(dec.add(std::vector<token_id>{0}, std::mt19937_64(1), {.stop_tokens = {3, 8}}),
                      contains("stop_tokens[1] = 8"));
    CHECK_THROWS_WITH(dec.take(3), contains("id 3 is not a sequence"));
    CHECK(dec.active() == 0);  // the refused sequences were not added
    const auto a = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto b = dec.add(std::vector<token_id>{2}, std::mt19937_64(2));
    dec.step();
    const std::vector<token_id> a_before = generated_of(dec, a);
    const std::size_t steps_before = dec.stats(b).steps;
    // The shared pass fails: no sequence changes, and the decoder stays usable.
    verifier.fail = true;
    CHECK_THROWS_WITH(dec.step(), contains("multi-sequence pass failed"));
    CHECK(generated_of(dec, a) == a_before);
    CHECK(dec.stats(b).steps == steps_before);
    // The executor fails: its exception comes through, nothing was committed.
    verifier.fail = false;
    failing_executor no_threads;
    CHECK_THROWS_AS(dec.step(no_threads), std::system_error);
    CHECK(generated_of(dec, a) == a_before);
    CHECK(dec.stats(b).steps == steps_before);
    dec.run();
    CHECK(dec.generated(a).size() == 50);
    CHECK(dec.take(b).tokens.size() == 50);
}

TEST_CASE("Errors name the user's call: specdec::batch_decoder, its add and its step, not an internal function",
          "[batch][multi][errors][tree]") {
    auto target = markov_model::random(8, 2, 7);
    markov_model draft = target;
    tree_markov good{&target};
    nan_tree_verifier nan{&target};
    using plain_decoder = specdec::batch_decoder<markov_model, tree_markov>;
    // Invalid options: the constructor.
    CHECK_THROWS_WITH(plain_decoder(draft, good, {.draft = {.stop_below = 2.0f}}),
                      contains("specdec::batch_decoder: draft.stop_below = 2"));
    CHECK_THROWS_WITH(plain_decoder(draft, good, {.sampling = {.top_p = 0.0f}}),
                      contains("specdec::batch_decoder: sampling.top_p"));
    CHECK_THROWS_WITH(plain_decoder(draft, good, {.draft = {.sampling = specdec::sampling_config{.top_k = -1}}}),
                      contains("specdec::batch_decoder: ") && contains("top_k = -1"));
    CHECK_THROWS_WITH(plain_decoder(draft, good, {.step = specdec::tree{.shape = {.branching = {}}}}),
                      contains("specdec::batch_decoder: ") && contains("depth 0"));
    specdec::gamma_controller two(2, known_costs());
    CHECK_THROWS_WITH(plain_decoder(draft, good,
                                    {.step = specdec::tree{.shape = {.branching = {2, 1, 1}}},
                                     .length = {.policy = specdec::gamma_policy::adaptive, .controller = &two}}),
                      contains("specdec::batch_decoder: the controller does not plan this step's tree"));
    CHECK_THROWS_WITH(plain_decoder(draft, good,
                                    {.step = specdec::chain{.gamma = 3},
                                     .length = {.policy = specdec::gamma_policy::adaptive, .controller = &two}}),
                      contains("specdec::batch_decoder: the controller's gamma_max() = 2 differs from the step's "
                               "gamma = 3"));
    CHECK_THROWS_WITH(plain_decoder(draft, good, {}, 0), contains("specdec::batch_decoder: threads = 0"));
    // add.
    plain_decoder dec(draft, good, {.step = specdec::tree{.shape = {.branching = {2, 1}}}});
    CHECK_THROWS_WITH(dec.add(std::vector<token_id>{}, std::mt19937_64(1)),
                      contains("specdec::batch_decoder::add: ") && contains("empty"));
    CHECK_THROWS_WITH(dec.add(std::vector<token_id>{8}, std::mt19937_64(1)),
                      contains("specdec::batch_decoder::add: prompt[0] = 8"));
    // step: NaN scores from a tree verifier are reported as the decoder's step, not as
    // verify_tree (which the user did not call); the sequence is unchanged.
    specdec::batch_decoder<markov_model, nan_tree_verifier> bad(draft, nan,
                                                               {.step = specdec::tree{.shape = {.branching = {2, 1}}}});
    const auto id = bad.add(std::vector<token_id>{1, 2}, std::mt19937_64(3));
    CHECK_THROWS_WITH(bad.step(), contains("specdec::batch_decoder::step: ") && !contains("verify_tree"));
    CHECK(bad.generated(id).empty());
    CHECK(bad.stats(id).steps == 0);
    CHECK(!bad.finished(id));
    // speculative_decode names itself for the same failure.
    std::mt19937_64 rng(3);
    CHECK_THROWS_WITH(specdec::speculative_decode(draft, nan, {1, 2},
                                                  {.step = specdec::tree{.shape = {.branching = {2, 1}}}}, rng),
                      contains("specdec::speculative_decode: ") && !contains("verify_tree") &&
                          !contains("batch_decoder"));
    // A chain step's malformed scores likewise name the step.
    struct nan_multi_verifier : multi_markov_verifier {
        void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
            multi_markov_verifier::score_batch(batch, out);
            for (std::size_t i = 0; i < batch.size(); ++i)
                out.sequence(i).setConstant(std::numeric_limits<float>::quiet_NaN());
        }
    };
    nan_multi_verifier nan_multi{{&target}};
    multi_markov_drafter multi{&target};
    specdec::batch_decoder chain_dec(multi, nan_multi, {.step = specdec::chain{.gamma = 2}});
    (void)chain_dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    CHECK_THROWS_WITH(chain_dec.step(), contains("specdec::batch_decoder::step: ") && !contains("specdec::verify"));
    CHECK_THROWS_WITH(chain_dec.take(5), contains("specdec::batch_decoder::take: id 5"));
}

TEST_CASE("A sequence whose own step throws is reported and left unchanged, and the others step", "[batch][multi][errors]") {
    const auto target = markov_model::random(8, 2, 3);
    picky drafter{markov_model::random(8, 2, 4)};
    multi_markov_verifier verifier{&target};
    specdec::batch_decoder<picky, multi_markov_verifier, std::mt19937_64> dec(
        drafter, verifier, {.step = specdec::chain{.gamma = 2}, .budget = {.max_new_tokens = 10}});
    const auto good = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto bad = dec.add(std::vector<token_id>{7}, std::mt19937_64(2));
    CHECK_THROWS_WITH(dec.step(), contains("draft engine failure"));
    CHECK(dec.generated(bad).empty());
    CHECK(dec.stats(bad).steps == 0);
    CHECK(!dec.finished(bad));
    CHECK(!dec.generated(good).empty());
    dec.remove(bad);
    dec.run();
    CHECK(dec.generated(good).size() == 10);
}

TEST_CASE("An on_step that throws leaves every sequence of the step settled (review finding)", "[batch][multi][errors]") {
    // on_step used to run inside the loop that settles each sequence: when it threw for the
    // first sequence, the second kept its new token unsettled, so it stepped again past its
    // budget of one token.
    const auto target = markov_model::random(8, 2, 5);
    multi_markov_verifier verifier{&target};
    multi_markov_drafter drafter{&target};
    std::size_t calls = 0;
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(
        drafter, verifier,
        {.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = 1}, .on_step = [&](const specdec::step_event&) {
             if (++calls == 1) throw std::runtime_error("consumer failure");
         }});
    const auto a = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto b = dec.add(std::vector<token_id>{2}, std::mt19937_64(2));
    CHECK_THROWS_WITH(dec.step(), contains("consumer failure"));
    CHECK(calls == 1);  // the callbacks after the throwing one are skipped
    CHECK(dec.active() == 0);
    dec.run();
    for (const auto id : {a, b}) {
        const auto r = dec.take(id);
        CHECK(r.tokens.size() == 1);
        CHECK(r.stats.steps == 1);
        CHECK(r.stats.steps_at_gamma.size() == 1);  // γ = min(4, budget − 1) = 0
    }
}

TEST_CASE("When a sequence's step and an on_step both fail in one step, the sequences that stepped get their "
          "events, the sequence's exception wins, and the controller has observed the sequences that stepped",
          "[batch][multi][errors][adaptive]") {
    // batch_decoder::step: every sequence is settled, then the adaptive policy observes the
    // sequences that stepped, then their callbacks run (a stream stays in step with
    // generated()), then the exception of the lowest-id failing sequence propagates, over the
    // callback's.
    const auto target = markov_model::random(8, 2, 13);
    for (const bool tree : {false, true}) {
        INFO((tree ? "trees" : "chains"));
        picky drafter{target};  // p == q: every tested position has β = 1
        markov_model verifier_model = target;
        tree_markov verifier{&verifier_model};
        const specdec::step_shape shape = tree ? specdec::step_shape{specdec::tree{.shape = {.branching = {2, 1, 1}}}}
                                               : specdec::step_shape{specdec::chain{.gamma = 3}};
        specdec::decode_options made{.step = shape, .length = {.adaptive = known_costs()}};
        specdec::gamma_controller controller = specdec::make_controller(made);
        const auto first_acceptance = [&] {
            return controller.plans_trees() ? controller.sibling_acceptance(1) : controller.acceptance(1);
        };
        std::size_t calls = 0;
        bool callback_fails = true;
        // tree_markov has no score(): chains are scored by the plain model, trees by score_tree.
        auto run = [&](auto& v) {
            specdec::batch_decoder dec(drafter, v,
                                       {.step = shape,
                                        .length = {.policy = specdec::gamma_policy::adaptive, .controller = &controller},
                                        .budget = {.max_new_tokens = 12},
                                        .on_step = [&](const specdec::step_event&) {
                                            ++calls;
                                            if (callback_fails) throw std::runtime_error("consumer failure");
                                        }});
            REQUIRE(dec.controller() == &controller);
            // Only the failing sequence: it throws, nothing stepped, nothing observed.
            const auto bad = dec.add(std::vector<token_id>{7, 1}, std::mt19937_64(2));
            CHECK_THROWS_WITH(dec.step(), contains("draft engine failure"));
            CHECK(calls == 0);
            CHECK(first_acceptance() == 0.0);
            // Beside a sequence that steps, with a callback that would throw too.
            const auto good = dec.add(std::vector<token_id>{1, 2}, std::mt19937_64(1));
            CHECK(good > bad);  // the failing sequence has the lower id
            CHECK_THROWS_WITH(dec.step(), contains("draft engine failure"));
            CHECK(calls == 1);                              // the sequence that stepped got its event
            CHECK(first_acceptance() > 0.99);               // it observed the sequence that stepped (β = 1)
            CHECK(dec.stats(good).steps == 1);              // which is settled
            CHECK(!dec.generated(good).empty());
            CHECK(dec.generated(bad).empty());              // the failing one unchanged and still active
            CHECK(dec.stats(bad).steps == 0);
            CHECK(!dec.finished(bad));
            CHECK(dec.active() == 2);
            // Without the failing sequence, the callback's exception comes out, after its step.
            dec.remove(bad);
            const std::size_t before = dec.generated(good).size();
            CHECK_THROWS_WITH(dec.step(), contains("consumer failure"));
            CHECK(calls == 2);
            CHECK(dec.generated(good).size() > before);
            // The decoder stays usable.
            callback_fails = false;
            dec.run();
            CHECK(dec.generated(good).size() == 12);
        };
        if (tree) run(verifier);
        else run(verifier_model);
    }
}

TEST_CASE("An on_step that takes, removes and adds sequences: a taken sequence's pending event is skipped even when "
          "its id is reused at once, and step from a callback is refused (review finding)",
          "[batch][multi][errors]") {
    // The decoder used to tell a taken sequence by its token vector's address, which a sequence
    // added at once into the freed id may get again: its event then read the new prompt as the
    // old step's tokens, and a draft from freed memory.
    const auto target = markov_model::random(8, 2, 5);
    multi_markov_verifier verifier{&target};
    multi_markov_drafter drafter{&target};
    std::vector<std::size_t> events;
    std::vector<std::size_t> emitted_sizes;
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64>* self = nullptr;
    std::size_t added = 99;
    bool reenter = false;
    specdec::stop_reason taken = specdec::stop_reason::max_new_tokens;
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(
        drafter, verifier,
        {.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 8}, .on_step = [&](const specdec::step_event& e) {
             events.push_back(e.sequence);
             emitted_sizes.push_back(e.emitted.size());
             if (reenter) (void)self->step();
             if (e.sequence == 0 && added == 99) {
                 taken = self->take(1).stop;                               // frees id 1 ...
                 added = self->add(std::vector<token_id>{3}, std::mt19937_64(7));  // ... which add reuses
                 self->remove(2);
             }
         }});
    self = &dec;
    for (std::uint64_t s = 0; s < 4; ++s) (void)dec.add(std::vector<token_id>{1, 2, 3, 4, 5}, std::mt19937_64(s));
    (void)dec.step();
    CHECK(added == 1);
    CHECK(events == std::vector<std::size_t>{0, 3});  // 1 (taken, its id reused) and 2 (removed) skipped
    for (const std::size_t n : emitted_sizes) CHECK(n >= 1);
    CHECK(dec.generated(added).empty());  // the new sequence has not stepped
    // A callback may not step the decoder it is called from.
    reenter = true;
    CHECK_THROWS_AS(dec.step(), std::logic_error);
    reenter = false;
    CHECK_NOTHROW(dec.step());  // the decoder is usable again
    CHECK(taken == specdec::stop_reason::unfinished);  // taken before it finished
    dec.run();
    CHECK(dec.take(0).stop == specdec::stop_reason::max_new_tokens);
}

TEST_CASE("A verifier that reshapes its packed logits is refused by name (review finding)", "[batch][multi][errors]") {
    // The loops read each sequence's columns by the layout they shaped; a verifier that reshaped
    // the packed logits made them read past the end of the offsets.
    struct reshaping_verifier : multi_markov_verifier {
        void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
            multi_markov_verifier::score_batch(batch, out);
            out.shape(out.vocab(), batch.first(1));
        }
    };
    const auto target = markov_model::random(8, 2, 6);
    reshaping_verifier verifier{{&target}};
    multi_markov_drafter drafter{&target};
    specdec::batch_decoder<multi_markov_drafter, reshaping_verifier, std::mt19937_64> dec(
        drafter, verifier, {.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 10}});
    const auto a = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto b = dec.add(std::vector<token_id>{2}, std::mt19937_64(2));
    CHECK_THROWS_WITH(dec.step(), contains("specdec::batch_decoder::step: ") &&
                                      contains("changed the layout of its packed_logits") &&
                                      contains("1 sequences of 8 rows") && contains("shaped for 2 sequences"));
    CHECK(dec.generated(a).empty());
    CHECK(dec.generated(b).empty());
    CHECK(dec.stats(a).steps == 0);
}

TEST_CASE("The adaptive policy in the batch loop keeps every sequence's budget and stops", "[batch][multi][adaptive]") {
    const auto target = markov_model::random(10, 2, 11);
    const auto draft = target;  // p == q: every draft is accepted, so speculation pays
    multi_markov_drafter d{&draft};
    multi_markov_verifier v{&target};
    specdec::decode_options o{.step = specdec::chain{.gamma = 4},
                              .length = {.policy = specdec::gamma_policy::adaptive, .adaptive = known_costs()},
                              .budget = {.max_new_tokens = 64}};
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(d, v, o);
    for (std::size_t i = 0; i < 5; ++i) (void)dec.add(std::vector<token_id>{static_cast<token_id>(i)}, std::mt19937_64(i));
    dec.run();
    for (std::size_t i = 0; i < 5; ++i) CHECK(dec.generated(i).size() == 64);
    REQUIRE(dec.controller() != nullptr);
    CHECK(dec.controller()->choices()[4] > dec.controller()->choices()[0]);  // it chose the long draft
}

TEST_CASE("Trees in batch_decoder, with the draft's own sampling, the draft-side stop and per-sequence stop tokens, "
          "give each sequence what a separate speculative_decode gives",
          "[batch][multi][tree]") {
    auto target = markov_model::random(12, 2, 41);
    auto draft = markov_model::random(12, 2, 42);
    constexpr std::size_t n = 7;
    const std::size_t budget[n] = {30, 9, 22, 1, 40, 17, 26};
    const std::size_t join[n] = {0, 0, 1, 2, 2, 5, 8};
    auto stops = [](std::size_t k) {
        return k % 3 == 1 ? std::vector<token_id>{} : std::vector<token_id>{static_cast<token_id>(k), 11};
    };
    for (const auto scheme :
         {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection}) {
        for (const auto draws : {specdec::sibling_draws::without_replacement, specdec::sibling_draws::iid})
        // Uniform per depth, and a tree whose nodes of one depth differ (tree_shape::from_children).
        for (const auto& shape : {specdec::tree_shape{.branching = {2, 2, 1}, .draws = draws},
                                  specdec::tree_shape::from_children({2, 2, 1, 1, 0, 1}, draws)}) {
            INFO((scheme == specdec::tree_verification_scheme::traversal ? "traversal" : "recursive rejection")
                 << ", siblings " << (draws == specdec::sibling_draws::iid ? "iid" : "without replacement")
                 << (shape.children.empty() ? ", uniform shape" : ", shape from children"));
            const specdec::decode_options options{
                .step = specdec::tree{.shape = shape, .scheme = scheme},
                .sampling = {.temperature = 0.8f},
                .draft = {.sampling = specdec::sampling_config{.temperature = 1.4f, .top_k = 8}, .stop_below = 0.2f}};
            auto separate = [&](std::size_t k, auto&& make_verifier) {
                markov_model d = draft, t = target;
                auto v = make_verifier(t);
                std::mt19937_64 rng(500 + k);
                specdec::decode_options o = options;
                o.budget = {.max_new_tokens = budget[k], .stop_tokens = stops(k)};
                return specdec::speculative_decode(d, v, prompt_of(k), o, rng);
            };
            // Sequences join at join[k] with their own budgets and stop tokens; finished ones are
            // taken as soon as they finish (their ids are then reused).
            auto run = [&](auto& verifier, std::size_t threads, auto&& make_verifier) {
                markov_model shared_draft = draft;
                std::vector<std::size_t> emitted(n, 0), holder(n, n);
                std::size_t pruned = 0, tree_steps = 0;
                specdec::decode_options o = options;
                o.on_step = [&](const specdec::step_event& e) {
                    REQUIRE(e.tree != nullptr);
                    ++tree_steps;
                    emitted[holder.at(e.sequence)] += e.emitted.size();
                    CHECK(e.draft.size() == e.accepted);  // the accepted path
                    CHECK(e.target_passes >= 1);
                    // A full-depth step whose tree lost nodes: the draft-side stop pruned it.
                    if (e.gamma == 3 && e.tree->size() < shape.nodes()) ++pruned;
                };
                specdec::batch_decoder dec(shared_draft, verifier, o, threads);
                std::vector<std::size_t> id(n, 0);
                std::vector<bool> added(n, false), taken(n, false);
                std::vector<specdec::decode_result> got(n);
                for (std::size_t step = 0; step < 300; ++step) {
                    for (std::size_t k = 0; k < n; ++k)
                        if (join[k] == step) {
                            id[k] = dec.add(prompt_of(k), std::mt19937_64(500 + k), {budget[k], stops(k)});
                            holder.at(id[k]) = k;
                            added[k] = true;
                        }
                    for (std::size_t k = 0; k < n; ++k)
                        if (added[k] && !taken[k] && dec.finished(id[k])) {
                            got[k] = dec.take(id[k]);
                            taken[k] = true;
                        }
                    if (std::all_of(taken.begin(), taken.end(), [](bool t) { return t; })) break;
                    dec.step();
                }
                std::size_t stopped = 0;
                for (std::size_t k = 0; k < n; ++k) {
                    INFO("sequence " << k << ", " << threads << " thread(s)");
                    REQUIRE(taken[k]);
                    const auto want = separate(k, make_verifier);
                    CHECK(got[k].tokens == want.tokens);
                    CHECK(got[k].stop == want.stop);
                    CHECK(got[k].stats.steps == want.stats.steps);
                    CHECK(got[k].stats.accepted_tokens == want.stats.accepted_tokens);
                    CHECK(got[k].stats.drafted_tokens == want.stats.drafted_tokens);
                    CHECK(got[k].stats.target_calls == want.stats.target_calls);
                    CHECK(emitted[k] == got[k].tokens.size());
                    stopped += got[k].stop == specdec::stop_reason::stop_token ? 1u : 0u;
                }
                CHECK(stopped >= 1);     // stop tokens ended some sequences
                CHECK(pruned > 0);       // the draft-side stop was in effect
                CHECK(tree_steps > 20);
            };
            {
                INFO("a TreeVerifier (one score_tree pass per step)");
                markov_model t = target;
                tree_markov verifier{&t};
                run(verifier, 1, [](markov_model& m) { return tree_markov{&m}; });
                run(verifier, 2, [](markov_model& m) { return tree_markov{&m}; });
            }
            {
                INFO("a BatchVerifier (one score() per root-to-leaf path)");
                markov_model t = target;
                batched_markov verifier{&t};
                run(verifier, 2, [](markov_model& m) { return batched_markov{&m}; });
            }
        }
    }
    // The draft's own sampling is used: at the target's settings the output differs.
    markov_model d1 = draft, d2 = draft, t = target;
    tree_markov v{&t};
    const specdec::decode_options with{.step = specdec::tree{.shape = {.branching = {2, 2, 1}}},
                                       .sampling = {.temperature = 0.8f},
                                       .draft = {.sampling = specdec::sampling_config{.temperature = 1.4f, .top_k = 8}},
                                       .budget = {.max_new_tokens = 40}};
    specdec::decode_options without = with;
    without.draft.sampling.reset();
    std::mt19937_64 r1(9), r2(9);
    CHECK(specdec::speculative_decode(d1, v, {1, 2}, with, r1).tokens !=
          specdec::speculative_decode(d2, v, {1, 2}, without, r2).tokens);
}

TEST_CASE("A caller's controller in batch_decoder, with chains and with trees: the decoder's controller() is the "
          "caller's, it observes the steps, and known costs make a seed reproduce the run",
          "[batch][multi][adaptive][tree]") {
    const auto target = markov_model::random(10, 2, 61);
    const auto draft = markov_model::random(10, 2, 62);
    const std::vector<std::vector<token_id>> prompts{{1}, {2, 3}, {4, 5, 6}, {7}};
    struct outcome {
        std::vector<std::vector<token_id>> tokens;
        std::vector<std::size_t> choices;
        double alpha1 = 0.0;
        std::vector<std::size_t> depths;  // steps per γ (or depth), all sequences
    };
    // One run: a fresh controller of the caller's (identical settings every time), sequences
    // added before the first step and one after the second; then a second decoder that goes on
    // with the same controller.
    auto run = [&](auto& drafter, auto& verifier, const specdec::step_shape& shape, std::size_t longest) {
        specdec::decode_options o{
            .step = shape,
            .length = {.policy = specdec::gamma_policy::adaptive, .adaptive = known_costs()},
            .sampling = {.temperature = 0.9f},
            .budget = {.max_new_tokens = 48}};
        // The controller a decoding call would make: a chain's, or the tree planner.
        specdec::gamma_controller c = specdec::make_controller(o);
        o.length.controller = &c;
        REQUIRE(c.gamma_max() == longest);
        REQUIRE(c.plans_trees() == std::holds_alternative<specdec::tree>(shape));
        const auto first_acceptance = [&] { return c.plans_trees() ? c.sibling_acceptance(1) : c.acceptance(1); };
        REQUIRE(first_acceptance() == 0.0);
        outcome out;
        {
            specdec::batch_decoder dec(drafter, verifier, o);
            CHECK(dec.controller() == &c);
            std::vector<std::size_t> ids;
            for (std::size_t i = 0; i + 1 < prompts.size(); ++i)
                ids.push_back(dec.add(prompts[i], std::mt19937_64(70 + i)));
            dec.step();
            dec.step();
            ids.push_back(dec.add(prompts.back(), std::mt19937_64(80)));
            dec.run();
            for (const auto id : ids) {
                const auto r = dec.take(id);
                CHECK(r.tokens.size() == 48);
                out.tokens.push_back(r.tokens);
                if (out.depths.size() < r.stats.steps_at_gamma.size()) out.depths.resize(r.stats.steps_at_gamma.size());
                for (std::size_t g = 0; g < r.stats.steps_at_gamma.size(); ++g) out.depths[g] += r.stats.steps_at_gamma[g];
            }
        }
        out.choices.assign(c.choices().begin(), c.choices().end());
        out.alpha1 = first_acceptance();
        // The controller observed the steps: estimates of acceptance, choices beyond the warm-up.
        const std::size_t chosen = std::accumulate(out.choices.begin(), out.choices.end(), std::size_t{0});
        CHECK(chosen >= 12);              // one choice per step of the whole batch
        CHECK(out.alpha1 > 0.0);
        CHECK(out.choices[1] < chosen);   // not only the warm-up's γ = 1
        // A second decoder goes on from the controller's state (kept across decoders).
        {
            specdec::batch_decoder dec(drafter, verifier, o);
            CHECK(dec.controller() == &c);
            (void)dec.add(prompts[0], std::mt19937_64(90));
            dec.run();
        }
        const std::size_t later = std::accumulate(c.choices().begin(), c.choices().end(), std::size_t{0});
        CHECK(later > chosen);
        return out;
    };
    auto check_reproducible = [](const outcome& a, const outcome& b) {
        CHECK(a.tokens == b.tokens);
        CHECK(a.choices == b.choices);
        CHECK(a.alpha1 == b.alpha1);
        CHECK(a.depths == b.depths);
    };
    {
        INFO("chains, multi-sequence models");
        multi_markov_drafter d{&draft};
        multi_markov_verifier v{&target};
        const specdec::step_shape chain = specdec::chain{.gamma = 4};
        const auto first = run(d, v, chain, 4);
        check_reproducible(first, run(d, v, chain, 4));
        CHECK(first.depths.size() >= 3);  // several γ were used
    }
    {
        INFO("chains, plain shared models");
        markov_model d = draft, t = target;
        const specdec::step_shape chain = specdec::chain{.gamma = 4};
        check_reproducible(run(d, t, chain, 4), run(d, t, chain, 4));
    }
    {
        INFO("trees");
        markov_model d = draft, t = target;
        tree_markov v{&t};
        const specdec::step_shape tree = specdec::tree{.shape = {.branching = {2, 2, 1, 1}}};
        const auto first = run(d, v, tree, 4);
        check_reproducible(first, run(d, v, tree, 4));
        CHECK(first.depths.size() >= 3);  // several depths were used
    }
    {
        INFO("a caller's tree planner takes how the decoder's models draft and score its plans");
        markov_model d = draft, t = target;
        const specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {2, 1}}},
                                        .length = {.policy = specdec::gamma_policy::adaptive}};
        specdec::gamma_controller planner = specdec::make_controller(o);  // a call per level, tree steps
        REQUIRE(planner.tree_limits().draft_calls == specdec::tree_draft_calls::per_level);
        REQUIRE_FALSE(planner.tree_limits().chains_as_chain_steps);
        specdec::decode_options with = o;
        with.length.controller = &planner;
        specdec::batch_decoder dec(d, t, with);  // plain models: a call per parent, chains as chain steps
        CHECK(planner.tree_limits().draft_calls == specdec::tree_draft_calls::per_parent);
        CHECK(planner.tree_limits().chains_as_chain_steps);
        CHECK_FALSE(planner.tree_limits().chains_batched);
    }
    {
        INFO("a controller that does not plan the step's tree is refused by name");
        markov_model d = draft, t = target;
        tree_markov v{&t};
        specdec::gamma_controller chain_controller(4);
        specdec::gamma_controller other_tree(specdec::tree_plan_limits{.branching = {3, 2, 1, 1}});
        for (specdec::gamma_controller* c : {&chain_controller, &other_tree}) {
            const specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {2, 2, 1, 1}}},
                                            .length = {.policy = specdec::gamma_policy::adaptive, .controller = c}};
            CHECK_THROWS_WITH(specdec::batch_decoder(d, v, o),
                              Catch::Contains("specdec::batch_decoder") &&
                                  Catch::Contains("does not plan this step's tree") &&
                                  Catch::Contains("make_controller"));
        }
    }
}

TEST_CASE("Per-sequence models step on a caller's executor with the same results", "[batch][executor]") {
    const auto target = markov_model::random(16, 2, 1);
    const auto draft = markov_model::random(16, 2, 2);
    constexpr std::size_t batch = 5, steps = 12;
    auto run = [&](auto&& step) {
        std::vector<markov_model> drafters(batch, draft), verifiers(batch, target);
        std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
        for (std::size_t b = 0; b < batch; ++b) seqs.push_back({prompt_of(b), {}, std::mt19937_64(b)});
        specdec::batch_workspace ws;
        for (std::size_t s = 0; s < steps; ++s) step(drafters, verifiers, seqs, ws);
        std::vector<std::vector<token_id>> out;
        for (const auto& s : seqs) out.push_back(s.tokens);
        return out;
    };
    jthread_executor jthreads;
    const specdec::step_options opts{.gamma = 3};
    const auto own = run([&](auto& d, auto& v, auto& s, auto& ws) { specdec::detail::speculative_step_batch(d, v, s, opts, ws); });
    const auto theirs = run([&](auto& d, auto& v, auto& s, auto& ws) {
        specdec::detail::speculative_step_batch(std::span(d), std::span(v), std::span(s), opts, ws, jthreads);
    });
    CHECK(own == theirs);
    CHECK(jthreads.jobs == batch * steps);
    // An executor that cannot start threads: its exception comes through, no sequence changed.
    std::vector<markov_model> drafters(batch, draft), verifiers(batch, target);
    std::vector<specdec::batch_sequence<std::mt19937_64>> seqs(batch, {{1}, {}, std::mt19937_64(1)});
    specdec::batch_workspace ws;
    failing_executor no_threads;
    CHECK_THROWS_AS(specdec::detail::speculative_step_batch(std::span(drafters), std::span(verifiers), std::span(seqs),
                                                            opts, ws, no_threads),
                    std::system_error);
    for (const auto& s : seqs) CHECK(s.tokens == std::vector<token_id>{1});
}

TEST_CASE("An executor that fails after some jobs leaves each sequence stepped or unchanged", "[batch][executor][errors]") {
    // Runs the first job, then cannot start more threads.
    struct half_executor {
        void parallel_for(std::size_t n, const std::function<void(std::size_t)>& job) {
            if (n > 0) job(0);
            throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "no more threads");
        }
    };
    const auto target = markov_model::random(8, 2, 3);
    const auto draft = markov_model::random(8, 2, 4);
    multi_markov_drafter d{&draft};
    multi_markov_verifier v{&target};
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(
        d, v, {.step = specdec::chain{.gamma = 3}, .budget = {.max_new_tokens = 20}});
    const auto a = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto b = dec.add(std::vector<token_id>{2}, std::mt19937_64(2));
    half_executor half;
    CHECK_THROWS_AS(dec.step(half), std::system_error);
    CHECK(dec.stats(a).steps == 1);  // committed, and its budget counted
    CHECK(!dec.generated(a).empty());
    CHECK(dec.stats(b).steps == 0);  // untouched
    CHECK(dec.generated(b).empty());
    dec.run();
    CHECK(dec.generated(a).size() == 20);
    CHECK(dec.generated(b).size() == 20);
}
