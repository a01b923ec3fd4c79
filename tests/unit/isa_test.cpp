// The run-time choice of instruction set: each compiled copy of the hot core against its stated
// error and against the others, and force_isa's contract.
#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <specdec/specdec.hpp>

#include "support/catch.hpp"
#include "support/skip.hpp"

namespace {

namespace det = specdec::detail;

/// One compiled copy of the core, as the tests reach it.
struct path {
    specdec::isa id;
    float (*exp)(float, float, float);  // pass_exp: the float a pass adds for logit x, reference m, 1/T
};

/// The copies this build has and this CPU can run.
std::vector<path> runnable_paths() {
    std::vector<path> paths{{specdec::isa::portable, &det::SPECDEC_DETAIL_NS_PORTABLE::pass_exp}};
#if SPECDEC_DETAIL_X86_DISPATCH
    if (specdec::isa_supported(specdec::isa::avx2))
        paths.push_back({specdec::isa::avx2, &det::SPECDEC_DETAIL_NS_AVX2::pass_exp});
    if (specdec::isa_supported(specdec::isa::avx512))
        paths.push_back({specdec::isa::avx512, &det::SPECDEC_DETAIL_NS_AVX512::pass_exp});
#endif
    return paths;
}

/// Restores the active path when a test that forced one ends.
struct isa_guard {
    specdec::isa saved = specdec::active_isa();
    ~isa_guard() { specdec::force_isa(saved); }
};

}  // namespace

TEST_CASE("The exp of every compiled path is within its stated error", "[isa]") {
    // AVX2 and AVX-512: 2^t with t = x·s − h (exp2_reference), exact up to the polynomial
    // (1.8e-7 on every float t in [−2, 0]) and t's rounding (|t|·2^-24 in the exponent). The
    // portable path: Eigen's exp of y = (x − m)/T, a float, to about the same precision.
    const float refs[] = {0.0f, 7.5f, -30.25f, 1000.0f, 31000.0f};
    const float inv_ts[] = {1.0f, 2.0f, 0.37f};
    for (const path& p : runnable_paths()) {
        INFO("path " << specdec::isa_name(p.id));
        double worst = 0.0;
        for (const float m : refs)
            for (const float inv_t : inv_ts)
                for (int k = 0; k <= 20000; ++k) {
                    const float x = m + static_cast<float>(-60.0 * k / 20000.0 / inv_t);
                    double t = 0.0, expected = 0.0;
                    if (p.id == specdec::isa::portable) {
                        t = static_cast<double>((x - m) * inv_t) * 1.4426950408889634;
                        expected = std::exp(static_cast<double>((x - m) * inv_t));
                    } else {
                        const det::exp2_reference r(m, inv_t);
                        t = static_cast<double>(x) * r.s - r.log2();
                        expected = std::exp2(t);
                    }
                    const double got = p.exp(x, m, inv_t);
                    const double err = std::abs(got - expected) / expected;
                    INFO("x " << x << ", reference " << m << ", 1/T " << inv_t);
                    REQUIRE(err <= 2e-7 + 4.5e-8 * std::abs(t));
                    worst = std::max(worst, err / (2e-7 + 4.5e-8 * std::abs(t)));
                }
        INFO("largest error, as a fraction of the tolerance: " << worst);
        CHECK(p.exp(-std::numeric_limits<float>::infinity(), 3.0f, 1.0f) == 0.0f);
        CHECK(std::isnan(p.exp(std::numeric_limits<float>::quiet_NaN(), 3.0f, 1.0f)));
        CHECK(p.exp(-1e30f, 3.0f, 1.0f) == 0.0f);
    }
}

TEST_CASE("The AVX2 and AVX-512 exps agree within one ulp from 2^-126 up", "[isa]") {
    // They differ only in f = t − floor(t): a subtraction with AVX2, vreduceps with AVX-512, which
    // round differently when t < 0 (f is not exact there); the polynomial and 2^n are the same.
    const std::vector<path> paths = runnable_paths();
    const path* avx2 = nullptr;
    const path* avx512 = nullptr;
    for (const path& p : paths) {
        if (p.id == specdec::isa::avx2) avx2 = &p;
        if (p.id == specdec::isa::avx512) avx512 = &p;
    }
    if (avx2 == nullptr || avx512 == nullptr) {
        specdec_test::skip("this CPU cannot run both the AVX2 and the AVX-512 path");
        return;
    }
    std::mt19937_64 g(11);
    std::normal_distribution<float> n(0.0f, 20.0f);
    std::size_t compared = 0, equal = 0;
    for (int k = 0; k < 200000; ++k) {
        const float m = n(g), x = m - std::abs(n(g)) * 3.0f, inv_t = 0.25f + static_cast<float>(k % 7) * 0.3f;
        const float a = avx2->exp(x, m, inv_t), b = avx512->exp(x, m, inv_t);
        if (b < std::numeric_limits<float>::min()) continue;  // below 2^-126 the AVX2 exp gives 0
        ++compared;
        std::int32_t ia = 0, ib = 0;
        std::memcpy(&ia, &a, sizeof a);
        std::memcpy(&ib, &b, sizeof b);
        INFO("x " << x << ", reference " << m << ", 1/T " << inv_t << ": " << a << " vs " << b);
        REQUIRE(std::abs(ia - ib) <= 1);  // positive floats: adjacent bit patterns are adjacent floats
        equal += ia == ib ? 1 : 0;
    }
    CHECK(compared > 100000);
    INFO("identical: " << equal << " of " << compared);
    CHECK(equal * 10 > compared * 9);  // one ulp apart only where f rounds differently
}

TEST_CASE("Every path standardizes, samples and verifies alike", "[isa]") {
    // The paths differ only in float rounding: each exp within 2e-7 + 4.5e-8·|t| of exact (t the
    // base-2 exponent, up to about 50 here), the portable one to about the same, and the
    // normalizer sums V floats in each copy's own order (a relative difference of order
    // sqrt(V)·2^-24, 1.2e-5 at most for V = 40000); so two paths' p agree within
    // (1.5e-5 + 4e-7·|t|) relatively. Draws on fixed uniforms land on the same token except where
    // rounding moves a boundary (a few in 1e4).
    isa_guard guard;
    std::mt19937_64 g(5);
    std::normal_distribution<float> n(0.0f, 3.0f);
    for (const Eigen::Index vocab : {100, 5000, 40000}) {
        Eigen::VectorXf z(vocab);
        for (float& v : z) v = n(g);
        const specdec::sampling_config s{.temperature = 0.8f};
        specdec::force_isa(specdec::isa::portable);
        specdec::sampling_workspace ws;
        Eigen::VectorXf reference(vocab);
        specdec::standardize(z, s, reference, ws);
        std::vector<Eigen::Index> reference_draws;
        Eigen::VectorXf scratch(vocab);
        for (int k = 0; k < 200; ++k)
            reference_draws.push_back(specdec::standardize_and_sample(z, s, scratch, (k + 0.5) / 200.0, ws));
        for (const path& p : runnable_paths()) {
            INFO("vocabulary " << vocab << ", path " << specdec::isa_name(p.id));
            specdec::force_isa(p.id);
            REQUIRE(specdec::active_isa() == p.id);
            Eigen::VectorXf out(vocab);
            specdec::standardize(z, s, out, ws);
            const float top = z.maxCoeff();
            for (Eigen::Index k = 0; k < vocab; ++k) {
                const float t = (top - z[k]) / s.temperature * 1.442695f;
                INFO("token " << k << ": " << out[k] << " vs " << reference[k]);
                REQUIRE(std::abs(out[k] - reference[k]) <= (1.5e-5f + 4e-7f * t) * reference[k]);
            }
            int moved = 0;
            for (int k = 0; k < 200; ++k)
                moved += specdec::standardize_and_sample(z, s, scratch, (k + 0.5) / 200.0, ws) != reference_draws[
                                                                                                    static_cast<std::size_t>(k)];
            CHECK(moved <= 2);
        }
    }
}

TEST_CASE("force_isa pins the path, returns the previous one, and rejects one it cannot run", "[isa]") {
    isa_guard guard;
    CHECK(specdec::isa_supported(specdec::isa::portable));
    CHECK(specdec::force_isa(specdec::isa::portable) == guard.saved);
    CHECK(specdec::active_isa() == specdec::isa::portable);
    CHECK(specdec::force_isa(specdec::best_isa()) == specdec::isa::portable);
    CHECK(specdec::active_isa() == specdec::best_isa());
    for (const specdec::isa i : {specdec::isa::portable, specdec::isa::avx2, specdec::isa::avx512}) {
        CHECK(specdec::parse_isa(specdec::isa_name(i)) == i);
        if (!specdec::isa_supported(i))
            CHECK_THROWS_WITH(specdec::force_isa(i), specdec_test::contains("is not available here"));
    }
    CHECK_FALSE(specdec::parse_isa("sse9").has_value());
}
