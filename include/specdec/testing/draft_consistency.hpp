#pragma once
/// \file
/// Are a drafter's tokens drawn from the distributions it reports? Draft consistency
/// (concepts.hpp: BlockDrafter 1-3, TreeDrafter 1-3): check_draft_consistency, which tests each
/// drafted token (or tree node) through the randomized probability integral transform of its
/// reported q with a chi-square test per position (or depth), and for chains also the joint law
/// of consecutive positions.
///
/// Part of the conformance kit (specdec/testing.hpp, which includes every check and defines
/// run_conformance). Not included by specdec/specdec.hpp.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "../adapters.hpp"
#include "../concepts.hpp"
#include "../multi_sequence.hpp"
#include "../random.hpp"
#include "../speculative_step.hpp"
#include "../tree.hpp"
#include "../types.hpp"
#include "report.hpp"
#include "stats.hpp"

namespace specdec::testing {

namespace detail {

/// The probability integral transform of token x under q, in the order of decreasing
/// probability (ties by index): F(x) = Σ_{y before x} q(y); u = F(x) + v q(x) with v uniform
/// in [0, 1) is uniform on [0, 1) exactly when x was drawn from q (randomized PIT). Ordering by
/// probability makes the test sensitive to a draw that is too peaked or too flat (a
/// temperature applied differently), whatever the token ids.
inline double randomized_pit(const Eigen::Ref<const Eigen::VectorXf>& probs, double scale, Eigen::Index x, double v) {
    const double qx = scale * probs[x];
    double before = 0.0;
    for (Eigen::Index y = 0; y < probs.size(); ++y) {
        const double qy = scale * probs[y];
        if (qy > qx || (qy == qx && y < x)) before += qy;
    }
    return std::clamp(before + v * qx, 0.0, std::nextafter(1.0, 0.0));
}

/// A drafter's chain call as the library's decoding loop makes it: a MultiSequenceDrafter's
/// draft_batch whenever it has one (below; also beside draft() or next_logits(), as
/// batch_decoder drafts), else a BlockDrafter's draft() as it is, a plain LanguageModel through
/// model_drafter.
template <class D>
struct as_block_drafter {
    explicit as_block_drafter(D& d) : d_(&d) {}
    void draft(std::span<const token_id> c, std::size_t gamma, const sampling_config& s, uniform_source& u,
               draft_block& out) {
        d_->draft(c, gamma, s, u, out);
    }
    D* d_;
};
template <Drafter D>
    requires(!BlockDrafter<D> && !MultiSequenceDrafter<D>)
struct as_block_drafter<D> {
    explicit as_block_drafter(D& d) : m_(d) {}
    void draft(std::span<const token_id> c, std::size_t gamma, const sampling_config& s, uniform_source& u,
               draft_block& out) {
        m_.draft(c, gamma, s, u, out);
    }
    model_drafter<D> m_;
};

/// A MultiSequenceDrafter as one sequence's BlockDrafter: draft_batch with the one request, in
/// slot 0.
template <class D>
    requires(MultiSequenceDrafter<D>)
struct as_block_drafter<D> {
    explicit as_block_drafter(D& d) : d_(&d) {}
    void draft(std::span<const token_id> c, std::size_t gamma, const sampling_config& s, uniform_source& u,
               draft_block& out) {
        draft_request r{0, c, gamma, u, &out};
        d_->draft_batch(std::span<draft_request>(&r, 1), s);
    }
    D* d_;
};

/// The χ² test of uniformity of each row of `counts` (randomized PIT values binned, one row per
/// draft position or tree depth), skipping rows with fewer than 5 draws per cell. Returns the
/// first row whose p-value is below `level` and its test (a row index of counts.size() when none
/// is), how many rows were tested, and the smallest p-value with its statistic.
struct pit_rows_outcome {
    std::size_t failed_row = 0;
    gof_result test{};
    std::size_t draws = 0;
    std::size_t tests = 0;
    double smallest_p = 1.0, its_statistic = 0.0;
};
inline pit_rows_outcome test_pit_rows(const std::vector<std::vector<std::size_t>>& counts, std::size_t bins,
                                      double level) {
    const std::vector<double> uniform(bins, 1.0 / static_cast<double>(bins));
    pit_rows_outcome out;
    out.failed_row = counts.size();
    for (std::size_t i = 0; i < counts.size(); ++i) {
        std::size_t n = 0;
        for (auto c : counts[i]) n += c;
        if (n < 5 * bins) continue;  // too few draws in this row for the χ² approximation
        const auto g = chi_square_test(counts[i], uniform);
        ++out.tests;
        if (g.p_value < out.smallest_p) {
            out.smallest_p = g.p_value;
            out.its_statistic = g.statistic;
        }
        if (g.p_value < level) {
            out.failed_row = i;
            out.test = g;
            out.draws = n;
            return out;
        }
    }
    return out;
}

/// The rows of `counts` and, last, their sum: the PIT values of every position (or depth)
/// together, as many draws as all the rows (each value is uniform given the ones before it in
/// its block for a right drafter, so together they are independent uniforms).
inline std::vector<std::vector<std::size_t>> with_pooled_row(std::vector<std::vector<std::size_t>> counts) {
    if (counts.size() < 2) return counts;
    std::vector<std::size_t> all(counts.front().size(), 0);
    for (const auto& row : counts)
        for (std::size_t b = 0; b < row.size(); ++b) all[b] += row[b];
    counts.push_back(std::move(all));
    return counts;
}

/// How the χ² test of draft consistency failed, in words: too many draws in the first cells (of
/// the most probable tokens) means the tokens come from a more peaked distribution than the
/// reported q.
inline std::string pit_direction(const std::vector<std::size_t>& counts) {
    return counts.front() > counts.back()
               ? "the drafted tokens are more concentrated on the likely tokens than q says (drawn at a lower "
                 "temperature than the one reported?)"
               : "the drafted tokens are more spread out than q says (drawn at a higher temperature than the one "
                 "reported, or from another position's q?)";
}

/// How often the drafted token is the likeliest of its reported q, against how often q says it
/// is: for a right drafter each draw is a Bernoulli trial of probability q(top) given the draws
/// before it. The count is tested against the law of a sum of independent trials of those
/// probabilities (a Poisson binomial law), its tails by a saddlepoint approximation
/// (poisson_binomial_two_sided_p): the normal approximation of the count, standardized by the
/// sum of the variances, alarmed 2 to 4 times as often as its level where the likeliest token
/// is rare or nearly certain. The test most sensitive to a fault that moves mass to or from the
/// likeliest token (a temperature, top-k or top-p applied when sampling and not when reporting,
/// a sampler that favours the argmax, mass moved between the two likeliest tokens), which the χ²
/// tests of binned PIT values spread over many cells.
struct top_token_tally {
    double hits = 0.0, expected = 0.0, variance = 0.0;
    std::size_t draws = 0;
    std::vector<double> probs{};  ///< q(top) of each draw

    /// One draw: whether the token was the likeliest, and the probability q gave that token.
    void add(bool hit, double p_top) {
        hits += hit ? 1.0 : 0.0;
        expected += p_top;
        variance += p_top * (1.0 - p_top);
        probs.push_back(p_top);
        ++draws;
    }
    /// Enough draws that a fault of the likeliest token's mass can show (a variance of 25: the
    /// count's standard deviation is 5 draws).
    bool testable() const { return variance >= 25.0; }
    /// The standardized count (its sign: too many or too few draws of the likeliest token).
    double z() const { return (hits - expected) / std::sqrt(variance); }
    /// Two-sided p-value of the count under the Poisson binomial law of the draws' q(top).
    double p_value() const { return poisson_binomial_two_sided_p(probs, hits); }
    /// The failure in words.
    std::string text() const {
        const double n = static_cast<double>(draws);
        return "the drafted token is the likeliest of its reported q in " + number(100.0 * hits / n) +
               "% of " + std::to_string(draws) + " draws, where q gives the likeliest token " +
               number(100.0 * expected / n) + "% on average (z = " + number(z()) + ", p = " + number(p_value());
    }
};

/// The likeliest token of `law` (the first, on ties) and its probability under law normalized
/// by its own sum (in double): below 1 whenever another token has weight, so that a column
/// accepted as a distribution within its tolerance (a largest entry rounded to 1.0f beside small
/// ones, say) never makes a legitimate draw of another token impossible.
inline std::pair<Eigen::Index, double> likeliest(const Eigen::Ref<const Eigen::VectorXf>& law) {
    Eigen::Index top = 0;
    const double largest = static_cast<double>(law.maxCoeff(&top));
    double sum = 0.0;
    for (Eigen::Index i = 0; i < law.size(); ++i) sum += static_cast<double>(law[i]);
    return {top, sum > 0.0 ? std::clamp(largest / sum, 0.0, 1.0) : 0.0};
}

/// Cells per position of the joint test of two consecutive draft positions (4 x 4 cells).
inline constexpr std::size_t joint_bins = 4;

/// The cell of a pair of probability-integral values (both uniform and independent for a correct
/// drafter: each position's randomized PIT under its q given the tokens before it is uniform,
/// whatever those were).
inline std::size_t joint_cell(double first, double second) {
    const auto bin = [](double u) { return std::min(joint_bins - 1, static_cast<std::size_t>(u * joint_bins)); };
    return bin(first) * joint_bins + bin(second);
}

/// How many of the draft check's contexts continue the prompt with the drafter's own samples.
inline std::size_t own_contexts(const conformance_options& o) {
    return o.draft_own_contexts ? std::max<std::size_t>(o.draft_contexts, 1) / 2 : 0;
}

/// The contexts of the draft check: the prompt, then up to max_context − gamma tokens; every
/// second one (draft_own_contexts) continued with the drafter's own samples at the first
/// sampling config (the contexts a draft is confident on: decoding meets them), the others with
/// random tokens. `call(context, sampling, uniforms, block)` drafts one block.
template <class Call>
std::vector<std::vector<token_id>> draft_check_contexts(Call& call, const conformance_options& o, std::size_t gamma,
                                                        std::ptrdiff_t vocab, std::mt19937_64& rng,
                                                        draft_block& block) {
    std::vector<std::vector<token_id>> contexts;
    if (vocab <= 0) return contexts;
    const std::size_t lo = o.prompt.size() + 1, hi = std::max(lo, o.max_context > gamma ? o.max_context - gamma : lo);
    const sampling_config own = o.samplings.empty() ? sampling_config{} : o.samplings.front();
    const auto random_token = [&] { return static_cast<token_id>(rng() % static_cast<std::uint64_t>(vocab)); };
    for (std::size_t i = 0; i < std::max<std::size_t>(o.draft_contexts, 1); ++i) {
        std::vector<token_id> c = o.prompt;
        const std::size_t len = lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
        const bool sampled = o.draft_own_contexts && i % 2 == 1;
        while (c.size() < len) {
            if (!sampled || c.empty()) {
                c.push_back(random_token());
                continue;
            }
            uniform_source u(rng);
            call(c, own, u, block);
            bool valid = !block.tokens.empty();
            for (const token_id t : block.tokens) valid = valid && t >= 0 && t < vocab;
            if (!valid) {
                c.push_back(random_token());  // (what is wrong with such a block is reported below)
                continue;
            }
            for (std::size_t k = 0; k < block.tokens.size() && c.size() < len; ++k) c.push_back(block.tokens[k]);
        }
        contexts.push_back(std::move(c));
    }
    return contexts;
}

/// What the draft checks of chains and of trees share: the report, the check's own generator
/// (contexts, the uniforms of the randomized PIT), and the tally of the χ² tests.
class draft_check {
protected:
    draft_check(std::ptrdiff_t vocab, const conformance_options& o)
        : o_(o), vocab_(vocab), rng_(o.seed ^ 0x9e3779b97f4a7c15ULL) {
        r_.check = "draft consistency";
        if (vocab_ <= 0) fail("vocab_size() = " + std::to_string(vocab_) + " must be positive");
    }

    void fail(std::string why) {
        if (!r_.passed) return;
        r_.passed = false;
        r_.failure = std::move(why);
    }

    /// Cells of the χ² test of each position (or depth).
    std::size_t bins() const { return std::max<std::size_t>(o_.pit_bins, 2); }
    /// The cell of a PIT value among bins().
    std::size_t cell_of(double pit) const {
        return std::min(bins() - 1, static_cast<std::size_t>(pit * static_cast<double>(bins())));
    }

    /// Whether scale · col is a distribution (finite, non-negative, sums to 1 within 1e-3); on
    /// failure, fails naming `subject` ("draft position 2", "node 5") and `where`.
    bool is_distribution(const Eigen::Ref<const Eigen::VectorXf>& col, double scale, const std::string& subject,
                         const std::string& where) {
        double sum = 0.0;
        bool valid = std::isfinite(scale) && scale > 0.0;
        for (Eigen::Index y = 0; y < col.size() && valid; ++y) {
            const double v = col[y];
            valid = std::isfinite(v) && v >= 0.0;
            sum += scale * v;
        }
        if (valid && std::abs(sum - 1.0) <= 1e-3) return true;
        fail("the reported q of " + subject +
             (valid ? " sums to " + number(sum) : std::string(" has a negative or non-finite entry")) +
             "; it must be a distribution (" + where + ")");
        return false;
    }

    /// How the tests were made, for the report: "" for one test at the budget.
    std::string sequential_text() const {
        return o_.sequential ? ", each at significance / " + std::to_string(sequential_plan::max_looks) +
                                   " after each sequential look"
                             : std::string();
    }

    /// The sequential plan of a config's draws (conformance_options::sequential).
    sequential_plan plan() const { return {o_.draft_blocks, o_.sequential, o_.significance}; }

    /// test_pit_rows at the plan's level; keeps the smallest p-value, and counts the rows tested
    /// into `look_tests` (the tests of a config are those of its last look: rows only gain draws).
    pit_rows_outcome test_rows(const std::vector<std::vector<std::size_t>>& counts, std::size_t cells,
                               std::size_t& look_tests) {
        const auto out = test_pit_rows(counts, cells, plan().level());
        look_tests += out.tests;
        if (out.smallest_p < worst_p_) {
            worst_p_ = out.smallest_p;
            worst_stat_ = out.its_statistic;
        }
        return out;
    }

    /// The top-token test (top_token_tally) of a config's draws at one look, when testable: fails
    /// naming `subject` and `config`; returns its p-value (1 when not testable) and counts it.
    double test_top_token(const top_token_tally& t, const std::string& subject, const std::string& config,
                          std::size_t& look_tests) {
        if (!t.testable()) return 1.0;
        ++look_tests;
        const double p = t.p_value();
        if (p < worst_p_) {
            worst_p_ = p;
            worst_stat_ = t.z() * t.z();
        }
        if (p < plan().level())
            fail(subject + ", " + config + ": " + t.text() + " < " + plan().level_text() +
                 "): the tokens are not drawn from the reported q (" +
                 (t.hits < t.expected ? "too few" : "too many") +
                 " draws of the likeliest token: a temperature, top-k or top-p applied when sampling and not "
                 "when reporting q, or the reverse, or mass moved to or from the likeliest token)");
        return p;
    }

    /// The draws of one config: `draw(k)` for k = 0, 1, ... and `test()` (which returns the
    /// look's smallest p-value and the number of tests it made) after each look of the plan, until
    /// a test fails or the plan stops; the config's tests are counted once, at its last look.
    template <class Draw, class Test>
    void run_looks(Draw&& draw, Test&& test) {
        const sequential_plan p = plan();
        std::size_t k = 0, config_tests = 0;
        for (std::size_t look = p.first(); r_.passed; ++look) {
            for (; k < p.draws(look) && r_.passed; ++k) draw(k);
            if (!r_.passed) break;
            config_tests = 0;
            const double smallest_p = test(config_tests);
            if (!r_.passed || !p.go_on(look, smallest_p)) break;
        }
        tests_ += config_tests;
    }

    /// The context of draw k: context by context (a drafter with a cache then recomputes only
    /// the draft positions), once around the contexts per budget.
    template <class Contexts>
    const auto& context_of(const Contexts& contexts, std::size_t k) const {
        const std::size_t budget = std::max<std::size_t>(o_.draft_blocks, 1);
        return contexts[(k % budget) * contexts.size() / budget];
    }

    /// The report, with the worst test, the false-alarm rate and what was run.
    report finish(std::string ran) {
        r_.statistic = worst_stat_;
        if (tests_ > 0) r_.p_value = worst_p_;
        r_.false_alarm_rate = static_cast<double>(tests_) * o_.significance;
        r_.ran = std::move(ran);
        r_.seconds = seconds_between(t0_);
        return r_;
    }

    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
    const conformance_options& o_;
    std::ptrdiff_t vocab_;
    std::mt19937_64 rng_;
    report r_;
    std::size_t tests_ = 0;
    double worst_p_ = 1.0, worst_stat_ = 0.0;
};

/// Draft consistency of a chain drafter: blocks of `gamma` tokens.
template <class D>
    requires(Drafter<D> || MultiSequenceDrafter<D>)
class block_draft_check : draft_check {
public:
    using counts_t = std::vector<std::vector<std::size_t>>;

    block_draft_check(D& drafter, const conformance_options& o, std::size_t gamma)
        : draft_check(static_cast<std::ptrdiff_t>(drafter.vocab_size()), o), blocks_of_(drafter), gamma_(gamma) {
        auto call = [this](const std::vector<token_id>& c, const sampling_config& s, uniform_source& u,
                           draft_block& out) { draft(c, s, u, out); };
        contexts_ = draft_check_contexts(call, o_, gamma_, vocab_, rng_, block_);
    }

    report run() {
        for (const sampling_config& s : o_.samplings) {
            if (!r_.passed) break;
            test_config(s);
        }
        return finish(
            std::to_string(blocks_) + " blocks of up to " + std::to_string(gamma_) + " tokens on " +
            std::to_string(contexts_.size()) + " contexts, " + std::to_string(o_.samplings.size()) +
            " sampling configs (" + std::to_string(own_contexts(o_)) + " contexts from the drafter's own samples); " +
            std::to_string(tested_tokens_) + " tokens tested against their reported q (" +
            std::to_string(tests_ - joint_tests_) + " tests: chi-square, one per position and config and one of all "
            "positions together, " + std::to_string(o_.pit_bins) + " cells each, and of the likeliest token's "
            "frequency per config" + sequential_text() + "; " +
            std::to_string(joint_tests_) +
            " of consecutive positions' joint law, " + std::to_string(joint_bins * joint_bins) + " cells each)" +
            (point_blocks_ ? "; " + std::to_string(point_blocks_) + " point-mass blocks checked for determinism"
                           : ""));
    }

private:
    /// One block after context c, as the library drafts it.
    void draft(const std::vector<token_id>& c, const sampling_config& s, uniform_source& u, draft_block& out) {
        out.clear();
        out.stop_below = 0.0f;
        blocks_of_.draft(std::span<const token_id>(c), gamma_, s, u, out);
    }

    /// Blocks at sampling config s (`o.draft_blocks`, or as the sequential plan says), each
    /// token's PIT value binned by position (and with the position before it, jointly); the χ²
    /// tests of the config after each look.
    void test_config(const sampling_config& s) {
        const std::string config = sampling_text(s);
        counts_t counts(gamma_, std::vector<std::size_t>(bins(), 0));
        top_ = {};
        // The PIT values of positions i and i + 1 of a block, binned jointly (joint_bins² cells).
        counts_t pairs(gamma_ > 1 ? gamma_ - 1 : 0, std::vector<std::size_t>(joint_bins * joint_bins, 0));
        std::map<std::vector<token_id>, std::vector<token_id>> point_drafts;  // context -> tokens
        const auto draw = [&](std::size_t k) {
            const auto& c = context_of(contexts_, k);
            uniform_source u(rng_);
            draft(c, s, u, block_);
            ++blocks_;
            const std::string where = "block " + std::to_string(k + 1) + " after " + tokens_text(c) + ", " + config;
            if (!tokens_in_range(where) || !decoding_accepts(where)) return;
            if (!block_.has_distributions())
                check_point_block(c, point_drafts, where);
            else if (distributions_shaped(where))
                test_tokens(counts, pairs, where);
        };
        run_looks(draw, [&](std::size_t& tests) { return test_counts(counts, pairs, config, tests); });
        joint_tests_ += last_joint_tests_;
        last_joint_tests_ = 0;
    }

    /// At most γ tokens, each in the vocabulary.
    bool tokens_in_range(const std::string& where) {
        if (block_.tokens.size() > gamma_) {
            fail("draft() proposed " + std::to_string(block_.tokens.size()) + " tokens; gamma was " +
                 std::to_string(gamma_) + " (" + where + ")");
            return false;
        }
        for (std::size_t i = 0; i < block_.tokens.size(); ++i)
            if (block_.tokens[i] < 0 || block_.tokens[i] >= vocab_) {
                fail("draft token " + std::to_string(i) + " = " + std::to_string(block_.tokens[i]) +
                     " is outside [0, " + std::to_string(vocab_) + ") (" + where + ")");
                return false;
            }
        return true;
    }

    /// The block passes the checks decoding makes of it (detail::check_draft: probs' shape, the
    /// scales), which are stricter than the test needs (probs with a spare column, say).
    bool decoding_accepts(const std::string& where) {
        try {
            if (block_.stop_below > 0.0f) {
                draft_block ended = block_;  // (check_draft ends a block at the draft-side stop)
                (void)specdec::detail::check_draft(ended, gamma_, vocab_, "decoding");
            } else {
                (void)specdec::detail::check_draft(block_, gamma_, vocab_, "decoding");
            }
        } catch (const std::invalid_argument& e) {
            fail(std::string("decoding would refuse this block: ") + e.what() + " (" + where + ")");
            return false;
        }
        return true;
    }

    /// Point masses: the tokens must be a function of the context alone.
    void check_point_block(const std::vector<token_id>& c,
                           std::map<std::vector<token_id>, std::vector<token_id>>& point_drafts,
                           const std::string& where) {
        ++point_blocks_;
        auto [it, inserted] = point_drafts.emplace(c, block_.tokens);
        if (!inserted && it->second != block_.tokens)
            fail("a drafter without distributions (point masses) proposed " + tokens_text(block_.tokens) +
                 " after proposing " + tokens_text(it->second) +
                 " for the same context: point-mass drafts must be a deterministic function of the context; "
                 "report the distributions the tokens were sampled from instead (" + where + ")");
    }

    /// One column of distributions per token (and a scale per token, when there are scales).
    bool distributions_shaped(const std::string& where) {
        if (block_.probs.rows() == vocab_ && block_.probs.cols() >= static_cast<Eigen::Index>(block_.tokens.size()) &&
            (block_.scales.empty() || block_.scales.size() >= block_.tokens.size()))
            return true;
        fail("the draft distributions are " + std::to_string(block_.probs.rows()) + " x " +
             std::to_string(block_.probs.cols()) + " with " + std::to_string(block_.scales.size()) + " scales for " +
             std::to_string(block_.tokens.size()) + " tokens; expected " + std::to_string(vocab_) +
             " rows and one column per token (" + where + ")");
        return false;
    }

    /// Each token of the block through the randomized PIT of its reported q, binned by position
    /// and, with the value of the position before it, jointly.
    void test_tokens(counts_t& counts, counts_t& pairs, const std::string& where) {
        double previous_pit = 0.0;
        for (std::size_t i = 0; i < block_.tokens.size() && r_.passed; ++i) {
            const auto col = block_.probs.col(static_cast<Eigen::Index>(i));
            const double scale = block_.scales.empty() ? 1.0 : block_.scales[i];
            if (!is_distribution(col, scale, "draft position " + std::to_string(i), where)) break;
            const auto x = static_cast<Eigen::Index>(block_.tokens[i]);
            if (col[x] <= 0.0f) {
                fail("draft token " + std::to_string(i) + " = " + std::to_string(x) +
                     " has probability 0 under the reported q: the token was not drawn from it (" + where + ")");
                break;
            }
            const double v = uniform01(rng_);
            const double pit = randomized_pit(col, scale, x, v);
            ++counts[i][cell_of(pit)];
            const auto [top, p_top] = likeliest(col);
            top_.add(top == x, p_top);
            if (i > 0) ++pairs[i - 1][joint_cell(previous_pit, pit)];
            previous_pit = pit;
            ++tested_tokens_;
        }
    }

    /// The χ² tests of a config at one look: each position's PIT values and all positions'
    /// together; then, when those pass, the joint law of consecutive positions. Returns the
    /// smallest p-value of the look; adds the look's tests to `tests`.
    double test_counts(const counts_t& counts, const counts_t& pairs, const std::string& config, std::size_t& tests) {
        last_joint_tests_ = 0;
        const counts_t rows = with_pooled_row(counts);
        const auto t = test_rows(rows, bins(), tests);
        if (const std::size_t i = t.failed_row; i < rows.size()) {
            const auto& g = t.test;
            fail((i < counts.size() ? "draft position " + std::to_string(i) : std::string("all draft positions together")) +
                 ", " + config + ": the tokens are not distributed as the reported q (chi2 = " + number(g.statistic) +
                 ", df = " + std::to_string(g.degrees_of_freedom) + ", p = " + number(g.p_value) + " < " +
                 plan().level_text() + " over " + std::to_string(t.draws) + " tokens): " + pit_direction(rows[i]));
            return t.smallest_p;
        }
        const double top_p = test_top_token(top_, "all draft positions together", config, tests);
        if (!r_.passed) return std::min(t.smallest_p, top_p);
        std::size_t joint = 0;
        const auto j = test_rows(pairs, joint_bins * joint_bins, joint);
        tests += joint;
        last_joint_tests_ = joint;
        if (const std::size_t i = j.failed_row; i < pairs.size())
            fail("draft positions " + std::to_string(i) + " and " + std::to_string(i + 1) + ", " + config +
                 ": each position's tokens follow its reported q, but the two positions are not drawn independently "
                 "given their contexts (chi2 = " + number(j.test.statistic) + ", df = " +
                 std::to_string(j.test.degrees_of_freedom) + ", p = " + number(j.test.p_value) + " < " +
                 plan().level_text() + " over " + std::to_string(j.draws) +
                 " pairs of probability-integral values): the drafter reuses randomness across the positions of a "
                 "block (the same uniform for several tokens?), or its q's do not condition on the tokens drafted "
                 "before them; the fault is the drafter's");
        return std::min({t.smallest_p, top_p, j.smallest_p});
    }

    as_block_drafter<D> blocks_of_;
    std::size_t gamma_;
    top_token_tally top_;  // the current config's
    draft_block block_;
    std::vector<std::vector<token_id>> contexts_;
    std::size_t blocks_ = 0, point_blocks_ = 0, tested_tokens_ = 0, joint_tests_ = 0, last_joint_tests_ = 0;
};

/// Draft consistency of a tree drafter (TreeDrafter 1-3): trees of `shape`, each node's token
/// tested against its column, given its earlier siblings when it was drawn without
/// replacement (the column with their tokens removed, renormalized): uniform PIT values exactly
/// when every node was drawn as the tree says.
template <TreeDrafter D>
class tree_draft_check : draft_check {
public:
    using counts_t = std::vector<std::vector<std::size_t>>;
    /// context -> (tokens, parents) of a point-mass tree
    using point_trees_t = std::map<std::vector<token_id>, std::pair<std::vector<token_id>, std::vector<std::int32_t>>>;

    tree_draft_check(D& drafter, const tree_shape& shape, const conformance_options& o)
        : draft_check(static_cast<std::ptrdiff_t>(drafter.vocab_size()), o), drafter_(drafter), shape_(shape),
          depth_(shape.depth()), cap_(shape.nodes()) {
        random_contexts();
    }

    report run() {
        for (const sampling_config& s : o_.samplings) {
            if (!r_.passed) break;
            test_config(s);
        }
        return finish(std::to_string(trees_) + " trees of the shape " + shape_text(shape_) + " on " +
                      std::to_string(contexts_.size()) + " contexts, " + std::to_string(o_.samplings.size()) +
                      " sampling configs; " + std::to_string(tested_nodes_) +
                      " nodes tested against their reported q, given their earlier siblings (" +
                      std::to_string(tests_) + " tests: chi-square, one per depth and config and one of all "
                      "depths together, " + std::to_string(o_.pit_bins) + " cells each, and of the likeliest "
                      "token's frequency per config" + sequential_text() + ")" +
                      (point_trees_ ? "; " + std::to_string(point_trees_) + " point-mass trees checked for determinism"
                                    : ""));
    }

private:
    /// The contexts: the prompt, then random tokens, leaving room for every node after the
    /// context (an engine whose window holds the whole tree).
    void random_contexts() {
        const std::size_t lo = o_.prompt.size() + 1,
                          hi = std::max(lo, o_.max_context > cap_ ? o_.max_context - cap_ : lo);
        for (std::size_t i = 0; i < std::max<std::size_t>(o_.draft_contexts, 1) && r_.passed; ++i) {
            std::vector<token_id> c = o_.prompt;
            const std::size_t len = lo + static_cast<std::size_t>(rng_() % (hi - lo + 1));
            while (c.size() < len) c.push_back(static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)));
            contexts_.push_back(std::move(c));
        }
    }

    /// Trees at sampling config s (`o.draft_blocks`, or as the sequential plan says), each
    /// node's PIT value binned by depth; the χ² tests of the config after each look.
    void test_config(const sampling_config& s) {
        const std::string config = sampling_text(s);
        counts_t counts(depth_, std::vector<std::size_t>(bins(), 0));
        top_ = {};
        point_trees_t point_trees_of;
        const auto draw = [&](std::size_t k) {
            const auto& c = context_of(contexts_, k);
            uniform_source u(rng_);
            tree_.clear();
            drafter_.propose_tree(std::span<const token_id>(c), shape_, s, u, tree_);
            ++trees_;
            const std::string where = "tree " + std::to_string(k + 1) + " after " + tokens_text(c) + ", " + config;
            if (!well_formed(where)) return;
            if (!tree_.has_distributions())
                check_point_tree(c, point_trees_of, where);
            else if (distributions_shaped(where))
                test_nodes(counts, where);
        };
        run_looks(draw, [&](std::size_t& tests) { return test_counts(counts, config, tests); });
    }

    /// Within the shape (nodes and depth), and a well-formed tree (parents first, depths, tokens).
    bool well_formed(const std::string& where) {
        if (tree_.size() > cap_ || static_cast<std::size_t>(std::max(tree_.max_depth(), 0)) > depth_) {
            fail("propose_tree proposed " + std::to_string(tree_.size()) + " nodes of depth up to " +
                 std::to_string(tree_.max_depth()) + "; the shape " + shape_text(shape_) + " allows at most " +
                 std::to_string(cap_) + " of depth " + std::to_string(depth_) + " (" + where + ")");
            return false;
        }
        try {
            specdec::detail::check_tree_structure(tree_, vocab_, "propose_tree");
        } catch (const std::invalid_argument& e) {
            fail(std::string("the proposed tree is malformed: ") + e.what() + " (" + where + ")");
            return false;
        }
        return true;
    }

    /// Point masses: the tree must be a function of the context alone.
    void check_point_tree(const std::vector<token_id>& c, point_trees_t& point_trees_of, const std::string& where) {
        ++point_trees_;
        auto [it, inserted] = point_trees_of.emplace(c, std::make_pair(tree_.tokens, tree_.parents));
        if (!inserted && (it->second.first != tree_.tokens || it->second.second != tree_.parents))
            fail("a tree drafter without distributions (point masses) proposed the tokens " +
                 tokens_text(tree_.tokens) + " after proposing " + tokens_text(it->second.first) +
                 " (or another structure) for the same context: point-mass trees must be a deterministic "
                 "function of the context; report the distributions the nodes were drawn from instead (" + where +
                 ")");
    }

    /// One column of distributions per node.
    bool distributions_shaped(const std::string& where) {
        if (tree_.probs.rows() == vocab_ && tree_.probs.cols() == static_cast<Eigen::Index>(tree_.size())) return true;
        fail("the tree's draft distributions are " + std::to_string(tree_.probs.rows()) + " x " +
             std::to_string(tree_.probs.cols()) + " for " + std::to_string(tree_.size()) + " nodes; expected " +
             std::to_string(vocab_) + " rows and one column per node (" + where + ")");
        return false;
    }

    /// The law node i was drawn from, into law_: its column, without the tokens of its earlier
    /// siblings when it was drawn without replacement. Returns the mass left (1 with replacement).
    double node_law(std::size_t i) {
        law_ = tree_.probs.col(static_cast<Eigen::Index>(i));
        if (tree_.draws_of(i) != sibling_draws::without_replacement) return 1.0;
        for (std::size_t j = 0; j < i; ++j)
            if (tree_.parents[j] == tree_.parents[i]) law_[tree_.tokens[j]] = 0.0f;
        double mass = 0.0;
        for (Eigen::Index y = 0; y < law_.size(); ++y) mass += law_[y];
        return mass;
    }

    /// Each node of the tree through the randomized PIT of the law it was drawn from, binned by depth.
    void test_nodes(counts_t& counts, const std::string& where) {
        for (std::size_t i = 0; i < tree_.size() && r_.passed; ++i) {
            const auto col = tree_.probs.col(static_cast<Eigen::Index>(i));
            if (!is_distribution(col, 1.0, "node " + std::to_string(i), where)) break;
            const double mass = node_law(i);
            const auto x = static_cast<Eigen::Index>(tree_.tokens[i]);
            if (!(law_[x] > 0.0f) || !(mass > 0.0)) {
                fail("node " + std::to_string(i) + " (token " + std::to_string(x) +
                     ") has probability 0 under the reported q" +
                     (tree_.draws_of(i) == sibling_draws::without_replacement
                          ? std::string(" once its earlier siblings are removed (drawn without replacement)")
                          : std::string()) +
                     ": the token was not drawn from it (" + where + ")");
                break;
            }
            const double pit = randomized_pit(law_, 1.0 / mass, x, uniform01(rng_));
            const auto d = static_cast<std::size_t>(tree_.depths[i] - 1);
            ++counts[d][cell_of(pit)];
            const auto [top, p_top] = likeliest(law_);
            top_.add(top == x, p_top);
            ++tested_nodes_;
        }
    }

    /// The χ² tests of a config at one look: each depth's PIT values and all depths' together.
    /// Returns the smallest p-value of the look; adds the look's tests to `tests`.
    double test_counts(const counts_t& counts, const std::string& config, std::size_t& tests) {
        const counts_t rows = with_pooled_row(counts);
        const auto t = test_rows(rows, bins(), tests);
        if (const std::size_t d = t.failed_row; d < rows.size()) {
            const auto& g = t.test;
            fail((d < counts.size() ? "tree depth " + std::to_string(d + 1) : std::string("all tree depths together")) +
                 ", " + config + ": the nodes' tokens are not distributed as the reported q (chi2 = " +
                 number(g.statistic) + ", df = " + std::to_string(g.degrees_of_freedom) + ", p = " +
                 number(g.p_value) + " < " + plan().level_text() + " over " + std::to_string(t.draws) +
                 " nodes): " + pit_direction(rows[d]));
            return t.smallest_p;
        }
        return std::min(t.smallest_p, test_top_token(top_, "all tree depths together", config, tests));
    }

    D& drafter_;
    const tree_shape& shape_;
    std::size_t depth_, cap_;
    draft_tree tree_;
    Eigen::VectorXf law_;
    top_token_tally top_;  // the current config's
    std::vector<std::vector<token_id>> contexts_;
    std::size_t trees_ = 0, point_trees_ = 0, tested_nodes_ = 0;
};

/// Draft consistency of the drafter as the checks' step drafts with it: trees with a tree step
/// and a TreeDrafter, blocks otherwise (a chain's γ, or as deep as the tree).
template <kit_drafter D>
report draft_consistency(D& drafter, const conformance_options& o) {
    const step_shape step = step_of<D>(o);
    if (const auto* t = std::get_if<specdec::tree>(&step)) {
        if constexpr (TreeDrafter<D>) return tree_draft_check<D>(drafter, t->shape, o).run();
    }
    if constexpr (Drafter<D> || MultiSequenceDrafter<D>) {
        return block_draft_check<D>(drafter, o, longest_draft(step, o)).run();
    } else {
        return {};  // unreachable: step_of gives a drafter of trees only a tree step
    }
}

}  // namespace detail

/// Draft consistency (concepts.hpp: BlockDrafter 1-3): each drafted token was drawn from the
/// distribution q_i the drafter reports for it. For each sampling config in `o.samplings` and
/// each draft position i, `o.draft_blocks` blocks are drawn after `o.draft_contexts` random
/// contexts, each token goes through the randomized probability integral transform of its q_i
/// (uniform exactly when it was drawn from q_i, whatever the context), and a χ² test with
/// `o.pit_bins` equiprobable cells compares the values with the uniform law. A block without
/// distributions (point masses) must repeat its tokens for the same context. Also checks that
/// each q_i is a distribution and gives its token positive probability.
///
/// With a tree step and a TreeDrafter (TreeDrafter 1-3), the drafter proposes trees of the
/// step's shape instead, each checked for its structure (parents first, depths, tokens in range,
/// at most the shape's nodes and depth), and each node's token goes through the transform of the
/// law it was drawn from: its column, given its earlier siblings when tree.draws says without
/// replacement; one χ² test per depth. A point-mass tree must repeat itself for the same context.
/// Other drafters with a tree step are checked as blocks as deep as the tree.
///
/// The PIT values of all positions (or depths) together get a test of their own, the one with
/// the most draws: a drafter whose fault is small but at every position shows there first; and
/// so does the frequency of the likeliest token (how often the drafted token is the argmax of its
/// q, against the law of that count given q's largest probabilities, tested with saddlepoint
/// tails: the test most sensitive to mass moved to or from the likeliest token).
/// With `o.sequential` (the default) the tests are made after a quarter, a half and all of the
/// blocks, stopping at the first failure, and after twice and four times as many when the last
/// p-value is borderline (below 0.01), each at `o.significance` / 5.
///
/// False-alarm rate: at most `o.significance` per test (each position or depth, all of them
/// together, each pair of consecutive positions; per config; the report states the total), plus
/// the error of the χ² approximation. A plain LanguageModel drafter goes through model_drafter
/// (the library's own sampling).
template <detail::kit_drafter D>
[[nodiscard]] report check_draft_consistency(D& drafter, const conformance_options& o = {}) {
    return detail::guarded("draft consistency", [&] { return detail::draft_consistency(drafter, o); });
}

}  // namespace specdec::testing
