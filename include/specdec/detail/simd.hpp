/// \file
/// The packet layer of one copy of the core: namespace pk, with the operations the passes use
/// under the names Eigen gives them (ploadu, padd, predux, ...). The portable copy takes Eigen's
/// own packets for the build's flags; the AVX2 and AVX-512 copies use 8 and 16 floats in
/// __m256 and __m512, whatever the flags, with Eigen's semantics where they matter (pmax returns
/// its first argument when that is NaN; predux adds in Eigen's order for 8 floats).
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

namespace pk {
#if SPECDEC_DETAIL_ISA == 0
using namespace Eigen::internal;
using packet = packet_traits<float>::type;
inline constexpr Eigen::Index width = packet_traits<float>::size;
/// v where key >= t, else 0 (also where key is NaN).
inline packet pkeep_at_least(packet key, packet t, packet v) { return pand(pcmp_le(t, key), v); }
#else
#if SPECDEC_DETAIL_ISA == 1
using packet = __m256;
inline constexpr Eigen::Index width = 8;
template <class P = packet>
SPECDEC_ALWAYS_INLINE packet ploadu(const float* p) { return _mm256_loadu_ps(p); }
template <class P = packet>
SPECDEC_ALWAYS_INLINE packet pset1(float v) { return _mm256_set1_ps(v); }
SPECDEC_ALWAYS_INLINE void pstoreu(float* p, packet x) { _mm256_storeu_ps(p, x); }
SPECDEC_ALWAYS_INLINE void pstore(float* p, packet x) { _mm256_store_ps(p, x); }
SPECDEC_ALWAYS_INLINE packet padd(packet a, packet b) { return _mm256_add_ps(a, b); }
SPECDEC_ALWAYS_INLINE packet psub(packet a, packet b) { return _mm256_sub_ps(a, b); }
SPECDEC_ALWAYS_INLINE packet pmul(packet a, packet b) { return _mm256_mul_ps(a, b); }
SPECDEC_ALWAYS_INLINE packet pdiv(packet a, packet b) { return _mm256_div_ps(a, b); }
/// a·b + c with one rounding.
SPECDEC_ALWAYS_INLINE packet pmadd(packet a, packet b, packet c) { return _mm256_fmadd_ps(a, b, c); }
SPECDEC_ALWAYS_INLINE packet pmax(packet a, packet b) { return _mm256_max_ps(b, a); }  // (a when a is NaN)
SPECDEC_ALWAYS_INLINE packet pmin(packet a, packet b) { return _mm256_min_ps(b, a); }  // (a when a is NaN)
SPECDEC_ALWAYS_INLINE packet por(packet a, packet b) { return _mm256_or_ps(a, b); }
/// v where key >= t, else 0 (also where key is NaN).
SPECDEC_ALWAYS_INLINE packet pkeep_at_least(packet key, packet t, packet v) { return _mm256_and_ps(_mm256_cmp_ps(key, t, _CMP_GE_OQ), v); }
SPECDEC_ALWAYS_INLINE float pfirst(packet a) { return _mm256_cvtss_f32(a); }
/// The sum of the 8 lanes in Eigen's order: halves, then pairs, then the last two.
SPECDEC_ALWAYS_INLINE float predux(packet a) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
SPECDEC_ALWAYS_INLINE float predux_max(packet a) {
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_shuffle_ps(q, q, 1)));
}
#else
using packet = __m512;
inline constexpr Eigen::Index width = 16;
template <class P = packet>
SPECDEC_ALWAYS_INLINE packet ploadu(const float* p) { return _mm512_loadu_ps(p); }
template <class P = packet>
SPECDEC_ALWAYS_INLINE packet pset1(float v) { return _mm512_set1_ps(v); }
SPECDEC_ALWAYS_INLINE void pstoreu(float* p, packet x) { _mm512_storeu_ps(p, x); }
SPECDEC_ALWAYS_INLINE void pstore(float* p, packet x) { _mm512_store_ps(p, x); }
SPECDEC_ALWAYS_INLINE packet padd(packet a, packet b) { return _mm512_add_ps(a, b); }
SPECDEC_ALWAYS_INLINE packet psub(packet a, packet b) { return _mm512_sub_ps(a, b); }
SPECDEC_ALWAYS_INLINE packet pmul(packet a, packet b) { return _mm512_mul_ps(a, b); }
SPECDEC_ALWAYS_INLINE packet pdiv(packet a, packet b) { return _mm512_div_ps(a, b); }
/// a·b + c with one rounding.
SPECDEC_ALWAYS_INLINE packet pmadd(packet a, packet b, packet c) { return _mm512_fmadd_ps(a, b, c); }
SPECDEC_ALWAYS_INLINE packet pmax(packet a, packet b) { return _mm512_max_ps(b, a); }  // (a when a is NaN)
SPECDEC_ALWAYS_INLINE packet pmin(packet a, packet b) { return _mm512_min_ps(b, a); }  // (a when a is NaN)
SPECDEC_ALWAYS_INLINE packet por(packet a, packet b) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
SPECDEC_ALWAYS_INLINE float pfirst(packet a) { return _mm512_cvtss_f32(a); }
/// v where key >= t, else 0 (also where key is NaN).
SPECDEC_ALWAYS_INLINE packet pkeep_at_least(packet key, packet t, packet v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(key, t, _CMP_GE_OQ), v);
}
/// The halves of a, as two vectors of 8.
SPECDEC_ALWAYS_INLINE __m256 low_half(packet a) { return _mm512_castps512_ps256(a); }
SPECDEC_ALWAYS_INLINE __m256 high_half(packet a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }
/// The sum of the 16 lanes: halves, then as 8.
SPECDEC_ALWAYS_INLINE float predux(packet a) {
    const __m256 e = _mm256_add_ps(low_half(a), high_half(a));
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
SPECDEC_ALWAYS_INLINE float predux_max(packet a) {
    const __m256 e = _mm256_max_ps(low_half(a), high_half(a));
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_shuffle_ps(q, q, 1)));
}
#endif
#endif
}  // namespace pk

/// Keeps a loaded packet in a register. Left to itself GCC folds the load into each use of
/// the packet (here a max and an add), which doubles the loads of a pass that is bound by them.
/// Also keeps the compiler from fusing a multiply with a later add (the passes' sums must not
/// depend on the compiler's contraction choices).
template <class Packet>
SPECDEC_ALWAYS_INLINE void keep_in_register(Packet& x) {
#if (SPECDEC_DETAIL_ISA >= 1 || defined(EIGEN_VECTORIZE)) && (defined(__GNUC__) || defined(__clang__)) && \
    (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+v"(x));
#elif defined(EIGEN_VECTORIZE) && (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
    __asm__("" : "+w"(x));
#else
    (void)x;
#endif
}

/// Σ x[0..n) in float, in an order fixed by this copy's packets (the same in every translation
/// unit, unlike an Eigen reduction, whose order follows the build's packets): four packet
/// accumulators, added lane by lane, then reduced; the tail added last.
inline float sum_floats(const float* x, Eigen::Index n) {
    constexpr Eigen::Index w = pk::width;
    pk::packet a0 = pk::pset1<pk::packet>(0.0f), a1 = a0, a2 = a0, a3 = a0;
    Eigen::Index k = 0;
    for (; k + 4 * w <= n; k += 4 * w) {
        a0 = pk::padd(a0, pk::ploadu<pk::packet>(x + k));
        a1 = pk::padd(a1, pk::ploadu<pk::packet>(x + k + w));
        a2 = pk::padd(a2, pk::ploadu<pk::packet>(x + k + 2 * w));
        a3 = pk::padd(a3, pk::ploadu<pk::packet>(x + k + 3 * w));
    }
    for (; k + w <= n; k += w) a0 = pk::padd(a0, pk::ploadu<pk::packet>(x + k));
    float s = pk::predux(pk::padd(pk::padd(a0, a1), pk::padd(a2, a3)));
    for (; k < n; ++k) s += x[k];
    return s;
}

/// sum_floats(x, n) (the same order, so the same value), and in the same pass whether some
/// x[k] may be negative: `negative` is set when one is, and may be set for NaN (whose sum is
/// NaN anyway). One pass where a minimum and a sum would read the block twice.
inline float sum_floats_noting_negative(const float* x, Eigen::Index n, bool& negative) {
    constexpr Eigen::Index w = pk::width;
    const pk::packet zero = pk::pset1<pk::packet>(0.0f);
    pk::packet a0 = zero, a1 = a0, a2 = a0, a3 = a0, lo = zero;
    Eigen::Index k = 0;
    for (; k + 4 * w <= n; k += 4 * w) {
        const pk::packet x0 = pk::ploadu<pk::packet>(x + k), x1 = pk::ploadu<pk::packet>(x + k + w);
        const pk::packet x2 = pk::ploadu<pk::packet>(x + k + 2 * w), x3 = pk::ploadu<pk::packet>(x + k + 3 * w);
        a0 = pk::padd(a0, x0);
        a1 = pk::padd(a1, x1);
        a2 = pk::padd(a2, x2);
        a3 = pk::padd(a3, x3);
        lo = pk::pmin(pk::pmin(lo, x0), pk::pmin(x1, pk::pmin(x2, x3)));
    }
    for (; k + w <= n; k += w) {
        const pk::packet x0 = pk::ploadu<pk::packet>(x + k);
        a0 = pk::padd(a0, x0);
        lo = pk::pmin(lo, x0);
    }
    float s = pk::predux(pk::padd(pk::padd(a0, a1), pk::padd(a2, a3)));
    float lanes[pk::width];
    pk::pstoreu(lanes, lo);
    bool neg = false;
    for (Eigen::Index l = 0; l < w; ++l) neg |= !(lanes[l] >= 0.0f);
    for (; k < n; ++k) {
        s += x[k];
        neg |= !(x[k] >= 0.0f);
    }
    negative = negative || neg;
    return s;
}

/// Σ x[0..n) of non-negative floats, as a double: sum_floats (its order and value) when that is
/// finite, which costs one check; when its float partial sums overflow (finite weights whose
/// sum exceeds FLT_MAX), or a weight is NaN or Inf, the floats are summed again in double,
/// which gives the finite sum, or NaN or Inf as the weights make it.
inline double sum_floats_in_double(const float* x, Eigen::Index n) {
    const float s = sum_floats(x, n);
    if (std::isfinite(s)) return static_cast<double>(s);
    double a[4] = {};
    Eigen::Index k = 0;
    for (; k + 4 <= n; k += 4)
        for (int l = 0; l < 4; ++l) a[l] += static_cast<double>(x[k + l]);
    for (; k < n; ++k) a[0] += static_cast<double>(x[k]);
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/// Σ max(0, a·x_k − b·y_k) over k < n, in float, in the order of sum_floats.
inline float positive_part_sum(const float* x, float a, const float* y, float b, Eigen::Index n) {
    constexpr Eigen::Index w = pk::width;
    const pk::packet pa = pk::pset1<pk::packet>(a), pb = pk::pset1<pk::packet>(b);
    const pk::packet zero = pk::pset1<pk::packet>(0.0f);
    pk::packet acc = zero;
    Eigen::Index k = 0;
    for (; k + w <= n; k += w) {
        pk::packet t = pk::psub(pk::pmul(pa, pk::ploadu<pk::packet>(x + k)), pk::pmul(pb, pk::ploadu<pk::packet>(y + k)));
        acc = pk::padd(acc, pk::pmax(zero, t));
    }
    float s = pk::predux(acc);
    for (; k < n; ++k) s += std::max(0.0f, a * x[k] - b * y[k]);
    return s;
}

/// x[k] *= s for k < n.
inline void scale_floats(float* x, Eigen::Index n, float s) {
    constexpr Eigen::Index w = pk::width;
    const pk::packet ps = pk::pset1<pk::packet>(s);
    Eigen::Index k = 0;
    for (; k + w <= n; k += w) pk::pstoreu(x + k, pk::pmul(pk::ploadu<pk::packet>(x + k), ps));
    for (; k < n; ++k) x[k] *= s;
}

/// out[k] = key[k] >= t ? out[k] : 0 for k < n (0 where key[k] is NaN): the cut of top-k, top-p
/// and min-p sampling. key may be out.
inline void zero_below(const float* key, float t, float* out, Eigen::Index n) {
    constexpr Eigen::Index w = pk::width;
    const pk::packet pt = pk::pset1<pk::packet>(t);
    Eigen::Index k = 0;
    for (; k + w <= n; k += w)
        pk::pstoreu(out + k, pk::pkeep_at_least(pk::ploadu<pk::packet>(key + k), pt, pk::ploadu<pk::packet>(out + k)));
    for (; k < n; ++k) out[k] = key[k] >= t ? out[k] : 0.0f;
}

/// x[k] /= s for k < n.
inline void divide_floats(float* x, Eigen::Index n, float s) {
    constexpr Eigen::Index w = pk::width;
    const pk::packet ps = pk::pset1<pk::packet>(s);
    Eigen::Index k = 0;
    for (; k + w <= n; k += w) pk::pstoreu(x + k, pk::pdiv(pk::ploadu<pk::packet>(x + k), ps));
    for (; k < n; ++k) x[k] /= s;
}

/// out[k] = x[k] · s for k < n.
inline void scaled_copy(const float* x, float s, float* out, Eigen::Index n) {
    constexpr Eigen::Index w = pk::width;
    const pk::packet ps = pk::pset1<pk::packet>(s);
    Eigen::Index k = 0;
    for (; k + w <= n; k += w) pk::pstoreu(out + k, pk::pmul(pk::ploadu<pk::packet>(x + k), ps));
    for (; k < n; ++k) out[k] = x[k] * s;
}

/// out[k] = max(0, a·x[k] − b·y[k]) for k < n (out may be x).
inline void positive_part_into(const float* x, float a, const float* y, float b, float* out, Eigen::Index n) {
    constexpr Eigen::Index w = pk::width;
    const pk::packet pa = pk::pset1<pk::packet>(a), pb = pk::pset1<pk::packet>(b);
    const pk::packet zero = pk::pset1<pk::packet>(0.0f);
    Eigen::Index k = 0;
    for (; k + w <= n; k += w) {
        pk::packet t = pk::psub(pk::pmul(pa, pk::ploadu<pk::packet>(x + k)), pk::pmul(pb, pk::ploadu<pk::packet>(y + k)));
        pk::pstoreu(out + k, pk::pmax(zero, t));
    }
    for (; k < n; ++k) out[k] = std::max(0.0f, a * x[k] - b * y[k]);
}

/// Lane sums of 16 × `columns` floats at x (column c at x + 16c): out[l] = x[l] + x[l + 16] + ...,
/// column by column.
inline void lane_sums_16(const float* x, Eigen::Index columns, float* out) {
    constexpr Eigen::Index w = pk::width, groups = 16 / w;
    static_assert(16 % w == 0);
    pk::packet acc[groups];
    for (Eigen::Index g = 0; g < groups; ++g) acc[g] = pk::pset1<pk::packet>(0.0f);
    for (Eigen::Index c = 0; c < columns; ++c)
        for (Eigen::Index g = 0; g < groups; ++g) acc[g] = pk::padd(acc[g], pk::ploadu<pk::packet>(x + 16 * c + g * w));
    for (Eigen::Index g = 0; g < groups; ++g) pk::pstoreu(out + g * w, acc[g]);
}
