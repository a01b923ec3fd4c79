#pragma once
/// \file
/// Hierarchical drafting (Leviathan et al. 2023, §6): a drafter that runs the draft model itself
/// by speculative decoding, with a cheaper drafter below it (prompt lookup, an n-gram table, a
/// smaller model).

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../diagnostics.hpp"
#include "../error.hpp"
#include "../random.hpp"
#include "../sampling.hpp"
#include "../speculative_step.hpp"
#include "../types.hpp"

namespace specdec {

/// Settings of the inner loop of a hierarchical_drafter.
struct hierarchical_options {
    /// Draft tokens the inner drafter proposes per inner step. \pre >= 1.
    std::size_t gamma = 4;
    /// The inner loop's verification scheme (both exact).
    verification_scheme scheme = verification_scheme::block;
};

namespace detail {

/// A uniform bit generator over a uniform_source: each call returns the 53 bits of one uniform,
/// so uniform01 on it gives back exactly that uniform (a range of 2^53: one call per draw).
class uniform_source_bits {
public:
    using result_type = std::uint64_t;
    explicit uniform_source_bits(uniform_source& u) noexcept : u_(&u) {}
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return (std::uint64_t{1} << 53) - 1; }
    result_type operator()() { return static_cast<result_type>((*u_)() * 0x1.0p53); }

private:
    uniform_source* u_;
};

}  // namespace detail

/// A BlockDrafter whose block is the draft model's own sample, produced by speculative decoding
/// of the draft model with `inner` proposing for it (Leviathan et al. 2023, §6: the draft model
/// M_q is itself sped up by a cheaper M_q'). Both members are held as fallback_drafter holds
/// them: an lvalue by reference, an rvalue moved in.
///
/// Exact: the inner loop is speculative decoding of `model` at the draft's sampling settings, so
/// its tokens x_1..x_γ have exactly the law of sampling them one by one from the model (App.
/// A.1 for the model as target), and column i of the block is the model's own standardized row
/// after context + x_<i, taken from the inner loop's verification pass (the model's logits at
/// the positions it scored, no extra pass): q_i is the law x_i was drawn from given the
/// past, which is all the outer verification needs. The block of a step asked for γ tokens may
/// come from inner steps that produced more; the first γ are kept (a prefix of an exact sample
/// is an exact sample of the prefix).
///
/// Cost: the inner steps' model passes (reported in draft_block::model_calls) and the inner
/// drafter's calls. Allocates per call where the inner loop's workspaces grow (not after
/// warm-up).
///
/// \code
/// specdec::prompt_lookup_drafter lookup(vocab);
/// specdec::hierarchical_drafter lookup_then_model(lookup, draft_model, {.gamma = 4});
/// auto out = specdec::speculative_decode(lookup_then_model, target, prompt, {}, rng);
/// \endcode
template <class Inner, class Model>
class hierarchical_drafter {
    // The inner drafter must be a Drafter and the model a Verifier: a miss is reported by name,
    // with the fix, as speculative_decode reports it (diagnostics.hpp).
    static_assert((detail::reject_speculative_call<std::remove_reference_t<Inner>, std::remove_reference_t<Model>,
                                                   detail::uniform_source_bits>(),
                   true));

public:
    /// \throws std::invalid_argument for options.gamma = 0 or vocabulary sizes that differ.
    hierarchical_drafter(Inner&& inner, Model&& model, hierarchical_options options = {})
        : inner_(std::forward<Inner>(inner)), model_(std::forward<Model>(model)), options_(options) {
        constexpr const char* where = "specdec::hierarchical_drafter";
        if (options_.gamma == 0) detail::fail_invalid(where, ": options.gamma = 0; the inner drafter must propose");
        vocab_ = detail::checked_vocab(inner_, model_, where);
    }

    /// The vocabulary size, the same for the inner drafter and the model (checked by the constructor).
    [[nodiscard]] std::ptrdiff_t vocab_size() const noexcept { return vocab_; }
    /// The inner loop's statistics over every call (its tokens, steps, acceptance).
    [[nodiscard]] const decode_stats& inner_stats() const noexcept { return stats_; }

    /// Proposes gamma tokens sampled from the model (with `sampling`) by the inner loop, with
    /// the model's standardized columns (see the class comment).
    void draft(std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
               uniform_source& uniforms, draft_block& out) {
        out.clear();
        if (gamma == 0) return;
        detail::uniform_source_bits bits(uniforms);
        sequence_.assign(context.begin(), context.end());
        const std::size_t start = sequence_.size();
        const std::size_t passes_before = stats_.target_calls;
        out.resize_probs(static_cast<Eigen::Index>(vocab_), static_cast<Eigen::Index>(gamma));
        std::size_t have = 0;
        while (have < gamma) {
            const step_options opts{.gamma = options_.gamma, .sampling = sampling, .scheme = options_.scheme};
            const step_result r = speculative_step(inner_, model_, sequence_, stats_, opts, bits, ws_);
            // The model's rows of this step: column j is its row after the sequence up to the
            // j-th new token, for the accepted tokens and the one the step drew after them.
            const std::size_t fresh = std::min(r.accepted + 1, gamma - have);
            for (std::size_t j = 0; j < fresh; ++j) {
                auto col = out.probs.col(static_cast<Eigen::Index>(have + j));
                standardize(ws_.target_logits.col(static_cast<Eigen::Index>(j)), sampling, col, sws_,
                            "specdec::hierarchical_drafter");
            }
            have += fresh;
        }
        out.tokens.assign(sequence_.begin() + static_cast<std::ptrdiff_t>(start),
                          sequence_.begin() + static_cast<std::ptrdiff_t>(start + gamma));
        out.standardized = true;
        out.model_calls = stats_.target_calls - passes_before;
    }

private:
    Inner inner_;
    Model model_;
    hierarchical_options options_;
    std::ptrdiff_t vocab_ = 0;
    std::vector<token_id> sequence_;
    decode_stats stats_;
    step_workspace ws_;
    sampling_workspace sws_;
};

/// Deduces the members' types from the arguments: an lvalue is held by reference, an rvalue
/// moved in (see the class comment).
template <class I, class M>
hierarchical_drafter(I&&, M&&) -> hierarchical_drafter<I, M>;
/// As the guide above, with options.
template <class I, class M>
hierarchical_drafter(I&&, M&&, hierarchical_options) -> hierarchical_drafter<I, M>;

}  // namespace specdec
