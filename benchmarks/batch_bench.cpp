// Throughput of a batch step against the batch size B and the thread count: the step over
// per-sequence models (specdec::detail::speculative_step_batch, the whole step of each sequence
// on the threads), and one step of the public loop, specdec::batch_decoder, with one shared
// drafter and verifier (drafting and scoring on the calling thread, sequence by sequence;
// verification and sampling of the target on the threads).
//
// Models: a table model with V = 32000 whose logits row is picked by a hash of the last two
// tokens (64 random rows, shared by all sequences; each sequence has its own handle), so a
// step costs what verification and sampling cost at a realistic vocabulary, without a
// transformer. Draft and target are two such tables; γ = 4, temperature 1, block verification.
//
//   bm_batch/B:<sequences>/threads:<n>     Time: one batch step (wall clock); counter tokens/s
//   bm_decoder/B:<sequences>/threads:<n>   the same for one batch_decoder::step()
//
// On a machine with k cores, bm_batch's throughput should grow with threads up to k for B >= k;
// bm_decoder's grows by less (its drafting and scoring are serial).

#include <benchmark/benchmark.h>

#include <specdec/specdec.hpp>

#include <Eigen/Core>

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace {

using specdec::token_id;

constexpr Eigen::Index vocab = 32000;
constexpr int table_rows = 64;

struct table {
    Eigen::MatrixXf logits;  // vocab x table_rows
    explicit table(std::uint64_t seed) : logits(vocab, table_rows) {
        std::mt19937_64 g(seed);
        std::normal_distribution<float> n(0.0f, 3.0f);
        for (Eigen::Index j = 0; j < table_rows; ++j)
            for (Eigen::Index i = 0; i < vocab; ++i) logits(i, j) = n(g);
    }
};

/// A per-sequence handle on a shared table: a LanguageModel.
struct table_model {
    const table* t;
    std::ptrdiff_t vocab_size() const { return vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) const {
        const auto a = static_cast<std::uint64_t>(context.empty() ? 0 : context.back());
        const auto b = static_cast<std::uint64_t>(context.size() > 1 ? context[context.size() - 2] : 0);
        const auto row = static_cast<Eigen::Index>((a * 0x9E3779B97F4A7C15ull ^ b * 0xC2B2AE3D27D4EB4Full) % table_rows);
        return t->logits.col(row);
    }
};

void bm_batch(benchmark::State& state) {
    static const table target_table(1), draft_table(2);
    const auto batch = static_cast<std::size_t>(state.range(0));
    const auto threads = static_cast<std::size_t>(state.range(1));
    std::vector<table_model> drafters(batch, table_model{&draft_table}), verifiers(batch, table_model{&target_table});
    std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
    for (std::size_t b = 0; b < batch; ++b) seqs.push_back({{static_cast<token_id>(b)}, {}, std::mt19937_64(b + 1)});
    specdec::batch_workspace ws(threads);
    const specdec::step_options opts{.gamma = 4, .sampling = {.temperature = 1.0f}};
    auto step = [&] {
        for (auto& s : seqs)
            if (s.tokens.size() > 4096) s.tokens.erase(s.tokens.begin(), s.tokens.end() - 2);  // bounded memory
        specdec::detail::speculative_step_batch(std::span(drafters), std::span(verifiers), std::span(seqs), opts, ws);
    };
    step();  // warm-up: workspaces sized
    std::size_t before = 0;
    for (const auto& s : seqs) before += s.stats.accepted_tokens + s.stats.steps;
    for (auto _ : state) step();
    std::size_t after = 0;
    for (const auto& s : seqs) after += s.stats.accepted_tokens + s.stats.steps;
    state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(after - before), benchmark::Counter::kIsRate);
}

void bm_decoder(benchmark::State& state) {
    static const table target_table(1), draft_table(2);
    const auto batch = static_cast<std::size_t>(state.range(0));
    const auto threads = static_cast<std::size_t>(state.range(1));
    table_model drafter{&draft_table}, verifier{&target_table};  // stateless: shared by the batch
    specdec::batch_decoder dec(drafter, verifier,
                               {.step = specdec::chain{.gamma = 4},
                                .sampling = {.temperature = 1.0f},
                                .budget = {.max_new_tokens = std::size_t{1} << 40}},
                               threads);
    std::vector<std::size_t> ids;
    for (std::size_t b = 0; b < batch; ++b)
        ids.push_back(dec.add(std::vector<token_id>{static_cast<token_id>(b)}, std::mt19937_64(b + 1)));
    auto produced = [&] {
        std::size_t n = 0;
        for (const auto id : ids) n += dec.stats(id).accepted_tokens + dec.stats(id).steps;
        return n;
    };
    dec.step();  // warm-up: workspaces sized
    const std::size_t before = produced();
    for (auto _ : state) dec.step();  // (each sequence grows by at most 5 tokens a step)
    state.counters["tokens/s"] =
        benchmark::Counter(static_cast<double>(produced() - before), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(bm_decoder)
    ->ArgsProduct({{1, 2, 4, 8, 16}, {1, 2}})
    ->ArgNames({"B", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(bm_batch)
    ->ArgsProduct({{1, 2, 4, 8, 16}, {1, 2}})
    ->ArgNames({"B", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
