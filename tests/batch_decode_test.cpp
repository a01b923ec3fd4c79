// The multi-sequence path: speculative_step_batch with a MultiSequenceVerifier, the batch loop
// (batch_decoder, speculative_decode_batch) and caller-supplied executors. The property every
// case checks: each sequence gets exactly what a separate run with its own generator gets.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/multi_markov.hpp"

#include <specdec/batch_decode.hpp>

#include <algorithm>
#include <atomic>
#include <functional>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>
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
        auto run = [&](auto& drafter, auto& executor, const char* what) {
            INFO(what);
            multi_markov_verifier verifier{&target};
            std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
            for (std::size_t b = 0; b < batch; ++b) seqs.push_back({prompt_of(b), {}, std::mt19937_64(100 + b)});
            specdec::batch_workspace ws(2);
            for (std::size_t s = 0; s < steps; ++s)
                specdec::speculative_step_batch(drafter, verifier, std::span(seqs), opts, ws, executor);
            CHECK(verifier.passes == steps);  // one target pass per step, for all sequences
            std::size_t ragged = 0;
            for (std::size_t b = 0; b < batch; ++b) {
                INFO("sequence " << b);
                CHECK(seqs[b].tokens == expected[b]);
                CHECK(seqs[b].stats.accepted_tokens == expected_stats[b].accepted_tokens);
                CHECK(seqs[b].stats.drafted_tokens == expected_stats[b].drafted_tokens);
                CHECK(seqs[b].stats.draft_calls == expected_stats[b].draft_calls);
                CHECK(seqs[b].stats.target_calls == steps);
                if (seqs[b].tokens.size() != seqs[0].tokens.size()) ++ragged;
            }
            CHECK(ragged > 0);  // acceptance really was ragged
        };
        multi_markov_drafter multi{&draft};
        markov_model plain = draft;  // a plain Drafter shared by all sequences
        specdec::batch_workspace builtin(3);
        jthread_executor jthreads;
        run(multi, builtin, "multi-sequence drafter, built-in pool");
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
        const specdec::batch_decode_options options{.gamma = 3, .sampling = {.temperature = 1.0f}, .scheme = scheme};
        // Sequence k: its own budget and stop tokens; joins at step join[k].
        const std::size_t n = 8;
        const std::size_t budget[n] = {40, 7, 25, 1, 60, 13, 33, 20};
        const std::size_t join[n] = {0, 0, 0, 2, 3, 3, 6, 9};
        auto stops = [](std::size_t k) { return k % 3 == 0 ? std::vector<token_id>{} : std::vector<token_id>{static_cast<token_id>(k)}; };
        auto separate = [&](std::size_t k) {
            markov_model d = draft, t = target;
            std::mt19937_64 rng(7 + k);
            specdec::decode_options o{.gamma = 3, .max_new_tokens = budget[k], .stop_tokens = stops(k),
                                      .sampling = options.sampling, .scheme = scheme};
            return specdec::speculative_decode(d, t, prompt_of(k), o, rng);
        };
        multi_markov_drafter drafter{&draft};
        multi_markov_verifier verifier{&target};
        std::vector<std::size_t> events(n, 0);
        auto opts = options;
        std::vector<std::size_t> id_of(n, 0);
        std::vector<std::size_t> holder(n, n);  // holder[id]: the sequence that has the id now
        opts.on_step = [&](std::size_t id, const specdec::step_event& e) { events[holder.at(id)] += e.emitted.size(); };
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

TEST_CASE("speculative_decode_batch equals separate runs; gamma = 0 is batched autoregressive decoding", "[batch][multi]") {
    const auto target = markov_model::random(10, 2, 8);
    const auto draft = markov_model::random(10, 2, 9);
    std::vector<std::vector<token_id>> prompts{{1}, {2, 3}, {4, 4, 4}, {0}};
    for (const std::size_t gamma : {0u, 2u, 5u}) {
        INFO("gamma " << gamma);
        markov_model shared_draft = draft, shared_target = target;  // plain models shared by the batch
        std::vector<std::mt19937_64> rngs{std::mt19937_64(1), std::mt19937_64(2), std::mt19937_64(3), std::mt19937_64(4)};
        const specdec::batch_decode_options o{.gamma = gamma, .max_new_tokens = 30, .stop_tokens = {9}};
        const auto out = specdec::speculative_decode_batch(shared_draft, shared_target,
                                                           std::span<const std::vector<token_id>>(prompts), o,
                                                           std::span(rngs), 2);
        REQUIRE(out.size() == prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            INFO("sequence " << i);
            // Alone in a batch, with a fresh generator of the same seed.
            multi_markov_drafter d{&draft};
            multi_markov_verifier v{&target};
            std::vector<std::mt19937_64> one{std::mt19937_64(i + 1)};
            const auto alone = specdec::speculative_decode_batch(d, v, std::span<const std::vector<token_id>>(&prompts[i], 1),
                                                                 o, std::span(one));
            CHECK(out[i].tokens == alone[0].tokens);
            CHECK(one[0] == rngs[i]);  // the generators advanced alike
            if (gamma == 0) {
                CHECK(out[i].stats.steps == out[i].tokens.size());
                CHECK(out[i].stats.drafted_tokens == 0);
            } else {
                markov_model sd = draft, st = target;
                std::mt19937_64 rng(i + 1);
                const auto want = specdec::speculative_decode(sd, st, prompts[i],
                                                              {.gamma = gamma, .max_new_tokens = 30, .stop_tokens = {9}}, rng);
                CHECK(out[i].tokens == want.tokens);
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
    CHECK_THROWS_WITH(decoder(drafter, verifier, {.gamma = 0, .policy = specdec::gamma_policy::adaptive}),
                      contains("gamma = 0"));
    CHECK_THROWS_WITH(decoder(drafter, verifier, {.stop_tokens = {8}}), contains("stop_tokens[0] = 8"));
    CHECK_THROWS_WITH(decoder(drafter, verifier, {.lenience = 0.5f}), contains("lenience"));
    CHECK_THROWS_AS(decoder(drafter, verifier, {}, 0), std::invalid_argument);

    decoder dec(drafter, verifier, {.gamma = 3, .max_new_tokens = 50});
    CHECK_THROWS_WITH(dec.add(std::vector<token_id>{}, std::mt19937_64(1)), contains("empty prompt"));
    CHECK_THROWS_WITH(dec.add(std::vector<token_id>{0, 9}, std::mt19937_64(1)), contains("prompt[1] = 9"));
    CHECK_THROWS_WITH(dec.take(3), contains("id 3 is not a sequence"));
    const auto a = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto b = dec.add(std::vector<token_id>{2}, std::mt19937_64(2));
    dec.step();
    const std::vector<token_id> a_before(dec.generated(a).begin(), dec.generated(a).end());
    const std::size_t steps_before = dec.stats(b).steps;
    // The shared pass fails: no sequence changes, and the decoder stays usable.
    verifier.fail = true;
    CHECK_THROWS_WITH(dec.step(), contains("multi-sequence pass failed"));
    CHECK(std::vector<token_id>(dec.generated(a).begin(), dec.generated(a).end()) == a_before);
    CHECK(dec.stats(b).steps == steps_before);
    // The executor fails: its exception comes through, nothing was committed.
    verifier.fail = false;
    failing_executor no_threads;
    CHECK_THROWS_AS(dec.step(no_threads), std::system_error);
    CHECK(std::vector<token_id>(dec.generated(a).begin(), dec.generated(a).end()) == a_before);
    CHECK(dec.stats(b).steps == steps_before);
    dec.run();
    CHECK(dec.generated(a).size() == 50);
    CHECK(dec.take(b).tokens.size() == 50);

    // speculative_step_batch: bad input is reported before any sequence changes.
    std::vector<specdec::batch_sequence<std::mt19937_64>> seqs(2, {{0}, {}, std::mt19937_64(1)});
    seqs[1].tokens = {0, 8};
    specdec::batch_workspace ws;
    CHECK_THROWS_WITH(specdec::speculative_step_batch(drafter, verifier, seqs, {.gamma = 2}, ws),
                      contains("sequence tokens[1] = 8 is out of range"));
    CHECK(seqs[0].tokens == std::vector<token_id>{0});
    seqs[1].tokens.clear();
    CHECK_THROWS_WITH(specdec::speculative_step_batch(drafter, verifier, seqs, {.gamma = 2}, ws),
                      contains("sequence 1 has no tokens"));
    CHECK_THROWS_WITH(specdec::speculative_step_batch(drafter, verifier, seqs, {.gamma = 0}, ws), contains("gamma = 0"));
    std::vector<std::mt19937_64> one_rng(1);
    std::vector<std::vector<token_id>> two_prompts{{1}, {2}};
    CHECK_THROWS_WITH(specdec::speculative_decode_batch(drafter, verifier,
                                                        std::span<const std::vector<token_id>>(two_prompts), {},
                                                        std::span(one_rng)),
                      contains("one generator per prompt"));
}

TEST_CASE("A sequence whose own step throws is reported and left unchanged; the others step", "[batch][multi][errors]") {
    // A plain shared drafter that fails on the contexts of one sequence (its prompt starts with 7).
    struct picky {
        markov_model m;
        std::ptrdiff_t vocab_size() const { return m.vocab; }
        Eigen::VectorXf next_logits(std::span<const token_id> c) {
            if (c.front() == 7) throw std::runtime_error("draft engine failure");
            return m.next_logits(c);
        }
    };
    const auto target = markov_model::random(8, 2, 3);
    picky drafter{markov_model::random(8, 2, 4)};
    multi_markov_verifier verifier{&target};
    specdec::batch_decoder<picky, multi_markov_verifier, std::mt19937_64> dec(drafter, verifier,
                                                                                 {.gamma = 2, .max_new_tokens = 10});
    const auto good = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto bad = dec.add(std::vector<token_id>{7}, std::mt19937_64(2));
    CHECK_THROWS_WITH(dec.step(), contains("draft engine failure"));
    CHECK(dec.generated(bad).empty());
    CHECK(dec.stats(bad).steps == 0);
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
        {.gamma = 4, .max_new_tokens = 1, .on_step = [&](std::size_t, const specdec::step_event&) {
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
        drafter, verifier, {.gamma = 3, .max_new_tokens = 10});
    const auto a = dec.add(std::vector<token_id>{1}, std::mt19937_64(1));
    const auto b = dec.add(std::vector<token_id>{2}, std::mt19937_64(2));
    CHECK_THROWS_WITH(dec.step(), contains("score_batch changed the layout of its packed_logits") &&
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
    specdec::batch_decode_options o{.gamma = 4, .policy = specdec::gamma_policy::adaptive, .max_new_tokens = 64};
    o.adaptive.draft_cost = [](std::size_t n) { return 0.05 * static_cast<double>(n); };
    o.adaptive.pass_cost = [](std::size_t m) { return 1.0 + 0.01 * static_cast<double>(m); };
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(d, v, o);
    for (std::size_t i = 0; i < 5; ++i) (void)dec.add(std::vector<token_id>{static_cast<token_id>(i)}, std::mt19937_64(i));
    dec.run();
    for (std::size_t i = 0; i < 5; ++i) CHECK(dec.generated(i).size() == 64);
    REQUIRE(dec.controller() != nullptr);
    CHECK(dec.controller()->choices()[4] > dec.controller()->choices()[0]);  // it chose the long draft
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
    const auto own = run([&](auto& d, auto& v, auto& s, auto& ws) { specdec::speculative_step_batch(d, v, s, opts, ws); });
    const auto theirs = run([&](auto& d, auto& v, auto& s, auto& ws) {
        specdec::speculative_step_batch(std::span(d), std::span(v), std::span(s), opts, ws, jthreads);
    });
    CHECK(own == theirs);
    CHECK(jthreads.jobs == batch * steps);
    // An executor that cannot start threads: its exception comes through, no sequence changed.
    std::vector<markov_model> drafters(batch, draft), verifiers(batch, target);
    std::vector<specdec::batch_sequence<std::mt19937_64>> seqs(batch, {{1}, {}, std::mt19937_64(1)});
    specdec::batch_workspace ws;
    failing_executor no_threads;
    CHECK_THROWS_AS(specdec::speculative_step_batch(std::span(drafters), std::span(verifiers), std::span(seqs), opts, ws,
                                                    no_threads),
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
    specdec::batch_decoder<multi_markov_drafter, multi_markov_verifier, std::mt19937_64> dec(d, v, {.gamma = 3, .max_new_tokens = 20});
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
