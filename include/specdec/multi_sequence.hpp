#pragma once
/// \file
/// Models that serve many sequences in one forward pass, as serving engines run them: the
/// MultiSequenceVerifier scores the contexts and (ragged) drafts of B sequences in one target
/// pass, streaming the weights once for the whole batch; the MultiSequenceDrafter proposes the
/// drafts of B sequences with one draft-model forward per draft position.
///
/// | concept                | member functions it needs                               |
/// |------------------------|---------------------------------------------------------|
/// | MultiSequenceVerifier  | `vocab_size()`, `score_batch(requests, packed_logits&)`  |
/// | MultiSequenceDrafter   | `vocab_size()`, `draft_batch(requests, sampling)`        |
/// | MultiSequenceTreeVerifier | `vocab_size()`, `score_tree_batch(requests, packed_logits&)` |
///
/// Layout of the scores: one packed matrix with offsets (packed_logits), not one matrix per
/// sequence. Sequence i's logits are the columns [offset(i), offset(i) + columns(i)) of one
/// column-major vocab_size() x total matrix, in request order, so they are contiguous: a
/// verifier writes them straight from its classifier product over all packed positions, and
/// verification reads them in place. The storage only grows (to the largest total seen), so a
/// decoding loop allocates nothing for the scores after warm-up.
///
/// Each request names a `slot`: which of the model's per-sequence states (its KV cache) to use.
/// The batch loops give a sequence the same slot at every step, so its cache is reused; a slot
/// freed by a sequence that left may be given to one that joins. Results must not depend on
/// the slot (a cache is only an optimization: column j of a sequence's scores is the logits of
/// context + draft[0..j), whatever the slot held before).
///
/// Plain per-sequence models (Drafter, Verifier) keep working: speculative_step_batch's
/// overload over spans of models calls each sequence's own, and the batch loops call a shared
/// plain model once per sequence.

#include <Eigen/Core>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "concepts.hpp"
#include "error.hpp"
#include "random.hpp"
#include "tree.hpp"
#include "types.hpp"

namespace specdec {

/// One sequence's part of a multi-sequence target pass.
struct score_request {
    std::size_t slot = 0;                ///< which per-sequence state (KV cache) of the model to use
    std::span<const token_id> context;   ///< the sequence so far (prompt first)
    std::span<const token_id> draft;     ///< the draft to score; may be empty
};

/// One sequence's part of a multi-sequence tree pass.
struct tree_score_request {
    std::size_t slot = 0;                ///< which per-sequence state (KV cache) of the model to use
    std::span<const token_id> context;   ///< the sequence so far (prompt first)
    const draft_tree* tree = nullptr;    ///< the tree to score (not null; may have no nodes)
};

/// The scores of a multi-sequence pass, packed: sequence i owns columns
/// [offset(i), offset(i) + columns(i)) of one column-major vocab() x total_columns() matrix,
/// columns(i) = draft length + 1, in request order with no gaps.
///
/// The caller (a batch loop) shapes it with shape() before score_batch(); the verifier writes
/// every column of every sequence and must not reshape it. Storage grows geometrically and is
/// never released, so shaping allocates only for a total not reached before.
class packed_logits {
public:
    /// Sets the layout for `requests` (vocab rows, draft.size() + 1 columns each); contents
    /// unspecified. \throws std::invalid_argument for vocab <= 0 or more entries than an
    /// Eigen::Index can count; std::bad_alloc (then the layout is unchanged).
    void shape(Eigen::Index vocab, std::span<const score_request> requests) {
        shape_by(vocab, requests.size(), [&](std::size_t i) { return static_cast<Eigen::Index>(requests[i].draft.size()) + 1; });
    }
    /// The same for a tree pass: tree->size() + 1 columns per request (the root, then each node).
    void shape(Eigen::Index vocab, std::span<const tree_score_request> requests) {
        shape_by(vocab, requests.size(), [&](std::size_t i) { return static_cast<Eigen::Index>(requests[i].tree->size()) + 1; });
    }

    /// Number of sequences in the current layout.
    [[nodiscard]] std::size_t size() const noexcept { return offsets_.empty() ? 0 : offsets_.size() - 1; }
    /// Rows (vocab_size()) of every column.
    [[nodiscard]] Eigen::Index vocab() const noexcept { return storage_.rows(); }
    /// First column of sequence i. \pre i < size().
    [[nodiscard]] Eigen::Index offset(std::size_t i) const noexcept { return offsets_[i]; }
    /// Columns of sequence i: its draft length + 1. \pre i < size().
    [[nodiscard]] Eigen::Index columns(std::size_t i) const noexcept { return offsets_[i + 1] - offsets_[i]; }
    /// Columns of all sequences together.
    [[nodiscard]] Eigen::Index total_columns() const noexcept { return offsets_.empty() ? 0 : offsets_.back(); }

    /// Sequence i's logits, vocab() x columns(i); column j follows context + draft[0..j).
    [[nodiscard]] Eigen::Map<Eigen::MatrixXf> sequence(std::size_t i) {
        return {storage_.data() + offset(i) * vocab(), vocab(), columns(i)};
    }
    /// Sequence i's logits, read-only.
    [[nodiscard]] Eigen::Map<const Eigen::MatrixXf> sequence(std::size_t i) const {
        return {storage_.data() + offset(i) * vocab(), vocab(), columns(i)};
    }
    /// All packed columns, vocab() x total_columns(): column-major and contiguous, so a
    /// verifier may write them with one product (data() is their first element).
    [[nodiscard]] Eigen::Map<Eigen::MatrixXf> all() { return {storage_.data(), vocab(), total_columns()}; }
    /// The first element of the packed columns (see all()).
    [[nodiscard]] float* data() noexcept { return storage_.data(); }

private:
    template <class Columns>
    void shape_by(Eigen::Index vocab, std::size_t n, Columns columns) {
        constexpr const char* where = "specdec::packed_logits::shape";
        if (vocab <= 0) detail::fail_invalid(where, ": vocab = ", vocab, " must be positive");
        Eigen::Index total = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const Eigen::Index cols = columns(i);
            if (cols > std::numeric_limits<Eigen::Index>::max() / vocab - total)
                detail::fail_invalid(where, ": ", n, " sequences' columns of ", vocab,
                                     " entries are more than an Eigen::Index can count");
            total += cols;
        }
        if (storage_.rows() != vocab || storage_.cols() < total) {
            const Eigen::Index have = storage_.rows() == vocab ? storage_.cols() : 0;
            Eigen::MatrixXf grown(vocab, std::max(total, 2 * have));  // allocated before anything changes
            storage_.swap(grown);
        }
        offsets_.reserve(n + 1);
        offsets_.assign(1, 0);
        for (std::size_t i = 0; i < n; ++i) offsets_.push_back(offsets_.back() + columns(i));
    }

    Eigen::MatrixXf storage_;             // vocab x capacity columns
    std::vector<Eigen::Index> offsets_;   // size() + 1 entries, offsets_[0] = 0
};

namespace detail {

/// After a verifier's score_batch: `out` still has the layout shape() gave it for `requests`
/// (a verifier writes the columns and must not reshape them; the loops read each sequence's
/// columns by that layout). \throws std::invalid_argument naming the difference.
template <class Request>
void check_packed_layout(const packed_logits& out, std::span<const Request> requests, Eigen::Index vocab,
                         const char* where, const char* call) {
    const auto columns = [&](std::size_t k) {
        if constexpr (std::is_same_v<Request, tree_score_request>) return static_cast<Eigen::Index>(requests[k].tree->size()) + 1;
        else return static_cast<Eigen::Index>(requests[k].draft.size()) + 1;
    };
    bool same = out.size() == requests.size() && out.vocab() == vocab;
    for (std::size_t k = 0; same && k < requests.size(); ++k) same = out.columns(k) == columns(k);
    if (!same)
        fail_invalid(where, ": ", call, " changed the layout of its packed_logits (", out.size(), " sequences of ",
                     out.vocab(), " rows, ", out.total_columns(), " columns; shaped for ", requests.size(),
                     " sequences of ", vocab, " rows); a verifier writes the columns and must not reshape them");
}

}  // namespace detail

/// One sequence's part of a multi-sequence draft.
struct draft_request {
    std::size_t slot = 0;              ///< which per-sequence state (KV cache) of the model to use
    std::span<const token_id> context; ///< the sequence so far (prompt first)
    std::size_t gamma = 0;             ///< at most this many draft tokens (0: none)
    uniform_source uniforms;           ///< this sequence's randomness: its own generator
    draft_block* out = nullptr;        ///< where to write the block (arrives cleared, as for BlockDrafter)
};

/// A target model that scores the contexts and drafts of B sequences in one pass.
///
/// Syntactic requirements: `v.vocab_size()` (convertible to std::ptrdiff_t) and
/// `v.score_batch(requests, out)` with a `std::span<const score_request>` and a `packed_logits&`.
///
/// Semantic requirements (not checked by the compiler):
///  1. `out` arrives shaped for `requests` (packed_logits::shape, vocab_size() rows); for each
///     request i, column j of `out.sequence(i)` is set to the logits of the token following
///     requests[i].context + requests[i].draft[0..j), the same values as next_logits would
///     return for that prefix (LanguageModel's requirements on values). Drafts are ragged and
///     may be empty (the batch loops send every live sequence, whatever its draft length).
///  2. Each result depends only on its own request, never on the other sequences of the pass
///     or on the slot's earlier contents; the slots of one call are distinct.
///  3. No hidden randomness.
///  4. On an exception the sequences' scores are unspecified and nothing of the caller's is
///     changed (the loops then leave every sequence of the step as it was).
/// A pass is one target forward over all sequences' new positions: decode_stats::target_calls
/// counts it once for each sequence that took part.
template <class V>
concept MultiSequenceVerifier = requires(V& v, std::span<const score_request> requests, packed_logits& out) {
    { v.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    v.score_batch(requests, out);
};

/// A target model that scores the draft trees of B sequences in one pass (tree attention over
/// every sequence's nodes, as serving engines run trees: each sequence's nodes attend to its
/// context and to their own ancestors).
///
/// Syntactic requirements: `v.vocab_size()` and `v.score_tree_batch(requests, out)` with a
/// `std::span<const tree_score_request>` and a `packed_logits&`.
///
/// Semantic requirements: as MultiSequenceVerifier's, with sequence i's columns laid out as
/// TreeVerifier::score_tree writes them: column 0 the logits after requests[i].context (the
/// root), column k + 1 those after the context and the path from the root to node k. Trees may
/// have no nodes (then one column). decode_stats::target_calls counts the pass once for each
/// sequence that took part.
template <class V>
concept MultiSequenceTreeVerifier = requires(V& v, std::span<const tree_score_request> requests, packed_logits& out) {
    { v.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    v.score_tree_batch(requests, out);
};

/// A drafter that proposes the drafts of B sequences together (one draft-model forward per
/// draft position for all of them).
///
/// Syntactic requirements: `d.vocab_size()` and `d.draft_batch(requests, sampling)` with a
/// `std::span<draft_request>` and a `const sampling_config&`.
///
/// Semantic requirements: for each request, what BlockDrafter asks of draft(): at most `gamma`
/// tokens into `*out` (which arrives cleared, with out->stop_below set), with their draft
/// distributions or as point masses; every random draw of sequence i from
/// `requests[i].uniforms` and in the order a one-sequence draft would make them, so that each
/// sequence's block equals what drafting it alone with its generator gives (the batch loops
/// promise results equal to separate runs with the same seeds); the blocks of the other
/// sequences must not influence it.
template <class D>
concept MultiSequenceDrafter = requires(D& d, std::span<draft_request> requests, const sampling_config& sampling) {
    { d.vocab_size() } -> std::convertible_to<std::ptrdiff_t>;
    d.draft_batch(requests, sampling);
};

}  // namespace specdec
