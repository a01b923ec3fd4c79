#pragma once
// A plain, double-precision transcription of Leviathan et al. Alg. 1 used by the tests as a
// second opinion, with deliberately wrong variants as negative controls for the statistical
// tests: if the goodness-of-fit test cannot tell these apart from the target distribution,
// it has no power and its passes mean nothing.

#include <random>
#include <vector>

#include "markov.hpp"

namespace specdec_test {

enum class variant {
    correct,           // Alg. 1 as published
    resample_from_p,   // WRONG: after a rejection, sample from p instead of norm(max(0, p - q))
    no_ratio_test,     // WRONG: accept every draft token without the min(1, p/q) test
    block_correct,                // Sun et al. 2024 block verification as published
    block_unweighted_residual,    // WRONG: block acceptance, but residual max(0, p - q) without w_tau
    block_first_failure,          // WRONG: tau = last i before the first eta_i >= h_i, not the last success
};

inline bool is_block(variant v) {
    return v == variant::block_correct || v == variant::block_unweighted_residual || v == variant::block_first_failure;
}

inline std::size_t sample_ref(const std::vector<double>& w, double u) {
    double total = 0.0;
    for (double x : w) total += x;
    double acc = 0.0;
    std::size_t last = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
        if (w[i] <= 0.0) continue;
        acc += w[i];
        last = i;
        if (acc > u * total) return i;
    }
    return last;
}

/// Generates `length` tokens after `prompt` with speculative decoding in the given variant.
inline std::vector<token_id> reference_decode(variant v, markov_model& draft, markov_model& target,
                                              const std::vector<token_id>& prompt, std::size_t length,
                                              std::size_t gamma, const specdec::sampling_config& s,
                                              std::mt19937_64& rng) {
    std::vector<token_id> seq = prompt;
    while (seq.size() < prompt.size() + length) {
        const std::size_t g = std::min(gamma, prompt.size() + length - seq.size() - 1);
        std::vector<std::vector<double>> q;
        std::vector<token_id> x;
        std::vector<token_id> ctx = seq;
        for (std::size_t i = 0; i < g; ++i) {
            q.push_back(ref_standardize(draft.next_logits(ctx), s));
            x.push_back(static_cast<token_id>(sample_ref(q.back(), specdec::uniform01(rng))));
            ctx.push_back(x.back());
        }
        // Target distributions p_1..p_{g+1} along the draft.
        std::vector<std::vector<double>> ps;
        ctx = seq;
        for (std::size_t i = 0; i <= g; ++i) {
            ps.push_back(ref_standardize(target.next_logits(ctx), s));
            if (i < g) ctx.push_back(x[i]);
        }
        std::size_t n = 0;
        double weight = 1.0;  // scale of p in the residual
        if (is_block(v)) {
            std::vector<double> eta(g);
            for (auto& e : eta) e = specdec::uniform01(rng);
            double w = 1.0;
            for (std::size_t i = 0; i < g; ++i) {
                const auto xi = static_cast<std::size_t>(x[i]);
                const double w_prev = w;
                w = std::min(1.0, w * ps[i][xi] / q[i][xi]);
                double h;
                if (i + 1 < g) {
                    double big_r = 0.0;
                    for (std::size_t k = 0; k < ps[i + 1].size(); ++k) big_r += std::max(0.0, w * ps[i + 1][k] - q[i + 1][k]);
                    h = big_r > 0.0 ? big_r / (big_r + 1.0 - w) : 0.0;
                } else {
                    h = std::min(1.0, w_prev * ps[i][xi] / q[i][xi]);
                }
                if (eta[i] < h) {
                    n = i + 1;
                    weight = v == variant::block_unweighted_residual ? 1.0 : w;
                } else if (v == variant::block_first_failure) {
                    break;
                }
            }
        } else {
            for (; n < g; ++n) {
                const auto xi = static_cast<std::size_t>(x[n]);
                const double r = specdec::uniform01(rng);
                if (!(v == variant::no_ratio_test || r * q[n][xi] < ps[n][xi])) break;
            }
        }
        const bool rejected = n < g;
        seq.insert(seq.end(), x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
        const std::vector<double>& p = ps[n];
        std::vector<double> w = p;
        if (rejected && v != variant::resample_from_p) {
            double mass = 0.0;
            for (std::size_t k = 0; k < w.size(); ++k) {
                w[k] = std::max(0.0, weight * p[k] - q[n][k]);
                mass += w[k];
            }
            if (mass <= 1e-12) w = p;
        }
        seq.push_back(static_cast<token_id>(sample_ref(w, specdec::uniform01(rng))));
    }
    seq.resize(prompt.size() + length);
    return {seq.begin() + static_cast<std::ptrdiff_t>(prompt.size()), seq.end()};
}

}  // namespace specdec_test
