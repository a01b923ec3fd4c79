#include "support/catch.hpp"
#include "support/counting_rng.hpp"
#include "support/markov.hpp"

#include <specdec/verify.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using specdec::token_id;
using specdec_test::contains;

namespace {

Eigen::MatrixXf random_logits(int vocab, int cols, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d(0.0f, 1.5f);
    Eigen::MatrixXf z(vocab, cols);
    for (int j = 0; j < cols; ++j)
        for (int i = 0; i < vocab; ++i) z(i, j) = d(g);
    return z;
}

Eigen::MatrixXf softmax_columns(const Eigen::MatrixXf& z) {
    Eigen::MatrixXf p(z.rows(), z.cols());
    specdec::sampling_workspace ws;
    for (int j = 0; j < z.cols(); ++j) {
        Eigen::VectorXf col(z.rows());
        specdec::standardize(z.col(j), {}, col, ws);
        p.col(j) = col;
    }
    return p;
}

}  // namespace

TEST_CASE("When q equals p every draft token is accepted and the bonus comes from the last row", "[verify]") {
    const int vocab = 16, gamma = 5;
    const auto z = random_logits(vocab, gamma + 1, 1);
    const Eigen::MatrixXf q = softmax_columns(z.leftCols(gamma));
    std::mt19937_64 rng(3);
    specdec::verify_workspace ws;
    specdec::sampling_workspace sws;
    std::vector<std::size_t> bonus_counts(vocab, 0);
    for (int trial = 0; trial < 2000; ++trial) {
        std::vector<token_id> draft;
        for (int i = 0; i < gamma; ++i)
            draft.push_back(static_cast<token_id>(specdec::sample_from_weights(q.col(i), specdec::uniform01(rng), sws)));
        const auto r = specdec::verify(z, draft, q, {}, rng, ws);
        REQUIRE(r.accepted == static_cast<std::size_t>(gamma));
        REQUIRE(r.next_token >= 0);
        REQUIRE(r.next_token < vocab);
        ++bonus_counts[static_cast<std::size_t>(r.next_token)];
    }
    // The most likely bonus token under p_{gamma+1} is the most frequent one.
    Eigen::Index best = 0;
    z.col(gamma).maxCoeff(&best);
    CHECK(std::max_element(bonus_counts.begin(), bonus_counts.end()) - bonus_counts.begin() == best);
}

TEST_CASE("A drafted token with q(x) = 0 or p(x) = 0 is always rejected", "[verify]") {
    constexpr float inf = std::numeric_limits<float>::infinity();
    Eigen::MatrixXf z(3, 2);
    z << 0.0f, 0.0f, -inf, 0.0f, 0.0f, 0.0f;  // token 1 impossible under p_1
    Eigen::MatrixXf q(3, 1);
    q << 0.0f, 1.0f, 0.0f;
    std::mt19937_64 rng(1);
    specdec::verify_workspace ws;
    const std::vector<token_id> draft1{1};
    for (int i = 0; i < 200; ++i) {
        const auto r = specdec::verify(z, draft1, q, {}, rng, ws);
        CHECK(r.accepted == 0);
        CHECK(r.next_token != 1);
    }
    // Token 2 drafted although the drafter said q(2) = 0.
    const std::vector<token_id> draft2{2};
    for (int i = 0; i < 200; ++i) CHECK(specdec::verify(z, draft2, q, {}, rng, ws).accepted == 0);
}

namespace {
/// A generator whose every value is min(): every uniform01 is 0, the one uniform that accepts a
/// draft token of any positive probability.
struct zeros_rng {
    using result_type = std::uint64_t;
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return ~result_type{0}; }
    result_type operator()() { return 0; }
};
}  // namespace

TEST_CASE("A token whose probability underflows float is rejected, as sampling from standardize never emits it",
          "[verify]") {
    // exp(-103) is about 1.4e-45, the smallest subnormal float; times the scale 1 / Σ it rounds
    // to 0 in float, as standardize() writes it. Verification computed p(x) in double (about
    // 1e-47) and accepted the token when the uniform was 0. Long rows (several blocks, exps not
    // kept) and short ones, point masses and draft columns, both schemes.
    for (const Eigen::Index V : {Eigen::Index{16}, Eigen::Index{8164}}) {
        Eigen::MatrixXf z = Eigen::MatrixXf::Constant(V, 2, -1.0f);
        z(0, 0) = -103.97f;
        Eigen::VectorXf p(V);
        specdec::sampling_workspace sws;
        specdec::standardize(z.col(0), {}, p, sws);
        REQUIRE(p[0] == 0.0f);
        Eigen::MatrixXf q = Eigen::MatrixXf::Zero(V, 1);
        q(0, 0) = 1.0f;
        const std::vector<token_id> draft{0};
        specdec::verify_workspace ws;
        for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
            specdec::verify_options opts;
            opts.scheme = scheme;
            zeros_rng rng;
            const auto point = specdec::verify(z, draft, specdec::point_mass, {}, rng, ws, opts);
            CHECK(point.accepted == 0);
            CHECK(p[point.next_token] > 0.0f);
            const auto column = specdec::verify(z, draft, q, {}, rng, ws, opts);
            CHECK(column.accepted == 0);
            CHECK(p[column.next_token] > 0.0f);
        }
    }
}

TEST_CASE("The token after a rejection comes from the residual max(0, p - q), never from where q >= p",
          "[verify]") {
    // p = (0.5, 0.5, 0), q = (1, 0, 0): x = 0 is accepted with probability 0.5; after a
    // rejection the residual is (0, 0.5, 0), so the correction is always token 1.
    Eigen::MatrixXf z(3, 2);
    z.col(0) << 0.0f, 0.0f, -std::numeric_limits<float>::infinity();
    z.col(1) << 0.0f, 0.0f, 0.0f;
    Eigen::MatrixXf q(3, 1);
    q << 1.0f, 0.0f, 0.0f;
    const std::vector<token_id> draft{0};
    std::mt19937_64 rng(5);
    specdec::verify_workspace ws;
    std::size_t accepted = 0;
    constexpr int n = 20000;
    for (int i = 0; i < n; ++i) {
        const auto r = specdec::verify(z, draft, q, {}, rng, ws);
        if (r.accepted == 0) {
            CHECK(r.next_token == 1);
        } else {
            ++accepted;
        }
    }
    // Binomial(n, 0.5): sd = 0.0035 of the rate; 6 sd (false alarm ~2e-9).
    CHECK(std::abs(static_cast<double>(accepted) / n - 0.5) < 6.0 * 0.5 / std::sqrt(n));
}

TEST_CASE("Point-mass drafts: acceptance p(x), residual p without x", "[verify]") {
    // p = (0.25, 0.75): drafting token 1 is accepted with probability 0.75; after a
    // rejection the only token left is 0.
    Eigen::MatrixXf z(2, 2);
    z.col(0) << std::log(0.25f), std::log(0.75f);
    z.col(1) << 0.0f, 0.0f;
    const std::vector<token_id> draft{1};
    std::mt19937_64 rng(9);
    specdec::verify_workspace ws;
    std::size_t accepted = 0;
    constexpr int n = 20000;
    for (int i = 0; i < n; ++i) {
        const auto r = specdec::verify(z, draft, specdec::point_mass, {}, rng, ws);
        if (r.accepted == 0) {
            CHECK(r.next_token == 0);
        } else {
            ++accepted;
        }
    }
    CHECK(std::abs(static_cast<double>(accepted) / n - 0.75) < 6.0 * std::sqrt(0.75 * 0.25 / n));
}

TEST_CASE("Temperature 0 accepts exactly the argmax tokens and corrects to the argmax", "[verify]") {
    const int vocab = 10;
    const auto z = random_logits(vocab, 4, 17);
    std::vector<token_id> draft;
    for (int i = 0; i < 3; ++i) {
        Eigen::Index a = 0;
        z.col(i).maxCoeff(&a);
        draft.push_back(static_cast<token_id>(a));
    }
    Eigen::Index wrong = 0, right = 0;
    z.col(1).maxCoeff(&right);
    wrong = (right + 1) % vocab;
    draft[1] = static_cast<token_id>(wrong);
    std::mt19937_64 rng(1);
    specdec::verify_workspace ws;
    const auto r = specdec::verify(z, draft, specdec::point_mass, {.temperature = 0.0f}, rng, ws);
    CHECK(r.accepted == 1);
    CHECK(r.next_token == right);
}

TEST_CASE("Temperature 0 verification draws no randomness, under either scheme", "[verify]") {
    // Every decision follows from the argmax, so the generator is never called; the same calls
    // at temperature 1 (the control) do call it.
    const int vocab = 300;
    const auto z = random_logits(vocab, 4, 23);
    Eigen::MatrixXf q(vocab, 3);
    for (int i = 0; i < 3; ++i) {
        const Eigen::VectorXf e = random_logits(vocab, 1, 40 + static_cast<std::uint64_t>(i)).col(0).array().exp();
        q.col(i) = e / e.sum();
    }
    std::vector<token_id> all_right, first_wrong;
    for (int i = 0; i < 3; ++i) {
        Eigen::Index a = 0;
        z.col(i).maxCoeff(&a);
        all_right.push_back(static_cast<token_id>(a));
        first_wrong.push_back(static_cast<token_id>(i == 0 ? (a + 1) % vocab : a));
    }
    specdec::verify_workspace ws;
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        for (const auto* draft : {&all_right, &first_wrong}) {
            specdec_test::counting_rng greedy{3}, control{3};
            const auto r0 = specdec::verify(z, *draft, q, {.temperature = 0.0f}, greedy, ws, {.scheme = scheme});
            const auto r1 = specdec::verify(z, *draft, specdec::point_mass, {.temperature = 0.0f}, greedy, ws,
                                            {.scheme = scheme});
            specdec::verify(z, *draft, q, {.temperature = 1.0f}, control, ws, {.scheme = scheme});
            INFO("scheme " << static_cast<int>(scheme) << ", first draft " << (*draft)[0]);
            CHECK(r0.accepted == (draft == &all_right ? 3u : 0u));
            CHECK(r1.accepted == r0.accepted);
            CHECK(greedy.calls == 0);
            CHECK(control.calls > 0);
        }
    }
}

TEST_CASE("Lenience raises acceptance and keeps every token below p(x)/l", "[verify][lenience]") {
    // p = (0.2, 0.8), q = (0.8, 0.2): drafting token 0 is accepted with probability
    // min(1, 0.2 / (l 0.8)); l = 0.5 gives 0.5 instead of 0.25.
    Eigen::MatrixXf z(2, 2);
    z.col(0) << std::log(0.2f), std::log(0.8f);
    z.col(1) << 0.0f, 0.0f;
    Eigen::MatrixXf q(2, 1);
    q << 0.8f, 0.2f;
    const std::vector<token_id> draft{0};
    std::mt19937_64 rng(2);
    specdec::verify_workspace ws;
    constexpr int n = 20000;
    for (float l : {1.0f, 0.5f}) {
        std::size_t accepted = 0;
        for (int i = 0; i < n; ++i)
            accepted +=
                specdec::verify(z, draft, q, {}, rng, ws, {.lenience = l, .scheme = specdec::verification_scheme::token})
                    .accepted;
        const double expect = std::min(1.0, 0.2 / (l * 0.8));
        INFO("lenience " << l);
        CHECK(std::abs(static_cast<double>(accepted) / n - expect) < 6.0 * std::sqrt(expect * (1 - expect) / n));
        // With the draft token drawn from q, as a drafter would: the first emitted token is 0
        // with probability q(0) min(1, p(0) / (l q(0))) = min(0.8, 0.2 / l) (token 1, accepted
        // with probability 1 here, is never rejected), which must not exceed p(0) / l. (6 sd: a
        // false alarm about 2e-9 per check.)
        std::size_t zeros = 0;
        for (int i = 0; i < n; ++i) {
            const std::vector<token_id> drawn{specdec::uniform01(rng) < 0.8 ? 0 : 1};
            const auto r = specdec::verify(z, drawn, q, {}, rng, ws,
                                           {.lenience = l, .scheme = specdec::verification_scheme::token});
            if ((r.accepted == 1 ? drawn[0] : r.next_token) == 0) ++zeros;
        }
        const double p0 = std::min(0.8, 0.2 / l), freq = static_cast<double>(zeros) / n;
        CHECK(std::abs(freq - p0) < 6.0 * std::sqrt(p0 * (1 - p0) / n));
        CHECK(freq <= 0.2 / l + 6.0 * std::sqrt(p0 * (1 - p0) / n));
    }
}

TEST_CASE("verify rejects malformed input with messages that name the problem", "[verify][errors]") {
    const auto z = random_logits(8, 3, 4);
    Eigen::MatrixXf q = softmax_columns(random_logits(8, 2, 5));
    const std::vector<token_id> draft{1, 2};
    std::mt19937_64 rng(1);
    specdec::verify_workspace ws;
    CHECK_THROWS_WITH(specdec::verify(z.leftCols(2), draft, q, {}, rng, ws), contains("columns"));
    CHECK_THROWS_WITH(specdec::verify(z, draft, q.topRows(7), {}, rng, ws), contains("draft_probs is 7 x 2"));
    const std::vector<token_id> out_of_range{1, 8};
    CHECK_THROWS_WITH(specdec::verify(z, out_of_range, q, {}, rng, ws), contains("draft_tokens[1] = 8"));
    const std::vector<token_id> negative{-1, 0};
    CHECK_THROWS_WITH(specdec::verify(z, negative, q, {}, rng, ws), contains("out of range"));
    CHECK_THROWS_WITH(specdec::verify(z, draft, q, {.temperature = -1.0f}, rng, ws), contains("temperature"));
    CHECK_THROWS_WITH(specdec::verify(z, draft, q, {.top_p = 0.0f}, rng, ws), contains("top_p"));
    CHECK_THROWS_WITH(specdec::verify(z, draft, q, {}, rng, ws, {.lenience = 0.0f}), contains("lenience"));
    CHECK_THROWS_WITH(specdec::verify(z, draft, q, {}, rng, ws, {.lenience = 1.5f}), contains("lenience"));
    CHECK_THROWS_WITH(specdec::verify(z, draft, q, {}, rng, ws, {.lenience = 0.5f}),
                      contains("token verification only"));
    Eigen::MatrixXf neg = q;
    neg(0, 0) = -0.1f;
    neg(1, 0) += 0.1f;
    CHECK_THROWS_WITH(specdec::verify(z, draft, neg, {}, rng, ws), contains("not a probability"));
    Eigen::MatrixXf unnormalized = q * 1.5f;
    CHECK_THROWS_WITH(specdec::verify(z, draft, unnormalized, {}, rng, ws), contains("sums to"));
    Eigen::MatrixXf bad_logits = z;
    bad_logits(3, 0) = std::nanf("");
    CHECK_THROWS_WITH(specdec::verify(bad_logits, draft, q, {}, rng, ws),
                      contains("specdec::verify: target_logits column 0: logit 3 is NaN"));
    bad_logits(3, 0) = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH(specdec::verify(bad_logits, draft, q, {}, rng, ws), contains("column 0: logit 3 is +Inf"));
    bad_logits.col(0).setConstant(-std::numeric_limits<float>::infinity());
    CHECK_THROWS_WITH(specdec::verify(bad_logits, draft, q, {}, rng, ws), contains("column 0: every logit is -Inf"));
    for (const float t : {0.0f, 1.0f}) {  // greedy rows too, and a later column
        Eigen::MatrixXf later = z;
        later(5, 1) = std::nanf("");
        const std::vector<token_id> accepted_draft{static_cast<token_id>(0)};
        Eigen::MatrixXf two = later.leftCols(2), q1 = Eigen::MatrixXf::Zero(8, 1);
        two.col(0).setConstant(-std::numeric_limits<float>::infinity());
        two(0, 0) = 5.0f;  // p = q = the point mass at the draft token: always accepted
        q1(0, 0) = 1.0f;
        CHECK_THROWS_WITH(specdec::verify(two, accepted_draft, q1, {.temperature = t}, rng, ws),
                          contains("target_logits column 1: logit 5 is NaN"));
    }
}

TEST_CASE("The draft-column check finds a bad entry anywhere in a long column and accepts -0.0", "[verify][errors]") {
    // Columns long enough for the vectorized loop of the checking pass (a short row, one block
    // of 2048, several blocks), with the bad entry in the body, in a partial tail and at the end.
    for (const int vocab : {300, 2048, 5000}) {
        const auto z = random_logits(vocab, 2, 11);
        const Eigen::MatrixXf q = softmax_columns(random_logits(vocab, 1, 12));
        const std::vector<token_id> draft{3};
        specdec::verify_workspace ws;
        for (const int at : {0, 77, 257, vocab - 1}) {
            for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
                INFO("vocab " << vocab << ", entry " << at << ", block scheme " << (scheme == specdec::verification_scheme::block));
                std::mt19937_64 rng(1);
                Eigen::MatrixXf bad = q;
                bad(at, 0) = -q(at, 0) - 1e-4f;  // negative, with the column's sum kept near 1
                bad((at + 1) % vocab, 0) += 2.0f * q(at, 0) + 1e-4f;
                CHECK_THROWS_WITH(specdec::verify(z, draft, bad, {}, rng, ws, {.scheme = scheme}), contains("not a probability"));
                bad = q;
                bad(at, 0) = std::nanf("");
                CHECK_THROWS_WITH(specdec::verify(z, draft, bad, {}, rng, ws, {.scheme = scheme}), contains("not a probability"));
                bad(at, 0) = -std::nanf("");
                CHECK_THROWS_WITH(specdec::verify(z, draft, bad, {}, rng, ws, {.scheme = scheme}), contains("not a probability"));
                // -0.0 is a probability: same outcome as +0.0 from the same seed.
                Eigen::MatrixXf zero = q;
                zero((at + 1) % vocab, 0) += q(at, 0);
                zero(at, 0) = 0.0f;
                Eigen::MatrixXf minus_zero = zero;
                minus_zero(at, 0) = -0.0f;
                std::mt19937_64 a(5), b(5);
                const auto r0 = specdec::verify(z, draft, zero, {}, a, ws, {.scheme = scheme});
                const auto r1 = specdec::verify(z, draft, minus_zero, {}, b, ws, {.scheme = scheme});
                CHECK(r1.accepted == r0.accepted);
                CHECK(r1.next_token == r0.next_token);
            }
        }
    }
}
TEST_CASE("Scaled draft columns give the decisions and draws of the columns multiplied out", "[verify][scales]") {
    // q_i = c_i · w_i with c_i a power of two, so that w_i = q_i / c_i and c_i · w_i = q_i hold
    // exactly in float: every decision and draw must then be the same, uniform for uniform, as
    // verify() on q itself, on every path (short rows that keep their exps, rows of several
    // blocks with grouped proposals, block verification's lane bounds and coins, stored
    // truncated rows, temperature 0), with and without the check.
    std::mt19937_64 g(41);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const specdec::sampling_config settings[] = {
        {.temperature = 1.0f}, {.temperature = 0.7f}, {.temperature = 1.0f, .top_k = 40}, {.temperature = 0.0f}};
    const float powers[] = {0x1p-6f, 0x1p-1f, 0x1p3f, 0x1p9f};
    std::size_t rejections = 0, cases = 0;
    for (const int vocab : {300, 7000}) {
        const int gamma = 3;
        for (int trial = 0; trial < 24; ++trial) {
            const float noise = trial % 3 == 0 ? 0.2f : trial % 3 == 1 ? 1.0f : 3.0f;
            Eigen::MatrixXf z(vocab, gamma + 1), dz(vocab, gamma);
            for (int j = 0; j <= gamma; ++j)
                for (int k = 0; k < vocab; ++k) z(k, j) = 2.0f * n(g);
            for (int j = 0; j < gamma; ++j)
                for (int k = 0; k < vocab; ++k) dz(k, j) = z(k, j) + noise * n(g);
            for (const auto& s : settings) {
                specdec::sampling_workspace sws;
                Eigen::MatrixXf q(vocab, gamma), w(vocab, gamma);
                std::vector<float> scales(gamma);
                std::vector<token_id> draft(gamma);
                for (int j = 0; j < gamma; ++j) {
                    Eigen::VectorXf col(vocab);
                    specdec::standardize(dz.col(j), s, col, sws);
                    q.col(j) = col;
                    scales[static_cast<std::size_t>(j)] = powers[(trial + j) % 4];
                    w.col(j) = col / scales[static_cast<std::size_t>(j)];
                    draft[static_cast<std::size_t>(j)] =
                        static_cast<token_id>(specdec::sample_from_weights(col, specdec::uniform01(g), sws));
                }
                for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block})
                    for (const bool check : {true, false}) {
                        INFO("vocab " << vocab << ", trial " << trial << ", temperature " << s.temperature << ", top_k "
                                      << s.top_k << ", block " << (scheme == specdec::verification_scheme::block)
                                      << ", check " << check);
                        const specdec::verify_options opts{.check_draft_distributions = check, .scheme = scheme};
                        specdec::verify_workspace ws_q, ws_w;
                        for (std::uint64_t seed = 0; seed < 4; ++seed) {
                            specdec_test::counting_rng a(seed), b(seed);
                            const auto r0 = specdec::verify(z, draft, q, s, a, ws_q, opts);
                            const auto r1 = specdec::verify(z, draft, w, scales, s, b, ws_w, opts);
                            REQUIRE(r1.accepted == r0.accepted);
                            REQUIRE(r1.next_token == r0.next_token);
                            REQUIRE(b.calls == a.calls);
                            rejections += r0.accepted < static_cast<std::size_t>(gamma);
                            ++cases;
                        }
                    }
            }
        }
    }
    // Both outcomes are common, so the residual draws were compared as often as the bonus draws.
    CHECK(rejections > cases / 4);
    CHECK(rejections < cases * 3 / 4 + cases / 8);
}

TEST_CASE("verify with draft scales names a bad scale or a scaled column that is not a distribution",
          "[verify][errors][scales]") {
    const auto z = random_logits(8, 3, 4);
    const Eigen::MatrixXf q = softmax_columns(random_logits(8, 2, 5));
    const std::vector<token_id> draft{1, 2};
    std::mt19937_64 rng(1);
    specdec::verify_workspace ws;
    const std::vector<float> ones{1.0f, 1.0f}, one{1.0f};
    CHECK_NOTHROW(specdec::verify(z, draft, q, ones, {}, rng, ws));
    CHECK_THROWS_WITH(specdec::verify(z, draft, q, one, {}, rng, ws), contains("draft_scales has 1 entries"));
    for (const float bad : {0.0f, -1.0f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
        const std::vector<float> scales{1.0f, bad};
        CHECK_THROWS_WITH(specdec::verify(z, draft, q, scales, {}, rng, ws),
                          contains("draft_scales[1] = ") && contains("finite and positive"));
    }
    // The check applies to the products: q itself with a scale of 2 sums to 2.
    const std::vector<float> doubled{1.0f, 2.0f};
    CHECK_THROWS_WITH(specdec::verify(z, draft, q, doubled, {}, rng, ws),
                      contains("column 1 times draft_scales[1] = 2 sums to "));
    // Weights that do not sum to 1 are fine with the scale that normalizes them.
    const Eigen::MatrixXf w = q * 8.0f;
    const std::vector<float> eighths{0.125f, 0.125f};
    CHECK_NOTHROW(specdec::verify(z, draft, w, eighths, {}, rng, ws));
    CHECK_THROWS_WITH(specdec::verify(z, draft, w, {}, rng, ws), contains("sums to"));
    Eigen::MatrixXf neg = w;
    neg(0, 0) = -0.1f;
    CHECK_THROWS_WITH(specdec::verify(z, draft, neg, eighths, {}, rng, ws), contains("draft_probs(0, 0) = -0.1"));
    // At temperature 0 the one entry read is checked, scaled: 8 · q(x) may exceed 1.
    Eigen::MatrixXf big = q;
    big(1, 0) = 0.5f;
    const std::vector<float> fours{4.0f, 1.0f};
    CHECK_THROWS_WITH(specdec::verify(z, draft, big, fours, {.temperature = 0.0f}, rng, ws),
                      contains("draft_scales[0] * draft_probs(1, 0) = 2"));
}

TEST_CASE("verify with no draft tokens samples one token from the first row", "[verify]") {
    Eigen::MatrixXf z(4, 1);
    z << -1.0f, 2.0f, 0.0f, 1.0f;
    std::mt19937_64 rng(1);
    specdec::verify_workspace ws;
    const auto r = specdec::verify(z, std::span<const token_id>{}, specdec::point_mass, {.temperature = 0.0f}, rng, ws);
    CHECK(r.accepted == 0);
    CHECK(r.next_token == 1);
}

TEST_CASE("Emitted tokens are always inside the vocabulary, even for near-degenerate rows", "[verify]") {
    // p and q equal up to rounding: any rejection meets a residual of (almost) zero mass,
    // which falls back to p.
    const int vocab = 50;
    std::mt19937_64 rng(8);
    specdec::verify_workspace ws;
    for (std::uint64_t seed = 0; seed < 200; ++seed) {
        const auto z = random_logits(vocab, 3, seed);
        Eigen::MatrixXf q = softmax_columns(z.leftCols(2));
        q.col(0) *= 1.0f + 1e-7f;  // q slightly above p: rejections are possible, residual tiny
        q.col(0) /= q.col(0).sum();
        const std::vector<token_id> draft{static_cast<token_id>(seed % vocab), static_cast<token_id>((seed * 7) % vocab)};
        const auto r = specdec::verify(z, draft, q, {}, rng, ws);
        CHECK(r.next_token >= 0);
        CHECK(r.next_token < vocab);
        CHECK(r.accepted <= 2);
    }
}
