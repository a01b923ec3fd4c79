// compare-trees: tokens per target pass of tree speculative decoding against chains, on the
// real draft/target pair, and the cost of one score_tree pass against its node count.
//
//   compare-trees --models DIR [--runs 40] [--tokens 200] [--scheme traversal|recursive]
//   compare-trees --cost [--preset stories110M] [--context 128] [--reps 5]
//
// Tokens per pass: for each temperature, `runs` generations of `tokens` tokens from BOS (seeds
// 1..runs, the same for every shape), drafted by the draft model, verified exactly: trees by
// traversal verification (speculative_decode with a specdec::tree step, siblings without
// replacement), chains by block verification (speculative_decode with a specdec::chain step). Tokens per target pass = generated / steps (one
// score or score_tree call per step). Standard errors are across runs. Then the best trees of
// the pair (specdec::best_tree) at 4, 8, 14, 21 and 28 nodes, from the sibling acceptance of a
// pilot on other seeds, against the uniform tree of as many nodes from the list.
// Cost: the wall time of score_tree on random weights of a preset's shape after `context`
// cached tokens, for 0 .. 32 nodes (median of `reps`), relative to a one-column pass.

#include "checkpoint.hpp"
#include "command_line.hpp"
#include "progress.hpp"
#include "transformer.hpp"

#include <specdec/specdec.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace {

struct measured {
    double mean = 0.0, se = 0.0;
};

/// `runs` generations (seeds 1..runs); `progress` shows "LABEL: run r/runs" while they go.
template <class Run>
measured tokens_per_pass(std::size_t runs, Run&& run, specdec_examples::progress_line& progress,
                         const std::string& label) {
    std::vector<double> per_run;
    std::size_t generated = 0, steps = 0;
    for (std::size_t r = 1; r <= runs; ++r) {
        const specdec::decode_result out = run(r);
        generated += out.tokens.size();
        steps += out.stats.steps;
        per_run.push_back(static_cast<double>(out.tokens.size()) / static_cast<double>(out.stats.steps));
        progress.show(r == runs, "%s: run %zu/%zu", label.c_str(), r, runs);
    }
    double m = 0.0, v = 0.0;
    for (double x : per_run) m += x;
    m /= static_cast<double>(runs);
    for (double x : per_run) v += (x - m) * (x - m);
    return {static_cast<double>(generated) / static_cast<double>(steps),
            std::sqrt(v / static_cast<double>(runs - 1) / static_cast<double>(runs))};
}

std::string shape_name(const std::vector<std::size_t>& b) {
    std::string s;
    for (std::size_t i = 0; i < b.size(); ++i) {
        if (i > 0) s.push_back(',');
        s.append(std::to_string(b[i]));
    }
    return s;
}

int measure_passes(const std::filesystem::path& models, std::size_t runs, std::size_t tokens,
                   specdec::tree_verification_scheme scheme) {
    llama2::transformer target(models / "stories260K.bin");
    llama2::transformer draft(models / "llama2xs_tok512_279K.bin");
    const std::vector<specdec::token_id> prompt{1};
    const std::vector<std::vector<std::size_t>> trees{{4},          {2, 1},          {2, 1, 1},    {2, 2},
                                                      {4, 1},       {2, 1, 1, 1},    {2, 2, 1, 1}, {3, 1, 1, 1},
                                                      {3, 2, 1, 1}, {4, 2, 1, 1},    {2, 2, 2, 1, 1}};
    specdec_examples::progress_line progress;  // on stderr, when it is a terminal
    for (const float temperature : {0.7f, 1.0f}) {
        const specdec::sampling_config s{.temperature = temperature};
        std::vector<measured> chain(33);
        auto chain_of = [&](std::size_t gamma) {
            if (chain[gamma].mean == 0.0)
                chain[gamma] = tokens_per_pass(runs, [&](std::size_t seed) {
                    std::mt19937_64 rng(seed);
                    return specdec::speculative_decode(
                        draft, target, prompt,
                        {.step = specdec::chain{.gamma = gamma}, .sampling = s, .budget = {.max_new_tokens = tokens}},
                        rng);
                }, progress, "chain of " + std::to_string(gamma));
            return chain[gamma];
        };
        std::printf("\nT = %.1f\n\n", static_cast<double>(temperature));
        std::printf("| tree | nodes | depth | tree: tokens/pass | chain of same depth | gain | chain of same nodes | gain |\n");
        std::printf("|---|---|---|---|---|---|---|---|\n");
        // Tokens per pass of trees of `shape`, over the same runs.
        const auto tree_of = [&](const specdec::tree_shape& shape, const std::string& label) {
            return tokens_per_pass(runs, [&](std::size_t seed) {
                std::mt19937_64 rng(seed);
                return specdec::speculative_decode(draft, target, prompt,
                                                   {.step = specdec::tree{.shape = shape, .scheme = scheme},
                                                    .sampling = s,
                                                    .budget = {.max_new_tokens = tokens}},
                                                   rng);
            }, progress, label);
        };
        for (const auto& b : trees) {
            const specdec::tree_shape shape{.branching = b};
            const measured t = tree_of(shape, "tree " + shape_name(b));
            const measured d = chain_of(shape.depth()), n = chain_of(shape.nodes());
            progress.clear();
            std::printf("| %s | %zu | %zu | %.3f ± %.3f | %.3f ± %.3f | %+.1f%% | %.3f ± %.3f | %+.1f%% |\n",
                        shape_name(b).c_str(), shape.nodes(), shape.depth(), t.mean, t.se, d.mean, d.se,
                        100.0 * (t.mean / d.mean - 1.0), n.mean, n.se, 100.0 * (t.mean / n.mean - 1.0));
            std::fflush(stdout);
        }
        // The best trees of this pair (specdec::best_tree, Sequoia's dynamic program) at the node
        // counts above, from its sibling acceptance a_k, estimated on a pilot of other seeds
        // (1001.., so the measured runs do not choose their own trees): trees of one level of 4.
        std::vector<double> expected(4, 0.0), reached(4, 0.0);
        for (std::size_t r = 1; r <= runs; ++r) {
            std::mt19937_64 rng(1000 + r);
            const auto out = specdec::speculative_decode(
                draft, target, prompt,
                {.step = specdec::tree{.shape = {.branching = {4}}, .scheme = scheme, .estimate_sibling_acceptance = true},
                 .sampling = s,
                 .budget = {.max_new_tokens = tokens}},
                rng);
            for (std::size_t k = 0; k < 4 && k < out.stats.reached_at_sibling.size(); ++k) {
                expected[k] += out.stats.expected_accepted_at_sibling[k];
                reached[k] += static_cast<double>(out.stats.reached_at_sibling[k]);
            }
            progress.show(r == runs, "sibling acceptance: run %zu/%zu", r, runs);
        }
        std::vector<double> a(4, 0.0);
        for (std::size_t k = 0; k < 4; ++k) a[k] = reached[k] > 0 ? expected[k] / reached[k] : 0.0;
        progress.clear();
        std::printf("\nBest trees (specdec::best_tree, widths up to 4 per node, depth up to 8) from the sibling "
                    "acceptance a_k = %.3f %.3f %.3f %.3f (pilot):\n\n",
                    a[0], a[1], a[2], a[3]);
        std::printf("| best tree (children per node) | nodes | depth | predicted tokens/pass | tokens/pass | uniform tree "
                    "of as many nodes | gain | chain of same nodes | gain |\n");
        std::printf("|---|---|---|---|---|---|---|---|---|\n");
        const std::vector<std::size_t> widest(8, 4);
        const std::vector<std::pair<std::size_t, std::vector<std::size_t>>> budgets{
            {4, {2, 1}}, {8, {2, 1, 1, 1}}, {14, {2, 2, 1, 1}}, {21, {3, 2, 1, 1}}, {28, {4, 2, 1, 1}}};
        for (const auto& [nodes, uniform] : budgets) {
            const specdec::tree_shape best = specdec::best_tree(a, nodes, widest);
            const measured t = tree_of(best, "best tree of " + std::to_string(nodes));
            const measured u = tree_of(specdec::tree_shape{.branching = uniform}, "tree " + shape_name(uniform));
            const measured n = chain_of(best.nodes());
            progress.clear();
            std::printf("| %s | %zu | %zu | %.3f | %.3f ± %.3f | %s %.3f ± %.3f | %+.1f%% | %.3f ± %.3f | %+.1f%% |\n",
                        shape_name(best.children).c_str(), best.nodes(), best.depth(),
                        specdec::expected_tree_tokens(best, a), t.mean, t.se, shape_name(uniform).c_str(), u.mean,
                        u.se, 100.0 * (t.mean / u.mean - 1.0), n.mean, n.se, 100.0 * (t.mean / n.mean - 1.0));
            std::fflush(stdout);
        }
    }
    return 0;
}

int measure_cost(const std::string& preset, std::ptrdiff_t context, int reps) {
    const auto cfg = llama2::preset_config(preset);
    if (!cfg) {
        std::fprintf(stderr, "compare-trees: unknown preset '%s'\n", preset.c_str());
        return 2;
    }
    auto ck = std::make_shared<llama2::checkpoint>();
    ck->name = preset + " (random weights)";
    ck->cfg = *cfg;
    ck->w = llama2::random_weights(ck->cfg, 1);
    llama2::transformer m(ck);
    std::mt19937_64 rng(3);
    std::vector<specdec::token_id> ctx(static_cast<std::size_t>(context));
    for (auto& t : ctx) t = static_cast<specdec::token_id>(3 + rng() % static_cast<std::uint64_t>(cfg->vocab_size - 3));
    (void)m.next_logits(ctx);  // cache the context
    Eigen::MatrixXf out;
    std::printf("| nodes | score_tree ms (median of %d) | relative to 1 column | score_into, a chain of as many, ms |\n"
                "|---|---|---|---|\n",
                reps);
    double base = 0.0;
    specdec_examples::progress_line progress;  // on stderr, when it is a terminal
    for (const std::size_t nodes : {0u, 1u, 2u, 4u, 8u, 14u, 16u, 21u, 32u}) {
        progress.show(true, "%zu nodes: timing", nodes);
        // A tree of `nodes` nodes: two children per node, breadth first.
        specdec::draft_tree tree;
        for (std::size_t i = 0; i < nodes; ++i)
            tree.add(i < 2 ? -1 : static_cast<std::int32_t>(i / 2 - 1),
                     static_cast<specdec::token_id>(3 + rng() % static_cast<std::uint64_t>(cfg->vocab_size - 3)));
        std::vector<double> ms;
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            m.score_tree(ctx, tree, out);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        if (nodes == 0) base = med;
        // The same number of positions as a chain (score_into), for the attention's share.
        std::vector<double> chain_ms;
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            m.score_into(ctx, std::span<const specdec::token_id>(tree.tokens), out);
            chain_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(chain_ms.begin(), chain_ms.end());
        progress.clear();
        std::printf("| %zu | %.1f | %.2f | %.1f |\n", nodes, med, med / base, chain_ms[chain_ms.size() / 2]);
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::filesystem::path models;
    if (const char* env = std::getenv("SPECDEC_MODELS_DIR"); env && *env) models = env;
    std::size_t runs = 40, tokens = 200;
    bool cost = false;
    std::string preset = "stories110M";
    std::ptrdiff_t context = 128;
    int reps = 5;
    std::string scheme = "traversal";
    CLI::App app("Tokens per target pass of tree speculative decoding against chains on the real pair; with "
                 "--cost, the time of a score_tree pass against its node count.",
                 "compare-trees");
    specdec_examples::command_line_defaults(app);
    app.add_option("--models", models, "folder with stories260K.bin and llama2xs_tok512_279K.bin (default: the "
                                        "SPECDEC_MODELS_DIR environment variable)");
    app.add_option("--runs", runs, "generations per setting (at least 2)")->capture_default_str();
    app.add_option("--tokens", tokens, "tokens per generation")->capture_default_str();
    app.add_option("--scheme", scheme, "tree verification: traversal or recursive (rejection sampling)")
        ->capture_default_str()
        ->check(CLI::IsMember({"traversal", "recursive"}));
    app.add_flag("--cost", cost, "time score_tree on random weights instead");
    app.add_option("--preset", preset, "model shape for --cost")->capture_default_str();
    app.add_option("--context", context, "cached context tokens for --cost")->capture_default_str();
    app.add_option("--reps", reps, "repetitions per node count for --cost")->capture_default_str();
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;
    try {
        if (cost) return measure_cost(preset, context, std::max(reps, 1));
        if (models.empty()) {
            std::fprintf(stderr, "compare-trees: pass --models DIR (or set SPECDEC_MODELS_DIR)\n");
            return 2;
        }
        if (runs < 2) {
            std::fprintf(stderr, "compare-trees: --runs needs at least 2 (standard errors are across runs)\n");
            return 2;
        }
        return measure_passes(models, runs, tokens,
                              scheme == "traversal" ? specdec::tree_verification_scheme::traversal
                                                    : specdec::tree_verification_scheme::recursive_rejection);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "compare-trees: %s\n", e.what());
        return 1;
    }
}
