/// \file
/// The vectorized exp of every pass: exp((x − m) / T) as 2^t with a degree-5 polynomial (AVX-512,
/// AVX2 + FMA), or Eigen's exp of the build's own packets (the portable path); one float at a
/// time (pass_exp) and one lane of 16 (exp_lane) as the passes compute them, and the factor
/// between two blocks' references (block_factor).
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

#if SPECDEC_DETAIL_ISA >= 1
/// 2^f for 0 <= f < 1 by the polynomial exp2_poly (Horner's rule, one multiply-add per
/// coefficient).
SPECDEC_ALWAYS_INLINE pk::packet exp2_polynomial(pk::packet f) {
    pk::packet p = pk::pmadd(pk::pset1(exp2_poly[0]), f, pk::pset1(exp2_poly[1]));
    p = pk::pmadd(p, f, pk::pset1(exp2_poly[2]));
    p = pk::pmadd(p, f, pk::pset1(exp2_poly[3]));
    p = pk::pmadd(p, f, pk::pset1(exp2_poly[4]));
    return pk::pmadd(p, f, pk::pset1(1.0f));
}
#endif

#if SPECDEC_DETAIL_ISA == 2

/// exp((x − m) inv_t) of 16 floats with x <= m (or −Inf): 2^t with t = x·s − h (see
/// exp2_reference) = n + f, n = floor(t), 0 <= f < 1: 2^f by a degree-5 polynomial fitted to it
/// on [0, 1] for the least maximum relative error (2^0 = 1 kept exact), times 2^n by vscalefps,
/// which takes the floor of t itself (exactly 0 once t < −149). Measured over every float t in
/// [−2, 0]: relative error at most 1.8e-7. NaN stays NaN and −Inf gives 0: f comes from
/// vreduceps (AVX512DQ, rounding down), which is 0 for t = −Inf (so the polynomial sees no NaN).
/// Eight vector instructions per 16 floats: the multiply-subtract, vreduceps, five multiply-adds
/// and vscalefps.
struct exp2_avx512 {
    __m512 vm, scale, ref;
    bool fused;
    explicit exp2_avx512(float m, float inv_t) : exp2_avx512(exp2_reference(m, inv_t)) {}
    explicit exp2_avx512(const exp2_reference& r)
        : vm(_mm512_set1_ps(r.m)), scale(_mm512_set1_ps(r.s)), ref(_mm512_set1_ps(r.h)), fused(r.fused) {}
    __m512 operator()(__m512 x) const {
        const __m512 t = fused ? _mm512_fmsub_ps(x, scale, ref) : _mm512_mul_ps(_mm512_sub_ps(x, vm), scale);
        const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512 n = t;  // vscalefps takes its floor
        const __m512 p = exp2_polynomial(f);
        return _mm512_scalef_ps(p, n);
    }
};
#endif

#if SPECDEC_DETAIL_ISA == 1
/// exp((x − m) inv_t) of 8 floats with x <= m (or −Inf), with AVX2 and FMA: the exponent t of
/// exp2_avx512 (exp2_reference), clamped below at −127, = n + f with n = floor(t); 2^f by the
/// same polynomial, times 2^n made in a float's exponent field, where n = −127 makes the factor
/// +0: results below 2^−126 (a natural exponent below about −87.3) are exactly 0, never
/// subnormal, and −Inf gives 0. NaN stays NaN (vmaxps returns its second operand, t, when one is
/// NaN; its integer conversion then makes a factor of 1). From 2^−126 up, within one ulp of
/// exp2_avx512 (f = t − floor(t) is rounded by a subtraction here, by vreduceps there, which
/// differ for some t < 0; most results are the same floats). Thirteen instructions per 8
/// floats, about half of Eigen's exp.
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
        const __m256 p = exp2_polynomial(f);
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    }
};
#endif

#if SPECDEC_DETAIL_ISA == 0
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
SPECDEC_ALWAYS_INLINE Packet exp_shifted(const Packet& x, const Packet& m_half, const Packet& inv_t_twice) {
    const Packet y = pk::pmul(pk::psub(pk::pmul(x, pk::pset1<Packet>(0.5f)), m_half), inv_t_twice);
    const Packet low = pk::pset1<Packet>(-87.0f);
    // pexp is given at least −87: at its own clamp (−88.7) it works with subnormal numbers,
    // which x86 cores handle slowly (a row that is mostly −Inf took 3–4× as long as a dense
    // one). Eigen's pmax returns its first argument when that is NaN (a test checks it).
    return pk::pselect(pk::pcmp_lt(y, low), pk::pzero(y), pk::pexp(pk::pmax(y, low)));
}

#endif

#if SPECDEC_DETAIL_ISA != 2
/// exp((x − m) inv_t) of Eigen packets as the passes without AVX-512 compute it: exp2_avx2 with
/// AVX2 and FMA, else exp_shifted; `one` gives the same float for a single x.
struct packet_exp {
    using packet = pk::packet;
#if SPECDEC_DETAIL_ISA == 1
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

#if SPECDEC_DETAIL_ISA == 2
/// The sum of a vector's 16 lanes, added in double precision as a tree (a chain of 16
/// dependent adds would be the longest latency of a pass over a short row).
///
/// Always inlined, as is every function here that takes or returns a vector: GCC 12 does not
/// clear the registers' upper halves (vzeroupper) on the paths out of a caller of such a
/// function compiled for another target than the translation unit's, and code compiled for the
/// baseline (the C library's exp2, the caller's own SSE code) then runs many times slower
/// (block_factor's exp2 took about 15 times as long, on a CPU with AVX-512).
SPECDEC_ALWAYS_INLINE double lanes_in_double(__m512 v) {
    alignas(64) float t[16];  // (not _mm512_reduce_add_ps: GCC 12 warns falsely inside it)
    _mm512_store_ps(t, v);
    double d[8];
    for (int i = 0; i < 8; ++i) d[i] = static_cast<double>(t[i]) + static_cast<double>(t[i + 8]);
    return ((d[0] + d[4]) + (d[2] + d[6])) + ((d[1] + d[5]) + (d[3] + d[7]));
}

/// The sum of four accumulators' 64 lanes, added in double precision.
SPECDEC_ALWAYS_INLINE double total_in_double(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
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


/// exp((x − m) inv_t) of one float, computed as the vectorized passes compute it (the float a
/// block's sum added for this element).
inline float pass_exp(float x, float m, float inv_t) {
#if SPECDEC_DETAIL_ISA == 2
    return _mm512_cvtss_f32(exp2_avx512{m, inv_t}(_mm512_set1_ps(x)));
#else
    using packet = pk::packet;
    return pk::pfirst(packet_exp{m, inv_t}(pk::pset1<packet>(x)));
#endif
}

/// exp((x − m) inv_t) of 16 floats with the exp of chunked_exp_pass (so a lane's elements come
/// out as the floats its lane sum was made of).
inline void exp_lane(const float* in, float* out, float m, float inv_t) {
#if SPECDEC_DETAIL_ISA == 2
    _mm512_storeu_ps(out, exp2_avx512{m, inv_t}(_mm512_loadu_ps(in)));
#else
    using packet = pk::packet;
    constexpr Eigen::Index width = pk::width;
    static_assert(chunk_lanes % width == 0);
    const packet_exp exp_of{m, inv_t};
    for (Eigen::Index g = 0; g < chunk_lanes; g += width) pk::pstoreu(out + g, exp_of(pk::ploadu<packet>(in + g)));
#endif
}

/// exp((ref − m) / T), the factor that turns exponentials taken relative to ref into ones
/// relative to m, as the vectorized exp defines its references (with AVX-512, from the base-2
/// references of exp2_reference, so that it matches the exponentials exactly).
inline double block_factor(float ref, float m, float inv_t) {
#if SPECDEC_DETAIL_ISA >= 1
    // exp2 is the C library's, compiled for the baseline instruction set: the upper halves of
    // the vector registers must be clear when it runs (see lanes_in_double), which costs one
    // instruction here whatever the compiler's own bookkeeping.
    _mm256_zeroupper();
    return std::exp2(exp2_reference(ref, inv_t).log2() - exp2_reference(m, inv_t).log2());
#else
    return std::exp((static_cast<double>(ref) - m) * inv_t);  // (in float, ref − m could overflow)
#endif
}
