#pragma once
/// \file
/// Prompt lookup: continue the most recent earlier occurrence of the context's last n
/// tokens. A negligible-cost drafter for outputs that repeat their input (Leviathan et al.
/// 2023, Sec. 3.6, on approximation models that copy from the context).

#include <algorithm>
#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../random.hpp"
#include "../types.hpp"

namespace specdec {

/// A BlockDrafter with point-mass drafts: for n from max_ngram down to min_ngram, find the
/// most recent earlier occurrence of the last n context tokens and propose the (up to γ)
/// tokens that followed it. Proposes nothing when no n-gram recurs; the target then
/// produces one token on its own. Deterministic, so the drafts are point masses and the
/// output stays exact.
class prompt_lookup_drafter {
public:
    /// \throws std::invalid_argument unless vocab_size > 0 and 1 <= min_ngram <= max_ngram.
    prompt_lookup_drafter(std::ptrdiff_t vocab_size, std::size_t max_ngram = 3, std::size_t min_ngram = 1)
        : vocab_(vocab_size), max_ngram_(max_ngram), min_ngram_(min_ngram) {
        constexpr const char* where = "specdec::prompt_lookup_drafter";
        if (vocab_size <= 0) detail::fail_invalid(where, ": vocab_size = ", vocab_size, " must be positive");
        if (min_ngram < 1 || min_ngram > max_ngram)
            detail::fail_invalid(where, ": need 1 <= min_ngram <= max_ngram, got ", min_ngram, " and ", max_ngram);
    }

    /// The vocabulary size given to the constructor.
    [[nodiscard]] std::ptrdiff_t vocab_size() const noexcept { return vocab_; }

    /// Proposes up to `gamma` tokens by the lookup of the class comment, as point masses (no
    /// distributions, out.model_calls = 0), or nothing when no n-gram recurs (see BlockDrafter).
    void draft(std::span<const token_id> context, std::size_t gamma, const sampling_config&, uniform_source&,
               draft_block& out) const {
        out.clear();  // point masses, or nothing
        out.model_calls = 0;  // a lookup, no model: it adds no draft calls to the statistics
        const std::size_t len = context.size();
        for (std::size_t n = std::min(max_ngram_, len > 0 ? len - 1 : 0); n >= min_ngram_ && n > 0; --n) {
            const auto key = context.subspan(len - n);
            // Most recent start j < len - n with context[j, j + n) == key.
            for (std::size_t j = len - n; j-- > 0;) {
                if (!std::equal(key.begin(), key.end(), context.begin() + static_cast<std::ptrdiff_t>(j))) continue;
                const std::size_t from = j + n;
                const std::size_t count = std::min(gamma, len - from);
                out.tokens.assign(context.begin() + static_cast<std::ptrdiff_t>(from),
                                  context.begin() + static_cast<std::ptrdiff_t>(from + count));
                return;
            }
        }
    }

private:
    std::ptrdiff_t vocab_;
    std::size_t max_ngram_;
    std::size_t min_ngram_;
};

}  // namespace specdec
