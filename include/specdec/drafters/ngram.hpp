#pragma once
/// \file
/// Unigram and bigram token models: negligible-cost draft models (Leviathan et al. 2023,
/// Sec. 3.6: "n-gram models, where the evaluation amounts to a table lookup"; their Table 3
/// reports non-zero alpha even for these).

#include <Eigen/Core>

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <unordered_map>
#include <vector>

#include "../error.hpp"
#include "../types.hpp"

namespace specdec {

/// A unigram (order 1) or bigram (order 2) model over token ids, fit from a token corpus
/// with fit() and, optionally, from the running context (the tokens of the sequence being
/// generated, kept up to date as drafts are rolled back).
///
/// It is a LanguageModel, so it drafts with distributions: speculative decoding samples
/// from its standardized distributions and verifies against them, like any draft model.
///
/// Probabilities: order 1, P(y) ∝ c(y) + k; order 2, P(y | x) ∝ c(x, y) + k·P₁(y), where
/// P₁ is the add-one unigram distribution and k = `smoothing`.
class ngram_model {
public:
    /// \param vocab_size           the shared vocabulary size (> 0)
    /// \param order                1 (unigram) or 2 (bigram)
    /// \param learn_from_context   also count the tokens of the context passed to next_logits
    /// \param smoothing            k > 0 (see the class comment)
    /// \throws std::invalid_argument for an order other than 1 or 2, a non-positive vocabulary
    ///         size, or a smoothing that is not positive and finite.
    ngram_model(std::ptrdiff_t vocab_size, int order, bool learn_from_context = true, float smoothing = 0.1f)
        : vocab_(vocab_size), order_(order), learn_(learn_from_context), smoothing_(smoothing),
          unigram_(Eigen::VectorXd::Zero(vocab_size > 0 ? vocab_size : 0)) {
        constexpr const char* where = "specdec::ngram_model";
        if (vocab_size <= 0) detail::fail_invalid(where, ": vocab_size = ", vocab_size, " must be positive");
        if (order != 1 && order != 2) detail::fail_invalid(where, ": order = ", order, " must be 1 or 2");
        if (!(smoothing > 0.0f && smoothing < std::numeric_limits<float>::infinity()))
            detail::fail_invalid(where, ": smoothing = ", smoothing, " must be positive and finite");
    }

    /// Adds the counts of a token corpus (one sequence; call again for more).
    /// \throws std::invalid_argument for a token out of range; the counts are then unchanged.
    void fit(std::span<const token_id> corpus) {
        for (const token_id t : corpus) check(t);
        for (std::size_t i = 0; i < corpus.size(); ++i) add(i > 0 ? corpus[i - 1] : -1, corpus[i], 1.0);
    }

    /// The vocabulary size given to the constructor.
    [[nodiscard]] std::ptrdiff_t vocab_size() const noexcept { return vocab_; }

    /// Logits of the next token after `context` (log of the smoothed probabilities).
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        if (learn_) sync(context);
        const double k = smoothing_;
        if (order_ == 1 || context.empty()) return (unigram_.array() + k).log().cast<float>().matrix();
        const double total = unigram_.sum();
        Eigen::VectorXd w = k * (unigram_.array() + 1.0) / (total + static_cast<double>(vocab_));
        if (auto it = bigram_.find(context.back()); it != bigram_.end())
            for (const auto& [y, c] : it->second) w[y] += c;
        return w.array().log().cast<float>().matrix();
    }

private:
    void check(token_id t) const {
        if (t < 0 || t >= vocab_)
            detail::fail_invalid("specdec::ngram_model: token ", t, " is out of range [0, ", vocab_, ")");
    }
    void add(token_id prev, token_id t, double c) {
        unigram_[t] += c;
        if (order_ == 2 && prev >= 0) bigram_[prev][t] += c;
    }
    /// Brings the context counts in line with `context`: uncount what diverged, count what is new.
    void sync(std::span<const token_id> context) {
        std::size_t common = 0;
        while (common < seen_.size() && common < context.size() && seen_[common] == context[common]) ++common;
        for (std::size_t i = seen_.size(); i > common; --i) add(i >= 2 ? seen_[i - 2] : -1, seen_[i - 1], -1.0);
        seen_.resize(common);
        for (std::size_t i = common; i < context.size(); ++i) {
            check(context[i]);
            add(i > 0 ? context[i - 1] : -1, context[i], 1.0);
            seen_.push_back(context[i]);
        }
    }

    std::ptrdiff_t vocab_;
    int order_;
    bool learn_;
    float smoothing_;
    // Counts in double: exact up to 2^53, so counting and uncounting a rolled-back draft
    // cancel (float counts stop growing at 2^24 while they still shrink).
    Eigen::VectorXd unigram_;
    std::unordered_map<token_id, std::unordered_map<token_id, double>> bigram_;
    std::vector<token_id> seen_;  // context tokens currently counted
};

}  // namespace specdec
