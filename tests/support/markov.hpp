#pragma once
// Test doubles: small random Markov language models, drafters without models, adapters
// that throw, and an independent double-precision reference of standardized sampling
// used to compute exact target distributions by enumeration.

#include <specdec/specdec.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

namespace specdec_test {

using specdec::token_id;

/// A language model whose logits depend on the last `order` tokens through a random
/// table (positions before the start of the context read as token 0).
struct markov_model {
    int vocab = 4;
    int order = 2;
    std::vector<float> table;  // vocab^order rows of vocab logits
    std::size_t calls = 0;

    static markov_model random(int vocab, int order, std::uint64_t seed, float scale = 1.5f) {
        markov_model m;
        m.vocab = vocab;
        m.order = order;
        std::mt19937_64 g(seed);
        std::normal_distribution<float> n(0.0f, scale);  // test data only; the library never uses <random> distributions
        std::size_t rows = 1;
        for (int i = 0; i < order; ++i) rows *= static_cast<std::size_t>(vocab);
        m.table.resize(rows * static_cast<std::size_t>(vocab));
        for (auto& x : m.table) x = n(g);
        return m;
    }

    /// Makes token t impossible in every context (logit -Inf).
    void forbid(token_id t) {
        for (std::size_t r = 0; r < table.size(); r += static_cast<std::size_t>(vocab))
            table[r + static_cast<std::size_t>(t)] = -std::numeric_limits<float>::infinity();
    }

    std::size_t row_of(std::span<const token_id> context) const {
        std::size_t row = 0;
        for (int k = order; k >= 1; --k) {
            const auto pos = static_cast<std::ptrdiff_t>(context.size()) - k;
            const token_id t = pos >= 0 ? context[static_cast<std::size_t>(pos)] : 0;
            row = row * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(t);
        }
        return row;
    }

    std::ptrdiff_t vocab_size() const { return vocab; }

    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        ++calls;
        const std::size_t row = row_of(context) * static_cast<std::size_t>(vocab);
        return Eigen::Map<const Eigen::VectorXf>(table.data() + row, vocab);
    }
};

/// The same model behind a batched score() (a BatchVerifier), counting passes.
struct batched_markov {
    markov_model* model;
    std::size_t passes = 0;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        ++passes;
        std::vector<token_id> seq(context.begin(), context.end());
        Eigen::MatrixXf out(model->vocab, static_cast<Eigen::Index>(draft.size() + 1));
        for (std::size_t j = 0; j <= draft.size(); ++j) {
            out.col(static_cast<Eigen::Index>(j)) = model->next_logits(seq);
            if (j < draft.size()) seq.push_back(draft[j]);
        }
        return out;
    }
};

/// A point-mass drafter: proposes (last token + shift) mod V, repeatedly. Deterministic.
struct shift_drafter {
    int vocab = 4;
    int shift = 1;
    std::ptrdiff_t vocab_size() const { return vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config&,
               specdec::uniform_source&, specdec::draft_block& out) const {
        out.tokens.clear();
        out.probs.resize(0, 0);
        token_id last = context.empty() ? 0 : context.back();
        for (std::size_t i = 0; i < gamma; ++i) {
            last = static_cast<token_id>((last + shift) % vocab);
            out.tokens.push_back(last);
        }
    }
};

/// Throws from its n-th call (1-based) of next_logits / score, otherwise forwards.
template <class Inner>
struct throwing_model {
    Inner* inner;
    std::size_t throw_at = 1;
    std::size_t seen = 0;
    std::ptrdiff_t vocab_size() const { return inner->vocab_size(); }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        if (++seen == throw_at) throw std::runtime_error("adapter failure");
        return inner->next_logits(context);
    }
};

// ---- Independent reference of standardized sampling (double precision, full sort). ----

/// Standardized distribution of logits z: temperature, then top-k, top-p, min-p.
inline std::vector<double> ref_standardize(const Eigen::VectorXf& z, const specdec::sampling_config& s) {
    const auto n = static_cast<std::size_t>(z.size());
    std::vector<double> p(n, 0.0);
    std::size_t best = 0;
    for (std::size_t i = 1; i < n; ++i)
        if (z[static_cast<Eigen::Index>(i)] > z[static_cast<Eigen::Index>(best)]) best = i;
    if (s.temperature == 0.0f) {
        p[best] = 1.0;
        return p;
    }
    const double m = z[static_cast<Eigen::Index>(best)];
    for (std::size_t i = 0; i < n; ++i) p[i] = std::exp((z[static_cast<Eigen::Index>(i)] - m) / s.temperature);
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return z[static_cast<Eigen::Index>(a)] > z[static_cast<Eigen::Index>(b)];
    });
    if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < n) {
        const float kth = z[static_cast<Eigen::Index>(order[static_cast<std::size_t>(s.top_k) - 1])];
        for (std::size_t i = 0; i < n; ++i)
            if (z[static_cast<Eigen::Index>(i)] < kth) p[i] = 0.0;
    }
    if (s.top_p < 1.0f) {
        const double total = std::accumulate(p.begin(), p.end(), 0.0);
        double acc = 0.0;
        double threshold = 0.0;
        for (std::size_t i : order) {
            if (p[i] == 0.0) continue;
            acc += p[i];
            threshold = p[i];
            if (acc >= s.top_p * total) break;
        }
        for (double& x : p)
            if (x < threshold) x = 0.0;
    }
    if (s.min_p > 0.0f) {
        for (double& x : p)
            if (x < s.min_p) x = 0.0;  // the maximum weight is exp(0) = 1
    }
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& x : p) x /= total;
    return p;
}

/// Exact probability of every continuation of `prompt` of length `length` when sampling
/// from `model` with settings `s`; index = tokens read as a base-V number, first token most
/// significant.
inline std::vector<double> exact_sequence_distribution(markov_model model, std::vector<token_id> prompt, int length,
                                                       const specdec::sampling_config& s) {
    std::size_t cells = 1;
    for (int i = 0; i < length; ++i) cells *= static_cast<std::size_t>(model.vocab);
    std::vector<double> out(cells, 0.0);
    std::vector<token_id> seq = prompt;
    // Depth-first enumeration.
    auto rec = [&](auto&& self, int depth, std::size_t index, double prob) -> void {
        if (depth == length) {
            out[index] = prob;
            return;
        }
        const auto p = ref_standardize(model.next_logits(seq), s);
        for (int t = 0; t < model.vocab; ++t) {
            if (p[static_cast<std::size_t>(t)] == 0.0) continue;
            seq.push_back(t);
            self(self, depth + 1, index * static_cast<std::size_t>(model.vocab) + static_cast<std::size_t>(t),
                 prob * p[static_cast<std::size_t>(t)]);
            seq.pop_back();
        }
    };
    rec(rec, 0, 0, 1.0);
    return out;
}

/// Exact probability of every value of the last `window` tokens of a continuation of `prompt`
/// of length `length` (window <= length) when sampling from `model` with settings `s`; index as
/// exact_sequence_distribution's. A forward pass over the model's states (its last `order`
/// tokens, token 0 before the start of the context, as row_of reads them) up to the window,
/// then enumeration of the window from each state.
inline std::vector<double> exact_window_distribution(markov_model model, const std::vector<token_id>& prompt,
                                                     int length, int window, const specdec::sampling_config& s) {
    if (model.order < 1 || window < 0 || window > length) throw std::invalid_argument("exact_window_distribution");
    const auto order = static_cast<std::size_t>(model.order);
    const auto state_of = [&](std::span<const token_id> context) {
        std::vector<token_id> st(order, 0);
        for (std::size_t k = 1; k <= order && k <= context.size(); ++k) st[order - k] = context[context.size() - k];
        return st;
    };
    std::map<std::vector<token_id>, double> states{{state_of(prompt), 1.0}};
    for (int step = 0; step < length - window; ++step) {
        std::map<std::vector<token_id>, double> next;
        for (const auto& [st, prob] : states) {
            const auto p = ref_standardize(model.next_logits(st), s);
            for (int t = 0; t < model.vocab; ++t) {
                if (p[static_cast<std::size_t>(t)] == 0.0) continue;
                std::vector<token_id> to(st.begin() + 1, st.end());
                to.push_back(t);
                next[to] += prob * p[static_cast<std::size_t>(t)];
            }
        }
        states = std::move(next);
    }
    std::vector<double> out;
    for (const auto& [st, prob] : states) {
        const auto part = exact_sequence_distribution(model, st, window, s);
        if (out.empty()) out.assign(part.size(), 0.0);
        for (std::size_t i = 0; i < part.size(); ++i) out[i] += prob * part[i];
    }
    return out;
}

}  // namespace specdec_test
