// Many sequences, one target pass: tokens/s of batched decoding against the batch size B, for
// batched autoregressive decoding (the baseline), speculative decoding at fixed γ = 1..6 and the
// adaptive γ policy, all through the same batch loop (specdec::batch_decoder) over the llama2
// multi-sequence engine (llama2::batch_transformer: one forward over all B·(γ+1) new positions,
// each weight matrix streamed once per pass, per-sequence KV caches). And the cost of one
// batched target pass against the positions it holds, B·(γ+1).
//
// Models: random weights at the shapes of llama2.c's stories110M (target) and stories15M
// (draft), vocabulary 32000. Random weights agree with nothing, so the acceptance is set by hand
// (as in adaptive_gamma_bench.cpp): at temperature 0 each sequence's output is the target's
// greedy continuation of its prompt, computed once; the drafter (llama2::controlled_drafter,
// examples/llama2/controlled_drafter.hpp) runs the 15M-shape model for every draft position of
// every sequence in one multi-sequence pass per position (so drafting costs what a real 15M
// draft costs) and then, at each output position, proposes the target's
// greedy token with probability α (a coin that is a fixed function of the sequence and the
// position, so every case sees the same positions drafted right and wrong), another token
// otherwise, as point masses. Acceptance is then α per position, i.i.d. (Leviathan et al.'s
// model); α = 0.8 unless ALPHA says otherwise. Trees (the tree cases): each sequence's tree is
// drafted on its own (propose_tree; the draft model's pass for one position per level, what a
// chain of the tree's depth costs — see controlled_drafter.hpp), and below the greedy path's node
// the r-th child is right with probability α_r given that the earlier ones were not: α for the
// first, then SIBLINGS (default 0.45,0.3,0.2); all sequences' trees are scored in one
// multi-sequence tree pass. Each sequence has a 4-token prompt, prefilled
// before the timed region; each iteration generates new_tokens tokens for each of the B
// sequences (48, or TOKENS), all cases the same tokens.
//
//   multi/B:<b>/gamma:<g>     fixed γ = g (g = 0: batched autoregressive decoding, no drafts)
//   multi/B:<b>/gamma:-1      the adaptive policy, γ in [0, 6], measured costs, fresh per iteration
//   multi/B:<b>/gamma:-2      the adaptive policy planning from an engine profile measured once
//                             (measured_profile() below; deterministic: nothing is timed during
//                             decoding, so the same seed gives the same tokens), fresh per iteration
//   tree/B:<b>/shape:<i>      a fixed tree shape, tree_shapes[i] (2-1-1, 2-2-1, 2-2-1-1, 3-2-1-1)
//   tree/B:<b>/shape:-1       the tree planner from the same profile, within 4-4-2-2-1-1-1-1 (every
//                             listed shape, every chain up to 8 and the plain step), fresh per
//                             iteration
//   pass/B:<b>/gamma:<g>      one target score_batch over B sequences with γ draft tokens each
//   matmul/streamed_once:<0|1>/k:<k>  one 2048 x 768 weight matrix against k packed columns: the
//                             9-column-group kernel (0, baseline) and the panelled product (1)
//
// Counters: tokens_per_s (all sequences, per second of CPU time: the engine is single-threaded,
// and CPU time is the steadier measure on a shared machine), tokens_per_step (per sequence),
// mean_gamma (the γ, or the tree's depth, asked for per step, mean over steps), drafted_per_step
// (draft tokens, or tree nodes, per step), accepted_share (accepted / drafted tokens: below α for
// long drafts, whose tokens after a rejection are never tested), positions (B·(γ+1), pass
// cases), columns_per_s (matmul cases).
//
// Run: build/bench/benchmarks/multi_sequence_bench   (cmake --preset bench; single-threaded engine)

#include <benchmark/benchmark.h>

#include <specdec/batch_decoder.hpp>
#include <specdec/measure_profile.hpp>

#include "llama2/batch_transformer.hpp"
#include "llama2/checkpoint.hpp"
#include "llama2/controlled_drafter.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using specdec::token_id;

/// Tokens generated per sequence: 48, or the TOKENS environment variable.
const std::size_t new_tokens = [] {
    const char* env = std::getenv("TOKENS");
    return env != nullptr && *env != '\0' ? static_cast<std::size_t>(std::atoi(env)) : std::size_t{48};
}();
constexpr std::size_t prompt_length = 4;

const std::shared_ptr<const llama2::checkpoint>& target_weights() {
    static const auto w = llama2::random_checkpoint("stories110M", 1234);
    return w;
}
const std::shared_ptr<const llama2::checkpoint>& draft_weights() {
    static const auto w = llama2::random_checkpoint("stories15M", 4321);
    return w;
}

std::vector<std::vector<token_id>> prompts(std::size_t batch) { return llama2::random_prompts(batch, prompt_length); }
using llama2::prefill;

double alpha() {
    const char* env = std::getenv("ALPHA");
    return env != nullptr && *env != '\0' ? std::atof(env) : 0.8;
}

/// The controlled drafter's acceptance by sibling rank: α, then the SIBLINGS list (comma
/// separated; default 0.45,0.3,0.2): the acceptance of the second, third, fourth child given
/// that the earlier ones were rejected.
std::vector<double> alphas() {
    std::vector<double> a{alpha()};
    const char* env = std::getenv("SIBLINGS");
    std::string list = env != nullptr && *env != '\0' ? env : "0.45,0.3,0.2";
    for (std::size_t at = 0; at < list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        a.push_back(std::atof(list.substr(at, comma - at).c_str()));
        at = comma + 1;
    }
    return a;
}

constexpr std::size_t max_batch = 16;

/// The target's greedy continuation of each prompt (new_tokens tokens), computed once through
/// the multi-sequence engine (batched autoregressive decoding at temperature 0).
/// Every prompt a case may use (a batch of b uses the first b).
const std::vector<std::vector<token_id>>& all_prompts() {
    static const auto p = prompts(max_batch);
    return p;
}

const std::vector<std::vector<token_id>>& greedy() {
    static const auto g = [] {
        llama2::batch_transformer target(target_weights());
        const auto& ps = all_prompts();
        specdec::batch_decoder dec(target, target,
                                   {.step = specdec::chain{.gamma = 0},
                                    .sampling = {.temperature = 0.0f},
                                    .budget = {.max_new_tokens = new_tokens}});
        std::vector<std::size_t> ids;
        for (const auto& p : ps) ids.push_back(dec.add(p, std::mt19937_64()));
        dec.run();
        std::vector<std::vector<token_id>> r;
        for (const auto id : ids) r.push_back(dec.take(id).tokens);
        return r;
    }();
    return g;
}

/// The engine profile of the planner case, measured once per process, before any case runs
/// its timed region, by specdec::measure_batch_profile (wall-clock seconds; the engine is
/// single-threaded): target_pass[m − 1], m = 1 .. 7·max_batch, one score_batch of the 110M-shape
/// engine over m positions in total spread over min(m, max_batch) sequences (the cost depends on
/// the total, docs/batching.md), the median of 3 calls at each point of the routine's grid,
/// linear between them; draft_step[n − 1], n = 1 .. max_batch, one draft_batch of the 15M-shape
/// engine drafting 4 tokens for each of n sequences, divided by 4 (median of 3);
/// draft_catch_up[n − 1], n = 1 .. 8, one draft_batch of one sequence whose context ends in n
/// tokens the draft engine has not read (median of 3).
const specdec::engine_profile& measured_profile() {
    static const specdec::engine_profile profile = [] {
        const auto ps = prompts(max_batch);
        llama2::batch_transformer target(target_weights()), draft(draft_weights());
        prefill(target, ps);
        prefill(draft, ps);
        return specdec::measure_batch_profile(draft, target, ps,
                                              {.max_positions = 7 * max_batch, .max_sequences = max_batch,
                                               .draft_tokens = 4, .repeats = 3, .sampling = {.temperature = 0.0f}});
    }();
    return profile;
}

/// One case: each iteration decodes new_tokens tokens for each of `batch` sequences with
/// `options` (fresh models, prefilled prompts, a fresh controlled drafter and decoder), timing
/// only the decoding; sets the counters of the file comment.
void decode_case(benchmark::State& state, std::size_t batch, const specdec::decode_options& options) {
    const auto ps = prompts(batch);
    std::size_t generated = 0, steps = 0, gamma_sum = 0, accepted = 0, drafted = 0;
    std::uint64_t seed = 1;
    for (auto _ : state) {
        state.PauseTiming();
        (void)greedy();
        llama2::batch_transformer target(target_weights()), draft_model(draft_weights());
        prefill(target, ps);
        prefill(draft_model, ps);
        // The 15M-shape model's draft pass for its cost, then the target's greedy token with the
        // set probabilities, as point masses (see the file comment).
        llama2::controlled_drafter<llama2::batch_transformer> draft(draft_model, all_prompts(), greedy(), alphas());
        specdec::batch_decoder<llama2::controlled_drafter<llama2::batch_transformer>, llama2::batch_transformer,
                               std::mt19937_64>
            dec(draft, target, options);
        std::vector<std::size_t> ids;
        for (const auto& p : ps) ids.push_back(dec.add(p, std::mt19937_64(seed++)));
        state.ResumeTiming();
        dec.run();
        state.PauseTiming();
        for (const auto id : ids) {
            const auto& s = dec.stats(id);
            generated += dec.generated(id).size();
            steps += s.steps;
            for (std::size_t g = 0; g < s.steps_at_gamma.size(); ++g) gamma_sum += g * s.steps_at_gamma[g];
            accepted += s.accepted_tokens;
            drafted += s.drafted_tokens;
        }
        state.ResumeTiming();
    }
    const auto per_step = [&](std::size_t n) { return steps == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(steps); };
    state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(generated), benchmark::Counter::kIsRate);
    state.counters["tokens_per_step"] = per_step(generated);
    state.counters["mean_gamma"] = per_step(gamma_sum);
    state.counters["drafted_per_step"] = per_step(drafted);
    state.counters["accepted_share"] = drafted == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(drafted);
}

void bm_multi(benchmark::State& state) {
    const bool adaptive = state.range(1) < 0;
    const bool from_profile = state.range(1) == -2;
    if (from_profile) (void)measured_profile();  // once, outside every timed region
    const std::size_t gamma = adaptive ? 6 : static_cast<std::size_t>(state.range(1));
    decode_case(state, static_cast<std::size_t>(state.range(0)),
                {.step = specdec::chain{.gamma = gamma},
                 .length = {.policy = adaptive ? specdec::gamma_policy::adaptive : specdec::gamma_policy::fixed,
                            .adaptive = {.profile = from_profile ? std::optional(measured_profile()) : std::nullopt}},
                 .sampling = {.temperature = 0.0f},
                 .budget = {.max_new_tokens = new_tokens}});
}

/// The tree shapes of the tree cases (index: the case's shape argument).
const std::vector<std::vector<std::size_t>> tree_shapes{{2, 1, 1}, {2, 2, 1}, {2, 2, 1, 1}, {3, 2, 1, 1}};

/// Trees in the same loop: a fixed shape (shape = index into tree_shapes), or the tree planner
/// (shape = -1) planning from the profile measured once, within {4, 4, 2, 2, 1, 1, 1, 1}, which
/// holds every listed shape and every chain up to 8 (and the plain step), fresh per iteration.
/// The controlled drafter proposes each sequence's tree (propose_tree: one sequence at a time,
/// as batch_decoder drafts trees; the planner's chain plans through draft_batch, for all
/// sequences at once), and the target scores every sequence's tree in one multi-sequence tree
/// pass (score_tree_batch).
void bm_tree(benchmark::State& state) {
    const bool planned = state.range(1) < 0;
    if (planned) (void)measured_profile();  // once, outside every timed region
    const std::vector<std::size_t> shape =
        planned ? std::vector<std::size_t>{4, 4, 2, 2, 1, 1, 1, 1} : tree_shapes[static_cast<std::size_t>(state.range(1))];
    decode_case(state, static_cast<std::size_t>(state.range(0)),
                {.step = specdec::tree{.shape = {.branching = shape}},
                 .length = {.policy = planned ? specdec::gamma_policy::adaptive : specdec::gamma_policy::fixed,
                            .adaptive = {.profile = planned ? std::optional(measured_profile()) : std::nullopt}},
                 .sampling = {.temperature = 0.0f},
                 .budget = {.max_new_tokens = new_tokens}});
}

void bm_pass(benchmark::State& state) {
    const auto batch = static_cast<std::size_t>(state.range(0));
    const auto gamma = static_cast<std::size_t>(state.range(1));
    const auto ps = prompts(batch);
    llama2::batch_transformer target(target_weights());
    prefill(target, ps);
    std::vector<std::vector<token_id>> drafts(batch);
    std::mt19937 rng(3);
    for (auto& d : drafts)
        for (std::size_t i = 0; i < gamma; ++i) d.push_back(static_cast<token_id>(3 + rng() % 30000));
    std::vector<specdec::score_request> requests;
    for (std::size_t i = 0; i < batch; ++i) requests.push_back({i, ps[i], drafts[i]});
    specdec::packed_logits out;
    out.shape(target.vocab_size(), requests);
    for (auto _ : state) {
        target.score_batch(requests, out);  // the same positions each time: the cache rolls back to the prompt
        benchmark::DoNotOptimize(out.data());
    }
    state.counters["positions"] = static_cast<double>(batch * (gamma + 1));
}

/// One 110M-shape FFN matrix (w1, 2048 x 768) against k packed columns: the kernel that sweeps
/// the matrix once per group of 9 columns (the baseline) and the panelled product that streams
/// it once.
void bm_matmul(benchmark::State& state) {
    const bool once = state.range(0) != 0;
    const auto k = static_cast<std::ptrdiff_t>(state.range(1));
    const auto& c = target_weights()->cfg;
    const float* w = target_weights()->w.w1.data();
    Eigen::MatrixXf x = Eigen::MatrixXf::Random(c.dim, k), y(c.hidden_dim, k);
    for (auto _ : state) {
        if (once) llama2::matmul_streamed_once(w, c.hidden_dim, c.dim, x.data(), c.dim, k, y.data(), c.hidden_dim);
        else llama2::detail::matmul(w, c.hidden_dim, c.dim, x.data(), c.dim, k, y.data(), c.hidden_dim);
        benchmark::DoNotOptimize(y.data());
    }
    state.counters["columns_per_s"] = benchmark::Counter(static_cast<double>(k), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(bm_matmul)
    ->Name("matmul")
    ->ArgsProduct({{0, 1}, {9, 32, 112}})
    ->ArgNames({"streamed_once", "k"})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(bm_multi)
    ->Name("multi")
    ->ArgsProduct({{1, 2, 4, 8, 16}, {0, 1, 2, 3, 4, 5, 6, -1, -2}})
    ->ArgNames({"B", "gamma"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(bm_tree)
    ->Name("tree")
    ->ArgsProduct({{1, 2, 4, 8, 16}, {0, 1, 2, 3, -1}})
    ->ArgNames({"B", "shape"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(bm_pass)
    ->Name("pass")
    ->ArgsProduct({{1, 2, 4, 8, 16}, {0, 1, 3, 6}})
    ->ArgNames({"B", "gamma"})
    ->MinTime(0.5)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
