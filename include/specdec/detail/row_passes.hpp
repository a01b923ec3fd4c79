/// \file
/// The vectorized passes over one row (Leviathan et al. 2023, Sec. 2.2 standardization, done
/// blockwise): maxima, exp-sums with and without lane sums, the residual sum, the checked
/// argmax, and the sums and scans of the inverse-CDF draws.
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

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

/// Fills `sums` with the sum of each block of `w` (vectorized per block, in double where the
/// block's float sum would overflow, see sum_floats_in_double; accumulated across blocks in
/// double) and returns the total.
inline double compute_block_sums(const Eigen::Ref<const Eigen::VectorXf>& w, std::vector<double>& sums) {
    const Eigen::Index n = w.size();
    const auto blocks = static_cast<std::size_t>((n + block_size - 1) / block_size);
    sums.resize(blocks);
    double total = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) {
        const Eigen::Index start = static_cast<Eigen::Index>(b) * block_size;
        const double bs = sum_floats_in_double(w.data() + start, std::min(block_size, n - start));
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
        const double gs = static_cast<double>(sum_floats(w + k, group));
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

/// Σ exp((z_k − m) inv_t) over len floats with z_k <= m (or −Inf), the exponentials written to
/// out: one vectorized pass, four accumulators for instruction-level parallelism. A NaN among
/// the z_k makes the sum NaN; −Inf gives exactly 0. `next_len` > 0: the row goes on for that
/// many floats after z + len, which are prefetched.
inline double exp_pass(const float* z, float* out, Eigen::Index len, float m, float inv_t, Eigen::Index next_len = 0) {
    Eigen::Index k = 0;
    double sum = 0.0;
#if SPECDEC_DETAIL_ISA == 2
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
    using packet = pk::packet;
    constexpr Eigen::Index width = pk::width;
    const packet_exp exp_of{m, inv_t};
    packet a0 = pk::pset1<packet>(0.0f), a1 = a0;
    for (; k + 2 * width <= len; k += 2 * width) {
        if (k % 16 == 0 && k < next_len) prefetch(z + len + k);
        const packet e0 = exp_of(pk::ploadu<packet>(z + k));
        const packet e1 = exp_of(pk::ploadu<packet>(z + k + width));
        pk::pstoreu(out + k, e0);
        pk::pstoreu(out + k + width, e1);
        a0 = pk::padd(a0, e0);
        a1 = pk::padd(a1, e1);
    }
    sum = static_cast<double>(pk::predux(pk::padd(a0, a1)));
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
#if SPECDEC_DETAIL_ISA == 2
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
    using packet = pk::packet;
    constexpr Eigen::Index width = pk::width;
    const packet_exp exp_of{m, inv_t};
    const packet pa = pk::pset1<packet>(a), pb = pk::pset1<packet>(b), zero = pk::pset1<packet>(0.0f);
    auto term = [&](const float* x, const float* y) {
        const packet scaled_q = pk::pmul(pb, pk::ploadu<packet>(y));
        return pk::pmax(zero, pk::psub(pk::pmul(exp_of(pk::ploadu<packet>(x)), pa), scaled_q));
    };
    packet a0 = zero, a1 = zero;
    for (; k + 2 * width <= len; k += 2 * width) {
        if (k % 16 == 0 && k < next_len) {
            prefetch(z + len + k);
            prefetch(q + len + k);
        }
        a0 = pk::padd(a0, term(z + k, q + k));
        a1 = pk::padd(a1, term(z + k + width, q + k + width));
    }
    sum = static_cast<double>(pk::predux(pk::padd(a0, a1)));
    for (; k < len; ++k) sum += static_cast<double>(std::max(0.0f, a * exp_of.one(z[k]) - b * q[k]));
#endif
    return sum;
}

/// Lane sums of one chunk of count <= exp_chunk floats at x: out[l] = x[l] + x[l + 16] + ...
/// (the layout of chunked_exp_pass's lane sums).
inline void chunk_lane_sums(const float* x, Eigen::Index count, float* out) {
    if (count == exp_chunk) {
        lane_sums_16(x, exp_chunk / chunk_lanes, out);
        return;
    }
    std::fill(out, out + chunk_lanes, 0.0f);
    for (Eigen::Index k = 0; k < count; ++k) out[k % chunk_lanes] += x[k];
}

/// What chunked_exp_pass reads and writes: the len floats at z (each <= m, or −Inf), the
/// scale inv_t, where the chunks' lane sums go (lanes); optionally a draft column block
/// q[0..len) checked in the same loop (its lane sums to q_lanes), the length of the row after
/// z + len (next_len, prefetched), and, with keep_exps, where the exponentials go (out).
struct exp_pass_args {
    const float* z = nullptr;
    Eigen::Index len = 0;
    float m = 0.0f;
    float inv_t = 1.0f;
    float* lanes = nullptr;
    const float* q = nullptr;
    float* q_lanes = nullptr;
    Eigen::Index next_len = 0;
    float* out = nullptr;
};

#if SPECDEC_DETAIL_ISA == 2
/// chunked_exp_pass with AVX-512: four exps of 16 per step, masked loads for the tail. (Longer
/// than most functions here: a chunk's loop stays whole, so that its accumulators live in
/// registers from the chunk's first element to its last.)
template <bool keep_exps>
chunked_exp_sums chunked_exp_pass_avx512(const exp_pass_args& args) {
    const float* const z = args.z;
    const Eigen::Index len = args.len, next_len = args.next_len;
    const float m = args.m, inv_t = args.inv_t;
    float* const lanes = args.lanes;
    const float* const q = args.q;
    float* const q_lanes = args.q_lanes;
    [[maybe_unused]] float* const out = args.out;
    chunked_exp_sums r;
    bool q_sign = false;
    double q_sum = 0.0;
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
    if (q != nullptr) {
        r.q_sign = q_sign;
        r.q_sum = q_sum;
    }
    return r;
}
#else
/// chunked_exp_pass with the packets of this copy (4 or 8 floats): two groups of 16 per step,
/// the tail padded with −Inf. (Longer than most functions here: a chunk's loop stays whole,
/// so that its accumulators live in registers from the chunk's first element to its last.)
template <bool keep_exps>
chunked_exp_sums chunked_exp_pass_packets(const exp_pass_args& args) {
    const float* const z = args.z;
    const Eigen::Index len = args.len, next_len = args.next_len;
    const float m = args.m, inv_t = args.inv_t;
    float* const lanes = args.lanes;
    const float* const q = args.q;
    float* const q_lanes = args.q_lanes;
    [[maybe_unused]] float* const out = args.out;
    chunked_exp_sums r;
    bool q_sign = false;
    double q_sum = 0.0;
    using packet = pk::packet;
    constexpr Eigen::Index width = pk::width;
    static_assert(chunk_lanes % width == 0);
    constexpr Eigen::Index per_group = chunk_lanes / width;  // packets per 16 consecutive floats
    const packet_exp exp_packet{m, inv_t};
    auto exp_of = [&](const float* x) { return exp_packet(pk::ploadu<packet>(x)); };
    packet q_bits = pk::pset1<packet>(0.0f);  // OR of q's entries, bit by bit (as the AVX-512 path)
    for (Eigen::Index start = 0, c = 0; start < len; start += exp_chunk, ++c) {
        const Eigen::Index end = std::min(len, start + exp_chunk);
        // Lane l of the chunk sums the elements at offsets l, l + 16, ... (as the AVX-512 path),
        // for the exponentials (a) and for q (b, its loads overlapping the exps).
        packet a[2][per_group], b[2][per_group];
        for (auto& row : a)
            for (packet& x : row) x = pk::pset1<packet>(0.0f);
        for (auto& row : b)
            for (packet& x : row) x = pk::pset1<packet>(0.0f);
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
                    pk::pstoreu(out + k + g * width, e0);
                    pk::pstoreu(out + k + chunk_lanes + g * width, e1);
                }
                a[0][g] = pk::padd(a[0][g], e0);
                a[1][g] = pk::padd(a[1][g], e1);
                if (q != nullptr) {
                    const packet v0 = pk::ploadu<packet>(q + k + g * width);
                    const packet v1 = pk::ploadu<packet>(q + k + chunk_lanes + g * width);
                    b[0][g] = pk::padd(b[0][g], v0);
                    b[1][g] = pk::padd(b[1][g], v1);
                    q_bits = pk::por(q_bits, pk::por(v0, v1));
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
                pk::pstore(e + g * width, eg);
                a[0][g] = pk::padd(a[0][g], eg);
            }
            if constexpr (keep_exps) std::copy(e, e + count, out + k);
        }
        float* l = lanes + c * chunk_lanes;
        for (Eigen::Index g = 0; g < per_group; ++g) {
            pk::pstoreu(l + g * width, pk::padd(a[0][g], a[1][g]));
            for (Eigen::Index i = 0; i < width; ++i) r.exp_sum += static_cast<double>(l[g * width + i]);
        }
        if (q != nullptr) {
            // The draft column's lane sums, with the elements the vector loop left (q_tail on).
            float* ql = q_lanes + c * chunk_lanes;
            for (Eigen::Index g = 0; g < per_group; ++g) pk::pstoreu(ql + g * width, pk::padd(b[0][g], b[1][g]));
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
        pk::pstore(bits, q_bits);
        for (const float v : bits) q_sign = q_sign || std::signbit(v);
    }
    if (q != nullptr) {
        r.q_sign = q_sign;
        r.q_sum = q_sum;
    }
    return r;
}
#endif

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
chunked_exp_sums chunked_exp_pass(const exp_pass_args& args) {
#if SPECDEC_DETAIL_ISA == 2
    return chunked_exp_pass_avx512<keep_exps>(args);
#else
    return chunked_exp_pass_packets<keep_exps>(args);
#endif
}

/// Maximum of a block: one vectorized pass with four independent accumulators (a single one
/// would wait on the latency of each max). A NaN in the block may or may not show in it, so
/// callers detect NaN through a sum over the block, which a NaN always turns into NaN.
inline float block_max(const Eigen::Ref<const Eigen::VectorXf>& z, Eigen::Index start, Eigen::Index len) {
    using packet = pk::packet;
    constexpr Eigen::Index width = pk::width;
    const float* x = z.data() + start;
    packet m0 = pk::pset1<packet>(-std::numeric_limits<float>::infinity()), m1 = m0, m2 = m0, m3 = m0;
    Eigen::Index k = 0;
    for (; k + 4 * width <= len; k += 4 * width) {
        m0 = pk::pmax(m0, pk::ploadu<packet>(x + k));
        m1 = pk::pmax(m1, pk::ploadu<packet>(x + k + width));
        m2 = pk::pmax(m2, pk::ploadu<packet>(x + k + 2 * width));
        m3 = pk::pmax(m3, pk::ploadu<packet>(x + k + 3 * width));
    }
    float m = pk::predux_max(pk::pmax(pk::pmax(m0, m1), pk::pmax(m2, m3)));
    for (; k < len; ++k) m = std::max(m, x[k]);
    return m;
}

/// Packets a max_and_sum pass keeps apart: accumulator a (0 <= a < 4) holds the maximum of the
/// packets at offsets a, a + 4, a + 8, ... (in packets), so lane l of it covers the elements
/// whose index is congruent to a·width + l modulo max_and_sum_group.
inline constexpr Eigen::Index max_and_sum_group = 4 * pk::width;

/// Maximum and sum of len floats in one vectorized pass (four max and two sum accumulators,
/// each element loaded once). The sum is there to detect NaN, which always makes it NaN; it
/// may also be NaN without one (+Inf next to -Inf, or sums that overflow both ways), so see
/// block_has_nan(). `acc` receives the four max accumulators (max_and_sum_group floats, see
/// there), which cover the first len − len % max_and_sum_group elements.
inline max_and_sum_result max_and_sum(const float* z, Eigen::Index len, float* acc) {
    using packet = pk::packet;
    constexpr Eigen::Index width = pk::width;
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    packet m0 = pk::pset1<packet>(neg_inf), m1 = m0, m2 = m0, m3 = m0;
    packet s0 = pk::pset1<packet>(0.0f), s1 = s0;
    Eigen::Index k = 0;
    for (; k + max_and_sum_group <= len; k += max_and_sum_group) {
        packet x0 = pk::ploadu<packet>(z + k), x1 = pk::ploadu<packet>(z + k + width);
        packet x2 = pk::ploadu<packet>(z + k + 2 * width), x3 = pk::ploadu<packet>(z + k + 3 * width);
        keep_in_register(x0);
        keep_in_register(x1);
        keep_in_register(x2);
        keep_in_register(x3);
        m0 = pk::pmax(m0, x0);
        m1 = pk::pmax(m1, x1);
        m2 = pk::pmax(m2, x2);
        m3 = pk::pmax(m3, x3);
        s0 = pk::padd(s0, pk::padd(x0, x1));
        s1 = pk::padd(s1, pk::padd(x2, x3));
    }
    pk::pstoreu(acc, m0);
    pk::pstoreu(acc + width, m1);
    pk::pstoreu(acc + 2 * width, m2);
    pk::pstoreu(acc + 3 * width, m3);
    float m = pk::predux_max(pk::pmax(pk::pmax(m0, m1), pk::pmax(m2, m3)));
    float sum = pk::predux(pk::padd(s0, s1));
    for (; k < len; ++k) {
        m = std::max(m, z[k]);
        sum += z[k];
    }
    return {m, sum};
}

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
#if SPECDEC_DETAIL_ISA >= 1 || defined(__AVX__)
    [[maybe_unused]] constexpr int predicate = C == group_compare::equal ? _CMP_EQ_OQ : _CMP_GT_OQ;
#endif
#if SPECDEC_DETAIL_ISA == 2
    static_assert(width == 16);
    return packets([pm = _mm512_set1_ps(m)](const float* p) {
        return _mm512_cmp_ps_mask(_mm512_loadu_ps(p), pm, predicate);
    });
#elif SPECDEC_DETAIL_ISA == 1
    static_assert(width == 8);
    return packets([pm = _mm256_set1_ps(m)](const float* p) {
        return _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), pm, predicate));
    });
#else
    // The portable copy: vector compares where the build's packets are x86 ones.
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
#endif
    std::uint64_t mask = 0;
    for (Eigen::Index l = 0; l < max_and_sum_group; ++l)
        mask |= static_cast<std::uint64_t>(C == group_compare::equal ? x[l] == m : x[l] > m) << l;
    return mask;
}

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
