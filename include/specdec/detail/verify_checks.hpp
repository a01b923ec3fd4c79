#pragma once
/// \file
/// The checks of verify()'s inputs: shapes, token ranges, scales, draft columns and entries.

#include <Eigen/Core>

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>

#include "buffers.hpp"
#include "error_helpers.hpp"
#include "row_layout.hpp"
#include "sampling_checks.hpp"
#include "verify_vocabulary.hpp"
#include "vocabulary.hpp"

namespace specdec::detail {

/// the entry is q_i(k) = c · draft_probs(k, i).
inline std::string draft_entry_name(Eigen::Index k, std::size_t i, float c) {
    std::string s = "draft_probs(" + std::to_string(k) + ", " + std::to_string(i) + ")";
    if (c != 1.0f) s = "draft_scales[" + std::to_string(i) + "] * " + s;
    return s;
}

/// Throws unless q_i(k) = c · draft_probs(k, i) is a probability (finite, in [0, 1]).
inline void check_draft_entry(const Eigen::Ref<const Eigen::MatrixXf>& q, Eigen::Index k, std::size_t i, float c,
                              const char* where) {
    const float v = c * q(k, static_cast<Eigen::Index>(i));
    if (!(v >= 0.0f && v <= 1.0f))
        fail_invalid(where, ": ", draft_entry_name(k, i, c), " = ", v,
                     " is not a probability (negative, NaN, Inf or > 1)");
}

/// Throws unless c · q is a probability distribution (with details of what is wrong).
inline void check_draft_column(const Eigen::Ref<const Eigen::VectorXf>& q, std::size_t i, float c, const char* where) {
    double s = 0.0;
    for (Eigen::Index k = 0; k < q.size(); ++k) {
        const float v = q[k];
        if (!(v >= 0.0f) || !std::isfinite(v))
            fail_invalid(where, ": ", draft_entry_name(k, i, 1.0f), " = ", v,
                         " is not a probability (negative, NaN or Inf)");
        s += v;
    }
    s *= c;
    if (std::abs(s - 1.0) > draft_probability_tolerance) {
        if (c != 1.0f)
            fail_invalid(where, ": draft distribution column ", i, " times draft_scales[", i, "] = ", c, " sums to ",
                         s, ", not 1");
        fail_invalid(where, ": draft distribution column ", i, " sums to ", s, ", not 1");
    }
}


/// Throws unless every token is in [0, vocab), naming `what` and the first bad entry.
inline void check_token_range(std::span<const token_id> tokens, std::ptrdiff_t vocab, const char* where,
                              const char* what) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            fail_invalid(where, ": ", what, "[", i, "] = ", tokens[i], " is out of range [0, vocab_size = ", vocab,
                         ")");
}

inline void check_verify_inputs(const Eigen::Ref<const Eigen::MatrixXf>& target_logits,
                                std::span<const token_id> draft_tokens, const Eigen::Index* q_rows,
                                const Eigen::Index* q_cols, const sampling_config& sampling,
                                const verify_options& opts, const char* where) {
    const auto n = static_cast<Eigen::Index>(draft_tokens.size());
    const Eigen::Index vocab = target_logits.rows();
    if (vocab <= 0) fail_invalid(where, ": target_logits has no rows (vocabulary size 0)");
    if (target_logits.cols() != n + 1)
        fail_invalid(where, ": target_logits has ", target_logits.cols(),
                     " columns; expected draft_tokens.size() + 1 = ", n + 1, " (one per position, column-major)");
    if (q_rows != nullptr && (*q_rows != vocab || *q_cols != n))
        fail_invalid(where, ": draft_probs is ", *q_rows, " x ", *q_cols, "; expected vocab_size x draft length = ",
                     vocab, " x ", n);
    check_sampling_config(sampling, where);
    if (!(opts.lenience > 0.0f && opts.lenience <= 1.0f))
        fail_invalid(where, ": lenience = ", opts.lenience, " must lie in (0, 1] (1 is exact)");
    if (opts.lenience != 1.0f && opts.scheme == verification_scheme::block)
        fail_invalid(where, ": lenience = ", opts.lenience,
                     " is defined for token verification only; set scheme = verification_scheme::token");
    check_token_range(draft_tokens, vocab, where, "draft_tokens");
}

/// Throws unless `scales` has one finite, positive factor per draft column (`columns`);
/// messages call them `name`.
inline void check_draft_scales(std::span<const float> scales, Eigen::Index columns, const char* where,
                               const char* name = "draft_scales") {
    if (static_cast<Eigen::Index>(scales.size()) != columns)
        fail_invalid(where, ": ", name, " has ", scales.size(), " entries; expected one per draft column = ", columns);
    for (std::size_t i = 0; i < scales.size(); ++i)
        if (!(scales[i] > 0.0f && scales[i] < std::numeric_limits<float>::infinity()))
            fail_invalid(where, ": ", name, "[", i, "] = ", scales[i], " must be finite and positive");
}

/// Column i's scale c_i (q_i = c_i · draft_probs column i): 1 without scales.
inline float draft_scale(const float* scales, std::size_t i) { return scales == nullptr ? 1.0f : scales[i]; }

/// q_i(x) = c · draft_probs(x, i) (1 for a point mass).
inline double draft_prob(const Eigen::Ref<const Eigen::MatrixXf>* q, std::size_t i, token_id x, float c) {
    return q == nullptr ? 1.0 : static_cast<double>(c * (*q)(x, static_cast<Eigen::Index>(i)));
}

/// Draft column i's data when it is to be checked in the pass over row i (temperature > 0),
/// else null; at temperature 0 only the entries the decision reads are checked, here q_i(x_i).
inline const float* column_to_check(const Eigen::Ref<const Eigen::MatrixXf>* q, bool check, std::size_t i, token_id x,
                                    float c, const sampling_config& s, const char* where) {
    if (!check) return nullptr;
    if (s.temperature == 0.0f) {
        check_draft_entry(*q, x, i, c, where);
        return nullptr;
    }
    return q->col(static_cast<Eigen::Index>(i)).data();
}

}  // namespace specdec::detail
