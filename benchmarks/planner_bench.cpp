// The tree planner (decode_options::length.policy = adaptive with a tree step, planning from an
// engine profile) against every fixed configuration of a list, plain batched decoding among
// them, on a simulated accelerator: a virtual clock charges each step what a GPU-like engine
// would, so every figure is exact (it depends on the seed only) and the run takes seconds.
//
// The engine (virtual): a target pass over m positions in total (all sequences of the step)
// costs 1 unit up to 64 positions, then grows by 1/64 per position (reading the weights
// dominates until the batch's positions fill the compute); a draft call costs 0.05 units
// whatever the batch (one batched call per draft level). The planner is given exactly this curve
// as its engine_profile, fresh for every generation (a profile measured once).
//
// The models: a random order-1 Markov target over 64 tokens; the draft's logits are the target's
// plus Gaussian noise of standard deviation `noise` (a fixed second table), so the acceptance
// is set by the noise and falls by sibling rank as real drafts' does (siblings drawn without
// replacement). Markov models cost nothing on the CPU: only the virtual clock counts.
//
// Cases, for B = 1, 2, 4, 8, 16 sequences of 128 new tokens each (a batch_decoder, all added at
// once), each iteration 32 such batches from fixed prompts and seeds (the same for every case):
//   planner/noise:N/B:b/plain       γ = 0, plain batched decoding (the baseline)
//   planner/noise:N/B:b/chain:G     fixed γ = G, G = 1..8
//   planner/noise:N/B:b/tree:S      a fixed tree shape S from the list below
//   planner/noise:N/B:b/best:n      a fixed best tree (specdec::best_tree) of n = 8, 16, 32, 64 nodes
//                                   within {4,4,2,2,1,1,1,1}, from the pair's sibling acceptance
//                                   a_1..a_4 measured by a pilot on other prompts and seeds
//   planner/noise:N/B:b/planned     the planner, within the shape {4,4,2,2,1,1,1,1} (which holds
//                                   every listed shape and chain), from the profile: shapes
//                                   uniform per depth and best_tree's trees of up to 64 nodes
//   planner/noise:N/B:b/planned_uniform  the same planner among the uniform shapes only
//                                   (tree_plan_limits::best_trees = false)
//   planner/noise:N/B:b/planned_prior  the planner told the pilot's a_1..a_4 before its first
//                                   step (adaptive_gamma_options::acceptance_prior)
// Ragged plans (chains, adaptive_gamma_options::per_sequence): a batch whose sequences differ,
// half drafted well (draft noise 0.5) and half poorly (noise 3.0; which one is told by the parity
// of the prompt's token, so one LanguageModel drafts both), on two virtual engines, the
// accelerator above and a CPU-like one whose pass costs 0.5 + 0.05 per position, for B = 2..16:
//   ragged/<engine>/B:b/plain, chain:G (G = 1..6), uniform (the adaptive policy, one γ for the
//   batch), per_sequence (the adaptive policy with ragged plans), tree_planner and
//   tree_planner_no_drain (the tree planner within 2,2,1,1, with and without the drain rule),
//   each from the engine's profile.
//   Counter full_batch_tokens_per_unit: the same rate over the steps before the batch's first
//   sequence finished (while every sequence is in the batch), summed over the batches; counter
//   drained_steps: steps the drain rule made plain, per batch.
// Time is virtual (UseManualTime): tokens_per_unit is generated tokens per virtual unit.
// planner_overhead/best_trees:0|1: the planner's own CPU time per step (choose + observe), without
// and with best trees (real time, the only case here that measures this machine).
// The summary (markdown, stdout) gives per B the best fixed configuration in hindsight and the
// planner's ratio to it and to plain decoding.
//
// Run: build/bench/benchmarks/planner_bench

#include <benchmark/benchmark.h>

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

namespace {

using specdec::token_id;

constexpr int vocab = 64;
constexpr std::size_t new_tokens = 128;
constexpr double draft_call_cost = 0.05;

/// The virtual engine's costs as a profile (the clock charges the same).
specdec::engine_profile accelerator() {
    specdec::engine_profile p;
    for (std::size_t m = 1; m <= 65; ++m) p.target_pass.push_back(m <= 64 ? 1.0 : 1.0 + static_cast<double>(m - 64) / 64.0);
    p.draft_step = {draft_call_cost, draft_call_cost};  // flat in the batch
    return p;
}

/// An order-1 Markov model: logits of the next token are row[last token] (a LanguageModel, and a
/// TreeVerifier that scores a tree's root and nodes in one call).
struct markov {
    std::vector<float> table;  // vocab x vocab
    std::ptrdiff_t vocab_size() const { return vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) const {
        const auto last = static_cast<std::size_t>(context.empty() ? 0 : context.back());
        return Eigen::Map<const Eigen::VectorXf>(table.data() + last * vocab, vocab);
    }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) const {
        out.resize(vocab, static_cast<Eigen::Index>(tree.size() + 1));
        out.col(0) = next_logits(context);
        for (std::size_t i = 0; i < tree.size(); ++i)
            out.col(static_cast<Eigen::Index>(i + 1)) = next_logits(std::span<const token_id>(&tree.tokens[i], 1));
    }
};

struct pair_of_models {
    markov target, draft;
};

/// Two drafts of one target in one LanguageModel: the sequence whose prompt token is even is
/// drafted by `good`, the odd one by `poor` (ragged plans' heterogeneous batch).
struct mixed_draft {
    markov good, poor;
    std::ptrdiff_t vocab_size() const { return vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) const {
        return (context.front() % 2 == 0 ? good : poor).next_logits(context);
    }
};

/// The CPU-like virtual engine: a pass costs 0.5 + 0.05 per position, a draft call 0.05.
specdec::engine_profile cpu_like() {
    specdec::engine_profile p;
    for (std::size_t m = 1; m <= 2; ++m) p.target_pass.push_back(0.5 + 0.05 * static_cast<double>(m));
    p.draft_step = {draft_call_cost, draft_call_cost};
    return p;
}

pair_of_models make_pair(double noise) {
    std::mt19937_64 g(2024);
    std::normal_distribution<float> n(0.0f, 1.0f);
    pair_of_models m;
    m.target.table.resize(vocab * vocab);
    m.draft.table.resize(vocab * vocab);
    for (std::size_t i = 0; i < m.target.table.size(); ++i) {
        m.target.table[i] = 2.0f * n(g);
        m.draft.table[i] = m.target.table[i] + static_cast<float>(noise) * n(g);
    }
    return m;
}

struct config {
    std::string name;
    specdec::decode_options options;
    bool best_trees = true;  // the tree planner's tree_plan_limits::best_trees
};

std::vector<config> configs() {
    std::vector<config> out;
    out.push_back({"plain", {.step = specdec::chain{.gamma = 0}}});
    for (std::size_t g = 1; g <= 8; ++g) out.push_back({"chain:" + std::to_string(g), {.step = specdec::chain{.gamma = g}}});
    const std::vector<std::vector<std::size_t>> shapes{{2, 1, 1}, {2, 2, 1}, {2, 2, 1, 1}, {3, 2, 1, 1},
                                                       {2, 2, 2, 1}, {4, 2, 2, 1}, {4, 4, 2, 1}, {3, 3, 2, 2, 1}};
    for (const auto& s : shapes) {
        std::string name = "tree:";
        for (std::size_t d = 0; d < s.size(); ++d) name += (d ? "-" : "") + std::to_string(s[d]);
        out.push_back({name, {.step = specdec::tree{.shape = {.branching = s}}}});
    }
    specdec::decode_options planned{.step = specdec::tree{.shape = {.branching = {4, 4, 2, 2, 1, 1, 1, 1}}},
                                    .length = {.policy = specdec::gamma_policy::adaptive}};
    planned.length.adaptive.profile = accelerator();
    out.push_back({"planned", planned});
    // The planner among the shapes uniform per depth only (without best_tree's trees).
    out.push_back({"planned_uniform", planned, false});
    return out;
}

/// Batches per case: each of `batch` sequences from its own prompt and seed; the same prompts
/// and seeds for every configuration (common random numbers), so configurations differ by how
/// they use the same draws, not by luck.
/// 32: with 8, a cell at B = 1 moved by up to 4% with any change of the plans' random path,
/// more than the differences the tables compare.
constexpr std::size_t batches_per_case = 32;

/// Steps the drain rule made plain (gamma_controller::drained_steps()), summed over the batches
/// run_clocked has run since it was last reset.
std::size_t drained_steps = 0;

/// One batch of `batch` sequences, 128 new tokens each, drafted by `draft` and verified by
/// `target`, on the virtual clock of the engine `prof`. Sequence s starts from the prompt token
/// `first_token(s)`, with the generator seed 1000 (round + 1) + s. Returns the virtual time;
/// `tokens` the tokens generated.
template <class Draft, class FirstToken>
double run_clocked(Draft draft, markov target, const specdec::engine_profile& prof, const specdec::decode_options& base,
                   std::size_t batch, std::size_t round, FirstToken first_token, std::size_t& tokens,
                   std::pair<std::size_t, double>* full_batch = nullptr, bool best_trees = true) {
    specdec::decode_options o = base;
    o.budget.max_new_tokens = new_tokens;
    // What the step's sequences cost: the most draft calls of any sequence (levels are batched
    // across sequences) and the positions of every sequence's pass.
    std::size_t calls = 0, positions = 0;
    o.on_step = [&](const specdec::step_event& e) {
        if (e.tree) {
            calls = std::max(calls, e.tree->model_calls);
            positions += e.tree->size() + 1;
        } else {
            calls = std::max(calls, e.draft.size());
            positions += e.draft.size() + 1;
        }
    };
    // The virtual engine drafts every sequence's tree together, a call per level (a drafter
    // that scores a level at once, as `markov` does) or per parent (a plain next_logits model,
    // as mixed_draft is): tell the tree planner so (a fresh controller per batch, as the
    // decoder would make).
    constexpr bool per_parent =
        !specdec::TreeDrafter<Draft> && !specdec::BlockDrafter<Draft> && !specdec::TreeVerifier<Draft>;
    std::optional<specdec::gamma_controller> planner;
    if (o.length.policy == specdec::gamma_policy::adaptive && std::holds_alternative<specdec::tree>(o.step)) {
        const auto& shape = std::get<specdec::tree>(o.step).shape;
        planner.emplace(specdec::tree_plan_limits{.branching = shape.branching,
                                                  .max_nodes = shape.max_nodes,
                                                  .draft_calls = per_parent ? specdec::tree_draft_calls::per_parent
                                                                            : specdec::tree_draft_calls::per_level,
                                                  .drafts_per_sequence = false,
                                                  .best_trees = best_trees},
                        o.length.adaptive);
        o.length.controller = &*planner;
    }
    specdec::batch_decoder dec(draft, target, o);
    for (std::size_t s = 0; s < batch; ++s)
        (void)dec.add(std::vector<token_id>{first_token(s)}, std::mt19937_64(1000 * (round + 1) + s));
    double clock = 0.0;
    while (dec.active() != 0) {
        calls = positions = 0;
        dec.step();
        const double before = clock;
        clock += static_cast<double>(calls) * prof.draft_cost(batch) + prof.pass_cost(positions);
        // The full batch's share: the steps before the first sequence finished, and that one.
        if (full_batch != nullptr && full_batch->second == before) {
            full_batch->second = clock;
            full_batch->first = 0;
            for (std::size_t s = 0; s < batch; ++s) full_batch->first += dec.generated(s).size();
            if (dec.active() < batch) full_batch->second = -clock;  // ended: no further updates
        }
    }
    if (full_batch != nullptr) full_batch->second = std::abs(full_batch->second);
    if (const specdec::gamma_controller* ctl = dec.controller()) drained_steps += ctl->drained_steps();
    tokens = 0;
    for (std::size_t s = 0; s < batch; ++s) tokens += dec.generated(s).size();
    return clock;
}

/// One batch of the planner's cases on the accelerator.
double run_batch(const pair_of_models& m, const config& c, std::size_t batch, std::size_t round,
                 std::size_t& tokens) {
    return run_clocked(m.draft, m.target, accelerator(), c.options, batch, round,
                       [&](std::size_t s) { return static_cast<token_id>((s + 7 * round) % vocab); }, tokens, nullptr,
                       c.best_trees);
}

/// One heterogeneous batch (see the file comment) on the engine `prof`; returns the virtual time.
double run_mixed_batch(const pair_of_models& good, const pair_of_models& poor, const specdec::engine_profile& prof,
                       const specdec::decode_options& base, std::size_t batch, std::size_t round,
                       std::size_t& tokens, std::pair<std::size_t, double>* full_batch = nullptr) {
    specdec::decode_options o = base;
    if (o.length.policy == specdec::gamma_policy::adaptive) o.length.adaptive.profile = prof;
    // (The same target table: make_pair draws it first from one seed.) Prompt token parity = s's:
    // even sequences drafted well, odd ones poorly.
    return run_clocked(mixed_draft{good.draft, poor.draft}, good.target, prof, o, batch, round,
                       [&](std::size_t s) { return static_cast<token_id>((2 * round * 7 + s) % vocab); }, tokens,
                       full_batch);
}

std::map<std::tuple<std::string, std::size_t, std::string>, double> ragged_results;  // tokens per unit
std::map<std::tuple<std::string, std::size_t, std::string>, double> ragged_full;     // the same, full batch

void register_ragged() {
    const auto good = std::make_shared<pair_of_models>(make_pair(0.5));
    const auto poor = std::make_shared<pair_of_models>(make_pair(3.0));
    std::vector<config> cs;
    cs.push_back({"plain", {.step = specdec::chain{.gamma = 0}}});
    for (std::size_t g = 1; g <= 6; ++g) cs.push_back({"chain:" + std::to_string(g), {.step = specdec::chain{.gamma = g}}});
    for (const bool ragged : {false, true}) {
        specdec::decode_options a{.step = specdec::chain{.gamma = 6}, .length = {.policy = specdec::gamma_policy::adaptive}};
        a.length.adaptive.per_sequence = ragged;
        cs.push_back({ragged ? "per_sequence" : "uniform", a});
    }
    // The tree planner within 2,2,1,1 (one tree for every sequence of a step), with the drain
    // rule (its plans weighed by each sequence's own acceptance by sibling rank) and without.
    for (const bool drain : {true, false}) {
        specdec::decode_options t{.step = specdec::tree{.shape = {.branching = {2, 2, 1, 1}}},
                                  .length = {.policy = specdec::gamma_policy::adaptive}};
        t.length.adaptive.drain = drain;
        cs.push_back({drain ? "tree_planner" : "tree_planner_no_drain", t});
    }
    for (const std::string engine : {"accelerator", "cpu"}) {
        const specdec::engine_profile prof = engine == "cpu" ? cpu_like() : accelerator();
        for (const std::size_t batch : {2u, 4u, 8u, 16u}) {
            for (const auto& c : cs) {
                const std::string name = "ragged/" + engine + "/B:" + std::to_string(batch) + "/" + c.name;
                benchmark::RegisterBenchmark(name.c_str(), [good, poor, prof, batch, c, engine](benchmark::State& state) {
                    std::size_t tokens = 0, full_tokens = 0;
                    double virtual_time = 0.0, full_time = 0.0;
                    for (auto _ : state) {
                        tokens = full_tokens = 0;
                        virtual_time = full_time = 0.0;
                        drained_steps = 0;
                        for (std::size_t round = 0; round < batches_per_case; ++round) {
                            std::size_t t = 0;
                            std::pair<std::size_t, double> full{0, 0.0};
                            virtual_time += run_mixed_batch(*good, *poor, prof, c.options, batch, round, t, &full);
                            tokens += t;
                            full_tokens += full.first;
                            full_time += full.second;
                        }
                        state.SetIterationTime(virtual_time);
                    }
                    const double rate = static_cast<double>(tokens) / virtual_time;
                    state.counters["tokens_per_unit"] = rate;
                    state.counters["full_batch_tokens_per_unit"] = static_cast<double>(full_tokens) / full_time;
                    // per batch: how many steps the drain rule made plain
                    state.counters["drained_steps"] =
                        static_cast<double>(drained_steps) / static_cast<double>(batches_per_case);
                    ragged_results[{engine, batch, c.name}] = rate;
                    ragged_full[{engine, batch, c.name}] = static_cast<double>(full_tokens) / full_time;
                })->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
            }
        }
    }
}

void print_ragged_summary() {
    std::printf("\n| engine | B | plain | best fixed chain (in hindsight) | adaptive, one gamma | adaptive, ragged | "
                "ragged / one gamma | ragged / best fixed | the same while the batch is full | tree planner | "
                "tree planner, drain off | tree planner / drain off |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::map<std::pair<std::string, std::size_t>, std::map<std::string, double>> by;
    for (const auto& [k, v] : ragged_results) by[{std::get<0>(k), std::get<1>(k)}][std::get<2>(k)] = v;
    for (const auto& [key, rows] : by) {
        double best = 0;
        std::string best_name;
        for (const auto& [name, rate] : rows)
            if ((name == "plain" || name.starts_with("chain:")) && rate > best) best = rate, best_name = name;
        const double uniform = rows.at("uniform"), ragged = rows.at("per_sequence");
        const auto full = [&](const std::string& name) { return ragged_full.at({key.first, key.second, name}); };
        const double tree = rows.at("tree_planner"), tree_off = rows.at("tree_planner_no_drain");
        std::printf("| %s | %zu | %.3f | %s %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
                    key.first.c_str(), key.second, rows.at("plain"), best_name.c_str(), best, uniform, ragged,
                    ragged / uniform, ragged / best, full("per_sequence") / full(best_name), tree, tree_off,
                    tree / tree_off);
    }
}

struct result_key {
    double noise;
    std::size_t batch;
    std::string name;
    bool operator<(const result_key& o) const {
        return std::tie(noise, batch, name) < std::tie(o.noise, o.batch, o.name);
    }
};
std::map<result_key, double> results;  // tokens per virtual unit
std::map<double, std::vector<double>> pilot_acceptance;  // a_1..a_4 by draft noise

/// The pair's sibling acceptance a_1..a_4 (decode_stats::estimated_sibling_acceptance), from a
/// pilot of trees of one level of 4 children on prompts and seeds the cases do not use.
std::vector<double> pilot_sibling_acceptance(const pair_of_models& m) {
    std::vector<double> expected(4, 0.0), reached(4, 0.0), a(4, 0.0);
    for (std::size_t s = 0; s < 16; ++s) {
        std::mt19937_64 rng(50000 + s);
        const auto out = specdec::speculative_decode(
            m.draft, m.target, std::vector<token_id>{static_cast<token_id>((5 * s + 3) % vocab)},
            {.step = specdec::tree{.shape = {.branching = {4}}, .estimate_sibling_acceptance = true},
             .budget = {.max_new_tokens = new_tokens}},
            rng);
        for (std::size_t k = 0; k < 4 && k < out.stats.reached_at_sibling.size(); ++k) {
            expected[k] += out.stats.expected_accepted_at_sibling[k];
            reached[k] += static_cast<double>(out.stats.reached_at_sibling[k]);
        }
    }
    for (std::size_t k = 0; k < 4; ++k) a[k] = reached[k] > 0 ? expected[k] / reached[k] : 0.0;
    return a;
}

void register_all() {
    for (const double noise : {0.5, 1.0, 2.0}) {
        const auto models = std::make_shared<pair_of_models>(make_pair(noise));
        // Fixed best trees (specdec::best_tree) of 8 to 64 nodes within the planner's shape, from
        // the pair's sibling acceptance (a pilot): the fixed trees a user would derive offline.
        std::vector<config> cs = configs();
        const std::vector<double> a = pilot_sibling_acceptance(*models);
        pilot_acceptance[noise] = a;
        for (const std::size_t n : {8u, 16u, 32u, 64u})
            cs.push_back({"best:" + std::to_string(n),
                          {.step = specdec::tree{.shape = specdec::best_tree(
                                                     a, n, std::vector<std::size_t>{4, 4, 2, 2, 1, 1, 1, 1})}}});
        // The planner told the same a_k before its first step (adaptive_gamma_options::acceptance_prior).
        config told = *std::find_if(cs.begin(), cs.end(), [](const config& c) { return c.name == "planned"; });
        told.name = "planned_prior";
        told.options.length.adaptive.acceptance_prior = a;
        cs.push_back(told);
        for (const std::size_t batch : {1u, 2u, 4u, 8u, 16u}) {
            for (const auto& c : cs) {
                char name[128];
                std::snprintf(name, sizeof name, "planner/noise:%.1f/B:%zu/%s", noise, batch, c.name.c_str());
                benchmark::RegisterBenchmark(name, [models, batch, c, noise](benchmark::State& state) {
                    std::size_t tokens = 0;
                    double virtual_time = 0.0;
                    for (auto _ : state) {
                        tokens = 0;
                        virtual_time = 0.0;
                        for (std::size_t round = 0; round < batches_per_case; ++round) {
                            std::size_t t = 0;
                            virtual_time += run_batch(*models, c, batch, round, t);
                            tokens += t;
                        }
                        state.SetIterationTime(virtual_time);
                    }
                    const double rate = static_cast<double>(tokens) / virtual_time;
                    state.counters["tokens_per_unit"] = rate;
                    results[{noise, batch, c.name}] = rate;
                })->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
            }
        }
    }
}

void print_summary() {
    std::printf("\nSibling acceptance a_1..a_4 of the pilots (the fixed best trees' and the told planner's):");
    for (const auto& [noise, a] : pilot_acceptance)
        std::printf(" noise %.1f: %.3f %.3f %.3f %.3f;", noise, a[0], a[1], a[2], a[3]);
    std::printf("\n");
    std::printf("\n| draft noise | B | plain | best fixed (in hindsight) | planner | planner / best fixed | planner / plain "
                "| planner, uniform shapes only | planner / that | planner told the a_k | that / best fixed |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::map<std::pair<double, std::size_t>, std::vector<std::pair<std::string, double>>> by;
    for (const auto& [k, v] : results) by[{k.noise, k.batch}].push_back({k.name, v});
    for (const auto& [key, rows] : by) {
        double plain = 0, planned = 0, uniform = 0, told = 0, best = 0;
        std::string best_name;
        for (const auto& [name, rate] : rows) {
            if (name == "plain") plain = rate;
            if (name == "planned") planned = rate;
            else if (name == "planned_uniform") uniform = rate;
            else if (name == "planned_prior") told = rate;
            else if (rate > best) best = rate, best_name = name;
        }
        std::printf("| %.1f | %zu | %.3f | %s %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", key.first,
                    key.second, plain, best_name.c_str(), best, planned, planned / best, planned / plain, uniform,
                    planned / uniform, told, told / best);
    }
}

}  // namespace

/// The planner's own time per step (real CPU time, not virtual): choose() and observe() of a
/// tree planner within {4,4,2,2,1,1,1,1} from a profile, with and without best trees (whose
/// dynamic program reruns after every observation that carries sibling acceptance).
void bm_planner_overhead(benchmark::State& state) {
    const bool best = state.range(0) != 0;
    specdec::adaptive_gamma_options o;
    o.profile = accelerator();
    specdec::gamma_controller c(specdec::tree_plan_limits{.branching = {4, 4, 2, 2, 1, 1, 1, 1},
                                                          .drafts_per_sequence = false,
                                                          .best_trees = best},
                                o);
    std::vector<float> a{0.7f, 0.35f, 0.25f, 0.2f};
    std::size_t i = 0;
    for (auto _ : state) {
        a[0] = 0.6f + 0.001f * static_cast<float>(i++ % 100);  // the estimates move every step
        benchmark::DoNotOptimize(c.choose(1000, 1));
        c.observe({.gamma = 1, .drafted = 1, .emitted = 1, .sibling_acceptance = a});
    }
}
BENCHMARK(bm_planner_overhead)->Name("planner_overhead/best_trees")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    register_all();
    register_ragged();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    if (!results.empty()) print_summary();
    if (!ragged_results.empty()) print_ragged_summary();
    return 0;
}
