// Quickstart: speculative decoding with two small built-in character models.
//
// The target is a 4-gram character model and the draft a bigram model, both counted from
// a short built-in text. Each is an ordinary class with vocab_size() and next_logits(): that
// is all specdec needs from a model. The program samples the same amount of text with
// speculative decoding and with plain autoregressive decoding and prints both with the
// statistics.
//
//   specdec_quickstart [--gamma N] [--tokens N] [--temperature T] [--seed S]

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

namespace {

constexpr std::string_view corpus =
    "once upon a time there was a little girl named lily. she loved to play outside in the park. "
    "one day she saw a big red ball in the grass. she wanted to play with the ball, so she ran to it. "
    "the ball was very big and very red. lily was happy. she played with the ball all day long. "
    "then her mom said it was time to go home. lily said goodbye to the ball and went home with her mom. "
    "the next day lily went to the park again. the ball was still there, and she played with it again.";

/// An n-gram character model over the characters of the corpus, backing off to shorter
/// contexts that were seen.
class char_ngram_model {
public:
    char_ngram_model(std::string_view text, int order) : order_(order) {
        for (char ch : text)
            if (index_.find(ch) == index_.end()) {
                index_[ch] = static_cast<specdec::token_id>(chars_.size());
                chars_.push_back(ch);
            }
        // Count every context length up to `order`, so next_logits can back off.
        for (std::size_t i = 0; i < text.size(); ++i)
            for (std::size_t k = 0; k <= std::min<std::size_t>(i, static_cast<std::size_t>(order_)); ++k) {
                auto& row = counts_[std::string(text.substr(i - k, k))];
                row.resize(256, 0.0f);
                row[static_cast<unsigned char>(text[i])] += 1.0f;
            }
    }

    [[nodiscard]] std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(chars_.size()); }

    /// Logits of the next character: log counts of the longest context seen in the corpus.
    [[nodiscard]] Eigen::VectorXf next_logits(std::span<const specdec::token_id> context) const {
        for (int k = std::min<int>(order_, static_cast<int>(context.size())); k >= 0; --k) {
            std::string key;
            for (std::size_t i = context.size() - static_cast<std::size_t>(k); i < context.size(); ++i)
                key += chars_[static_cast<std::size_t>(context[i])];
            if (auto it = counts_.find(key); it != counts_.end()) {
                Eigen::VectorXf logits(vocab_size());
                for (std::size_t c = 0; c < chars_.size(); ++c)  // add-0.01 smoothing
                    logits[static_cast<Eigen::Index>(c)] =
                        std::log(it->second[static_cast<unsigned char>(chars_[c])] + 0.01f);
                return logits;
            }
        }
        return Eigen::VectorXf::Zero(vocab_size());
    }

    [[nodiscard]] std::vector<specdec::token_id> encode(std::string_view s) const {
        std::vector<specdec::token_id> out;
        for (char ch : s) out.push_back(index_.at(ch));
        return out;
    }
    [[nodiscard]] std::string decode(std::span<const specdec::token_id> tokens) const {
        std::string out;
        for (auto t : tokens) out += chars_[static_cast<std::size_t>(t)];
        return out;
    }

private:
    int order_;
    std::vector<char> chars_;
    std::map<char, specdec::token_id> index_;
    std::map<std::string, std::vector<float>> counts_;  // next-character counts by byte
};

}  // namespace

int main(int argc, char** argv) {
    specdec::decode_options opts{.gamma = 4, .max_new_tokens = 200, .sampling = {.temperature = 0.8f}};
    std::uint64_t seed = 1;
    CLI::App app("Speculative decoding between two character n-gram models fit on a built-in text "
                 "(a 4-gram target, a bigram draft), beside the autoregressive baseline.",
                 "specdec_quickstart");
    specdec_examples::command_line_defaults(app);
    app.add_option("--gamma", opts.gamma, "draft length")->capture_default_str();
    app.add_option("--tokens", opts.max_new_tokens, "tokens to generate")->capture_default_str();
    app.add_option("--temperature", opts.sampling.temperature, "sampling temperature (0: greedy)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--seed", seed, "random seed")->capture_default_str();
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;
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
                    spec.stats.acceptance_rate(), opts.gamma);
        std::printf("Eq. 1 predicts %.2f tokens per target call at this acceptance rate\n",
                    specdec::expected_tokens_per_step(spec.stats.acceptance_rate(), opts.gamma));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
