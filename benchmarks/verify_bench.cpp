// Benchmarks of the hot core: specdec::verify against two reference points on identical inputs,
// and drafter-side sampling (standardize + one draw) against a naive version.
//
//   BM_verify/<case>          specdec::verify, default verify_options: block verification, draft
//                             columns checked
//   BM_verify_token/<case>    token verification (Leviathan et al. Alg. 1), draft columns checked
//   BM_verify_nocheck/<case>  token verification with check_draft_distributions = false, as
//                             speculative_step runs it for drafts that come from standardize()
//                             (draft distributions at V >= 32000)
//   BM_verify_block_nocheck/<case>  the same with block verification: how speculative_step runs
//                             its default scheme on drafts from a model drafter
//   BM_naive/<case>           specdec_bench::naive_verify (baselines.hpp): full softmax of all γ+1
//                             rows into fresh vectors, std::sort for top-k / top-p, explicit
//                             residual normalization, std::discrete_distribution
//   BM_bound/<case>           one vectorized log-sum-exp (temperature 0: max) pass over exactly the
//                             rows the algorithm must normalize: rows 0..n for an outcome with n
//                             accepted drafts under token verification (n + 1 rows; γ + 1 when
//                             all are accepted): the bound for BM_verify_token
//   BM_bound_block/<case>     the same over the rows block verification must normalize for
//                             the outcome: p_1..p_k, k the first position where the block weight
//                             w_k is 0 (else γ), and p_{γ+1} when all γ drafts are accepted: the
//                             bound for BM_verify
//   BM_bound_q, BM_bound_block_q/<case>  (draft distributions, T = 1, plain) the same passes,
//                             each also reading the draft column of its position in the same loop
//                             (log_sum_exp_reading): the least work of a pass that normalizes the
//                             rows and reads the draft columns, as the default check must. A
//                             reference for the checked benchmarks (the bound proper counts logits
//                             only); the nocheck benchmarks read no draft column.
//
//   <case> = <draft>/<filter>/<regime>/V:<vocab>/gamma:<γ>/T:<temperature>
//     draft   dist (V x γ draft distributions) | point (specdec::point_mass)
//     filter  plain | topk40 | topp0.9 (top-k / top-p at temperature 1)
//     regime  all_accepted | first_reject | mix (token acceptance ≈ 0.7)
//
// Every case is a fixed batch of K = 16 calls ("slots"), each with its own draft tokens and its
// own rng seed (splitmix64, restarted for every call), whose outcome (number of accepted drafts)
// was fixed once, at setup, by running specdec::verify with token verification (the outcome under
// block verification is recorded too). In the timed runs the seed's stream supplies only the
// uniforms of the decision (block verification: its η_i); the emitted token is drawn with
// uniforms from a stream that no call restarts (call_rng), as in decoding. Block verification
// can settle a test η_i < h_i (i < γ) with coins drawn after its η_i, from that second stream,
// so BM_verify checks of its outcome only what fixes the rows it normalizes: whether all γ
// drafts were accepted (that test uses η_γ alone). The regimes:
//   all_accepted  every slot accepts all γ drafts. Draft distributions: q_i = p_i except that
//                 1e-3 of q_i(x_i) moves to another token, so q_i(x_i) < p_i(x_i) and the test
//                 passes for every r (robust to rounding differences between implementations);
//                 at T = 0, x_i is the argmax. Point mass at T = 1: the target gives x_i
//                 probability 0.7 and only seeds whose tests all pass are kept.
//   first_reject  the target logit of x_1 is -inf (p_1(x_1) = 0) while q_1(x_1) > 0.
//   mix           slots are drawn (tokens from q, fresh seeds; point mass: p(x_i) = 0.7; T = 0:
//                 the draft agrees with the target's argmax or picks its second choice) and kept
//                 so that the batch holds the outcomes n = 0..γ in the proportions of i.i.d.
//                 acceptance with α = 0.7 (P(n) = 0.3·0.7^n, P(γ) = 0.7^γ), rounded to K.
//                 Draft distributions at T > 0 are standardize(target logits + σ·noise) with σ
//                 tuned so that Σ min(p, q) ≈ 0.7.
// BM_bound replays the same outcomes; BM_naive runs its own decisions from the same seeds and
// reports how many differ from specdec's (counter outcome_diff: 0 for token verification; the
// block scheme decides differently from the same uniforms).
//
// Timing: one iteration = the whole batch of K calls, so Time and CPU are per K calls; the
// counter per_call is CPU time / K (and scripts/bench_verify_report.py divides by the counter
// calls = K). One verify_workspace per benchmark; a first untimed batch warms it up.
//
// Counters: per_call   seconds of CPU time per call (mean over the batch)
//           tok/s      emitted tokens (n + 1 per call) per CPU second = rows normalized per second
//           bytes_per_second  target-logit bytes of those rows (4·V·(n + 1) per call) per second
//           accept     acceptance rate of the batch: accepted / tested drafts
//           outcome_diff (naive) fraction of slots where naive's outcome differs from verify's
//
// Logits: i.i.d. N(0, 3^2) per entry (a few hundred effective tokens at V = 32000).
//
// Rejection cost against the residual mass R (V = 32000, 151936; R = 0.01, 0.001, 0.0001):
//   BM_rejection/V:<vocab>/R:<R>        token verification of one draft token that is always
//                                       rejected, with residual mass R (see rejection_input); the
//                                       draw after it takes about 1/R proposals or the exact pass
//   BM_rejection_bound[_q]/V:<vocab>/R:<R>  the bound: one log-sum-exp of the row (_q: reading q too)
//   BM_pass/V:<vocab>/check:<0|1>       that call's normalizing pass alone (R = 0.01), with or
//                                       without the draft-column check
//   BM_proposals/V:<vocab>/group:<K>    that call's residual proposals alone, K made side by side
//                                       (per_call: seconds per proposal)
//
// Drafter side:  BM_sample/<filter>/V:<vocab>/T:1        standardize_and_sample (q normalized)
//                BM_sample_weights/...                    standardize_weights_and_sample (weights and
//                                                         their scale, as speculative decoding drafts)
//                BM_sample_naive/...                      naive softmax + std::discrete_distribution
//                BM_sample_bound/...                      log-sum-exp of the row
//                BM_sample_bound_write/...                that pass also storing its exps, then one
//                                                         pass scaling them to sum 1: the least work
//                                                         that writes q (specdec_bench::softmax_into)
//
// Run:   build/bench/benchmarks/verify_bench --benchmark_min_time=0.05
//          --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//          --benchmark_out=verify.json --benchmark_out_format=json
//        python3 scripts/bench_verify_report.py verify.json

#include <benchmark/benchmark.h>

#include <Eigen/Core>

#include <specdec/sampling.hpp>
#include <specdec/verify.hpp>

#include "baselines.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace {

using specdec::token_id;
using specdec_bench::splitmix64;
using Index = Eigen::Index;

constexpr int calls_per_batch = 16;             // K: calls per iteration (slots per case)
constexpr double mix_alpha = 0.7;               // acceptance rate of the mix regime
constexpr float logit_sigma = 3.0f;             // target logits ~ N(0, sigma^2)
constexpr float point_mass_probability = 0.7f;  // p(x_i) of point-mass drafts at T > 0
constexpr int max_candidates = 20000;           // slots tried before a case gives up
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

enum class draft_kind { dist, point };
/// masked: drafter side only, plain sampling of a row where all but 1% of the tokens are −Inf
/// (a constrained vocabulary).
enum class filter_kind { plain, topk40, topp09, masked };
enum class regime { all_accepted, first_reject, mix };

struct case_spec {
    Index vocab;
    int gamma;
    int temperature;  // 0 or 1
    filter_kind filter;
    draft_kind draft;
    regime reg;

    bool operator==(const case_spec&) const = default;

    specdec::sampling_config sampling() const {
        specdec::sampling_config s;
        s.temperature = static_cast<float>(temperature);
        if (filter == filter_kind::topk40) s.top_k = 40;
        if (filter == filter_kind::topp09) s.top_p = 0.9f;
        return s;
    }
    std::string path() const {
        const char* d = draft == draft_kind::dist ? "dist" : "point";
        const char* f = filter == filter_kind::plain    ? "plain"
                        : filter == filter_kind::topk40 ? "topk40"
                        : filter == filter_kind::topp09 ? "topp0.9"
                                                        : "masked";
        const char* r = reg == regime::all_accepted ? "all_accepted" : reg == regime::first_reject ? "first_reject" : "mix";
        return std::string(d) + "/" + f + "/" + r;
    }
};

struct slot {
    std::vector<token_id> tokens;
    std::size_t q_index = 0;  // which draft matrix (T = 0 mix patterns); unused for point mass
    std::uint64_t seed = 0;
    std::size_t accepted = 0;        // outcome under token verification (defines the regime)
    std::size_t accepted_block = 0;  // outcome under block verification (the default scheme)
    std::size_t rows_block = 0;      // rows block verification must normalize for this outcome
};

struct built_case {
    case_spec spec{};
    specdec::sampling_config sampling;
    Eigen::MatrixXf z;               // V x (γ+1) target logits
    std::vector<Eigen::MatrixXf> q;  // V x γ draft distributions (empty for point mass)
    std::vector<slot> slots;         // the batch
    double acceptance = 0.0;         // accepted / tested over the batch
    double tokens_per_call = 0.0;    // mean n + 1
    double bytes_per_call = 0.0;     // mean 4·V·(n + 1)
    double naive_outcome_diff = 0.0;
    double naive_acceptance = 0.0;
    std::string error;
};

// ---------------------------------------------------------------------------------------------
// Input construction.
// ---------------------------------------------------------------------------------------------

std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) {
    splitmix64 g{a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull)};
    g();
    return g();
}

double standard_normal(splitmix64& g) {  // Box-Muller; platform-independent
    const double u1 = 1.0 - specdec::uniform01(g), u2 = specdec::uniform01(g);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void fill_normal(Eigen::MatrixXf& m, float sigma, splitmix64& g) {
    for (Index j = 0; j < m.cols(); ++j)
        for (Index i = 0; i < m.rows(); ++i) m(i, j) = static_cast<float>(sigma * standard_normal(g));
}

Eigen::VectorXf standardized(const Eigen::Ref<const Eigen::VectorXf>& z, const specdec::sampling_config& s) {
    Eigen::VectorXf out(z.size());
    specdec::sampling_workspace ws;
    specdec::standardize(z, s, out, ws);
    return out;
}

Index argmax(const Eigen::Ref<const Eigen::VectorXf>& v) {
    Index best = 0;
    v.maxCoeff(&best);
    return best;
}

Index second_largest(const Eigen::Ref<const Eigen::VectorXf>& v) {
    const Index best = argmax(v);
    Index second = best == 0 ? 1 : 0;
    for (Index i = 0; i < v.size(); ++i)
        if (i != best && v[i] > v[second]) second = i;
    return second;
}

/// Index drawn from weights w by inversion on their prefix sums (double).
Index draw(const std::vector<double>& cdf, splitmix64& g) {
    const double target = specdec::uniform01(g) * cdf.back();
    const auto it = std::upper_bound(cdf.begin(), cdf.end(), target);
    return std::min<Index>(static_cast<Index>(it - cdf.begin()), static_cast<Index>(cdf.size()) - 1);
}

std::vector<double> prefix_sums(const Eigen::Ref<const Eigen::VectorXf>& w) {
    std::vector<double> c(static_cast<std::size_t>(w.size()));
    double acc = 0.0;
    for (Index i = 0; i < w.size(); ++i) c[static_cast<std::size_t>(i)] = acc += w[i];
    return c;
}

Eigen::MatrixXf one_hot_columns(Index vocab, const std::vector<token_id>& tokens) {
    Eigen::MatrixXf q = Eigen::MatrixXf::Zero(vocab, static_cast<Index>(tokens.size()));
    for (std::size_t i = 0; i < tokens.size(); ++i) q(tokens[i], static_cast<Index>(i)) = 1.0f;
    return q;
}

/// Outcome counts n = 0..γ of the batch: all_accepted / first_reject put all K at γ / 0; mix
/// rounds K·P(n) for i.i.d. acceptance with probability α (largest remainders).
std::vector<int> target_counts(const case_spec& c) {
    const auto g = static_cast<std::size_t>(c.gamma);
    const int k = calls_per_batch;
    std::vector<int> counts(g + 1, 0);
    if (c.reg == regime::all_accepted) {
        counts[g] = k;
        return counts;
    }
    if (c.reg == regime::first_reject) {
        counts[0] = k;
        return counts;
    }
    std::vector<double> want(g + 1);
    for (std::size_t n = 0; n < g; ++n) want[n] = k * (1.0 - mix_alpha) * std::pow(mix_alpha, static_cast<double>(n));
    want[g] = k * std::pow(mix_alpha, static_cast<double>(g));
    int used = 0;
    for (std::size_t n = 0; n <= g; ++n) used += counts[n] = static_cast<int>(std::floor(want[n]));
    std::vector<std::size_t> order(g + 1);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return want[a] - std::floor(want[a]) > want[b] - std::floor(want[b]);
    });
    for (std::size_t j = 0; used < k; ++j, ++used) ++counts[order[j % order.size()]];
    return counts;
}

/// The generator of a timed call: the slot's own stream, restarted for the call, for the
/// uniforms that decide the outcome (so that it is the one fixed at setup), then a stream that
/// no call restarts for the rest, the draw of the emitted token. In decoding no two steps see
/// the same uniforms; replaying the draw's uniforms batch after batch would let the branch
/// predictor learn the draw's branches, which it cannot do in use.
struct call_rng {
    using result_type = std::uint64_t;
    splitmix64 replayed;
    int replayed_left;  // outputs still to come from `replayed` (one per uniform01)
    splitmix64* fresh;
    static constexpr result_type min() { return splitmix64::min(); }
    static constexpr result_type max() { return splitmix64::max(); }
    result_type operator()() { return replayed_left-- > 0 ? replayed() : (*fresh)(); }
};

/// Uniforms a call spends on its decision: at T > 0 one per tested draft under token
/// verification (the naive baseline tests as it does), the γ values η_i under block
/// verification; none at T = 0, where the decision follows from the argmax.
int decision_uniforms(const built_case& bc, const slot& s, bool token) {
    if (bc.spec.temperature == 0) return 0;
    return token ? static_cast<int>(std::min<std::size_t>(s.accepted + 1, s.tokens.size()))
                 : static_cast<int>(s.tokens.size());
}

template <class G>
specdec::verify_result run_verify(const built_case& bc, const slot& s, G& rng, specdec::verify_workspace& ws,
                                  const specdec::verify_options& opts) {
    const std::span<const token_id> tokens(s.tokens);
    if (bc.spec.draft == draft_kind::dist) return specdec::verify(bc.z, tokens, bc.q[s.q_index], bc.sampling, rng, ws, opts);
    return specdec::verify(bc.z, tokens, specdec::point_mass, bc.sampling, rng, ws, opts);
}

template <class G>
specdec_bench::naive_result run_naive(const built_case& bc, const slot& s, G& rng) {
    const Eigen::MatrixXf* q = bc.spec.draft == draft_kind::dist ? &bc.q[s.q_index] : nullptr;
    return specdec_bench::naive_verify(bc.z, std::span<const token_id>(s.tokens), q, bc.sampling, rng);
}

/// Draft distributions for the T > 0 mix: standardize(z + σ·noise) with σ chosen by bisection so
/// that the mean over positions of Σ min(p, q) is ≈ α.
std::vector<Eigen::VectorXf> tuned_draft(const built_case& bc, splitmix64& g) {
    const Index vocab = bc.z.rows();
    const int gamma = bc.spec.gamma;
    Eigen::MatrixXf noise(vocab, gamma);
    fill_normal(noise, 1.0f, g);
    std::vector<Eigen::VectorXf> p;
    for (int i = 0; i < gamma; ++i) p.push_back(standardized(bc.z.col(i), bc.sampling));
    auto draft_at = [&](double sigma, std::vector<Eigen::VectorXf>& q) {
        q.clear();
        double beta = 0.0;
        for (int i = 0; i < gamma; ++i) {
            const Eigen::VectorXf d = bc.z.col(i) + static_cast<float>(sigma) * noise.col(i);
            q.push_back(standardized(d, bc.sampling));
            beta += p[static_cast<std::size_t>(i)].cwiseMin(q.back()).cast<double>().sum();
        }
        return beta / gamma;
    };
    std::vector<Eigen::VectorXf> q;
    double lo = 0.0, hi = 8.0;
    for (int it = 0; it < 16; ++it) {
        const double mid = 0.5 * (lo + hi);
        (draft_at(mid, q) > mix_alpha ? lo : hi) = mid;
    }
    draft_at(0.5 * (lo + hi), q);
    return q;
}

/// Rows block verification must normalize: p_1..p_k, where k is the first position with
/// w_k = 0 (w_i = min(1, w_{i−1} p_i(x_i) / q_i(x_i))) or γ, and p_{γ+1} when all γ drafts are
/// accepted (from double-precision reference probabilities).
std::size_t block_rows(const built_case& bc, const slot& s) {
    const auto gamma = s.tokens.size();
    double w = 1.0;
    std::size_t k = gamma;
    for (std::size_t i = 0; i < gamma; ++i) {
        const auto col = static_cast<Index>(i);
        const std::vector<float> p = specdec_bench::naive_standardize(bc.z.col(col).data(), static_cast<std::size_t>(bc.z.rows()), bc.sampling);
        const double px = p[static_cast<std::size_t>(s.tokens[i])];
        const double qx = bc.spec.draft == draft_kind::dist ? static_cast<double>(bc.q[s.q_index](s.tokens[i], col)) : 1.0;
        w = qx > 0.0 ? std::min(1.0, w * px / qx) : 0.0;
        if (w == 0.0) {
            k = i + 1;
            break;
        }
    }
    return k + (s.accepted_block == gamma ? 1 : 0);
}

built_case build(const case_spec& c) {
    built_case bc;
    bc.spec = c;
    bc.sampling = c.sampling();
    const Index vocab = c.vocab;
    const int gamma = c.gamma;
    const auto ug = static_cast<std::size_t>(gamma);
    const bool greedy = c.temperature == 0;
    splitmix64 data{mix_seed(static_cast<std::uint64_t>(vocab), static_cast<std::uint64_t>(gamma) * 131 +
                                                                    static_cast<std::uint64_t>(c.filter) * 7 +
                                                                    static_cast<std::uint64_t>(c.draft))};
    bc.z.resize(vocab, gamma + 1);
    fill_normal(bc.z, logit_sigma, data);

    // Candidate generator: slot number k -> tokens, draft matrix, seed. Outcomes come from verify.
    std::vector<token_id> fixed_tokens(ug);
    std::function<slot(int)> candidate;
    auto fixed = [&](int k) {
        slot s;
        s.tokens = fixed_tokens;
        s.seed = mix_seed(0x5eed, static_cast<std::uint64_t>(k));
        return s;
    };

    if (c.draft == draft_kind::point && !greedy) {
        // The target gives the drafted token probability 0.7 (before top-k / top-p).
        for (int i = 0; i < gamma; ++i) {
            const auto x = static_cast<Index>(mix_seed(data(), 1) % static_cast<std::uint64_t>(vocab));
            auto col = bc.z.col(i);
            double m = neg_inf;
            for (Index k = 0; k < vocab; ++k)
                if (k != x) m = std::max<double>(m, col[k]);
            double s = 0.0;
            for (Index k = 0; k < vocab; ++k)
                if (k != x) s += std::exp(col[k] - m);
            col[x] = static_cast<float>(m + std::log(s) + std::log(point_mass_probability / (1.0 - point_mass_probability)));
            fixed_tokens[static_cast<std::size_t>(i)] = static_cast<token_id>(x);
        }
        if (c.reg == regime::first_reject) bc.z(fixed_tokens[0], 0) = neg_inf;
        candidate = fixed;
    } else if (greedy) {
        // T = 0: the draft (point mass, or one-hot q = standardize at T = 0) agrees with the
        // target's argmax, or picks its second choice; first_reject removes x_1 from the target.
        std::vector<token_id> best(ug), second(ug);
        for (std::size_t i = 0; i < ug; ++i) {
            best[i] = static_cast<token_id>(argmax(bc.z.col(static_cast<Index>(i))));
            second[i] = static_cast<token_id>(second_largest(bc.z.col(static_cast<Index>(i))));
        }
        if (c.reg != regime::mix) {
            fixed_tokens = best;
            if (c.draft == draft_kind::dist) bc.q.push_back(one_hot_columns(vocab, fixed_tokens));
            if (c.reg == regime::first_reject) bc.z(fixed_tokens[0], 0) = neg_inf;
            candidate = fixed;
        } else {
            // One pattern per outcome n < γ needed: argmax everywhere except the second choice at n.
            const std::vector<int> counts = target_counts(c);
            std::vector<std::vector<token_id>> patterns;
            for (std::size_t n = 0; n <= ug; ++n) {
                if (counts[n] == 0) continue;
                std::vector<token_id> t = best;
                if (n < ug) t[n] = second[n];
                patterns.push_back(t);
                if (c.draft == draft_kind::dist) bc.q.push_back(one_hot_columns(vocab, t));
            }
            candidate = [patterns, is_dist = c.draft == draft_kind::dist](int k) {
                const auto which = static_cast<std::size_t>(k) % patterns.size();
                slot s;
                s.tokens = patterns[which];
                s.q_index = is_dist ? which : 0;
                s.seed = mix_seed(0x5eed, static_cast<std::uint64_t>(k));
                return s;
            };
        }
    } else {
        // Draft distributions at T > 0.
        if (c.reg == regime::mix) {
            const std::vector<Eigen::VectorXf> qs = tuned_draft(bc, data);
            Eigen::MatrixXf q(vocab, gamma);
            std::vector<std::vector<double>> cdf;
            for (int i = 0; i < gamma; ++i) {
                q.col(i) = qs[static_cast<std::size_t>(i)];
                cdf.push_back(prefix_sums(q.col(i)));
            }
            bc.q.push_back(std::move(q));
            candidate = [cdf](int k) {
                splitmix64 g{mix_seed(0x70c3, static_cast<std::uint64_t>(k))};
                slot s;
                for (const auto& col : cdf) s.tokens.push_back(static_cast<token_id>(draw(col, g)));
                s.seed = mix_seed(0x5eed, static_cast<std::uint64_t>(k));
                return s;
            };
        } else {
            Eigen::MatrixXf q(vocab, gamma);
            for (int i = 0; i < gamma; ++i) {
                q.col(i) = standardized(bc.z.col(i), bc.sampling);
                const std::vector<double> cdf = prefix_sums(q.col(i));
                Index x = draw(cdf, data);
                if (c.reg == regime::first_reject && i == 0) x = argmax(q.col(0));
                fixed_tokens[static_cast<std::size_t>(i)] = static_cast<token_id>(x);
                if (c.reg == regime::all_accepted) {
                    // Move 1e-3 of q(x) to the most probable other token in the support, so that
                    // q(x) < p(x) and every acceptance test passes whatever r is.
                    Index y = -1;
                    for (Index k = 0; k < vocab; ++k)
                        if (k != x && q(k, i) > 0.0f && (y < 0 || q(k, i) > q(y, i))) y = k;
                    if (y >= 0) {
                        const float moved = 1e-3f * q(x, i);
                        q(x, i) -= moved;
                        q(y, i) += moved;
                    }
                }
            }
            if (c.reg == regime::first_reject) bc.z(fixed_tokens[0], 0) = neg_inf;  // p_1(x_1) = 0 < q_1(x_1)
            bc.q.push_back(std::move(q));
            candidate = fixed;
        }
    }

    // Fill the batch: keep candidates whose outcome under specdec::verify is still wanted.
    std::vector<int> need = target_counts(c);
    const int batch = calls_per_batch;
    int missing = batch;
    specdec::verify_workspace ws;
    try {
        for (int k = 0; missing > 0 && k < max_candidates; ++k) {
            slot s = candidate(k);
            splitmix64 rng{s.seed};
            const specdec::verify_result r = run_verify(bc, s, rng, ws, {.scheme = specdec::verification_scheme::token});
            if (need[r.accepted] > 0) {
                --need[r.accepted];
                --missing;
                s.accepted = r.accepted;
                splitmix64 rng_block{s.seed};
                s.accepted_block = run_verify(bc, s, rng_block, ws, {}).accepted;
                s.rows_block = block_rows(bc, s);
                bc.slots.push_back(std::move(s));
            }
        }
    } catch (const std::exception& e) {
        bc.error = std::string("specdec::verify threw at setup: ") + e.what();
        return bc;
    }
    if (missing > 0) {
        bc.error = "could not realize the regime: " + std::to_string(missing) + " of " + std::to_string(batch) +
                   " slots missing after " + std::to_string(max_candidates) + " candidates (outcomes differ from the construction)";
        return bc;
    }
    std::stable_sort(bc.slots.begin(), bc.slots.end(), [](const slot& a, const slot& b) { return a.accepted < b.accepted; });

    std::size_t accepted = 0, tested = 0, tokens = 0, naive_diff = 0, naive_accepted = 0, naive_tested = 0;
    for (const slot& s : bc.slots) {
        accepted += s.accepted;
        tested += std::min<std::size_t>(s.accepted + 1, ug);
        tokens += s.accepted + 1;
        splitmix64 rng{s.seed};
        const auto nr = run_naive(bc, s, rng);
        naive_diff += nr.accepted != s.accepted;
        naive_accepted += nr.accepted;
        naive_tested += std::min<std::size_t>(nr.accepted + 1, ug);
    }
    bc.acceptance = static_cast<double>(accepted) / static_cast<double>(tested);
    bc.tokens_per_call = static_cast<double>(tokens) / batch;
    bc.bytes_per_call = bc.tokens_per_call * 4.0 * static_cast<double>(vocab);
    bc.naive_outcome_diff = static_cast<double>(naive_diff) / batch;
    bc.naive_acceptance = static_cast<double>(naive_accepted) / static_cast<double>(naive_tested);
    if (naive_diff > 0)
        std::fprintf(stderr, "note: %s V=%td gamma=%d T=%d: naive and specdec::verify differ in %zu of %d outcomes\n",
                     c.path().c_str(), vocab, gamma, c.temperature, naive_diff, batch);
    return bc;
}

/// The input of the benchmark that runs now, made by make() only when the key differs from the
/// last call's (one slot per call site): benchmarks that share an input are registered next to
/// each other, so it is built once for all of them and every repetition.
template <class Value, class Key, class Make>
const Value& cached_input(const Key& key, Make&& make) {
    static std::optional<std::pair<Key, Value>> slot;
    if (!slot || !(slot->first == key)) {
        slot.reset();  // free the previous input first
        slot.emplace(key, make());
    }
    return slot->second;
}

/// The case of the benchmark that runs now; the BM_verify / BM_naive / BM_bound benchmarks of a
/// case are registered next to each other, so one cached case serves all of them (and every
/// repetition).
const built_case& get_case(const case_spec& c) { return cached_input<built_case>(c, [&] { return build(c); }); }

// ---------------------------------------------------------------------------------------------
// Benchmarks.
// ---------------------------------------------------------------------------------------------

/// Runs `batch` (all K calls of a case) once untimed (warm-up: workspace sizes, caches), then once
/// per iteration.
template <class Batch>
void timed_batches(benchmark::State& state, Batch&& batch) {
    batch();
    for (auto _ : state) batch();
}

/// Counters of a benchmark whose iteration is a batch of k calls: calls, and per_call (seconds).
void set_per_call(benchmark::State& state, double k) {
    state.counters["calls"] = k;
    state.counters["per_call"] = benchmark::Counter(k, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void set_counters(benchmark::State& state, const built_case& bc, double acceptance) {
    const auto k = static_cast<double>(bc.slots.size());
    set_per_call(state, k);
    state.counters["tok/s"] = benchmark::Counter(k * bc.tokens_per_call, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bytes_per_second"] = benchmark::Counter(k * bc.bytes_per_call, benchmark::Counter::kIsIterationInvariantRate,
                                                            benchmark::Counter::kIs1024);
    state.counters["accept"] = acceptance;
}

void bm_verify(benchmark::State& state, const case_spec& c, bool check, specdec::verification_scheme scheme) {
    const built_case& bc = get_case(c);
    if (!bc.error.empty()) {
        state.SkipWithError(bc.error.c_str());
        return;
    }
    specdec::verify_workspace ws;
    specdec::verify_options opts;
    opts.check_draft_distributions = check;
    opts.scheme = scheme;
    const bool token = scheme == specdec::verification_scheme::token;
    std::size_t mismatches = 0;
    splitmix64 fresh{0xd7a3};
    timed_batches(state, [&] {
        for (const slot& s : bc.slots) {
            call_rng rng{splitmix64{s.seed}, decision_uniforms(bc, s, token), &fresh};
            const specdec::verify_result r = run_verify(bc, s, rng, ws, opts);
            benchmark::DoNotOptimize(r);
            // (Block verification: only whether all drafts were accepted is fixed; see the top.)
            const std::size_t all = s.tokens.size();
            const bool changed = token ? r.accepted != s.accepted : (r.accepted == all) != (s.accepted_block == all);
            if (changed) ++mismatches;
        }
    });
    if (mismatches > 0) state.SkipWithError("specdec::verify outcomes changed between setup and the timed run");
    set_counters(state, bc, bc.acceptance);
}

void bm_naive(benchmark::State& state, const case_spec& c) {
    const built_case& bc = get_case(c);
    if (!bc.error.empty()) {
        state.SkipWithError(bc.error.c_str());
        return;
    }
    splitmix64 fresh{0xd7a3};
    timed_batches(state, [&] {
        for (const slot& s : bc.slots) {
            call_rng rng{splitmix64{s.seed}, decision_uniforms(bc, s, true), &fresh};
            const specdec_bench::naive_result r = run_naive(bc, s, rng);
            benchmark::DoNotOptimize(r);
        }
    });
    set_counters(state, bc, bc.naive_acceptance);
    state.counters["outcome_diff"] = bc.naive_outcome_diff;
}

/// The bound: one log-sum-exp (temperature 0: one max) pass over each row the scheme must
/// normalize. Token verification: rows 0..n (n accepted). Block verification: see block_rows().
/// read_q (draft distributions, temperature > 0): each row's pass also reads the draft column of
/// the same position (columns 0..γ−1 among those rows), as verify's default check must; a
/// reference for the checked benchmarks, next to the bound proper.
void bm_bound(benchmark::State& state, const case_spec& c, bool block, bool read_q = false) {
    const built_case& bc = get_case(c);
    if (!bc.error.empty()) {
        state.SkipWithError(bc.error.c_str());
        return;
    }
    const Index vocab = bc.z.rows();
    const bool greedy = c.temperature == 0;
    timed_batches(state, [&] {
        for (const slot& s : bc.slots) {
            const auto rows = static_cast<Index>(block ? s.rows_block : s.accepted + 1);
            for (Index j = 0; j < rows; ++j) {
                const float* col = bc.z.col(j).data();
                if (read_q && j < c.gamma) {
                    auto v = specdec_bench::log_sum_exp_reading(col, bc.q[s.q_index].col(j).data(), vocab);
                    benchmark::DoNotOptimize(v);
                    continue;
                }
                float v = greedy ? specdec_bench::row_max(col, vocab) : specdec_bench::log_sum_exp(col, vocab);
                benchmark::DoNotOptimize(v);
            }
        }
    });
    set_counters(state, bc, bc.acceptance);
}

// Drafter side: standardize + one draw from a V-sized logits vector.

/// The logits row of a drafter-side benchmark: N(0, 3²), the same for every filter, with all but
/// every 100th token −Inf for `masked`.
const Eigen::VectorXf& get_sample_input(Index vocab, filter_kind f) {
    return cached_input<Eigen::VectorXf>(std::pair{vocab, f}, [&] {
        splitmix64 g{mix_seed(static_cast<std::uint64_t>(vocab), 0xd4a7)};
        Eigen::MatrixXf m(vocab, 1);
        fill_normal(m, logit_sigma, g);
        if (f == filter_kind::masked)
            for (Index i = 0; i < vocab; ++i)
                if (i % 100 != 0) m(i, 0) = neg_inf;
        return Eigen::VectorXf(m.col(0));
    });
}

specdec::sampling_config sample_config(filter_kind f) {
    specdec::sampling_config s;  // temperature 1
    if (f == filter_kind::topp09) s.top_p = 0.9f;
    return s;
}

/// One drafter-side sampler on a row: draw(z, s, out, u, ws) per iteration.
template <class Draw>
void run_sampler(benchmark::State& state, Index vocab, filter_kind f, Draw&& draw) {
    const Eigen::VectorXf& z = get_sample_input(vocab, f);
    const specdec::sampling_config s = sample_config(f);
    specdec::sampling_workspace ws;
    Eigen::VectorXf out(vocab);
    std::mt19937_64 rng(42);
    for (auto _ : state) {
        double u = specdec::uniform01(rng);
        const auto x = draw(z, s, out, u, ws);
        benchmark::DoNotOptimize(x);
    }
    state.counters["tok/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * vocab * 4);
}

/// standardize_and_sample: q written normalized.
void bm_sample(benchmark::State& state, Index vocab, filter_kind f) {
    run_sampler(state, vocab, f, [](auto&... a) { return specdec::standardize_and_sample(a...); });
}

/// standardize_weights_and_sample: what speculative decoding runs on a draft model's logits
/// (the weights and their scale go to verification, and no pass normalizes them).
void bm_sample_weights(benchmark::State& state, Index vocab, filter_kind f) {
    run_sampler(state, vocab, f, [](auto&... a) { return specdec::standardize_weights_and_sample(a...); });
}

void bm_sample_naive(benchmark::State& state, Index vocab, filter_kind f) {
    const Eigen::VectorXf& z = get_sample_input(vocab, f);
    const specdec::sampling_config s = sample_config(f);
    std::mt19937_64 rng(42);
    for (auto _ : state) {
        token_id x = specdec_bench::naive_sample(z.data(), static_cast<std::size_t>(vocab), s, rng);
        benchmark::DoNotOptimize(x);
    }
    state.counters["tok/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * vocab * 4);
}

void bm_sample_bound(benchmark::State& state, Index vocab, filter_kind f) {
    const Eigen::VectorXf& z = get_sample_input(vocab, f);
    for (auto _ : state) {
        float v = specdec_bench::log_sum_exp(z.data(), vocab);
        benchmark::DoNotOptimize(v);
    }
    state.counters["tok/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * vocab * 4);
}

void bm_sample_bound_write(benchmark::State& state, Index vocab, filter_kind f) {
    const Eigen::VectorXf& z = get_sample_input(vocab, f);
    Eigen::VectorXf q(vocab);
    std::vector<float> block_max(static_cast<std::size_t>(specdec_bench::lse_blocks(vocab)));
    // It must write what the drafter writes: specdec's plain distribution, up to float rounding.
    specdec_bench::softmax_into(z.data(), q.data(), vocab, block_max.data());
    Eigen::VectorXf expected(vocab);
    specdec::sampling_workspace sws;
    specdec::standardize(z, specdec::sampling_config{}, expected, sws);
    if (!((q - expected).cwiseAbs().array() <= 1e-5f * expected.array() + 1e-12f).all()) {
        state.SkipWithError("softmax_into differs from specdec::standardize");
        return;
    }
    for (auto _ : state) {
        specdec_bench::softmax_into(z.data(), q.data(), vocab, block_max.data());
        benchmark::DoNotOptimize(q.data());
        benchmark::ClobberMemory();
    }
    state.counters["tok/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * vocab * 4);
}

// Rejection cost against the residual mass: one draft token, always rejected, with residual mass R.

/// Target logits N(0, 3²) and q = their standardized distribution, except that the target logit of
/// the draft token x is -Inf: p(x) = 0, q(x) = R, and max(0, p − q) = p off x − q off x has mass
/// exactly R (p = q / (1 − R) off x), so every proposal from p is accepted with probability R.
/// x is the token whose q is nearest R (the realized R is reported as counter R).
struct rejection_input {
    Eigen::MatrixXf z, q;  // V x 2, V x 1
    token_id x = 0;
};

const rejection_input& get_rejection_input(Index vocab, double want) {
    return cached_input<rejection_input>(std::pair{vocab, want}, [&] {
        rejection_input in;
        splitmix64 g{mix_seed(static_cast<std::uint64_t>(vocab), 0x4e7)};
        in.z.resize(vocab, 2);
        fill_normal(in.z, logit_sigma, g);
        in.q = standardized(in.z.col(0), specdec::sampling_config{});
        Index x = 0;
        for (Index k = 1; k < vocab; ++k)
            if (std::abs(in.q(k, 0) - want) < std::abs(in.q(x, 0) - want)) x = k;
        in.x = static_cast<token_id>(x);
        in.z(x, 0) = neg_inf;
        return in;
    });
}

/// specdec::verify (token scheme, default check) on that input, K calls per iteration, their
/// uniforms from one stream that is never restarted; counters: R, and the mean number of
/// uniforms per call (2 per proposal, plus the test's and the first draw's, plus one when the
/// exact pass draws).
void bm_rejection(benchmark::State& state, Index vocab, double want) {
    const rejection_input& in = get_rejection_input(vocab, want);
    specdec::verify_workspace ws;
    specdec::verify_options opts;
    opts.scheme = specdec::verification_scheme::token;
    const token_id tokens[] = {in.x};
    std::uint64_t uniforms = 0, calls = 0;
    splitmix64 fresh{0x4e7};  // never restarted (see call_rng): p(x) = 0 fixes the outcome anyway
    timed_batches(state, [&] {
        for (int k = 0; k < calls_per_batch; ++k) {
            struct counted {
                using result_type = std::uint64_t;
                splitmix64* g;
                std::uint64_t* n;
                static constexpr result_type min() { return splitmix64::min(); }
                static constexpr result_type max() { return splitmix64::max(); }
                result_type operator()() { return ++*n, (*g)(); }
            } rng{&fresh, &uniforms};
            const specdec::verify_result r = specdec::verify(in.z, tokens, in.q, {}, rng, ws, opts);
            benchmark::DoNotOptimize(r);
            ++calls;
        }
    });
    set_per_call(state, calls_per_batch);
    state.counters["R"] = static_cast<double>(in.q(in.x, 0));
    state.counters["uniforms"] = static_cast<double>(uniforms) / static_cast<double>(calls);
}

/// Its references: the bound (one log-sum-exp of the row), and the same pass reading q as the
/// check must (log_sum_exp_reading).
void bm_rejection_bound(benchmark::State& state, Index vocab, double want, bool read_q) {
    const rejection_input& in = get_rejection_input(vocab, want);
    timed_batches(state, [&] {
        for (int k = 0; k < calls_per_batch; ++k) {
            if (read_q) {
                auto v = specdec_bench::log_sum_exp_reading(in.z.col(0).data(), in.q.col(0).data(), vocab);
                benchmark::DoNotOptimize(v);
            } else {
                float v = specdec_bench::log_sum_exp(in.z.col(0).data(), vocab);
                benchmark::DoNotOptimize(v);
            }
        }
    });
    set_per_call(state, calls_per_batch);
}

/// The copy of the hot core the internal benchmarks below call directly: the one for this
/// build's own instruction set (the bench preset's -march=native), as the preprocessor chose
/// before the core was dispatched at run time.
#if SPECDEC_DETAIL_X86_DISPATCH && defined(__AVX512F__) && defined(__AVX512DQ__)
namespace core = specdec::detail::SPECDEC_DETAIL_NS_AVX512;
#elif SPECDEC_DETAIL_X86_DISPATCH && defined(__AVX2__) && defined(__FMA__)
namespace core = specdec::detail::SPECDEC_DETAIL_NS_AVX2;
#else
namespace core = specdec::detail::kernels;
#endif

/// The parts of such a call, on the same input (R = 0.01): the normalizing pass over the row
/// alone (core::prepare_row, with or without the draft-column check), to be read
/// against BM_rejection_bound(_q); and the proposals of the residual draw alone: group = K draws
/// from p made side by side as sample_residual makes them (draw_plain_group for K = 4, the
/// AVX-512 walk with K draws for K = 1 and 8), uniforms from a stream never restarted. Counter
/// per_call: seconds per pass, or per proposal.
void bm_pass(benchmark::State& state, Index vocab, bool check) {
    const rejection_input& in = get_rejection_input(vocab, 0.01);
    specdec::detail::verify_buffers ws;
    const specdec::sampling_config s{};
    specdec::detail::reserve_rows(ws, vocab, 1, s);
    const float* q = check ? in.q.col(0).data() : nullptr;
    timed_batches(state, [&] {
        for (int k = 0; k < calls_per_batch; ++k) {
            const auto r = core::prepare_row(in.z, 0, s, ws, "bm_pass", q);
            benchmark::DoNotOptimize(r);
        }
    });
    set_per_call(state, calls_per_batch);
}

template <int K>
void bm_proposals(benchmark::State& state, Index vocab) {
    const rejection_input& in = get_rejection_input(vocab, 0.01);
    specdec::detail::verify_buffers ws;
    const specdec::sampling_config s{};
    specdec::detail::reserve_rows(ws, vocab, 1, s);
    const specdec::detail::target_row row = core::prepare_row(in.z, 0, s, ws, "bm_proposals");
    const double* prefix = core::block_prefix(row, vocab, ws);
    splitmix64 fresh{0x9e0};
    constexpr int per_batch = 64;  // proposals per timed batch
    static_assert(per_batch % K == 0);
    timed_batches(state, [&] {
        for (int t = 0; t < per_batch; t += K) {
            constexpr auto count = static_cast<std::size_t>(K);
            double u[count];
            core::weighted_index y[count];
            for (double& x : u) x = specdec::uniform01(fresh);
            if constexpr (K == core::proposal_group) {
                core::draw_plain_group(row, in.z, ws, prefix, u, y);
            } else {
#if defined(__AVX512F__)
                core::draw_plain_avx512<K>(row, in.z, ws, prefix, u, y);
#else
                for (int k = 0; k < K; ++k) y[k] = core::draw_plain(row, in.z, ws, prefix, u[k]);
#endif
            }
            benchmark::DoNotOptimize(y);
        }
    });
    set_per_call(state, per_batch);
}

// ---------------------------------------------------------------------------------------------
// Registration.
// ---------------------------------------------------------------------------------------------

std::vector<case_spec> verify_cases() {
    std::vector<case_spec> cases;
    const regime regimes[] = {regime::all_accepted, regime::first_reject, regime::mix};
    // Draft distributions, plain sampling: every V x γ x T x regime.
    for (Index v : {Index{512}, Index{32000}, Index{128256}, Index{151936}})
        for (int g : {1, 4, 8})
            for (int t : {0, 1})
                for (regime r : regimes) cases.push_back({v, g, t, filter_kind::plain, draft_kind::dist, r});
    // Point mass (plain), and top-k / top-p with both kinds of draft: γ = 4.
    for (Index v : {Index{32000}, Index{151936}}) {
        for (int t : {0, 1})
            for (regime r : regimes) cases.push_back({v, 4, t, filter_kind::plain, draft_kind::point, r});
        for (filter_kind f : {filter_kind::topk40, filter_kind::topp09})
            for (draft_kind d : {draft_kind::dist, draft_kind::point})
                for (regime r : regimes) cases.push_back({v, 4, 1, f, d, r});
    }
    return cases;
}

bool with_nocheck(const case_spec& c) { return c.draft == draft_kind::dist && c.vocab >= 32000; }
/// The checked cases whose check reads whole draft columns: draft distributions, temperature > 0.
bool with_read_q(const case_spec& c) {
    return c.draft == draft_kind::dist && c.temperature > 0 && c.filter == filter_kind::plain;
}

template <class Fn>
void add(const std::string& name, const case_spec& c, Fn fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Args({c.vocab, c.gamma, c.temperature})
        ->ArgNames({"V", "gamma", "T"})
        ->Unit(benchmark::kMicrosecond);
}

void register_all() {
    for (const case_spec& c : verify_cases()) {
        std::string p = "/";
        p += c.path();
        using specdec::verification_scheme;
        add("BM_verify" + p, c, [c](benchmark::State& s) { bm_verify(s, c, true, verification_scheme::block); });
        add("BM_verify_token" + p, c, [c](benchmark::State& s) { bm_verify(s, c, true, verification_scheme::token); });
        if (with_nocheck(c)) {
            add("BM_verify_nocheck" + p, c, [c](benchmark::State& s) { bm_verify(s, c, false, verification_scheme::token); });
            add("BM_verify_block_nocheck" + p, c,
                [c](benchmark::State& s) { bm_verify(s, c, false, verification_scheme::block); });
        }
        add("BM_naive" + p, c, [c](benchmark::State& s) { bm_naive(s, c); });
        add("BM_bound" + p, c, [c](benchmark::State& s) { bm_bound(s, c, false); });
        add("BM_bound_block" + p, c, [c](benchmark::State& s) { bm_bound(s, c, true); });
        if (with_read_q(c)) {
            add("BM_bound_q" + p, c, [c](benchmark::State& s) { bm_bound(s, c, false, true); });
            add("BM_bound_block_q" + p, c, [c](benchmark::State& s) { bm_bound(s, c, true, true); });
        }
    }
    for (Index v : {Index{32000}, Index{151936}})
        for (const char* r : {"0.01", "0.001", "0.0001"}) {
            const double want = std::stod(r);
            const std::string p = "/V:" + std::to_string(v) + "/R:" + r;
            auto reg = [&](const std::string& name, auto fn) {
                benchmark::RegisterBenchmark(name.c_str(), fn)->Unit(benchmark::kMicrosecond);
            };
            reg("BM_rejection" + p, [v, want](benchmark::State& s) { bm_rejection(s, v, want); });
            reg("BM_rejection_bound" + p, [v, want](benchmark::State& s) { bm_rejection_bound(s, v, want, false); });
            reg("BM_rejection_bound_q" + p, [v, want](benchmark::State& s) { bm_rejection_bound(s, v, want, true); });
        }
    for (Index v : {Index{32000}, Index{151936}}) {
        const std::string p = "/V:" + std::to_string(v);
        auto reg = [&](const std::string& name, auto fn) {
            benchmark::RegisterBenchmark(name.c_str(), fn)->Unit(benchmark::kNanosecond);
        };
        reg("BM_pass" + p + "/check:1", [v](benchmark::State& s) { bm_pass(s, v, true); });
        reg("BM_pass" + p + "/check:0", [v](benchmark::State& s) { bm_pass(s, v, false); });
        reg("BM_proposals" + p + "/group:1", [v](benchmark::State& s) { bm_proposals<1>(s, v); });
        reg("BM_proposals" + p + "/group:4", [v](benchmark::State& s) { bm_proposals<4>(s, v); });
        reg("BM_proposals" + p + "/group:8", [v](benchmark::State& s) { bm_proposals<8>(s, v); });
    }
    for (Index v : {Index{32000}, Index{151936}})
        for (filter_kind f : {filter_kind::plain, filter_kind::topp09, filter_kind::masked}) {
            const std::string p = std::string("/") + (f == filter_kind::plain    ? "plain"
                                                      : f == filter_kind::topp09 ? "topp0.9"
                                                                                 : "masked");
            auto reg = [&](const std::string& name, auto fn) {
                benchmark::RegisterBenchmark(name.c_str(), [v, f, fn](benchmark::State& s) { fn(s, v, f); })
                    ->Args({v, 1})
                    ->ArgNames({"V", "T"})
                    ->Unit(benchmark::kMicrosecond);
            };
            reg("BM_sample" + p, bm_sample);
            reg("BM_sample_weights" + p, bm_sample_weights);
            reg("BM_sample_naive" + p, bm_sample_naive);
            reg("BM_sample_bound" + p, bm_sample_bound);
            reg("BM_sample_bound_write" + p, bm_sample_bound_write);
        }
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
    // Serve every allocation up to 32 MiB from the heap and never trim it: glibc's default moves
    // its mmap threshold with the history of frees, so the naive baseline's fresh vectors would
    // cost page faults in some benchmarks and not in others, depending on what ran before. With
    // this, fresh allocations are cheap and their cost reproducible (the naive side's best case).
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 256 * 1024 * 1024);
#endif
    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
