// Run-time ISA dispatch of the sampling exp pass (specdec::detail::exp_pass), by hand or with Google
// Highway: Σ exp((x − m)·inv_t) over a float row, the exps written to an output row, the total in
// double. Built only when Highway is found (benchmarks/CMakeLists.txt) and for the baseline ISA (no
// -march): every vector path here is chosen at run time.
//
//   BM_hand/<isa>/V:<v>        by hand: kernels with __attribute__((target(...))) in per-ISA namespaces
//                              (hand_avx512, hand_avx2). dispatched: through the kernel chosen once by
//                              __builtin_cpu_supports; avx2: the AVX2+FMA kernel called directly
//   BM_hwy/<isa>/V:<v>         the algorithm written once with Highway ops (foreach_target.h,
//                              HWY_EXPORT, HWY_DYNAMIC_DISPATCH). dispatched: Highway's own choice;
//                              avx2: after hwy::SetSupportedTargetsForTest(HWY_AVX2)
//   BM_hwy_bits/<isa>/V:<v>    as BM_hwy with 2^n made without hn::ConvertTo (n + 2^23 + 127 as a
//                              float holds n + 127 in its low bits), whose overflow fix-up costs four
//                              more instructions per AVX2 vector than the hand kernel's vcvtps2dq
//   BM_hwy_exp/<isa>/V:<v>     as BM_hwy with hn::Exp (hwy/contrib/math) of (x − m)·inv_t
//   BM_hwy_scalef/dispatched/V:<v>  as BM_hwy, but on the AVX-512 targets the reduction and the 2^n
//                              are vreduceps / vscalefps through .raw (the hand AVX-512 instructions)
//   BM_bound/<isa>/V:<v>       the physical bound: the sum of the row's floats (one read; no exp, no
//                              store), by hand with the ISA of the kernels it bounds
//
// Highway has no portable op for vscalefps / vreduceps, so BM_hwy computes 2^t on every target as
// exp2_avx2 does (clamp at −127, floor, polynomial, 2^n in the exponent field): 13 vector instructions
// per vector where the hand AVX-512 kernel needs 8 (exp2_avx512); BM_hwy_scalef isolates that.
//
// Rows: V = 512, 32000, 151936 logits drawn N(0, 3) from a fixed seed, 64-byte aligned; m = the row's
// max, T = 1. One iteration is one row (in cache after the first), so Time is ns per row, each call
// paying its dispatch (the hand kernels' function pointer or Highway's table). The context lists the
// kernel each dispatch chose and each kernel's max relative error against std::exp in double.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch_compare_bench.cpp"
#include <hwy/foreach_target.h>  // re-includes this file once per Highway target

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#ifndef SPECDEC_DISPATCH_COMPARE_SHARED
#define SPECDEC_DISPATCH_COMPARE_SHARED
namespace dispatch_bench {

// exp2_poly and log2e_float of include/specdec/sampling.hpp: 2^f on [0, 1) = 1 + f·(c4 + f·(c3 + ...)).
inline constexpr float exp2_poly[5] = {0.00186711829f, 0.00901705492f, 0.055799894f, 0.240164459f, 0.693151295f};
inline constexpr float log2e = 1.44269504088896341f;

// exp2_reference (fused case, |m·s| <= 2^22): exp((x − m)·inv_t) = 2^t with t = x·s − h in one fused
// multiply-subtract, s = inv_t·log2(e), h = m·s.
struct exp_params {
    float m, inv_t, s, h;
    exp_params(float m_, float inv_t_) : m(m_), inv_t(inv_t_), s(inv_t_ * log2e), h(m_ * s) {}
};

// The sum of n float lanes, added in double.
inline double lanes_in_double(const float* lanes, std::size_t n) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(lanes[i]);
    return sum;
}

}  // namespace dispatch_bench
#endif

// ---- (b) with Highway: one source, compiled once per target ----
HWY_BEFORE_NAMESPACE();
namespace dispatch_bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

enum class exp_kind { poly, bits, contrib, scalef };

// 2^f for 0 <= f < 1 by exp2_poly (Horner's rule).
HWY_INLINE V Exp2Poly(D d, V f) {
    V p = hn::MulAdd(hn::Set(d, exp2_poly[0]), f, hn::Set(d, exp2_poly[1]));
    p = hn::MulAdd(p, f, hn::Set(d, exp2_poly[2]));
    p = hn::MulAdd(p, f, hn::Set(d, exp2_poly[3]));
    p = hn::MulAdd(p, f, hn::Set(d, exp2_poly[4]));
    return hn::MulAdd(p, f, hn::Set(d, 1.0f));
}

// exp((x − m)·inv_t) of one vector. poly: exp2_avx2's algorithm (t clamped below at −127, n = floor(t),
// 2^(t − n) by the polynomial, 2^n made in a float's exponent field, so −Inf gives +0); bits: poly with
// the exponent field taken from the float n + (2^23 + 127) (exact for −127 <= n <= 128; the shift drops
// its own exponent) instead of hn::ConvertTo; contrib: hn::Exp; scalef: exp2_avx512's vreduceps /
// vscalefps on the AVX-512 targets, poly elsewhere.
template <exp_kind kind>
HWY_INLINE V ExpOf(D d, V x, const exp_params& r) {
    if constexpr (kind == exp_kind::contrib) {
        return hn::Exp(d, hn::Mul(hn::Sub(x, hn::Set(d, r.m)), hn::Set(d, r.inv_t)));
    } else {
        V t = hn::MulSub(x, hn::Set(d, r.s), hn::Set(d, r.h));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        if constexpr (kind == exp_kind::scalef) {
            const V f{_mm512_reduce_ps(t.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
            return V{_mm512_scalef_ps(Exp2Poly(d, f).raw, t.raw)};
        }
#endif
        t = hn::Max(hn::Set(d, -127.0f), t);
        const V n = hn::Floor(t);
        const hn::RebindToSigned<D> di;
        if constexpr (kind == exp_kind::bits) {
            const auto two_n = hn::ShiftLeft<23>(hn::BitCast(di, hn::Add(n, hn::Set(d, 8388735.0f))));
            return hn::Mul(Exp2Poly(d, hn::Sub(t, n)), hn::BitCast(d, two_n));
        }
        const auto two_n = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
        return hn::Mul(Exp2Poly(d, hn::Sub(t, n)), hn::BitCast(d, two_n));
    }
}

// The row: four vectors per step into four accumulators, then whole vectors, then the last partial
// vector through a buffer padded with −Inf (whose exps are 0).
template <exp_kind kind>
HWY_INLINE double ExpSumRow(const float* HWY_RESTRICT z, float* HWY_RESTRICT out, size_t len, float m,
                            float inv_t) {
    const D d;
    const size_t n = hn::Lanes(d);
    const exp_params r(m, inv_t);
    V a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
    size_t k = 0;
    for (; k + 4 * n <= len; k += 4 * n) {
        const V e0 = ExpOf<kind>(d, hn::LoadU(d, z + k), r);
        const V e1 = ExpOf<kind>(d, hn::LoadU(d, z + k + n), r);
        const V e2 = ExpOf<kind>(d, hn::LoadU(d, z + k + 2 * n), r);
        const V e3 = ExpOf<kind>(d, hn::LoadU(d, z + k + 3 * n), r);
        hn::StoreU(e0, d, out + k);
        hn::StoreU(e1, d, out + k + n);
        hn::StoreU(e2, d, out + k + 2 * n);
        hn::StoreU(e3, d, out + k + 3 * n);
        a0 = hn::Add(a0, e0);
        a1 = hn::Add(a1, e1);
        a2 = hn::Add(a2, e2);
        a3 = hn::Add(a3, e3);
    }
    for (; k + n <= len; k += n) {
        const V e = ExpOf<kind>(d, hn::LoadU(d, z + k), r);
        hn::StoreU(e, d, out + k);
        a0 = hn::Add(a0, e);
    }
    HWY_ALIGN float buf[hn::MaxLanes(d)];
    if (k < len) {
        for (size_t i = 0; i < n; ++i) buf[i] = k + i < len ? z[k + i] : -std::numeric_limits<float>::infinity();
        const V e = ExpOf<kind>(d, hn::Load(d, buf), r);
        hn::Store(e, d, buf);
        std::memcpy(out + k, buf, (len - k) * sizeof(float));
        a0 = hn::Add(a0, e);
    }
    hn::Store(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), d, buf);
    return lanes_in_double(buf, n);
}

double ExpSumPoly(const float* z, float* out, size_t len, float m, float inv_t) {
    return ExpSumRow<exp_kind::poly>(z, out, len, m, inv_t);
}
double ExpSumBits(const float* z, float* out, size_t len, float m, float inv_t) {
    return ExpSumRow<exp_kind::bits>(z, out, len, m, inv_t);
}
double ExpSumContrib(const float* z, float* out, size_t len, float m, float inv_t) {
    return ExpSumRow<exp_kind::contrib>(z, out, len, m, inv_t);
}
double ExpSumScalef(const float* z, float* out, size_t len, float m, float inv_t) {
    return ExpSumRow<exp_kind::scalef>(z, out, len, m, inv_t);
}
int64_t Target() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace dispatch_bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <benchmark/benchmark.h>

#if !defined(__x86_64__) || !(defined(__GNUC__) || defined(__clang__))
#error "dispatch_compare_bench: the hand-dispatched kernels need x86-64 and GCC or Clang"
#endif
#include <immintrin.h>

namespace dispatch_bench {

HWY_EXPORT(ExpSumPoly);
HWY_EXPORT(ExpSumBits);
HWY_EXPORT(ExpSumContrib);
HWY_EXPORT(ExpSumScalef);
HWY_EXPORT(Target);

// ---- (a) by hand: one kernel per ISA, function target attributes ----
#define DISPATCH_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma")))
#define DISPATCH_AVX2 __attribute__((target("avx2,fma")))

namespace hand_avx512 {

// exp2_avx512 (its AVX512DQ path): t = x·s − h; f = t − floor(t) by vreduceps; 2^f by exp2_poly; times
// 2^floor(t) by vscalefps, which floors t itself (−Inf gives 0).
[[gnu::always_inline]] DISPATCH_AVX512 inline __m512 exp_of(__m512 x, __m512 s, __m512 h) {
    const __m512 t = _mm512_fmsub_ps(x, s, h);
    const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(exp2_poly[0]), f, _mm512_set1_ps(exp2_poly[1]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(exp2_poly[2]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(exp2_poly[3]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(exp2_poly[4]));
    return _mm512_scalef_ps(_mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f)), t);
}

// The exps of the 16 floats at z, stored at out and added to acc.
[[gnu::always_inline]] DISPATCH_AVX512 inline void exp_step(const float* z, float* out, __m512 s, __m512 h,
                                                            __m512& acc) {
    const __m512 e = exp_of(_mm512_loadu_ps(z), s, h);
    _mm512_storeu_ps(out, e);
    acc = _mm512_add_ps(acc, e);
}

DISPATCH_AVX512 inline double lanes_of(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    return lanes_in_double(lanes, 16);
}

DISPATCH_AVX512 inline __mmask16 first_n(std::size_t left) {
    return static_cast<__mmask16>((1u << std::min<std::size_t>(16, left)) - 1u);
}

// exp_pass's AVX-512 loop: 64 floats per step into four accumulators, masked last vectors (−Inf in the
// unused lanes).
DISPATCH_AVX512 double exp_sum(const float* z, float* out, std::size_t len, float m, float inv_t) {
    const exp_params r(m, inv_t);
    const __m512 s = _mm512_set1_ps(r.s), h = _mm512_set1_ps(r.h);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t k = 0;
    for (; k + 64 <= len; k += 64) {
        exp_step(z + k, out + k, s, h, a0);
        exp_step(z + k + 16, out + k + 16, s, h, a1);
        exp_step(z + k + 32, out + k + 32, s, h, a2);
        exp_step(z + k + 48, out + k + 48, s, h, a3);
    }
    for (; k < len; k += 16) {
        const __mmask16 mask = first_n(len - k);
        const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), mask, z + k);
        const __m512 e = exp_of(x, s, h);
        _mm512_mask_storeu_ps(out + k, mask, e);
        a0 = _mm512_add_ps(a0, e);
    }
    return lanes_of(a0, a1, a2, a3);
}

// The bound: the row's floats summed, 64 per step into four accumulators.
DISPATCH_AVX512 double read_sum(const float* z, std::size_t len) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t k = 0;
    for (; k + 64 <= len; k += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(z + k));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(z + k + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(z + k + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(z + k + 48));
    }
    for (; k < len; k += 16) a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(first_n(len - k), z + k));
    return lanes_of(a0, a1, a2, a3);
}

}  // namespace hand_avx512

namespace hand_avx2 {

// exp2_avx2: t = x·s − h clamped below at −127, n = floor(t), 2^(t − n) by exp2_poly, times 2^n made in
// a float's exponent field (n = −127 gives +0, so −Inf gives 0).
[[gnu::always_inline]] DISPATCH_AVX2 inline __m256 exp_of(__m256 x, __m256 s, __m256 h) {
    const __m256 t = _mm256_max_ps(_mm256_set1_ps(-127.0f), _mm256_fmsub_ps(x, s, h));
    const __m256 n = _mm256_floor_ps(t);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(exp2_poly[0]), f, _mm256_set1_ps(exp2_poly[1]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(exp2_poly[2]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(exp2_poly[3]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(exp2_poly[4]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// The exps of the 8 floats at z, stored at out and added to acc.
[[gnu::always_inline]] DISPATCH_AVX2 inline void exp_step(const float* z, float* out, __m256 s, __m256 h,
                                                          __m256& acc) {
    const __m256 e = exp_of(_mm256_loadu_ps(z), s, h);
    _mm256_storeu_ps(out, e);
    acc = _mm256_add_ps(acc, e);
}

DISPATCH_AVX2 inline double lanes_of(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return lanes_in_double(lanes, 8);
}

// All-ones in the first min(8, left) lanes.
DISPATCH_AVX2 inline __m256i first_n(std::size_t left) {
    const auto n = static_cast<int>(std::min<std::size_t>(8, left));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 32 floats per step into four accumulators, masked last vectors (−Inf in the unused lanes).
DISPATCH_AVX2 double exp_sum(const float* z, float* out, std::size_t len, float m, float inv_t) {
    const exp_params r(m, inv_t);
    const __m256 s = _mm256_set1_ps(r.s), h = _mm256_set1_ps(r.h);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t k = 0;
    for (; k + 32 <= len; k += 32) {
        exp_step(z + k, out + k, s, h, a0);
        exp_step(z + k + 8, out + k + 8, s, h, a1);
        exp_step(z + k + 16, out + k + 16, s, h, a2);
        exp_step(z + k + 24, out + k + 24, s, h, a3);
    }
    for (; k < len; k += 8) {
        const __m256i mask = first_n(len - k);
        const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()),
                                          _mm256_maskload_ps(z + k, mask), _mm256_castsi256_ps(mask));
        const __m256 e = exp_of(x, s, h);
        _mm256_maskstore_ps(out + k, mask, e);
        a0 = _mm256_add_ps(a0, e);
    }
    return lanes_of(a0, a1, a2, a3);
}

// The bound: the row's floats summed, 32 per step into four accumulators.
DISPATCH_AVX2 double read_sum(const float* z, std::size_t len) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t k = 0;
    for (; k + 32 <= len; k += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(z + k));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(z + k + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(z + k + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(z + k + 24));
    }
    for (; k < len; k += 8) a0 = _mm256_add_ps(a0, _mm256_maskload_ps(z + k, first_n(len - k)));
    return lanes_of(a0, a1, a2, a3);
}

}  // namespace hand_avx2

// Without AVX2: plain loops (the library's fallback is Eigen's exp).
namespace hand_scalar {

double exp_sum(const float* z, float* out, std::size_t len, float m, float inv_t) {
    double sum = 0.0;
    for (std::size_t k = 0; k < len; ++k) {
        out[k] = std::exp((z[k] - m) * inv_t);
        sum += static_cast<double>(out[k]);
    }
    return sum;
}

double read_sum(const float* z, std::size_t len) {
    double sum = 0.0;
    for (std::size_t k = 0; k < len; ++k) sum += static_cast<double>(z[k]);
    return sum;
}

}  // namespace hand_scalar

using exp_sum_fn = double (*)(const float*, float*, std::size_t, float, float);
using read_sum_fn = double (*)(const float*, std::size_t);

struct hand_kernels {
    const char* isa;
    exp_sum_fn exp_sum;
    read_sum_fn read_sum;
};

// The hand kernels for this CPU, chosen on the first call. __builtin_cpu_supports also checks that the
// OS saves the AVX / AVX-512 registers (XGETBV), so a feature it reports can be used.
const hand_kernels& hand_dispatch() {
    static const hand_kernels chosen = [] {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
            return hand_kernels{"avx512", hand_avx512::exp_sum, hand_avx512::read_sum};
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            return hand_kernels{"avx2", hand_avx2::exp_sum, hand_avx2::read_sum};
        return hand_kernels{"scalar", hand_scalar::exp_sum, hand_scalar::read_sum};
    }();
    return chosen;
}

bool cpu_has_avx2_fma() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// ---- the measurement ----

struct free_deleter {
    void operator()(float* p) const { std::free(p); }
};
using aligned_floats = std::unique_ptr<float[], free_deleter>;

aligned_floats allocate_floats(std::size_t n) {
    const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    return aligned_floats(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// One logits row: z ~ N(0, 3) from a fixed seed, m = max(z), T = 1; out receives the exps.
struct row {
    std::size_t v;
    aligned_floats z, out;
    float m;
    float inv_t = 1.0f;
    explicit row(std::size_t v_) : v(v_), z(allocate_floats(v_)), out(allocate_floats(v_)) {
        std::mt19937_64 gen(20240611u);
        std::normal_distribution<float> logit(0.0f, 3.0f);
        for (std::size_t i = 0; i < v; ++i) z[i] = logit(gen);
        m = *std::max_element(z.get(), z.get() + v);
    }
};

// Highway's targets restricted to `targets` (0: all that the CPU supports) while in scope.
struct hwy_targets_scope {
    explicit hwy_targets_scope(int64_t targets) { hwy::SetSupportedTargetsForTest(targets); }
    ~hwy_targets_scope() { hwy::SetSupportedTargetsForTest(0); }
    hwy_targets_scope(const hwy_targets_scope&) = delete;
    hwy_targets_scope& operator=(const hwy_targets_scope&) = delete;
};

// The Highway target HWY_DYNAMIC_DISPATCH calls now.
int64_t hwy_dispatched() { return HWY_DYNAMIC_DISPATCH(Target)(); }

// Highway may be forced to AVX2 when it compiled that target and the CPU has it.
bool hwy_avx2_available() { return (HWY_TARGETS & HWY_AVX2) != 0 && (hwy::SupportedTargets() & HWY_AVX2) != 0; }

// Times one call per iteration; `call(z, out, len, m, inv_t)` includes its own dispatch.
template <class Call>
void time_exp(benchmark::State& state, const row& r, Call call) {
    for (auto _ : state) {
        double sum = call(r.z.get(), r.out.get(), r.v, r.m, r.inv_t);
        benchmark::DoNotOptimize(sum);
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(r.v));
}

void time_read(benchmark::State& state, const row& r, read_sum_fn read) {
    for (auto _ : state) {
        double sum = read(r.z.get(), r.v);
        benchmark::DoNotOptimize(sum);
    }
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(r.v));
}

double hand_dispatched(const float* z, float* out, std::size_t len, float m, float inv_t) {
    return hand_dispatch().exp_sum(z, out, len, m, inv_t);
}
double hwy_poly(const float* z, float* out, std::size_t len, float m, float inv_t) {
    return HWY_DYNAMIC_DISPATCH(ExpSumPoly)(z, out, len, m, inv_t);
}
double hwy_bits(const float* z, float* out, std::size_t len, float m, float inv_t) {
    return HWY_DYNAMIC_DISPATCH(ExpSumBits)(z, out, len, m, inv_t);
}
double hwy_contrib(const float* z, float* out, std::size_t len, float m, float inv_t) {
    return HWY_DYNAMIC_DISPATCH(ExpSumContrib)(z, out, len, m, inv_t);
}
double hwy_scalef(const float* z, float* out, std::size_t len, float m, float inv_t) {
    return HWY_DYNAMIC_DISPATCH(ExpSumScalef)(z, out, len, m, inv_t);
}

// Max relative errors over the rows against std::exp((x − m)·inv_t) in double: of each exp, of each
// p = exp / sum (the normalized weight, which a common factor such as the rounding of h leaves alone),
// and of the sum.
std::string agreement(const std::vector<std::unique_ptr<row>>& rows, exp_sum_fn kernel) {
    double exp_err = 0.0, p_err = 0.0, sum_err = 0.0;
    for (const auto& r : rows) {
        std::vector<double> ref(r->v);
        double ref_sum = 0.0;
        for (std::size_t i = 0; i < r->v; ++i) {
            ref[i] = std::exp((static_cast<double>(r->z[i]) - static_cast<double>(r->m)) * r->inv_t);
            ref_sum += ref[i];
        }
        const double sum = kernel(r->z.get(), r->out.get(), r->v, r->m, r->inv_t);
        for (std::size_t i = 0; i < r->v; ++i) {
            const double e = static_cast<double>(r->out[i]);
            exp_err = std::max(exp_err, std::abs(e - ref[i]) / ref[i]);
            p_err = std::max(p_err, std::abs(e / sum - ref[i] / ref_sum) / (ref[i] / ref_sum));
        }
        sum_err = std::max(sum_err, std::abs(sum - ref_sum) / ref_sum);
    }
    char text[160];
    std::snprintf(text, sizeof text, "exp %.2e, p %.2e, sum %.2e", exp_err, p_err, sum_err);
    return text;
}

std::string compiled_hwy_targets() {
    std::string names;
    for (int64_t t = HWY_TARGETS; t != 0; t &= t - 1) names += std::string(names.empty() ? "" : ",") +
                                                              hwy::TargetName(t & -t);
    return names;
}

void register_all(const std::vector<std::unique_ptr<row>>& rows) {
    const hand_kernels& hand = hand_dispatch();
    for (const auto& p : rows) {
        const row& r = *p;
        const std::string v = "/V:" + std::to_string(r.v);
        auto add = [&](const std::string& name, auto fn) { benchmark::RegisterBenchmark((name + v).c_str(), fn); };
        add("BM_bound/dispatched", [&r, &hand](benchmark::State& s) { time_read(s, r, hand.read_sum); });
        add("BM_hand/dispatched", [&r](benchmark::State& s) { time_exp(s, r, hand_dispatched); });
        add("BM_hwy/dispatched", [&r](benchmark::State& s) { time_exp(s, r, hwy_poly); });
        add("BM_hwy_bits/dispatched", [&r](benchmark::State& s) { time_exp(s, r, hwy_bits); });
        add("BM_hwy_exp/dispatched", [&r](benchmark::State& s) { time_exp(s, r, hwy_contrib); });
        add("BM_hwy_scalef/dispatched", [&r](benchmark::State& s) { time_exp(s, r, hwy_scalef); });
        if (!cpu_has_avx2_fma()) continue;
        add("BM_bound/avx2", [&r](benchmark::State& s) { time_read(s, r, hand_avx2::read_sum); });
        add("BM_hand/avx2", [&r](benchmark::State& s) { time_exp(s, r, hand_avx2::exp_sum); });
        if (!hwy_avx2_available()) continue;
        add("BM_hwy/avx2", [&r](benchmark::State& s) {
            const hwy_targets_scope only(HWY_AVX2);
            if (hwy_dispatched() != HWY_AVX2) return s.SkipWithError("Highway did not dispatch to AVX2");
            time_exp(s, r, hwy_poly);
        });
        add("BM_hwy_bits/avx2", [&r](benchmark::State& s) {
            const hwy_targets_scope only(HWY_AVX2);
            if (hwy_dispatched() != HWY_AVX2) return s.SkipWithError("Highway did not dispatch to AVX2");
            time_exp(s, r, hwy_bits);
        });
        add("BM_hwy_exp/avx2", [&r](benchmark::State& s) {
            const hwy_targets_scope only(HWY_AVX2);
            if (hwy_dispatched() != HWY_AVX2) return s.SkipWithError("Highway did not dispatch to AVX2");
            time_exp(s, r, hwy_contrib);
        });
    }
}

}  // namespace dispatch_bench

int main(int argc, char** argv) {
    namespace db = dispatch_bench;
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

    std::vector<std::unique_ptr<db::row>> rows;
    for (std::size_t v : {std::size_t{512}, std::size_t{32000}, std::size_t{151936}})
        rows.push_back(std::make_unique<db::row>(v));

#if defined(__AVX__)
    benchmark::AddCustomContext("baseline_build", "no: compiled with AVX enabled (-march?); not the intended setup");
#else
    benchmark::AddCustomContext("baseline_build", "yes (no AVX at compile time)");
#endif
    benchmark::AddCustomContext("hand_dispatched", db::hand_dispatch().isa);
    benchmark::AddCustomContext("hwy_version", std::to_string(HWY_MAJOR) + "." + std::to_string(HWY_MINOR) + "." +
                                                   std::to_string(HWY_PATCH));
    benchmark::AddCustomContext("hwy_compiled_targets", db::compiled_hwy_targets());
    benchmark::AddCustomContext("hwy_dispatched", hwy::TargetName(db::hwy_dispatched()));
    benchmark::AddCustomContext("max_rel_err hand/dispatched", db::agreement(rows, db::hand_dispatched));
    benchmark::AddCustomContext("max_rel_err hwy/dispatched", db::agreement(rows, db::hwy_poly));
    benchmark::AddCustomContext("max_rel_err hwy_bits/dispatched", db::agreement(rows, db::hwy_bits));
    benchmark::AddCustomContext("max_rel_err hwy_exp/dispatched", db::agreement(rows, db::hwy_contrib));
    benchmark::AddCustomContext("max_rel_err hwy_scalef/dispatched", db::agreement(rows, db::hwy_scalef));
    if (db::cpu_has_avx2_fma())
        benchmark::AddCustomContext("max_rel_err hand/avx2", db::agreement(rows, db::hand_avx2::exp_sum));
    if (db::hwy_avx2_available()) {
        const db::hwy_targets_scope only(HWY_AVX2);
        benchmark::AddCustomContext("max_rel_err hwy/avx2 (" + std::string(hwy::TargetName(db::hwy_dispatched())) +
                                        ")",
                                    db::agreement(rows, db::hwy_poly));
        benchmark::AddCustomContext("max_rel_err hwy_bits/avx2", db::agreement(rows, db::hwy_bits));
        benchmark::AddCustomContext("max_rel_err hwy_exp/avx2", db::agreement(rows, db::hwy_contrib));
    }
    benchmark::AddCustomContext("hwy_dispatched_after_reset", hwy::TargetName(db::hwy_dispatched()));

    db::register_all(rows);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}

#endif  // HWY_ONCE
