#pragma once
// The adapters of the conformance kit's own tests (tests/statistical/conformance_*_test.cpp):
// a cached model with the bugs real adapters have, drafters that misreport what they draw, tree
// models, and the small options the tests run with.

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/skip.hpp"
#include "char_ngram_model.hpp"
#include "llama2/checkpoint.hpp"
#include "llama2/context_limit.hpp"
#include "llama2/transformer.hpp"
#include <specdec/specdec.hpp>
#include <specdec/testing.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace specdec_test::conformance {

using specdec::token_id;
namespace kit = specdec::testing;

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/// What is wrong with a cached_model.
enum class bug { none, ignores_rollback, shifted_scores, shared_cache, reduced_precision };

/// A model whose logits depend on every token of the context (like a transformer), computed
/// through a per-position state cache (like a KV cache): state_i = hash(state_{i-1}, token_i),
/// logits = a fixed random function of the last state. Optionally with one of the bugs of real
/// adapters.
class cached_model {
public:
    cached_model(int vocab, std::uint64_t seed, bug b = bug::none)
        : vocab_(vocab), seed_(seed), bug_(b), states_(std::make_shared<std::vector<std::uint64_t>>()) {}
    cached_model(const cached_model& other)
        : vocab_(other.vocab_), seed_(other.seed_), bug_(other.bug_), tokens_(other.tokens_),
          // The shared-cache bug: a copy keeps its own token list but shares the state buffer.
          states_(other.bug_ == bug::shared_cache ? other.states_
                                                  : std::make_shared<std::vector<std::uint64_t>>(*other.states_)) {}
    cached_model& operator=(const cached_model&) = delete;

    std::ptrdiff_t vocab_size() const { return vocab_; }

    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        advance(context, {});
        return logits_at(context.size());
    }

    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        advance(context, draft);
        Eigen::MatrixXf out(vocab_, static_cast<Eigen::Index>(draft.size() + 1));
        for (std::size_t j = 0; j <= draft.size(); ++j) {
            // The off-by-one of slicing the scores one position early.
            const std::size_t n = context.size() + j - (bug_ == bug::shifted_scores && context.size() + j > 1 ? 1 : 0);
            out.col(static_cast<Eigen::Index>(j)) = logits_at(n);
            if (bug_ == bug::reduced_precision)  // not a bug: a batched pass in bf16, relative 4e-3 per logit
                for (Eigen::Index k = 0; k < out.rows(); ++k)
                    out(k, static_cast<Eigen::Index>(j)) *=
                        1.0f + 4e-3f * (static_cast<float>(mix(n * 131 + static_cast<std::size_t>(k)) >> 40) * 0x1.0p-23f - 1.0f);
        }
        return out;
    }

private:
    /// Brings the cache to context + draft: keep the longest common prefix, compute the rest.
    void advance(std::span<const token_id> context, std::span<const token_id> draft) {
        std::vector<token_id> seq(context.begin(), context.end());
        seq.insert(seq.end(), draft.begin(), draft.end());
        std::size_t keep = 0;
        if (bug_ == bug::ignores_rollback) {
            // The bug: trusts that the cache holds a prefix of the new sequence.
            keep = std::min(tokens_.size(), seq.size());
        } else {
            while (keep < tokens_.size() && keep < seq.size() && tokens_[keep] == seq[keep]) ++keep;
        }
        auto& st = *states_;
        st.resize(std::max(st.size(), seq.size() + 1));
        if (keep == 0) st[0] = seed_;
        for (std::size_t i = keep; i < seq.size(); ++i)
            st[i + 1] = mix(st[i] ^ (static_cast<std::uint64_t>(seq[i]) + 1) * 0x2545f4914f6cdd1dULL);
        tokens_ = seq;
    }

    Eigen::VectorXf logits_at(std::size_t n) const {
        // Reads the states of every position up to n, as attention reads every cached key and
        // value: a stale entry anywhere changes the logits.
        std::uint64_t s = 0;
        for (std::size_t i = 0; i <= n; ++i) s += (*states_)[i] * (2 * i + 1);
        s = mix(s);
        Eigen::VectorXf z(vocab_);
        for (int k = 0; k < vocab_; ++k)
            z[k] = static_cast<float>(static_cast<double>(mix(s + static_cast<std::uint64_t>(k)) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
        return z;
    }

    int vocab_;
    std::uint64_t seed_;
    bug bug_;
    std::vector<token_id> tokens_;
    std::shared_ptr<std::vector<std::uint64_t>> states_;
};

/// The loop the broken drafters below share: for each of `gamma` positions, the model's logits
/// after the context and the tokens drafted so far, and `pick(i, z, column i of q)`, which writes
/// the reported q into the column and returns the drafted token.
template <class Pick>
void draft_positions(specdec_test::markov_model& model, std::span<const token_id> context, std::size_t gamma,
                     specdec::draft_block& out, Pick&& pick) {
    std::vector<token_id> seq(context.begin(), context.end());
    auto& q = out.resize_probs(model.vocab, static_cast<Eigen::Index>(gamma));
    for (std::size_t i = 0; i < gamma; ++i) {
        const Eigen::VectorXf z = model.next_logits(seq);
        const token_id x = pick(i, z, q.col(static_cast<Eigen::Index>(i)));
        out.tokens.push_back(x);
        seq.push_back(x);
    }
}

/// A drafter that applies the temperature twice to the logits it samples from (T^2), and once to
/// the distributions it reports: "the draft distribution is not the one the tokens were drawn
/// from". Harmless at temperature 1, wrong at any other.
struct tempered_drafter {
    specdec_test::markov_model* model;
    specdec::sampling_workspace ws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        Eigen::VectorXf sampled(model->vocab);
        specdec::sampling_config hot = s;
        hot.temperature = s.temperature * s.temperature;
        draft_positions(*model, context, gamma, out, [&](std::size_t, const Eigen::VectorXf& z, auto col) {
            specdec::standardize(z, s, col, ws);
            return static_cast<token_id>(specdec::standardize_and_sample(z, hot, sampled, u(), ws));
        });
    }
};

/// A drafter that reports the distribution of the previous position for each token: the
/// columns are shifted against the tokens.
struct shifted_columns_drafter {
    specdec_test::markov_model* model;
    specdec::sampling_workspace ws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        Eigen::VectorXf p(model->vocab), prev(model->vocab);
        draft_positions(*model, context, gamma, out, [&](std::size_t i, const Eigen::VectorXf& z, auto col) {
            const auto x = static_cast<token_id>(specdec::standardize_and_sample(z, s, p, u(), ws));
            col = i == 0 ? p : prev;
            prev = p;
            return x;
        });
    }
};

/// A drafter that draws one uniform per block and samples every position of the block with it
/// (the inverse CDF at the same u): the positions are not drawn independently given their
/// contexts. With a context-free model every position repeats the first token, and each
/// position alone still follows its reported q.
struct same_uniform_drafter {
    specdec_test::markov_model* model;
    specdec::sampling_workspace ws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        const double once = u();
        draft_positions(*model, context, gamma, out, [&](std::size_t, const Eigen::VectorXf& z, auto col) {
            return static_cast<token_id>(specdec::standardize_and_sample(z, s, col, once, ws));
        });
    }
};

/// A drafter that takes the most likely token wherever its model is confident (q of the top
/// token at least 0.8) and samples elsewhere, reporting q in both cases: wrong only where the
/// draft is confident, which random contexts rarely reach.
struct confident_greedy_drafter {
    specdec_test::markov_model* model;
    specdec::sampling_workspace ws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        draft_positions(*model, context, gamma, out, [&](std::size_t, const Eigen::VectorXf& z, auto col) {
            const auto x = static_cast<token_id>(specdec::standardize_and_sample(z, s, col, u(), ws));
            Eigen::Index top = 0;
            return col.maxCoeff(&top) >= 0.8f ? static_cast<token_id>(top) : x;
        });
    }
};

/// A draft model over 64 tokens that is confident only on its own path: after tokens 0..3 the
/// next token of the cycle 0 -> 1 -> 2 -> 3 -> 0 has logit 6 against 0 for the other 63
/// (q ≈ 0.86); after any other token every logit is 0 (q = 1/64).
inline specdec_test::markov_model confident_on_own_path() {
    auto m = specdec_test::markov_model::random(64, 1, 1);
    std::fill(m.table.begin(), m.table.end(), 0.0f);
    for (int t = 0; t < 4; ++t) m.table[static_cast<std::size_t>(t * 64 + (t + 1) % 4)] = 6.0f;  // q ≈ 0.86
    return m;
}

/// A drafter with hidden randomness: a generator of its own decides how many tokens to propose.
struct own_rng_drafter {
    specdec_test::markov_model* model;
    std::mt19937_64 own{7};  // state that advances from call to call, outside the caller's generator
    specdec::model_drafter<specdec_test::markov_model> inner{*model};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        inner.draft(context, 1 + own() % gamma, s, u, out);
        // The χ² test cannot see this (each block is still drawn from its q); determinism can.
    }
};

/// cached_model as a TreeVerifier: score_tree scores every node after the context and its path,
/// one next_logits call per column. With `mask_bug`, a node is scored after the context and
/// every node before it in index order (a chain's causal mask used for a tree: a node sees its
/// earlier siblings and their subtrees as if they were its ancestors).
class tree_cached_model : public cached_model {
public:
    tree_cached_model(int vocab, std::uint64_t seed, bool mask_bug = false)
        : cached_model(vocab, seed), mask_bug_(mask_bug) {}

    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        out.resize(vocab_size(), static_cast<Eigen::Index>(tree.size() + 1));
        std::vector<token_id> seq(context.begin(), context.end()), path;
        out.col(0) = next_logits(seq);
        for (std::size_t i = 0; i < tree.size(); ++i) {
            if (mask_bug_)
                path.assign(tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(i + 1));
            else
                specdec::path_tokens(tree, static_cast<std::int32_t>(i), path);
            seq.assign(context.begin(), context.end());
            seq.insert(seq.end(), path.begin(), path.end());
            out.col(static_cast<Eigen::Index>(i + 1)) = next_logits(seq);
        }
    }

private:
    bool mask_bug_;
};

/// A target of trees only: T's vocab_size and score_tree, and neither score() nor
/// next_logits() (an engine that only runs tree passes).
template <class T>
struct tree_only {
    T model;
    std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(model.vocab_size()); }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        model.score_tree(context, tree, out);
    }
};
static_assert(specdec::TreeVerifier<tree_only<tree_cached_model>> && !specdec::Verifier<tree_only<tree_cached_model>>);

/// A TreeDrafter of its own (no draft(), no next_logits): trees drawn from a Markov model as
/// specdec::draft_tree_from_model draws them. With `tempered`, the nodes are drawn at
/// temperature T^2 while the columns report the model's distributions at T: "the draft
/// distribution is not the one the nodes were drawn from" (harmless at T = 1).
struct markov_tree_drafter {
    specdec_test::markov_model* model;
    bool tempered = false;
    std::vector<token_id> path{};
    Eigen::VectorXf logits{}, q{}, scratch{};
    specdec::sampling_workspace ws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void propose_tree(std::span<const token_id> context, const specdec::tree_shape& shape,
                      const specdec::sampling_config& s, specdec::uniform_source& u, specdec::draft_tree& out) {
        specdec::sampling_config hot = s;
        if (tempered) hot.temperature = s.temperature * s.temperature;
        specdec::draft_tree_from_model(*model, context, shape, hot, u, out, path, logits, q, scratch, ws);
        if (!tempered) return;
        for (std::size_t i = 0; i < out.size(); ++i) {
            specdec::path_tokens(out, out.parents[i], path);
            path.insert(path.begin(), context.begin(), context.end());
            specdec::standardize(model->next_logits(path), s, q, ws);
            out.probs.col(static_cast<Eigen::Index>(i)) = q;
        }
    }
};
static_assert(specdec::TreeDrafter<markov_tree_drafter> && !specdec::Drafter<markov_tree_drafter>);
static_assert(specdec::TreeVerifier<tree_cached_model> && specdec::Verifier<tree_cached_model>);

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// small_options() with a tree step of 2, 2, 1 (10 nodes).
inline kit::conformance_options small_tree_options(
    specdec::tree_verification_scheme scheme = specdec::tree_verification_scheme::traversal);

/// The options of the small-model tests: V = 5, sequences of 5 tokens (nearly every sequence a
/// cell of its own).
inline kit::conformance_options small_options() {
    return {.prompt = {0, 3}, .gamma = 3, .max_context = 24, .samples = 20000};
}

inline kit::conformance_options small_tree_options(specdec::tree_verification_scheme scheme) {
    auto o = small_options();
    o.decode.step = specdec::tree{.shape = {.branching = {2, 2, 1}}, .scheme = scheme};
    return o;
}

inline std::optional<std::filesystem::path> models_dir() {
    const char* env = std::getenv("SPECDEC_MODELS_DIR");
    if (env == nullptr || *env == '\0') {
        specdec_test::skip("SPECDEC_MODELS_DIR is not set (it must name the folder with stories260K.bin, "
                           "llama2xs_tok512_279K.bin and tok512.bin)");
        return std::nullopt;
    }
    const std::filesystem::path dir(env);
    for (const char* f : {"stories260K.bin", "llama2xs_tok512_279K.bin"})
        if (!std::filesystem::exists(dir / f)) {
            specdec_test::skip((dir / f).string() + " not found (SPECDEC_MODELS_DIR=" + env + ")");
            return std::nullopt;
        }
    return dir;
}

}  // namespace specdec_test::conformance
