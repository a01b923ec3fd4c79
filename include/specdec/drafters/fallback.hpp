#pragma once
/// \file
/// A chain of drafters: the first that proposes anything wins.

#include <Eigen/Core>

#include <cstddef>
#include <span>
#include <tuple>
#include <vector>

#include "../adapters.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../random.hpp"
#include "../sampling.hpp"
#include "../types.hpp"

namespace specdec {

/// A BlockDrafter that asks its drafters in order and uses the first non-empty block, e.g.
/// prompt lookup first, then a small model: `fallback_drafter chain(lookup, small_model);`.
/// Each member is a Drafter (a BlockDrafter or a plain LanguageModel) held by reference.
/// The output stays exact: whichever drafter proposes, verification uses what it proposed
/// with (its distributions, or point masses).
template <Drafter... Ds>
    requires(sizeof...(Ds) >= 1)
class fallback_drafter {
public:
    /// \throws std::invalid_argument if the drafters' vocabulary sizes differ.
    explicit fallback_drafter(Ds&... drafters) : drafters_(&drafters...) {
        const std::ptrdiff_t sizes[] = {static_cast<std::ptrdiff_t>(drafters.vocab_size())...};
        for (std::ptrdiff_t s : sizes)
            if (s != sizes[0])
                detail::fail_invalid("specdec::fallback_drafter: drafters have different vocab_size() (", sizes[0],
                                     " and ", s, ")");
    }

    [[nodiscard]] std::ptrdiff_t vocab_size() const {
        return static_cast<std::ptrdiff_t>(std::get<0>(drafters_)->vocab_size());
    }

    /// Index of the drafter that produced the last block (sizeof...(Ds) if none proposed).
    [[nodiscard]] std::size_t last_used() const noexcept { return last_used_; }

    void draft(std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
               uniform_source& uniforms, draft_block& out) {
        std::size_t calls = 0;
        last_used_ = sizeof...(Ds);
        try_from<0>(context, gamma, sampling, uniforms, out, calls);
        out.model_calls = calls;
    }

private:
    template <std::size_t I>
    void try_from(std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
                  uniform_source& uniforms, draft_block& out, std::size_t& calls) {
        if constexpr (I < sizeof...(Ds)) {
            auto& d = *std::get<I>(drafters_);
            // What an earlier drafter left (an empty block, but its probs, scales or flag)
            // must not apply to this one's draft.
            out.clear();
            if constexpr (BlockDrafter<std::remove_reference_t<decltype(d)>>) {
                d.draft(context, gamma, sampling, uniforms, out);
            } else {
                detail::draft_from_model(d, context, gamma, sampling, uniforms, out, scratch_, logits_, sampling_ws_);
            }
            calls += out.model_calls;
            if (!out.tokens.empty()) {
                last_used_ = I;
                return;
            }
            try_from<I + 1>(context, gamma, sampling, uniforms, out, calls);
        }
    }

    std::tuple<Ds*...> drafters_;
    std::size_t last_used_ = 0;
    std::vector<token_id> scratch_;
    Eigen::VectorXf logits_;
    sampling_workspace sampling_ws_;
};

}  // namespace specdec
