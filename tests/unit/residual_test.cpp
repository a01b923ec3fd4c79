// The pieces of the hot core that small-vocabulary tests cannot reach: rows that span several
// 2048-token blocks, the residual draw by rejection sampling from p with its exact fallback
// (on long rows, and on short rows whose pass keeps its exponentials), the blockwise inverse
// CDF with group skipping, the lane-wise draw from a prepared row, and the fused argmax pass.
//
// Statistical cases: 100,000 draws each, Pearson's chi-square against the exact residual
// computed in double precision; a case fails at p < 1e-4 (false alarm rate below 1e-4 per
// case, seeds fixed). Each distribution case has a negative control: the same draws tested
// against p, which is what a residual sampler that skipped its acceptance test would produce,
// must fail (p < 1e-4).

#include "support/catch.hpp"
#include "support/counting_rng.hpp"
#include "support/markov.hpp"
#include "support/stats.hpp"

#include <specdec/verify.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

using specdec::token_id;

namespace {

constexpr Eigen::Index kVocab = 6500;  // four blocks of 2048, the last one partial
constexpr std::size_t kDraws = 100000;
constexpr double kFalseAlarm = 1e-4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// The chi-square test of `counts` against the residual's probabilities (must pass at
/// kFalseAlarm), and its negative control: `control` (the same draws, counted where p has
/// cells of its own) against p (must fail).
void check_residual_law(const std::vector<std::size_t>& counts, const std::vector<double>& residual,
                        const std::vector<std::size_t>& control, const std::vector<double>& p) {
    const auto ok = specdec_test::chi_square_test(counts, residual);
    INFO("against the residual: chi2 = " << ok.statistic << ", df = " << ok.degrees_of_freedom << ", p = " << ok.p_value);
    CHECK(ok.p_value >= kFalseAlarm);
    const auto wrong = specdec_test::chi_square_test(control, p);
    INFO("negative control, against p: chi2 = " << wrong.statistic << ", p = " << wrong.p_value);
    CHECK(wrong.p_value < kFalseAlarm);
}

/// A vocabulary, the tokens where p > 0, and a draft token outside them.
struct case_shape {
    Eigen::Index vocab;
    std::vector<token_id> support;
    token_id draft;
};

/// Four blocks of 2048, the last one partial: support tokens spread over blocks 0, 1 and 3
/// (block 2 is all -Inf), including block edges and the partial last block.
case_shape long_rows() {
    std::vector<token_id> s{0, 1, 15, 16, 17, 255, 256, 1000, 2046, 2047, 2048, 2049, 3000, 4095};
    for (token_id t = 6144; t < 6500; t += 23) s.push_back(t);
    s.push_back(6499);
    return {kVocab, s, 5000};
}

/// A row within detail::kept_row_limit (the pass keeps its exponentials) of 1000 tokens, or of
/// `vocab` >= 1000: support over both chunks of 256 and the partial chunk and lanes at the end
/// of the first 1000 tokens, and past them every 37th token up to the last.
case_shape short_rows(Eigen::Index vocab = 1000) {
    std::vector<token_id> s{0, 1, 15, 16, 17, 255, 256, 257, 511, 512};
    for (token_id t = 700; t < 999; t += 13) s.push_back(t);
    s.push_back(999);
    for (token_id t = 1024; t < vocab - 1; t += 37) s.push_back(t);
    if (vocab > 1000) s.push_back(static_cast<token_id>(vocab - 1));
    return {vocab, s, 600};
}

struct residual_case {
    Eigen::MatrixXf logits;  // V x 2: column 0 is tested, column 1 is never read
    Eigen::MatrixXf q;       // V x 1
    token_id draft = 0;      // p(draft) = 0 < q(draft): always rejected
    std::vector<token_id> support;
    std::vector<double> p;         // over support
    std::vector<double> residual;  // norm(max(0, p − l q)) over support
};

/// p from logits N(0, sigma²) on the support; q = p − ε u + ε δ(draft) with u uniform on the
/// support, so that the residual max(0, p − q) is ε u: its mass is ε and it is not p.
residual_case make_case(double eps, float sigma, double lenience, std::uint64_t seed, const case_shape& shape = long_rows()) {
    residual_case c;
    c.support = shape.support;
    c.draft = shape.draft;  // a -Inf logit: p(draft) = 0
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.0f, sigma);
    c.logits = Eigen::MatrixXf::Constant(shape.vocab, 2, kNegInf);
    c.logits(0, 1) = 0.0f;
    for (token_id t : c.support) c.logits(t, 0) = n(g);
    double m = -1e300, s = 0.0;
    for (token_id t : c.support) m = std::max(m, static_cast<double>(c.logits(t, 0)));
    for (token_id t : c.support) s += std::exp(c.logits(t, 0) - m);
    const double u = 1.0 / static_cast<double>(c.support.size());
    c.q = Eigen::MatrixXf::Zero(shape.vocab, 1);
    for (token_id t : c.support) {
        const double pt = std::exp(c.logits(t, 0) - m) / s;
        REQUIRE(pt >= eps * u);  // q stays a distribution
        c.p.push_back(pt);
        c.q(t, 0) = static_cast<float>(pt - eps * u);
    }
    c.q(c.draft, 0) = static_cast<float>(eps);
    double total = 0.0;
    for (std::size_t i = 0; i < c.support.size(); ++i) {
        const double r = std::max(0.0, c.p[i] - lenience * c.q(c.support[i], 0));
        c.residual.push_back(r);
        total += r;
    }
    for (double& r : c.residual) r /= total;
    return c;
}

/// Counts over the support of kDraws emitted tokens (every one a rejection at position 0).
std::vector<std::size_t> draw_counts(const residual_case& c, const specdec::verify_options& opts, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    specdec::verify_workspace ws;
    std::vector<std::size_t> counts(c.support.size(), 0);
    const token_id tokens[] = {c.draft};
    for (std::size_t i = 0; i < kDraws; ++i) {
        const auto r = specdec::verify(c.logits, tokens, c.q, {}, rng, ws, opts);
        REQUIRE(r.accepted == 0);
        const auto at = std::find(c.support.begin(), c.support.end(), r.next_token);
        REQUIRE(at != c.support.end());  // never outside the residual's support
        ++counts[static_cast<std::size_t>(at - c.support.begin())];
    }
    return counts;
}

void check_residual(const residual_case& c, const specdec::verify_options& opts, std::uint64_t seed) {
    const auto counts = draw_counts(c, opts, seed);
    check_residual_law(counts, c.residual, counts, c.p);
}

}  // namespace

TEST_CASE("The residual draw over a multi-block vocabulary has the residual distribution when proposals succeed",
          "[statistical][residual]") {
    // Residual mass 0.5 (R_lo = 0.5: 12 proposals, all failing with probability 2e-4): the
    // draws are accepted proposals from p.
    const residual_case c = make_case(0.5, 0.2f, 1.0, 7);
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        INFO((scheme == specdec::verification_scheme::token ? "token" : "block"));
        check_residual(c, {.scheme = scheme}, 100);
    }
}

TEST_CASE("The residual draw has the residual distribution when the exact pass draws most tokens",
          "[statistical][residual]") {
    // Residual mass 0.01, known to be at least R_lo = q(draft) = 0.01: 1 / R_lo = 100 expected
    // proposals would cost more than the budget, so 6 are made (6500 / residual_proposal_cost),
    // which all fail with probability 0.99^6 = 0.94: the exact pass over the residual draws most
    // tokens.
    REQUIRE(kVocab / specdec::residual_proposal_cost == 6);
    const residual_case c = make_case(0.01, 1.0f, 1.0, 8);
    check_residual(c, {.scheme = specdec::verification_scheme::token}, 200);
}

TEST_CASE("The residual draw has the residual distribution when proposals and the exact pass share the draws",
          "[statistical][residual]") {
    // Residual mass 0.1 (R_lo = 0.1, 1 / R_lo = 10 > the budget of 6): 6 proposals, which all
    // fail with probability 0.9^6 = 0.53, so about half of the tokens come from accepted
    // proposals and half from the exact pass: the mixture over where the draw stops must be
    // the residual too.
    REQUIRE(kVocab / specdec::residual_proposal_cost == 6);
    const residual_case c = make_case(0.1, 1.0f, 1.0, 10);
    check_residual(c, {.scheme = specdec::verification_scheme::token}, 250);
}

TEST_CASE("After a point-mass draft is rejected on a long row the correction follows p without it",
          "[statistical][residual]") {
    // q = δ(x): x is accepted with probability p(x), and the residual is p with x removed. On
    // a long row up to point_mass_proposals proposals from p (accepted unless they are x) come
    // before the exact draw from the block masses, and only when R = 1 − p(x) >= 1/4:
    //  - p(x) = 0.3: proposals draw nearly every token (all eight fail with probability 7e-5);
    //  - p(x) = 0.7: all eight fail with probability 0.058, so both share the draws;
    //  - p(x) = 0.8: no proposal, the exact draw alone.
    // 100,000 / 50,000 / 25,000 rejections (fewer where rejections are rarer, to bound the
    // calls); negative control: the same draws against p (x included).
    const case_shape shape = long_rows();
    const token_id x = 2049;  // in the support, in block 1
    const std::pair<double, std::size_t> cases[] = {{0.3, kDraws}, {0.7, kDraws / 2}, {0.8, kDraws / 4}};
    for (const auto& [px, draws] : cases) {
        std::mt19937_64 g(41);
        std::normal_distribution<float> n(0.0f, 1.0f);
        Eigen::MatrixXf logits = Eigen::MatrixXf::Constant(shape.vocab, 2, kNegInf);
        logits(0, 1) = 0.0f;
        double others = 0.0;
        for (token_id t : shape.support)
            if (t != x) others += std::exp(static_cast<double>(logits(t, 0) = n(g)));
        logits(x, 0) = static_cast<float>(std::log(others) + std::log(px / (1.0 - px)));
        double total = 0.0;
        for (token_id t : shape.support) total += std::exp(static_cast<double>(logits(t, 0)));
        std::vector<double> p, residual;
        for (token_id t : shape.support) {
            p.push_back(std::exp(static_cast<double>(logits(t, 0))) / total);
            residual.push_back(t == x ? 0.0 : std::exp(static_cast<double>(logits(t, 0))) / others);
        }
        std::mt19937_64 rng(300);
        specdec::verify_workspace ws;
        std::vector<std::size_t> counts(shape.support.size(), 0);
        const token_id tokens[] = {x};
        std::size_t calls = 0;
        for (std::size_t rejected = 0; rejected < draws; ++calls) {
            const auto r = specdec::verify(logits, tokens, specdec::point_mass, {}, rng, ws,
                                           {.scheme = specdec::verification_scheme::token});
            if (r.accepted == 1) continue;
            const auto at = std::find(shape.support.begin(), shape.support.end(), r.next_token);
            REQUIRE(at != shape.support.end());
            ++counts[static_cast<std::size_t>(at - shape.support.begin())];
            ++rejected;
        }
        INFO("p(x) = " << px << ", rejected " << draws << " of " << calls);
        check_residual_law(counts, residual, counts, p);
    }
}

TEST_CASE("After a point-mass draft in the last of many blocks is rejected the correction follows p without it",
          "[statistical][residual]") {
    // The exact draw that follows eight failed proposals walks the residual's block sums to the
    // block the uniform lands in. Those sums must survive the proposals, which draw from p by
    // its running block masses. Eight blocks of 2048: p spread evenly over blocks 0-6 (every
    // 64th token) and x in block 7 with p(x) = 0.74, so the residual mass 0.26 is just above the
    // threshold for proposals and all eight fail with probability 0.74^8 = 0.09. A walk over
    // the running masses instead of the block sums stops by block 3 and never draws from blocks
    // 4-6, which hold 3/7 of the residual. Counted per block (seven cells), 20,000 rejections
    // per scheme (token and block verification); negative control: the same counts against
    // p's block masses, x's block included.
    constexpr Eigen::Index vocab = 8 * 2048;
    constexpr token_id x = 7 * 2048 + 100;
    constexpr double px = 0.74;
    constexpr std::size_t draws = 20000;
    Eigen::MatrixXf logits = Eigen::MatrixXf::Constant(vocab, 2, kNegInf);
    logits(0, 1) = 0.0f;
    std::size_t support = 0;
    for (Eigen::Index t = 0; t < 7 * 2048; t += 64) logits(t, 0) = 0.0f, ++support;
    logits(x, 0) = static_cast<float>(std::log(static_cast<double>(support)) + std::log(px / (1.0 - px)));
    const std::vector<double> residual(7, 1.0 / 7.0);
    std::vector<double> p(8, (1.0 - px) / 7.0);
    p[7] = px;
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        std::mt19937_64 rng(301);
        specdec::verify_workspace ws;
        std::vector<std::size_t> counts(7, 0), with_x(8, 0);
        const token_id tokens[] = {x};
        std::size_t calls = 0;
        for (std::size_t rejected = 0; rejected < draws; ++calls) {
            const auto r = specdec::verify(logits, tokens, specdec::point_mass, {}, rng, ws, {.scheme = scheme});
            if (r.accepted == 1) continue;
            REQUIRE(r.next_token != x);
            REQUIRE(logits(r.next_token, 0) == 0.0f);
            ++counts[static_cast<std::size_t>(r.next_token / 2048)];
            ++with_x[static_cast<std::size_t>(r.next_token / 2048)];
            ++rejected;
        }
        INFO((scheme == specdec::verification_scheme::token ? "token" : "block") << " verification: rejected " << draws
                                                                                  << " of " << calls);
        std::string cells;
        for (const std::size_t c : counts) cells += std::to_string(c) + " ";
        INFO("rejections per block: " << cells);
        check_residual_law(counts, residual, with_x, p);
    }
}

TEST_CASE("On a short row whose pass keeps its exponentials the residual draw has the residual distribution",
          "[statistical][residual]") {
    // 1000 tokens, below residual_proposal_cost: no proposal, the exact pass over the kept
    // exponentials draws every token. 1800 tokens: a budget of one proposal; with mass 0.5
    // (1 / R_lo = 2 > 1) the proposal and the exact pass each draw about half of the tokens,
    // with mass 0.01 the exact pass draws 99% of them.
    REQUIRE(1800 <= specdec::detail::kept_row_limit);
    REQUIRE(1000 / specdec::residual_proposal_cost == 0);
    REQUIRE(1800 / specdec::residual_proposal_cost == 1);
    for (const Eigen::Index vocab : {1000, 1800}) {
        for (const double mass : {0.5, 0.01}) {
            INFO("vocabulary " << vocab << ", residual mass " << mass);
            const residual_case c = make_case(mass, 0.2f, 1.0, 12, short_rows(vocab));
            for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
                INFO((scheme == specdec::verification_scheme::token ? "token" : "block"));
                check_residual(c, {.scheme = scheme}, (mass == 0.5 ? 400 : 500) + static_cast<std::uint64_t>(vocab));
            }
        }
    }
}

TEST_CASE("A short row below the proposal budget draws its residual with one uniform", "[residual]") {
    // Token verification that rejects its only draft: one uniform for the test, then the
    // residual. Below residual_proposal_cost tokens the exact pass takes the draw's first
    // uniform; at 1800 tokens one proposal comes first (a draw and a test: two uniforms, and
    // one more for the exact pass when the proposal fails).
    for (const Eigen::Index vocab : {1000, 1800}) {
        INFO("vocabulary " << vocab);
        const residual_case c = make_case(0.01, 0.2f, 1.0, 13, short_rows(vocab));
        const token_id tokens[] = {c.draft};
        specdec::verify_workspace ws;
        specdec_test::counting_rng rng{5};
        int least = 1 << 30, most = 0;
        for (int i = 0; i < 200; ++i) {
            rng.calls = 0;
            const auto r =
                specdec::verify(c.logits, tokens, c.q, {}, rng, ws, {.scheme = specdec::verification_scheme::token});
            REQUIRE(r.accepted == 0);
            least = std::min(least, rng.calls);
            most = std::max(most, rng.calls);
        }
        if (vocab < specdec::residual_proposal_cost) {
            CHECK(least == 2);
            CHECK(most == 2);
        } else {
            CHECK(least >= 3);  // the proposal's two uniforms at least
            CHECK(most == 4);   // mass 0.01: most proposals fail, and the exact pass draws
        }
    }
}

TEST_CASE("With lenience the residual draw follows norm(max(0, p - l q))", "[statistical][residual][lenience]") {
    const residual_case c = make_case(0.3, 0.25f, 0.5, 9);
    check_residual(c, {.lenience = 0.5f, .scheme = specdec::verification_scheme::token}, 300);
}

TEST_CASE("The blockwise inverse CDF returns the index a plain running sum gives", "[residual]") {
    std::mt19937_64 g(3);
    std::uniform_real_distribution<float> w(0.0f, 1.0f);
    std::bernoulli_distribution zero(0.3);
    const Eigen::Index n = 5000, nb = specdec::detail::blocks_of(n);
    std::vector<float> weights(static_cast<std::size_t>(n));
    for (auto& x : weights) x = zero(g) ? 0.0f : w(g);
    std::fill(weights.begin() + 2048, weights.begin() + 4096, 0.0f);  // an empty block
    std::vector<double> sums(static_cast<std::size_t>(nb), 0.0), cum(static_cast<std::size_t>(n));
    double acc = 0.0;
    for (Eigen::Index k = 0; k < n; ++k) {
        sums[static_cast<std::size_t>(k / specdec::detail::row_block)] += weights[static_cast<std::size_t>(k)];
        cum[static_cast<std::size_t>(k)] = acc += weights[static_cast<std::size_t>(k)];
    }
    std::vector<float> buf(static_cast<std::size_t>(specdec::detail::row_block));
    auto fill = [&](Eigen::Index b, Eigen::Index off, Eigen::Index len, float* out) {
        std::copy_n(weights.begin() + b * specdec::detail::row_block + off, len, out);
    };
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (int t = 0; t < 20000; ++t) {
        const double u = t == 0 ? 0.0 : t == 1 ? std::nextafter(1.0, 0.0) : u01(g);
        const Eigen::Index k = specdec::detail::kernels::draw_by_blocks(sums.data(), nb, n, acc, u, buf.data(), fill);
        REQUIRE(k >= 0);
        REQUIRE(k < n);
        REQUIRE(weights[static_cast<std::size_t>(k)] > 0.0f);
        REQUIRE(buf[static_cast<std::size_t>(k % specdec::detail::row_block)] == weights[static_cast<std::size_t>(k)]);
        // The running sum crosses u·total at k, up to float rounding of the group sums.
        const double target = u * acc, slack = 1e-5 * acc;
        const double before = k > 0 ? cum[static_cast<std::size_t>(k - 1)] : 0.0;
        CHECK(before <= target + slack);
        CHECK(cum[static_cast<std::size_t>(k)] >= target - slack);
    }
}

namespace {

/// One column of vocab N(0, sigma²) logits, about 30% of them -Inf, and tokens 2048..4095 (the
/// second 2048-token block) all -Inf.
Eigen::MatrixXf holey_logits(Eigen::Index vocab, float sigma, std::mt19937_64& g) {
    std::normal_distribution<float> n(0.0f, sigma);
    std::bernoulli_distribution hole(0.3);
    Eigen::MatrixXf logits(vocab, 1);
    for (Eigen::Index k = 0; k < vocab; ++k) logits(k, 0) = hole(g) || (k >= 2048 && k < 4096) ? kNegInf : n(g);
    return logits;
}

/// A row of holey_logits prepared at temperature 0.7, with its workspace.
struct prepared_holey_row {
    Eigen::MatrixXf logits;
    specdec::detail::verify_buffers ws;
    specdec::detail::target_row row;
    prepared_holey_row(Eigen::Index vocab, float sigma, std::mt19937_64& g) : logits(holey_logits(vocab, sigma, g)) {
        const specdec::sampling_config s{.temperature = 0.7f};
        specdec::detail::reserve_rows(ws, vocab, 0, s);
        row = specdec::detail::kernels::prepare_row(logits, 0, s, ws, "test");
    }
};

/// Running sums of weight(k) over a row of vocab tokens in the draws' order: 2048-token block,
/// 256-token chunk, lane (offset mod 16), element. before[k] / at[k]: the sum up to token k,
/// without / with it.
struct lane_order_sums {
    std::vector<double> before, at;
    double total = 0.0;
};
template <class Weight>
lane_order_sums sums_in_lane_order(Eigen::Index vocab, Weight&& weight) {
    using specdec::detail::exp_chunk;
    using specdec::detail::row_block;
    lane_order_sums r;
    r.before.assign(static_cast<std::size_t>(vocab), -1.0);
    r.at.assign(static_cast<std::size_t>(vocab), -1.0);
    for (Eigen::Index b = 0; b * row_block < vocab; ++b)
        for (Eigen::Index c = 0; c < row_block / exp_chunk; ++c)
            for (Eigen::Index l = 0; l < 16; ++l)
                for (Eigen::Index k = 0; k < exp_chunk / 16; ++k) {
                    const Eigen::Index at = b * row_block + c * exp_chunk + l + 16 * k;
                    if (at >= vocab) continue;
                    r.before[static_cast<std::size_t>(at)] = r.total;
                    r.at[static_cast<std::size_t>(at)] = r.total += weight(at);
                }
    return r;
}

}  // namespace

TEST_CASE("A draw from a prepared row follows the (block, chunk, lane, element) order of the cumulative p",
          "[residual]") {
    // 5000 tokens: blocks of 2048, 2048 and 904 (a partial chunk and partial lanes at the end);
    // block 1 is all -Inf, and a third of the other logits are -Inf too. 1000 tokens: one
    // block, whose exponentials the pass keeps (the lane's elements are read, not recomputed).
    std::mt19937_64 g(11);
    const Eigen::Index vocab = GENERATE(Eigen::Index{5000}, Eigen::Index{1000});
    INFO("vocabulary " << vocab);
    prepared_holey_row prepared(vocab, 2.0f, g);
    auto& [logits, ws, row] = prepared;
    CHECK(row.exps == (vocab <= specdec::detail::kept_row_limit));
    // The cumulative p in the draw's order.
    const lane_order_sums cum =
        sums_in_lane_order(vocab, [&prepared](Eigen::Index k) {
            return specdec::detail::kernels::prob_of(prepared.row, prepared.logits, prepared.ws, k);
        });
    REQUIRE(std::find(cum.at.begin(), cum.at.end(), -1.0) == cum.at.end());  // every token in the order
    CHECK(cum.total == Approx(1.0).epsilon(1e-5));
    const double* prefix = specdec::detail::kernels::block_prefix(row, vocab, ws);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (int t = 0; t < 20000; ++t) {
        const double u = t == 0 ? 0.0 : t == 1 ? std::nextafter(1.0, 0.0) : u01(g);
        const auto y = specdec::detail::kernels::draw_plain(row, logits, ws, prefix, u);
        REQUIRE(y.index >= 0);
        REQUIRE(y.index < vocab);
        const double py = specdec::detail::kernels::prob_of(row, logits, ws, y.index);
        REQUIRE(py > 0.0);  // never a token of probability 0
        CHECK(y.weight == Approx(py).epsilon(1e-5));
        // The cumulative p crosses u at y, up to float rounding of the lane sums.
        const double slack = 1e-5;
        CHECK(cum.before[static_cast<std::size_t>(y.index)] <= u + slack);
        CHECK(cum.at[static_cast<std::size_t>(y.index)] >= u - slack);
    }
}

TEST_CASE("Grouped draws from a long row give the tokens of the scalar walk", "[residual]") {
    // draw_plain_group (the residual's proposals, four at a time; with AVX-512 a walk with no
    // branch on the uniforms, four draws side by side) against draw_plain_scalar with the same
    // uniforms, over rows with -Inf holes, an all -Inf block and a partial last block. Only the
    // order of additions differs, so a token may differ only where a uniform falls within
    // rounding of a boundary between two tokens: at most a few in 20000 draws.
    std::mt19937_64 g(17);
    const Eigen::Index vocab = GENERATE(Eigen::Index{5000}, Eigen::Index{40000});
    INFO("vocabulary " << vocab);
    prepared_holey_row prepared(vocab, 3.0f, g);
    auto& [logits, ws, row] = prepared;
    REQUIRE_FALSE(row.exps);
    const double* prefix = specdec::detail::kernels::block_prefix(row, vocab, ws);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    constexpr int group = specdec::detail::kernels::proposal_group;
    int differ = 0, draws = 0;
    for (int t = 0; t < 5000; ++t) {
        double u[group];
        for (int k = 0; k < group; ++k) u[k] = u01(g);
        if (t == 0) u[0] = 0.0, u[1] = std::nextafter(1.0, 0.0);
        specdec::detail::kernels::weighted_index y[group];
        specdec::detail::kernels::draw_plain_group(row, logits, ws, prefix, u, y);
        for (int k = 0; k < group; ++k, ++draws) {
            REQUIRE(y[k].index >= 0);
            REQUIRE(y[k].index < vocab);
            const double py = specdec::detail::kernels::prob_of(row, logits, ws, y[k].index);
            REQUIRE(py > 0.0);  // never a token of probability 0
            CHECK(y[k].weight == Approx(py).epsilon(1e-5));
            const auto scalar = specdec::detail::kernels::draw_plain_scalar(row, logits, ws, prefix, u[k]);
            differ += scalar.index != y[k].index;
        }
    }
    INFO(differ << " of " << draws << " draws differ from the scalar walk");
    CHECK(differ <= 5);
}

TEST_CASE("The short-row residual draw follows the lane order of the cumulative residual", "[residual]") {
    // A row of 1000 or 2048 tokens whose pass keeps its exponentials, against a draft that puts
    // more mass than p on about half of the tokens (their residual weight is 0): the token drawn
    // with u is where the residual's running sum in (chunk, lane, element) order crosses u times
    // the total (up to float rounding of the lane sums), never a token of weight 0.
    std::mt19937_64 g(19);
    const Eigen::Index vocab = GENERATE(Eigen::Index{1000}, Eigen::Index{2048});
    INFO("vocabulary " << vocab);
    prepared_holey_row prepared(vocab, 2.0f, g);
    auto& [logits, ws, row] = prepared;
    REQUIRE(row.exps);
    Eigen::VectorXf q(vocab);
    std::uniform_real_distribution<float> spread(0.0f, 2.0f);
    for (Eigen::Index k = 0; k < vocab; ++k)
        q[k] = static_cast<float>(specdec::detail::kernels::prob_of(row, logits, ws, k)) * spread(g);
    q /= q.sum();
    specdec::detail::kernels::short_row_lanes lanes;
    const double total = specdec::detail::kernels::short_residual_weights(row, q.data(), 1.0f, 1.0f, ws, vocab, lanes);
    REQUIRE(total > 0.01);
    const lane_order_sums cum = sums_in_lane_order(vocab, [&prepared, &q](Eigen::Index k) {
        return std::max(0.0, specdec::detail::kernels::prob_of(prepared.row, prepared.logits, prepared.ws, k) -
                                 static_cast<double>(q[k]));
    });
    CHECK(cum.total == Approx(total).epsilon(1e-4));
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (int t = 0; t < 20000; ++t) {
        const double u = t == 0 ? 0.0 : t == 1 ? std::nextafter(1.0, 0.0) : u01(g);
        const Eigen::Index y = specdec::detail::kernels::draw_short_residual(ws, lanes, vocab, total, u);
        REQUIRE(y >= 0);
        REQUIRE(y < vocab);
        REQUIRE(ws.block[static_cast<std::size_t>(y)] > 0.0f);  // never a token of weight 0
        const double slack = 1e-5 * cum.total;
        CHECK(cum.before[static_cast<std::size_t>(y)] <= u * cum.total + slack);
        CHECK(cum.at[static_cast<std::size_t>(y)] >= u * cum.total - slack);
    }
}

TEST_CASE("The lane-level residual mass bound never exceeds the exact residual mass", "[residual][block]") {
    // Over 5000 tokens (three blocks, one all -Inf): R = Σ max(0, w p − q) against the bound from
    // the lane sums the checking pass keeps, for drafts close to and far from the target.
    std::mt19937_64 g(13);
    std::normal_distribution<float> n(0.0f, 2.0f);
    const Eigen::Index vocab = 5000;
    const specdec::sampling_config s{.temperature = 0.9f};
    for (int trial = 0; trial < 12; ++trial) {
        Eigen::MatrixXf logits(vocab, 1), draft(vocab, 1);
        const float noise = trial % 3 == 0 ? 0.0f : trial % 3 == 1 ? 0.3f : 3.0f;
        for (Eigen::Index k = 0; k < vocab; ++k) {
            logits(k, 0) = k >= 2048 && k < 4096 ? kNegInf : n(g);
            draft(k, 0) = (k >= 2048 && k < 4096 ? n(g) : logits(k, 0)) + noise * n(g);
        }
        Eigen::VectorXf qcol(vocab);
        specdec::sampling_workspace sw;
        specdec::standardize(draft.col(0), s, qcol, sw, "test");
        const Eigen::MatrixXf q = qcol;
        const Eigen::Ref<const Eigen::MatrixXf> qref(q);
        specdec::detail::verify_buffers ws;
        specdec::detail::reserve_rows(ws, vocab, 0, s);
        const auto row = specdec::detail::kernels::prepare_row(logits, 0, s, ws, "test", q.col(0).data());
        REQUIRE(row.q_lanes);
        // The same lane sums made afterwards from q alone, for rows prepared without the check.
        specdec::detail::verify_buffers unchecked_ws;
        specdec::detail::reserve_rows(unchecked_ws, vocab, 0, s);
        auto unchecked = specdec::detail::kernels::prepare_row(logits, 0, s, unchecked_ws, "test");
        REQUIRE_FALSE(unchecked.q_lanes);
        specdec::detail::kernels::keep_draft_lanes(unchecked, q, unchecked_ws);
        REQUIRE(unchecked.q_lanes);
        for (const double w : {0.05, 0.3, 0.7, 1.0}) {
            const double exact = specdec::detail::kernels::residual_mass(row, logits, &qref, 1.0f, 0, w, false, ws, "test");
            const double low = specdec::detail::kernels::residual_mass_lower_bound(row, vocab, ws, w, 1.0f);
            INFO("trial " << trial << ", noise " << noise << ", w " << w << ": R = " << exact << ", bound " << low);
            CHECK(low >= 0.0);
            CHECK(specdec::detail::kernels::residual_mass_lower_bound(unchecked, vocab, unchecked_ws, w, 1.0f) ==
                  Approx(low).epsilon(1e-5).margin(1e-9));
            CHECK(low <= exact + 1e-6);
            // Drafts equal to the target up to scaling inside each lane: the bound is exact.
            if (noise == 0.0f) CHECK(low == Approx(exact).margin(1e-6));
        }
    }
}

TEST_CASE("The fused argmax pass finds the lowest index of the maximum in every lane, block and tail", "[residual]") {
    std::mt19937_64 g(5);
    std::normal_distribution<float> n(0.0f, 3.0f);
    for (const Eigen::Index size : {Eigen::Index{1}, Eigen::Index{7}, Eigen::Index{64}, Eigen::Index{100},
                                    Eigen::Index{2048}, Eigen::Index{2049}, Eigen::Index{5000}, Eigen::Index{9000}}) {
        for (int trial = 0; trial < 50; ++trial) {
            Eigen::VectorXf z(size);
            for (auto& x : z) x = n(g);
            // Plant ties of a new maximum at 1–3 random places (possibly in the scalar tail).
            std::uniform_int_distribution<Eigen::Index> at(0, size - 1);
            const int copies = 1 + trial % 3;
            for (int c = 0; c < copies; ++c) z[at(g)] = 100.0f;
            if (trial % 5 == 0) z.setConstant(-1.0f);  // all tied: index 0
            Eigen::Index expected = 0;
            for (Eigen::Index i = 1; i < size; ++i)
                if (z[i] > z[expected]) expected = i;
            const auto got = specdec::detail::kernels::checked_argmax(z, "test");
            INFO("size " << size << ", trial " << trial);
            CHECK(got.index == expected);
            CHECK(got.value == z[expected]);
        }
    }
    Eigen::VectorXf bad = Eigen::VectorXf::Zero(3000);
    bad[2500] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(specdec::detail::kernels::checked_argmax(bad, "f"), specdec_test::contains("logit 2500 is NaN"));
    // Huge finite logits whose block sum overflows both ways are not mistaken for NaN.
    Eigen::VectorXf big = Eigen::VectorXf::Zero(4096);
    for (Eigen::Index i = 0; i < 4096; ++i) big[i] = (i % 2 == 0 ? 3e38f : -3e38f);
    CHECK(specdec::detail::kernels::checked_argmax(big, "f").index == 0);
}
