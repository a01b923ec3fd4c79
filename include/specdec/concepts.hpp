#pragma once
/// \file
/// What a model must provide to take part in speculative decoding.
///
/// Three small interfaces, and the two concepts the algorithms are constrained on:
///
/// | concept          | member functions it needs                                      |
/// |------------------|----------------------------------------------------------------|
/// | LanguageModel    | `vocab_size()`, `next_logits(context)`                         |
/// | BatchVerifier    | `vocab_size()`, `score(context, draft)`                        |
/// | BlockDrafter     | `vocab_size()`, `draft(context, gamma, sampling, uniforms, out)` |
/// | **Drafter**      | BlockDrafter, or a plain LanguageModel                         |
/// | **Verifier**     | BatchVerifier, or a plain LanguageModel                        |
///
/// A plain LanguageModel therefore works as draft and as target without further code;
/// `model_drafter` and `model_verifier` (in adapters.hpp) are the adapters that make it so.
/// Models that serve many sequences in one pass (MultiSequenceVerifier, MultiSequenceDrafter)
/// are in multi_sequence.hpp.
///
/// When an argument misses a requirement, the entry points (speculative_decode,
/// autoregressive_decode, speculative_step, speculative_step_batch) report which one and the
/// fix in a static_assert message (see diagnostics.hpp), e.g. "next_logits must return an
/// Eigen vector of float ...; got std::vector" or "the model is const: ...".

#include <Eigen/Core>

#include <concepts>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "error.hpp"
#include "detail/reshape.hpp"
#include "random.hpp"
#include "types.hpp"

namespace specdec {

namespace detail {

/// The column storage of draft_block and draft_tree: `probs` (vocab rows, one column per draft
/// token or node, or 0 columns for point masses) and the storage clear() keeps, which
/// resize_probs() takes back when the shape repeats, so drafting allocates nothing after warm-up.
class draft_columns {
public:
    /// The draft distributions (see draft_block::probs and draft_tree::probs).
    Eigen::MatrixXf probs;

    /// True when the draft carries its distributions.
    [[nodiscard]] bool has_distributions() const noexcept { return probs.cols() != 0; }

    /// Sizes probs to rows x cols for the drafter to fill (contents unspecified), taking back
    /// the storage that clear() kept when it has that size: no allocation once the shape repeats.
    /// \throws std::invalid_argument for a negative size, or more entries than an Eigen::Index
    ///         can count (a huge gamma); std::bad_alloc when memory runs out.
    Eigen::MatrixXf& resize_probs(Eigen::Index rows, Eigen::Index cols) {
        if (rows < 0 || cols < 0 || (cols > 0 && rows > std::numeric_limits<Eigen::Index>::max() / cols))
            fail_invalid("specdec::resize_probs: ", rows, " x ", cols,
                         " is not a valid size (negative, or more entries than an Eigen::Index can count)");
        if (probs.size() != rows * cols && kept_.size() == rows * cols) probs.swap(kept_);
        reshape(probs, rows, cols);
        return probs;
    }

protected:
    /// Empties probs (0 columns), keeping its storage for resize_probs().
    void clear_columns() {
        if (probs.size() != 0) probs.swap(kept_);
        probs.resize(0, 0);
    }

private:
    Eigen::MatrixXf kept_;  // the storage of the last columns clear() removed
};

}  // namespace detail

/// A block of draft tokens and, optionally, the draft distributions they were sampled from.
struct draft_block : detail::draft_columns {
    /// The proposed tokens x_1..x_n (n <= the gamma asked for; n may be 0).
    std::vector<token_id> tokens;
    /// Draft distributions: vocab_size() rows, tokens.size() columns; column i is q_i, the
    /// distribution x_i was sampled from (non-negative, summing to 1). Leave it with 0
    /// columns for point-mass drafts (a deterministic drafter such as an n-gram table or
    /// prompt lookup): then q_i is the point mass at x_i, the acceptance probability is
    /// p_i(x_i), and the residual is p_i with x_i removed. speculative_step() hands the block
    /// to draft() with no tokens and 0 columns (clear()); size it with resize_probs(), which
    /// reuses the storage of an earlier step's columns, so that drafting allocates nothing
    /// after warm-up. (Declared in detail::draft_columns.)
    using detail::draft_columns::probs;
    /// Optional factors of the columns of probs: empty, or one per column, each finite and
    /// positive; then q_i = scales[i] · probs.col(i), and probs may hold weights that do not sum
    /// to 1 (such as the exponentials of standardize_weights_and_sample, which saves the pass
    /// that normalizes them). speculative_step() empties it before each draft() call.
    std::vector<float> scales;
    /// True when every column of probs (with its scale) was written by standardize() or one
    /// of its sampling variants (standardize_and_sample, standardize_weights_and_sample) from
    /// the drafter's logits, as model_drafter's and fallback_drafter's model columns are. Such
    /// columns are distributions by construction, so speculative_step() does not check them
    /// (verify_options::check_draft_distributions), which saves a pass over each tested
    /// column. A drafter that sets it for columns of its own gives up that check: columns
    /// that are not distributions then make the output inexact without an error.
    /// speculative_step() resets it to false before each draft() call.
    bool standardized = false;
    /// How many forward passes of a draft model this block cost, for
    /// decode_stats::draft_calls: assign it (`out.model_calls = n`; 0 for a drafter without a
    /// model, such as a table lookup) to report the drafter's real cost. Left unset
    /// (std::nullopt, as clear() leaves it), the step counts one draft call when the block
    /// proposed tokens and none when it is empty: right for a drafter that makes one (batched)
    /// model call per block, an undercount for one that calls its model once per token
    /// (model_drafter reports one call per token it drafted).
    std::optional<std::size_t> model_calls;
    /// An input, not an output: set by speculative_step() before draft() (from
    /// decode_options::draft.stop_below; 0 turns it off). A drafter may end the block after
    /// the first token x_i whose draft probability q_i(x_i) is below it, sparing the draft
    /// calls that would follow (model_drafter does); such a block may keep the columns of
    /// probs it sized beyond its tokens, which are ignored. The step ends the block there in
    /// any case. Exact: where the block ends depends on draft values only. clear() leaves it
    /// as it is.
    float stop_below = 0.0f;

    /// An empty block: no tokens, probs with 0 columns (point masses), no scales, not
    /// standardized, model calls not reported. The storage of probs is kept for resize_probs().
    void clear() {
        tokens.clear();
        clear_columns();
        scales.clear();
        standardized = false;
        model_calls.reset();
    }
};

/// A plain autoregressive language model.
///
/// Syntactic requirements: `m.vocab_size()` (convertible to std::ptrdiff_t) and
/// `m.next_logits(context)` for a `std::span<const token_id>` context, returning something
/// convertible to `Eigen::VectorXf`: an Eigen vector or expression, or an `Eigen::Map` over
/// the engine's buffer (a `std::vector<float>` is not; map its data).
///
/// Semantic requirements (not checked by the compiler):
///  1. `context` is the whole sequence so far (prompt first); the result holds
///     vocab_size() logits of the token that follows it. A model with a KV cache may keep
///     state between calls, but the result must depend on `context` alone, since the
///     algorithm rolls back by passing a shorter context.
///  2. Logits are finite or -Inf (an impossible token), never NaN or +Inf, and not all -Inf.
///  3. No hidden randomness: a model is a deterministic function of its context.
template <class M>
concept LanguageModel = requires(M& m, std::span<const token_id> context) {
    { m.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    { m.next_logits(context) } -> std::convertible_to<Eigen::VectorXf>;
};

/// A target model that scores a whole draft in one batched pass (Leviathan et al. 2023,
/// Alg. 1, "run M_p in parallel").
///
/// Syntactic requirements: `v.vocab_size()` and `v.score(context, draft)` for two
/// `std::span<const token_id>`, returning something convertible to `Eigen::MatrixXf`.
///
/// Semantic requirements:
///  1. The result has vocab_size() rows and draft.size() + 1 columns; column j holds the
///     logits of the token that follows context + draft[0..j). Columns are contiguous in
///     a column-major Eigen::MatrixXf, which is what verification reads.
///  2. Each column equals what next_logits would return for that prefix (the same
///     requirements on the values as LanguageModel).
///  3. No hidden randomness.
///
/// Optional: `v.calls_per_score(n)`, convertible to std::size_t, the number of target forward
/// passes one score() of n draft tokens costs (as model_verifier over a plain model says:
/// n + 1). decode_stats::target_calls counts that many per step; without it, one.
template <class V>
concept BatchVerifier = requires(V& v, std::span<const token_id> context, std::span<const token_id> draft) {
    { v.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    { v.score(context, draft) } -> std::convertible_to<Eigen::MatrixXf>;
};

/// A BatchVerifier that can also write its scores into a caller's matrix,
/// `v.score_into(context, draft, out)` (same contents as score()). When a verifier has it,
/// speculative decoding uses it, so a step needs no allocation for the scores.
template <class V>
concept InPlaceBatchVerifier =
    BatchVerifier<V> && requires(V& v, std::span<const token_id> context, std::span<const token_id> draft,
                                 Eigen::MatrixXf& out) { v.score_into(context, draft, out); };

/// A drafter that proposes a whole block at once.
///
/// Syntactic requirements: `d.vocab_size()` and
/// `d.draft(context, gamma, sampling, uniforms, out)` with a `std::span<const token_id>`
/// context, a `std::size_t` gamma, a `const sampling_config&`, a `uniform_source&` and a
/// `draft_block&` to fill.
///
/// Semantic requirements:
///  1. It writes at most `gamma` tokens into `out.tokens`, each in [0, vocab_size()).
///  2. Either `out.probs` has vocab_size() rows and one column per token, column i the
///     distribution q_i that token i was actually sampled from, given context and the
///     earlier draft tokens (or, with `out.scales`, q_i = out.scales[i] · column i); or
///     `out.probs` has 0 columns and the tokens are a deterministic function of the context
///     (point-mass drafts). Columns are checked to be distributions unless `out.standardized`
///     says that standardize() or one of its sampling variants wrote them.
///  3. No hidden randomness: every random draw comes from `uniforms`, which reads the
///     caller's generator. Output is exact whatever q is, as long as 2 holds; q only
///     decides how many tokens are accepted.
///  `out` arrives empty (draft_block::clear(): speculative_step() clears it before each
///  call), so a drafter that writes only tokens proposes point masses; size the columns with
///  `out.resize_probs(rows, cols)`, which reuses the last step's storage (a plain
///  `out.probs.resize` allocates on every call).
///  4. To make q as close to p as possible, apply `sampling` as the target does
///     (see standardize()); a drafter may ignore it, at the cost of acceptance. (The step
///     passes decode_options::draft.sampling when it is set, the target's settings otherwise.)
///  5. For statistics, `out.model_calls` may report the draft model's forward passes; left
///     unset, each draft() that proposed tokens counts as one draft call
///     (decode_stats::draft_calls).
template <class D>
concept BlockDrafter = requires(D& d, std::span<const token_id> context, std::size_t gamma,
                                const sampling_config& sampling, uniform_source& uniforms, draft_block& out) {
    { d.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    d.draft(context, gamma, sampling, uniforms, out);
};

/// Anything speculative decoding can draft with: a BlockDrafter, or a plain LanguageModel
/// (then γ tokens are sampled autoregressively from its standardized distributions,
/// Leviathan et al. Alg. 1, first loop). A type that is both is used as a BlockDrafter.
template <class D>
concept Drafter = BlockDrafter<D> || LanguageModel<D>;

/// Anything speculative decoding can verify with: a BatchVerifier, or a plain
/// LanguageModel (then next_logits is called once per position). A type that is both is
/// used through its batched score().
template <class V>
concept Verifier = BatchVerifier<V> || LanguageModel<V>;

namespace detail {

/// Target forward passes behind one scoring of n draft tokens, for decode_stats::target_calls:
/// a plain model is called n + 1 times; a BatchVerifier once, unless it says otherwise with
/// `calls_per_score(n)` (as model_verifier does when it wraps a plain model).
template <Verifier V>
std::size_t score_calls(V& verifier, std::size_t n) {
    if constexpr (BatchVerifier<V>) {
        if constexpr (requires { { verifier.calls_per_score(n) } -> std::convertible_to<std::size_t>; })
            return static_cast<std::size_t>(verifier.calls_per_score(n));
        return 1;
    } else {
        return n + 1;
    }
}

}  // namespace detail

}  // namespace specdec
