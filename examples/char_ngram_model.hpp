#pragma once
// The quickstart's models: character n-gram models counted from a short built-in text, each an
// ordinary class with vocab_size() and next_logits() (all specdec needs from a model). Used by
// examples/quickstart.cpp and by the conformance kit's tests.

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace specdec_examples {

inline constexpr std::string_view corpus =
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

}  // namespace specdec_examples
