// compare-schemes: mean tokens per target pass under token and under block verification, on
// the real draft/target pair, with the same seeds (Sun et al. 2024 vs Leviathan et al. 2023).
//
//   compare-schemes --models DIR [--runs 40] [--tokens 200]
//
// For each temperature and gamma, `runs` generations of `tokens` tokens from BOS (seeds
// 1..runs, the same for both schemes); tokens per target pass = generated / steps, over all
// runs. Standard errors are across runs.

#include "command_line.hpp"
#include "context_limit.hpp"
#include "progress.hpp"
#include "transformer.hpp"

#include <specdec/specdec.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <random>
#include <vector>

int main(int argc, char** argv) {
    std::filesystem::path models;
    if (const char* env = std::getenv("SPECDEC_MODELS_DIR"); env && *env) models = env;
    std::size_t runs = 40, tokens = 200;
    CLI::App app("Mean tokens per target pass under token and under block verification, on the real "
                 "draft/target pair, with the same seeds.",
                 "compare-schemes");
    specdec_examples::command_line_defaults(app);
    app.add_option("--models", models,
                   "folder with stories260K.bin and llama2xs_tok512_279K.bin (default: the SPECDEC_MODELS_DIR "
                   "environment variable)");
    app.add_option("--runs", runs, "generations per setting and scheme")
        ->capture_default_str()
        ->check(CLI::Validator(
            [](const std::string& v) {
                std::size_t n = 0;
                const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
                if (ec != std::errc() || end != v.data() + v.size()) return "'" + v + "' is not a number";
                return n >= 2 ? std::string() : std::string("needs at least 2 runs (standard errors are across runs)");
            },
            "N >= 2"));
    app.add_option("--tokens", tokens, "tokens per generation")->capture_default_str();
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;
    if (models.empty()) {
        std::fprintf(stderr, "compare-schemes: pass --models DIR (or set SPECDEC_MODELS_DIR); "
                             "scripts/download_models.sh DIR fetches the files\n");
        return 2;
    }
    try {
        llama2::transformer target(models / "stories260K.bin");
        llama2::transformer draft_model(models / "llama2xs_tok512_279K.bin");
        llama2::context_limited_drafter<llama2::transformer> draft(draft_model);
        const std::vector<specdec::token_id> prompt{1};
        specdec_examples::progress_line progress;  // on stderr, when it is a terminal
        std::printf("| temperature | gamma | token: tokens/pass | block: tokens/pass | block gain |\n");
        std::printf("|---|---|---|---|---|\n");
        for (const float temperature : {0.7f, 1.0f}) {
            for (const std::size_t gamma : {2u, 4u, 8u}) {
                double mean[2] = {0, 0}, se[2] = {0, 0};
                int k = 0;
                for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
                    std::vector<double> per_run;
                    std::size_t generated = 0, steps = 0;
                    for (std::size_t r = 1; r <= runs; ++r) {
                        std::mt19937_64 rng(r);
                        const auto out = specdec::speculative_decode(
                            draft, target, prompt,
                            {.step = specdec::chain{.gamma = gamma, .scheme = scheme},
                             .sampling = {.temperature = temperature},
                             .budget = {.max_new_tokens = tokens}},
                            rng);
                        generated += out.tokens.size();
                        steps += out.stats.steps;
                        per_run.push_back(static_cast<double>(out.tokens.size()) / static_cast<double>(out.stats.steps));
                        progress.show(r == runs, "temperature %.1f, gamma %zu, %s verification: run %zu/%zu",
                                      static_cast<double>(temperature), gamma,
                                      scheme == specdec::verification_scheme::token ? "token" : "block", r, runs);
                    }
                    mean[k] = static_cast<double>(generated) / static_cast<double>(steps);
                    double m = 0.0, v = 0.0;
                    for (double x : per_run) m += x;
                    m /= static_cast<double>(runs);
                    for (double x : per_run) v += (x - m) * (x - m);
                    se[k] = std::sqrt(v / static_cast<double>(runs - 1) / static_cast<double>(runs));
                    ++k;
                }
                progress.clear();
                std::printf("| %.1f | %zu | %.3f ± %.3f | %.3f ± %.3f | %+.1f%% |\n", static_cast<double>(temperature),
                            gamma, mean[0], se[0], mean[1], se[1], 100.0 * (mean[1] / mean[0] - 1.0));
                std::fflush(stdout);
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "compare-schemes: %s\n", e.what());
        return 1;
    }
    return 0;
}
