// End-to-end decoding speed on the real model pair: specdec::speculative_decode with each drafter
// against specdec::autoregressive_decode of the target alone, both measured in this binary.
//
// Models: SPECDEC_MODELS_DIR must hold stories260K.bin (target), llama2xs_tok512_279K.bin (draft)
// and tok512.bin (their shared tokenizer); without them every benchmark is skipped with a message.
//
// Every iteration is one whole generation from scratch (empty KV caches, fresh n-gram tables):
// the prompt "Once upon a time" (BOS first), exactly 200 new tokens (no stop tokens, so the length
// is fixed), seed 42, gamma = 4, block verification (the default), temperature 0 and 1.
//
// Drafters: the 279K draft model (llama2::context_limited_drafter: its window is 256 tokens),
// early exit (the target's first 2 or 4 of 5 layers), unigram and bigram tables fit on the running
// context (specdec::ngram_model), prompt lookup (specdec::prompt_lookup_drafter), and prompt lookup
// falling back to the 279K model (specdec::fallback_drafter).
//
// Counters:
//   tokens_per_s            generated tokens per second
//   tokens_per_target_call  generated tokens / target calls (Eq. 1's E[tokens per step] when
//                           every step drafts gamma tokens; 1 for the autoregressive baseline)
//   alpha                   accepted / tested draft tokens (decode_stats::acceptance_rate)
//   speedup                 time of one autoregressive generation at the same temperature
//                           (e2e/autoregressive, measured in this binary) / time of this one
// Verification's share (e2e/verify_share/<drafter>): the same generation run once more through
// wrappers that record what each step handed to specdec::verify (the target's scores, the draft
// tokens, their columns and scales); those calls are then replayed in the timed loop, with the
// options speculative_step used, and set against the time of the generation (counters steps,
// verify_us_per_step, step_us, share). It shows what verification costs at the vocabulary of
// 512, where its ratios to verify_bench's bound are highest, in real decoding.
// Times are CPU time, as Google Benchmark's rate counters use: decoding is single-threaded, so on
// an idle machine this is wall time, and on a shared one it leaves out the time other processes
// hold the core. A markdown summary (medians over --benchmark_repetitions) follows the run.
//
// What to expect. Speculative decoding trades serial target steps for draft steps plus one
// batched verification pass (Leviathan et al. 2023, Eq. 1 and Thm. 3.8); it saves wall time when
// a target step is expensive and memory-bound, so that scoring gamma+1 positions costs about one
// step, and a draft step is cheap (c << 1). This pair has neither property: the target (260K
// parameters) is *smaller* than its 279K draft (c is about 1), and both are so small (about 1 MB
// of weights, in cache) that they are compute-bound: a score() pass over 5 positions costs about
// 4.6 single steps (llama2_bench with SPECDEC_BENCH_CHECKPOINT=.../stories260K.bin). Every
// position the target verifies costs nearly a full step whether it is accepted or not, so
// speculative decoding is not expected to win in wall time here, with any drafter: even a free
// drafter pays gamma+1 positions per step for E[tokens per step] < gamma+1 tokens.
// tokens_per_target_call and alpha still show how well each drafter predicts the target. benchmarks/llama2_bench.cpp measures the regime where it wins: at the stories110M shape
// a score() pass over 5 positions costs about one step, and its derived report predicts the
// speedup from those costs.
//
// Build with -O3 -march=native (the engine's kernels use Eigen's SIMD packets for the target ISA).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <time.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include "recording_reporter.hpp"

#include <specdec/specdec.hpp>

#include "llama2/context_limit.hpp"
#include "llama2/tokenizer.hpp"
#include "llama2/transformer.hpp"

namespace {

namespace fs = std::filesystem;
using specdec::token_id;

constexpr const char* prompt_text = "Once upon a time";
constexpr std::size_t new_tokens = 200;
constexpr std::size_t gamma = 4;
constexpr std::uint64_t seed = 42;

/// The real pair, its early-exit drafters and the encoded prompt.
struct real_pair {
    llama2::transformer target, draft, exit2, exit4;
    std::vector<token_id> prompt;

    explicit real_pair(const fs::path& dir)
        : target(dir / "stories260K.bin"),
          draft(dir / "llama2xs_tok512_279K.bin"),
          exit2(target.early_exit(2)),
          exit4(target.early_exit(4)),
          prompt(llama2::tokenizer(dir / "tok512.bin", std::int32_t(target.vocab_size())).encode(prompt_text, true,
                                                                                                 false)) {}
};

std::unique_ptr<real_pair>& pair_slot() {
    static std::unique_ptr<real_pair> pair;
    return pair;
}

real_pair& models() { return *pair_slot(); }

specdec::decode_options options(int temperature) {
    return {.step = specdec::chain{.gamma = gamma},
            .sampling = {.temperature = float(temperature)},
            .budget = {.max_new_tokens = new_tokens,
                       .stop_tokens = {}}};  // none: every generation has exactly new_tokens tokens
}

/// CPU time of the calling thread, the clock Google Benchmark reports as "CPU" by default.
double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

enum class drafter_kind { draft_model, early_exit_2, early_exit_4, unigram, bigram, prompt_lookup, lookup_then_model };

struct drafter_info {
    drafter_kind kind;
    const char* name;
};

constexpr drafter_info drafters[] = {
    {drafter_kind::draft_model, "draft_279K"},
    {drafter_kind::early_exit_2, "early_exit_2"},
    {drafter_kind::early_exit_4, "early_exit_4"},
    {drafter_kind::unigram, "unigram"},
    {drafter_kind::bigram, "bigram"},
    {drafter_kind::prompt_lookup, "prompt_lookup"},
    {drafter_kind::lookup_then_model, "lookup_then_279K"},
};

/// One autoregressive generation from scratch.
specdec::decode_result generate_autoregressive(int temperature) {
    real_pair& m = models();
    m.target.clear_cache();
    std::mt19937_64 rng(seed);
    return specdec::autoregressive_decode(m.target, m.prompt, options(temperature), rng);
}

/// What one speculative step handed to verification: the target's scores, the draft tokens, and
/// their draft distributions (0 columns for point masses; with scales when the drafter gave them;
/// `standardized`: written by specdec's sampling, so speculative_step did not check them).
struct recorded_step {
    Eigen::MatrixXf target_logits;
    std::vector<token_id> tokens;
    Eigen::MatrixXf probs;
    std::vector<float> scales;
    bool standardized = false;
};

/// A generation's verification inputs, step by step.
using recorded_generation = std::vector<recorded_step>;

/// How recording_drafter holds its drafter: a BlockDrafter by reference, a plain LanguageModel in
/// specdec::model_drafter (which drafts as speculative_step does with such a model).
template <class D>
struct held_drafter {
    using type = D&;
};
template <class D>
    requires(!specdec::BlockDrafter<D>)
struct held_drafter<D> {
    using type = specdec::model_drafter<D>;
};

/// A BlockDrafter that forwards to `inner` and keeps a copy of each block it drafts.
template <class D>
class recording_drafter {
public:
    explicit recording_drafter(D& inner) : inner_(inner) {}
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return inner_.vocab_size(); }
    void draft(std::span<const token_id> context, std::size_t count, const specdec::sampling_config& sampling,
               specdec::uniform_source& uniforms, specdec::draft_block& out) {
        inner_.draft(context, count, sampling, uniforms, out);
        last = out;
    }
    specdec::draft_block last;

private:
    typename held_drafter<D>::type inner_;
};

/// The target, scoring as it does (score_into) and recording each step: its scores, the draft
/// they score, and that draft's columns from the drafter's last block (none for an empty draft:
/// then the step may not have called the drafter at all).
template <class D>
class recording_target {
public:
    recording_target(llama2::transformer& target, const recording_drafter<D>& drafter, recorded_generation& log)
        : target_(target), drafter_(drafter), log_(log) {}
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return target_.vocab_size(); }
    [[nodiscard]] Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        Eigen::MatrixXf out;
        score_into(context, draft, out);
        return out;
    }
    void score_into(std::span<const token_id> context, std::span<const token_id> draft, Eigen::MatrixXf& out) {
        target_.score_into(context, draft, out);
        recorded_step s{out, {draft.begin(), draft.end()}, Eigen::MatrixXf(out.rows(), 0), {}, false};
        if (!draft.empty()) {
            s.probs = drafter_.last.probs;
            s.scales = drafter_.last.scales;
            s.standardized = drafter_.last.standardized;
        }
        log_.push_back(std::move(s));
    }

private:
    llama2::transformer& target_;
    const recording_drafter<D>& drafter_;
    recorded_generation& log_;
};

/// One speculative generation from scratch with the given drafter; with `log`, through the
/// recording wrappers above (the same draws: the wrappers only copy), keeping what each step
/// verified.
specdec::decode_result generate_speculative(drafter_kind kind, int temperature, recorded_generation* log = nullptr) {
    real_pair& m = models();
    m.target.clear_cache();
    const specdec::decode_options opts = options(temperature);
    std::mt19937_64 rng(seed);
    auto run = [&](auto& drafter) {
        if (log == nullptr) return specdec::speculative_decode(drafter, m.target, m.prompt, opts, rng);
        using D = std::remove_cvref_t<decltype(drafter)>;
        recording_drafter<D> recording(drafter);
        recording_target<D> target(m.target, recording, *log);
        return specdec::speculative_decode(recording, target, m.prompt, opts, rng);
    };
    auto run_model = [&](llama2::transformer& model) {
        model.clear_cache();
        llama2::context_limited_drafter<llama2::transformer> drafter(model);
        return run(drafter);
    };
    const auto vocab = m.target.vocab_size();
    switch (kind) {
        case drafter_kind::draft_model: return run_model(m.draft);
        case drafter_kind::early_exit_2: return run_model(m.exit2);
        case drafter_kind::early_exit_4: return run_model(m.exit4);
        case drafter_kind::unigram:
        case drafter_kind::bigram: {
            specdec::ngram_model drafter(vocab, kind == drafter_kind::unigram ? 1 : 2);
            return run(drafter);
        }
        case drafter_kind::prompt_lookup: {
            specdec::prompt_lookup_drafter drafter(vocab);
            return run(drafter);
        }
        case drafter_kind::lookup_then_model: {
            m.draft.clear_cache();
            specdec::prompt_lookup_drafter lookup(vocab);
            llama2::context_limited_drafter<llama2::transformer> model(m.draft);
            specdec::fallback_drafter drafter(lookup, model);
            return run(drafter);
        }
    }
    throw std::logic_error("end_to_end_bench: unknown drafter");
}

using specdec_bench::median_of;

/// The median CPU seconds of 5 calls of generate() (a whole generation), for a time that its
/// benchmark, filtered out, did not measure.
template <class Generate>
double median_seconds_of(Generate&& generate) {
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
        const double t0 = thread_cpu_seconds();
        benchmark::DoNotOptimize(generate().tokens.data());
        times.push_back(thread_cpu_seconds() - t0);
    }
    return median_of(times);
}

/// CPU seconds of one autoregressive generation, per temperature.
std::map<int, double>& baseline_cache() {
    static std::map<int, double> cache;
    return cache;
}

/// The baseline's time at `temperature`: what e2e/autoregressive measured, or, when it did not
/// run (filtered out), the median of 5 generations measured here.
double baseline_seconds(int temperature) {
    auto& cache = baseline_cache();
    if (auto it = cache.find(temperature); it != cache.end()) return it->second;
    return cache[temperature] = median_seconds_of([&] { return generate_autoregressive(temperature); });
}

/// The greedy autoregressive output: speculative decoding at temperature 0 must reproduce it.
const std::vector<token_id>& greedy_tokens() {
    static const std::vector<token_id> tokens = generate_autoregressive(0).tokens;
    return tokens;
}

void set_counters(benchmark::State& state, const specdec::decode_result& out, double baseline_s) {
    const auto iters = double(state.iterations());
    state.counters["tokens_per_s"] = benchmark::Counter(double(out.tokens.size()) * iters, benchmark::Counter::kIsRate);
    state.counters["tokens_per_target_call"] =
        double(out.tokens.size()) / double(std::max<std::size_t>(1, out.stats.target_calls));
    // (baseline seconds * iterations) / this benchmark's seconds = t_autoregressive / t_this.
    state.counters["speedup"] = benchmark::Counter(baseline_s * iters, benchmark::Counter::kIsRate);
}

void bm_autoregressive(benchmark::State& state) {
    const int temperature = int(state.range(0));
    specdec::decode_result out;
    const double t0 = thread_cpu_seconds();
    for (auto _ : state) {
        out = generate_autoregressive(temperature);
        benchmark::DoNotOptimize(out.tokens.data());
    }
    const double per_generation = (thread_cpu_seconds() - t0) / double(state.iterations());
    baseline_cache()[temperature] = per_generation;
    if (out.tokens.size() != new_tokens) state.SkipWithError("wrong number of tokens generated");
    set_counters(state, out, per_generation);
}

/// CPU seconds of one speculative generation, per (drafter, temperature).
std::map<std::pair<drafter_kind, int>, double>& speculative_cache() {
    static std::map<std::pair<drafter_kind, int>, double> cache;
    return cache;
}

/// The time of one speculative generation: what e2e/speculative measured, or, when it did not run
/// (filtered out), the median of 5 generations measured here.
double speculative_seconds(drafter_kind kind, int temperature) {
    auto& cache = speculative_cache();
    if (auto it = cache.find({kind, temperature}); it != cache.end()) return it->second;
    return cache[{kind, temperature}] = median_seconds_of([&] { return generate_speculative(kind, temperature); });
}

void bm_speculative(benchmark::State& state, drafter_kind kind) {
    const int temperature = int(state.range(0));
    const double baseline_s = baseline_seconds(temperature);  // outside the timed loop
    if (temperature == 0) (void)greedy_tokens();
    specdec::decode_result out;
    const double t0 = thread_cpu_seconds();
    for (auto _ : state) {
        out = generate_speculative(kind, temperature);
        benchmark::DoNotOptimize(out.tokens.data());
    }
    speculative_cache()[{kind, temperature}] = (thread_cpu_seconds() - t0) / double(state.iterations());
    // Every iteration is the same generation (same seed), so checking the last one suffices.
    if (out.tokens.size() != new_tokens) state.SkipWithError("wrong number of tokens generated");
    if (temperature == 0 && out.tokens != greedy_tokens())
        state.SkipWithError("temperature 0 output differs from greedy autoregressive decoding");
    set_counters(state, out, baseline_s);
    state.counters["alpha"] = out.stats.acceptance_rate();
}

/// Verification's share of speculative decoding on the real pair (vocabulary 512): the
/// verification inputs of one whole generation (recorded through the wrappers above) are replayed
/// through specdec::verify, with the options speculative_step used, and the time of that replay
/// is set against the time of the generation itself (e2e/speculative, or timed here). The
/// replay's uniforms come from a fresh stream, so single outcomes may differ from the recorded
/// ones; the inputs, and so the work per step, are those of real decoding.
// Counters: steps (of the generation), verify_us_per_step, step_us (generation time / steps),
//           share (replay time / generation time).
void bm_verify_share(benchmark::State& state, drafter_kind kind) {
    const int temperature = int(state.range(0));
    recorded_generation log;
    const specdec::decode_result recorded = generate_speculative(kind, temperature, &log);
    if (recorded.tokens != generate_speculative(kind, temperature).tokens) {
        state.SkipWithError("the recorded generation differs from the plain one");
        return;
    }
    const double generation_s = speculative_seconds(kind, temperature);
    const specdec::sampling_config sampling = options(temperature).sampling;
    specdec::verify_options opts;  // block verification, as the generation ran
    specdec::verify_workspace ws;
    std::mt19937_64 rng(seed);
    std::size_t emitted = 0;
    auto replay = [&] {
        for (const recorded_step& s : log) {
            const std::span<const token_id> tokens(s.tokens);
            opts.check_draft_distributions = !s.standardized;  // as speculative_step decided
            specdec::verify_result r;
            if (s.probs.cols() == 0)
                r = specdec::verify(s.target_logits, tokens, specdec::point_mass, sampling, rng, ws, opts);
            else if (s.scales.empty())
                r = specdec::verify(s.target_logits, tokens, s.probs, sampling, rng, ws, opts);
            else
                r = specdec::verify(s.target_logits, tokens, s.probs, std::span<const float>(s.scales), sampling, rng,
                                    ws, opts);
            emitted += r.accepted + 1;
        }
    };
    replay();  // warm-up: the workspace reaches its size
    const double t0 = thread_cpu_seconds();
    for (auto _ : state) replay();
    const double per_generation = (thread_cpu_seconds() - t0) / double(state.iterations());
    benchmark::DoNotOptimize(emitted);
    const auto steps = double(log.size());
    state.counters["steps"] = steps;
    state.counters["verify_us_per_step"] = 1e6 * per_generation / steps;
    state.counters["step_us"] = 1e6 * generation_s / steps;
    state.counters["share"] = per_generation / generation_s;
}

using specdec_bench::recording_reporter;

void print_summary(const recording_reporter& rec) {
    std::printf("\n## End to end: stories260K target, \"%s\", %zu new tokens, gamma = %zu, block verification\n\n"
                "| drafter | temperature | tokens/s, speculative | tokens/s, autoregressive | speedup | "
                "tokens per target call | alpha |\n|---|---|---|---|---|---|---|\n",
                prompt_text, new_tokens, gamma);
    for (const drafter_info& d : drafters)
        for (const int t : {0, 1}) {
            const std::string arg = "temperature:" + std::to_string(t);
            const std::string name = std::string("e2e/speculative/") + d.name + "/" + arg;
            const double rate = rec.median(name, "tokens_per_s").value_or(-1.0);
            if (rate < 0) continue;
            // The baseline's rate: its benchmark's median, or the generations timed aside when it was
            // filtered out (what the speedup was computed from then).
            double base = rec.median("e2e/autoregressive/" + arg, "tokens_per_s").value_or(-1.0);
            if (base < 0) base = double(new_tokens) / baseline_seconds(t);
            std::printf("| %s | %d | %.0f | %.0f | %.2fx | %.2f | %.3f |\n", d.name, t, rate, base,
                        rec.median(name, "speedup").value_or(-1.0), rec.median(name, "tokens_per_target_call").value_or(-1.0),
                        rec.median(name, "alpha").value_or(-1.0));
        }
    std::printf("\n## Verification's share of a step (the same generations, their verify calls replayed)\n\n"
                "| drafter | temperature | steps | verify µs per step | step µs | share |\n"
                "|---|---|---|---|---|---|\n");
    for (const drafter_info& d : drafters)
        for (const int t : {0, 1}) {
            const std::string name = std::string("e2e/verify_share/") + d.name + "/temperature:" + std::to_string(t);
            const double share = rec.median(name, "share").value_or(-1.0);
            if (share < 0) continue;
            auto median = [&](const char* counter) { return rec.median(name, counter).value_or(-1.0); };
            std::printf("| %s | %d | %.0f | %.3g | %.0f | %.2g%% |\n", d.name, t, median("steps"),
                        median("verify_us_per_step"), median("step_us"), 100.0 * share);
        }
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

    const char* dir = std::getenv("SPECDEC_MODELS_DIR");
    if (dir == nullptr || *dir == '\0') {
        std::printf("end_to_end_bench: SPECDEC_MODELS_DIR is not set; skipping the end-to-end benchmarks (they need "
                    "stories260K.bin, llama2xs_tok512_279K.bin and tok512.bin).\n");
        return 0;
    }
    try {
        pair_slot() = std::make_unique<real_pair>(dir);
    } catch (const std::exception& e) {
        std::printf("end_to_end_bench: cannot load the models from %s (%s); skipping the end-to-end benchmarks.\n", dir,
                    e.what());
        return 0;
    }

    // The baseline first: the speculative benchmarks take their speedup from its time.
    benchmark::RegisterBenchmark("e2e/autoregressive", bm_autoregressive)
        ->ArgName("temperature")
        ->Arg(0)
        ->Arg(1)
        ->Unit(benchmark::kMillisecond);
    for (const drafter_info& d : drafters)
        benchmark::RegisterBenchmark((std::string("e2e/speculative/") + d.name).c_str(), bm_speculative, d.kind)
            ->ArgName("temperature")
            ->Arg(0)
            ->Arg(1)
            ->Unit(benchmark::kMillisecond);

    for (const drafter_info& d : drafters)
        benchmark::RegisterBenchmark((std::string("e2e/verify_share/") + d.name).c_str(), bm_verify_share, d.kind)
            ->ArgName("temperature")
            ->Arg(0)
            ->Arg(1)
            ->Unit(benchmark::kMicrosecond);

    benchmark::AddCustomContext("models", dir);
    recording_reporter reporter(isatty(STDOUT_FILENO) != 0 ? benchmark::ConsoleReporter::OO_Color
                                                           : benchmark::ConsoleReporter::OO_None);
    benchmark::RunSpecifiedBenchmarks(&reporter);
    print_summary(reporter);
    benchmark::Shutdown();
    return 0;
}
