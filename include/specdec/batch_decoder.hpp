#pragma once
/// \file
/// The one decoding loop: batch_decoder decodes one or many sequences, each step a chain of γ
/// draft tokens or a token tree (decode_options::step), of fixed or adaptive length, with the
/// draft's own sampling and the draft-side stop; sequences join and leave between steps.
/// speculative_decode (speculative_decode.hpp) is a batch_decoder of one sequence, so every
/// capability is available, and behaves the same, for one sequence and for many.
///
/// A step, for every active sequence: (1) the plan: the chain's γ or the tree's depth, capped by
/// the tokens the sequence still needs (the adaptive policy chooses it from earlier steps
/// only); (2) the drafts (one draft_batch call with a MultiSequenceDrafter, else the drafter
/// once per sequence); (3) the target pass (one score_batch call with a MultiSequenceVerifier,
/// else the verifier once per sequence: score(), score_tree(), or position by position);
/// (4) verification and commit per sequence on the executor, each with its own generator;
/// (5) stop tokens, budget, statistics, then the events.
///
/// Exactness: each sequence is decoded with its own generator, drawing exactly what a
/// one-sequence run with that generator draws, so under the fixed policy a sequence's tokens
/// equal those of a separate speculative_decode run with the same seed, prompt, options and
/// budget, whatever the other sequences do (tests/unit/batch_decode_test.cpp); under the adaptive
/// policy each step's length is chosen from earlier steps only, so every sequence keeps the
/// target's distribution (tests/statistical/batch_distribution_test.cpp). Chains are verified by
/// Leviathan et al. 2023, Alg. 1 (or block verification, Sun et al. 2024), trees by
/// verify_tree.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "adapters.hpp"
#include "adaptive_gamma.hpp"
#include "batch.hpp"
#include "concepts.hpp"
#include "decode_options.hpp"
#include "diagnostics.hpp"
#include "error.hpp"
#include "multi_sequence.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "speculative_step.hpp"
#include "tree.hpp"
#include "tree_verify.hpp"
#include "types.hpp"

namespace specdec {

/// Anything a tree step can draft with: a TreeDrafter; a BlockDrafter (its block becomes a
/// chain as deep as the shape); or a plain LanguageModel (branching[d] siblings per node at
/// depth d, sampled from its standardized q as shape.draws says, one next_logits call per node
/// that has children, or one score_tree call per level when it is also a TreeVerifier).
template <class D>
concept AnyTreeDrafter = TreeDrafter<D> || BlockDrafter<D> || LanguageModel<D>;

/// Anything a tree step can verify with: a TreeVerifier (one pass per step), or a Verifier
/// without score_tree(): a BatchVerifier then scores each root-to-leaf path (one score() per
/// leaf), a plain LanguageModel each node (nodes + 1 next_logits calls). Correct, and slower;
/// decode_stats::target_calls counts those passes.
template <class V>
concept AnyTreeVerifier = TreeVerifier<V> || Verifier<V>;

/// What batch_decoder and speculative_decode can draft with: a per-sequence drafter for chains
/// (Drafter) or trees (AnyTreeDrafter), or a MultiSequenceDrafter (chains of all sequences in
/// one call).
template <class D>
concept DecodeDrafter = Drafter<D> || TreeDrafter<D> || MultiSequenceDrafter<D>;

/// What batch_decoder and speculative_decode can verify with: a Verifier, a TreeVerifier, a
/// MultiSequenceVerifier (chains of all sequences in one pass), or a MultiSequenceTreeVerifier
/// (trees of all sequences in one pass).
template <class V>
concept DecodeVerifier = Verifier<V> || TreeVerifier<V> || MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>;

namespace detail {

/// Cuts `sequence` after the first stop token among its last `fresh` tokens, if any.
/// Returns true when a stop token was found.
inline bool cut_at_stop(std::vector<token_id>& sequence, std::size_t fresh, std::span<const token_id> stop_tokens) {
    if (stop_tokens.empty()) return false;
    for (std::size_t k = sequence.size() - fresh; k < sequence.size(); ++k) {
        if (std::find(stop_tokens.begin(), stop_tokens.end(), sequence[k]) != stop_tokens.end()) {
            sequence.resize(k + 1);
            return true;
        }
    }
    return false;
}

/// The prompt must not be empty, and it and the stop tokens must be tokens of the models'
/// vocabulary.
inline void check_prompt_and_stop_tokens(std::span<const token_id> prompt, std::span<const token_id> stop_tokens,
                                         std::ptrdiff_t vocab, const char* where) {
    if (prompt.empty())
        fail_invalid(where, ": the prompt is empty; the models need at least one context token to condition on"
                            " (start the prompt with the model's BOS token)");
    check_token_range(prompt, vocab, where, "prompt");
    check_token_range(stop_tokens, vocab, where, "stop_tokens");
}

/// How many generated tokens to reserve room for up front: a large budget with a stop token
/// ("until end of text") must not allocate the whole budget.
inline constexpr std::size_t initial_reserve = 4096;

/// A reference to the caller's generator that is itself a generator: speculative_decode runs
/// a batch_decoder of one sequence that draws from the caller's object.
template <class G>
struct generator_ref {
    G* g;
    using result_type = std::invoke_result_t<G&>;
    static constexpr result_type min() { return G::min(); }
    static constexpr result_type max() { return G::max(); }
    result_type operator()() { return (*g)(); }
};

/// Buffers of one sequence's tree steps (nothing allocated per step once shapes repeat).
struct tree_workspace {
    draft_tree tree;
    draft_block block;
    Eigen::MatrixXf scores;
    std::vector<Eigen::MatrixXf> draft_scores;  // one per level (see draft_tree_from_model)
    tree_verify_workspace verify;
    tree_shape shape;                           // this step's shape: the first levels of the run's
    std::vector<token_id> path;                 // scratch of path-by-path scoring
    std::vector<token_id> accepted;             // the accepted path (step_event::draft)
    std::vector<char> is_leaf;
    std::vector<std::int32_t> kept;             // the draft-side stop's new index of each node
    Eigen::VectorXf logits, q, scratch;
    sampling_workspace sampling;
};

/// One tree step's draft into ws.tree: a tree of ws.shape (the run's shape cut to `depth`
/// levels) from whichever kind of drafter D is (an empty tree when depth is 0), checked
/// before any target sees it.
template <class D>
void draft_tree_step(D& drafter, std::span<const token_id> context, std::size_t depth, const sampling_config& sampling,
                     uniform_source& uniforms, tree_workspace& ws, std::ptrdiff_t vocab, const char* where) {
    ws.tree.clear();
    if (depth == 0) return;
    if constexpr (TreeDrafter<D>) {
        drafter.propose_tree(context, ws.shape, sampling, uniforms, ws.tree);
        if (ws.tree.size() > ws.shape.nodes() || static_cast<std::size_t>(ws.tree.max_depth()) > depth)
            fail_invalid(where, ": the drafter proposed ", ws.tree.size(), " nodes of depth up to ",
                         ws.tree.max_depth(), "; at most ", ws.shape.nodes(), " of depth ", depth, " were asked for");
    } else if constexpr (BlockDrafter<D>) {
        ws.block.clear();
        // A chain as deep as the shape, within its node budget.
        const std::size_t n = std::min(depth, ws.shape.nodes());
        drafter.draft(context, n, sampling, uniforms, ws.block);
        // Checked as a chain's block is (length, token range, the sizes of probs and scales,
        // the scales' values) before tree_from_block reads its columns.
        ws.block.tokens.resize(check_draft(ws.block, n, vocab, where));
        tree_from_block(ws.block, ws.tree);
    } else {
        // Sampled from the model's own checked rows: in range and well formed by construction.
        if (ws.draft_scores.size() < ws.shape.depth()) ws.draft_scores.resize(ws.shape.depth());
        draft_tree_levels(drafter, context, ws.shape, sampling, uniforms, ws.tree, ws.path, ws.logits, ws.q,
                          ws.scratch, ws.sampling, where, [&ws](std::size_t d) { return &ws.draft_scores[d]; });
        return;
    }
    // A token out of range must never reach the target's model; verify_tree checks the columns.
    check_tree_structure(ws.tree, vocab, where);
}

/// The draft-side stop on a tree: a node whose draft probability q(x) (its column at its
/// token, before the removal of earlier siblings) is below `stop_below` keeps its place and
/// loses its descendants, as a chain's block ends after such a token. Which nodes stay depends
/// on draft values only, so verification stays exact. Point-mass trees have no q: unchanged.
inline void prune_tree_below(draft_tree& tree, float stop_below, std::vector<std::int32_t>& kept) {
    if (!(stop_below > 0.0f) || !tree.has_distributions()) return;
    const std::size_t n = tree.size();
    kept.assign(n, -1);
    std::int32_t next = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t parent = tree.parents[i];
        bool keep = parent < 0;
        if (!keep) {
            const auto p = static_cast<std::size_t>(parent);
            keep = kept[p] >= 0 &&
                   !(tree.probs(tree.tokens[p], static_cast<Eigen::Index>(p)) < stop_below);
        }
        if (keep) kept[i] = next++;
    }
    if (static_cast<std::size_t>(next) == n) return;
    const bool has_draws = !tree.draws.empty();
    for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t to = kept[i];
        if (to < 0) continue;
        const auto t = static_cast<std::size_t>(to);
        tree.tokens[t] = tree.tokens[i];
        tree.parents[t] = tree.parents[i] < 0 ? -1 : kept[static_cast<std::size_t>(tree.parents[i])];
        tree.depths[t] = tree.depths[i];
        if (has_draws) tree.draws[t] = tree.draws[i];
        if (t != i) tree.probs.col(static_cast<Eigen::Index>(t)) = tree.probs.col(static_cast<Eigen::Index>(i));
    }
    const auto m = static_cast<std::size_t>(next);
    tree.tokens.resize(m);
    tree.parents.resize(m);
    tree.depths.resize(m);
    if (has_draws) tree.draws.resize(m);
    // The first m columns. (Allocates, a few times per pruned step: this copy, then the full-size
    // storage the next draft takes back. Steps the stop leaves whole allocate nothing.)
    Eigen::MatrixXf pruned = tree.probs.leftCols(static_cast<Eigen::Index>(m));
    tree.probs.swap(pruned);
}

/// Scores ws.tree after `context` into ws.scores (one score_tree pass, or path by path) and
/// checks the shape of what came back. Returns the target passes it took.
template <class V>
std::size_t score_tree_step(V& verifier, std::span<const token_id> context, tree_workspace& ws, std::ptrdiff_t vocab,
                            const char* where) {
    std::size_t passes = 1;
    if constexpr (TreeVerifier<V>) {
        verifier.score_tree(context, ws.tree, ws.scores);
    } else {
        passes = score_tree_by_paths(verifier, context, ws.tree, ws.scores, ws.path, ws.is_leaf, ws.logits, where);
    }
    if (ws.scores.rows() != vocab || ws.scores.cols() != static_cast<Eigen::Index>(ws.tree.size() + 1))
        fail_invalid(where, ": the target's scores are ", ws.scores.rows(), " x ", ws.scores.cols(),
                     "; expected vocab_size x (nodes + 1) = ", vocab, " x ", ws.tree.size() + 1);
    return passes;
}

/// Adds one tree step to the statistics: per depth, as decode_stats counts a chain's
/// positions; a rejection (and a reached position below the accepted path) only where the
/// accepted node has children, which were then tested and failed. steps_at_gamma is counted
/// by the loop (the depth asked).
inline void count_tree_step(decode_stats& st, const tree_verify_result& r, const draft_tree& tree, std::size_t passes) {
    st.steps += 1;
    st.target_calls += passes;
    st.draft_calls += tree.model_calls;
    st.drafted_tokens += tree.size();
    st.accepted_tokens += r.accepted;
    const auto tree_depth = static_cast<std::size_t>(tree.max_depth());
    const bool tested_below = std::find(tree.parents.begin(), tree.parents.end(), r.last_node) != tree.parents.end();
    if (tested_below) st.rejected_tokens += 1;
    if (st.accepted_at_position.size() < tree_depth) {
        st.accepted_at_position.resize(tree_depth, 0);
        st.reached_at_position.resize(tree_depth, 0);
    }
    for (std::size_t i = 0; i < r.accepted; ++i) ++st.accepted_at_position[i];
    for (std::size_t i = 0; i < r.accepted + (tested_below ? 1 : 0); ++i) ++st.reached_at_position[i];
    // The acceptance by sibling rank at the root (capacity reserved by the caller).
    const std::size_t ranks = r.sibling_acceptance.size();
    if (st.reached_at_sibling.size() < ranks) {
        st.reached_at_sibling.resize(ranks, 0);
        st.expected_accepted_at_sibling.resize(ranks, 0.0);
    }
    for (std::size_t k = 0; k < ranks; ++k) {
        ++st.reached_at_sibling[k];
        st.expected_accepted_at_sibling[k] += r.sibling_acceptance[k];
    }
}

/// One sequence of a step, as multi_step sees it.
template <class G>
struct multi_item {
    std::size_t slot = 0;                   // the models' per-sequence state to use
    std::vector<token_id>* tokens = nullptr;
    decode_stats* stats = nullptr;
    G* rng = nullptr;
    step_workspace* ws = nullptr;
    tree_workspace* tws = nullptr;          // tree steps only
    std::size_t gamma = 0;                  // γ, or the tree's depth (0: a plain target step)
    bool tree = false;                      // a tree step
    step_extras* extras = nullptr;          // may be null
    std::exception_ptr error{};             // what this sequence's step threw
    bool stepped = false;                   // the step was committed
    step_result result{};                   // chain steps
    tree_verify_result tree_result{};       // tree steps
    std::size_t passes = 0;                 // target passes (tree steps)
    std::size_t packed = 0;                 // index in the packed target pass (chain steps)
    std::size_t appended = 0;               // tokens the settled step added (after a stop-token cut)
    bool settled = false;                   // settled, its on_step not yet run
};

/// What multi_step measured (steady clock) when asked to.
struct multi_timing {
    bool time = false;
    double draft_seconds = 0.0;  // the drafting phase, all sequences
    double pass_seconds = 0.0;   // the target pass, all sequences
};

/// The settings a step needs besides each item's own (checked by the decoder).
struct step_settings {
    const sampling_config* sampling = nullptr;        // the target's
    const sampling_config* draft_sampling = nullptr;  // the drafter's
    float lenience = 1.0f;
    verification_scheme scheme = verification_scheme::block;
    tree_verification_scheme tree_scheme = tree_verification_scheme::traversal;
    float stop_below = 0.0f;
    const tree_shape* shape = nullptr;                // a tree step's full shape
    const tree_shape* planned = nullptr;  // the planner's tree for this step (null: the run's shape)
    bool sibling_stats = false;                       // estimate the acceptance by sibling rank
};

/// Verifies a tree step's scores and commits the accepted path and the drawn token. Strong
/// guarantee: if anything throws, the sequence and stats are as they were.
template <class G>
void finish_tree_step(const Eigen::Ref<const Eigen::MatrixXf>& scores, multi_item<G>& it, const step_settings& s,
                      const char* where) {
    tree_workspace& ws = *it.tws;
    uniform_source uniforms(*it.rng);
    const tree_verify_result r =
        verify_tree_for(scores, ws.tree, *s.sampling, uniforms, ws.verify,
                        tree_verify_options{.scheme = s.tree_scheme, .check_draft_distributions = true,
                                            .estimate_sibling_acceptance = s.sibling_stats},
                        where);
    std::vector<token_id>& sequence = *it.tokens;
    path_tokens(ws.tree, r.last_node, ws.accepted);
    const std::size_t need = sequence.size() + r.accepted + 1;
    if (need > sequence.capacity()) sequence.reserve(std::max(need, 2 * sequence.capacity()));
    decode_stats& st = *it.stats;
    const auto depth = static_cast<std::size_t>(ws.tree.max_depth());
    st.accepted_at_position.reserve(std::max(depth, st.accepted_at_position.size()));
    st.reached_at_position.reserve(std::max(depth, st.reached_at_position.size()));
    const std::size_t ranks = r.sibling_acceptance.size();
    st.reached_at_sibling.reserve(std::max(ranks, st.reached_at_sibling.size()));
    st.expected_accepted_at_sibling.reserve(std::max(ranks, st.expected_accepted_at_sibling.size()));
    sequence.insert(sequence.end(), ws.accepted.begin(), ws.accepted.end());
    sequence.push_back(r.next_token);
    count_tree_step(st, r, ws.tree, it.passes);
    it.tree_result = r;
}

/// One step of every item (see the file comment): the drafts of all, one target pass for all
/// (or one per sequence), then verification and commit per sequence on the executor, each with
/// its own generator and workspace. So each sequence draws exactly the uniforms, in the same
/// order, that a one-sequence step with its generator draws.
///
/// Errors: an exception of a per-sequence call (drafting, checks, scoring, verification) is
/// recorded in that item, whose sequence stays unchanged; the others step. An exception of a
/// call that serves all sequences (draft_batch, score_batch) propagates before any sequence
/// changes. An exception of the executor propagates after what was committed (see
/// multi_item::stepped). Settings must have been checked.
template <class D, class V, class G, BatchExecutor E>
void multi_step(D& drafter, V& verifier, std::span<multi_item<G>> items, const step_settings& s, std::ptrdiff_t vocab,
                multi_buffers& buf, E& executor, const char* where, multi_timing* timing = nullptr) {
    const sampling_config& draft_sampling = s.draft_sampling ? *s.draft_sampling : *s.sampling;
    for (auto& it : items) {
        it.error = nullptr;
        it.stepped = false;
        if (!it.tree) begin_draft(it.ws->draft, it.extras);
    }
    const bool timed = timing && timing->time;
    auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};

    // Alg. 1, first loop, for every sequence.
    const auto draft_one = [&](multi_item<G>& it) {
        try {
            uniform_source uniforms(*it.rng);
            const std::span<const token_id> context(*it.tokens);
            if (it.tree) {
                if constexpr (AnyTreeDrafter<D>) {
                    // The run's shape cut to this step's depth (no allocation: the vector only
                    // shrinks and regrows within its capacity).
                    (s.planned ? s.planned : s.shape)->cut(it.gamma, it.tws->shape);
                    draft_tree_step(drafter, context, it.gamma, draft_sampling, uniforms, *it.tws, vocab, where);
                    prune_tree_below(it.tws->tree, s.stop_below, it.tws->kept);
                }
            } else if constexpr (Drafter<D>) {
                run_drafter(drafter, context, it.gamma, draft_sampling, uniforms, *it.ws, where);
            }
        } catch (...) {
            it.error = std::current_exception();
        }
    };
    if constexpr (MultiSequenceDrafter<D>) {
        // Chain drafts of every sequence in one draft_batch call per position; trees one
        // sequence at a time.
        buf.drafts.clear();
        for (auto& it : items)
            if (!it.tree && it.gamma > 0)
                buf.drafts.push_back({it.slot, std::span<const token_id>(*it.tokens), it.gamma, uniform_source(*it.rng),
                                      &it.ws->draft});
        if (!buf.drafts.empty()) drafter.draft_batch(std::span<draft_request>(buf.drafts), draft_sampling);
        for (auto& it : items)
            if (it.tree) draft_one(it);
    } else {
        for (auto& it : items) draft_one(it);
    }
    for (auto& it : items) {
        if (it.error || it.tree) continue;
        try {
            (void)check_draft(it.ws->draft, it.gamma, vocab, where);
        } catch (...) {
            it.error = std::current_exception();
        }
    }
    if (timed) {
        timing->draft_seconds = seconds_since(t0);
        t0 = std::chrono::steady_clock::now();
    }

    // Alg. 1: run M_p on every sequence's γ+1 prefixes (or tree nodes), all in one pass.
    buf.scores.clear();
    buf.tree_scores.clear();
    buf.scored.clear();
    constexpr bool packed = MultiSequenceVerifier<V>;
    constexpr bool tree_packed = MultiSequenceTreeVerifier<V>;
    for (std::size_t i = 0; i < items.size(); ++i) {
        auto& it = items[i];
        if (it.error) continue;
        if (it.tree) {
            if constexpr (tree_packed) {
                it.packed = buf.tree_scores.size();
                it.passes = 1;
                buf.tree_scores.push_back({it.slot, std::span<const token_id>(*it.tokens), &it.tws->tree});
            } else if constexpr (AnyTreeVerifier<V>) {
                try {
                    it.passes = score_tree_step(verifier, std::span<const token_id>(*it.tokens), *it.tws, vocab, where);
                } catch (...) {
                    it.error = std::current_exception();
                }
            }
            continue;
        }
        if constexpr (packed) {
            it.packed = buf.scores.size();
            buf.scores.push_back({it.slot, std::span<const token_id>(*it.tokens),
                                  std::span<const token_id>(it.ws->draft.tokens)});
        } else if constexpr (Verifier<V>) {
            try {
                run_verifier(verifier, std::span<const token_id>(*it.tokens),
                             std::span<const token_id>(it.ws->draft.tokens), *it.ws, vocab, where);
            } catch (...) {
                it.error = std::current_exception();
            }
        }
    }
    if constexpr (packed) {
        if (!buf.scores.empty()) {
            buf.logits.shape(static_cast<Eigen::Index>(vocab), buf.scores);
            verifier.score_batch(std::span<const score_request>(buf.scores), buf.logits);
            check_packed_layout(buf.logits, std::span<const score_request>(buf.scores),
                                static_cast<Eigen::Index>(vocab), where, "score_batch");
        }
    }
    // (A step's items are all chains or all trees: the two packed passes never share buf.logits.)
    if constexpr (tree_packed) {
        if (!buf.tree_scores.empty()) {
            buf.logits.shape(static_cast<Eigen::Index>(vocab), buf.tree_scores);
            verifier.score_tree_batch(std::span<const tree_score_request>(buf.tree_scores), buf.logits);
            check_packed_layout(buf.logits, std::span<const tree_score_request>(buf.tree_scores),
                                static_cast<Eigen::Index>(vocab), where, "score_tree_batch");
        }
    }
    if (timed) timing->pass_seconds = seconds_since(t0);

    // Verification per sequence, with its own generator, on the executor. The job captures one
    // pointer, so std::function stores it without allocating.
    struct context_t {
        std::span<multi_item<G>> items;
        multi_buffers& buf;
        V& verifier;
        const step_settings& s;
        std::ptrdiff_t vocab;
        const char* where;
    } ctx{items, buf, verifier, s, vocab, where};
    const std::function<void(std::size_t)> job = [c = &ctx](std::size_t i) {
        auto& it = c->items[i];
        if (it.error) return;  // drafting or a per-sequence scoring call failed
        try {
            if (it.tree) {
                if constexpr (tree_packed) finish_tree_step(c->buf.logits.sequence(it.packed), it, c->s, c->where);
                else finish_tree_step(it.tws->scores, it, c->s, c->where);
            } else {
                const std::size_t n = it.ws->draft.tokens.size();
                if constexpr (packed) {
                    it.result = finish_step(c->buf.logits.sequence(it.packed), *it.tokens, *it.stats, 1,
                                            *c->s.sampling, c->s.lenience, c->s.scheme, *it.rng, *it.ws, c->vocab,
                                            c->where, it.extras);
                } else if constexpr (Verifier<V>) {
                    it.result = finish_step(it.ws->target_logits, *it.tokens, *it.stats, score_calls(c->verifier, n),
                                            *c->s.sampling, c->s.lenience, c->s.scheme, *it.rng, *it.ws, c->vocab,
                                            c->where, it.extras);
                }
            }
            it.stepped = true;
        } catch (...) {
            it.error = std::current_exception();
        }
    };
    executor.parallel_for(items.size(), job);
}

/// Whether batch_decoder runs a tree planner's chain plans as chain steps: the drafter has a
/// chain call, and the verifier scores a chain in one call (score, score_batch), or has no tree
/// call that would (a plain model scores a chain tree one node at a time, as a chain).
template <class D, class V>
inline constexpr bool chains_as_chains =
    (Drafter<D> || MultiSequenceDrafter<D>) &&
    (BatchVerifier<V> || MultiSequenceVerifier<V> ||
     (LanguageModel<V> && !TreeVerifier<V> && !MultiSequenceTreeVerifier<V>));

/// The names a decoder's errors give the user's call: its construction, add() and step().
/// speculative_decode's decoder names speculative_decode in all three.
struct entry_point {
    const char* construct;
    const char* add;
    const char* step;
};

}  // namespace detail

/// Decodes one or many sequences together (see the file comment); speculative_decode is this
/// decoder with one sequence.
///
/// \tparam D a drafter: a Drafter or a TreeDrafter shared by all sequences (called once per
///           sequence, on the calling thread; it must return for each context what it would
///           alone: a stateless drafter, or a model whose cache follows the context), or a
///           MultiSequenceDrafter (chain drafts of all sequences in one call)
/// \tparam V a verifier: a Verifier or TreeVerifier shared the same way, or a
///           MultiSequenceVerifier (chain steps of all sequences in one target pass) and/or a
///           MultiSequenceTreeVerifier (tree steps of all sequences in one target pass)
/// \tparam G the sequences' generator type (std::mt19937_64 unless named; see
///           make_batch_decoder)
///
/// A sequence is identified by the id add() returns, which is also its slot in the models
/// (score_request::slot); a finished sequence keeps its id until take() or remove(), then the
/// id may be given to a sequence added later. Not thread-safe; one decoder per loop.
///
/// \code
/// specdec::batch_decoder dec(draft, target, {.step = specdec::chain{.gamma = 3}});  // std::mt19937_64
/// auto a = dec.add(prompt_a, std::mt19937_64(1), {.max_new_tokens = 64, .stop_tokens = {2}});
/// auto b = dec.add(prompt_b, std::mt19937_64(2));   // the options' budget
/// while (dec.active() != 0) dec.step();            // more sequences may be added between steps
/// specdec::decode_result ra = dec.take(a), rb = dec.take(b);
/// \endcode
template <class D, class V, class G = std::mt19937_64>
class batch_decoder {
public:
    /// \param threads threads of the built-in executor (1: the calling thread alone); unused
    ///        by step(executor).
    /// \throws std::invalid_argument for invalid options (the step's shape, sampling, the
    ///         draft's settings, the adaptive settings or a controller of another length), a
    ///         shape the models cannot serve (a tree with a MultiSequenceVerifier that has no
    ///         per-sequence scoring, a chain with a drafter that only proposes trees), a
    ///         vocabulary mismatch, a stop token out of range, or threads = 0.
    batch_decoder(D& drafter, V& verifier, decode_options options = {}, std::size_t threads = 1)
        : batch_decoder(detail::entry_point{"specdec::batch_decoder", "specdec::batch_decoder::add",
                                            "specdec::batch_decoder::step"},
                        drafter, verifier, std::move(options), threads) {}

    /// (Internal: speculative_decode's, whose errors then name it.)
    batch_decoder(detail::entry_point names, D& drafter, V& verifier, decode_options options, std::size_t threads)
        : drafter_(drafter), verifier_(verifier), options_(std::move(options)), ws_(checked_threads(threads, names)),
          where_(names) {
        [[maybe_unused]] constexpr bool diagnosed = detail::diagnose_decoder_call<D, V, G>();
        const char* where = where_.construct;
        tree_ = std::holds_alternative<tree>(options_.step);
        const bool adaptive = options_.length.policy == gamma_policy::adaptive;
        if (options_.length.policy != gamma_policy::fixed && !adaptive)
            detail::fail_invalid(where, ": options.length.policy = ", static_cast<int>(options_.length.policy),
                                 " is neither gamma_policy::fixed nor gamma_policy::adaptive");
        validate(options_.sampling, where);
        detail::check_draft_sampling(options_.draft.sampling, where, "draft.");
        if (!(options_.draft.stop_below >= 0.0f && options_.draft.stop_below <= 1.0f))
            detail::fail_invalid(where, ": draft.stop_below = ", options_.draft.stop_below,
                                 " must lie in [0, 1] (0 is off)");
        settings_.sampling = &options_.sampling;
        settings_.draft_sampling = options_.draft.sampling ? &*options_.draft.sampling : nullptr;
        settings_.stop_below = options_.draft.stop_below;
        if (tree_) {
            const tree& t = std::get<tree>(options_.step);
            if (!t.shape.children.empty()) {
                if (const char* problem = t.shape.children_problem())
                    detail::fail_invalid(where, ": step.shape.children: ", problem);
                if (t.shape.branching != t.shape.widest_per_depth())
                    detail::fail_invalid(where, ": step.shape.children is set, and step.shape.branching is not the "
                                                "widest node of each of its depths (a drafter that reads only "
                                                "branching would propose another tree); make the shape with "
                                                "specdec::tree_shape::from_children()");
            }
            longest_ = t.shape.depth();
            if (longest_ == 0)
                detail::fail_invalid(where, ": options.step is a tree whose shape.branching has depth 0; at least "
                                            "one level with a positive branching is needed");
            if (t.shape.draws != sibling_draws::iid && t.shape.draws != sibling_draws::without_replacement)
                detail::fail_invalid(where, ": step.shape.draws = ", static_cast<int>(t.shape.draws),
                                     " is neither sibling_draws::iid nor sibling_draws::without_replacement");
            settings_.shape = &t.shape;
            if (t.scheme != tree_verification_scheme::traversal &&
                t.scheme != tree_verification_scheme::recursive_rejection)
                detail::fail_invalid(where, ": step.scheme = ", static_cast<int>(t.scheme),
                                     " is not a tree_verification_scheme");
            settings_.tree_scheme = t.scheme;
            settings_.sibling_stats = adaptive || t.estimate_sibling_acceptance;
            if constexpr (!AnyTreeDrafter<D>)
                detail::fail_invalid(where, ": options.step is a tree, and the drafter proposes chains for many "
                                            "sequences only (draft_batch); give it propose_tree(), draft() or "
                                            "next_logits() for one sequence, or use specdec::chain");
            if constexpr (!AnyTreeVerifier<V> && !MultiSequenceTreeVerifier<V>)
                detail::fail_invalid(where, ": options.step is a tree, and the verifier scores chains of many "
                                            "sequences only (score_batch); give it score_tree(), score() or "
                                            "next_logits() for one sequence, or use specdec::chain");
        } else {
            const chain& c = std::get<chain>(options_.step);
            longest_ = c.gamma;
            if (adaptive && c.gamma == 0)
                detail::fail_invalid(where, ": step.gamma = 0 with the adaptive policy; it needs gamma >= 1 as the "
                                            "longest draft");
            detail::check_step_options(std::max<std::size_t>(c.gamma, 1), options_.sampling, c.lenience, c.scheme,
                                       where);
            settings_.lenience = c.lenience;
            settings_.scheme = c.scheme;
            estimate_ = adaptive || c.estimate_acceptance;
            if constexpr (!Drafter<D> && !MultiSequenceDrafter<D>)
                if (c.gamma > 0)
                    detail::fail_invalid(where, ": options.step is a chain, and the drafter only proposes trees "
                                                "(propose_tree); use specdec::tree, or give it draft()");
            if constexpr (!Verifier<V> && !MultiSequenceVerifier<V>)
                detail::fail_invalid(where, ": options.step is a chain, and the verifier only scores trees "
                                            "(score_tree or score_tree_batch); use specdec::tree, or give it score()");
        }
        vocab_ = detail::checked_vocab(drafter, verifier, where);
        detail::check_token_range(options_.budget.stop_tokens, vocab_, where, "budget.stop_tokens");
        // How this pair drafts and scores a tree planner's plans (tree_plan_limits): a plain
        // next_logits drafter grows a tree one call per parent (draft_tree_step), the others a
        // level per call; chain plans run as chain steps when both models have chain calls.
        constexpr bool per_parent = !TreeDrafter<D> && !BlockDrafter<D> && !TreeVerifier<D>;
        constexpr tree_draft_calls draft_calls = per_parent ? tree_draft_calls::per_parent : tree_draft_calls::per_level;
        constexpr bool chains_batched = MultiSequenceDrafter<D> && detail::chains_as_chains<D, V>;
        constexpr bool chain_steps = detail::chains_as_chains<D, V>;
        if (adaptive) {
            if (options_.length.controller) {
                gamma_controller& c = *options_.length.controller;
                if (tree_) {
                    const tree_shape& shape = std::get<tree>(options_.step).shape;
                    const auto& lim = c.tree_limits();
                    const std::size_t cap = shape.children.empty() ? shape.max_nodes : shape.nodes();
                    if (!c.plans_trees() || lim.max_nodes != cap || lim.branching.size() != longest_ ||
                        !std::equal(lim.branching.begin(), lim.branching.end(), shape.branching.begin()))
                        detail::fail_invalid(where, ": the controller does not plan this step's tree; make it with "
                                                    "specdec::make_controller(options) (the tree planner with the "
                                                    "shape's branching and max_nodes as its limits)");
                    // How these models draft and score its plans (a planner that costed this
                    // pair's steps as another pair's would plan from the wrong times: a plain
                    // step timed in the chain table while the planner waited for it in the tree
                    // table never ended).
                    c.describe_models(draft_calls, chains_batched, chain_steps);
                } else if (c.plans_trees() || c.gamma_max() != longest_) {
                    detail::fail_invalid(where, ": the controller's gamma_max() = ", c.gamma_max(),
                                         c.plans_trees() ? " (a tree planner)" : "", " differs from the step's gamma = ",
                                         longest_, "; make it with specdec::make_controller(options)");
                }
                controller_ = &c;
            } else {
                controller_ = &own_controller_.emplace(make_controller(options_, draft_calls, chains_batched, chain_steps));
            }
        }
    }

    batch_decoder(const batch_decoder&) = delete;
    batch_decoder& operator=(const batch_decoder&) = delete;

    /// Adds a sequence to the batch; it takes part from the next step on.
    /// \returns its id (and model slot): the lowest id not in use.
    /// \throws std::invalid_argument for an empty prompt or a prompt or stop token out of
    ///         range (nothing changes).
    std::size_t add(std::span<const token_id> prompt, G rng, decode_budget budget) {
        const char* where = where_.add;
        detail::check_prompt_and_stop_tokens(prompt, budget.stop_tokens, vocab_, where);
        std::size_t id = 0;
        while (id < entries_.size() && entries_[id]) ++id;
        auto e = std::make_unique<entry>(std::move(rng));
        e->sequence.reserve(prompt.size() + std::min(budget.max_new_tokens, detail::initial_reserve) +
                            std::min(longest_, detail::initial_reserve) + 1);
        e->sequence.assign(prompt.begin(), prompt.end());
        e->prompt = prompt.size();
        e->done = budget.max_new_tokens == 0;
        if (e->done) e->stop = stop_reason::max_new_tokens;  // (exactly 0 tokens)
        e->budget = std::move(budget);
        if (tree_) {
            e->tws = std::make_unique<detail::tree_workspace>();
            std::get<tree>(options_.step).shape.cut(longest_, e->tws->shape);
            e->tws->accepted.reserve(longest_);  // the longest accepted path, so committing never allocates
        }
        e->stats.steps_at_gamma.reserve(longest_ + 1);  // (settle() then never allocates)
        if (id == entries_.size()) entries_.emplace_back();
        entries_[id] = std::move(e);
        return id;
    }
    /// Adds a sequence with the options' budget.
    std::size_t add(std::span<const token_id> prompt, G rng) { return add(prompt, std::move(rng), options_.budget); }

    /// Sequences still generating (not finished).
    [[nodiscard]] std::size_t active() const noexcept {
        std::size_t n = 0;
        for (const auto& e : entries_) n += (e && !e->done) ? 1u : 0u;
        return n;
    }
    /// True when `id` is a sequence of this decoder (generating or finished, not yet taken).
    [[nodiscard]] bool contains(std::size_t id) const noexcept { return id < entries_.size() && entries_[id]; }
    /// True when sequence `id` has finished (budget reached or stop token).
    [[nodiscard]] bool finished(std::size_t id) const { return at(id, "finished").done; }
    /// The tokens sequence `id` has generated so far (prompt excluded); valid until the next
    /// step, add, take or remove.
    [[nodiscard]] std::span<const token_id> generated(std::size_t id) const {
        const entry& e = at(id, "generated");
        return std::span<const token_id>(e.sequence).subspan(e.prompt);
    }
    /// Sequence `id`'s counters so far.
    [[nodiscard]] const decode_stats& stats(std::size_t id) const { return at(id, "stats").stats; }
    /// Sequence `id`'s generator (it has advanced by what the sequence drew).
    [[nodiscard]] G& rng(std::size_t id) { return at(id, "rng").rng; }

    /// Removes sequence `id` from the batch (finished or not) and returns what it generated
    /// (`stop`: stop_reason::unfinished for a sequence taken before it finished); the other
    /// sequences are not disturbed, and the id becomes free (an on_step callback may take a
    /// sequence: its event of the current step, if not yet run, is then skipped).
    /// \throws std::invalid_argument for an id not in the batch.
    decode_result take(std::size_t id) {
        entry& e = at(id, "take");
        decode_result r;
        r.tokens.assign(e.sequence.begin() + static_cast<std::ptrdiff_t>(e.prompt), e.sequence.end());
        r.stats = std::move(e.stats);
        r.stop = e.stop;
        release(id);
        return r;
    }
    /// Removes sequence `id`, discarding its output (as take(), from a callback too).
    /// \throws std::invalid_argument for an id not in the batch.
    void remove(std::size_t id) {
        (void)at(id, "remove");
        release(id);
    }

    /// One step of every active sequence: the plan, drafts for all, the target pass, verification
    /// per sequence on `executor` (see BatchExecutor), then each sequence's stop tokens, budget
    /// and statistics; then the adaptive policy observes the step; then on_step runs for each
    /// sequence that stepped, in id order.
    /// \returns the number of sequences still active.
    /// \throws the exception of a call for the whole batch: draft_batch, score_batch or
    ///         score_tree_batch, or the packed scores' layout check (no sequence changed; the
    ///         generators of sequences that drafted have advanced; the adaptive policy has not
    ///         observed the step, though it counted its plan among its choices); the exceptions
    ///         of single sequences' drafts in that step are then dropped. Otherwise every
    ///         sequence of the step is settled first (those whose step failed unchanged and still
    ///         active: step again, or remove them) and the adaptive policy observes the sequences
    ///         that stepped; the callbacks then run for the sequences that stepped, in id order,
    ///         and an exception of one skips the callbacks after it; then, if a sequence's step
    ///         threw, the exception of the lowest-id such sequence propagates (and a callback's
    ///         is dropped: the sequence's exception wins), else a callback's. When the executor
    ///         itself throws, the sequences it stepped are settled and observed (without the
    ///         step's times), no callback runs, and its exception propagates (the sequences'
    ///         own are dropped). Either way the decoder stays usable.
    ///         std::logic_error when called while a step of this decoder runs (from on_step:
    ///         take, remove and add are allowed there).
    template <BatchExecutor E>
    std::size_t step(E& executor) {
        const char* where = where_.step;
        if (stepping_)
            throw std::logic_error(std::string(where) +
                                   ": called while a step of this decoder runs (from its on_step callback, or its "
                                   "adapters); take, remove and add are allowed there, step and run are not");
        stepping_ = true;
        const struct stepping_guard {
            bool& flag;
            ~stepping_guard() { flag = false; }
        } guard{stepping_};
        items_.clear();
        std::size_t limit = 0;  // the most any sequence could still use
        bool first = false, all_first = true;
        for (std::size_t id = 0; id < entries_.size(); ++id) {
            entry* e = entries_[id].get();
            if (!e || e->done) continue;
            const std::size_t remaining = e->budget.max_new_tokens - e->generated;
            limit = std::max(limit, remaining - 1);
            first = first || e->stats.steps == 0;
            all_first = all_first && e->stats.steps == 0;
            items_.push_back({.slot = id, .tokens = &e->sequence, .stats = &e->stats, .rng = &e->rng, .ws = &e->ws,
                              .tws = e->tws.get(), .gamma = std::min(longest_, remaining - 1), .tree = tree_,
                              .extras = &e->extras});
        }
        if (items_.empty()) return 0;
        std::size_t planned = longest_;
        if (controller_) {
            if (all_first) controller_->new_call();
            planned = controller_->choose(limit, items_.size());
            if (items_.size() > 1) had_many_ = true;
            const auto& adaptive = controller_->options();
            // A tree planner's batch that drains (adaptive_gamma_options::drain): a plain step
            // where plain steps are predicted to finish every sequence sooner than the tree.
            if (tree_ && planned > 0 && had_many_ && adaptive.drain) {
                fill_ragged();
                if (controller_->drain_to_plain(ragged_, {})) planned = 0;
            }
            bool as_chain = false;
            if (tree_) {
                // The plan: a shape uniform per depth, or a best tree's children list (then its
                // widest node per depth and node count as branching and max_nodes, as
                // tree_shape::from_children sets them).
                const auto shape = controller_->planned_shape();
                const auto children = controller_->planned_children();
                const tree_shape& run_shape = std::get<tree>(options_.step).shape;
                planned_tree_.branching.assign(shape.begin(), shape.end());
                planned_tree_.children.assign(children.begin(), children.end());
                planned_tree_.max_nodes = run_shape.max_nodes;
                if (!children.empty()) {
                    planned_tree_.max_nodes = 0;
                    for (const std::size_t k : children) planned_tree_.max_nodes += k;
                }
                planned_tree_.draws = run_shape.draws;
                settings_.planned = &planned_tree_;
                // A plan that is a chain (or a plain step) runs as a chain step when both models
                // can, at no more target calls than the tree's: the chain's draft, pass and block
                // verification, without the tree machinery (tree attention, the tree
                // verification core), so the planner's chains cost what a chain
                // configuration's steps cost. Verification is exact either way; only which
                // uniforms are drawn differs.
                if constexpr (detail::chains_as_chains<D, V>)
                    as_chain = detail::is_chain_shape(shape);
            }
            const std::size_t cap = as_chain ? std::get<tree>(options_.step).shape.max_nodes : 0;
            for (auto& it : items_) {
                const entry& e = *entries_[it.slot];
                it.gamma = std::min(planned, e.budget.max_new_tokens - e.generated - 1);
                if (as_chain) {
                    it.tree = false;
                    if (cap != 0) it.gamma = std::min(it.gamma, cap);
                }
            }
            // Ragged plans: each sequence's own draft length from its own acceptance so far; also
            // for a sequence left alone once the batch had several, since the controller's
            // estimates then hold the others' acceptance (a poorly drafted sequence left last
            // would otherwise draft as long as the batch's mean acceptance pays).
            if (!tree_ && planned > 0 && had_many_ && (adaptive.per_sequence || adaptive.drain)) {
                fill_ragged();
                ragged_gamma_.resize(items_.size());
                if (adaptive.per_sequence) controller_->plan_sequences(longest_, ragged_, ragged_gamma_, planned);
                else
                    for (std::size_t i = 0; i < items_.size(); ++i) ragged_gamma_[i] = items_[i].gamma;
                // A batch that drains (adaptive_gamma_options::drain): plain steps where they
                // are predicted to finish every sequence sooner than this plan.
                if (controller_->drain_to_plain(ragged_, ragged_gamma_)) {
                    planned = 0;
                    std::fill(ragged_gamma_.begin(), ragged_gamma_.end(), std::size_t{0});
                }
                for (std::size_t i = 0; i < items_.size(); ++i) items_[i].gamma = ragged_gamma_[i];
            }
        }
        for (auto& it : items_)
            *it.extras = detail::step_extras{.estimate_acceptance = estimate_ || (tree_ && !it.tree),
                                             .acceptance_as_sibling = tree_,
                                             .draft_stop_below = options_.draft.stop_below,
                                             .draft_sampling = settings_.draft_sampling};
        // Timed for a controller that measures costs, and for on_step's step_timing.
        detail::multi_timing timing{.time = (controller_ && controller_->measures_time()) || bool(options_.on_step)};
        const auto t0 = timing.time ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        const std::span<detail::multi_item<G>> items(items_);
        try {
            detail::multi_step(drafter_, verifier_, items, settings_, vocab_, ws_.multi(), executor, where, &timing);
        } catch (...) {
            // What the executor committed before it threw: settled, and observed (without the
            // step's times, which cover sequences that did not step).
            settle(items);
            if (controller_) observe(planned, first, detail::multi_timing{}, t0, items);
            throw;
        }
        settle(items);
        if (controller_) observe(planned, first, timing, t0, items);
        if (options_.on_step) {
            const double total = detail::seconds_since(t0);
            timing_ = step_timing{.start = t0,
                                  .draft_seconds = timing.draft_seconds,
                                  .target_seconds = timing.pass_seconds,
                                  .library_seconds = std::max(0.0, total - timing.draft_seconds - timing.pass_seconds)};
        }
        std::exception_ptr failed;
        for (const auto& it : items)
            if (it.error) {
                failed = it.error;
                break;
            }
        if (failed) {
            // The sequences that stepped still get their events (a stream stays in step with
            // generated()); then the failed sequence's exception, which wins over a callback's.
            try {
                notify(items);
            } catch (...) {
            }
            std::rethrow_exception(failed);
        }
        notify(items);
        return active();
    }
    /// One step on the built-in executor (the decoder's threads).
    std::size_t step() { return step(ws_); }

    /// Steps until no sequence is active (on `executor`, or the built-in one).
    template <BatchExecutor E>
    void run(E& executor) {
        while (step(executor) != 0) {
        }
    }
    /// Steps until no sequence is active, on the built-in executor (the decoder's threads).
    void run() { run(ws_); }

    /// The adaptive policy's controller (the caller's, or the decoder's own; null under the
    /// fixed policy).
    [[nodiscard]] const gamma_controller* controller() const noexcept { return controller_; }
    /// The options the decoder runs with.
    [[nodiscard]] const decode_options& options() const noexcept { return options_; }

private:
    struct entry {
        explicit entry(G g) : rng(std::move(g)) {}
        std::vector<token_id> sequence;  // prompt, then generated tokens
        std::size_t prompt = 0;
        std::size_t generated = 0;
        decode_budget budget;
        G rng;
        decode_stats stats;
        stop_reason stop = stop_reason::unfinished;
        bool done = false;
        step_workspace ws;
        std::unique_ptr<detail::tree_workspace> tws;  // tree steps only
        detail::step_extras extras;
    };

    // What the controller's per-sequence plans read of each sequence of items_.
    void fill_ragged() {
        ragged_.clear();
        for (const auto& it : items_) {
            const entry& e = *entries_[it.slot];
            ragged_.push_back({.expected = e.stats.expected_accepted_at_position,
                               .reached = e.stats.reached_at_position,
                               .limit = std::min(longest_, e.budget.max_new_tokens - e.generated - 1),
                               .remaining = e.budget.max_new_tokens - e.generated,
                               .sibling_expected = e.stats.expected_accepted_at_sibling,
                               .sibling_reached = e.stats.reached_at_sibling});
        }
    }

    /// Frees `id`'s slot; a settled event of the current step for it (take or remove from a
    /// callback) is not run, even when add() reuses the slot before notify() reaches it.
    void release(std::size_t id) {
        for (auto& it : items_)
            if (it.slot == id) it.settled = false;
        entries_[id].reset();
    }

    entry& at(std::size_t id, const char* fn) const {
        if (!contains(id))
            detail::fail_invalid("specdec::batch_decoder::", fn, ": id ", id, " is not a sequence of this batch");
        return *entries_[id];
    }

    /// Stop tokens, budgets and the length counts of the sequences that stepped.
    void settle(std::span<detail::multi_item<G>> items) {
        for (auto& it : items) {
            if (!it.stepped) continue;
            it.stepped = false;  // settled once
            entry& e = *entries_[it.slot];
            if (e.stats.steps_at_gamma.size() <= it.gamma) e.stats.steps_at_gamma.resize(it.gamma + 1, 0);
            ++e.stats.steps_at_gamma[it.gamma];
            const std::size_t fresh = it.tree ? it.tree_result.accepted + 1 : it.result.emitted();
            const bool stopped = detail::cut_at_stop(e.sequence, fresh, e.budget.stop_tokens);
            it.appended = e.sequence.size() - e.prompt - e.generated;
            it.settled = true;
            e.generated += it.appended;
            if (stopped) {
                e.stop = stop_reason::stop_token;
                e.done = true;
            } else if (e.generated >= e.budget.max_new_tokens) {
                e.stop = stop_reason::max_new_tokens;
                e.done = true;
            }
        }
    }

    /// on_step for each settled sequence, in id order; a callback that throws skips the rest
    /// (a callback may take or remove a sequence: its event is then skipped).
    void notify(std::span<detail::multi_item<G>> items) {
        for (auto& it : items) {
            if (!it.settled) continue;
            it.settled = false;
            const entry* e = entries_[it.slot].get();
            if (!options_.on_step || e == nullptr) continue;
            const auto emitted = std::span<const token_id>(e->sequence).last(it.appended);
            step_event ev{.sequence = it.slot, .gamma = it.gamma, .timing = timing_};
            ev.emitted = emitted;
            if (it.tree) {
                ev.draft = it.tws->accepted;
                ev.accepted = it.tree_result.accepted;
                ev.next_token = it.tree_result.next_token;
                ev.tree = &it.tws->tree;
                ev.last_node = it.tree_result.last_node;
                ev.sibling_acceptance = it.tree_result.sibling_acceptance;
                ev.target_passes = it.passes;
            } else {
                ev.draft = it.result.draft;
                ev.accepted = it.result.accepted;
                ev.next_token = it.result.next_token;
                ev.acceptance = it.result.acceptance;
                ev.target_passes = MultiSequenceVerifier<V> ? 1 : passes_of(it.result.draft.size());
            }
            options_.on_step(ev);
        }
    }

    std::size_t passes_of(std::size_t n) {
        if constexpr (Verifier<V>) return detail::score_calls(verifier_, n);
        else return 1;
    }

    /// Feeds the controller one observation for the whole batch: the step's length, the times
    /// of its draft phase and target pass, and per draft position (or tree depth) the mean of
    /// what the sequences that tested it measured (β for chains; for trees, whether the
    /// accepted path went on at that depth).
    void observe(std::size_t planned, bool first, const detail::multi_timing& timing,
                 std::chrono::steady_clock::time_point t0, std::span<const detail::multi_item<G>> items) {
        // Positions up to the longest draft of the step: a ragged plan may give a sequence more
        // than the batch's γ (plan_sequences() starts from gamma_max).
        std::size_t depth = planned;
        for (const auto& it : items)
            if (it.settled && !it.tree) depth = std::max(depth, it.result.draft.size());
        beta_sum_.assign(depth, 0.0);
        beta_count_.assign(depth, 0);
        std::size_t drafted = 0, emitted = 0, stepped = 0, positions = 0, calls = 0;
        bool tree_pass = false;
        sibling_sum_.clear();
        sibling_count_.clear();
        for (const auto& it : items) {
            if (!it.settled) continue;  // failed, or not run (an executor that threw)
            ++stepped;
            std::span<const float> seen;
            if (it.tree) {
                // A tree's draft calls (its model calls, else one per level) and its positions.
                const draft_tree& t = it.tws->tree;
                tree_pass = true;
                calls += t.model_calls != 0 ? t.model_calls : static_cast<std::size_t>(t.max_depth());
                positions += t.size() + 1;
                emitted += it.tree_result.accepted + 1;
                const auto ranks = it.tree_result.sibling_acceptance;
                if (sibling_sum_.size() < ranks.size()) {
                    sibling_sum_.resize(ranks.size(), 0.0);
                    sibling_count_.resize(ranks.size(), 0);
                }
                for (std::size_t k = 0; k < ranks.size(); ++k) {
                    sibling_sum_[k] += ranks[k];
                    ++sibling_count_[k];
                }
            } else {
                positions += it.result.draft.size() + 1;
                drafted = std::max(drafted, it.result.draft.size());
                calls += it.result.draft.size();
                emitted += it.result.emitted();
                seen = it.result.acceptance;
                if (tree_ && !seen.empty()) {
                    // A tree planner's chain step: β at position 1 is a_1, the first child's
                    // acceptance at the root (tree_verify_result::sibling_acceptance[0]).
                    if (sibling_sum_.empty()) {
                        sibling_sum_.resize(1, 0.0);
                        sibling_count_.resize(1, 0);
                    }
                    sibling_sum_[0] += seen[0];
                    ++sibling_count_[0];
                }
            }
            for (std::size_t i = 0; i < seen.size() && i < depth; ++i) {
                beta_sum_[i] += seen[i];
                ++beta_count_[i];
            }
        }
        if (stepped == 0) return;
        // The draft calls the step's time is divided by. Trees are drafted one sequence at a
        // time, and so are a tree planner's chain plans without draft_batch: the tree planner
        // charges such a step B times one sequence's calls (tree_plan_limits::
        // drafts_per_sequence), so its draft token's time is one sequence's, the step's time over
        // every sequence's calls. A chain controller charges a step γ calls of the whole batch
        // (one call per position, batched or not): its time over the longest draft.
        if (tree_pass || (controller_->plans_trees() && !MultiSequenceDrafter<D>)) drafted = calls;
        mean_beta_.clear();
        for (std::size_t i = 0; i < depth && beta_count_[i] != 0; ++i)
            mean_beta_.push_back(static_cast<float>(beta_sum_[i] / static_cast<double>(beta_count_[i])));
        mean_sibling_.clear();
        for (std::size_t k = 0; k < sibling_sum_.size() && sibling_count_[k] != 0; ++k)
            mean_sibling_.push_back(static_cast<float>(sibling_sum_[k] / static_cast<double>(sibling_count_[k])));
        gamma_controller::step_observation o{.gamma = planned, .drafted = drafted,
                                             .emitted = (emitted + stepped / 2) / stepped, .acceptance = mean_beta_};
        o.positions = positions;  // the pass's, over the batch
        o.tree_pass = tree_pass;
        o.sibling_acceptance = mean_sibling_;
        o.first = first;
        if (timing.time) {
            o.draft_seconds = timing.draft_seconds;
            o.pass_seconds = timing.pass_seconds;
            o.step_seconds = detail::seconds_since(t0);
        }
        controller_->observe(o);
    }

    /// The constructor's `threads`, refused by the user's call's name when 0.
    static std::size_t checked_threads(std::size_t threads, const detail::entry_point& names) {
        if (threads == 0) detail::fail_invalid(names.construct, ": threads = 0 must be >= 1 (1: the calling thread alone)");
        return threads;
    }

    D& drafter_;
    V& verifier_;
    decode_options options_;
    batch_workspace ws_;
    detail::entry_point where_;
    std::ptrdiff_t vocab_ = 0;
    bool tree_ = false;
    bool had_many_ = false;  // a step has held several sequences (ragged plans)
    bool stepping_ = false;  // step() is running (a re-entrant call is refused)
    bool estimate_ = false;
    std::size_t longest_ = 0;  // the chain's γ or the tree's depth
    detail::step_settings settings_;
    std::optional<gamma_controller> own_controller_;
    gamma_controller* controller_ = nullptr;
    std::vector<std::unique_ptr<entry>> entries_;  // by id; null: free
    std::vector<detail::multi_item<G>> items_;
    std::vector<double> beta_sum_;
    std::vector<std::size_t> beta_count_;
    std::vector<float> mean_beta_;
    std::vector<double> sibling_sum_;
    std::vector<std::size_t> sibling_count_;
    std::vector<float> mean_sibling_;
    tree_shape planned_tree_{};  // the tree planner's tree for the step
    step_timing timing_{};                         // the last step's, for on_step
    std::vector<gamma_controller::sequence_acceptance> ragged_;  // plan_sequences' input
    std::vector<std::size_t> ragged_gamma_;                      // and its output
};

/// A batch_decoder whose sequences use generators of type G:
/// `auto dec = specdec::make_batch_decoder<std::minstd_rand>(draft, target, options);`
template <class G, class D, class V>
batch_decoder<D, V, G> make_batch_decoder(D& drafter, V& verifier, decode_options options = {},
                                          std::size_t threads = 1) {
    return batch_decoder<D, V, G>(drafter, verifier, std::move(options), threads);
}

}  // namespace specdec
