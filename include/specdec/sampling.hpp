#pragma once
/// \file
/// Standardized sampling (Leviathan et al. 2023, Sec. 2.2): temperature, top-k, top-p
/// and min-p turn logits into one probability distribution, and every sampling method
/// becomes plain sampling from that distribution. Target and draft logits go through
/// the same function, so the draft token is sampled from exactly the q that
/// verification later uses.

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "error.hpp"
#include "types.hpp"

namespace specdec {

/// Checks a sampling_config.
/// \throws std::invalid_argument naming `where` and the offending field when
///         temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], or
///         min_p outside [0, 1].
inline void validate(const sampling_config& s, const char* where = "specdec::validate") {
    if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
        detail::fail_invalid(where, ": sampling.temperature = ", s.temperature, " must be finite and >= 0");
    if (s.top_k < 0) detail::fail_invalid(where, ": sampling.top_k = ", s.top_k, " must be >= 0 (0 disables it)");
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
        detail::fail_invalid(where, ": sampling.top_p = ", s.top_p, " must lie in (0, 1] (1 disables it)");
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
        detail::fail_invalid(where, ": sampling.min_p = ", s.min_p, " must lie in [0, 1] (0 disables it)");
}

/// Scratch buffers for the truncating filters; reuse one across calls so that
/// sampling allocates nothing after warm-up.
struct sampling_workspace {
    std::vector<float> values;  ///< scratch copy for selection (top-k, top-p)
};

namespace detail {

/// Sum of float weights in double precision, in index order (the order
/// sample_from_weights accumulates in, so inversion is exact for these weights).
inline double sum_in_double(const Eigen::Ref<const Eigen::VectorXf>& w) {
    double s = 0.0;
    for (Eigen::Index i = 0; i < w.size(); ++i) s += w[i];
    return s;
}

/// Index of the largest logit (lowest index on ties), with the input checks every
/// logits row gets: \throws std::invalid_argument on NaN, +Inf or an all -Inf row.
inline Eigen::Index checked_argmax(const Eigen::Ref<const Eigen::VectorXf>& z, const char* where) {
    const Eigen::Index n = z.size();
    if (n == 0) fail_invalid(where, ": logits row is empty");
    Eigen::Index best = 0;
    float m = z[0];
    bool bad = false;
    for (Eigen::Index i = 0; i < n; ++i) {
        const float v = z[i];
        bad |= !(v < std::numeric_limits<float>::infinity());  // NaN or +Inf
        if (v > m) {
            m = v;
            best = i;
        }
    }
    if (bad) {
        for (Eigen::Index i = 0; i < n; ++i) {
            if (std::isnan(z[i])) fail_invalid(where, ": logit ", i, " is NaN");
            if (z[i] == std::numeric_limits<float>::infinity()) fail_invalid(where, ": logit ", i, " is +Inf");
        }
    }
    if (m == -std::numeric_limits<float>::infinity())
        fail_invalid(where, ": every logit is -Inf (no token is possible)");
    return best;
}

/// Smallest threshold t among the positive values such that the values >= t sum to at
/// least `need`, found by three-way quickselect on the mass instead of sorting the
/// vocabulary (expected linear time). `v` is scratch and is reordered.
inline float top_p_threshold(std::vector<float>& v, double need) {
    std::size_t lo = 0, hi = v.size();  // active range [lo, hi)
    while (hi - lo > 1) {
        // Median of three as pivot.
        const float a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1];
        const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
        // Dutch-flag partition: [lo, gt) > pivot, [gt, eq) == pivot, [eq, hi) < pivot.
        std::size_t gt = lo, i = lo, lt = hi;
        double mass_gt = 0.0, mass_eq = 0.0;
        while (i < lt) {
            const float x = v[i];
            if (x > pivot) {
                std::swap(v[i], v[gt]);
                mass_gt += x;
                ++gt;
                ++i;
            } else if (x < pivot) {
                --lt;
                std::swap(v[i], v[lt]);
            } else {
                mass_eq += x;
                ++i;
            }
        }
        if (mass_gt >= need) {
            hi = gt;  // the answer lies strictly above the pivot
        } else if (mass_gt + mass_eq >= need) {
            return pivot;
        } else {
            need -= mass_gt + mass_eq;
            if (lt == hi) return pivot;  // rounding: nothing left below, keep everything
            lo = lt;
        }
    }
    return hi > lo ? v[lo] : 0.0f;
}

}  // namespace detail

/// Turns one row of logits into the standardized distribution it is sampled from.
///
/// \param logits  raw logits, one per token (any contiguous float vector or column)
/// \param s       sampling settings (validated by the caller, see validate())
/// \param out     receives the probabilities (resized to logits.size(); sums to 1)
/// \param ws      scratch for top-k / top-p
/// \param where   function name used in error messages
/// \throws std::invalid_argument if logits contain NaN or +Inf, or are all -Inf.
inline void standardize(const Eigen::Ref<const Eigen::VectorXf>& logits, const sampling_config& s,
                        Eigen::Ref<Eigen::VectorXf> out, sampling_workspace& ws,
                        const char* where = "specdec::standardize") {
    const Eigen::Index n = logits.size();
    SPECDEC_ASSERT(out.size() == n, "standardize: output size must match logits");
    const Eigen::Index best = detail::checked_argmax(logits, where);
    if (s.temperature == 0.0f) {
        // Argmax as a distribution: zero all but the max and normalize (Sec. 2.2).
        out.setZero();
        out[best] = 1.0f;
        return;
    }
    const float m = logits[best];
    const float inv_t = 1.0f / s.temperature;
    out = ((logits.array() - m) * inv_t).exp().matrix();  // exp(-inf) == 0: impossible stays impossible

    if (s.top_k > 0 && s.top_k < n) {
        ws.values.assign(logits.data(), logits.data() + n);
        auto kth = ws.values.begin() + (s.top_k - 1);
        std::nth_element(ws.values.begin(), kth, ws.values.end(), std::greater<float>());
        const float threshold = *kth;
        out = (logits.array() >= threshold).select(out, 0.0f);
    }
    if (s.top_p < 1.0f) {
        ws.values.clear();
        double total = 0.0;
        for (Eigen::Index i = 0; i < n; ++i)
            if (out[i] > 0.0f) {
                ws.values.push_back(out[i]);
                total += out[i];
            }
        const float threshold = detail::top_p_threshold(ws.values, static_cast<double>(s.top_p) * total);
        out = (out.array() >= threshold).select(out, 0.0f);
    }
    if (s.min_p > 0.0f) {
        // The largest weight is exp(0) == 1, so "p >= min_p * p_max" is "w >= min_p".
        out = (out.array() >= s.min_p).select(out, 0.0f);
    }
    out /= out.sum();
}

/// Draws an index from non-negative weights by inversion with one uniform u in [0, 1):
/// the first index whose running sum exceeds u * total. Never returns an index of
/// weight 0. The weights need not be normalized.
/// \pre total is the sum of the weights and is > 0.
[[nodiscard]] inline Eigen::Index sample_from_weights(const Eigen::Ref<const Eigen::VectorXf>& w, double total,
                                                      double u) {
    const double target = u * total;
    double acc = 0.0;
    Eigen::Index last_positive = -1;
    const Eigen::Index n = w.size();
    for (Eigen::Index i = 0; i < n; ++i) {
        const float x = w[i];
        if (x > 0.0f) {
            acc += x;
            last_positive = i;
            if (acc > target) return i;
        }
    }
    // Rounding left target at or above the final sum: the last token with mass.
    SPECDEC_ASSERT(last_positive >= 0, "sample_from_weights: all weights are zero");
    return last_positive;
}

}  // namespace specdec
