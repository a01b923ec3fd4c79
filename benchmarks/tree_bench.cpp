// Benchmarks of exact tree verification (specdec::verify_tree) beside the chain of the same depth
// verified by block verification, and beside the bound, on identical inputs:
//
//   BM_verify_tree/<scheme>/<shape>/V:<vocab>/<sampling>   verify_tree (traversal or recursive
//                             rejection) on draft trees of the shape
//   BM_verify_chain/<shape>/V:<vocab>/<sampling>   specdec::verify (block verification, the
//                             default) on the tree's first root-to-leaf path: a chain of the same
//                             depth, its columns and draft distributions taken from the tree
//   BM_bound_tree/<scheme>/<shape>/V:<vocab>/<sampling>   one vectorized log-sum-exp pass over
//                             each target row the tree's verification read (recorded at setup,
//                             tree_verify_workspace::rows_read): the least work of any
//                             implementation that normalizes those rows
//
//   <shape>     chain4 {1,1,1,1} (4 nodes) | 2x1x1x1 (8) | 2x2x1x1 (12) | 4x2x1x1 (28)
//   <sampling>  T:1 (plain, temperature 1) | topk40 (top-k 40 at temperature 1)
//
// Inputs (fixed at setup, K = 8 slots per case, each with its own tree and its own seed): target
// logits N(0, 2²) for the root and every node; each node's children drawn without replacement
// from q = standardize(its target logits + N(0, 1²) noise) with the case's sampling, the
// columns marked standardized (so neither side checks them, as in decoding with a model
// drafter). That gives a draft that agrees with the target for roughly half the mass; the
// counters report what happened: accepted (mean tokens accepted per call), rows (mean target
// rows normalized per call), nodes.
//
// Timing: one iteration = the K calls; each call restarts its seed's stream (splitmix64), so
// every repetition takes the same decisions. Compare BM_verify_tree with BM_bound_tree of the
// same case (the ratio is the price of the algorithm over the rows it needs) and with
// BM_verify_chain of the same shape (what the extra candidates cost the verifier).

#include <benchmark/benchmark.h>

#include <specdec/specdec.hpp>

#include "baselines.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using specdec::token_id;

struct shape_case {
    const char* name;
    std::vector<std::size_t> branching;
};

const std::vector<shape_case>& shapes() {
    static const std::vector<shape_case> s{
        {"chain4", {1, 1, 1, 1}}, {"2x1x1x1", {2, 1, 1, 1}}, {"2x2x1x1", {2, 2, 1, 1}}, {"4x2x1x1", {4, 2, 1, 1}}};
    return s;
}

constexpr int kSlots = 8;

/// One slot: a tree, the target's logits at its root and nodes, the chain along its first path.
struct slot {
    specdec::draft_tree tree;
    Eigen::MatrixXf scores;        // V x (nodes + 1)
    Eigen::MatrixXf chain_scores;  // V x (depth + 1): the root and the first path's nodes
    Eigen::MatrixXf chain_q;       // V x depth
    std::vector<token_id> chain_tokens;
    std::uint64_t seed = 0;
    std::size_t rows_read[2] = {0, 0};  // by scheme (recursive rejection, traversal)
};

/// Builds a slot: full tree of `branching` in breadth-first order, children drawn without
/// replacement from the standardized noisy target column of their parent.
slot make_slot(Eigen::Index vocab, const std::vector<std::size_t>& branching, const specdec::sampling_config& s,
               std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> target_logit(0.0f, 2.0f), noise(0.0f, 1.0f);
    slot out;
    out.seed = seed * 0x9e3779b97f4a7c15ull + 1;
    std::size_t nodes = 0, level = 1;
    for (std::size_t b : branching) nodes += (level *= b);
    out.scores.resize(vocab, static_cast<Eigen::Index>(nodes + 1));
    for (Eigen::Index k = 0; k < out.scores.size(); ++k) out.scores.data()[k] = target_logit(g);
    out.tree.resize_probs(vocab, static_cast<Eigen::Index>(nodes));
    specdec::sampling_workspace sws;
    Eigen::VectorXf noisy(vocab), q(vocab), left(vocab);
    std::vector<std::int32_t> parents{-1}, next;
    for (std::size_t b : branching) {
        next.clear();
        for (std::int32_t par : parents) {
            for (Eigen::Index k = 0; k < vocab; ++k) noisy[k] = out.scores(k, par + 1) + noise(g);
            specdec::standardize(noisy, s, q, sws);
            left = q;
            for (std::size_t j = 0; j < b; ++j) {
                std::uniform_real_distribution<double> u(0.0, 1.0);
                const auto x = static_cast<token_id>(specdec::sample_from_weights(left, u(g), sws));
                left[x] = 0.0f;
                const std::int32_t node = out.tree.add(par, x, specdec::sibling_draws::without_replacement);
                out.tree.probs.col(node) = q;
                next.push_back(node);
            }
        }
        parents = next;
    }
    out.tree.standardized = true;
    // The chain: the root, then first children all the way down (nodes 0, b0, ... in BFS order).
    std::vector<std::int32_t> path;
    for (std::int32_t v = -1;;) {
        std::int32_t first = -1;
        for (std::size_t i = 0; i < out.tree.size(); ++i)
            if (out.tree.parents[i] == v) {
                first = static_cast<std::int32_t>(i);
                break;
            }
        if (first < 0) break;
        path.push_back(first);
        v = first;
    }
    const auto d = static_cast<Eigen::Index>(path.size());
    out.chain_scores.resize(vocab, d + 1);
    out.chain_q.resize(vocab, d);
    out.chain_scores.col(0) = out.scores.col(0);
    for (Eigen::Index i = 0; i < d; ++i) {
        const auto node = path[static_cast<std::size_t>(i)];
        out.chain_scores.col(i + 1) = out.scores.col(node + 1);
        out.chain_q.col(i) = out.tree.probs.col(node);
        out.chain_tokens.push_back(out.tree.tokens[static_cast<std::size_t>(node)]);
    }
    return out;
}

struct case_spec {
    Eigen::Index vocab;
    std::size_t shape;
    bool topk;
    specdec::sampling_config sampling() const {
        return topk ? specdec::sampling_config{.temperature = 1.0f, .top_k = 40} : specdec::sampling_config{};
    }
    std::string suffix() const {
        return std::string(shapes()[shape].name) + "/V:" + std::to_string(vocab) + (topk ? "/topk40" : "/T:1");
    }
};

/// The slots of a case, built once and shared by its benchmarks.
const std::vector<slot>& slots_of(const case_spec& c) {
    static std::vector<std::pair<std::string, std::vector<slot>>> cache;
    const std::string key = c.suffix();
    for (auto& [k, v] : cache)
        if (k == key) return v;
    if (cache.size() > 2) cache.erase(cache.begin());  // bounded memory: cases run in order
    std::vector<slot> v;
    for (int i = 0; i < kSlots; ++i) {
        v.push_back(make_slot(c.vocab, shapes()[c.shape].branching, c.sampling(), 1000u * c.shape + static_cast<std::uint64_t>(i) + 1));
        // Record the rows each scheme reads for this slot (its decisions are fixed by its seed).
        specdec::tree_verify_workspace ws;
        for (int scheme = 0; scheme < 2; ++scheme) {
            specdec_bench::splitmix64 rng{v.back().seed};
            specdec::verify_tree(v.back().scores, v.back().tree, c.sampling(), rng, ws,
                                 {.scheme = scheme == 1 ? specdec::tree_verification_scheme::traversal
                                                        : specdec::tree_verification_scheme::recursive_rejection});
            v.back().rows_read[scheme] = ws.rows_read();
        }
    }
    cache.emplace_back(key, std::move(v));
    return cache.back().second;
}

void set_counters(benchmark::State& state, double accepted, double rows, std::size_t nodes) {
    state.counters["accepted"] = accepted / kSlots;
    state.counters["rows"] = rows / kSlots;
    state.counters["nodes"] = static_cast<double>(nodes);
}

void bm_verify_tree(benchmark::State& state, case_spec c, specdec::tree_verification_scheme scheme) {
    const auto& slots = slots_of(c);
    const auto s = c.sampling();
    specdec::tree_verify_workspace ws;
    double accepted = 0, rows = 0;
    for (auto _ : state) {
        accepted = rows = 0;
        for (const slot& sl : slots) {
            specdec_bench::splitmix64 rng{sl.seed};
            const auto r = specdec::verify_tree(sl.scores, sl.tree, s, rng, ws, {.scheme = scheme});
            benchmark::DoNotOptimize(r.next_token);
            accepted += static_cast<double>(r.accepted);
            rows += static_cast<double>(ws.rows_read());
        }
    }
    set_counters(state, accepted, rows, slots.front().tree.size());
}

void bm_verify_chain(benchmark::State& state, case_spec c) {
    const auto& slots = slots_of(c);
    const auto s = c.sampling();
    specdec::verify_workspace ws;
    const specdec::verify_options opts{.check_draft_distributions = false};  // standardized, as the tree's
    double accepted = 0;
    for (auto _ : state) {
        accepted = 0;
        for (const slot& sl : slots) {
            specdec_bench::splitmix64 rng{sl.seed};
            const auto r = specdec::verify(sl.chain_scores, sl.chain_tokens, sl.chain_q, s, rng, ws, opts);
            benchmark::DoNotOptimize(r.next_token);
            accepted += static_cast<double>(r.accepted);
        }
    }
    set_counters(state, accepted, 0.0, slots.front().chain_tokens.size());
    state.counters.erase("rows");
}

void bm_bound_tree(benchmark::State& state, case_spec c, specdec::tree_verification_scheme scheme) {
    const auto& slots = slots_of(c);
    const int k = scheme == specdec::tree_verification_scheme::traversal ? 1 : 0;
    double rows = 0;
    for (auto _ : state) {
        rows = 0;
        for (const slot& sl : slots) {
            // The rows read: the root and the first rows_read − 1 node columns (the same amount
            // of memory as the rows the algorithm read, which the bound only has to stream).
            for (std::size_t j = 0; j < sl.rows_read[k]; ++j) {
                float v = specdec_bench::log_sum_exp(sl.scores.col(static_cast<Eigen::Index>(j)).data(), c.vocab);
                benchmark::DoNotOptimize(v);
            }
            rows += static_cast<double>(sl.rows_read[k]);
        }
    }
    set_counters(state, 0.0, rows, slots.front().tree.size());
    state.counters.erase("accepted");
}

const char* scheme_name(specdec::tree_verification_scheme s) {
    return s == specdec::tree_verification_scheme::traversal ? "traversal" : "recursive";
}

int register_all() {
    for (Eigen::Index vocab : {Eigen::Index{4096}, Eigen::Index{32000}})
        for (bool topk : {false, true})
            for (std::size_t sh = 0; sh < shapes().size(); ++sh) {
                const case_spec c{vocab, sh, topk};
                for (auto scheme :
                     {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection}) {
                    benchmark::RegisterBenchmark(
                        ("BM_verify_tree/" + std::string(scheme_name(scheme)) + "/" + c.suffix()).c_str(),
                        bm_verify_tree, c, scheme)
                        ->Unit(benchmark::kMicrosecond);
                    benchmark::RegisterBenchmark(
                        ("BM_bound_tree/" + std::string(scheme_name(scheme)) + "/" + c.suffix()).c_str(),
                        bm_bound_tree, c, scheme)
                        ->Unit(benchmark::kMicrosecond);
                }
                benchmark::RegisterBenchmark(("BM_verify_chain/" + c.suffix()).c_str(), bm_verify_chain, c)
                    ->Unit(benchmark::kMicrosecond);
            }
    return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
