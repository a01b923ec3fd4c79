// measure-alpha: the acceptance rate alpha = E[β], β = Σ_x min(p(x), q(x)), of each drafter
// against a target (Leviathan et al. 2023, Cor. 3.6; measured as in their Table 3: on
// positions of the target's own samples).
//
//   measure-alpha --models DIR [--samples 8] [--tokens 200] [--seed 1]
//
// For each temperature (0 and 1) it samples `samples` continuations of `tokens` tokens from
// the target (prompt: BOS), and at every position computes β between the target's
// standardized distribution p and each drafter's q at the same context. Point-mass drafters
// (prompt lookup) have β = p(proposed token), and 0 where they propose nothing.

#include "command_line.hpp"
#include "tokenizer.hpp"
#include "transformer.hpp"

#include <specdec/specdec.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using specdec::token_id;

/// A drafter as seen by the measurement: β against p at a context.
struct drafter_entry {
    std::string name;
    std::function<double(std::span<const token_id> context, const Eigen::VectorXf& p,
                         const specdec::sampling_config& s)>
        beta;
};

/// β for a model that gives logits: standardize them with the same settings as the target.
template <class M>
drafter_entry model_entry(std::string name, M& model) {
    return {std::move(name), [&model, q = Eigen::VectorXf(), ws = specdec::sampling_workspace()](
                                 std::span<const token_id> ctx, const Eigen::VectorXf& p,
                                 const specdec::sampling_config& s) mutable {
                const Eigen::VectorXf logits = model.next_logits(ctx);
                q.resize(logits.size());
                specdec::standardize(logits, s, q, ws);
                return static_cast<double>(p.cwiseMin(q).sum());
            }};
}

}  // namespace

int main(int argc, char** argv) {
    std::filesystem::path models;
    if (const char* env = std::getenv("SPECDEC_MODELS_DIR"); env && *env) models = env;
    std::size_t samples = 8, tokens = 200;
    std::uint64_t seed = 1;
    CLI::App app("The acceptance rate alpha of each drafter against the target, measured on positions of "
                 "the target's own samples.",
                 "measure-alpha");
    specdec_examples::command_line_defaults(app);
    app.add_option("--models", models,
                   "folder with stories260K.bin, llama2xs_tok512_279K.bin and tok512.bin (default: the "
                   "SPECDEC_MODELS_DIR environment variable)");
    app.add_option("--samples", samples, "continuations sampled per temperature")->capture_default_str();
    app.add_option("--tokens", tokens, "tokens per continuation")->capture_default_str();
    app.add_option("--seed", seed, "random seed")->capture_default_str();
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;
    if (models.empty()) {
        std::fprintf(stderr, "measure-alpha: pass --models DIR or set SPECDEC_MODELS_DIR; "
                             "scripts/download_models.sh DIR fetches the files\n");
        return 2;
    }
    try {
        llama2::transformer target(models / "stories260K.bin");
        llama2::transformer draft(models / "llama2xs_tok512_279K.bin");
        const auto vocab = target.vocab_size();
        std::vector<llama2::transformer> exits;
        for (int k = 1; k < target.model_config().n_layers; ++k) exits.push_back(target.early_exit(k));
        specdec::ngram_model unigram(vocab, 1), bigram(vocab, 2);
        specdec::prompt_lookup_drafter lookup(vocab, 3, 1);

        std::vector<drafter_entry> drafters;
        drafters.push_back(model_entry("llama2xs 279K (independent draft model)", draft));
        for (std::size_t k = 0; k < exits.size(); ++k)
            drafters.push_back(model_entry("early exit: target's first " + std::to_string(k + 1) + " layers", exits[k]));
        drafters.push_back(model_entry("unigram (running context)", unigram));
        drafters.push_back(model_entry("bigram (running context)", bigram));
        drafters.push_back({"prompt lookup (n <= 3, point mass)",
                            [&lookup, block = specdec::draft_block()](std::span<const token_id> ctx,
                                                                      const Eigen::VectorXf& p,
                                                                      const specdec::sampling_config& s) mutable {
                                std::mt19937_64 unused;
                                specdec::uniform_source u(unused);
                                lookup.draft(ctx, 1, s, u, block);
                                return block.tokens.empty() ? 0.0 : static_cast<double>(p[block.tokens[0]]);
                            }});

        std::printf("| drafter | alpha, temperature 0 | alpha, temperature 1 |\n|---|---|---|\n");
        std::vector<std::vector<double>> alpha(drafters.size());
        for (const float temperature : {0.0f, 1.0f}) {
            const specdec::sampling_config s{.temperature = temperature};
            std::vector<double> sum(drafters.size(), 0.0);
            std::size_t positions = 0;
            std::mt19937_64 rng(seed);
            specdec::sampling_workspace ws;
            Eigen::VectorXf p(vocab);
            for (std::size_t n = 0; n < samples; ++n) {
                std::vector<token_id> seq{llama2::tokenizer::bos_id};
                for (std::size_t t = 0; t < tokens && seq.size() < static_cast<std::size_t>(draft.max_context()); ++t) {
                    specdec::standardize(target.next_logits(seq), s, p, ws);
                    for (std::size_t d = 0; d < drafters.size(); ++d) sum[d] += drafters[d].beta(seq, p, s);
                    ++positions;
                    const auto next = static_cast<token_id>(specdec::sample_from_weights(p, specdec::uniform01(rng), ws));
                    if (next == llama2::tokenizer::eos_id || next == llama2::tokenizer::bos_id) break;
                    seq.push_back(next);
                }
            }
            for (std::size_t d = 0; d < drafters.size(); ++d) alpha[d].push_back(sum[d] / static_cast<double>(positions));
            std::fprintf(stderr, "temperature %g: %zu positions\n", static_cast<double>(temperature), positions);
        }
        for (std::size_t d = 0; d < drafters.size(); ++d)
            std::printf("| %s | %.2f | %.2f |\n", drafters[d].name.c_str(), alpha[d][0], alpha[d][1]);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "measure-alpha: %s\n", e.what());
        return 1;
    }
    return 0;
}
