// Valid extremes of the inputs, on every instruction set of the core: weights whose sum exceeds
// FLT_MAX (the sums are in double), rows with -Inf entries, rows with a single finite entry,
// and logits of +-1e30. Each works, or fails with the documented std::invalid_argument.

#include "support/catch.hpp"
#include "support/markov.hpp"

#include <specdec/sampling.hpp>
#include <specdec/verify.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

using specdec::sampling_config;
using specdec::token_id;
using specdec_test::contains;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float flt_max = std::numeric_limits<float>::max();

/// The index sample_from_weights must return: the first k with w[k] > 0 whose running sum,
/// in double, exceeds u * total (the last k with weight when rounding overshoots); -1 when the
/// running sum lies within `slack` (relative) of u * total at that k, where block sums and a
/// plain scan may round differently.
Eigen::Index reference_draw(const Eigen::VectorXf& w, double u, double slack = 1e-12) {
    double total = 0.0;
    for (Eigen::Index k = 0; k < w.size(); ++k) total += static_cast<double>(w[k]);
    const double target = u * total;
    double acc = 0.0;
    Eigen::Index last = -1;
    for (Eigen::Index k = 0; k < w.size(); ++k) {
        if (!(w[k] > 0.0f)) continue;
        acc += static_cast<double>(w[k]);
        last = k;
        if (acc > target) return std::abs(acc - target) <= slack * total ? -1 : k;
    }
    return last;
}

/// The sampling settings the row tests run under: greedy, plain at three temperatures, and
/// each truncation.
std::vector<sampling_config> settings() {
    return {{.temperature = 0.0f},       {.temperature = 1.0f},  {.temperature = 0.5f},
            {.temperature = 1e-30f},     {.temperature = 1e30f}, {.temperature = 1.0f, .top_k = 2},
            {.temperature = 1.0f, .top_p = 0.5f}, {.temperature = 0.7f, .min_p = 0.1f}};
}

/// Checks standardize, standardize_and_sample and standardize_weights_and_sample on row z
/// against the double-precision reference: the probabilities (to 1e-5 relative, 0 where the
/// reference is 0), and draws with u in {0, 0.3, 0.7, 1 - 2^-53} that have p > 0.
void check_row(const Eigen::VectorXf& z, const sampling_config& s) {
    INFO("temperature " << s.temperature << ", top_k " << s.top_k << ", top_p " << s.top_p << ", min_p " << s.min_p
                        << ", " << z.size() << " tokens");
    const std::vector<double> ref = specdec_test::ref_standardize(z, s);
    specdec::sampling_workspace ws;
    Eigen::VectorXf p(z.size()), w(z.size());
    specdec::standardize(z, s, p, ws);
    for (Eigen::Index k = 0; k < z.size(); ++k) {
        const double r = ref[static_cast<std::size_t>(k)];
        INFO("token " << k << ": p " << p[k] << ", reference " << r);
        REQUIRE(std::isfinite(p[k]));
        if (r == 0.0)
            REQUIRE(p[k] == 0.0f);
        else
            REQUIRE(std::abs(static_cast<double>(p[k]) - r) <= 1e-5 * r + 1e-30);
    }
    for (const double u : {0.0, 0.3, 0.7, 1.0 - 0x1p-53}) {
        INFO("u = " << u);
        const Eigen::Index a = specdec::sample_from_weights(p, u, ws);
        REQUIRE(ref[static_cast<std::size_t>(a)] > 0.0);
        const Eigen::Index b = specdec::standardize_and_sample(z, s, w, u, ws);
        REQUIRE(ref[static_cast<std::size_t>(b)] > 0.0);
        const specdec::token_draw d = specdec::standardize_weights_and_sample(z, s, w, u, ws);
        REQUIRE(ref[static_cast<std::size_t>(d.token)] > 0.0);
        REQUIRE(std::isfinite(d.scale));
        REQUIRE(d.scale > 0.0f);
        for (Eigen::Index k = 0; k < z.size(); ++k)
            if (ref[static_cast<std::size_t>(k)] == 0.0) REQUIRE(w[k] == 0.0f);
    }
}

/// Frequencies of the first token verification emits (the first draft token when accepted,
/// else the correction), γ = 1, over `trials` drafts drawn from q = uniform.
std::vector<double> first_token_frequencies(const Eigen::MatrixXf& target, specdec::verification_scheme scheme,
                                            const sampling_config& s, int trials, std::uint64_t seed) {
    const Eigen::Index vocab = target.rows();
    const Eigen::MatrixXf q = Eigen::MatrixXf::Constant(vocab, 1, 1.0f / static_cast<float>(vocab));
    std::mt19937_64 rng(seed);
    specdec::verify_workspace ws;
    std::vector<double> freq(static_cast<std::size_t>(vocab), 0.0);
    for (int t = 0; t < trials; ++t) {
        const std::vector<token_id> draft{static_cast<token_id>(rng() % static_cast<std::uint64_t>(vocab))};
        const auto r = specdec::verify(target, draft, q, s, rng, ws, {.scheme = scheme});
        const token_id first = r.accepted > 0 ? draft[0] : r.next_token;
        REQUIRE(first >= 0);
        REQUIRE(first < vocab);
        freq[static_cast<std::size_t>(first)] += 1.0 / trials;
    }
    return freq;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Weights whose sum exceeds FLT_MAX
// ---------------------------------------------------------------------------------------------

TEST_CASE("numerics: sample_from_weights takes finite weights whose sum exceeds FLT_MAX", "[numerics][sampling]") {
    specdec::sampling_workspace ws;
    SECTION("2048 weights of 1e36 (each 512-weight block sums to 5.12e38 > FLT_MAX)") {
        const Eigen::VectorXf w = Eigen::VectorXf::Constant(2048, 1e36f);
        CHECK(specdec::sample_from_weights(w, 0.0, ws) == 0);
        CHECK(specdec::sample_from_weights(w, 0.5, ws) == 1024);
        CHECK(specdec::sample_from_weights(w, (700.0 + 0.5) / 2048.0, ws) == 700);
        CHECK(specdec::sample_from_weights(w, 1.0 - 0x1p-53, ws) == 2047);
    }
    SECTION("weights of FLT_MAX") {
        Eigen::VectorXf w(5);
        w << flt_max, 0.0f, flt_max, flt_max, 0.0f;
        CHECK(specdec::sample_from_weights(w, 0.2, ws) == 0);
        CHECK(specdec::sample_from_weights(w, 0.5, ws) == 2);
        CHECK(specdec::sample_from_weights(w, 0.9, ws) == 3);
        CHECK(specdec::sample_from_weights(w, 1.0 - 0x1p-53, ws) == 3);
    }
    SECTION("a single finite weight of FLT_MAX among zeros, in a long row") {
        Eigen::VectorXf w = Eigen::VectorXf::Zero(5000);
        w[4321] = flt_max;
        for (const double u : {0.0, 0.5, 1.0 - 0x1p-53}) CHECK(specdec::sample_from_weights(w, u, ws) == 4321);
    }
    SECTION("random weights up to FLT_MAX over many blocks, with zero runs, against a double-precision scan") {
        const int n = 5000;
        std::mt19937_64 g(17);
        Eigen::VectorXf w(n);
        for (int i = 0; i < n; ++i)
            w[i] = (i / 700) % 3 == 1 ? 0.0f : static_cast<float>(specdec::uniform01(g) * static_cast<double>(flt_max));
        int checked = 0;
        for (int trial = 0; trial < 2000; ++trial) {
            const double u = specdec::uniform01(g);
            const Eigen::Index expect = reference_draw(w, u, 1e-6);
            const Eigen::Index got = specdec::sample_from_weights(w, u, ws);
            INFO("u = " << u);
            REQUIRE(w[got] > 0.0f);
            if (expect < 0) continue;  // within rounding of a boundary
            REQUIRE(got == expect);
            ++checked;
        }
        CHECK(checked > 1900);
    }
    SECTION("Inf and NaN among huge weights are still the documented error") {
        Eigen::VectorXf w = Eigen::VectorXf::Constant(1024, 1e37f);
        w[600] = inf;
        CHECK_THROWS_WITH((void)specdec::sample_from_weights(w, 0.5, ws), contains("the weights sum to inf"));
        w[600] = std::nanf("");
        CHECK_THROWS_AS((void)specdec::sample_from_weights(w, 0.5, ws), std::invalid_argument);
        CHECK_THROWS_WITH((void)specdec::sample_from_weights(w, 0.5, ws), contains("the weights sum to nan"));
    }
}

TEST_CASE("numerics: verify takes draft weights whose sum exceeds FLT_MAX with the scale that normalizes them",
          "[numerics][verify]") {
    // q = c · w with w = 2e35 over V = 3000 tokens: the column's float sum overflows (6e38),
    // c = 1 / 6e38 (necessarily below FLT_MIN: a subnormal, still a finite positive factor)
    // makes it 1. Against the target p = q, every draft token is accepted.
    const Eigen::Index vocab = 3000;
    const Eigen::MatrixXf z = Eigen::MatrixXf::Zero(vocab, 2);
    const Eigen::MatrixXf w = Eigen::MatrixXf::Constant(vocab, 1, 2e35f);
    const std::vector<float> scales{static_cast<float>(1.0 / (3000.0 * static_cast<double>(2e35f)))};
    std::mt19937_64 rng(5);
    specdec::verify_workspace ws;
    for (int t = 0; t < 50; ++t) {
        const std::vector<token_id> draft{static_cast<token_id>(rng() % static_cast<std::uint64_t>(vocab))};
        const auto r = specdec::verify(z, draft, w, scales, {}, rng, ws);
        REQUIRE(r.accepted == 1);
    }
}

// ---------------------------------------------------------------------------------------------
// Rows with -Inf entries, and rows with a single finite entry
// ---------------------------------------------------------------------------------------------

TEST_CASE("numerics: rows with -Inf entries, whole blocks of them, standardize and sample as p", "[numerics][sampling]") {
    std::mt19937_64 g(23);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (const Eigen::Index size : {Eigen::Index{7}, Eigen::Index{100}, Eigen::Index{2048}, Eigen::Index{5000}}) {
        Eigen::VectorXf z(size);
        for (Eigen::Index k = 0; k < size; ++k)
            z[k] = (k % 3 == 0 || (k >= 512 && k < 2600)) ? -inf : nd(g);  // every third, and runs over blocks
        z[1] = 1.5f;                                                        // at least one finite entry
        for (const auto& s : settings()) check_row(z, s);
    }
}

TEST_CASE("numerics: a row with a single finite entry is a point mass", "[numerics][sampling]") {
    for (const Eigen::Index size : {Eigen::Index{1}, Eigen::Index{17}, Eigen::Index{2048}, Eigen::Index{5000}})
        for (const Eigen::Index at : {Eigen::Index{0}, size / 2, size - 1})
            for (const float value : {0.0f, -1e30f, 1e30f, -flt_max, flt_max}) {
                Eigen::VectorXf z = Eigen::VectorXf::Constant(size, -inf);
                z[at] = value;
                INFO("size " << size << ", entry " << at << " = " << value);
                for (const auto& s : settings()) {
                    check_row(z, s);
                    specdec::sampling_workspace ws;
                    Eigen::VectorXf p(size);
                    specdec::standardize(z, s, p, ws);
                    REQUIRE(p[at] == 1.0f);
                }
            }
}

TEST_CASE("numerics: all -Inf, NaN and +Inf rows are the documented error", "[numerics][sampling]") {
    specdec::sampling_workspace ws;
    for (const Eigen::Index size : {Eigen::Index{3}, Eigen::Index{5000}}) {
        Eigen::VectorXf z = Eigen::VectorXf::Constant(size, -inf), p(size);
        for (const auto& s : settings()) {
            CHECK_THROWS_WITH(specdec::standardize(z, s, p, ws), contains("-Inf"));
            CHECK_THROWS_AS((void)specdec::standardize_and_sample(z, s, p, 0.5, ws), std::invalid_argument);
            CHECK_THROWS_AS((void)specdec::standardize_weights_and_sample(z, s, p, 0.5, ws), std::invalid_argument);
        }
        z[size - 1] = 1e30f;
        z[0] = std::nanf("");
        CHECK_THROWS_WITH(specdec::standardize(z, {}, p, ws), contains("NaN"));
        z[0] = inf;
        CHECK_THROWS_WITH(specdec::standardize(z, {}, p, ws), contains("+Inf"));
    }
}

// ---------------------------------------------------------------------------------------------
// Logits of +-1e30
// ---------------------------------------------------------------------------------------------

TEST_CASE("numerics: logits of +-1e30 standardize and sample as the double-precision softmax", "[numerics][sampling]") {
    // Opposite signs (their difference, 2e30, times 1/T overflows a float at T = 1e-30) with
    // ordinary values and -Inf between them, short rows and rows of several blocks.
    for (const Eigen::Index size : {Eigen::Index{6}, Eigen::Index{5000}}) {
        Eigen::VectorXf z(size);
        for (Eigen::Index k = 0; k < size; ++k) {
            const int r = static_cast<int>(k % 6);
            z[k] = r == 0 ? 1e30f : r == 1 ? -1e30f : r == 2 ? 0.0f : r == 3 ? 1e30f : r == 4 ? -inf : 5.0f;
        }
        for (const auto& s : settings()) check_row(z, s);
        // At T = 1 the entries of 1e30 share all the mass.
        specdec::sampling_workspace ws;
        Eigen::VectorXf p(size);
        specdec::standardize(z, {}, p, ws);
        const auto top = static_cast<float>((z.array() == 1e30f).count());
        CHECK(p[0] == Approx(1.0f / top).epsilon(1e-5));
        CHECK(p[3] == Approx(1.0f / top).epsilon(1e-5));
        CHECK(p[2] == 0.0f);
        CHECK(p[5] == 0.0f);
    }
}

TEST_CASE("numerics: verification of rows with -Inf entries, a single finite entry and +-1e30 logits",
          "[numerics][verify]") {
    using specdec::verification_scheme;
    const int trials = 4000;
    for (const auto scheme : {verification_scheme::token, verification_scheme::block}) {
        INFO((scheme == verification_scheme::token ? "token" : "block") << " verification");
        // One row of +-1e30, 0, 5 and -Inf, for both positions: the first token is distributed
        // as p (exact speculative sampling), whatever the draft.
        Eigen::MatrixXf z(6, 2);
        for (int j = 0; j < 2; ++j) z.col(j) << 1e30f, -1e30f, 0.0f, 1e30f, -inf, 5.0f;
        for (const sampling_config s : {sampling_config{}, sampling_config{.temperature = 1e30f},
                                        sampling_config{.temperature = 1e-30f}, sampling_config{.top_p = 0.9f}}) {
            INFO("temperature " << s.temperature << ", top_p " << s.top_p);
            const std::vector<double> p = specdec_test::ref_standardize(z.col(0), s);
            const std::vector<double> f = first_token_frequencies(z, scheme, s, trials, 41);
            for (std::size_t k = 0; k < 6; ++k) {
                INFO("token " << k << ": frequency " << f[k] << ", p " << p[k]);
                if (p[k] == 0.0)
                    CHECK(f[k] == 0.0);
                else
                    CHECK(std::abs(f[k] - p[k]) <= 5.0 * std::sqrt(p[k] * (1.0 - p[k]) / trials) + 1e-12);
            }
        }
        // A single finite entry per column: a point mass, so only that token is ever emitted,
        // on short rows and on rows of several blocks, with distributions and point-mass drafts.
        for (const Eigen::Index vocab : {Eigen::Index{5}, Eigen::Index{5000}}) {
            Eigen::MatrixXf one = Eigen::MatrixXf::Constant(vocab, 2, -inf);
            one(vocab - 2, 0) = -1e30f;
            one(1, 1) = 1e30f;
            const Eigen::MatrixXf q = Eigen::MatrixXf::Constant(vocab, 1, 1.0f / static_cast<float>(vocab));
            std::mt19937_64 rng(7);
            specdec::verify_workspace ws;
            for (int t = 0; t < 200; ++t) {
                const std::vector<token_id> draft{static_cast<token_id>(t % 2 == 0 ? vocab - 2 : t % static_cast<int>(vocab))};
                const bool hit = draft[0] == vocab - 2;
                for (const sampling_config s : {sampling_config{}, sampling_config{.temperature = 0.0f}}) {
                    const auto r = specdec::verify(one, draft, q, s, rng, ws, {.scheme = scheme});
                    REQUIRE(r.accepted == (hit ? 1u : 0u));
                    REQUIRE(r.next_token == (hit ? 1 : vocab - 2));
                    const auto m = specdec::verify(one, draft, specdec::point_mass, s, rng, ws, {.scheme = scheme});
                    REQUIRE(m.accepted == (hit ? 1u : 0u));
                    REQUIRE(m.next_token == (hit ? 1 : vocab - 2));
                }
            }
        }
    }
}
