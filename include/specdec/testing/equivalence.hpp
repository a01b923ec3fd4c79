#pragma once
/// \file
/// Does speculative decoding with the user's pair generate the target's law? Sequence-level
/// equivalence (Leviathan et al. 2023, App. A.1): check_equivalence, which tests the law of the
/// first n generated tokens against the target's exact probabilities of a partition into prefix
/// cells (its probability tree enumerated down to the prefixes a sample can fill), or against
/// plain sampling from the target by a two-sample test.
///
/// Part of the conformance kit (specdec/testing.hpp, which includes every check and defines
/// run_conformance). Not included by specdec/specdec.hpp.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../adaptive_gamma.hpp"
#include "../concepts.hpp"
#include "../decode_options.hpp"
#include "../error.hpp"
#include "../sampling.hpp"
#include "../speculative_decode.hpp"
#include "../types.hpp"
#include "report.hpp"
#include "stats.hpp"

namespace specdec::testing {

namespace detail {

/// The target's exact law over a partition of the sequences of its first `length` tokens into
/// prefix cells, from its probability tree: every prefix of probability at least `min_prob` is
/// expanded (one target call each); a cell is a sequence of full length (or ended by a stop
/// token) reached through expanded prefixes, or "an expanded prefix X, then a token whose
/// prefix X + t is not expanded" (its probability is the sum of those continuations'). With
/// min_prob = 0 this enumerates every sequence. The partition depends on the target alone.
class prefix_law {
public:
    template <Verifier V>
    prefix_law(V& target, const std::vector<token_id>& prompt, std::size_t length, const sampling_config& s,
               const std::vector<token_id>& stop_tokens, double min_prob)
        : stop_(stop_tokens) {
        std::vector<token_id> seq = prompt;
        sampling_workspace ws;
        const auto vocab = static_cast<Eigen::Index>(target.vocab_size());
        Eigen::VectorXf p(vocab);
        auto rec = [&](auto&& self, double prob) -> void {
            std::vector<token_id> x(seq.begin() + static_cast<std::ptrdiff_t>(prompt.size()), seq.end());
            if (x.size() == length || stops(x)) {
                add_cell(std::move(x), prob);
                return;
            }
            const Eigen::VectorXf z = single_logits(target, seq);
            if (z.size() != vocab)
                specdec::detail::fail_invalid("specdec::testing::check_equivalence: the target returned ", z.size(),
                                              " logits; its vocab_size() is ", vocab);
            standardize(z, s, p, ws, "specdec::testing::check_equivalence");
            std::vector<bool> zero(static_cast<std::size_t>(vocab));
            std::vector<std::pair<token_id, double>> children;
            double rest = 0.0;
            for (Eigen::Index t = 0; t < vocab; ++t) {
                const double q = prob * static_cast<double>(p[t]);
                if (p[t] <= 0.0f) zero[static_cast<std::size_t>(t)] = true;
                else if (q >= min_prob) children.emplace_back(static_cast<token_id>(t), q);
                else rest += q;
            }
            std::vector<token_id> rest_key = x;
            rest_key.push_back(-1);
            expanded_.emplace(std::move(x), std::move(zero));
            if (rest > 0.0) add_cell(std::move(rest_key), rest);
            for (const auto& [t, q] : children) {
                seq.push_back(t);
                self(self, q);
                seq.pop_back();
            }
        };
        rec(rec, 1.0);
    }

    /// The cell of a generated sequence, or npos for one the target cannot generate.
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);
    [[nodiscard]] std::size_t locate(const std::vector<token_id>& s) const {
        std::vector<token_id> x;
        for (;;) {
            if (x.size() == s.size()) {
                auto it = cell_.find(x);  // a leaf: full length, or ended by a stop token
                return it == cell_.end() ? npos : it->second;
            }
            auto node = expanded_.find(x);
            if (node == expanded_.end()) return npos;
            const token_id t = s[x.size()];
            if (t < 0 || static_cast<std::size_t>(t) >= node->second.size() || node->second[static_cast<std::size_t>(t)])
                return npos;
            x.push_back(t);
            if (expanded_.count(x) == 0 && cell_.count(x) == 0) {
                x.back() = -1;  // the rest cell of the prefix
                auto it = cell_.find(x);
                return it == cell_.end() ? npos : it->second;
            }
        }
    }

    [[nodiscard]] const std::vector<double>& probs() const noexcept { return probs_; }
    [[nodiscard]] const std::vector<std::vector<token_id>>& names() const noexcept { return names_; }
    [[nodiscard]] std::size_t expanded() const noexcept { return expanded_.size(); }

private:
    bool stops(const std::vector<token_id>& x) const {
        return !x.empty() && std::find(stop_.begin(), stop_.end(), x.back()) != stop_.end();
    }
    void add_cell(std::vector<token_id> key, double prob) {
        cell_.emplace(key, probs_.size());
        probs_.push_back(prob);
        names_.push_back(std::move(key));
    }

    std::vector<token_id> stop_;
    std::map<std::vector<token_id>, std::vector<bool>> expanded_;  // prefix -> tokens of probability 0 after it
    std::map<std::vector<token_id>, std::size_t> cell_;
    std::vector<double> probs_;
    std::vector<std::vector<token_id>> names_;
};

/// "[1 2 3]", or "[1 2] then a less likely token" for a rest cell.
inline std::string cell_text(std::vector<token_id> key) {
    if (!key.empty() && key.back() == -1) {
        key.pop_back();
        return tokens_text(key) + " then a token of low probability";
    }
    return tokens_text(key);
}

/// Cells of the two-sample test: each sequence goes to its longest prefix that at least
/// `min_count` sequences of the pooled sample share. The partition depends on the pooled
/// sample only, never on which sampler drew what, so the test of homogeneity stays valid.
inline std::vector<std::vector<token_id>> prefix_cells(const std::vector<std::vector<token_id>>& pooled,
                                                       std::size_t min_count) {
    std::map<std::vector<token_id>, std::size_t> prefix_count;
    for (const auto& s : pooled)
        for (std::size_t k = 0; k <= s.size(); ++k) ++prefix_count[std::vector<token_id>(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k))];
    std::vector<std::vector<token_id>> cell_of;
    cell_of.reserve(pooled.size());
    for (const auto& s : pooled) {
        std::size_t k = s.size();
        while (k > 0 && prefix_count[std::vector<token_id>(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k))] < min_count) --k;
        // A sequence of full length: the sequence itself (closed cells); shorter prefixes are
        // marked as such so that a sequence that ends with a stop token is not confused with
        // the prefix cell of longer ones.
        std::vector<token_id> cell(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k));
        if (k < s.size()) cell.push_back(-1);
        cell_of.push_back(std::move(cell));
    }
    return cell_of;
}

/// The sequence-level equivalence check (see check_equivalence).
template <kit_drafter D, kit_target V>
class equivalence_runner {
public:
    using sequence = std::vector<token_id>;

    equivalence_runner(D& drafter, V& target, const conformance_options& o)
        : drafter_(drafter), target_(target), plain_(plain_target(target)), o_(o) {
        r_.check = "sequence-level equivalence";
    }

    report run() {
        std::size_t index = 0;
        for (const auto& step : steps_to_run<D, V>(o_, false)) {
            for (const auto& s : o_.samplings) {
                if (!r_.passed) break;
                test_config(step, s, ++index);
            }
        }
        r_.statistic = worst_stat_;
        r_.p_value = worst_p_;
        r_.false_alarm_rate = static_cast<double>(tests_) * o_.significance;
        r_.drafted = drafted_;
        if (drafted_ > 0) r_.acceptance = static_cast<double>(accepted_) / static_cast<double>(drafted_);
        r_.ran = std::string(o_.two_sample ? "two-sample test; " : "exact probabilities; ") + ran_.str();
        r_.seconds = seconds_between(t0_);
        return r_;
    }

private:
    /// One scheme (or the tree step) and sampling config, the `index`-th: its runs draw from
    /// generators of their own, seeded from the index.
    void test_config(const named_step& step, const sampling_config& s, std::size_t index) {
        decode_options opts = o_.decode;
        opts.step = step.step;
        opts.sampling = s;
        opts.budget.max_new_tokens = o_.length;
        opts.on_step = nullptr;
        if (opts.length.policy == gamma_policy::adaptive) opts.length.controller = nullptr;
        const std::string config = step.name + ", " + sampling_text(s);
        std::mt19937_64 rng_a(o_.seed + 1000 * index), rng_b(o_.seed + 1000 * index + 1);
        started_ = std::chrono::steady_clock::now();
        if (!o_.two_sample)
            exact_test(config, opts, rng_a);
        else
            two_sample_test(config, opts, rng_a, rng_b);
    }

    /// Whether the config's time (o.max_seconds) ran out before sample k (looked at every 64).
    bool out_of_time(std::size_t k) const {
        return o_.max_seconds > 0.0 && k % 64 == 0 && seconds_between(started_) > o_.max_seconds;
    }

    /// One speculative run, its drafted and accepted tokens counted.
    sequence run_one(const decode_options& opts, std::mt19937_64& rng) {
        decode_result out = speculative_decode(drafter_, target_, o_.prompt, opts, rng);
        drafted_ += out.stats.drafted_tokens;
        accepted_ += out.stats.accepted_tokens;
        return std::move(out.tokens);
    }

    /// Counts a χ² test: the smallest p-value and its statistic.
    void tally(const gof_result& g) {
        ++tests_;
        note(g);
    }
    /// Keeps the smallest p-value (and its statistic) of the looks at a sample.
    void note(const gof_result& g) {
        if (g.p_value < worst_p_) {
            worst_p_ = g.p_value;
            worst_stat_ = g.statistic;
        }
    }

    /// The speculative sample against the target's exact probabilities of prefix cells.
    void exact_test(const std::string& config, const decode_options& opts, std::mt19937_64& rng) {
        // Every prefix the sample is expected to reach 5 times or more is expanded.
        const prefix_law law(plain_, o_.prompt, o_.length, opts.sampling, opts.budget.stop_tokens,
                             5.0 / static_cast<double>(std::max<std::size_t>(o_.samples, 1)));
        std::vector<std::size_t> counts(law.probs().size(), 0);
        // Sequentially (conformance_options::sequential): tested after each look of the plan.
        const sequential_plan plan{o_.samples, o_.sequential, o_.significance};
        std::size_t n = 0;
        gof_result g{};
        for (std::size_t look = plan.first();; ++look) {
            const std::size_t wanted = plan.draws(look);
            n = count_in_cells(config, opts, rng, law, counts, n, wanted);
            if (!r_.passed) {
                ++tests_;
                return;
            }
            g = chi_square_test(counts, law.probs());
            note(g);
            if (g.p_value < plan.level() || n < wanted || !plan.go_on(look, g.p_value)) break;
        }
        ++tests_;
        ran_ << (tests_ > 1 ? "; " : "") << config << ": " << n << " sequences against the target's exact "
             << "probabilities of " << law.probs().size() << " prefix cells (" << law.expanded()
             << " prefixes expanded; df " << g.degrees_of_freedom << ")";
        if (g.p_value < plan.level()) exact_failure(config, g, law, counts, static_cast<double>(n), plan);
    }

    /// Speculative runs from the n-th up to the `wanted`-th, each counted in its cell of `law`
    /// (fewer when the config's time runs out); a sequence the target cannot generate fails the
    /// check. Returns how many were drawn in all.
    std::size_t count_in_cells(const std::string& config, const decode_options& opts, std::mt19937_64& rng,
                               const prefix_law& law, std::vector<std::size_t>& counts, std::size_t n,
                               std::size_t wanted) {
        for (std::size_t k = n; k < wanted; ++k) {
            if (out_of_time(k)) break;
            const sequence x = run_one(opts, rng);
            ++n;
            const std::size_t c = law.locate(x);
            if (c == prefix_law::npos) {
                r_.passed = false;
                r_.failure = config + ": speculative decoding generated " + tokens_text(x) +
                             ", a sequence that plain sampling from the target never generates (probability 0)";
                worst_stat_ = std::numeric_limits<double>::infinity();  // what run() reports
                worst_p_ = 0.0;
                ran_ << (tests_ > 0 ? "; " : "") << config << ": " << n
                     << " sequences, the last of probability 0 under the target";
                break;
            }
            ++counts[c];
        }
        return n;
    }

    /// The failure of the exact test, with the cell furthest from its expected count.
    void exact_failure(const std::string& config, const gof_result& g, const prefix_law& law,
                       const std::vector<std::size_t>& counts, double n, const sequential_plan& plan) {
        std::size_t worst = 0;
        double z = -1.0;
        for (std::size_t i = 0; i < counts.size(); ++i) {
            const double e = law.probs()[i] * n;
            if (e < 5.0) continue;
            const double d = std::abs(static_cast<double>(counts[i]) - e) / std::sqrt(e);
            if (d > z) {
                z = d;
                worst = i;
            }
        }
        r_.passed = false;
        r_.failure = config + ": the law of the first " + std::to_string(o_.length) +
                     " tokens differs from the target's (chi2 = " + number(g.statistic) + ", df = " +
                     std::to_string(g.degrees_of_freedom) + ", p = " + number(g.p_value) + " < " +
                     plan.level_text() + "); e.g. " + cell_text(law.names()[worst]) + " came " +
                     std::to_string(counts[worst]) + " times, " + number(law.probs()[worst] * n) + " expected";
    }

    /// The speculative sample against as many sequences of plain sampling from the target, by a
    /// χ² test of homogeneity over prefix cells of the pooled sample.
    void two_sample_test(const std::string& config, const decode_options& opts, std::mt19937_64& rng_a,
                         std::mt19937_64& rng_b) {
        std::vector<sequence> a, b;
        a.reserve(o_.samples);
        b.reserve(o_.samples);
        for (std::size_t k = 0; k < o_.samples; ++k) {
            if (out_of_time(k)) break;
            a.push_back(run_one(opts, rng_a));
            b.push_back(autoregressive_decode(plain_, o_.prompt, opts, rng_b).tokens);
        }
        std::vector<sequence> pooled = a;
        pooled.insert(pooled.end(), b.begin(), b.end());
        const auto cells = prefix_cells(pooled, 20);
        std::map<sequence, std::size_t> index_of;
        for (const auto& c : cells) index_of.emplace(c, index_of.size());
        std::vector<std::size_t> ca(index_of.size(), 0), cb(index_of.size(), 0);
        for (std::size_t k = 0; k < cells.size(); ++k) ++(k < a.size() ? ca : cb)[index_of[cells[k]]];
        const auto g = chi_square_two_sample_test(ca, cb);
        tally(g);
        ran_ << (tests_ > 1 ? "; " : "") << config << ": " << a.size() << " speculative against " << b.size()
             << " plain sequences, " << index_of.size() << " prefix cells (df " << g.degrees_of_freedom << ")";
        if (g.p_value < o_.significance) two_sample_failure(config, g, index_of, ca, cb);
    }

    /// The failure of the two-sample test, with the cell whose two counts differ the most.
    void two_sample_failure(const std::string& config, const gof_result& g,
                            const std::map<sequence, std::size_t>& index_of, const std::vector<std::size_t>& ca,
                            const std::vector<std::size_t>& cb) {
        sequence worst;
        double z = -1.0;
        std::size_t wa = 0, wb = 0;
        for (const auto& [c, i] : index_of) {
            const double t = static_cast<double>(ca[i] + cb[i]);
            if (t < 10.0) continue;
            const double d = std::abs(static_cast<double>(ca[i]) - static_cast<double>(cb[i])) / std::sqrt(t);
            if (d > z) {
                z = d;
                worst = c;
                wa = ca[i];
                wb = cb[i];
            }
        }
        const bool prefix = !worst.empty() && worst.back() == -1;
        if (prefix) worst.pop_back();
        r_.passed = false;
        r_.failure = config + ": the law of the first " + std::to_string(o_.length) +
                     " tokens differs from plain sampling from the target (two-sample chi2 = " + number(g.statistic) +
                     ", df = " + std::to_string(g.degrees_of_freedom) + ", p = " + number(g.p_value) + " < " +
                     number(o_.significance) + "); e.g. " + (prefix ? "sequences starting " : "") +
                     tokens_text(worst) + ": " + std::to_string(wa) + " from speculative decoding, " +
                     std::to_string(wb) + " from plain sampling";
    }

    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point started_{};  // when the current config began
    D& drafter_;
    V& target_;
    decltype(plain_target(std::declval<V&>())) plain_;  // what plain sampling from the target reads
    const conformance_options& o_;
    report r_;
    double worst_p_ = 1.0, worst_stat_ = 0.0;
    std::size_t tests_ = 0, drafted_ = 0, accepted_ = 0;
    std::ostringstream ran_;
};

template <kit_drafter D, kit_target V>
report equivalence(D& drafter, V& target, const conformance_options& o) {
    return equivalence_runner<D, V>(drafter, target, o).run();
}

}  // namespace detail

/// Sequence-level equivalence (Leviathan et al. 2023, App. A.1): the law of the first `o.length`
/// tokens generated after `o.prompt` by speculative_decode with the user's pair equals the law
/// of plain sampling from the target, for every scheme in `o.schemes` (or, for a tree step, the
/// tree's own scheme) and sampling config in `o.samplings` (with `o.decode`'s other settings:
/// the tree's shape, the length policy, the draft's sampling and stop, stop tokens).
///
/// By default `o.samples` sequences are tested (Pearson's χ²) against the target's exact
/// probabilities of a partition into prefix cells: the target's probability tree is enumerated
/// (standardized as the library does) down to the prefixes of probability 5 / `o.samples`, so
/// every cell the sample can fill is resolved, and when V^n is small every sequence is a cell of
/// its own. The partition depends on the target alone. With `o.two_sample`, `o.samples`
/// sequences of speculative_decode and as many of autoregressive_decode are compared instead by
/// a χ² test of homogeneity over prefix cells (each sequence counted in its longest prefix that
/// 20 of the pooled sequences share; a partition that does not depend on which sampler drew what).
/// With `o.sequential` (the default) the exact test is made after a quarter, a half and all of
/// `o.samples`, stopping at the first failure, and after twice and four times as many when the
/// last p-value is borderline (below 0.01), each look at `o.significance` / 5; the two-sample test
/// draws its samples at once.
///
/// False-alarm rate: `o.significance` per scheme and config (the report states the total), up
/// to the error of the χ² approximation (cells expected fewer than 5 times are pooled, and a
/// pool still that small is tested exactly on its own, see testing::chi_square_test; for the
/// same test specdec's distribution suite measured 1-2 × 10^-4 at a nominal 10^-4).
template <detail::kit_drafter D, detail::kit_target V>
[[nodiscard]] report check_equivalence(D& drafter, V& target, const conformance_options& o = {}) {
    return detail::guarded("sequence-level equivalence", [&] { return detail::equivalence(drafter, target, o); });
}

}  // namespace specdec::testing
