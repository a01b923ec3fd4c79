#include "support/catch.hpp"
#include "support/markov.hpp"

#include <specdec/sampling.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <vector>

using specdec::sampling_config;

namespace {
Eigen::VectorXf standardized(const Eigen::VectorXf& z, const sampling_config& s) {
    Eigen::VectorXf p(z.size());
    specdec::sampling_workspace ws;
    specdec::standardize(z, s, p, ws);
    return p;
}

Eigen::VectorXf random_logits(int n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d(0.0f, 2.0f);
    Eigen::VectorXf z(n);
    for (int i = 0; i < n; ++i) z[i] = d(g);
    return z;
}

/// Logits N(0, 3²) with about a fifth of them -Inf (never the first), and, in rows of more
/// than two 2048-token blocks, the whole second block -Inf.
Eigen::VectorXf holey_row(Eigen::Index size, std::mt19937_64& g) {
    std::normal_distribution<float> n(0.0f, 3.0f);
    std::bernoulli_distribution hole(0.2);
    Eigen::VectorXf z(size);
    for (Eigen::Index k = 0; k < size; ++k)
        z[k] = (size > 4096 && k >= 2048 && k < 4096) || (k > 0 && hole(g)) ? -std::numeric_limits<float>::infinity()
                                                                           : n(g);
    return z;
}

/// Running sums of p, in double.
std::vector<double> running_sums(const Eigen::VectorXf& p) {
    std::vector<double> cum(static_cast<std::size_t>(p.size()));
    double acc = 0.0;
    for (Eigen::Index k = 0; k < p.size(); ++k) cum[static_cast<std::size_t>(k)] = acc += p[k];
    return cum;
}
}  // namespace

TEST_CASE("Temperature 1 is the softmax, temperature 0 is argmax with ties to the lowest id", "[sampling]") {
    Eigen::VectorXf z(4);
    z << 1.0f, 3.0f, 3.0f, -2.0f;
    const auto p = standardized(z, {});
    const Eigen::VectorXf e = (z.array() - 3.0f).exp();
    CHECK((p - e / e.sum()).cwiseAbs().maxCoeff() < 1e-7f);
    const auto g = standardized(z, {.temperature = 0.0f});
    CHECK(g[1] == 1.0f);
    CHECK(g.sum() == 1.0f);
}

TEST_CASE("Standardization agrees with the double-precision reference for every filter", "[sampling]") {
    const sampling_config configs[] = {{},
                                       {.temperature = 0.5f},
                                       {.temperature = 1.7f},
                                       {.top_k = 1},
                                       {.top_k = 7},
                                       {.top_p = 0.5f},
                                       {.top_p = 0.95f},
                                       {.min_p = 0.05f},
                                       {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .min_p = 0.02f}};
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        const auto z = random_logits(64, seed);
        for (const auto& s : configs) {
            const auto p = standardized(z, s);
            const auto ref = specdec_test::ref_standardize(z, s);
            for (int i = 0; i < z.size(); ++i) {
                INFO("seed " << seed << " token " << i << " T=" << s.temperature << " k=" << s.top_k
                             << " p=" << s.top_p << " min_p=" << s.min_p);
                CHECK(std::abs(p[i] - ref[static_cast<std::size_t>(i)]) < 1e-6);
                CHECK((p[i] == 0.0f) == (ref[static_cast<std::size_t>(i)] == 0.0));
            }
        }
    }
}

TEST_CASE("top-k keeps the k largest logits, and all ties at the boundary", "[sampling]") {
    Eigen::VectorXf z(6);
    z << 0.0f, 5.0f, 2.0f, 2.0f, -1.0f, 4.0f;
    auto p = standardized(z, {.top_k = 3});
    CHECK((p.array() > 0).count() == 4);  // 5, 4 and the two tied 2s
    CHECK(p[0] == 0.0f);
    CHECK(p[4] == 0.0f);
    p = standardized(z, {.top_k = 2});
    CHECK((p.array() > 0).count() == 2);
    CHECK(p.sum() == Approx(1.0f));
}

TEST_CASE("The top-p threshold is the smallest weight whose nucleus reaches the mass asked for", "[sampling]") {
    // Rows of weights exp(z - max) for narrow to wide logits, with ties and zeros, against the
    // definition: the weights >= t reach `need`, the weights > t do not (up to double rounding).
    std::mt19937_64 g(31);
    std::vector<float> values;
    std::vector<double> buckets;
    for (const Eigen::Index size : {3, 64, 100, 5000, 40000}) {
        for (const float sigma : {0.5f, 3.0f, 10.0f}) {
            for (const double p : {0.1, 0.5, 0.9, 0.99, 0.999999}) {
                for (int trial = 0; trial < 4; ++trial) {
                    std::normal_distribution<float> n(0.0f, sigma);
                    Eigen::VectorXf z(size);
                    for (Eigen::Index t = 0; t < size; ++t) z[t] = trial % 2 == 0 ? std::round(n(g)) : n(g);
                    if (trial == 3) z.head(size / 3).setConstant(-std::numeric_limits<float>::infinity());
                    const Eigen::VectorXf w = (z.array() - z.maxCoeff()).exp().matrix();
                    const double total = specdec::detail::kernels::sum_in_double(w);
                    const double need = p * total;
                    const float t = specdec::detail::kernels::top_p_threshold(w, total, need, values, buckets);
                    double at_or_above = 0.0, strictly_above = 0.0;
                    for (Eigen::Index k = 0; k < size; ++k) {
                        if (w[k] >= t && w[k] > 0.0f) at_or_above += w[k];
                        if (w[k] > t) strictly_above += w[k];
                    }
                    INFO("size " << size << ", sigma " << sigma << ", p " << p << ", trial " << trial << ", t " << t);
                    CHECK(t > 0.0f);
                    CHECK(at_or_above >= need * (1.0 - 1e-12));
                    CHECK(strictly_above < need * (1.0 + 1e-12));
                }
            }
        }
    }
}

TEST_CASE("The top-k threshold is the k-th largest logit, with ties and -Inf, at every offset", "[sampling]") {
    // Against std::nth_element, over rows whose lengths and k straddle the 16- to 64-float
    // groups the vectorized search compares at once; coarse values make many ties.
    std::mt19937_64 g(29);
    std::normal_distribution<float> n(0.0f, 3.0f);
    std::bernoulli_distribution hole(0.1);
    std::vector<float> heap;
    for (const Eigen::Index size : {2, 17, 63, 64, 65, 130, 1000, 4099}) {
        for (const Eigen::Index k : {1, 2, 15, 16, 40, 63, 64, 65, 999}) {
            if (k >= size) continue;
            for (int trial = 0; trial < 20; ++trial) {
                Eigen::VectorXf z(size);
                for (Eigen::Index t = 0; t < size; ++t)
                    z[t] = hole(g) ? -std::numeric_limits<float>::infinity()
                                   : (trial % 2 == 0 ? std::round(n(g)) : n(g));
                std::vector<float> sorted(z.data(), z.data() + size);
                std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
                INFO("size " << size << ", k " << k << ", trial " << trial);
                CHECK(specdec::detail::kernels::top_k_threshold(z, k, heap) == sorted[static_cast<std::size_t>(k - 1)]);
            }
        }
    }
}

TEST_CASE("top-p keeps the smallest most probable set reaching p", "[sampling]") {
    Eigen::VectorXf z(4);
    z << std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f);
    auto p = standardized(z, {.top_p = 0.45f});
    CHECK((p.array() > 0).count() == 1);
    p = standardized(z, {.top_p = 0.6f});
    CHECK((p.array() > 0).count() == 2);
    CHECK(p[0] == Approx(0.5f / 0.8f));
    p = standardized(z, {.top_p = 0.96f});
    CHECK((p.array() > 0).count() == 4);
}

TEST_CASE("Logits of -Inf are impossible tokens, while NaN, +Inf and all -Inf rows are errors", "[sampling][errors]") {
    constexpr float inf = std::numeric_limits<float>::infinity();
    Eigen::VectorXf z(3);
    z << -inf, 0.0f, 1.0f;
    CHECK(standardized(z, {})[0] == 0.0f);
    z << 0.0f, std::nanf(""), 1.0f;
    CHECK_THROWS_WITH(standardized(z, {}), specdec_test::contains("NaN"));
    z << 0.0f, inf, 1.0f;
    CHECK_THROWS_WITH(standardized(z, {}), specdec_test::contains("+Inf"));
    z << -inf, -inf, -inf;
    CHECK_THROWS_WITH(standardized(z, {}), specdec_test::contains("-Inf"));
}

TEST_CASE("Invalid sampling settings are rejected with the field named", "[sampling][errors]") {
    CHECK_THROWS_WITH(specdec::validate({.temperature = -0.5f}), specdec_test::contains("temperature"));
    CHECK_THROWS_WITH(specdec::validate({.temperature = std::nanf("")}), specdec_test::contains("temperature"));
    CHECK_THROWS_WITH(specdec::validate({.top_k = -1}), specdec_test::contains("top_k"));
    CHECK_THROWS_WITH(specdec::validate({.top_p = 0.0f}), specdec_test::contains("top_p"));
    CHECK_THROWS_WITH(specdec::validate({.top_p = 1.5f}), specdec_test::contains("top_p"));
    CHECK_THROWS_WITH(specdec::validate({.min_p = -0.1f}), specdec_test::contains("min_p"));
    CHECK_NOTHROW(specdec::validate({.temperature = 0.0f, .top_k = 5, .top_p = 1.0f, .min_p = 0.0f}));
    // A positive temperature so small that 1/T overflows would make every exponent NaN.
    CHECK_THROWS_WITH(specdec::validate({.temperature = 1e-40f}), specdec_test::contains("too small"));
    CHECK_THROWS_WITH(specdec::validate({.temperature = 5e-39f}), specdec_test::contains("too small"));
    CHECK_NOTHROW(specdec::validate({.temperature = 6e-39f}));
    CHECK_NOTHROW(specdec::validate({.temperature = 1e-30f}));
}

TEST_CASE("The sampling functions check their settings, their output's size and the weights' sum",
          "[sampling][errors]") {
    using specdec_test::contains;
    Eigen::VectorXf z(4), out(4), too_short(3), none;
    z << 0.0f, 1.0f, 2.0f, 3.0f;
    out.setConstant(7.0f);
    specdec::sampling_workspace ws;
    // A view cannot be resized: a wrong size is an error, and out keeps its contents.
    CHECK_THROWS_WITH(specdec::standardize(z, {}, too_short, ws),
                      contains("standardize: out has 3 entries but logits has 4"));
    CHECK_THROWS_WITH((void)specdec::standardize_and_sample(z, {}, none, 0.5, ws),
                      contains("standardize_and_sample: out has 0 entries but logits has 4"));
    CHECK_THROWS_WITH((void)specdec::standardize_weights_and_sample(z, {}, too_short, 0.5, ws),
                      contains("standardize_weights_and_sample: out has 3 entries"));
    // Settings are checked as validate() does.
    CHECK_THROWS_WITH(specdec::standardize(z, {.temperature = -1.0f}, out, ws), contains("sampling.temperature = -1"));
    CHECK_THROWS_WITH((void)specdec::standardize_and_sample(z, {.top_p = 0.0f}, out, 0.5, ws),
                      contains("sampling.top_p = 0"));
    CHECK_THROWS_WITH((void)specdec::standardize_weights_and_sample(z, {.top_k = -2}, out, 0.5, ws),
                      contains("sampling.top_k = -2"));
    CHECK((out.array() == 7.0f).all());
    // Weights that sum to zero or to a non-finite value cannot be sampled.
    Eigen::VectorXf w = Eigen::VectorXf::Zero(5);
    CHECK_THROWS_WITH((void)specdec::sample_from_weights(w, 0.5, ws), contains("the weights sum to 0 over 5 entries"));
    CHECK_THROWS_WITH((void)specdec::sample_from_weights(none, 0.5, ws), contains("sum to 0 over 0 entries"));
    w[2] = std::nanf("");
    CHECK_THROWS_WITH((void)specdec::sample_from_weights(w, 0.5, ws), contains("sum to nan"));
    w[2] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH((void)specdec::sample_from_weights(w, 0.5, ws), contains("sum to inf"));
}

TEST_CASE("sample_from_weights inverts the running sum and never returns a zero-weight index", "[sampling]") {
    Eigen::VectorXf w(5);
    w << 0.0f, 1.0f, 0.0f, 3.0f, 0.0f;
    specdec::sampling_workspace ws;
    CHECK(specdec::sample_from_weights(w, 0.0, ws) == 1);
    CHECK(specdec::sample_from_weights(w, 0.2499, ws) == 1);
    CHECK(specdec::sample_from_weights(w, 0.25, ws) == 3);
    CHECK(specdec::sample_from_weights(w, 0.9999999999, ws) == 3);
}

TEST_CASE("Blocked sampling over a large vocabulary inverts the same running sum as a plain scan", "[sampling]") {
    // Weights spanning many blocks, with zero runs across block boundaries.
    const int n = 5000;
    Eigen::VectorXf w(n);
    std::mt19937_64 g(3);
    for (int i = 0; i < n; ++i) w[i] = (i / 700) % 2 == 0 ? static_cast<float>(specdec::uniform01(g)) : 0.0f;
    specdec::sampling_workspace ws;
    double total = 0.0;
    for (int i = 0; i < n; ++i) total += w[i];
    for (int trial = 0; trial < 2000; ++trial) {
        const double u = specdec::uniform01(g);
        double acc = 0.0;
        int expect = -1;
        for (int i = 0; i < n && expect < 0; ++i) {
            acc += w[i];
            if (w[i] > 0.0f && acc > u * total) expect = i;
        }
        const auto got = specdec::sample_from_weights(w, u, ws);
        CHECK(w[got] > 0.0f);
        // Block sums are rounded separately from the scan: the two may disagree only when
        // u * total lies within rounding of a boundary between two tokens.
        const bool agree_or_boundary = got == expect || std::abs(acc - u * total) < 1e-5 * total;
        CHECK(agree_or_boundary);
    }
}

TEST_CASE("standardize_and_sample writes standardize's distribution and inverts its running sum", "[sampling]") {
    // Rows of 5 to 9000 tokens (several 2048-token blocks, a block of -Inf, -Inf scattered),
    // plain sampling at three temperatures and the truncating / greedy paths.
    std::mt19937_64 g(17);
    const specdec::sampling_config settings[] = {
        {.temperature = 1.0f}, {.temperature = 0.6f}, {.temperature = 2.5f}, {.temperature = 1.0f, .top_k = 40},
        {.temperature = 0.0f}};
    for (const Eigen::Index size : {Eigen::Index{5}, Eigen::Index{2048}, Eigen::Index{2049}, Eigen::Index{9000}}) {
        const Eigen::VectorXf z = holey_row(size, g);
        for (const auto& s : settings) {
            INFO("size " << size << ", temperature " << s.temperature << ", top_k " << s.top_k);
            specdec::sampling_workspace ws;
            Eigen::VectorXf expected(size), got(size);
            specdec::standardize(z, s, expected, ws);
            const std::vector<double> cum = running_sums(expected);
            for (int trial = 0; trial < 400; ++trial) {
                const double u = trial == 0 ? 0.0 : trial == 1 ? std::nextafter(1.0, 0.0) : specdec::uniform01(g);
                const Eigen::Index y = specdec::standardize_and_sample(z, s, got, u, ws);
                REQUIRE(y >= 0);
                REQUIRE(y < size);
                REQUIRE(got[y] > 0.0f);  // never a token of probability 0
                if (trial == 0) {
                    for (Eigen::Index k = 0; k < size; ++k)
                        REQUIRE(got[k] == Approx(expected[k]).epsilon(1e-5).margin(1e-12));
                }
                // The running probability crosses u at y, up to float rounding.
                const double before = y > 0 ? cum[static_cast<std::size_t>(y - 1)] : 0.0;
                CHECK(before <= u + 1e-5);
                CHECK(cum[static_cast<std::size_t>(y)] >= u - 1e-5);
            }
        }
    }
    Eigen::VectorXf bad = Eigen::VectorXf::Zero(3000), out(3000);
    bad[2500] = std::numeric_limits<float>::quiet_NaN();
    specdec::sampling_workspace ws;
    CHECK_THROWS_WITH(specdec::standardize_and_sample(bad, {}, out, 0.5, ws), specdec_test::contains("logit 2500 is NaN"));
    bad.setConstant(-std::numeric_limits<float>::infinity());
    CHECK_THROWS_WITH(specdec::standardize_and_sample(bad, {}, out, 0.5, ws), specdec_test::contains("-Inf"));
}

TEST_CASE("The vectorized exp is within 2e-7 of the exp of its exponent, 0 at -Inf and NaN at NaN", "[sampling]") {
    // pass_exp(x, m, 1/T) is the float every pass adds for logit x relative to reference m. In
    // the portable copy of the core (detail::kernels) it is Eigen's exp of y = (x − m)/T, a
    // float, to about 2e-7; the AVX2 and AVX-512 copies are checked in isa_test.cpp.
    const float refs[] = {0.0f, 7.5f, -30.25f, 1000.0f, 31000.0f};
    const float inv_ts[] = {1.0f, 2.0f, 0.37f};
    double worst = 0.0;
    for (const float m : refs)
        for (const float inv_t : inv_ts)
            for (int k = 0; k <= 20000; ++k) {
                const float x = m + static_cast<float>(-60.0 * k / 20000.0 / inv_t);
                const double t = static_cast<double>((x - m) * inv_t) * 1.4426950408889634;
                const double expected = std::exp(static_cast<double>((x - m) * inv_t));
                const double got = specdec::detail::kernels::pass_exp(x, m, inv_t);
                const double err = std::abs(got - expected) / expected;
                INFO("x " << x << ", reference " << m << ", 1/T " << inv_t);
                REQUIRE(err <= 2e-7 + 4.5e-8 * std::abs(t));
                worst = std::max(worst, err / (2e-7 + 4.5e-8 * std::abs(t)));
            }
    INFO("largest error, as a fraction of the tolerance: " << worst);
    CHECK(specdec::detail::kernels::pass_exp(-std::numeric_limits<float>::infinity(), 3.0f, 1.0f) == 0.0f);
    CHECK(std::isnan(specdec::detail::kernels::pass_exp(std::numeric_limits<float>::quiet_NaN(), 3.0f, 1.0f)));
    CHECK(specdec::detail::kernels::pass_exp(-1e30f, 3.0f, 1.0f) == 0.0f);
}

TEST_CASE("Rows of many blocks with large logits are normalized alike in every block", "[sampling]") {
    // Logits near 1000 and 30000 rising block by block, so that each 2048-token block of the
    // blockwise pass has its own reference: the factors between blocks must be those of the
    // exponentials. Each p is then within float precision of the double-precision softmax
    // (about 2e-6 for the least likely tokens here, whose exponent is largest); with AVX-512, a
    // factor taken from the logits rather than from the base-2 references of the exponentials
    // would be off by up to half an ulp of h = m·log2(e)/T: 4e-5 near 1000, 1e-3 near 30000.
    std::mt19937_64 g(29);
    std::normal_distribution<float> n(0.0f, 2.0f);
    for (const float offset : {1000.0f, 30000.0f})
        for (const float temperature : {1.0f, 0.7f}) {
            const Eigen::Index size = 9000;
            Eigen::VectorXf z(size);
            for (Eigen::Index k = 0; k < size; ++k) z[k] = offset + 0.5f * static_cast<float>(k / 2048) + n(g);
            const sampling_config s{.temperature = temperature};
            const auto ref = specdec_test::ref_standardize(z, s);
            specdec::sampling_workspace ws;
            Eigen::VectorXf got(size);
            (void)specdec::standardize_and_sample(z, s, got, 0.5, ws);
            double worst = 0.0;
            for (Eigen::Index k = 0; k < size; ++k) {
                const double r = ref[static_cast<std::size_t>(k)];
                worst = std::max(worst, std::abs(got[k] - r) / r);
            }
            INFO("offset " << offset << ", temperature " << temperature << ": largest relative error " << worst);
            CHECK(worst < 5e-6);
        }
}

TEST_CASE("standardize_weights_and_sample writes weights whose scaled values are standardize's distribution",
          "[sampling]") {
    // As for standardize_and_sample: rows of 5 to 9000 tokens with -Inf holes and a block of
    // -Inf; the draw inverts the running sum of q = scale · w at u.
    std::mt19937_64 g(23);
    const specdec::sampling_config settings[] = {
        {.temperature = 1.0f}, {.temperature = 0.6f}, {.temperature = 2.5f}, {.temperature = 1.0f, .top_k = 40},
        {.temperature = 1.0f, .top_p = 0.9f}, {.temperature = 0.0f}};
    for (const Eigen::Index size : {Eigen::Index{5}, Eigen::Index{2048}, Eigen::Index{2049}, Eigen::Index{9000}}) {
        const Eigen::VectorXf z = holey_row(size, g);
        for (const auto& s : settings) {
            INFO("size " << size << ", temperature " << s.temperature << ", top_k " << s.top_k << ", top_p "
                         << s.top_p);
            specdec::sampling_workspace ws;
            Eigen::VectorXf expected(size), w(size), plain(size);
            specdec::standardize(z, s, expected, ws);
            const std::vector<double> cum = running_sums(expected);
            for (int trial = 0; trial < 400; ++trial) {
                const double u = trial == 0 ? 0.0 : trial == 1 ? std::nextafter(1.0, 0.0) : specdec::uniform01(g);
                const specdec::token_draw d = specdec::standardize_weights_and_sample(z, s, w, u, ws);
                REQUIRE(d.token >= 0);
                REQUIRE(d.token < size);
                REQUIRE(w[d.token] > 0.0f);
                if (trial == 0) {
                    // Truncation and temperature 0 write the distribution itself; plain sampling
                    // writes exp((z − max) / T), whose largest weight is 1 (up to the vectorized
                    // exp's rounding of its reference).
                    if (s.temperature == 0.0f || s.top_k > 0 || s.top_p < 1.0f) {
                        CHECK(d.scale == 1.0f);
                    } else {
                        CHECK(w.maxCoeff() == Approx(1.0f).epsilon(1e-6));
                        CHECK(d.scale <= 1.0f + 1e-6f);
                    }
                    for (Eigen::Index k = 0; k < size; ++k)
                        REQUIRE(d.scale * w[k] == Approx(expected[k]).epsilon(1e-5).margin(1e-12));
                    // The same draw as standardize_and_sample wherever rounding leaves it alone.
                    std::size_t same = 0;
                    for (int t = 0; t < 200; ++t) {
                        const double v = (t + 0.5) / 200.0;
                        same += specdec::standardize_weights_and_sample(z, s, w, v, ws).token ==
                                specdec::standardize_and_sample(z, s, plain, v, ws);
                    }
                    CHECK(same >= 198);
                }
                const double before = d.token > 0 ? cum[static_cast<std::size_t>(d.token - 1)] : 0.0;
                CHECK(before <= u + 1e-5);
                CHECK(cum[static_cast<std::size_t>(d.token)] >= u - 1e-5);
            }
        }
    }
    Eigen::VectorXf bad = Eigen::VectorXf::Zero(3000), out(3000);
    specdec::sampling_workspace ws;
    bad[2500] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(specdec::standardize_weights_and_sample(bad, {}, out, 0.5, ws),
                      specdec_test::contains("logit 2500 is NaN"));
    bad[2500] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH(specdec::standardize_weights_and_sample(bad, {}, out, 0.5, ws),
                      specdec_test::contains("logit 2500 is +Inf"));
    bad.setConstant(-std::numeric_limits<float>::infinity());
    CHECK_THROWS_WITH(specdec::standardize_weights_and_sample(bad, {}, out, 0.5, ws), specdec_test::contains("-Inf"));
    Eigen::VectorXf empty(0);
    CHECK_THROWS_WITH(specdec::standardize_weights_and_sample(empty, {}, empty, 0.5, ws),
                      specdec_test::contains("empty"));
}

TEST_CASE("Logits of opposite signs near the float limit are normalized exactly at a huge temperature",
          "[sampling]") {
    // 3e38 − (−3e38) overflows a float; divided by T = 3e38 it is 2. Every exp path must give
    // softmax(1, −1, 0) (the portable one gave (1, 0, 0) when it subtracted first).
    Eigen::VectorXf z(3), out(3), w(3);
    z << 3e38f, -3e38f, 0.0f;
    const sampling_config s{.temperature = 3e38f};
    const auto ref = specdec_test::ref_standardize(z, s);
    REQUIRE(ref[1] == Approx(std::exp(-1.0) / (std::exp(1.0) + std::exp(-1.0) + 1.0)));
    specdec::sampling_workspace ws;
    specdec::standardize(z, s, out, ws);
    for (Eigen::Index k = 0; k < 3; ++k) CHECK(out[k] == Approx(ref[static_cast<std::size_t>(k)]).epsilon(1e-5));
    (void)specdec::standardize_and_sample(z, s, out, 0.5, ws);
    for (Eigen::Index k = 0; k < 3; ++k) CHECK(out[k] == Approx(ref[static_cast<std::size_t>(k)]).epsilon(1e-5));
    const specdec::token_draw d = specdec::standardize_weights_and_sample(z, s, w, 0.5, ws);
    for (Eigen::Index k = 0; k < 3; ++k)
        CHECK(d.scale * w[k] == Approx(ref[static_cast<std::size_t>(k)]).epsilon(1e-5));
}

TEST_CASE("Rows of logits of any finite magnitude are normalized exactly", "[sampling]") {
    // Half the tokens at a logit b, half one float below it, over three 2048-token blocks (the
    // first holds only the lower ones, so its reference differs from the row's maximum): the
    // ratio of their probabilities must be exp(−ulp/T), down to 0 where that underflows, for
    // |b| up to 3e38. With AVX-512 the exponent is x·s − h with h = b·log2(e)/T rounded to a
    // float, exact only up to h's rounding error; fusing that subtraction for every finite h (the
    // negative control: it did, before) left no weight or NaN from |b| = 1e10 on, where that
    // error alone is hundreds of binary orders.
    for (const float base : {1e3f, 2.9e6f, 3e6f, 1e7f, 1e9f, 1e10f, 1e20f, 1e30f, 3e38f})
        for (const float sign : {1.0f, -1.0f})
            for (const float temperature : {1.0f, 0.25f}) {
                const float hi = sign * base, lo = std::nextafter(hi, -std::numeric_limits<float>::infinity());
                const Eigen::Index size = 5000;
                Eigen::VectorXf z(size);
                for (Eigen::Index k = 0; k < size; ++k) z[k] = k < 2048 || k % 2 == 1 ? lo : hi;
                const sampling_config s{.temperature = temperature};
                const auto ref = specdec_test::ref_standardize(z, s);
                specdec::sampling_workspace ws;
                Eigen::VectorXf got(size);
                (void)specdec::standardize_and_sample(z, s, got, 0.5, ws);
                // The weights variant takes the row's maximum as its one reference: the same
                // distribution once scaled.
                Eigen::VectorXf w(size);
                const specdec::token_draw d = specdec::standardize_weights_and_sample(z, s, w, 0.5, ws);
                for (Eigen::Index k = 0; k < size; ++k)
                    REQUIRE(d.scale * w[k] == Approx(got[k]).epsilon(1e-5).margin(1e-30));
                INFO("logit " << hi << ", temperature " << temperature << ": p(hi) " << got[2048] << ", p(lo) "
                              << got[0] << " (expected " << ref[2048] << ", " << ref[0] << ")");
                for (const Eigen::Index k : {Eigen::Index{0}, Eigen::Index{2047}, Eigen::Index{2048},
                                             Eigen::Index{2049}, size - 1}) {
                    const double r = ref[static_cast<std::size_t>(k)];
                    REQUIRE(std::isfinite(got[k]));
                    if (r > 1e-30)
                        CHECK(std::abs(got[k] - r) <= 5e-6 * r);
                    else
                        CHECK(got[k] <= 1e-29f);
                }
                CHECK(std::abs(got.cast<double>().sum() - 1.0) < 1e-5);
            }
}

TEST_CASE("The sampling functions return tokens as token_id", "[sampling]") {
    Eigen::VectorXf z(5), out(5);
    z << 0.1f, 2.0f, -1.0f, 0.5f, 0.0f;
    specdec::sampling_workspace ws;
    static_assert(std::is_same_v<decltype(specdec::sample_from_weights(z, 0.5, ws)), specdec::token_id>);
    static_assert(std::is_same_v<decltype(specdec::standardize_and_sample(z, {}, out, 0.5, ws)), specdec::token_id>);
    static_assert(std::is_same_v<decltype(specdec::standardize_weights_and_sample(z, {}, out, 0.5, ws).token),
                                 specdec::token_id>);
    const specdec::token_id a = specdec::standardize_and_sample(z, {.temperature = 0.0f}, out, 0.5, ws);
    CHECK(a == 1);
    const specdec::token_draw d = specdec::standardize_weights_and_sample(z, {.temperature = 0.0f}, out, 0.5, ws);
    CHECK(d.token == 1);
    CHECK(specdec::sample_from_weights(out, 0.5, ws) == 1);
}

TEST_CASE("A row longer than a token_id can index is rejected before it is read", "[sampling][errors]") {
    // A view that claims 2^31 + 1 entries over one float: the size check comes first, so
    // nothing past the float is read.
    const float one = 1.0f;
    const Eigen::Map<const Eigen::VectorXf> huge(&one, (Eigen::Index{1} << 31) + 1);
    Eigen::VectorXf out(1);
    specdec::sampling_workspace ws;
    CHECK_THROWS_WITH((void)specdec::sample_from_weights(huge, 0.5, ws),
                      specdec_test::contains("specdec::sample_from_weights: w has 2147483649 entries, more than a token_id"));
    CHECK_THROWS_WITH((void)specdec::standardize_and_sample(huge, {}, out, 0.5, ws),
                      specdec_test::contains("logits has 2147483649 entries, more than a token_id can index"));
    CHECK_THROWS_WITH((void)specdec::standardize_weights_and_sample(huge, {}, out, 0.5, ws),
                      specdec_test::contains("logits has 2147483649 entries"));
}
