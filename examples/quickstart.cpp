// Quickstart: speculative decoding with two small built-in character models.
//
// The target is a 4-gram character model and the draft a bigram model, both counted from
// a short built-in text. Each is an ordinary class with vocab_size() and next_logits(): that
// is all specdec needs from a model. The program samples the same amount of text with
// speculative decoding and with plain autoregressive decoding and prints both with the
// statistics.
//
//   specdec_quickstart [--gamma N] [--max-new-tokens N] [--temperature T] [--seed S]

#include "char_ngram_model.hpp"
#include "command_line.hpp"

#include <specdec/specdec.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using specdec_examples::char_ngram_model;
using specdec_examples::corpus;

int main(int argc, char** argv) {
    specdec::decode_options opts{.sampling = {.temperature = 0.8f}, .budget = {.max_new_tokens = 200}};
    std::size_t gamma = 4;
    std::uint64_t seed = 1;
    CLI::App app("Speculative decoding between two character n-gram models fit on a built-in text "
                 "(a 4-gram target, a bigram draft), beside the autoregressive baseline.",
                 "specdec_quickstart");
    specdec_examples::command_line_defaults(app);
    app.add_option("--gamma", gamma, "draft length (0: plain target steps)")->capture_default_str();
    app.add_option("--max-new-tokens", opts.budget.max_new_tokens, "tokens to generate")->capture_default_str();
    app.add_option("--tokens", opts.budget.max_new_tokens, "old spelling of --max-new-tokens")->group("");
    app.add_option("--temperature", opts.sampling.temperature, "sampling temperature (0: greedy)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--seed", seed, "random seed")->capture_default_str();
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;
    opts.step = specdec::chain{.gamma = gamma};
    const char_ngram_model target(corpus, 4), draft(corpus, 1);
    const auto prompt = target.encode("once upon a time");
    try {
        std::mt19937_64 rng(seed);
        const auto spec = specdec::speculative_decode(draft, target, prompt, opts, rng);
        std::mt19937_64 rng2(seed);
        const auto base = specdec::autoregressive_decode(target, prompt, opts, rng2);
        std::printf("speculative:    once upon a time%s\n\n", target.decode(spec.tokens).c_str());
        std::printf("autoregressive: once upon a time%s\n\n", target.decode(base.tokens).c_str());
        std::printf("tokens %zu, target calls %zu (autoregressive: %zu), tokens per target call %.2f, "
                    "acceptance rate %.2f, gamma %zu\n",
                    spec.tokens.size(), spec.stats.steps, base.stats.target_calls, spec.stats.tokens_per_step(),
                    spec.stats.acceptance_rate(), gamma);
        if (gamma > 0)  // (gamma 0: plain target steps, nothing drafted)
            std::printf("Eq. 1 predicts %.2f tokens per target call at this acceptance rate\n",
                        specdec::expected_tokens_per_step(spec.stats.acceptance_rate(), gamma));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
