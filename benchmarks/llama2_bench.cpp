// Benchmarks of the llama2.c example engine (examples/llama2/transformer.hpp): the cost of one
// decoding step, of one batched verification pass over gamma+1 positions, of the same positions
// done as separate steps, and of the matrix kernel against Eigen's products -- set against the
// measured memory-streaming bandwidth of this machine.
//
// Model: the checkpoint named by the environment variable SPECDEC_BENCH_CHECKPOINT, or else
// random weights at the shapes of llama2.c's stories15M and stories110M, written to a temporary
// file and read back (the file is removed right after loading).
//
// Counters:
//   weight_GBps   weight bytes a pass streams (transformer::streamed_weight_bytes) / time per pass
//   bw_fraction   weight_GBps / the streaming bandwidth measured by llama2/bandwidth
//   cost_vs_step  time of the benchmarked operation / time of one single-token step (same model,
//                 as llama2/step measured it just before; ~1 for llama2/step itself)
//   positions_per_s  positions run through the model per second
//
// Targets (single thread, 110M shape): one score() pass over 5 positions costs <= 1.5x one
// single-token step; a single-token step streams weights at >= 70% of the measured bandwidth.
//
// After the benchmarks, a derived report (markdown, stdout) turns the measured times into
// predictions for speculative decoding with a stories15M-shape draft and a stories110M-shape
// target (Leviathan et al. 2023), from the median CPU time per iteration of each benchmark over
// its repetitions (e.g. --benchmark_repetitions=5). CPU time, as Google Benchmark's rate counters
// use: the work is single-threaded, so on an idle machine it equals wall time, and on a shared one
// it leaves out the time other processes hold the core.
//   c      the cost coefficient, t_step(15M shape) / t_step(110M shape)  (Sec. 3.1)
//   alpha  the acceptance rate of the real pair in SPECDEC_MODELS_DIR (stories260K target,
//          llama2xs_tok512_279K draft), measured here as measure-alpha does; without the models,
//          the values measure-alpha printed, labeled as such
//   Thm. 3.8  the expected speedup (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), which
//          assumes the verification pass over gamma+1 positions costs one target step, at the
//          optimal gamma and at gamma = 4
//   measured cost  Eq. 1 with the measured pass: time per token
//          (gamma t_draft + t_score(gamma+1)) / E[tokens per step], E = (1 - alpha^(gamma+1)) / (1 - alpha),
//          against t_step of the target, for gamma = 2..8
// The report needs llama2/step for both shapes (and llama2/score for the measured-cost table);
// with SPECDEC_BENCH_CHECKPOINT there is one model only and no report. The console display is
// Google Benchmark's ConsoleReporter whatever --benchmark_format says; use --benchmark_out for
// JSON.
//
// Build with -O3 -march=native (the kernels use Eigen's SIMD packets for the target ISA).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <benchmark/benchmark.h>

#include "recording_reporter.hpp"

// Eigen 3.4's AVX-512 GEMM packing (used by the Eigen comparison in bm_matmul) trips GCC 12's
// -Wmaybe-uninitialized inside <immintrin.h>; it is a false positive in third-party code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <Eigen/Core>

#include <specdec/specdec.hpp>

#include "llama2/checkpoint.hpp"
#include "llama2/transformer.hpp"

namespace {

namespace fs = std::filesystem;
using tokens = std::vector<std::int32_t>;

constexpr std::size_t context_length = 64;

/// Sums a buffer much larger than the last-level cache with independent SIMD accumulators and
/// the same software prefetch as the kernels: the single-thread streaming read bandwidth
/// (bytes / s), best of `runs`. The buffer is allocated like the weights (llama2::tensor).
double measure_bandwidth(std::size_t bytes, int runs) {
    using namespace Eigen::internal;
    using packet = llama2::detail::packet;
    constexpr std::ptrdiff_t P = llama2::detail::packet_size;
    constexpr std::ptrdiff_t ahead = llama2::detail::prefetch_distance;
    static llama2::tensor buffer;
    const auto n = std::ptrdiff_t(bytes / sizeof(float)) / (4 * P) * (4 * P);
    if (std::ptrdiff_t(buffer.size()) != n + ahead) {
        buffer.assign(std::size_t(n + ahead), 0.0f);
        for (std::size_t i = 0; i < buffer.size(); i += 1024) buffer[i] = float(i % 7);
    }
    double best = 0.0;
    for (int r = 0; r < runs; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        packet a0 = pset1<packet>(0.0f), a1 = a0, a2 = a0, a3 = a0;
        const float* p = buffer.data();
        for (std::ptrdiff_t i = 0; i < n; i += 4 * P) {
            prefetch(p + i + ahead);
            a0 = padd(a0, pload<packet>(p + i));
            a1 = padd(a1, pload<packet>(p + i + P));
            a2 = padd(a2, pload<packet>(p + i + 2 * P));
            a3 = padd(a3, pload<packet>(p + i + 3 * P));
        }
        const float s = predux(padd(padd(a0, a1), padd(a2, a3)));
        benchmark::DoNotOptimize(s);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(n) * sizeof(float) / secs);
    }
    return best;
}

/// The machine's streaming bandwidth, measured once (512 MiB buffer, best of 10 runs: the best
/// run is the one least disturbed by other processes).
double bandwidth() {
    static const double bw = measure_bandwidth(std::size_t{512} << 20, 10);
    return bw;
}

struct bench_model {
    std::string label;
    std::shared_ptr<const llama2::checkpoint> ck;
};

/// The models to benchmark: SPECDEC_BENCH_CHECKPOINT, or random stories15M / stories110M.
std::vector<std::string> model_labels() {
    if (const char* env = std::getenv("SPECDEC_BENCH_CHECKPOINT"); env != nullptr && *env != '\0')
        return {fs::path(env).filename().string()};
    return {"random_stories15M", "random_stories110M"};
}

const bench_model& get_model(const std::string& label) {
    static std::map<std::string, bench_model> cache;
    auto& m = cache[label];
    if (m.ck) return m;
    m.label = label;
    if (const char* env = std::getenv("SPECDEC_BENCH_CHECKPOINT"); env != nullptr && *env != '\0') {
        m.ck = std::make_shared<const llama2::checkpoint>(llama2::read_checkpoint(env));
        return m;
    }
    const std::string preset = label.substr(std::string("random_").size());
    const llama2::config c = *llama2::preset_config(preset);
    const fs::path file = fs::temp_directory_path() /
                          ("specdec_llama2_bench_" + preset + "_" + std::to_string(std::random_device{}()) + ".bin");
    llama2::write_checkpoint(file, c, llama2::random_weights(c, 1234));
    try {
        m.ck = std::make_shared<const llama2::checkpoint>(llama2::read_checkpoint(file));
    } catch (...) {
        fs::remove(file);
        throw;
    }
    fs::remove(file);
    return m;
}

tokens random_tokens(std::size_t n, std::int32_t vocab, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::int32_t> d(3, vocab - 1);
    tokens t(n);
    for (auto& x : t) x = d(rng);
    t[0] = 1;  // BOS
    return t;
}

/// Time of one single-token step per model (seconds): what llama2/step measured last, or, when
/// that benchmark did not run (filtered out), the median of 15 steps measured here.
std::map<std::string, double>& step_seconds_cache() {
    static std::map<std::string, double> cache;
    return cache;
}

double single_step_seconds(const bench_model& m) {
    auto& cache = step_seconds_cache();
    if (auto it = cache.find(m.label); it != cache.end()) return it->second;
    llama2::transformer model(m.ck);
    tokens ctx = random_tokens(context_length + 1, std::int32_t(model.vocab_size()), 7);
    benchmark::DoNotOptimize(model.next_logits(std::span(ctx).first(context_length)));
    std::vector<double> times;
    for (int i = 0; i < 15; ++i) {
        ctx.back() = 3 + i;
        const auto t0 = std::chrono::steady_clock::now();
        benchmark::DoNotOptimize(model.next_logits(ctx));
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + 7, times.end());
    return cache[m.label] = times[7];
}

void set_weight_counters(benchmark::State& state, const llama2::transformer& model, double passes_per_iter) {
    const double bytes = double(model.streamed_weight_bytes()) * passes_per_iter * double(state.iterations());
    state.counters["weight_GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
    state.counters["bw_fraction"] = benchmark::Counter(bytes / bandwidth(), benchmark::Counter::kIsRate);
}

void set_cost_vs_step(benchmark::State& state, const bench_model& m) {
    // elapsed / (iterations * t_step): an inverted rate.
    state.counters["cost_vs_step"] =
        benchmark::Counter(double(state.iterations()) * single_step_seconds(m),
                           benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

/// The memory-streaming probe itself.
void bm_bandwidth(benchmark::State& state) {
    const std::size_t bytes = std::size_t{512} << 20;
    double last = 0.0;
    for (auto _ : state) benchmark::DoNotOptimize(last = measure_bandwidth(bytes, 1));
    state.SetBytesProcessed(std::int64_t(bytes) * state.iterations());
    state.counters["GBps"] = benchmark::Counter(double(bytes) * double(state.iterations()) / 1e9,
                                                benchmark::Counter::kIsRate);
    state.counters["best_GBps"] = bandwidth() / 1e9;
}

/// One decoding step: next_logits on a 64-token cached context extended by one token.
void bm_step(benchmark::State& state, const std::string& label) {
    const bench_model& m = get_model(label);
    llama2::transformer model(m.ck);
    tokens ctx = random_tokens(context_length + 1, std::int32_t(model.vocab_size()), 7);
    benchmark::DoNotOptimize(model.next_logits(std::span(ctx).first(context_length)));
    std::int32_t t = 3;
    const auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) {
        ctx.back() = t;  // a different last token each time: exactly one new position
        t = t + 1 < model.vocab_size() ? t + 1 : 3;
        benchmark::DoNotOptimize(model.next_logits(ctx));
    }
    step_seconds_cache()[label] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                                  double(state.iterations());
    set_weight_counters(state, model, 1.0);
    state.counters["positions_per_s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
    set_cost_vs_step(state, m);
}

/// One verification pass: score(context, draft) over state.range(0) = gamma + 1 new positions
/// (the last context token, not yet cached, plus gamma draft tokens), as in speculative decoding.
void bm_score(benchmark::State& state, const std::string& label) {
    const bench_model& m = get_model(label);
    llama2::transformer model(m.ck);
    const auto positions = std::size_t(state.range(0));
    const tokens all = random_tokens(context_length + positions, std::int32_t(model.vocab_size()), 7);
    const auto ctx = std::span(all).first(context_length);
    const auto draft = std::span(all).subspan(context_length, positions - 1);
    benchmark::DoNotOptimize(model.next_logits(ctx.first(context_length - 1)));
    for (auto _ : state) benchmark::DoNotOptimize(model.score(ctx, draft));  // reruns positions 63 .. 63+gamma
    set_weight_counters(state, model, 1.0);
    state.counters["positions_per_s"] =
        benchmark::Counter(double(positions) * double(state.iterations()), benchmark::Counter::kIsRate);
    set_cost_vs_step(state, m);
}

/// The baseline: the same gamma + 1 positions as separate single-token steps.
void bm_steps(benchmark::State& state, const std::string& label) {
    const bench_model& m = get_model(label);
    llama2::transformer model(m.ck);
    const auto positions = std::size_t(state.range(0));
    const tokens all = random_tokens(context_length + positions, std::int32_t(model.vocab_size()), 7);
    benchmark::DoNotOptimize(model.next_logits(std::span(all).first(context_length - 1)));
    for (auto _ : state)
        for (std::size_t j = 0; j < positions; ++j)
            benchmark::DoNotOptimize(model.next_logits(std::span(all).first(context_length + j)));
    set_weight_counters(state, model, double(positions));
    state.counters["positions_per_s"] =
        benchmark::Counter(double(positions) * double(state.iterations()), benchmark::Counter::kIsRate);
    set_cost_vs_step(state, m);
}

/// The layer-matrix product alone, Y = W X for the few columns of a verification pass, over a
/// stack of 12 matrices 2048 x 768 (the w1 matrices of stories110M, 75 MB: more than the
/// last-level cache), with: 0 = this library's streaming kernel (llama2::detail::matmul),
/// 1 = Eigen GEMM `Y.noalias() = W * X`, 2 = Eigen `W.lazyProduct(X)` (coefficient-wise).
void bm_matmul(benchmark::State& state) {
    const int impl = int(state.range(0));
    const auto cols = Eigen::Index(state.range(1));
    constexpr Eigen::Index rows = 2048, inner = 768, count = 12;
    using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    static std::vector<row_major> ws;
    if (ws.empty())
        for (Eigen::Index i = 0; i < count; ++i) ws.push_back(row_major::Random(rows, inner));
    const Eigen::MatrixXf x = Eigen::MatrixXf::Random(inner, cols);
    Eigen::MatrixXf y(rows, cols);
    for (auto _ : state) {
        for (const auto& w : ws) {
            if (impl == 0)
                llama2::detail::matmul(w.data(), rows, inner, x.data(), inner, cols, y.data(), rows);
            else if (impl == 1)
                y.noalias() = w * x;
            else
                y.noalias() = w.lazyProduct(x);
            benchmark::DoNotOptimize(y.data());
            benchmark::ClobberMemory();
        }
    }
    const double bytes = double(count * rows * inner) * sizeof(float) * double(state.iterations());
    state.counters["weight_GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
    state.counters["bw_fraction"] = benchmark::Counter(bytes / bandwidth(), benchmark::Counter::kIsRate);
    state.SetLabel(impl == 0 ? "llama2::detail::matmul" : impl == 1 ? "Eigen noalias GEMM" : "Eigen lazyProduct");
}

// ---------------------------------------------------------------------------------------------
// Derived report: speculative-decoding predictions from the measured costs.

using specdec_bench::recording_reporter;

/// The acceptance rate alpha = E[beta], beta = sum_x min(p(x), q(x)) (Leviathan et al. 2023,
/// Def. 3.1, Cor. 3.6), of `draft` against `target`: the mean of beta over the positions of
/// `samples` sequences of up to `length` tokens that the target samples itself from BOS, p and q
/// standardized with the same temperature. The protocol of measure-alpha (same defaults, same
/// seed), so the figures agree with the ones it prints.
double measure_alpha(llama2::transformer& target, llama2::transformer& draft, float temperature,
                     std::size_t samples = 8, std::size_t length = 200, std::uint64_t seed = 1) {
    const specdec::sampling_config sampling{.temperature = temperature};
    const auto vocab = target.vocab_size();
    const auto limit = std::size_t(std::min(target.max_context(), draft.max_context()));
    Eigen::VectorXf p(vocab), q(vocab);
    specdec::sampling_workspace ws;
    std::mt19937_64 rng(seed);
    double beta_sum = 0.0;
    std::size_t positions = 0;
    for (std::size_t n = 0; n < samples; ++n) {
        std::vector<specdec::token_id> seq{1};  // BOS
        for (std::size_t t = 0; t < length && seq.size() < limit; ++t) {
            specdec::standardize(target.next_logits(seq), sampling, p, ws);
            specdec::standardize(draft.next_logits(seq), sampling, q, ws);
            beta_sum += p.cast<double>().cwiseMin(q.cast<double>()).sum();
            ++positions;
            const auto next = specdec::token_id(specdec::sample_from_weights(p, specdec::uniform01(rng), ws));
            if (next == 1 || next == 2) break;  // BOS or EOS ends the sample
            seq.push_back(next);
        }
    }
    return beta_sum / double(positions);
}

struct pair_alpha {
    double temperature0 = 0.0, temperature1 = 0.0;
    std::string source;
};

/// alpha of the real pair at temperatures 0 and 1: measured when SPECDEC_MODELS_DIR holds it,
/// otherwise the values measure-alpha printed for it (labeled as such).
pair_alpha real_pair_alpha() {
    const pair_alpha printed{0.76, 0.67,
                             "not measured: the values measure-alpha prints for stories260K / llama2xs_tok512_279K"};
    const char* dir = std::getenv("SPECDEC_MODELS_DIR");
    if (dir == nullptr || *dir == '\0') {
        std::printf("SPECDEC_MODELS_DIR is not set: alpha of the real pair is not measured.\n");
        return {printed.temperature0, printed.temperature1, printed.source + " (SPECDEC_MODELS_DIR unset)"};
    }
    try {
        llama2::transformer target(fs::path(dir) / "stories260K.bin");
        llama2::transformer draft(fs::path(dir) / "llama2xs_tok512_279K.bin");
        const double a0 = measure_alpha(target, draft, 0.0f);
        const double a1 = measure_alpha(target, draft, 1.0f);
        return {a0, a1,
                "measured here: stories260K target, llama2xs_tok512_279K draft, 8 target samples of up to 200 "
                "tokens from BOS, seed 1 (measure-alpha's protocol)"};
    } catch (const std::exception& e) {
        std::printf("alpha of the real pair could not be measured (%s).\n", e.what());
        return {printed.temperature0, printed.temperature1, printed.source + " (models unreadable)"};
    }
}

/// Prints the derived report (markdown) from the recorded times; see the file comment.
void print_derived_report(const recording_reporter& rec) {
    const std::string draft_label = "random_stories15M", target_label = "random_stories110M";
    std::printf("\n## Derived: speculative decoding with a stories15M-shape draft and a stories110M-shape target\n\n");
    const auto t_draft = rec.median("llama2/step/" + draft_label, "cpu_seconds");
    const auto t_step = rec.median("llama2/step/" + target_label, "cpu_seconds");
    if (!t_draft || !t_step) {
        std::printf("Not available: needs llama2/step/%s and llama2/step/%s in this run (random-weight models, "
                    "SPECDEC_BENCH_CHECKPOINT unset, not filtered out).\n",
                    draft_label.c_str(), target_label.c_str());
        return;
    }
    const double c = *t_draft / *t_step;
    const pair_alpha alpha = real_pair_alpha();
    const double alphas[2] = {alpha.temperature0, alpha.temperature1};

    std::printf("- cost coefficient c = t_step(15M shape) / t_step(110M shape) = %.3f ms / %.3f ms = **%.3f** "
                "(Leviathan et al. 2023, Sec. 3.1)\n",
                *t_draft * 1e3, *t_step * 1e3, c);
    std::printf("- acceptance rate alpha = E[sum min(p, q)]: **%.3f** at temperature 0, **%.3f** at temperature 1 "
                "(%s)\n",
                alphas[0], alphas[1], alpha.source.c_str());
    std::printf("- alpha belongs to the tiny real pair, c to the large random-weight shapes: the predictions below "
                "are for a 15M/110M pair that drafts as well as the real pair does.\n\n");

    // Thm. 3.8: expected walltime improvement (1 - a^(g+1)) / ((1 - a)(g c + 1)), which takes the
    // verification pass over g+1 positions to cost one target step.
    std::printf("| temperature | alpha | optimal gamma (Sec. 3.5) | Thm. 3.8 speedup, optimal gamma | "
                "Thm. 3.8 speedup, gamma = 4 |\n|---|---|---|---|---|\n");
    for (int t = 0; t < 2; ++t) {
        const std::size_t g = specdec::optimal_gamma(alphas[t], c);
        std::printf("| %d | %.3f | %zu | %.2fx | %.2fx |\n", t, alphas[t], g,
                    specdec::expected_walltime_improvement(alphas[t], g, c),
                    specdec::expected_walltime_improvement(alphas[t], 4, c));
    }

    // Measured cost: Eq. 1 gives E[tokens per step]; one step costs gamma draft steps plus the
    // measured batched pass over gamma+1 positions (verification's sampling work is not counted).
    std::printf("\nMeasured-cost prediction: time per token = (gamma t_draft + t_score(gamma+1)) / E[tokens per step], "
                "E = (1 - alpha^(gamma+1)) / (1 - alpha) (Eq. 1); speedup = t_step / time per token; "
                "t_draft = %.3f ms (15M-shape step), t_step = %.3f ms (110M-shape step), t_score = 110M-shape "
                "score() pass. Thm. 3.8 alongside (it takes t_score = t_step).\n\n",
                *t_draft * 1e3, *t_step * 1e3);
    std::printf("| gamma | t_score(gamma+1) ms | t_score / t_step | T=0: E[tokens/step] | T=0: speedup, measured cost | "
                "T=0: Thm. 3.8 | T=1: E[tokens/step] | T=1: speedup, measured cost | T=1: Thm. 3.8 |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
    for (std::size_t g = 2; g <= 8; ++g) {
        const auto t_score =
            rec.median("llama2/score/" + target_label + "/positions:" + std::to_string(g + 1), "cpu_seconds");
        if (!t_score) {
            std::printf("| %zu | not measured | | | | | | | |\n", g);
            continue;
        }
        std::printf("| %zu | %.3f | %.3f", g, *t_score * 1e3, *t_score / *t_step);
        for (const double a : alphas) {
            const double tokens_per_step = specdec::expected_tokens_per_step(a, g);
            const double per_token = (double(g) * *t_draft + *t_score) / tokens_per_step;
            std::printf(" | %.2f | %.2fx | %.2fx", tokens_per_step, *t_step / per_token,
                        specdec::expected_walltime_improvement(a, g, c));
        }
        std::printf(" |\n");
    }
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

    benchmark::RegisterBenchmark("llama2/bandwidth", bm_bandwidth)->Unit(benchmark::kMillisecond);
    for (const std::string& label : model_labels()) {
        benchmark::RegisterBenchmark(("llama2/step/" + label).c_str(), bm_step, label)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("llama2/score/" + label).c_str(), bm_score, label)
            ->ArgNames({"positions"})
            ->DenseRange(2, 9)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("llama2/steps/" + label).c_str(), bm_steps, label)
            ->ArgNames({"positions"})
            ->DenseRange(2, 9)
            ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark("llama2/matmul", bm_matmul)
        ->ArgNames({"impl", "cols"})
        ->ArgsProduct({{0, 1, 2}, {1, 2, 5, 9}})
        ->Unit(benchmark::kMillisecond);

    benchmark::AddCustomContext("bandwidth_GBps", std::to_string(bandwidth() / 1e9));
    recording_reporter reporter(isatty(STDOUT_FILENO) != 0 ? benchmark::ConsoleReporter::OO_Color
                                                           : benchmark::ConsoleReporter::OO_None);
    benchmark::RunSpecifiedBenchmarks(&reporter);
    print_derived_report(reporter);
    benchmark::Shutdown();
    return 0;
}
