// Fuzz harness: standardized sampling (specdec/sampling.hpp) on arbitrary rows and settings.
//
// Input: an instruction-set byte, a mode byte, the sampling settings (fuzz::sampling: valid or
// not), 8 bytes for the uniform u, the vocabulary size, a pattern length, then the pattern of
// logits (NaN, ±Inf, subnormals, extremes or ordinary values; see fuzz::any_float), repeated to
// fill the row, and a second pattern of raw weights.
//
// Invariants: validate(), standardize(), standardize_and_sample() and
// standardize_weights_and_sample() throw std::invalid_argument exactly when their documented
// conditions hold (invalid settings; NaN, +Inf or an all -Inf row; an output of another size),
// and otherwise write a distribution: finite, non-negative, summing to 1, zero where the logit
// is -Inf, the argmax kept (and alone at temperature 0), top-k and min-p respected; the three
// functions agree up to rounding; every draw is an index in range whose weight is not zero.
// sample_from_weights() throws exactly when the weights sum to zero or to NaN or Inf.

#include "fuzz_common.hpp"

#include <algorithm>
#include <functional>
#include <stdexcept>

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

/// The checks every standardized distribution must pass; `best` is the first argmax of the logits.
FUZZ_NO_COVERAGE void check_distribution(const Eigen::VectorXf& logits, const specdec::sampling_config& s, const Eigen::VectorXf& q,
                        Eigen::Index best) {
    const Eigen::Index n = logits.size();
    FUZZ_CHECK(q.size() == n);
    const float* z = logits.data();  // (raw pointers: see fuzz::fill_cycled)
    const float* p = q.data();
    double sum = 0.0;
    float pmax = 0.0f;
    for (Eigen::Index i = 0; i < n; ++i) {
        FUZZ_CHECK(std::isfinite(p[i]) && p[i] >= 0.0f);
        if (z[i] == -inf) FUZZ_CHECK(p[i] == 0.0f);
        sum += p[i];
        pmax = std::max(pmax, p[i]);
    }
    FUZZ_CHECK(std::abs(sum - 1.0) <= 1e-4);
    if (s.temperature == 0.0f) {
        FUZZ_CHECK(p[best] == 1.0f);
        return;
    }
    // The most likely token survives every filter and is (up to rounding) the most probable.
    FUZZ_CHECK(p[best] > 0.0f);
    FUZZ_CHECK(pmax <= p[best] * (1.0f + 1e-5f));
    if (s.top_k > 0 && s.top_k < n) {
        std::vector<float> sorted(z, z + n);
        std::nth_element(sorted.begin(), sorted.begin() + (s.top_k - 1), sorted.end(), std::greater<float>());
        const float kth = sorted[static_cast<std::size_t>(s.top_k - 1)];
        for (Eigen::Index i = 0; i < n; ++i)
            if (p[i] > 0.0f) FUZZ_CHECK(z[i] >= kth);
    }
    if (s.min_p > 0.0f) {
        const double floor = static_cast<double>(s.min_p) * p[best] * (1.0 - 1e-5) - 1e-37;
        for (Eigen::Index i = 0; i < n; ++i)
            if (p[i] > 0.0f) FUZZ_CHECK(static_cast<double>(p[i]) >= floor);
    }
}

/// q and r are the same distribution up to float rounding.
FUZZ_NO_COVERAGE void check_close(const Eigen::VectorXf& q, const Eigen::VectorXf& r) {
    FUZZ_CHECK(q.size() == r.size());
    const float* a = q.data();
    const float* b = r.data();
    for (Eigen::Index i = 0; i < q.size(); ++i)
        FUZZ_CHECK(std::abs(static_cast<double>(a[i]) - b[i]) <= 1e-6 + 1e-4 * std::max(a[i], b[i]));
}

/// Runs f; returns true when it threw std::invalid_argument (other exceptions escape: a finding).
template <class F>
bool throws_invalid(F&& f) {
    try {
        f();
        return false;
    } catch (const std::invalid_argument&) {
        return true;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::input in(data, size);
    fuzz::pick_isa(in);
    const std::uint8_t mode = in.byte();
    const specdec::sampling_config s = fuzz::sampling(in);
    const double u = [&] {
        const std::uint64_t bits = in.u64();
        fuzz::tape_rng g(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&bits), 8));
        return specdec::uniform01(g);
    }();
    FUZZ_CHECK(u >= 0.0 && u < 1.0);
    const Eigen::Index n = (mode & 0x80u) != 0 ? 0 : fuzz::vocab_size(in);
    Eigen::VectorXf logits(n);
    fuzz::fill_cycled(in, logits, in.range(1, 64), fuzz::any_float);

    const bool valid = fuzz::valid_sampling(s);
    FUZZ_CHECK(throws_invalid([&] { specdec::validate(s); }) == !valid);
    const bool expect_throw = !valid || fuzz::bad_logit_row(logits);
    Eigen::Index best = 0;
    if (!fuzz::bad_logit_row(logits)) logits.maxCoeff(&best);  // the first maximum

    specdec::sampling_workspace ws;

    // standardize, then sample_from_weights over its output.
    Eigen::VectorXf q(n);
    const bool threw = throws_invalid([&] { specdec::standardize(logits, s, q, ws); });
    FUZZ_CHECK(threw == expect_throw);
    if (!threw) {
        check_distribution(logits, s, q, best);
        const Eigen::Index k = specdec::sample_from_weights(q, u, ws);
        FUZZ_CHECK(k >= 0 && k < n && q[k] > 0.0f);
    }

    // An output of the wrong size is an error, whatever else is wrong.
    if ((mode & 1u) != 0) {
        Eigen::VectorXf wrong(n + 1 + (mode >> 4));
        FUZZ_CHECK(throws_invalid([&] { specdec::standardize(logits, s, wrong, ws); }));
        FUZZ_CHECK(throws_invalid([&] { (void)specdec::standardize_and_sample(logits, s, wrong, u, ws); }));
        FUZZ_CHECK(throws_invalid([&] { (void)specdec::standardize_weights_and_sample(logits, s, wrong, u, ws); }));
    }

    // standardize_and_sample: the same distribution, and a draw from it.
    Eigen::VectorXf r(n);
    Eigen::Index k = -1;
    FUZZ_CHECK(throws_invalid([&] { k = specdec::standardize_and_sample(logits, s, r, u, ws); }) == expect_throw);
    if (!expect_throw) {
        check_distribution(logits, s, r, best);
        check_close(q, r);
        FUZZ_CHECK(k >= 0 && k < n && r[k] > 0.0f);
    }

    // standardize_weights_and_sample: weights and a scale, q = scale · w.
    Eigen::VectorXf w(n);
    specdec::token_draw d;
    FUZZ_CHECK(throws_invalid([&] { d = specdec::standardize_weights_and_sample(logits, s, w, u, ws); }) ==
               expect_throw);
    if (!expect_throw) {
        FUZZ_CHECK(std::isfinite(d.scale) && d.scale > 0.0f);
        FUZZ_CHECK(d.token >= 0 && d.token < n && w[d.token] > 0.0f);
        Eigen::VectorXf scaled(n);
        for (Eigen::Index i = 0; i < n; ++i) {
            const float wi = w.data()[i];
            FUZZ_CHECK(std::isfinite(wi) && wi >= 0.0f);
            scaled.data()[i] = d.scale * wi;
        }
        check_distribution(logits, s, scaled, best);
        check_close(q, scaled);
    }

    // sample_from_weights on raw non-negative weights (NaN and Inf included).
    Eigen::VectorXf raw(n);
    fuzz::fill_cycled(in, raw, in.range(1, 32), [](fuzz::input& i) { return std::abs(fuzz::any_weight(i)); });
    double total = 0.0;
    for (Eigen::Index i = 0; i < n; ++i) total += raw.data()[i];
    const bool expect_weights_throw = !(total > 0.0) || !std::isfinite(total);
    Eigen::Index j = -1;
    FUZZ_CHECK(throws_invalid([&] { j = specdec::sample_from_weights(raw, u, ws); }) == expect_weights_throw);
    if (!expect_weights_throw) FUZZ_CHECK(j >= 0 && j < n && raw[j] > 0.0f);
    return 0;
}
