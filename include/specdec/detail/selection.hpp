/// \file
/// Top-k and top-p selection: the thresholds that truncating sampling keeps tokens above.
// Part of the per-instruction-set core: no include guard. detail/instance_*.hpp include this file
// once per instruction set, inside that set's namespace (see specdec/isa.hpp); what it includes
// comes before.

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
