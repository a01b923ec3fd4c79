#pragma once
/// \file
/// The public vocabulary that the core takes as it is: token_id and sampling_config, in
/// namespace specdec. specdec/types.hpp re-exports them (include that one); they are defined here
/// so that detail/ includes no public header.

#include <cstdint>

namespace specdec {

/// A token of the shared draft/target vocabulary; valid ids lie in [0, vocab_size()).
using token_id = std::int32_t;

/// Standardized sampling (Leviathan et al. 2023, Sec. 2.2): how raw logits become the
/// distribution that is sampled from. The same settings are applied to the target's
/// and to the draft's logits, so every sampling method reduces to plain sampling from
/// an adjusted distribution, and speculative decoding stays exact for all of them.
///
/// Filters apply in this order: temperature, top-k, top-p, min-p.
struct sampling_config {
    /// Softmax temperature. 0 selects argmax (greedy; ties go to the lowest id).
    /// \pre temperature is 0, or finite and at least about 5.9e-39 (2 / temperature a finite float).
    float temperature = 1.0f;
    /// Keep only tokens whose logit is at least the k-th largest (ties at the
    /// boundary are all kept). 0 disables the filter.
    int top_k = 0;
    /// Nucleus sampling: keep the smallest set of most probable tokens whose
    /// probability sums to at least top_p (ties at the boundary are all kept).
    /// \pre 0 < top_p <= 1; 1 disables the filter.
    float top_p = 1.0f;
    /// Keep only tokens with probability >= min_p * (largest probability).
    /// \pre 0 <= min_p <= 1; 0 disables the filter.
    float min_p = 0.0f;
};

}  // namespace specdec
