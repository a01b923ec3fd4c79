#pragma once
/// \file
/// Reference points for benchmarks/verify_bench.cpp, run on the same inputs as specdec::verify:
///
///  * naive_verify / naive_sample: speculative verification and drafter-side sampling as they are
///    usually written: a full softmax of every row into freshly allocated std::vector<float>s
///    (scalar std::exp), std::sort of the whole vocabulary for top-k / top-p, the residual
///    max(0, p - q) normalized explicitly into a fresh vector, std::discrete_distribution to sample.
///    Correct (it is the same algorithm: accept with min(1, p/q), resample from
///    norm(max(0, p - q))), only not tuned.
///
///  * log_sum_exp / row_max: the work that no implementation can avoid: one vectorized pass per row
///    that must be normalized (the log-sum-exp of the row at temperature > 0; its maximum at
///    temperature 0). log_sum_exp_reading adds, in the same pass, the read of a draft column
///    that checking it requires (a reference for verify with its default draft-column check).
///    softmax_into: that pass storing its exps, then one scaling pass: the least work that writes
///    a normalized distribution (a reference for drafter-side sampling, which must write q).
///
///  * splitmix64: a std::uniform_random_bit_generator whose whole state is one seed, so that a
///    benchmark can restart the same random stream for every call at no cost.

#include <Eigen/Core>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <specdec/random.hpp>
#include <specdec/sampling.hpp>
#include <specdec/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace specdec_bench {

/// SplitMix64 (Steele, Lea & Flood 2014): 64 random bits per call; seeding is an assignment.
struct splitmix64 {
    using result_type = std::uint64_t;
    std::uint64_t state = 0;
    static constexpr result_type min() noexcept { return 0; }
    static constexpr result_type max() noexcept { return ~result_type{0}; }
    result_type operator()() noexcept {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
};

// ---------------------------------------------------------------------------------------------
// The bound: one vectorized pass over each row that has to be normalized.
// ---------------------------------------------------------------------------------------------

/// Floats per block of the log-sum-exp pass (8 KiB, stays in L1), and the blocks of a row of n.
inline constexpr Eigen::Index lse_block = 2048;
inline Eigen::Index lse_blocks(Eigen::Index n) { return (n + lse_block - 1) / lse_block; }

/// The base-2 reference of the exps of a block whose maximum is m: each is 2^(x·log2(e) - ref).
/// With AVX-512, or AVX2 with FMA, the bound uses specdec's own exp (exp2_avx512 / exp2_avx2 with
/// 1/T = 1), whose reference is exp2_reference's; with Eigen's exp of x - m, ref = m·log2(e).
inline double block_ref_log2(float m) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    return specdec::detail::exp2_reference(m, 1.0f).log2();
#else
    return static_cast<double>(m) * 1.4426950408889634;
#endif
}

#if defined(__AVX512F__)
/// Σ 2^(b_i·log2(e) - block_ref_log2(m)) (= Σ exp(b_i - m) up to the reference's rounding) over
/// len floats with b_i <= m (or -Inf), AVX-512, with specdec's own exp (exp2_avx512: eight
/// instructions per 16 floats, relative error at most 1.8e-7 for t near 0, growing to 4e-6 at
/// t = -125 from t's rounding; the terms that carry the sum are those near 0, so the sum is
/// accurate to float precision).
///
/// With `q` (ReadQ): also sums q[0..len) in the same loop into *q_sum, and prefetches q's next
/// block: the bytes a draft-column check must read, hidden behind the exp where compute allows.
/// With Write: also writes the len exps to out.
template <bool ReadQ = false, bool Write = false>
inline float exp_sum_avx512(const float* b, Eigen::Index len, float m, Eigen::Index next_len = 0,
                            const float* q = nullptr, double* q_sum = nullptr, float* out = nullptr) {
    const specdec::detail::SPECDEC_DETAIL_NS_AVX512::exp2_avx512 exp_of{m, 1.0f};  // its reference is block_ref_log2(m)
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0;
    Eigen::Index i = 0;
    for (; i + 64 <= len; i += 64) {
        if (i < next_len)  // the next block, prefetched while this one's exps run
            for (int line = 0; line < 64; line += 16) {
                __builtin_prefetch(b + len + i + line, 0, 3);
                if constexpr (ReadQ) __builtin_prefetch(q + len + i + line, 0, 3);
            }
        const __m512 e0 = exp_of(_mm512_loadu_ps(b + i)), e1 = exp_of(_mm512_loadu_ps(b + i + 16));
        const __m512 e2 = exp_of(_mm512_loadu_ps(b + i + 32)), e3 = exp_of(_mm512_loadu_ps(b + i + 48));
        if constexpr (Write) {
            _mm512_storeu_ps(out + i, e0);
            _mm512_storeu_ps(out + i + 16, e1);
            _mm512_storeu_ps(out + i + 32, e2);
            _mm512_storeu_ps(out + i + 48, e3);
        }
        s0 = _mm512_add_ps(s0, e0);
        s1 = _mm512_add_ps(s1, e1);
        s2 = _mm512_add_ps(s2, e2);
        s3 = _mm512_add_ps(s3, e3);
        if constexpr (ReadQ) {
            t0 = _mm512_add_ps(t0, _mm512_add_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(q + i + 16)));
            t1 = _mm512_add_ps(t1, _mm512_add_ps(_mm512_loadu_ps(q + i + 32), _mm512_loadu_ps(q + i + 48)));
        }
    }
    for (; i + 16 <= len; i += 16) {
        const __m512 e = exp_of(_mm512_loadu_ps(b + i));
        if constexpr (Write) _mm512_storeu_ps(out + i, e);
        s0 = _mm512_add_ps(s0, e);
        if constexpr (ReadQ) t0 = _mm512_add_ps(t0, _mm512_loadu_ps(q + i));
    }
    if (i < len) {
        const auto mask = static_cast<__mmask16>((1u << static_cast<unsigned>(len - i)) - 1u);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), mask, b + i);
        const __m512 e = exp_of(v);
        if constexpr (Write) _mm512_mask_storeu_ps(out + i, mask, e);
        s1 = _mm512_add_ps(s1, e);
        if constexpr (ReadQ) t1 = _mm512_add_ps(t1, _mm512_maskz_loadu_ps(mask, q + i));
    }
    if constexpr (ReadQ) {
        alignas(64) float q_lanes[16];
        _mm512_store_ps(q_lanes, _mm512_add_ps(t0, t1));
        for (float v : q_lanes) *q_sum += v;
    }
    alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12 warns falsely inside it)
    _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    float total = 0.0f;
    for (float v : lanes) total += v;
    return total;
}
#endif

/// log Σ exp(x_i) of n floats (n >= 1, no NaN, no +Inf; all -Inf gives -Inf); with ReadQ, also
/// the sum of q[0..n) into *q_sum, in the same loops.
///
/// Blockwise: the maximum of a block of 2048 floats (8 KiB, stays in L1), then Σ exp(x - max) of
/// the same block, four independent accumulators; blocks are combined by rescaling with one
/// scalar exp2 per block (by their references, block_ref_log2). Memory is streamed once; the
/// second read of a block hits L1, and the next block is prefetched during the exp-sum (as
/// specdec's own pass does, so that neither side waits on memory the other does not wait on).
/// The exp-sum is exp_sum_avx512 where AVX-512 is enabled, else Eigen's SIMD exp (AVX2 / SSE
/// packets).
///
/// With Write (`out`, and `block_max`: lse_blocks(n) floats): also writes the normalized distribution
/// exp(x_i) / Σ exp(x_j) to out, the least work that does so: the exps are stored by the same
/// pass (relative to their block's maximum, recorded in block_max), then one pass scales each
/// block by its factor. The distribution cannot be written before the normalizer is known, and
/// scaling stored exps costs less than computing them again.
template <bool ReadQ = false, bool Write = false>
inline float log_sum_exp_impl(const float* x, Eigen::Index n, const float* q = nullptr, double* q_sum = nullptr,
                              float* out = nullptr, float* block_max = nullptr) {
    namespace ei = Eigen::internal;
    using Packet = ei::packet_traits<float>::type;
    constexpr Eigen::Index L = ei::packet_traits<float>::size;
    constexpr Eigen::Index block = lse_block;
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();

    float run_max = neg_inf;
    double run_sum = 0.0, run_ref = 0.0;
    for (Eigen::Index start = 0; start < n; start += block) {
        const float* b = x + start;
        const Eigen::Index len = std::min(block, n - start);
        const Eigen::Index vec_end = len - len % (4 * L);

        // Pass 1: block maximum.
        Packet m0 = ei::pset1<Packet>(neg_inf), m1 = m0, m2 = m0, m3 = m0;
        for (Eigen::Index i = 0; i < vec_end; i += 4 * L) {
            m0 = ei::pmax(m0, ei::ploadu<Packet>(b + i));
            m1 = ei::pmax(m1, ei::ploadu<Packet>(b + i + L));
            m2 = ei::pmax(m2, ei::ploadu<Packet>(b + i + 2 * L));
            m3 = ei::pmax(m3, ei::ploadu<Packet>(b + i + 3 * L));
        }
        float m = ei::predux_max(ei::pmax(ei::pmax(m0, m1), ei::pmax(m2, m3)));
        for (Eigen::Index i = vec_end; i < len; ++i) m = std::max(m, b[i]);
        if constexpr (Write) block_max[start / block] = m;
        if (m == neg_inf) {  // the block contributes nothing (but q's block is still read)
            if constexpr (ReadQ) *q_sum += Eigen::Map<const Eigen::VectorXf>(q + start, len).sum();
            if constexpr (Write) std::fill(out + start, out + start + len, 0.0f);
            continue;
        }

        // Pass 2: Σ exp(x - m) over the block (exp(-inf) == 0).
#if defined(__AVX512F__)
        const float s = exp_sum_avx512<ReadQ, Write>(b, len, m, std::min(block, n - start - len),
                                                     ReadQ ? q + start : nullptr, q_sum, Write ? out + start : nullptr);
#else
#if defined(__AVX2__) && defined(__FMA__)
        // AVX2 and FMA: specdec's own exp (the same instructions as the AVX-512 one, 8 floats).
        const specdec::detail::SPECDEC_DETAIL_NS_AVX2::exp2_avx2 exp2_of{m, 1.0f};
        const auto exp_of = [&](const float* p) { return exp2_of(ei::ploadu<Packet>(p)); };
#else
        // exp(max(x − m, −87)): as in specdec, pexp is kept away from subnormal results (at its
        // clamp), which x86 cores compute slowly; the bound must not be slowed by them either.
        const Packet vm = ei::pset1<Packet>(m);
        const Packet low = ei::pset1<Packet>(-87.0f);
        const auto exp_of = [&](const float* p) {
            return ei::pexp(ei::pmax(ei::psub(ei::ploadu<Packet>(p), vm), low));
        };
#endif
        Packet s0 = ei::pset1<Packet>(0.0f), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0;
        const Eigen::Index next_len = std::min(block, n - start - len);
        [[maybe_unused]] const float* qb = ReadQ ? q + start : nullptr;
        for (Eigen::Index i = 0; i < vec_end; i += 4 * L) {
            if (i < next_len)
                for (Eigen::Index line = 0; line < 4 * L; line += 16) {
                    __builtin_prefetch(b + len + i + line, 0, 3);
                    if constexpr (ReadQ) __builtin_prefetch(qb + len + i + line, 0, 3);
                }
            const Packet e0 = exp_of(b + i);
            const Packet e1 = exp_of(b + i + L);
            const Packet e2 = exp_of(b + i + 2 * L);
            const Packet e3 = exp_of(b + i + 3 * L);
            if constexpr (Write) {
                ei::pstoreu(out + start + i, e0);
                ei::pstoreu(out + start + i + L, e1);
                ei::pstoreu(out + start + i + 2 * L, e2);
                ei::pstoreu(out + start + i + 3 * L, e3);
            }
            s0 = ei::padd(s0, e0);
            s1 = ei::padd(s1, e1);
            s2 = ei::padd(s2, e2);
            s3 = ei::padd(s3, e3);
            if constexpr (ReadQ) {
                t0 = ei::padd(t0, ei::padd(ei::ploadu<Packet>(qb + i), ei::ploadu<Packet>(qb + i + L)));
                t1 = ei::padd(t1, ei::padd(ei::ploadu<Packet>(qb + i + 2 * L), ei::ploadu<Packet>(qb + i + 3 * L)));
            }
        }
        float s = ei::predux(ei::padd(ei::padd(s0, s1), ei::padd(s2, s3)));
        for (Eigen::Index i = vec_end; i < len; ++i) {
            const float e = std::exp(b[i] - m);
            if constexpr (Write) out[start + i] = e;
            s += e;
        }
        if constexpr (ReadQ) {
            *q_sum += ei::predux(ei::padd(t0, t1));
            for (Eigen::Index i = vec_end; i < len; ++i) *q_sum += qb[i];
        }
#endif

        // Blocks are combined in base 2, by their references (block_ref_log2).
        const double ref = block_ref_log2(m);
        if (m > run_max) {
            run_sum = run_max == neg_inf ? s : run_sum * std::exp2(run_ref - ref) + s;
            run_max = m;
            run_ref = ref;
        } else {
            run_sum += s * std::exp2(ref - run_ref);
        }
    }
    if (run_max == neg_inf) return neg_inf;
    if constexpr (Write)  // the scaling pass
        for (Eigen::Index start = 0; start < n; start += block) {
            const float m = block_max[start / block];
            if (m == neg_inf) continue;
            const auto f = static_cast<float>(std::exp2(block_ref_log2(m) - run_ref) / run_sum);
            Eigen::Map<Eigen::VectorXf>(out + start, std::min(block, n - start)) *= f;
        }
    return static_cast<float>(run_ref * 0.6931471805599453 + std::log(run_sum));
}

/// log Σ exp(x_i) of n floats, as log_sum_exp_impl documents.
inline float log_sum_exp(const float* x, Eigen::Index n) { return log_sum_exp_impl<false>(x, n); }

/// softmax(x) of n floats into out, as log_sum_exp_impl documents (block_max: lse_blocks(n)
/// floats): the least work that writes a normalized distribution, as a drafter must.
inline void softmax_into(const float* x, float* out, Eigen::Index n, float* block_max) {
    log_sum_exp_impl<false, true>(x, n, nullptr, nullptr, out, block_max);
}

/// A row's log-sum-exp and the sum of a draft column q of the same length, in one fused pass
/// (q's loads ride along the exp loop, q prefetched as the row is): the least work of a pass
/// that normalizes the row and reads every entry of q, as a draft-column check must.
struct log_sum_exp_and_sum {
    float log_sum_exp;
    double q_sum;
};
inline log_sum_exp_and_sum log_sum_exp_reading(const float* x, const float* q, Eigen::Index n) {
    double q_sum = 0.0;
    const float l = log_sum_exp_impl<true>(x, n, q, &q_sum);
    return {l, q_sum};
}

/// Largest of n floats (n >= 1): the one pass a temperature-0 row needs.
inline float row_max(const float* x, Eigen::Index n) { return Eigen::Map<const Eigen::VectorXf>(x, n).maxCoeff(); }

// ---------------------------------------------------------------------------------------------
// The naive implementation.
// ---------------------------------------------------------------------------------------------

/// Softmax of one row of logits with temperature, top-k, top-p and min-p (in that order, ties at
/// the top-k / top-p boundary kept, as specdec::standardize defines them), into a fresh vector.
inline std::vector<float> naive_standardize(const float* z, std::size_t n, const specdec::sampling_config& s) {
    std::vector<float> p(n, 0.0f);
    if (s.temperature == 0.0f) {  // greedy: the argmax (lowest index on ties) as a distribution
        std::size_t best = 0;
        for (std::size_t i = 1; i < n; ++i)
            if (z[i] > z[best]) best = i;
        p[best] = 1.0f;
        return p;
    }
    const float m = *std::max_element(z, z + n);
    for (std::size_t i = 0; i < n; ++i) p[i] = std::exp((z[i] - m) / s.temperature);

    if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < n) {
        std::vector<float> sorted(z, z + n);
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        const float threshold = sorted[static_cast<std::size_t>(s.top_k) - 1];
        for (std::size_t i = 0; i < n; ++i)
            if (z[i] < threshold) p[i] = 0.0f;
    }
    if (s.top_p < 1.0f) {
        std::vector<float> sorted(p);
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        double total = 0.0;
        for (float v : sorted) total += v;
        const double need = static_cast<double>(s.top_p) * total;
        double acc = 0.0;
        float threshold = 0.0f;
        for (float v : sorted) {
            if (v <= 0.0f) break;
            acc += v;
            threshold = v;
            if (acc >= need) break;
        }
        for (std::size_t i = 0; i < n; ++i)
            if (p[i] < threshold) p[i] = 0.0f;
    }
    if (s.min_p > 0.0f) {  // the largest weight is exp(0) == 1
        for (std::size_t i = 0; i < n; ++i)
            if (p[i] < s.min_p) p[i] = 0.0f;
    }
    double sum = 0.0;
    for (float v : p) sum += v;
    for (float& v : p) v = static_cast<float>(v / sum);
    return p;
}

struct naive_result {
    std::size_t accepted = 0;
    specdec::token_id next_token = 0;
};

template <class Rng>
int naive_discrete(const std::vector<float>& w, Rng& rng) {
    std::discrete_distribution<int> d(w.begin(), w.end());
    return d(rng);
}

/// Speculative verification (Leviathan et al. 2023, Alg. 1) written plainly.
/// \param z       V x (γ+1) target logits
/// \param tokens  x_1..x_γ
/// \param q       V x γ draft distributions, or nullptr for point-mass drafts (q_i = δ(x_i))
/// The acceptance tests draw r_i with specdec::uniform01 in order (the same test r·q(x) < p(x) as
/// specdec's token scheme, so both see the same accept/reject decisions from the same seed); the
/// final token comes from std::discrete_distribution.
template <class Rng>
naive_result naive_verify(const Eigen::MatrixXf& z, std::span<const specdec::token_id> tokens, const Eigen::MatrixXf* q,
                          const specdec::sampling_config& s, Rng& rng) {
    const auto vocab = static_cast<std::size_t>(z.rows());
    const std::size_t n = tokens.size();
    // Softmax of every row up front.
    std::vector<std::vector<float>> p;
    p.reserve(n + 1);
    for (std::size_t j = 0; j <= n; ++j) p.push_back(naive_standardize(z.col(static_cast<Eigen::Index>(j)).data(), vocab, s));

    for (std::size_t i = 0; i < n; ++i) {
        const auto x = static_cast<std::size_t>(tokens[i]);
        const auto col = static_cast<Eigen::Index>(i);
        const double qx = q != nullptr ? static_cast<double>((*q)(static_cast<Eigen::Index>(x), col)) : 1.0;
        const double px = p[i][x];
        const double r = specdec::uniform01(rng);
        if (qx > 0.0 && r * qx < px) continue;  // accepted with probability min(1, p/q)

        // Rejected: residual max(0, p - q), normalized into a fresh vector.
        std::vector<float> residual(vocab);
        double mass = 0.0;
        for (std::size_t k = 0; k < vocab; ++k) {
            const float qk = q != nullptr ? (*q)(static_cast<Eigen::Index>(k), col) : (k == x ? 1.0f : 0.0f);
            residual[k] = std::max(0.0f, p[i][k] - qk);
            mass += residual[k];
        }
        if (!(mass > 1e-6)) return {i, static_cast<specdec::token_id>(naive_discrete(p[i], rng))};  // p ≈ q
        std::vector<float> normalized(vocab);
        for (std::size_t k = 0; k < vocab; ++k) normalized[k] = static_cast<float>(residual[k] / mass);
        return {i, static_cast<specdec::token_id>(naive_discrete(normalized, rng))};
    }
    return {n, static_cast<specdec::token_id>(naive_discrete(p[n], rng))};  // all accepted: bonus token
}

/// Drafter-side sampling written plainly: softmax into a fresh vector, std::discrete_distribution.
template <class Rng>
specdec::token_id naive_sample(const float* z, std::size_t n, const specdec::sampling_config& s, Rng& rng) {
    return static_cast<specdec::token_id>(naive_discrete(naive_standardize(z, n, s), rng));
}

}  // namespace specdec_bench
