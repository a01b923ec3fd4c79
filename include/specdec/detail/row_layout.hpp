#pragma once
/// \file
/// How the hot core cuts a row into blocks, chunks and lanes, the reference of its exps
/// (exp2_reference), and the small types its passes return; the same for every instruction set.

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "config.hpp"
#include "error_helpers.hpp"
#include "vocabulary.hpp"

namespace specdec::detail {

/// A token drawn from weights w, with the factor that turns them into the distribution:
/// q = scale · w (the public form is specdec::token_draw).
struct scaled_draw {
    Eigen::Index index = 0;  ///< the token drawn
    float scale = 1.0f;      ///< q = scale · w; 1 when w is already the distribution
};

}  // namespace specdec::detail

namespace specdec::detail {

/// True when the settings remove tokens (top-k, top-p or min-p), so a row must be
/// materialized to know its distribution.
inline bool truncates(const sampling_config& s) noexcept {
    return s.top_k > 0 || s.top_p < 1.0f || s.min_p > 0.0f;
}

/// Elements per block of a row in the blockwise passes over logits (8 KiB: stays in L1 between
/// the block's max pass and its exp pass, and long enough that the per-block reductions cost
/// little).
inline constexpr Eigen::Index row_block = 2048;

/// Blocks of row_block elements in a row of n.
inline Eigen::Index blocks_of(Eigen::Index n) { return (n + row_block - 1) / row_block; }

/// Length of block b of a row of n elements (<= 0 past the last block).
inline Eigen::Index block_len(Eigen::Index n, Eigen::Index b) { return std::min(row_block, n - b * row_block); }

/// Elements per block in the two-level passes: small enough to stay in L1 between the
/// vectorized reduction of a block and the scalar work that may follow on it.
inline constexpr Eigen::Index block_size = 512;

/// Elements per chunk of chunked_exp_pass.
inline constexpr Eigen::Index exp_chunk = 256;

/// Chunks of exp_chunk elements (the last one possibly partial) in len elements.
inline Eigen::Index chunks_of(Eigen::Index len) { return (len + exp_chunk - 1) / exp_chunk; }
/// Floats stored per chunk by chunked_exp_pass (the chunk's SIMD lane sums, unreduced).
inline constexpr Eigen::Index chunk_lanes = 16;

/// Elements per block of the temperature-0 pass: with no exp to hide it behind, the
/// per-block reduction must be rare (at 512 it costs about 1.5x of the max pass itself).
inline constexpr Eigen::Index argmax_block = 2048;

/// Coefficients of f^5 .. f^1 of the vectorized polynomial for 2^f on [0, 1] (constant term 1),
/// each the float nearest to the fitted value.
inline constexpr float exp2_poly[5] = {0.00186711829f, 0.00901705492f, 0.055799894f, 0.240164459f, 0.693151295f};

/// log2(e) as a float: the factor that turns a natural exponent into a power of 2.
inline constexpr float log2e_float = 1.44269504088896341f;

/// The exponent of the vectorized exp relative to a reference m: exp((x − m) inv_t) is computed
/// as 2^t with t = x·s − h, s = inv_t·log2(e) and h = m·s (floats), in one fused
/// multiply-subtract, so that x·s is never rounded and t is exact up to its own rounding. What
/// is computed is then exp((x − m') inv_t) for the reference m' = h / s, which differs from m by
/// the rounding of h (at most half its ulp, over s); the factors between blocks (block_factor)
/// are taken from h as well, so the row's p is the same function of its logits whatever its
/// blocks' references. The exponent of x = m itself is then m·s − h, h's rounding error, up to
/// half an ulp of h: this is kept within ±1/4 (the weight of the maximum within 2^±0.25) by
/// fusing only while |h| <= 2^22 (|m| inv_t up to about 2.9e6; beyond 2^31 that error alone
/// would overflow or underflow every exp of the block). Otherwise t = (x − m)·s, whose
/// difference is exact near m, and the reference is m·s exactly.
struct exp2_reference {
    /// The largest |h| for which the multiply-subtract is used.
    static constexpr float fused_limit = 4194304.0f;  // 2^22: ulp(h) <= 1/2
    float m;
    float s;
    float h;
    bool fused;
    exp2_reference(float ref, float inv_t)
        : m(ref), s(inv_t * log2e_float), h(m * s), fused(std::abs(h) <= fused_limit) {}
    /// The reference in base 2: 2^(x·s − log2()) is the exp of x relative to it.
    double log2() const { return fused ? static_cast<double>(h) : static_cast<double>(m) * s; }
};


/// Throws the error that describes what is wrong with a logits row that failed a check:
/// NaN, +Inf, or every entry -Inf.
[[noreturn]] inline void diagnose_logits(const Eigen::Ref<const Eigen::VectorXf>& z, const char* where) {
    for (Eigen::Index i = 0; i < z.size(); ++i) {
        if (std::isnan(z[i])) fail_invalid(where, ": logit ", i, " is NaN");
        if (z[i] == std::numeric_limits<float>::infinity()) fail_invalid(where, ": logit ", i, " is +Inf");
    }
    fail_invalid(where, ": every logit is -Inf (no token is possible)");
}

/// After a target row's checks threw: when column j of the logits is what is wrong (NaN, +Inf, or
/// every entry -Inf), throws that error with the column named ("where: target_logits column 2:
/// logit 7 is NaN"); returns otherwise (the error was about the draft column). Scalar: it runs
/// only after a check has failed, and once for every instruction set.
inline void name_bad_target_column(const Eigen::Ref<const Eigen::MatrixXf>& logits, std::size_t j, const char* where) {
    const auto column = logits.col(static_cast<Eigen::Index>(j));
    bool bad = false, all_neg_inf = true;
    for (Eigen::Index i = 0; i < column.size(); ++i) {
        const float v = column[i];
        bad = bad || std::isnan(v) || v == std::numeric_limits<float>::infinity();
        all_neg_inf = all_neg_inf && v == -std::numeric_limits<float>::infinity();
    }
    if (!bad && !all_neg_inf) return;
    const std::string named = std::string(where) + ": target_logits column " + std::to_string(j);
    diagnose_logits(column, named.c_str());
}

/// Result of chunked_exp_pass.
struct chunked_exp_sums {
    double exp_sum = 0.0;
    bool q_sign = false;  // some entry of q may be negative (see chunked_exp_pass)
    double q_sum = 0.0;  // sum of q (NaN or +Inf anywhere make it fail a check)
};

/// Result of max_and_sum.
struct max_and_sum_result {
    float max;
    float sum;
};

/// True when one of len floats is NaN (scalar; only run after a fast check has failed).
inline bool block_has_nan(const float* z, Eigen::Index len) {
    for (Eigen::Index k = 0; k < len; ++k)
        if (std::isnan(z[k])) return true;
    return false;
}

/// The comparison compare_group makes.
enum class group_compare { equal, greater };


/// The largest logit and its lowest index.
struct row_argmax {
    float value;
    Eigen::Index index;
};

}  // namespace specdec::detail
