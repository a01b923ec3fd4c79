#pragma once
/// \file
/// A chain of drafters: the first that proposes anything wins.

#include <Eigen/Core>

#include <cstddef>
#include <memory>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../adapters.hpp"
#include "../concepts.hpp"
#include "../diagnostics.hpp"
#include "../error.hpp"
#include "../random.hpp"
#include "../sampling.hpp"
#include "../types.hpp"

namespace specdec {

/// A BlockDrafter that asks its drafters in order and uses the first non-empty block, e.g.
/// prompt lookup first, then a small model: `fallback_drafter chain(lookup, small_model);`.
/// Each member is a Drafter (a BlockDrafter or a plain LanguageModel). As with std::tuple
/// and forwarding, a member passed as an lvalue is held by reference (it must outlive the
/// chain; a model with a KV cache is not copied), and one passed as an rvalue (a temporary,
/// or std::move) is moved into the chain and owned by it:
/// `fallback_drafter chain(prompt_lookup_drafter(vocab), small_model);` holds the lookup by
/// value and small_model by reference. Spelled out, `fallback_drafter<A&, B>` is that chain
/// (an A held by reference, a B owned).
/// The output stays exact: whichever drafter proposes, verification uses what it proposed
/// with (its distributions, or point masses).
///
/// Statistics: the chain reports, in draft_block::model_calls, the sum over the drafters it
/// asked of their reported model calls; a drafter that reports none counts one call if it
/// proposed tokens and none otherwise (as speculative_step() counts such a drafter).
template <class... Ds>
class fallback_drafter {
    // Each member must be a Drafter: a miss is reported by name, with the fix, as
    // speculative_decode reports a drafter's (diagnostics.hpp).
    static_assert(sizeof...(Ds) >= 1, "specdec::fallback_drafter: give it at least one drafter");
    static_assert(((detail::diagnose_drafter<std::remove_reference_t<Ds>>() ? true : true) && ...));

public:
    /// Lvalue members are referred to, rvalue members moved in (see the class comment).
    /// \throws std::invalid_argument if the drafters' vocabulary sizes differ.
    explicit fallback_drafter(Ds&&... drafters) : drafters_(hold<Ds>(std::forward<Ds>(drafters))...) {
        check_vocab(std::index_sequence_for<Ds...>{});
    }

    /// The vocabulary size, the same for every drafter (checked by the constructor).
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(member<0>().vocab_size()); }

    /// Index of the drafter that produced the last block (sizeof...(Ds) if none proposed).
    [[nodiscard]] std::size_t last_used() const noexcept { return last_used_; }

    /// Asks the drafters in order and keeps the first non-empty block (see BlockDrafter), with
    /// the model calls of every drafter asked in out.model_calls.
    void draft(std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
               uniform_source& uniforms, draft_block& out) {
        std::size_t calls = 0;
        last_used_ = sizeof...(Ds);
        try_from<0>(context, gamma, sampling, uniforms, out, calls);
        out.model_calls = calls;
    }

private:
    // A member held by reference is stored as a pointer, so that the chain stays
    // copy-assignable with the usual meaning (rebinding, not assigning through).
    template <class D>
    using stored = std::conditional_t<std::is_lvalue_reference_v<D>, std::remove_reference_t<D>*, D>;
    template <class D, class A>
    static stored<D> hold(A&& a) {
        if constexpr (std::is_lvalue_reference_v<D>) return std::addressof(a);
        else return stored<D>(std::forward<A>(a));
    }
    // The members' own functions (vocab_size() included) are non-const (as the concepts ask).
    template <std::size_t I>
    decltype(auto) member() const {
        if constexpr (std::is_pointer_v<std::tuple_element_t<I, std::tuple<stored<Ds>...>>>) return *std::get<I>(drafters_);
        else return (std::get<I>(drafters_));
    }
    template <std::size_t... I>
    void check_vocab(std::index_sequence<I...>) const {
        const std::ptrdiff_t sizes[] = {static_cast<std::ptrdiff_t>(member<I>().vocab_size())...};
        for (std::ptrdiff_t s : sizes)
            if (s != sizes[0])
                detail::fail_invalid("specdec::fallback_drafter: drafters have different vocab_size() (", sizes[0],
                                     " and ", s, ")");
    }

    template <std::size_t I>
    void try_from(std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
                  uniform_source& uniforms, draft_block& out, std::size_t& calls) {
        if constexpr (I < sizeof...(Ds)) {
            auto& d = member<I>();
            // What an earlier drafter left (an empty block, but its probs, scales or flag)
            // must not apply to this one's draft.
            out.clear();
            if constexpr (BlockDrafter<std::remove_reference_t<decltype(d)>>) {
                d.draft(context, gamma, sampling, uniforms, out);
            } else {
                detail::draft_from_model(d, context, gamma, sampling, uniforms, out, scratch_, logits_, sampling_ws_,
                                         "specdec::fallback_drafter::draft");
            }
            calls += out.model_calls.value_or(out.tokens.empty() ? 0 : 1);
            if (!out.tokens.empty()) {
                last_used_ = I;
                return;
            }
            try_from<I + 1>(context, gamma, sampling, uniforms, out, calls);
        }
    }

    // mutable: an owned member is used as a referred-to one is (the const vocab_size() calls
    // the member's, which need not be const).
    mutable std::tuple<stored<Ds>...> drafters_;
    std::size_t last_used_ = 0;
    std::vector<token_id> scratch_;
    Eigen::VectorXf logits_;
    sampling_workspace sampling_ws_;
};

/// Lvalues are held by reference, rvalues owned (see fallback_drafter).
template <class... Ds>
fallback_drafter(Ds&&...) -> fallback_drafter<Ds...>;

}  // namespace specdec
