#pragma once
/// \file
/// Standardized sampling (Leviathan et al. 2023, Sec. 2.2): temperature, top-k, top-p
/// and min-p turn logits into one probability distribution, and every sampling method
/// becomes plain sampling from that distribution. Target and draft logits go through
/// the same function, so the draft token is sampled from exactly the q that
/// verification later uses.

#include <Eigen/Core>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "error.hpp"
#include "types.hpp"

/// Forces inlining of the small templates that carry a hot loop's body in a lambda (left to
/// itself GCC keeps them out of line, which costs about 5% of standardize_and_sample).
#if defined(__GNUC__) || defined(__clang__)
#define SPECDEC_ALWAYS_INLINE [[gnu::always_inline]] inline
#elif defined(_MSC_VER)
#define SPECDEC_ALWAYS_INLINE __forceinline
#else
#define SPECDEC_ALWAYS_INLINE inline
#endif
/// Keeps one variant of a hot loop out of line, so that the caller's other variant is compiled
/// as if it did not exist.
#if defined(__GNUC__) || defined(__clang__)
#define SPECDEC_NOINLINE [[gnu::noinline]] inline
#elif defined(_MSC_VER)
#define SPECDEC_NOINLINE __declspec(noinline) inline
#else
#define SPECDEC_NOINLINE inline
#endif

namespace specdec {

/// Checks a sampling_config.
/// \throws std::invalid_argument naming `where` and the offending field when
///         temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], or
///         min_p outside [0, 1].
inline void validate(const sampling_config& s, const char* where = "specdec::validate") {
    if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
        detail::fail_invalid(where, ": sampling.temperature = ", s.temperature, " must be finite and >= 0");
    // Exponents are scaled by 1/T (times log2(e), or 2): it must stay a finite float.
    if (s.temperature > 0.0f && !std::isfinite(2.0f / s.temperature))
        detail::fail_invalid(where, ": sampling.temperature = ", s.temperature,
                             " is too small: 2 / temperature overflows a float (below about 5.9e-39);"
                             " use 0 for greedy (argmax) decoding");
    if (s.top_k < 0) detail::fail_invalid(where, ": sampling.top_k = ", s.top_k, " must be >= 0 (0 disables it)");
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
        detail::fail_invalid(where, ": sampling.top_p = ", s.top_p, " must lie in (0, 1] (1 disables it)");
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
        detail::fail_invalid(where, ": sampling.min_p = ", s.min_p, " must lie in [0, 1] (0 disables it)");
}

namespace detail {

/// The O(1) checks of every public sampling call: valid settings, and an output view of the
/// logits' size (an Eigen::Ref is written in place and cannot be resized).
inline void check_sampling_call(Eigen::Index logits_size, Eigen::Index out_size, const sampling_config& s,
                                const char* where) {
    validate(s, where);
    if (out_size != logits_size)
        fail_invalid(where, ": out has ", out_size, " entries but logits has ", logits_size,
                     "; size out to match first (it is written in place, not resized)");
}

}  // namespace detail

/// Scratch buffers for the truncating filters; reuse one across calls so that
/// sampling allocates nothing after warm-up.
struct sampling_workspace {
    std::vector<float> values;        ///< scratch copy for selection (top-k, top-p)
    std::vector<double> block_sums;   ///< per-block sums for blocked inverse-CDF sampling
    std::vector<double> buckets;      ///< per-magnitude masses for top-p
    std::vector<float> block_refs;    ///< per-block exp references of standardize_and_sample
};

namespace detail {

/// True when the settings remove tokens (top-k, top-p or min-p), so a row must be
/// materialized to know its distribution.
inline bool truncates(const sampling_config& s) noexcept {
    return s.top_k > 0 || s.top_p < 1.0f || s.min_p > 0.0f;
}

/// Sum in double precision: eight partial sums (index mod 8), added at the end. The partial
/// sums are independent (a single running sum would wait on each add's latency) and vectorize
/// lane by lane.
inline double sum_in_double(const Eigen::Ref<const Eigen::VectorXf>& w) {
    const Eigen::Index n = w.size();
    const float* x = w.data();
    double a[8] = {};
    Eigen::Index i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) a[l] += static_cast<double>(x[i + l]);
    for (int l = 0; i < n; ++i, ++l) a[l] += static_cast<double>(x[i]);
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
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

/// Fills `sums` with the sum of each block of `w` (vectorized per block, accumulated
/// across blocks in double) and returns the total.
inline double compute_block_sums(const Eigen::Ref<const Eigen::VectorXf>& w, std::vector<double>& sums) {
    const Eigen::Index n = w.size();
    const auto blocks = static_cast<std::size_t>((n + block_size - 1) / block_size);
    sums.resize(blocks);
    double total = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) {
        const Eigen::Index start = static_cast<Eigen::Index>(b) * block_size;
        const double bs = w.segment(start, std::min(block_size, n - start)).sum();
        sums[b] = bs;
        total += bs;
    }
    return total;
}

/// Inverse-CDF draw over blocks: `sums` holds each block's weight and `weight(k)` the weight
/// of element k; returns the first k whose running weight exceeds u·total (never a k of
/// weight 0; on rounding overshoot the last k with weight).
template <class Weight>
Eigen::Index draw_blocked(const std::vector<double>& sums, double total, Eigen::Index n, double u, Weight&& weight) {
    const double target = u * total;
    double acc = 0.0;
    std::size_t b = 0;
    while (b + 1 < sums.size() && acc + sums[b] <= target) acc += sums[b++];
    Eigen::Index last = -1;
    for (Eigen::Index k = static_cast<Eigen::Index>(b) * block_size; k < n; ++k) {
        const double x = weight(k);
        if (x > 0.0) {
            acc += x;
            last = k;
            if (acc > target) return k;
        }
    }
    if (last >= 0) return last;
    for (Eigen::Index k = static_cast<Eigen::Index>(b) * block_size - 1; k >= 0; --k)
        if (weight(k) > 0.0) return k;
    SPECDEC_ASSERT(false, "draw_blocked: all weights are zero");
    return 0;
}

/// Scans the weights w[0..len) of one block on top of the running sum acc: returns the first k
/// at which acc + w[0] + ... + w[k] exceeds target (w[k] > 0), or -1 with the block's weights
/// added to acc and `last` set to the last k with weight (-1 if none). Groups of 16 are
/// skipped by their (vectorized) sums, so a 2048-float block costs about 150 scalar adds.
inline Eigen::Index scan_block(const float* w, Eigen::Index len, double& acc, double target, Eigen::Index& last) {
    constexpr Eigen::Index group = 16;
    Eigen::Index k = 0;
    for (; k + group <= len; k += group) {
        const Eigen::Map<const Eigen::Matrix<float, group, 1>> g(w + k);
        const double gs = static_cast<double>(g.sum());
        if (acc + gs <= target) {
            // Skip the group (its sum is exact enough: the elementwise walk below re-checks
            // against target whenever the group sum says the crossing is near).
            acc += gs;
            if (gs > 0.0)
                for (Eigen::Index i = group - 1; i >= 0; --i)
                    if (w[k + i] > 0.0f) {
                        last = k + i;
                        break;
                    }
            continue;
        }
        break;
    }
    for (; k < len; ++k) {
        if (w[k] > 0.0f) {
            acc += static_cast<double>(w[k]);
            last = k;
            if (acc > target) return k;
        }
    }
    return -1;
}

/// draw_blocked over a materialized weight vector.
inline Eigen::Index sample_with_block_sums(const Eigen::Ref<const Eigen::VectorXf>& w,
                                           const std::vector<double>& sums, double total, double u) {
    return draw_blocked(sums, total, w.size(), u, [&](Eigen::Index k) { return static_cast<double>(w[k]); });
}

/// Throws the error that describes what is wrong with a logits row that failed a check:
/// NaN, +Inf, or every entry -Inf.
[[noreturn]] inline void diagnose_logits(const Eigen::Ref<const Eigen::VectorXf>& z, const char* where) {
    for (Eigen::Index i = 0; i < z.size(); ++i) {
        if (std::isnan(z[i])) fail_invalid(where, ": logit ", i, " is NaN");
        if (z[i] == std::numeric_limits<float>::infinity()) fail_invalid(where, ": logit ", i, " is +Inf");
    }
    fail_invalid(where, ": every logit is -Inf (no token is possible)");
}

/// Asks for the cache line holding p (a hint; never faults). The blockwise passes use it to
/// fetch the next block of a row while the exps of the current one run, so that a row coming
/// from memory rather than cache streams at the rate of the arithmetic.
inline void prefetch(const float* p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 0, 3);
#else
    (void)p;
#endif
}

/// With AVX2 and FMA but not AVX-512, the passes use exp2_avx2 (8 floats per packet) instead of
/// Eigen's exp.
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define SPECDEC_DETAIL_EXP2_AVX2 1
#endif

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

/// 2^f for 0 <= f < 1 by the polynomial exp2_poly (Horner's rule, one multiply-add per
/// coefficient), for a vector type given its multiply-add fma(a, b, c) = a·b + c and broadcast.
template <class V, class Fma, class Set1>
SPECDEC_ALWAYS_INLINE V exp2_polynomial(V f, Fma fma, Set1 set1) {
    V p = fma(set1(exp2_poly[0]), f, set1(exp2_poly[1]));
    p = fma(p, f, set1(exp2_poly[2]));
    p = fma(p, f, set1(exp2_poly[3]));
    p = fma(p, f, set1(exp2_poly[4]));
    return fma(p, f, set1(1.0f));
}

#if defined(__AVX512F__)

/// exp((x − m) inv_t) of 16 floats with x <= m (or −Inf): 2^t with t = x·s − h (see
/// exp2_reference) = n + f, n = floor(t), 0 <= f < 1: 2^f by a degree-5 polynomial fitted to it
/// on [0, 1] for the least maximum relative error (2^0 = 1 kept exact), times 2^n by vscalefps,
/// which takes the floor of t itself (exactly 0 once t < −149). Measured over every float t in
/// [−2, 0]: relative error at most 1.8e-7. NaN stays NaN and −Inf gives 0: with AVX512DQ, f comes
/// from vreduceps (rounding down), which is 0 for t = −Inf (so the polynomial sees no NaN);
/// without it t is clamped below at −200 (2^-200 underflows to 0) with the NaN-propagating
/// operand order of vmaxps, and f = t − floor(t). Eight vector instructions per 16 floats (with
/// AVX512DQ): the multiply-subtract, vreduceps, five multiply-adds and vscalefps.
struct exp2_avx512 {
    __m512 vm, scale, ref;
    bool fused;
    explicit exp2_avx512(float m, float inv_t) : exp2_avx512(exp2_reference(m, inv_t)) {}
    explicit exp2_avx512(const exp2_reference& r)
        : vm(_mm512_set1_ps(r.m)), scale(_mm512_set1_ps(r.s)), ref(_mm512_set1_ps(r.h)), fused(r.fused) {}
    __m512 operator()(__m512 x) const {
        __m512 t = fused ? _mm512_fmsub_ps(x, scale, ref) : _mm512_mul_ps(_mm512_sub_ps(x, vm), scale);
#if defined(__AVX512DQ__)
        const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512 n = t;  // vscalefps takes its floor
#else
        t = _mm512_max_ps(_mm512_set1_ps(-200.0f), t);
        const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512 f = _mm512_sub_ps(t, n);
#endif
        const __m512 p = exp2_polynomial(
            f, [](__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); },
            [](float c) { return _mm512_set1_ps(c); });
        return _mm512_scalef_ps(p, n);
    }
};
#endif

#if defined(SPECDEC_DETAIL_EXP2_AVX2)
/// exp((x − m) inv_t) of 8 floats with x <= m (or −Inf), with AVX2 and FMA: the exponent t of
/// exp2_avx512 (exp2_reference), clamped below at −127, = n + f with n = floor(t); 2^f by the
/// same polynomial, times 2^n made in a float's exponent field, where n = −127 makes the factor
/// +0: results below 2^−126 (a natural exponent below about −87.3) are exactly 0, never
/// subnormal, and −Inf gives 0. NaN stays NaN (vmaxps returns its second operand, t, when one is
/// NaN; its integer conversion then makes a factor of 1). The same floats as exp2_avx512 from
/// 2^−126 up. Thirteen instructions per 8 floats, about half of Eigen's exp.
struct exp2_avx2 {
    __m256 vm, scale, ref;
    bool fused;
    explicit exp2_avx2(float m, float inv_t) : exp2_avx2(exp2_reference(m, inv_t)) {}
    explicit exp2_avx2(const exp2_reference& r)
        : vm(_mm256_set1_ps(r.m)), scale(_mm256_set1_ps(r.s)), ref(_mm256_set1_ps(r.h)), fused(r.fused) {}
    __m256 operator()(__m256 x) const {
        __m256 t = fused ? _mm256_fmsub_ps(x, scale, ref) : _mm256_mul_ps(_mm256_sub_ps(x, vm), scale);
        t = _mm256_max_ps(_mm256_set1_ps(-127.0f), t);
        const __m256 n = _mm256_floor_ps(t);
        const __m256 f = _mm256_sub_ps(t, n);
        const __m256 p = exp2_polynomial(
            f, [](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); },
            [](float c) { return _mm256_set1_ps(c); });
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    }
};
#endif

#if !defined(__AVX512F__)
/// exp((x − m) inv_t) of one Eigen packet, given m/2 and 2·inv_t. The exponent is computed as
/// (x/2 − m/2)·(2 inv_t): halving and doubling are exact (for a subnormal logit, up to 1e-45),
/// so it is the same float as (x − m)·inv_t, except that x − m can overflow (logits of
/// opposite signs beyond ±1.7e38) where its half cannot, which matters at a temperature large
/// enough to bring it back.
/// Eigen's pexp clamps its argument, so exp(−Inf) would come out as a tiny positive number
/// rather than 0 and a token of probability 0 could be drawn; arguments below −87 (exp < 2e-38,
/// far below any probability that can matter) give exactly 0 instead, as in the AVX-512 path.
/// NaN stays NaN.
template <class Packet>
Packet exp_shifted(const Packet& x, const Packet& m_half, const Packet& inv_t_twice) {
    namespace ei = Eigen::internal;
    const Packet y = ei::pmul(ei::psub(ei::pmul(x, ei::pset1<Packet>(0.5f)), m_half), inv_t_twice);
    const Packet low = ei::pset1<Packet>(-87.0f);
    // pexp is given at least −87: at its own clamp (−88.7) it works with subnormal numbers,
    // which x86 cores handle slowly (a row that is mostly −Inf took 3–4× as long as a dense
    // one). Eigen's pmax returns its first argument when that is NaN (a test checks it).
    return ei::pselect(ei::pcmp_lt(y, low), ei::pzero(y), ei::pexp(ei::pmax(y, low)));
}

/// exp((x − m) inv_t) of Eigen packets as the passes without AVX-512 compute it: exp2_avx2 with
/// AVX2 and FMA, else exp_shifted; `one` gives the same float for a single x.
struct packet_exp {
    using packet = Eigen::internal::packet_traits<float>::type;
#if defined(SPECDEC_DETAIL_EXP2_AVX2)
    exp2_avx2 exp_of;
    packet_exp(float m, float inv_t) : exp_of(m, inv_t) {}
    packet operator()(const packet& x) const { return exp_of(x); }
    float one(float x) const { return _mm256_cvtss_f32(exp_of(_mm256_set1_ps(x))); }
#else
    float m_half, inv_t_twice;  // (validate() keeps 2 / temperature finite)
    packet pm, pt;
    packet_exp(float m, float inv_t)
        : m_half(m * 0.5f), inv_t_twice(inv_t * 2.0f), pm(Eigen::internal::pset1<packet>(m_half)),
          pt(Eigen::internal::pset1<packet>(inv_t_twice)) {}
    packet operator()(const packet& x) const { return exp_shifted(x, pm, pt); }
    float one(float x) const { return std::exp((x * 0.5f - m_half) * inv_t_twice); }
#endif
};
#endif

#if defined(__AVX512F__)
/// The sum of a vector's 16 lanes, added in double precision as a tree (a chain of 16
/// dependent adds would be the longest latency of a pass over a short row).
inline double lanes_in_double(__m512 v) {
    alignas(64) float t[16];  // (not _mm512_reduce_add_ps: GCC 12 warns falsely inside it)
    _mm512_store_ps(t, v);
    double d[8];
    for (int i = 0; i < 8; ++i) d[i] = static_cast<double>(t[i]) + static_cast<double>(t[i + 8]);
    return ((d[0] + d[4]) + (d[2] + d[6])) + ((d[1] + d[5]) + (d[3] + d[7]));
}

/// The sum of four accumulators' 64 lanes, added in double precision.
inline double total_in_double(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    return lanes_in_double(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/// The exps of the 64 floats at z, as four vectors.
SPECDEC_ALWAYS_INLINE void exp_64(const exp2_avx512& exp2_of, const float* z, __m512 (&e)[4]) {
    for (int i = 0; i < 4; ++i) e[i] = exp2_of(_mm512_loadu_ps(z + 16 * i));
}
/// Stores four vectors to out[0..64).
SPECDEC_ALWAYS_INLINE void store_64(float* out, const __m512 (&e)[4]) {
    for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + 16 * i, e[i]);
}
#endif

/// Σ exp((z_k − m) inv_t) over len floats with z_k <= m (or −Inf), the exponentials written to
/// out: one vectorized pass, four accumulators for instruction-level parallelism. A NaN among
/// the z_k makes the sum NaN; −Inf gives exactly 0. `next_len` > 0: the row goes on for that
/// many floats after z + len, which are prefetched.
inline double exp_pass(const float* z, float* out, Eigen::Index len, float m, float inv_t, Eigen::Index next_len = 0) {
    Eigen::Index k = 0;
    double sum = 0.0;
#if defined(__AVX512F__)
    {
        const exp2_avx512 exp2_of{m, inv_t};
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; k + 64 <= len; k += 64) {
            if (k < next_len)
                for (int line = 0; line < 64; line += 16) prefetch(z + len + k + line);
            __m512 e[4];
            exp_64(exp2_of, z + k, e);
            store_64(out + k, e);
            a0 = _mm512_add_ps(a0, e[0]);
            a1 = _mm512_add_ps(a1, e[1]);
            a2 = _mm512_add_ps(a2, e[2]);
            a3 = _mm512_add_ps(a3, e[3]);
        }
        for (; k < len; k += 16) {
            // Last partial vectors, masked (-Inf in the unused lanes gives 0).
            const Eigen::Index left = std::min<Eigen::Index>(16, len - k);
            const auto mask = static_cast<__mmask16>((1u << static_cast<unsigned>(left)) - 1u);
            const __m512 e = exp2_of(_mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), mask, z + k));
            _mm512_mask_storeu_ps(out + k, mask, e);
            a0 = _mm512_add_ps(a0, e);
        }
        sum = total_in_double(a0, a1, a2, a3);
    }
#else
    namespace ei = Eigen::internal;
    using packet = ei::packet_traits<float>::type;
    constexpr Eigen::Index width = ei::packet_traits<float>::size;
    const packet_exp exp_of{m, inv_t};
    packet a0 = ei::pset1<packet>(0.0f), a1 = a0;
    for (; k + 2 * width <= len; k += 2 * width) {
        if (k % 16 == 0 && k < next_len) prefetch(z + len + k);
        const packet e0 = exp_of(ei::ploadu<packet>(z + k));
        const packet e1 = exp_of(ei::ploadu<packet>(z + k + width));
        ei::pstoreu(out + k, e0);
        ei::pstoreu(out + k + width, e1);
        a0 = ei::padd(a0, e0);
        a1 = ei::padd(a1, e1);
    }
    sum = static_cast<double>(ei::predux(ei::padd(a0, a1)));
    for (; k < len; ++k) {
        const float e = exp_of.one(z[k]);
        out[k] = e;
        sum += static_cast<double>(e);
    }
#endif
    return sum;
}

/// Σ max(0, a·exp((z_k − m) inv_t) − b·q_k) over len floats (z_k <= m or −Inf): the mass of a
/// residual over one block in one vectorized pass, with nothing written (a NaN among the z_k
/// may be lost to the max, so only call it on rows whose pass already checked them). `next_len`
/// as in chunked_exp_pass.
inline double residual_sum(const float* z, const float* q, Eigen::Index len, float m, float inv_t, float a, float b,
                           Eigen::Index next_len = 0) {
    Eigen::Index k = 0;
    double sum = 0.0;
#if defined(__AVX512F__)
    {
        const exp2_avx512 exp2_of{m, inv_t};
        const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), zero = _mm512_setzero_ps();
        auto term_of = [&](__m512 x, __m512 y) {
            return _mm512_max_ps(zero, _mm512_fmsub_ps(exp2_of(x), va, _mm512_mul_ps(vb, y)));
        };
        auto term = [&](const float* x, const float* y) { return term_of(_mm512_loadu_ps(x), _mm512_loadu_ps(y)); };
        __m512 a0 = zero, a1 = zero, a2 = zero, a3 = zero;
        for (; k + 64 <= len; k += 64) {
            if (k < next_len)
                for (int line = 0; line < 64; line += 16) {
                    prefetch(z + len + k + line);
                    prefetch(q + len + k + line);
                }
            a0 = _mm512_add_ps(a0, term(z + k, q + k));
            a1 = _mm512_add_ps(a1, term(z + k + 16, q + k + 16));
            a2 = _mm512_add_ps(a2, term(z + k + 32, q + k + 32));
            a3 = _mm512_add_ps(a3, term(z + k + 48, q + k + 48));
        }
        for (; k < len; k += 16) {
            // Last partial vectors, masked (−Inf and 0 in the unused lanes give 0), so that every
            // term takes its exp from exp2_of, as the draw that scans the block recomputes it.
            const Eigen::Index left = std::min<Eigen::Index>(16, len - k);
            const auto mask = static_cast<__mmask16>((1u << static_cast<unsigned>(left)) - 1u);
            a0 = _mm512_add_ps(a0, term_of(_mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                                                                mask, z + k),
                                           _mm512_maskz_loadu_ps(mask, q + k)));
        }
        sum = total_in_double(a0, a1, a2, a3);
    }
#else
    namespace ei = Eigen::internal;
    using packet = ei::packet_traits<float>::type;
    constexpr Eigen::Index width = ei::packet_traits<float>::size;
    const packet_exp exp_of{m, inv_t};
    const packet pa = ei::pset1<packet>(a), pb = ei::pset1<packet>(b), zero = ei::pset1<packet>(0.0f);
    auto term = [&](const float* x, const float* y) {
        const packet scaled_q = ei::pmul(pb, ei::ploadu<packet>(y));
        return ei::pmax(zero, ei::psub(ei::pmul(exp_of(ei::ploadu<packet>(x)), pa), scaled_q));
    };
    packet a0 = zero, a1 = zero;
    for (; k + 2 * width <= len; k += 2 * width) {
        if (k % 16 == 0 && k < next_len) {
            prefetch(z + len + k);
            prefetch(q + len + k);
        }
        a0 = ei::padd(a0, term(z + k, q + k));
        a1 = ei::padd(a1, term(z + k + width, q + k + width));
    }
    sum = static_cast<double>(ei::predux(ei::padd(a0, a1)));
    for (; k < len; ++k) sum += static_cast<double>(std::max(0.0f, a * exp_of.one(z[k]) - b * q[k]));
#endif
    return sum;
}

/// Elements per chunk of chunked_exp_pass.
inline constexpr Eigen::Index exp_chunk = 256;

/// Chunks of exp_chunk elements (the last one possibly partial) in len elements.
inline Eigen::Index chunks_of(Eigen::Index len) { return (len + exp_chunk - 1) / exp_chunk; }
/// Floats stored per chunk by chunked_exp_pass (the chunk's SIMD lane sums, unreduced).
inline constexpr Eigen::Index chunk_lanes = 16;

/// exp((x − m) inv_t) of one float, computed as the vectorized passes compute it (the float a
/// block's sum added for this element).
inline float pass_exp(float x, float m, float inv_t) {
#if defined(__AVX512F__)
    return _mm512_cvtss_f32(exp2_avx512{m, inv_t}(_mm512_set1_ps(x)));
#else
    namespace ei = Eigen::internal;
    using packet = ei::packet_traits<float>::type;
    return ei::pfirst(packet_exp{m, inv_t}(ei::pset1<packet>(x)));
#endif
}

/// exp((x − m) inv_t) of 16 floats with the exp of chunked_exp_pass (so a lane's elements come
/// out as the floats its lane sum was made of).
inline void exp_lane(const float* in, float* out, float m, float inv_t) {
#if defined(__AVX512F__)
    _mm512_storeu_ps(out, exp2_avx512{m, inv_t}(_mm512_loadu_ps(in)));
#else
    namespace ei = Eigen::internal;
    using packet = ei::packet_traits<float>::type;
    constexpr Eigen::Index width = ei::packet_traits<float>::size;
    static_assert(chunk_lanes % width == 0);
    const packet_exp exp_of{m, inv_t};
    for (Eigen::Index g = 0; g < chunk_lanes; g += width) ei::pstoreu(out + g, exp_of(ei::ploadu<packet>(in + g)));
#endif
}

/// Lane sums of one chunk of count <= exp_chunk floats at x: out[l] = x[l] + x[l + 16] + ...
/// (the layout of chunked_exp_pass's lane sums).
inline void chunk_lane_sums(const float* x, Eigen::Index count, float* out) {
    Eigen::Map<Eigen::Matrix<float, chunk_lanes, 1>> lanes(out);
    if (count == exp_chunk) {
        // Column k of this 16 x 16 view holds offsets 16k..16k+15: row l sums lane l.
        lanes = Eigen::Map<const Eigen::Matrix<float, chunk_lanes, exp_chunk / chunk_lanes>>(x).rowwise().sum();
        return;
    }
    lanes.setZero();
    for (Eigen::Index k = 0; k < count; ++k) lanes[k % chunk_lanes] += x[k];
}

/// Result of chunked_exp_pass.
struct chunked_exp_sums {
    double exp_sum = 0.0;
    bool q_sign = false;  // some entry of q may be negative (see chunked_exp_pass)
    double q_sum = 0.0;  // sum of q (NaN or +Inf anywhere make it fail a check)
};

/// Σ exp((z_k − m) inv_t) over len floats (z_k <= m or −Inf) without writing the exponentials,
/// and for each chunk of exp_chunk elements its 16 lane sums, stored unreduced in
/// lanes[c·chunk_lanes ..]: lane l of a chunk sums the elements at offsets l, l + 16, ...,
/// l + 240 (the chunk's sum is the sum of those floats), so that a later draw can find its
/// chunk, then its lane, and recompute 16 exponentials only. When q is not null, a draft
/// column block q[0..len) is checked in the same loop (its loads overlap the exps): its sum,
/// and whether an entry may be negative (q_sign; the loop ORs the bits of the entries (with
/// AVX-512 two vectors per instruction) and tests the sign bit, so −0.0 or a NaN with its sign
/// bit set raise it too: the caller's exact check then decides), and its lane sums, laid out as those
/// of the exponentials, go to q_lanes (required with q). `next_len` > 0 says that the row goes
/// on for that many floats after z + len (and after q + len): they are prefetched, so the next
/// block's max pass finds them in cache.
/// With keep_exps, `out` receives the len exponentials as well.
template <bool keep_exps = false>
chunked_exp_sums chunked_exp_pass(const float* z, Eigen::Index len, float m, float inv_t, float* lanes,
                                  const float* q = nullptr, float* q_lanes = nullptr, Eigen::Index next_len = 0,
                                  float* out = nullptr) {
    chunked_exp_sums r;
    bool q_sign = false;
    double q_sum = 0.0;
#if defined(__AVX512F__)
    const exp2_avx512 exp2_of{m, inv_t};
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 total = _mm512_setzero_ps(), q_total = total;
    __m512i bits0 = _mm512_setzero_si512(), bits1 = bits0;  // OR of q's entries, as integers
    for (Eigen::Index start = 0, c = 0; start < len; start += exp_chunk, ++c) {
        const Eigen::Index end = std::min(len, start + exp_chunk);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, s0 = a0, s1 = a0;
        Eigen::Index k = start;
        for (; k + 64 <= end; k += 64) {
            if (k < next_len)
                for (int line = 0; line < 64; line += 16) {
                    prefetch(z + len + k + line);
                    if (q != nullptr) prefetch(q + len + k + line);
                }
            __m512 e[4];
            exp_64(exp2_of, z + k, e);
            if constexpr (keep_exps) store_64(out + k, e);
            a0 = _mm512_add_ps(a0, e[0]);
            a1 = _mm512_add_ps(a1, e[1]);
            a2 = _mm512_add_ps(a2, e[2]);
            a3 = _mm512_add_ps(a3, e[3]);
            if (q != nullptr) {
                const __m512 v0 = _mm512_loadu_ps(q + k), v1 = _mm512_loadu_ps(q + k + 16);
                const __m512 v2 = _mm512_loadu_ps(q + k + 32), v3 = _mm512_loadu_ps(q + k + 48);
                s0 = _mm512_add_ps(s0, _mm512_add_ps(v0, v1));
                s1 = _mm512_add_ps(s1, _mm512_add_ps(v2, v3));
                // 0xFE: the truth table of a | b | c.
                bits0 = _mm512_ternarylogic_epi32(bits0, _mm512_castps_si512(v0), _mm512_castps_si512(v1), 0xFE);
                bits1 = _mm512_ternarylogic_epi32(bits1, _mm512_castps_si512(v2), _mm512_castps_si512(v3), 0xFE);
            }
        }
        for (; k < end; k += 16) {
            const Eigen::Index left = std::min<Eigen::Index>(16, end - k);
            const auto mask = static_cast<__mmask16>((1u << static_cast<unsigned>(left)) - 1u);
            const __m512 e = exp2_of(_mm512_mask_loadu_ps(neg_inf, mask, z + k));
            if constexpr (keep_exps) _mm512_mask_storeu_ps(out + k, mask, e);
            a0 = _mm512_add_ps(a0, e);
            if (q != nullptr) {
                const __m512 v = _mm512_maskz_loadu_ps(mask, q + k);
                s0 = _mm512_add_ps(s0, v);
                bits0 = _mm512_or_si512(bits0, _mm512_castps_si512(v));  // (0 in the lanes left out)
            }
        }
        const __m512 chunk = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        _mm512_storeu_ps(lanes + c * chunk_lanes, chunk);
        total = _mm512_add_ps(total, chunk);
        if (q != nullptr) {
            const __m512 q_chunk = _mm512_add_ps(s0, s1);
            _mm512_storeu_ps(q_lanes + c * chunk_lanes, q_chunk);
            q_total = _mm512_add_ps(q_total, q_chunk);
        }
    }
    r.exp_sum = lanes_in_double(total);
    if (q != nullptr) {
        q_sum = lanes_in_double(q_total);  // (a NaN shows in the sum)
        q_sign = _mm512_test_epi32_mask(_mm512_or_si512(bits0, bits1), _mm512_set1_epi32(INT32_MIN)) != 0;
    }
#else
    namespace ei = Eigen::internal;
    using packet = ei::packet_traits<float>::type;
    constexpr Eigen::Index width = ei::packet_traits<float>::size;
    static_assert(chunk_lanes % width == 0);
    constexpr Eigen::Index per_group = chunk_lanes / width;  // packets per 16 consecutive floats
    const packet_exp exp_packet{m, inv_t};
    auto exp_of = [&](const float* x) { return exp_packet(ei::ploadu<packet>(x)); };
    packet q_bits = ei::pset1<packet>(0.0f);  // OR of q's entries, bit by bit (as the AVX-512 path)
    for (Eigen::Index start = 0, c = 0; start < len; start += exp_chunk, ++c) {
        const Eigen::Index end = std::min(len, start + exp_chunk);
        // Lane l of the chunk sums the elements at offsets l, l + 16, ... (as the AVX-512 path),
        // for the exponentials (a) and for q (b, its loads overlapping the exps).
        packet a[2][per_group], b[2][per_group];
        for (auto& row : a)
            for (packet& x : row) x = ei::pset1<packet>(0.0f);
        for (auto& row : b)
            for (packet& x : row) x = ei::pset1<packet>(0.0f);
        Eigen::Index k = start;
        for (; k + 2 * chunk_lanes <= end; k += 2 * chunk_lanes) {
            if (k < next_len)
                for (int line = 0; line < 2 * chunk_lanes; line += 16) {
                    prefetch(z + len + k + line);
                    if (q != nullptr) prefetch(q + len + k + line);
                }
            for (Eigen::Index g = 0; g < per_group; ++g) {
                const packet e0 = exp_of(z + k + g * width), e1 = exp_of(z + k + chunk_lanes + g * width);
                if constexpr (keep_exps) {
                    ei::pstoreu(out + k + g * width, e0);
                    ei::pstoreu(out + k + chunk_lanes + g * width, e1);
                }
                a[0][g] = ei::padd(a[0][g], e0);
                a[1][g] = ei::padd(a[1][g], e1);
                if (q != nullptr) {
                    const packet v0 = ei::ploadu<packet>(q + k + g * width);
                    const packet v1 = ei::ploadu<packet>(q + k + chunk_lanes + g * width);
                    b[0][g] = ei::padd(b[0][g], v0);
                    b[1][g] = ei::padd(b[1][g], v1);
                    q_bits = ei::por(q_bits, ei::por(v0, v1));
                }
            }
        }
        const Eigen::Index q_tail = k;  // q's elements from here on are added after the loop
        for (; k < end; k += chunk_lanes) {
            // The last (partial) groups of 16, padded with -Inf (whose exp is 0).
            alignas(64) float group[chunk_lanes];
            std::fill(group, group + chunk_lanes, -std::numeric_limits<float>::infinity());
            const Eigen::Index count = std::min(end, k + chunk_lanes) - k;
            std::copy(z + k, z + k + count, group);
            alignas(64) float e[chunk_lanes];
            for (Eigen::Index g = 0; g < per_group; ++g) {
                const packet eg = exp_of(group + g * width);
                ei::pstore(e + g * width, eg);
                a[0][g] = ei::padd(a[0][g], eg);
            }
            if constexpr (keep_exps) std::copy(e, e + count, out + k);
        }
        float* l = lanes + c * chunk_lanes;
        for (Eigen::Index g = 0; g < per_group; ++g) {
            ei::pstoreu(l + g * width, ei::padd(a[0][g], a[1][g]));
            for (Eigen::Index i = 0; i < width; ++i) r.exp_sum += static_cast<double>(l[g * width + i]);
        }
        if (q != nullptr) {
            // The draft column's lane sums, with the elements the vector loop left (q_tail on).
            float* ql = q_lanes + c * chunk_lanes;
            for (Eigen::Index g = 0; g < per_group; ++g) ei::pstoreu(ql + g * width, ei::padd(b[0][g], b[1][g]));
            for (Eigen::Index i = q_tail; i < end; ++i) {
                ql[(i - start) % chunk_lanes] += q[i];
                q_sign = q_sign || !(q[i] >= 0.0f);
            }
            for (Eigen::Index i = 0; i < chunk_lanes; ++i) q_sum += static_cast<double>(ql[i]);
        }
    }
    if (q != nullptr) {
        // A set sign bit in the OR: some entry may be negative (or −0.0, or a NaN with its sign
        // bit set; the caller's exact check decides).
        alignas(64) float bits[width];
        ei::pstore(bits, q_bits);
        for (const float v : bits) q_sign = q_sign || std::signbit(v);
    }
#endif
    if (q != nullptr) {
        r.q_sign = q_sign;
        r.q_sum = q_sum;
    }
    return r;
}

/// Maximum of a block: one vectorized pass with four independent accumulators (a single one
/// would wait on the latency of each max). A NaN in the block may or may not show in it, so
/// callers detect NaN through a sum over the block, which a NaN always turns into NaN.
inline float block_max(const Eigen::Ref<const Eigen::VectorXf>& z, Eigen::Index start, Eigen::Index len) {
    namespace ei = Eigen::internal;
    using packet = ei::packet_traits<float>::type;
    constexpr Eigen::Index width = ei::packet_traits<float>::size;
    const float* x = z.data() + start;
    packet m0 = ei::pset1<packet>(-std::numeric_limits<float>::infinity()), m1 = m0, m2 = m0, m3 = m0;
    Eigen::Index k = 0;
    for (; k + 4 * width <= len; k += 4 * width) {
        m0 = ei::pmax(m0, ei::ploadu<packet>(x + k));
        m1 = ei::pmax(m1, ei::ploadu<packet>(x + k + width));
        m2 = ei::pmax(m2, ei::ploadu<packet>(x + k + 2 * width));
        m3 = ei::pmax(m3, ei::ploadu<packet>(x + k + 3 * width));
    }
    float m = ei::predux_max(ei::pmax(ei::pmax(m0, m1), ei::pmax(m2, m3)));
    for (; k < len; ++k) m = std::max(m, x[k]);
    return m;
}

/// Elements per block of the temperature-0 pass: with no exp to hide it behind, the
/// per-block reduction must be rare (at 512 it costs about 1.5x of the max pass itself).
inline constexpr Eigen::Index argmax_block = 2048;

/// Keeps a loaded packet in a register. Left to itself GCC folds the load into each use of
/// the packet (here a max and an add), which doubles the loads of a pass that is bound by them.
template <class Packet>
SPECDEC_ALWAYS_INLINE void keep_in_register(Packet& x) {
#if defined(EIGEN_VECTORIZE) && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+v"(x));
#elif defined(EIGEN_VECTORIZE) && (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
    __asm__("" : "+w"(x));
#else
    (void)x;
#endif
}

/// Packets a max_and_sum pass keeps apart: accumulator a (0 <= a < 4) holds the maximum of the
/// packets at offsets a, a + 4, a + 8, ... (in packets), so lane l of it covers the elements
/// whose index is congruent to a·width + l modulo max_and_sum_group.
inline constexpr Eigen::Index max_and_sum_group = 4 * Eigen::internal::packet_traits<float>::size;

/// Result of max_and_sum.
struct max_and_sum_result {
    float max;
    float sum;
};
/// Maximum and sum of len floats in one vectorized pass (four max and two sum accumulators,
/// each element loaded once). The sum is there to detect NaN, which always makes it NaN; it
/// may also be NaN without one (+Inf next to -Inf, or sums that overflow both ways), so see
/// block_has_nan(). `acc` receives the four max accumulators (max_and_sum_group floats, see
/// there), which cover the first len − len % max_and_sum_group elements.
inline max_and_sum_result max_and_sum(const float* z, Eigen::Index len, float* acc) {
    namespace ei = Eigen::internal;
    using packet = ei::packet_traits<float>::type;
    constexpr Eigen::Index width = ei::packet_traits<float>::size;
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    packet m0 = ei::pset1<packet>(neg_inf), m1 = m0, m2 = m0, m3 = m0;
    packet s0 = ei::pset1<packet>(0.0f), s1 = s0;
    Eigen::Index k = 0;
    for (; k + max_and_sum_group <= len; k += max_and_sum_group) {
        packet x0 = ei::ploadu<packet>(z + k), x1 = ei::ploadu<packet>(z + k + width);
        packet x2 = ei::ploadu<packet>(z + k + 2 * width), x3 = ei::ploadu<packet>(z + k + 3 * width);
        keep_in_register(x0);
        keep_in_register(x1);
        keep_in_register(x2);
        keep_in_register(x3);
        m0 = ei::pmax(m0, x0);
        m1 = ei::pmax(m1, x1);
        m2 = ei::pmax(m2, x2);
        m3 = ei::pmax(m3, x3);
        s0 = ei::padd(s0, ei::padd(x0, x1));
        s1 = ei::padd(s1, ei::padd(x2, x3));
    }
    ei::pstoreu(acc, m0);
    ei::pstoreu(acc + width, m1);
    ei::pstoreu(acc + 2 * width, m2);
    ei::pstoreu(acc + 3 * width, m3);
    float m = ei::predux_max(ei::pmax(ei::pmax(m0, m1), ei::pmax(m2, m3)));
    float sum = ei::predux(ei::padd(s0, s1));
    for (; k < len; ++k) {
        m = std::max(m, z[k]);
        sum += z[k];
    }
    return {m, sum};
}

/// True when one of len floats is NaN (scalar; only run after a fast check has failed).
inline bool block_has_nan(const float* z, Eigen::Index len) {
    for (Eigen::Index k = 0; k < len; ++k)
        if (std::isnan(z[k])) return true;
    return false;
}

/// The comparison compare_group makes.
enum class group_compare { equal, greater };

/// Bit l set when x[l] == m (equal) or x[l] > m (greater; NaN compares false either way), over
/// max_and_sum_group floats (at most 64): four vector compares where the packets are x86 ones,
/// else one scalar compare per float.
template <group_compare C>
std::uint64_t compare_group(const float* x, float m) {
    constexpr int width = static_cast<int>(max_and_sum_group / 4);
    static_assert(max_and_sum_group <= 64);
    // The four packets' compare masks (bits_of: the mask of one packet), side by side.
    [[maybe_unused]] auto packets = [&](auto bits_of) {
        std::uint64_t mask = 0;
        for (int a = 0; a < 4; ++a)
            mask |= static_cast<std::uint64_t>(static_cast<unsigned>(bits_of(x + width * a))) << (width * a);
        return mask;
    };
#if defined(__AVX__)
    [[maybe_unused]] constexpr int predicate = C == group_compare::equal ? _CMP_EQ_OQ : _CMP_GT_OQ;
#endif
#if defined(__AVX512F__)
    if constexpr (width == 16)
        return packets([pm = _mm512_set1_ps(m)](const float* p) {
            return _mm512_cmp_ps_mask(_mm512_loadu_ps(p), pm, predicate);
        });
#endif
#if defined(__AVX__)
    if constexpr (width == 8)
        return packets([pm = _mm256_set1_ps(m)](const float* p) {
            return _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), pm, predicate));
        });
#endif
#if defined(__SSE2__)
    if constexpr (width == 4)
        return packets([pm = _mm_set1_ps(m)](const float* p) {
            const __m128 v = _mm_loadu_ps(p);
            return _mm_movemask_ps(C == group_compare::equal ? _mm_cmpeq_ps(v, pm) : _mm_cmpgt_ps(v, pm));
        });
#endif
    std::uint64_t mask = 0;
    for (Eigen::Index l = 0; l < max_and_sum_group; ++l)
        mask |= static_cast<std::uint64_t>(C == group_compare::equal ? x[l] == m : x[l] > m) << l;
    return mask;
}

/// The largest logit and its lowest index.
struct row_argmax {
    float value;
    Eigen::Index index;
};

/// Largest logit (lowest index on ties) with the checks every logits row gets, in one
/// vectorized pass over the row (maximum and NaN check fused, per 2048-float block), then a
/// search for the index inside the first block that attains the maximum: only the
/// accumulator lanes of max_and_sum that hold the maximum can hold it, and each is searched
/// with stride max_and_sum_group (len / 64 reads under AVX-512), then the scalar tail.
/// \throws std::invalid_argument on an empty row, NaN, +Inf, or a row that is all -Inf.
inline row_argmax checked_argmax(const Eigen::Ref<const Eigen::VectorXf>& z, const char* where) {
    constexpr Eigen::Index group = max_and_sum_group;
    const Eigen::Index n = z.size();
    if (n == 0) fail_invalid(where, ": logits row is empty");
    float m = -std::numeric_limits<float>::infinity();
    Eigen::Index best_block = -1;
    // The accumulators of the block being read and of the best block so far (swapped, not copied).
    alignas(64) float acc[2][group];
    int current = 0;
    const float* best_acc = acc[1];
    const float* data = z.data();
    for (Eigen::Index start = 0; start < n; start += argmax_block) {
        const Eigen::Index len = std::min(argmax_block, n - start);
        const max_and_sum_result b = max_and_sum(data + start, len, acc[current]);
        if ((std::isnan(b.max) || std::isnan(b.sum)) && block_has_nan(data + start, len)) diagnose_logits(z, where);
        if (b.max > m) {
            m = b.max;
            best_block = start;
            best_acc = acc[current];
            current ^= 1;
        }
    }
    if (best_block < 0 || m == std::numeric_limits<float>::infinity()) diagnose_logits(z, where);
    const float* x = data + best_block;
    const Eigen::Index len = std::min(argmax_block, n - best_block);
    const Eigen::Index vec_end = len - len % group;
    // The lanes holding the maximum, as a bit mask (no branch on where they are: such branches
    // mispredict on nearly every row, at a cost comparable to the pass over a short row).
    std::uint64_t lanes = compare_group<group_compare::equal>(best_acc, m);
    Eigen::Index best = vec_end;  // no hit in the part the accumulators cover (yet)
    while (lanes != 0) {  // usually one lane
        const auto l = static_cast<Eigen::Index>(std::countr_zero(lanes));
        lanes &= lanes - 1;
        for (Eigen::Index k = l; k < best; k += group)
            if (x[k] == m) {
                best = k;
                break;
            }
    }
    if (best == vec_end)
        while (best < len && x[best] != m) ++best;
    return {m, best_block + best};
}

/// fn(x[k]) for each k < n with x[k] > low(), in order, reading low() once per
/// max_and_sum_group floats (one vector compare each, see compare_group; then once per float of
/// the tail): the cost is a pass over x plus fn's calls. low() may grow as fn runs, as a
/// heap's minimum does; fn then sees floats above an older, lower value too.
template <class Low, class Fn>
void for_each_above(const float* x, Eigen::Index n, Low&& low, Fn&& fn) {
    constexpr Eigen::Index group = max_and_sum_group;
    Eigen::Index k = 0;
    for (; k + group <= n; k += group)
        for (std::uint64_t bits = compare_group<group_compare::greater>(x + k, low()); bits != 0; bits &= bits - 1)
            fn(x[k + std::countr_zero(bits)]);
    for (; k < n; ++k)
        if (x[k] > low()) fn(x[k]);
}

/// k-th largest value of z (k >= 1, k < z.size()): a min-heap of the k largest values seen.
/// The row is read max_and_sum_group floats at a time by vector compares against the heap's
/// minimum, and only the floats above it are offered to the heap (on typical rows a small
/// fraction), so the cost is about one pass over the row plus the heap's work for the values
/// that enter it. `heap` is scratch.
inline float top_k_threshold(const Eigen::Ref<const Eigen::VectorXf>& z, Eigen::Index k, std::vector<float>& heap) {
    const float* x = z.data();
    heap.assign(x, x + k);
    std::make_heap(heap.begin(), heap.end(), std::greater<float>());
    // The same heap as offering every float in turn: a float the compare passes over is not
    // above the minimum, which only grows, and the offer itself checks against the current one.
    for_each_above(x + k, z.size() - k, [&] { return heap.front(); }, [&](float v) {
        if (v > heap.front()) {
            std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
            heap.back() = v;
            std::push_heap(heap.begin(), heap.end(), std::greater<float>());
        }
    });
    return heap.front();
}

/// Bucket of a positive float by its exponent and top 3 mantissa bits: monotone in the value,
/// 8 buckets per octave.
inline std::uint32_t magnitude_bucket(float v) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits >> 20;  // sign (0) | exponent | 3 mantissa bits
}

/// Smallest threshold t among the positive weights w, which sum to `total`, such that the
/// weights >= t sum to at least `need` (top-p, ties kept). A weight below
/// floor = (total − need) / n is never the threshold: those at or above the floor sum to at
/// least total − n·floor = need. So one vectorized pass picks the weights above (just under) the
/// floor — on typical rows a small fraction — and sums their mass per magnitude bucket (8 per
/// octave); the bucket where the running mass from the top crosses `need` is found, and only
/// that bucket's values are sorted. Should rounding leave those buckets short of `need`, the
/// search is repeated over every positive weight. `values` and `bucket_mass` are scratch;
/// `values` is given room for every weight of the row on first use, since how many share the
/// crossing bucket depends on the row (all of them on a flat one), so that a workspace warmed up
/// on any row of this size allocates nothing later.
inline float top_p_threshold(const Eigen::Ref<const Eigen::VectorXf>& w, double total, double need,
                             std::vector<float>& values, std::vector<double>& bucket_mass) {
    constexpr std::size_t buckets = std::size_t{1} << 11;  // 8 exponent bits + 3 mantissa bits
    const Eigen::Index n = w.size();
    if (values.capacity() < static_cast<std::size_t>(n)) values.reserve(static_cast<std::size_t>(n));
    const float* x = w.data();
    // The floor, lowered by a relative 1e-6 so that rounding cannot lift it above a weight it
    // should keep.
    const auto cutoff = static_cast<float>(std::max(0.0, (total - need) / static_cast<double>(n) * (1.0 - 1e-6)));
    for (float low = cutoff;; low = 0.0f) {
        bucket_mass.assign(buckets, 0.0);
        for_each_above(x, n, [low] { return low; }, [&](float v) { bucket_mass[magnitude_bucket(v)] += v; });
        double above = 0.0;
        std::size_t b = buckets;
        while (b > 0 && above + bucket_mass[b - 1] < need) above += bucket_mass[--b];
        if (b == 0) {
            if (low > 0.0f) continue;  // rounding: search every positive weight
            return 0.0f;               // rounding: keep everything
        }
        const auto crossing = static_cast<std::uint32_t>(b - 1);
        // The bucket's values are at least its smallest float (its bits: crossing, then zeros).
        const std::uint32_t smallest_bits = crossing << 20;
        float smallest;
        std::memcpy(&smallest, &smallest_bits, sizeof smallest);
        values.clear();
        const float from = std::max(low, std::nextafter(smallest, 0.0f));
        for_each_above(x, n, [from] { return from; }, [&](float v) {
            if (magnitude_bucket(v) == crossing) values.push_back(v);
        });
        std::sort(values.begin(), values.end(), std::greater<float>());
        for (const float v : values) {
            above += v;
            if (above >= need) return v;
        }
        return values.empty() ? 0.0f : values.back();
    }
}

/// The blockwise normalizing pass of a logits row, shared by verify's prepare_row and
/// standardize_and_sample: per row_block block a vectorized max (NaN and +Inf are diagnosed),
/// the running maximum m recorded as the block's reference ref[b] (never above the block's own
/// maximum, so nothing overflows; m grows O(log blocks) times on typical rows), then
/// mass[b] = exp_block(b, start, len, m), the block's Σ exp((z − m) / T), or, for a block that
/// is all −Inf, mass[b] = 0 and empty_block(start, len). Returns m.
/// \throws std::invalid_argument on NaN, +Inf, or a row that is all −Inf.
template <class ExpBlock, class EmptyBlock>
SPECDEC_ALWAYS_INLINE float blockwise_exp_pass(const Eigen::Ref<const Eigen::VectorXf>& z, float* ref, double* mass,
                                               const char* where, ExpBlock&& exp_block, EmptyBlock&& empty_block) {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    const Eigen::Index n = z.size();
    float m = neg_inf;
    for (Eigen::Index b = 0, start = 0; start < n; ++b, start += row_block) {
        const Eigen::Index len = block_len(n, b);
        const float bm = block_max(z, start, len);
        if (std::isnan(bm) || bm == std::numeric_limits<float>::infinity()) diagnose_logits(z, where);
        m = std::max(m, bm);
        ref[b] = m;
        if (bm == neg_inf) {
            empty_block(start, len);
            mass[b] = 0.0;
            continue;
        }
        mass[b] = exp_block(b, start, len, m);
        if (std::isnan(mass[b])) diagnose_logits(z, where);  // a NaN logit in the block
    }
    if (m == neg_inf) diagnose_logits(z, where);
    return m;
}

/// exp((ref − m) / T), the factor that turns exponentials taken relative to ref into ones
/// relative to m, as the vectorized exp defines its references (with AVX-512, from the base-2
/// references of exp2_reference, so that it matches the exponentials exactly).
inline double block_factor(float ref, float m, float inv_t) {
#if defined(__AVX512F__) || defined(SPECDEC_DETAIL_EXP2_AVX2)
    return std::exp2(exp2_reference(ref, inv_t).log2() - exp2_reference(m, inv_t).log2());
#else
    return std::exp((static_cast<double>(ref) - m) * inv_t);  // (in float, ref − m could overflow)
#endif
}

/// The last index of a weight above 0 among the row_block blocks 0..last_block of the n weights
/// at w, or −1: where an inverse-CDF draw lands when rounding carried its running sum past
/// every block.
inline Eigen::Index last_weighted(const float* w, Eigen::Index n, Eigen::Index last_block) {
    for (Eigen::Index b = last_block; b >= 0; --b) {
        const Eigen::Index start = b * row_block;
        for (Eigen::Index k = block_len(n, b) - 1; k >= 0; --k)
            if (w[start + k] > 0.0f) return start + k;
    }
    return -1;
}

/// After blockwise_exp_pass: fn(b, block_factor(ref[b], m, 1 / T)) for each block with mass, in
/// order, with one factor per distinct reference (p = exp((z − ref_b) / T) · that factor / S).
template <class Fn>
SPECDEC_ALWAYS_INLINE void for_each_block_factor(const float* ref, const double* mass, Eigen::Index blocks, float m,
                                                 float inv_t, Fn&& fn) {
    float current = -std::numeric_limits<float>::infinity();
    double factor = 0.0;
    for (Eigen::Index b = 0; b < blocks; ++b) {
        if (mass[b] == 0.0) continue;
        if (ref[b] != current) {
            current = ref[b];
            // A factor of 1 exactly: the common case (a single block, or the block holding the
            // maximum and those after it) needs no call to exp2.
            factor = current == m ? 1.0 : block_factor(current, m, inv_t);
        }
        fn(b, factor);
    }
}

}  // namespace detail

/// Turns one row of logits into the standardized distribution it is sampled from.
///
/// \param logits  raw logits, one per token (any contiguous float vector or column)
/// \param s       sampling settings (checked as validate() does)
/// \param out     receives the probabilities (sums to 1); must already have logits.size()
///                entries: a view is written in place, not resized
/// \param ws      scratch for top-k / top-p
/// \param where   function name used in error messages
/// \throws std::invalid_argument for invalid settings, an `out` of another size, or logits
///         that contain NaN or +Inf, or are all -Inf.
inline void standardize(const Eigen::Ref<const Eigen::VectorXf>& logits, const sampling_config& s,
                        Eigen::Ref<Eigen::VectorXf> out, sampling_workspace& ws,
                        const char* where = "specdec::standardize") {
    const Eigen::Index n = logits.size();
    detail::check_sampling_call(n, out.size(), s, where);
    const detail::row_argmax best = detail::checked_argmax(logits, where);
    if (s.temperature == 0.0f) {
        // Argmax as a distribution: zero all but the max and normalize (Sec. 2.2).
        out.setZero();
        out[best.index] = 1.0f;
        return;
    }
    const float m = best.value;
    const float inv_t = 1.0f / s.temperature;
    // exp(-inf) == 0: impossible stays impossible.
    const double total = detail::exp_pass(logits.data(), out.data(), n, m, inv_t);
    if (!detail::truncates(s)) {
        out *= static_cast<float>(1.0 / total);
        return;
    }

    if (s.top_k > 0 && s.top_k < n) {
        const float threshold = detail::top_k_threshold(logits, s.top_k, ws.values);
        out = (logits.array() >= threshold).select(out, 0.0f);
    }
    if (s.top_p < 1.0f) {
        const double kept = detail::sum_in_double(out);
        const float threshold =
            detail::top_p_threshold(out, kept, static_cast<double>(s.top_p) * kept, ws.values, ws.buckets);
        out = (out.array() >= threshold).select(out, 0.0f);
    }
    if (s.min_p > 0.0f) {
        // p >= min_p * p_max, in weights: the largest logit's weight (about exp(0) = 1) times min_p.
        const float threshold = s.min_p * out[best.index];
        out = (out.array() >= threshold).select(out, 0.0f);
    }
    out /= out.sum();
}

/// Draws an index from non-negative weights by inversion with one uniform u in [0, 1): the
/// first index whose running sum exceeds u * Σw. Never returns an index of weight 0. The
/// weights need not be normalized. Blocked: one vectorized pass for block sums, then a scan
/// of one block.
/// \pre the weights are non-negative (not checked: it would take another pass).
/// \throws std::invalid_argument when the weights sum to zero or to a value that is not
///         finite (all zero, an empty vector, NaN or Inf among them).
[[nodiscard]] inline Eigen::Index sample_from_weights(const Eigen::Ref<const Eigen::VectorXf>& w, double u,
                                                      sampling_workspace& ws,
                                                      const char* where = "specdec::sample_from_weights") {
    const double total = detail::compute_block_sums(w, ws.block_sums);
    if (!(total > 0.0) || !std::isfinite(total))
        detail::fail_invalid(where, ": the weights sum to ", total, " over ", w.size(),
                             " entries; they must be finite, non-negative and not all zero");
    return detail::sample_with_block_sums(w, ws.block_sums, total, u);
}

/// standardize() and sample_from_weights() in one: writes the standardized distribution to
/// `out` and returns a draw from it with the uniform u (the first index whose running
/// probability exceeds u). Without truncation (the common case for a drafter) the row is read
/// once, blockwise: per 2048-float block a vectorized max, then the exps, written to `out`
/// relative to the running maximum, with the block's sum; one scaling pass then normalizes
/// `out`, and the draw picks a block by its mass and scans that block only (groups of 16
/// skipped by their sums). The same distribution as the two calls, up to float rounding, with
/// two passes fewer over the row; the draw may differ from theirs only where rounding moves a
/// block boundary. Truncating settings and temperature 0 take the two calls' path.
/// \throws std::invalid_argument as standardize().
[[nodiscard]] inline Eigen::Index standardize_and_sample(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                                         const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
                                                         double u, sampling_workspace& ws,
                                                         const char* where = "specdec::standardize_and_sample") {
    const Eigen::Index n = logits.size();
    detail::check_sampling_call(n, out.size(), s, where);
    if (s.temperature == 0.0f || detail::truncates(s)) {
        standardize(logits, s, out, ws, where);
        return sample_from_weights(out, u, ws);
    }
    if (n == 0) detail::fail_invalid(where, ": logits row is empty");
    using detail::row_block;
    const Eigen::Index nb = detail::blocks_of(n);
    ws.block_sums.resize(static_cast<std::size_t>(nb));
    ws.block_refs.resize(static_cast<std::size_t>(nb));
    double* mass = ws.block_sums.data();
    float* ref = ws.block_refs.data();
    const float inv_t = 1.0f / s.temperature;
    const float m = detail::blockwise_exp_pass(
        logits, ref, mass, where,
        [&](Eigen::Index b, Eigen::Index start, Eigen::Index len, float ref_m) {
            return detail::exp_pass(logits.data() + start, out.data() + start, len, ref_m, inv_t,
                                    detail::block_len(n, b + 1));
        },
        [&](Eigen::Index start, Eigen::Index len) { out.segment(start, len).setZero(); });
    double total = 0.0;
    detail::for_each_block_factor(ref, mass, nb, m, inv_t, [&](Eigen::Index b, double f) { total += mass[b] * f; });
    // Normalize block by block, and draw on the way: the masses are normalized, so the target is u.
    double acc = 0.0;
    Eigen::Index pick = -1, last = -1;
    detail::for_each_block_factor(ref, mass, nb, m, inv_t, [&](Eigen::Index b, double f) {
        const Eigen::Index start = b * row_block, len = detail::block_len(n, b);
        const double scale = f / total;
        out.segment(start, len) *= static_cast<float>(scale);
        mass[b] *= scale;
        if (pick >= 0) return;
        if (acc + mass[b] <= u) {
            acc += mass[b];
            last = b;
            return;
        }
        Eigen::Index block_last = -1;
        const Eigen::Index k = detail::scan_block(out.data() + start, len, acc, u, block_last);
        if (k >= 0) {
            pick = start + k;
        } else {
            last = b;  // rounding: the block's weights did not reach the target
        }
    });
    if (pick >= 0) return pick;
    // Rounding overshoot past every block: the last element with weight.
    const Eigen::Index k = detail::last_weighted(out.data(), n, last);
    SPECDEC_ASSERT(k >= 0, "standardize_and_sample: all weights are zero");
    return std::max<Eigen::Index>(k, 0);
}

/// A token drawn from weights w, with the factor that turns them into the distribution:
/// q = scale · w.
struct scaled_draw {
    Eigen::Index index = 0;  ///< the token drawn
    float scale = 1.0f;      ///< q = scale · w; 1 when w is already the distribution
};

/// standardize_and_sample without its normalizing pass: writes weights w to `out` with the
/// standardized distribution q = scale · w, and returns a draw from q with the uniform u
/// together with that scale. This is what a drafter needs for verification, which takes the
/// scale with the weights (see the verify() overload with draft_scales, and
/// draft_block::scales), so the row is read twice (a vectorized maximum, then the exps,
/// written, with their block sums) and written once, never rescaled. Without truncation and
/// at temperature > 0, w = exp((z − max z) / T) (the largest weight is 1 up to rounding, so
/// the scale lies in about [1 / V, 1]); truncating settings and temperature 0 write the
/// distribution itself (scale 1), as standardize_and_sample. The draw is the first index whose
/// running weight exceeds u · Σw.
/// \throws std::invalid_argument as standardize().
[[nodiscard]] inline scaled_draw standardize_weights_and_sample(
    const Eigen::Ref<const Eigen::VectorXf>& logits, const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
    double u, sampling_workspace& ws, const char* where = "specdec::standardize_weights_and_sample") {
    const Eigen::Index n = logits.size();
    detail::check_sampling_call(n, out.size(), s, where);
    if (s.temperature == 0.0f || detail::truncates(s))
        return {standardize_and_sample(logits, s, out, u, ws, where), 1.0f};
    if (n == 0) detail::fail_invalid(where, ": logits row is empty");
    using detail::row_block;
    constexpr float inf = std::numeric_limits<float>::infinity();
    const Eigen::Index nb = detail::blocks_of(n);
    ws.block_sums.resize(static_cast<std::size_t>(nb));
    double* mass = ws.block_sums.data();
    // One reference for the whole row, its maximum, so that one factor normalizes every block.
    float m = -inf;
    for (Eigen::Index b = 0; b < nb; ++b) {
        const float bm = detail::block_max(logits, b * row_block, detail::block_len(n, b));
        if (std::isnan(bm) || bm == inf) detail::diagnose_logits(logits, where);
        m = std::max(m, bm);
    }
    if (m == -inf) detail::diagnose_logits(logits, where);
    const float inv_t = 1.0f / s.temperature;
    double total = 0.0;
    for (Eigen::Index b = 0; b < nb; ++b) {
        const Eigen::Index start = b * row_block;
        mass[b] = detail::exp_pass(logits.data() + start, out.data() + start, detail::block_len(n, b), m, inv_t,
                                   detail::block_len(n, b + 1));
        total += mass[b];
    }
    if (std::isnan(total)) detail::diagnose_logits(logits, where);  // a NaN the maxima did not show
    const auto scale = static_cast<float>(1.0 / total);
    // Inversion over the block sums, then within one block (groups of 16 skipped by their sums).
    const double target = u * total;
    double acc = 0.0;
    Eigen::Index last = -1;
    for (Eigen::Index b = 0; b < nb; ++b) {
        if (acc + mass[b] <= target) {
            acc += mass[b];
            if (mass[b] > 0.0) last = b;
            continue;
        }
        Eigen::Index block_last = -1;
        const Eigen::Index k = detail::scan_block(out.data() + b * row_block, detail::block_len(n, b), acc, target,
                                                  block_last);
        if (k >= 0) return {b * row_block + k, scale};
        if (block_last >= 0) last = b;  // rounding: the block's weights did not reach the target
    }
    // Rounding overshoot past every block: the last element with weight.
    const Eigen::Index k = detail::last_weighted(out.data(), n, last);
    SPECDEC_ASSERT(k >= 0, "standardize_weights_and_sample: all weights are zero");
    return {std::max<Eigen::Index>(k, 0), scale};
}

}  // namespace specdec
