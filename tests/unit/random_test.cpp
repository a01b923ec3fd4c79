#include "support/catch.hpp"

#include <specdec/random.hpp>

#include <cmath>
#include <cstdint>
#include <random>

TEST_CASE("uniform01 uses the top 53 bits of one 64-bit draw", "[random]") {
    std::mt19937_64 a(123), b(123);
    for (int i = 0; i < 1000; ++i) {
        const double u = specdec::uniform01(a);
        const std::uint64_t bits = b();
        CHECK(u == static_cast<double>(bits >> 11) * 0x1.0p-53);
        CHECK(u >= 0.0);
        CHECK(u < 1.0);
    }
}

TEST_CASE("uniform01 combines two draws of a 32-bit generator", "[random]") {
    std::mt19937 a(7), b(7);
    for (int i = 0; i < 1000; ++i) {
        const double u = specdec::uniform01(a);
        const std::uint64_t hi = b(), lo = b();
        CHECK(u == static_cast<double>((hi << 21) | (lo >> 11)) * 0x1.0p-53);
    }
}

TEST_CASE("uniform01 works with a 24-bit generator and stays below 1", "[random]") {
    std::ranlux24 g(5);
    double lo = 1.0, hi = 0.0, sum = 0.0;
    constexpr int n = 20000;
    for (int i = 0; i < n; ++i) {
        const double u = specdec::uniform01(g);
        lo = std::min(lo, u);
        hi = std::max(hi, u);
        sum += u;
    }
    CHECK(lo >= 0.0);
    CHECK(hi < 1.0);
    // Mean of n uniforms: sd = 1/sqrt(12 n) ~ 0.002; 6 sd bound (false alarm ~2e-9).
    CHECK(std::abs(sum / n - 0.5) < 6.0 / std::sqrt(12.0 * n));
}

TEST_CASE("uniform01 takes generators whose range is not a power of two, and redraws outside 2^b", "[random]") {
    // std::minstd_rand gives 2^31 - 2 values, min() = 1: 30 usable bits a call, and a call
    // whose offset from min() is 2^30 or more is drawn again.
    std::minstd_rand a(11), b(11);
    auto next30 = [&] {
        for (;;) {
            const std::uint64_t x = b() - std::minstd_rand::min();
            if (x < (std::uint64_t{1} << 30)) return x;
        }
    };
    for (int i = 0; i < 1000; ++i) {
        const std::uint64_t hi = next30(), lo = next30();
        CHECK(specdec::uniform01(a) == static_cast<double>((hi << 23) | (lo >> 7)) * 0x1.0p-53);
    }
    // The same through std::knuth_b, and the result is uniform: mean within 6 sd of 1/2, and
    // the top bit equally often 0 and 1 (each check false-alarms with probability ~2e-9).
    std::knuth_b g(3);
    constexpr int n = 20000;
    double sum = 0.0, skewed_sum = 0.0;
    int upper = 0, skewed_upper = 0;
    for (int i = 0; i < n; ++i) {
        const double u = specdec::uniform01(g);
        REQUIRE(u >= 0.0);
        REQUIRE(u < 1.0);
        sum += u;
        upper += u >= 0.5;
        const double v = std::pow(u, 1.2);  // negative control: a slightly skewed stream
        skewed_sum += v;
        skewed_upper += v >= 0.5;
    }
    auto mean_ok = [&](double total) { return std::abs(total / n - 0.5) < 6.0 / std::sqrt(12.0 * n); };
    auto half_ok = [&](int count) { return std::abs(count - n / 2.0) < 6.0 * std::sqrt(n / 4.0); };
    CHECK(mean_ok(sum));
    CHECK(half_ok(upper));
    CHECK_FALSE(mean_ok(skewed_sum));  // the checks have the power to see a skew of this size
    CHECK_FALSE(half_ok(skewed_upper));
}

TEST_CASE("uniform_source reads the caller's generator", "[random]") {
    std::mt19937_64 a(99), b(99);
    specdec::uniform_source src(a);
    for (int i = 0; i < 10; ++i) CHECK(src() == specdec::uniform01(b));
}
