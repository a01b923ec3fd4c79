// Compiled mode against header-only use: the same source built twice, as compiled_mode_bench
// (header-only: the hot core inline in this translation unit) and compiled_mode_bench_compiled
// (linked with specdec::compiled: SPECDEC_COMPILED defined, the core only declared here and
// compiled once in src/specdec_core.cpp). Each binary times the public calls that run the core at
// a language model's vocabulary (V = 32000) beside the bound of the data they read:
//
//   verify/block/gamma:4       specdec::verify, block verification, γ = 4, draft columns
//   verify/token/gamma:4       the same with token verification
//   sample/standardize_and_sample   one row standardized (temperature 0.8, top-p 0.95) and sampled
//   tree/traversal/2,2,1,1     specdec::verify_tree on a 14-node tree, traversal verification
//   decode/chain/gamma:4       specdec::speculative_decode of 64 tokens with two plain models
//                              (next_logits maps one of 64 stored rows): in compiled mode the loop
//                              the library compiled once, reached through detail::model_ref
//   decode/autoregressive      specdec::autoregressive_decode of 64 tokens, the same target
//   bound/read/cols:<n>        one pass summing n columns of V floats (Eigen, vectorized): reading
//                              the logits a call needs, with nothing else done (cols 5: the target's
//                              rows of a γ = 4 verification; 1: one row)
//
// Random logits (normal, scale 3) and draft columns made from perturbed logits, fixed seeds; every
// iteration draws fresh uniforms from the same generator type. The A/B is
// scripts/bench_compiled_ab.py, which runs the two binaries alternately and reports the median
// ratio per benchmark (compiled / header-only): on the same machine, in the same minutes.
//
//   cmake --preset bench && cmake --build --preset bench --target compiled_mode_bench compiled_mode_bench_compiled
//   python3 scripts/bench_compiled_ab.py build/bench/benchmarks/compiled_mode_bench build/bench/benchmarks/compiled_mode_bench_compiled

#include <benchmark/benchmark.h>

#include <specdec/sampling.hpp>
#include <specdec/speculative_decode.hpp>
#include <specdec/tree.hpp>
#include <specdec/tree_verify.hpp>
#include <specdec/verify.hpp>

#include <Eigen/Core>

#include <cstdint>
#include <random>
#include <vector>

namespace {

constexpr Eigen::Index vocab = 32000;
constexpr Eigen::Index gamma = 4;

Eigen::MatrixXf random_logits(Eigen::Index cols, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.0f, 3.0f);  // test data only
    Eigen::MatrixXf m(vocab, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = n(g);
    return m;
}

/// Draft distributions close to the target's (standardized perturbed logits), and tokens drawn
/// from them.
struct draft_data {
    Eigen::MatrixXf probs;
    std::vector<specdec::token_id> tokens;
};
draft_data make_draft(const Eigen::MatrixXf& target, const specdec::sampling_config& s, std::uint64_t seed) {
    draft_data d;
    Eigen::MatrixXf perturbed = target.leftCols(gamma) + 0.5f * random_logits(gamma, seed);
    d.probs.resize(vocab, gamma);
    std::mt19937_64 g(seed + 1);
    specdec::sampling_workspace ws;
    for (Eigen::Index j = 0; j < gamma; ++j) {
        Eigen::VectorXf q(vocab);
        d.tokens.push_back(specdec::standardize_and_sample(perturbed.col(j), s, q, specdec::uniform01(g), ws));
        d.probs.col(j) = q;
    }
    return d;
}

void bm_verify(benchmark::State& state, specdec::verification_scheme scheme) {
    const specdec::sampling_config s{.temperature = 1.0f};
    const Eigen::MatrixXf target = random_logits(gamma + 1, 11);
    const draft_data d = make_draft(target, s, 12);
    specdec::verify_workspace ws;
    std::mt19937_64 rng(3);
    std::size_t accepted = 0;
    for (auto _ : state) {
        const auto r = specdec::verify(target, d.tokens, d.probs, s, rng, ws, {.scheme = scheme});
        accepted += r.accepted;
        benchmark::DoNotOptimize(r.next_token);
    }
    state.counters["accepted"] = benchmark::Counter(static_cast<double>(accepted), benchmark::Counter::kAvgIterations);
}

void bm_sample(benchmark::State& state) {
    const specdec::sampling_config s{.temperature = 0.8f, .top_p = 0.95f};
    const Eigen::MatrixXf logits = random_logits(1, 21);
    Eigen::VectorXf out(vocab);
    specdec::sampling_workspace ws;
    std::mt19937_64 rng(4);
    for (auto _ : state) {
        const auto t = specdec::standardize_and_sample(logits.col(0), s, out, specdec::uniform01(rng), ws);
        benchmark::DoNotOptimize(t);
    }
}

void bm_tree(benchmark::State& state) {
    const specdec::sampling_config s{.temperature = 1.0f};
    // A 2,2,1,1 tree: 2 + 4 + 4 + 4 = 14 nodes, each with its own draft column.
    specdec::draft_tree tree;
    std::vector<std::int32_t> level{-1};
    for (const int branching : {2, 2, 1, 1}) {
        std::vector<std::int32_t> next;
        for (const auto parent : level)
            for (int k = 0; k < branching; ++k) next.push_back(tree.add(parent, 0));
        level = next;
    }
    const auto nodes = static_cast<Eigen::Index>(tree.size());
    const Eigen::MatrixXf target = random_logits(nodes + 1, 31);
    tree.resize_probs(vocab, nodes);
    std::mt19937_64 g(32);
    specdec::sampling_workspace sws;
    for (Eigen::Index i = 0; i < nodes; ++i) {
        // The node's column: the target's row at its parent, perturbed; its token drawn from it.
        const auto parent = tree.parents[static_cast<std::size_t>(i)];
        const Eigen::VectorXf perturbed = target.col(parent + 1) + 0.5f * random_logits(1, 40 + static_cast<std::uint64_t>(i));
        Eigen::VectorXf q(vocab);
        tree.tokens[static_cast<std::size_t>(i)] = specdec::standardize_and_sample(perturbed, s, q, specdec::uniform01(g), sws);
        tree.probs.col(i) = q;
    }
    specdec::tree_verify_workspace ws;
    std::mt19937_64 rng(5);
    std::size_t accepted = 0;
    for (auto _ : state) {
        const auto r = specdec::verify_tree(target, tree, s, rng, ws);
        accepted += r.accepted;
        benchmark::DoNotOptimize(r.next_token);
    }
    state.counters["accepted"] = benchmark::Counter(static_cast<double>(accepted), benchmark::Counter::kAvgIterations);
}

/// A plain model over stored rows: next_logits maps the row the last token and the context's
/// length pick (no model work, so the loop's own cost shows).
struct table_model {
    Eigen::MatrixXf rows;
    std::ptrdiff_t vocab_size() const { return vocab; }
    Eigen::Map<const Eigen::VectorXf> next_logits(std::span<const specdec::token_id> context) const {
        const auto r = static_cast<Eigen::Index>((static_cast<std::size_t>(context.back()) * 31 + context.size()) %
                                                 static_cast<std::size_t>(rows.cols()));
        return Eigen::Map<const Eigen::VectorXf>(rows.col(r).data(), vocab);
    }
};

void bm_decode(benchmark::State& state, bool speculative) {
    table_model target{random_logits(64, 61)};
    table_model draft{target.rows + 0.5f * random_logits(64, 62)};
    const std::vector<specdec::token_id> prompt{1, 2, 3};
    const specdec::decode_options o{.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = 64}};
    std::mt19937_64 rng(6);
    std::size_t steps = 0;
    for (auto _ : state) {
        const auto r = speculative ? specdec::speculative_decode(draft, target, prompt, o, rng)
                                   : specdec::autoregressive_decode(target, prompt, o, rng);
        steps += r.stats.steps;
        benchmark::DoNotOptimize(r.tokens.data());
    }
    state.counters["steps"] = benchmark::Counter(static_cast<double>(steps), benchmark::Counter::kAvgIterations);
}

void bm_bound(benchmark::State& state) {
    const Eigen::MatrixXf m = random_logits(state.range(0), 51);
    for (auto _ : state) {
        float sum = m.sum();
        benchmark::DoNotOptimize(sum);
    }
}

}  // namespace

BENCHMARK_CAPTURE(bm_verify, block, specdec::verification_scheme::block)->Name("verify/block/gamma:4");
BENCHMARK_CAPTURE(bm_verify, token, specdec::verification_scheme::token)->Name("verify/token/gamma:4");
BENCHMARK(bm_sample)->Name("sample/standardize_and_sample");
BENCHMARK(bm_tree)->Name("tree/traversal/2,2,1,1");
BENCHMARK_CAPTURE(bm_decode, chain, true)->Name("decode/chain/gamma:4")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(bm_decode, autoregressive, false)->Name("decode/autoregressive")->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_bound)->Name("bound/read/cols")->Arg(1)->Arg(5);

BENCHMARK_MAIN();
