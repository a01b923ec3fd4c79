/// \file
/// Inverse-CDF draws from a prepared target row: by blocks, then by the chunk and lane sums the
/// normalizing pass kept (with AVX-512, several draws side by side with no branch on the uniforms).
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

template <class Fill>
Eigen::Index draw_by_blocks(const double* sums, Eigen::Index nb, Eigen::Index n, double total, double u, float* buf,
                            Fill&& fill, const double* prefix = nullptr) {
    const double target = u * total;
    double acc = 0.0;
    Eigen::Index b = 0;
    if (prefix != nullptr) {
        b = std::min<Eigen::Index>(nb - 1, std::upper_bound(prefix, prefix + nb, target) - prefix);
        acc = b > 0 ? prefix[b - 1] : 0.0;
    } else {
        while (b + 1 < nb && acc + sums[b] <= target) acc += sums[b++];
    }
    Eigen::Index last_block = -1;
    for (Eigen::Index c = b; c < nb; ++c) {
        if (c > b && !(sums[c] > 0.0)) continue;
        const Eigen::Index len = block_len(n, c);
        bool any = false;
        for (Eigen::Index off = 0; off < len; off += exp_chunk) {
            const Eigen::Index cl = std::min(exp_chunk, len - off);
            fill(c, off, cl, buf + off);
            Eigen::Index chunk_last = -1;
            const Eigen::Index k = scan_block(buf + off, cl, acc, target, chunk_last);
            if (k >= 0) return c * row_block + off + k;
            any = any || chunk_last >= 0;
        }
        if (any) last_block = c;
    }
    // Rounding overshoot: the last element with weight, its block refilled into buf.
    for (Eigen::Index c = last_block >= 0 ? last_block : b - 1; c >= 0; --c) {
        if (c != last_block && !(sums[c] > 0.0)) continue;
        const Eigen::Index len = block_len(n, c);
        fill(c, 0, len, buf);
        for (Eigen::Index k = len - 1; k >= 0; --k)
            if (buf[k] > 0.0f) return c * row_block + k;
    }
    SPECDEC_ASSERT(false, "draw_by_blocks: all weights are zero");
    return 0;
}

/// Over w[0..count): the first i at which acc + w[0] + ... + w[i] exceeds target (w[i] > 0),
/// with the weights before it added to acc; when none does (rounding overshoot), the last i
/// with weight and target set to +Inf, so that the levels below take their last element with
/// weight too. -1 when every weight is 0.
inline int pick_crossing(const double* w, int count, double& acc, double& target) {
    int last = -1;
    for (int i = 0; i < count; ++i) {
        if (!(w[i] > 0.0)) continue;
        if (acc + w[i] > target) return i;
        acc += w[i];
        last = i;
    }
    target = std::numeric_limits<double>::infinity();
    return last;
}

/// An element of a row and the weight it was drawn with.
struct weighted_index {
    Eigen::Index index = 0;
    double weight = 0.0;  ///< p(index) as the draw computed it
};

/// The chunk and lane levels of a lane-order draw: over `chunks` chunks whose lane sums are
/// at lanes[c·chunk_lanes + l], picks the chunk, then the lane, where acc + the running weight
/// crosses target (see pick_crossing, which updates both); returns the lane's first element,
/// c·exp_chunk + l, or -1 when no lane has weight.
inline Eigen::Index pick_lane(const float* lanes, Eigen::Index chunks, double& acc, double& target) {
    static_assert(chunks_per_block <= chunk_lanes);  // a block's chunk sums fit in w
    double w[chunk_lanes];
    for (Eigen::Index c = 0; c < chunks; ++c)
        w[c] = sum_floats(lanes + c * chunk_lanes, chunk_lanes);
    const int c = pick_crossing(w, static_cast<int>(chunks), acc, target);
    if (c < 0) return -1;
    for (Eigen::Index l = 0; l < chunk_lanes; ++l) w[l] = lanes[c * chunk_lanes + l];
    const int l = pick_crossing(w, static_cast<int>(chunk_lanes), acc, target);
    return l < 0 ? -1 : static_cast<Eigen::Index>(c) * exp_chunk + l;
}

/// Index of the first of the n non-decreasing values p[0..n) that exceeds t, n when none does:
/// a binary search whose steps depend on n only (a conditional move each, no branch on the
/// data: a draw's uniform makes such branches mispredict half the time).
inline Eigen::Index first_above(const double* p, Eigen::Index n, double t) {
    const double* base = p;
    for (Eigen::Index len = n; len > 1;) {
        const Eigen::Index half = len / 2;
        base = base[half] <= t ? base + half : base;
        len -= half;
    }
    return (base - p) + (*base <= t ? 1 : 0);
}

#if SPECDEC_DETAIL_ISA == 2
/// pick_crossing over 16 weights in two vectors of doubles (lanes past the count hold 0): the
/// first i with w[i] > 0 and acc + w[0] + ... + w[i] > target, found with no branch (prefix
/// sums in three shift-and-add steps per vector, one compare); acc becomes acc + w[0] + ... +
/// w[i − 1]. -1 when none crosses (rounding overshoot): the caller then takes the scalar path,
/// which handles it. The sums are those of pick_crossing up to the order of the additions.
SPECDEC_ALWAYS_INLINE int crossing_16(__m512d lo, __m512d hi, double& acc, double target) {
    const __m512i zero = _mm512_setzero_si512();
    auto scan = [&](__m512d x) {  // inclusive prefix sums of 8 doubles
        x = _mm512_add_pd(x, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(x), zero, 7)));
        x = _mm512_add_pd(x, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(x), zero, 6)));
        return _mm512_add_pd(x, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(x), zero, 4)));
    };
    const __m512d plo = _mm512_add_pd(scan(lo), _mm512_set1_pd(acc));
    const __m512d phi = _mm512_add_pd(scan(hi), _mm512_permutexvar_pd(_mm512_set1_epi64(7), plo));
    const __m512d t = _mm512_set1_pd(target), none = _mm512_setzero_pd();
    const unsigned below = _mm512_mask_cmp_pd_mask(_mm512_cmp_pd_mask(lo, none, _CMP_GT_OQ), plo, t, _CMP_GT_OQ);
    const unsigned above = _mm512_mask_cmp_pd_mask(_mm512_cmp_pd_mask(hi, none, _CMP_GT_OQ), phi, t, _CMP_GT_OQ);
    const unsigned mask = below | (above << 8);
    if (mask == 0) return -1;
    const int i = std::countr_zero(mask);
    // Exclusive prefix sums (acc, P_0, ..., P_14): element i is what precedes w[i].
    const __m512i elo = _mm512_alignr_epi64(_mm512_castpd_si512(plo), _mm512_castpd_si512(_mm512_set1_pd(acc)), 7);
    const __m512i ehi = _mm512_alignr_epi64(_mm512_castpd_si512(phi), _mm512_castpd_si512(plo), 7);
    const __m512i at = _mm512_set1_epi64(i);
    acc = _mm512_cvtsd_f64(_mm512_permutex2var_pd(_mm512_castsi512_pd(elo), at, _mm512_castsi512_pd(ehi)));
    return i;
}

/// crossing_16 over 16 floats, widened to double.
SPECDEC_ALWAYS_INLINE int crossing_16(__m512 w, double& acc, double target) {
    return crossing_16(_mm512_cvtps_pd(_mm512_castps512_ps256(w)),
                       _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1))), acc, target);
}

/// The sums of a block's chunks (each the sum of its 16 lane sums, see chunked_exp_pass) in
/// one vector of 8 doubles, from registers: halves added, then pairwise horizontal adds (the
/// lane sums of chunks past the end of the row read as 0).
SPECDEC_ALWAYS_INLINE __m512d chunk_sums_avx512(const float* lanes, Eigen::Index chunks) {
    static_assert(chunks_per_block == 8 && chunk_lanes == 16);
    __m256 h[8];
    for (int c = 0; c < 8; ++c) {
        const __m512 v = _mm512_maskz_loadu_ps(c < chunks ? 0xFFFF : 0, lanes + c * chunk_lanes);
        const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        h[c] = _mm256_add_ps(_mm512_castps512_ps256(v), high);
    }
    const __m256 h01 = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    const __m256 h45 = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
    return _mm512_cvtps_pd(
        _mm256_add_ps(_mm256_permute2f128_ps(h01, h45, 0x20), _mm256_permute2f128_ps(h01, h45, 0x31)));
}

/// K draws of draw_plain's walk at once (uniforms u[0..K)), for rows whose pass kept no
/// exponentials, with no branch on the uniforms, stage by stage (block, chunk, lane, element)
/// so that the K independent chains of loads and arithmetic overlap. out[k].index is -1 where
/// rounding overshot at the chunk, lane or element level (the scalar walk then redoes that draw).
template <int K>
void draw_plain_avx512(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, const verify_buffers& ws,
                       const double* prefix, const double* u, weighted_index* out) {
    const Eigen::Index n = logits.rows(), nb = blocks_of(n);
    const std::size_t base = block_base(n, r.column);
    const double* mass = ws.block_mass.data() + base;
    constexpr auto count = static_cast<std::size_t>(K);
    Eigen::Index b[count], len[count], first[count];  // first: the lane's first element, -1 on overshoot
    double target[count], acc[count], scale[count];
    for (int k = 0; k < K; ++k) {  // the block: binary search on the running block masses
        target[k] = u[k] * prefix[nb - 1];
        b[k] = std::min<Eigen::Index>(nb - 1, first_above(prefix, nb, target[k]));
        while (b[k] > 0 && !(mass[b[k]] > 0.0)) --b[k];  // rounding overshoot past the last block with mass
        scale[k] = ws.scale[base + static_cast<std::size_t>(b[k])];
        target[k] = (target[k] - (b[k] > 0 ? prefix[b[k] - 1] : 0.0)) / scale[k];
        acc[k] = 0.0;
        len[k] = block_len(n, b[k]);
        out[k].index = -1;
    }
    for (int k = 0; k < K; ++k) {  // the chunk, then the lane
        const float* lanes = chunk_data(ws, n, r.column, b[k]);
        const int c = crossing_16(chunk_sums_avx512(lanes, chunks_of(len[k])), _mm512_setzero_pd(), acc[k], target[k]);
        const int l = c < 0 ? -1 : crossing_16(_mm512_loadu_ps(lanes + c * chunk_lanes), acc[k], target[k]);
        first[k] = l < 0 ? -1 : static_cast<Eigen::Index>(c) * exp_chunk + l;
    }
    // The lane's 16 elements (past the end of the row: −Inf, whose exp is 0), gathered.
    static_assert(chunk_lanes == 16);  // a lane's elements lie 16 floats apart
    const __m512i offsets = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    const float* z = logits.col(static_cast<Eigen::Index>(r.column)).data();
    for (int k = 0; k < K; ++k) {
        if (first[k] < 0) continue;
        const auto left = static_cast<int>(len[k] - first[k]);  // elements of the block from the lane's first on
        const __mmask16 inside = _mm512_cmplt_epi32_mask(offsets, _mm512_set1_epi32(left));
        const __m512 x = _mm512_mask_i32gather_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), inside,
                                                  offsets, z + b[k] * row_block + first[k], 4);
        const __m512 e = exp2_avx512{ws.block_max[base + static_cast<std::size_t>(b[k])], r.inv_t}(x);
        const int i = crossing_16(e, acc[k], target[k]);
        if (i < 0) continue;
        alignas(64) float ev[chunk_lanes];
        _mm512_store_ps(ev, e);
        const float weight = ev[i] * static_cast<float>(scale[k]);
        out[k] = {b[k] * row_block + first[k] + i * chunk_lanes, static_cast<double>(weight)};
    }
}
#endif

/// The 16 exponentials of the lane whose first element is `first` (offset in block b) of a
/// plain row, recomputed through the pass's own exp (0 past the end of the row): the floats
/// its lane sum was made of, before the block's scale.
inline void recompute_lane(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                           const verify_buffers& ws, Eigen::Index b, Eigen::Index first, float* e) {
    const Eigen::Index n = logits.rows(), len = block_len(n, b);
    const float* z = logits.col(static_cast<Eigen::Index>(r.column)).data() + b * row_block;
    alignas(64) float in[chunk_lanes];
    for (Eigen::Index k = 0; k < chunk_lanes; ++k) {
        const Eigen::Index at = first + k * chunk_lanes;
        in[k] = at < len ? z[at] : -std::numeric_limits<float>::infinity();
    }
    exp_lane(in, e, ws.block_max[block_base(n, r.column) + static_cast<std::size_t>(b)], r.inv_t);
}

/// One inverse-CDF draw from a plain row with uniform u, in (block, chunk, lane, element)
/// order: the block by binary search on the running block masses `prefix`, the 256-token chunk
/// and then the lane by the lane sums the normalizing pass kept (see chunked_exp_pass), and
/// finally one of the lane's 16 elements, whose exponentials are the only ones recomputed (or
/// read, on short rows whose pass kept them). Any fixed order of the elements gives a draw
/// from p; this one costs a binary search, 16 exps and about 40 adds per draw. On long rows
/// with AVX-512 the walk has no branch on u (draw_plain_avx512): a draw's branches mispredict
/// about half the time, and a proposal's loads wait behind the mispredictions of the one before
/// (on fresh uniforms: 65 against 85 ns a draw at V = 32000, 76 against 109 ns at V = 151936).
/// Short rows, whose exponentials are kept, keep the scalar walk, which is as fast there.
inline weighted_index draw_plain_scalar(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                                        const verify_buffers& ws, const double* prefix, double u) {
    const Eigen::Index n = logits.rows(), nb = blocks_of(n);
    const std::size_t base = block_base(n, r.column);
    const double* mass = ws.block_mass.data() + base;
    double target = u * prefix[nb - 1];
    Eigen::Index b = std::min<Eigen::Index>(nb - 1, std::upper_bound(prefix, prefix + nb, target) - prefix);
    while (b > 0 && !(mass[b] > 0.0)) --b;  // rounding overshoot past the last block with mass
    const double scale = ws.scale[base + static_cast<std::size_t>(b)];
    // From here on, weights are the block's exp((z − ref_b) / T), before scaling.
    target = (target - (b > 0 ? prefix[b - 1] : 0.0)) / scale;
    double acc = 0.0;
    const Eigen::Index len = block_len(n, b), chunks = chunks_of(len);
    const Eigen::Index first = pick_lane(chunk_data(ws, n, r.column, b), chunks, acc, target);
    SPECDEC_ASSERT(first >= 0, "draw_plain: a block with mass has no lane with weight");
    // The lane's elements (0 past the end of the row): kept by the pass, or recomputed through
    // the pass's own exp.
    alignas(64) float e[chunk_lanes];
    if (r.exps) {
        const float* kept = ws.rows.col(static_cast<Eigen::Index>(r.column)).data() + b * row_block;
        for (Eigen::Index k = 0; k < chunk_lanes; ++k) {
            const Eigen::Index at = first + k * chunk_lanes;
            e[k] = at < len ? kept[at] : 0.0f;
        }
    } else {
        recompute_lane(r, logits, ws, b, first, e);
    }
    double w[chunk_lanes];
    for (Eigen::Index k = 0; k < chunk_lanes; ++k) w[k] = e[k];
    const int k = pick_crossing(w, static_cast<int>(chunk_lanes), acc, target);
    SPECDEC_ASSERT(k >= 0, "draw_plain: a lane with weight has no element with weight");
    return {b * row_block + first + k * chunk_lanes, static_cast<double>(e[k] * static_cast<float>(scale))};
}

/// See draw_plain_scalar; on long rows with AVX-512, draw_plain_avx512 (the scalar walk only
/// where rounding overshoots).
inline weighted_index draw_plain(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                                 const verify_buffers& ws, const double* prefix, double u) {
#if SPECDEC_DETAIL_ISA == 2
    if (!r.exps) {
        weighted_index y;
        draw_plain_avx512<1>(r, logits, ws, prefix, &u, &y);
        if (y.index >= 0) return y;
    }
#endif
    return draw_plain_scalar(r, logits, ws, prefix, u);
}

/// Rejection-sampling proposals of the residual are made this many at a time on plain rows
/// that keep no exponentials (more than kept_row_limit tokens): the group's uniforms are drawn
/// first, two a proposal in the order one-by-one proposals would draw them, then its draws
/// (draw_plain_group: their loads and arithmetic overlap), then its tests in order; the first
/// accepted proposal is returned and the rest of the group's uniforms go unused. The tokens are
/// those one-by-one proposals would give from the same uniforms; the i.i.d. proposals tested in
/// order give the residual's distribution however many are made (see sample_residual).
inline constexpr int proposal_group = 4;

/// After a rejection of a point-mass draft (q = δ(x)) on a long plain row, the residual, p with
/// p(x) lowered, is drawn by at most this many proposals from p (two groups; each accepted
/// unless it is x) before the exact draw from the block masses (see sample_residual).
inline constexpr Eigen::Index point_mass_proposals = 2 * proposal_group;

/// draw_plain with each of the uniforms u[0..proposal_group) into out[..] (a plain row that
/// keeps no exponentials); with AVX-512 the draws run side by side (draw_plain_avx512).
inline void draw_plain_group(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                             const verify_buffers& ws, const double* prefix, const double* u, weighted_index* out) {
#if SPECDEC_DETAIL_ISA == 2
    draw_plain_avx512<proposal_group>(r, logits, ws, prefix, u, out);
    for (int k = 0; k < proposal_group; ++k)
        if (out[k].index < 0) out[k] = draw_plain_scalar(r, logits, ws, prefix, u[k]);
#else
    for (int k = 0; k < proposal_group; ++k) out[k] = draw_plain(r, logits, ws, prefix, u[k]);
#endif
}

/// max(0, a·p − b·q) over block blk of a row of n tokens whose values are in ws.rows (see

/// Running sums of row r's block masses into ws.sums (for draw_plain); returns the total.
inline const double* block_prefix(const target_row& r, Eigen::Index vocab, verify_buffers& ws) {
    const Eigen::Index nb = blocks_of(vocab);
    const double* mass = ws.block_mass.data() + block_base(vocab, r.column);
    ws.sums.resize(static_cast<std::size_t>(nb));
    double acc = 0.0;
    for (Eigen::Index b = 0; b < nb; ++b) ws.sums[static_cast<std::size_t>(b)] = acc += mass[b];
    return ws.sums.data();
}

/// Draws a token from p itself (after full acceptance, or as the fallback of an empty
/// residual): plain rows by draw_plain, stored rows blockwise.
inline token_id sample_target(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits,
                              verify_buffers& ws, double u) {
    if (r.kind == target_row::form::greedy) return static_cast<token_id>(r.argmax);
    const Eigen::Index n = logits.rows(), nb = blocks_of(n);
    const double* prefix = block_prefix(r, n, ws);
    if (r.kind == target_row::form::plain) return static_cast<token_id>(draw_plain(r, logits, ws, prefix, u).index);
    const double* mass = ws.block_mass.data() + block_base(n, r.column);
    return static_cast<token_id>(draw_by_blocks(
        mass, nb, n, prefix[nb - 1], u, ws.block.data(),
        [&](Eigen::Index b, Eigen::Index off, Eigen::Index len, float* out) { fill_block(r, logits, ws, b, off, len, out); },
        prefix));
}

/// sample_target with a uniform from rng; a greedy row gives its argmax and draws none.
inline token_id sample_target_from(const target_row& r, const Eigen::Ref<const Eigen::MatrixXf>& logits, verify_buffers& ws,
                            uniform_source& rng) {
    if (r.kind == target_row::form::greedy) return static_cast<token_id>(r.argmax);
    return sample_target(r, logits, ws, uniform01(rng));
}

/// Σ max(0, a·p(y) − b·q(y)) over block blk of a prepared (non-greedy) row, q being the draft
