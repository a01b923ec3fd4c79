#pragma once
/// \file
/// Adapters that let a plain LanguageModel serve as a BlockDrafter (model_drafter) and
/// as a BatchVerifier (model_verifier).

#include <Eigen/Core>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "concepts.hpp"
#include "detail/reshape.hpp"
#include "error.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "types.hpp"

namespace specdec {

namespace detail {

/// Calls m.next_logits(context) and checks that it holds vocab logits. An error names `where`
/// (the call the user made) and `role` ("the draft model's ", "the target model's " or "").
template <LanguageModel M>
void checked_next_logits(M& m, std::span<const token_id> context, Eigen::Index vocab, Eigen::VectorXf& out,
                         const char* where, const char* role = "") {
    out = m.next_logits(context);
    if (out.size() != vocab)
        fail_invalid(where, ": ", role, "next_logits returned ", out.size(), " logits; the model's vocab_size() is ",
                     vocab);
}

/// The error of standardizing a draft model's logits (NaN, +Inf, every logit -Inf), with the
/// model named: "...: logit 2 is NaN (in the draft model's logits)".
[[noreturn]] inline void fail_draft_logits(const std::invalid_argument& e) {
    fail_invalid(e.what(), " (in the draft model's logits)");
}

/// A non-owning, type-erased reference to a plain LanguageModel (compiled mode: the decoding
/// loops are compiled once, in the library's source file, for model_ref, and a caller's plain
/// models reach them through it; see speculative_decode). It forwards vocab_size() and
/// next_logits() to the model it refers to, unchanged: the loop makes the same calls and gets
/// the same values as with the model itself. It must not outlive that model.
class model_ref {
public:
    template <LanguageModel M>
        requires(!std::same_as<std::remove_cv_t<M>, model_ref>)
    explicit model_ref(M& m) noexcept
        : model_(const_cast<void*>(static_cast<const void*>(&m))),
          vocab_([](void* p) { return static_cast<std::ptrdiff_t>(static_cast<M*>(p)->vocab_size()); }),
          next_([](void* p, std::span<const token_id> context, Eigen::VectorXf& out) {
              out = static_cast<M*>(p)->next_logits(context);
          }) {}

    [[nodiscard]] std::ptrdiff_t vocab_size() const { return vocab_(model_); }
    /// The model's logits (checked_next_logits writes them into the caller's vector instead).
    [[nodiscard]] Eigen::VectorXf next_logits(std::span<const token_id> context) const {
        Eigen::VectorXf out;
        next_(model_, context, out);
        return out;
    }
    /// The model's logits, assigned to `out` (no copy beyond what the model's own return costs).
    void next_logits_into(std::span<const token_id> context, Eigen::VectorXf& out) const { next_(model_, context, out); }

private:
    void* model_;
    std::ptrdiff_t (*vocab_)(void*);
    void (*next_)(void*, std::span<const token_id>, Eigen::VectorXf&);
};

/// checked_next_logits of a model_ref: the model's logits go straight into `out`.
inline void checked_next_logits(model_ref& m, std::span<const token_id> context, Eigen::Index vocab,
                                Eigen::VectorXf& out, const char* where, const char* role = "") {
    m.next_logits_into(context, out);
    if (out.size() != vocab)
        fail_invalid(where, ": ", role, "next_logits returned ", out.size(), " logits; the model's vocab_size() is ",
                     vocab);
}

/// Alg. 1, first loop: sample x_1..x_γ autoregressively from the standardized draft
/// distributions q_i, which are kept for verification as weights in out.probs and factors in
/// out.scales (q_i = out.scales[i] · out.probs.col(i)).
template <LanguageModel M>
void draft_from_model(M& m, std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
                      uniform_source& uniforms, draft_block& out, std::vector<token_id>& scratch,
                      Eigen::VectorXf& logits, sampling_workspace& sws,
                      const char* where = "specdec::model_drafter::draft") {
    const auto vocab = static_cast<Eigen::Index>(m.vocab_size());
    out.clear();  // (standardized stays false until every column is written)
    out.model_calls = 0;  // reported: one per next_logits call
    if (gamma > static_cast<std::size_t>(std::numeric_limits<Eigen::Index>::max() / std::max<Eigen::Index>(vocab, 1)))
        fail_invalid(where, ": gamma = ", gamma, " draft columns of vocab_size = ", vocab,
                     " entries are more than an Eigen::Index can count");
    out.resize_probs(vocab, static_cast<Eigen::Index>(gamma));
    scratch.assign(context.begin(), context.end());
    for (std::size_t i = 0; i < gamma; ++i) {
        checked_next_logits(m, std::span<const token_id>(scratch), vocab, logits, where, "the draft model's ");
        ++*out.model_calls;
        // Weights and their scale, q_i = scale · column i: no pass normalizes the column.
        auto q = out.probs.col(static_cast<Eigen::Index>(i));
        token_draw d;
        try {
            d = standardize_weights_and_sample(logits, sampling, q, uniforms(), sws, where);
        } catch (const std::invalid_argument& e) {
            fail_draft_logits(e);
        }
        const token_id x = d.token;
        out.scales.push_back(d.scale);
        out.tokens.push_back(x);
        scratch.push_back(x);
        // The draft-side stop (draft_block::stop_below): it reads q_i(x_i) only, a draft value.
        // The columns after it stay unused (see draft_block::stop_below).
        if (static_cast<double>(d.scale) * static_cast<double>(q[x]) < static_cast<double>(out.stop_below)) break;
    }
    out.standardized = true;
}

/// Scores context + draft with γ+1 calls of next_logits (for models without score()).
template <LanguageModel M>
void score_with_model(M& m, std::span<const token_id> context, std::span<const token_id> draft, Eigen::MatrixXf& out,
                      std::vector<token_id>& scratch, Eigen::VectorXf& logits,
                      const char* where = "specdec::model_verifier::score") {
    const auto vocab = static_cast<Eigen::Index>(m.vocab_size());
    reshape(out, vocab, static_cast<Eigen::Index>(draft.size() + 1));
    scratch.assign(context.begin(), context.end());
    for (std::size_t j = 0; j <= draft.size(); ++j) {
        checked_next_logits(m, std::span<const token_id>(scratch), vocab, logits, where, "the target model's ");
        out.col(static_cast<Eigen::Index>(j)) = logits;
        if (j < draft.size()) scratch.push_back(draft[j]);
    }
}

}  // namespace detail

/// Makes a plain LanguageModel a BlockDrafter: draft() calls next_logits γ times,
/// standardizes each result with the sampling settings and samples from it, returning the
/// tokens with their distributions. Holds a reference to the model (which must outlive it).
template <LanguageModel M>
class model_drafter {
public:
    /// Wraps `model`, held by reference (it must outlive the drafter).
    explicit model_drafter(M& model) noexcept : model_(&model) {}

    /// The model's vocabulary size.
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(model_->vocab_size()); }

    /// Samples `gamma` draft tokens after `context` (see BlockDrafter).
    void draft(std::span<const token_id> context, std::size_t gamma, const sampling_config& sampling,
               uniform_source& uniforms, draft_block& out) {
        detail::draft_from_model(*model_, context, gamma, sampling, uniforms, out, context_, logits_, sampling_ws_);
    }

private:
    M* model_;
    std::vector<token_id> context_;
    Eigen::VectorXf logits_;
    sampling_workspace sampling_ws_;
};

/// Makes a plain LanguageModel a BatchVerifier. score() forwards to the model's own
/// batched score() when it has one, and otherwise calls next_logits once per position
/// (γ+1 calls). Holds a reference to the model.
template <LanguageModel M>
class model_verifier {
public:
    /// Wraps `model`, held by reference (it must outlive the verifier).
    explicit model_verifier(M& model) noexcept : model_(&model) {}

    /// The model's vocabulary size.
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return static_cast<std::ptrdiff_t>(model_->vocab_size()); }

    /// Number of model calls one score() of a draft of length n costs: n + 1 next_logits calls
    /// for a plain model; for a model with its own score(), what that model says (its own
    /// calls_per_score(n), else 1).
    [[nodiscard]] std::size_t calls_per_score(std::size_t n) const {
        if constexpr (BatchVerifier<M>)
            return detail::score_calls(*model_, n);
        else
            return n + 1;
    }

    /// Logits of all positions: vocab_size() x (draft.size() + 1), column j after context + draft[0..j).
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        Eigen::MatrixXf out;
        score_into(context, draft, out);
        return out;
    }

    /// As score(), writing into `out` (reusing its storage).
    void score_into(std::span<const token_id> context, std::span<const token_id> draft, Eigen::MatrixXf& out) {
        if constexpr (BatchVerifier<M>) {
            out = model_->score(context, draft);
        } else {
            detail::score_with_model(*model_, context, draft, out, context_, logits_);
        }
    }

private:
    M* model_;
    std::vector<token_id> context_;
    Eigen::VectorXf logits_;
};

}  // namespace specdec
