// The adaptive γ policy (decode_options::length.policy = gamma_policy::adaptive) against every fixed γ
// and plain autoregressive decoding, in one binary, on random weights at the shapes of
// llama2.c's stories110M (target) and stories15M (draft).
//
// The drafter (controlled_drafter): random weights agree with nothing, so the acceptance is set
// by hand. At temperature 0 the target's output is its greedy continuation, computed once per
// prompt; at each draft position the drafter runs the 15M-shape model (so drafting costs what a
// real 15M draft step costs) and then, with probability α drawn from its own generator,
// proposes the target's next greedy token (accepted), and otherwise another token (rejected),
// as point masses. Acceptance is then α per position, independent across positions: Leviathan
// et al.'s i.i.d. model. The coin of output position k is a fixed function of k (common random
// numbers): every case sees the same positions drafted right and wrong, as a real drafter would
// on the same text, so cases differ only in how they use them, not by luck. Every run generates
// the same tokens (greedy).
//
// Cases (each iteration is one generation of `new_tokens` tokens from the same prompt, fresh KV
// caches):
//   adaptive/alpha:A/gamma:G     fixed γ = G (1..8); G = 0 is autoregressive decoding
//   adaptive/alpha:A/auto        the adaptive policy, γ in [0, 8], a fresh controller per
//                                generation (it learns from each generation's first steps)
//   adaptive/alpha:A/auto_kept   the same, one controller kept across generations (a server
//                                answering successive requests)
//   adaptive/alpha:A/auto_window8  fresh, with adaptive_gamma_options::window = 8 (estimates
//                                that follow a change faster, and are noisier)
//   A = 30, 60, 80, 95 (%), and "varying": α = 0.95 for 32 positions, then 0.2 for 32, and so on
//   (copied spans followed by novel text, as prompt lookup meets them).
// Counters: tokens_per_s; mean_gamma (the adaptive cases' mean γ per step).
// The summary (markdown, stdout) has the medians over repetitions and, per α, the best fixed γ in
// hindsight and the adaptive policy's ratio to it: the best fixed γ is the bound an adaptive
// policy is measured against (it cannot know α in advance), and γ = 0 the baseline.
//
// Run: build/bench/benchmarks/adaptive_gamma_bench --benchmark_repetitions=3

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <specdec/specdec.hpp>

#include "llama2/checkpoint.hpp"
#include "llama2/transformer.hpp"

namespace {

namespace fs = std::filesystem;
using specdec::token_id;

constexpr std::size_t new_tokens = 128;
constexpr std::size_t prompt_length = 8;

std::shared_ptr<const llama2::checkpoint> random_model(const std::string& preset, std::uint64_t seed) {
    const llama2::config c = *llama2::preset_config(preset);
    const fs::path file = fs::temp_directory_path() /
                          ("specdec_adaptive_bench_" + preset + "_" + std::to_string(std::random_device{}()) + ".bin");
    llama2::write_checkpoint(file, c, llama2::random_weights(c, seed));
    std::shared_ptr<const llama2::checkpoint> ck;
    try {
        ck = std::make_shared<const llama2::checkpoint>(llama2::read_checkpoint(file));
    } catch (...) {
        fs::remove(file);
        throw;
    }
    fs::remove(file);
    return ck;
}

struct models {
    llama2::transformer target, draft;
    std::vector<token_id> prompt;
    std::vector<token_id> greedy;  // the target's greedy continuation of the prompt
};

models& shared_models() {
    static models m = [] {
        models x{llama2::transformer(random_model("stories110M", 1234)),
                 llama2::transformer(random_model("stories15M", 4321)), {}, {}};
        std::mt19937 rng(7);
        x.prompt.push_back(1);
        for (std::size_t i = 1; i < prompt_length; ++i)
            x.prompt.push_back(static_cast<token_id>(3 + rng() % 30000));
        std::mt19937_64 unused(1);
        const specdec::decode_options greedy{.sampling = {.temperature = 0.0f},
                                             .budget = {.max_new_tokens = new_tokens}};
        x.greedy = specdec::autoregressive_decode(x.target, x.prompt, greedy, unused).tokens;
        return x;
    }();
    return m;
}

/// α at output position k (0-based): fixed, or alternating 32 positions at 0.95 and 32 at 0.2.
double alpha_at(double alpha, std::size_t k) {
    if (alpha >= 0) return alpha;
    return (k / 32) % 2 == 0 ? 0.95 : 0.2;
}

/// See the file comment: runs the draft model for its cost, proposes the target's greedy token
/// with probability α.
class controlled_drafter {
public:
    controlled_drafter(models& m, double alpha) : m_(&m), alpha_(alpha) {}
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return m_->target.vocab_size(); }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config&,
               specdec::uniform_source&, specdec::draft_block& out) {
        context_.assign(context.begin(), context.end());
        out.model_calls = 0;  // reported: one per forward pass of the draft model
        for (std::size_t i = 0; i < gamma; ++i) {
            const Eigen::VectorXf z = m_->draft.next_logits(context_);
            benchmark::DoNotOptimize(z.data());
            ++*out.model_calls;
            const std::size_t k = context_.size() - m_->prompt.size();
            if (k >= m_->greedy.size()) break;
            const token_id right = m_->greedy[k];
            const bool follow = coin(k) < alpha_at(alpha_, k);
            const token_id t = follow ? right : static_cast<token_id>((right + 1) % vocab_size());
            out.tokens.push_back(t);
            context_.push_back(t);
        }
    }

private:
    /// A uniform in [0, 1) that depends on k only (splitmix64 of k).
    static double coin(std::size_t k) {
        std::uint64_t z = 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(k) + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return static_cast<double>(z >> 11) * 0x1.0p-53;
    }
    models* m_;
    double alpha_;
    std::vector<token_id> context_;
};

std::map<std::string, std::vector<double>>& results() {
    static std::map<std::string, std::vector<double>> r;
    return r;
}

/// gamma: >= 1 fixed, 0 autoregressive, -1 adaptive (fresh), -2 adaptive (kept), -3 adaptive
/// (fresh, window 8).
void bm_decode(benchmark::State& state, double alpha, int gamma, std::string key) {
    models& m = shared_models();
    static std::map<std::string, std::unique_ptr<specdec::gamma_controller>> kept;
    double gamma_sum = 0, steps = 0;
    for (auto _ : state) {
        state.PauseTiming();
        m.target.clear_cache();
        m.draft.clear_cache();
        controlled_drafter drafter(m, alpha);
        specdec::decode_options o{.step = specdec::chain{.gamma = gamma > 0 ? static_cast<std::size_t>(gamma) : 8},
                                  .sampling = {.temperature = 0.0f},
                                  .budget = {.max_new_tokens = new_tokens}};
        if (gamma < 0) o.length.policy = specdec::gamma_policy::adaptive;
        if (gamma == -3) o.length.adaptive.window = 8;
        if (gamma == -2) {
            auto& c = kept[key];
            if (!c) c = std::make_unique<specdec::gamma_controller>(8);
            o.length.controller = c.get();
        }
        std::mt19937_64 rng(1);
        state.ResumeTiming();
        const auto r = gamma == 0 ? specdec::autoregressive_decode(m.target, m.prompt, o, rng)
                                  : specdec::speculative_decode(drafter, m.target, m.prompt, o, rng);
        state.PauseTiming();
        if (r.tokens != m.greedy) state.SkipWithError("output differs from greedy decoding");
        for (std::size_t g = 0; g < r.stats.steps_at_gamma.size(); ++g) {
            gamma_sum += static_cast<double>(g * r.stats.steps_at_gamma[g]);
            steps += static_cast<double>(r.stats.steps_at_gamma[g]);
        }
        state.ResumeTiming();
    }
    state.counters["tokens_per_s"] =
        benchmark::Counter(static_cast<double>(new_tokens) * static_cast<double>(state.iterations()),
                           benchmark::Counter::kIsRate);
    if (gamma < 0) state.counters["mean_gamma"] = steps > 0 ? gamma_sum / steps : 0;
    // Tokens per step (per target pass), for comparison with i.i.d. acceptance's prediction
    // (1 − α^(γ+1)) / (1 − α) (Leviathan et al., Eq. 1).
    if (gamma != 0 && steps > 0)
        state.counters["tokens_per_step"] =
            static_cast<double>(new_tokens) * static_cast<double>(state.iterations()) / steps;
    if (gamma == -2) {
        // What the kept controller believes: α_1, and the expected cost of a step at γ = 0, 1, 4,
        const auto& c = *kept[key];
        state.counters["alpha1"] = c.acceptance(1);
        state.counters["cost0_ms"] = 1e3 * c.expected_cost(0);
        state.counters["cost1_ms"] = 1e3 * c.expected_cost(1);
        state.counters["cost4_ms"] = 1e3 * c.expected_cost(4);
        // and beyond the lengths it plans most (at high α): α_6, a step at γ = 6, and the
        // predicted speedups of γ = 4 and 6 over plain steps.
        state.counters["alpha6"] = c.acceptance(6);
        state.counters["cost6_ms"] = 1e3 * c.expected_cost(6);
        state.counters["pred4"] = c.predicted_speedup(4, 1);
        state.counters["pred6"] = c.predicted_speedup(6, 1);
    }
}

/// Records each repetition's wall time per iteration, by name, for the summary.
class summary_reporter : public benchmark::ConsoleReporter {
public:
    void ReportRuns(const std::vector<Run>& runs) override {
        for (const auto& r : runs)
            if (r.run_type == Run::RT_Iteration && r.iterations > 0)
                results()[r.benchmark_name()].push_back(static_cast<double>(new_tokens) /
                                                        (r.real_accumulated_time / static_cast<double>(r.iterations)));
        ConsoleReporter::ReportRuns(runs);
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

const std::vector<std::pair<std::string, double>> alphas{{"30", 0.3}, {"60", 0.6}, {"80", 0.8}, {"95", 0.95},
                                                         {"varying", -1.0}};

/// The medians of the case whose name starts with `prefix` (Google Benchmark appends its options).
double median_of(const std::string& prefix) {
    for (const auto& [name, values] : results())
        if (name.rfind(prefix, 0) == 0) return median(values);
    return 0.0;
}

void print_summary() {
    std::printf("\n## Adaptive γ against fixed γ (110M-shape target, 15M-shape draft, %zu tokens, greedy)\n\n",
                new_tokens);
    std::printf("Medians of tokens/s over repetitions (wall time). Best fixed: the best of γ = 0..8 in hindsight "
                "(γ = 0: autoregressive decoding).\n\n");
    std::printf("| α | γ=0 | γ=1 | γ=2 | γ=3 | γ=4 | γ=5 | γ=6 | γ=7 | γ=8 | best fixed | auto | auto / best | "
                "auto kept | kept / best | auto, window 8 | w8 / best |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& [label, alpha] : alphas) {
        const std::string base = "adaptive/alpha:" + label + "/";
        double best = 0;
        int best_g = 0;
        std::printf("| %s |", label.c_str());
        for (int g = 0; g <= 8; ++g) {
            const double v = median_of(base + "gamma:" + std::to_string(g) + "/");
            std::printf(" %.2f |", v);
            if (v > best) {
                best = v;
                best_g = g;
            }
        }
        const double a = median_of(base + "auto/"), k = median_of(base + "auto_kept/"),
                     w = median_of(base + "auto_window8/");
        std::printf(" %.2f (γ=%d) | %.2f | %.3f | %.2f | %.3f | %.2f | %.3f |\n", best, best_g, a,
                    best > 0 ? a / best : 0.0, k, best > 0 ? k / best : 0.0, w, best > 0 ? w / best : 0.0);
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (const auto& [label, alpha] : alphas) {
        const std::string base = "adaptive/alpha:" + label + "/";
        const auto add = [&, a = alpha](const std::string& name, int gamma) {
            benchmark::RegisterBenchmark((base + name).c_str(), bm_decode, a, gamma, base)
                ->Iterations(1)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        };
        for (int g = 0; g <= 8; ++g) add("gamma:" + std::to_string(g), g);
        add("auto", -1);
        add("auto_kept", -2);
        add("auto_window8", -3);
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    summary_reporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    print_summary();
    benchmark::Shutdown();
    return 0;
}
