#pragma once
/// \file
/// measure_engine_profile(): the documented routine that measures an engine_profile once, for a
/// drafter and a verifier of one sequence, through the calls a decoding step makes (the same
/// adapters, the same workspaces), so that the adaptive policy can plan from the first step and
/// reproducibly (adaptive_gamma_options::profile). Store the result with to_text() and load it
/// with parse_engine_profile() for later runs of the same pair on the same machine.
///
/// measure_batch_profile(): the same for multi-sequence adapters (a MultiSequenceDrafter and a
/// MultiSequenceVerifier, as batch_decoder runs them): the pass's cost by the positions of all
/// sequences together, and the draft's by the number of sequences.
///
/// Timings depend on the machine and on what else runs on it: each entry is the median of
/// several calls, but a profile measured on a busy machine plans for a busy machine.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <random>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "diagnostics.hpp"
#include "engine_profile.hpp"
#include "multi_sequence.hpp"
#include "sampling.hpp"
#include "speculative_step.hpp"
#include "tree.hpp"

namespace specdec {

namespace detail {

/// The median of `v` (reordered).
inline double median_of(std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
}

/// A clock too coarse for the first pass measures 0 for it: then the smallest positive time
/// measured (or 1 ns), so that the profile is valid.
inline void floor_first_pass(engine_profile& p) {
    if (p.target_pass[0] > 0.0) return;
    double smallest = 0.0;
    for (const double t : p.target_pass)
        if (t > 0.0 && (smallest == 0.0 || t < smallest)) smallest = t;
    p.target_pass[0] = smallest > 0.0 ? smallest : 1e-9;
    if (!p.tree_pass.empty() && !(p.tree_pass[0] > 0.0)) p.tree_pass[0] = p.target_pass[0];
}

/// The tree a tree pass over `nodes` + 1 positions is timed on: two branches below the root,
/// grown in turn (node i on branch i mod 2 at depth i / 2 + 1), with the drafted `tokens` on the
/// first branch and the next token ids on the second: the kind of tree the planner chooses
/// (a few children at the root, then chains), at the node count that sets a pass's cost.
inline void profile_tree(draft_tree& tree, std::span<const token_id> tokens, std::size_t nodes, std::ptrdiff_t vocab) {
    tree.clear();
    for (std::size_t i = 0; i < nodes; ++i) {
        const std::size_t branch = i % 2, depth = i / 2;
        const token_id t = tokens[depth % tokens.size()];
        const auto token = static_cast<token_id>(branch == 0 ? t : (static_cast<std::ptrdiff_t>(t) + 1) % vocab);
        tree.add(depth == 0 ? -1 : static_cast<std::int32_t>(i - 2), token);
    }
}

/// The points at which measure_batch_profile() times passes, and both routines catch-up: 1, 2,
/// 3, then 4, 6, 8, 12, 16, 24, ... below max_positions, then max_positions.
inline std::vector<std::size_t> profile_grid(std::size_t max_positions) {
    std::vector<std::size_t> grid;
    for (std::size_t m = 1; m <= 3 && m < max_positions; ++m) grid.push_back(m);
    for (std::size_t m = 4; m < max_positions; m *= 2) {
        grid.push_back(m);
        if (m + m / 2 < max_positions) grid.push_back(m + m / 2);
    }
    grid.push_back(max_positions);
    return grid;
}

/// Fills table[m − 1] for m = 1 .. grid.back() from the times at the grid's points, linearly
/// between them.
inline void fill_from_grid(std::vector<double>& table, const std::vector<std::size_t>& grid,
                           const std::vector<double>& at_grid) {
    table.clear();
    for (std::size_t total = 1, hi = 0; total <= grid.back(); ++total) {
        while (grid[hi] < total) ++hi;
        if (grid[hi] == total) {
            table.push_back(at_grid[hi]);
            continue;
        }
        const double f = static_cast<double>(total - grid[hi - 1]) / static_cast<double>(grid[hi] - grid[hi - 1]);
        table.push_back(at_grid[hi - 1] + f * (at_grid[hi] - at_grid[hi - 1]));
    }
}


/// Fills `table` from the first `kept` points of `grid` (each the median of its times), linearly
/// between them; empty when none is kept.
inline void fill_kept(std::vector<double>& table, std::vector<std::size_t> grid,
                      std::vector<std::vector<double>>& times, std::size_t kept) {
    table.clear();
    if (kept == 0) return;
    grid.resize(kept);
    std::vector<double> at_grid;
    for (std::size_t g = 0; g < kept; ++g) at_grid.push_back(median_of(times[g]));
    fill_from_grid(table, grid, at_grid);
}

}  // namespace detail

/// What measure_engine_profile() measures.
struct profile_measurement {
    /// Target passes over 1 .. max_positions positions are timed (one sequence's γ + 1; the
    /// profile extends beyond along the last slope). \pre >= 2.
    std::size_t max_positions = 9;
    /// Each entry is the median of this many timed calls, timed in rounds (one call at each
    /// point in turn, after one untimed call); a median discards a call that a slow spell of the
    /// machine delayed from 3 on. \pre >= 1.
    std::size_t repeats = 7;
    /// The draft's sampling settings for the measured drafts.
    sampling_config sampling{};
    /// Seed of the draws of the measured drafts (their tokens are what the target then scores).
    std::uint64_t seed = 1;
    /// The draft model's catch-up is timed for n = 1 .. catch_up_tokens tokens it has not read
    /// (draft_catch_up's entries), at 1, 2, 3, 4, 6, 8, 12, 16, 24, ... and catch_up_tokens, linear
    /// between: after L plain steps the draft model has L + 1 tokens to read, and the planner
    /// explores every 16 to 256 steps. 0 leaves the table empty (the planner then charges a draft
    /// step per missed token). The context must leave room for catch_up_tokens + 1 more tokens in
    /// the draft model's window: what an adapter throws at its window propagates.
    /// \pre <= 2^20 (a profile table's largest size).
    std::size_t catch_up_tokens = 64;
};

/// Measures what the pair costs on this machine, at `context` (a prompt of realistic length:
/// attention's cost grows with it):
/// - draft_step[0]: a draft of max_positions − 1 tokens, timed as one call, divided by its
///   tokens (so a drafter's per-call overhead is spread over them, as in a long step); each
///   timed call follows a target pass, as a draft does in decoding (not timed warm);
/// - target_pass[m − 1] for m = 1 .. 1 + the tokens of that draft (max_positions when it
///   drafted them all): the verifier scoring `context` plus the first m − 1 of them, as a step
///   does (a KV-cached engine rolls back to
///   `context` between calls, so each call runs m new positions);
/// - tree_pass[m − 1], when the verifier has score_tree (a TreeVerifier): score_tree over a tree
///   of m − 1 nodes in two branches below the root, made of those draft tokens;
/// - draft_catch_up[n − 1] for n = 1 .. catch_up_tokens: a draft of one token at `context`
///   plus n of those draft tokens (repeated when n needs more of them), timed at the points of
///   profile_measurement::catch_up_tokens and linear between, each timed call after an untimed
///   draft of one token at `context` alone (so that a KV-cached drafter holds `context` and must
///   read the n tokens: what it does after plain steps) and a target pass (as a draft step is
///   timed); the table ends at the last point before the first at which the drafter proposes no
///   token (a context window reached, a lookup that answers without the model), so that no
///   entry times a call that drafted nothing.
/// Each table is timed in rounds, one call at each point in turn, and each entry is its point's
/// median (see measure_batch_profile).
/// The models' caches end holding a prefix of `context` plus some draft tokens; a decoding
/// call afterwards rolls them back as any step does.
/// \throws std::invalid_argument for an empty context, max_positions < 2, max_positions or
///         catch_up_tokens above 2^20, repeats = 0, bad
///         sampling settings, or a drafter that proposes no tokens at this context (nothing to
///         time); what the adapters throw propagates.
template <Drafter D, Verifier V>
engine_profile measure_engine_profile(D& drafter, V& verifier, std::span<const token_id> context,
                                      const profile_measurement& m = {}) {
    constexpr const char* where = "specdec::measure_engine_profile";
    if (context.empty()) detail::fail_invalid(where, ": the context is empty; pass a prompt (BOS at least)");
    if (m.max_positions < 2)
        detail::fail_invalid(where, ": max_positions = ", m.max_positions, "; at least 2 (a draft token and the bonus)");
    if (m.max_positions > detail::max_profile_entries || m.catch_up_tokens > detail::max_profile_entries)
        detail::fail_invalid(where, ": max_positions = ", m.max_positions, ", catch_up_tokens = ", m.catch_up_tokens,
                             "; a profile table holds at most ", detail::max_profile_entries, " entries");
    if (m.repeats == 0) detail::fail_invalid(where, ": repeats = 0; at least 1 is needed");
    validate(m.sampling, where);
    const std::ptrdiff_t vocab = detail::checked_vocab(drafter, verifier, where);
    detail::check_token_range(context, vocab, where, "the context");

    using clock = std::chrono::steady_clock;
    step_workspace ws;
    std::mt19937_64 rng(m.seed);
    const std::size_t gamma = m.max_positions - 1;
    std::vector<double> times;

    // The draft: one untimed call (the draft model reads the prompt), then `repeats` timed ones,
    // each after a target pass (as in decoding: see measure_batch_profile).
    std::vector<token_id> tokens;
    for (std::size_t r = 0; r <= m.repeats; ++r) {
        detail::run_verifier(verifier, context, std::span<const token_id>{}, ws, vocab, where);
        uniform_source uniforms(rng);
        detail::begin_draft(ws.draft, nullptr);
        const auto t0 = clock::now();
        detail::run_drafter(drafter, context, gamma, m.sampling, uniforms, ws, where);
        const double s = detail::seconds_since(t0);
        const std::size_t n = detail::check_draft(ws.draft, gamma, vocab, where);
        if (n == 0)
            detail::fail_invalid(where, ": the drafter proposed no tokens at this context; measure at a context "
                                        "where it drafts");
        if (r == 0) {
            tokens = ws.draft.tokens;
            continue;
        }
        times.push_back(s / static_cast<double>(n));
    }
    engine_profile p;
    p.draft_step = {detail::median_of(times)};

    // Catching up on n tokens the draft model has not read, at the points of catch_up_tokens.
    // Each table below is timed in rounds, each point once per round, so that a slow spell of
    // the machine costs one call at several points, which their medians discard (see
    // measure_batch_profile); `kept` drops the first point whose call drafted nothing, and those
    // above it.
    std::vector<std::size_t> catch_up_grid;
    if (m.catch_up_tokens > 0) catch_up_grid = detail::profile_grid(m.catch_up_tokens);
    std::vector<token_id> grown;
    std::size_t kept = catch_up_grid.size();
    std::vector<std::vector<double>> at_point(kept);
    for (std::size_t r = 0; r < m.repeats; ++r)
        for (std::size_t g = 0; g < kept; ++g) {
            grown.assign(context.begin(), context.end());
            for (std::size_t j = 0; j < catch_up_grid[g]; ++j) grown.push_back(tokens[j % tokens.size()]);
            uniform_source uniforms(rng);
            detail::begin_draft(ws.draft, nullptr);
            detail::run_drafter(drafter, context, 1, m.sampling, uniforms, ws, where);  // back to `context`
            detail::run_verifier(verifier, context, std::span<const token_id>{}, ws, vocab, where);
            detail::begin_draft(ws.draft, nullptr);
            const auto t0 = clock::now();
            detail::run_drafter(drafter, std::span<const token_id>(grown), 1, m.sampling, uniforms, ws, where);
            const double s = detail::seconds_since(t0);
            if (detail::check_draft(ws.draft, 1, vocab, where) != 0)
                at_point[g].push_back(s);
            else
                kept = g;
        }
    detail::fill_kept(p.draft_catch_up, catch_up_grid, at_point, kept);

    // The target passes, over 1 .. 1 + tokens.size() positions (one untimed call first).
    const std::span<const token_id> draft(tokens);
    detail::run_verifier(verifier, context, draft.first(0), ws, vocab, where);
    at_point.assign(draft.size() + 1, {});
    for (std::size_t r = 0; r < m.repeats; ++r)
        for (std::size_t k = 0; k <= draft.size(); ++k) {
            const auto t0 = clock::now();
            detail::run_verifier(verifier, context, draft.first(k), ws, vocab, where);
            at_point[k].push_back(detail::seconds_since(t0));
        }
    for (auto& t : at_point) p.target_pass.push_back(detail::median_of(t));
    if constexpr (TreeVerifier<V>) {
        // Tree passes over 1 .. max_positions positions (one untimed call first).
        std::vector<draft_tree> trees(draft.size() + 1);
        for (std::size_t k = 0; k <= draft.size(); ++k) detail::profile_tree(trees[k], draft, k, vocab);
        Eigen::MatrixXf scores;
        at_point.assign(draft.size() + 1, {});
        for (std::size_t r = 0; r <= m.repeats; ++r)
            for (std::size_t k = 0; k <= draft.size(); ++k) {
                if (r == 0 && k > 0) continue;  // (only the very first call is not timed)
                const auto t0 = clock::now();
                verifier.score_tree(context, std::as_const(trees[k]), scores);
                const double s = detail::seconds_since(t0);
                if (scores.rows() != vocab || scores.cols() != static_cast<Eigen::Index>(k + 1))
                    detail::fail_invalid(where, ": score_tree returned ", scores.rows(), " x ", scores.cols(),
                                         "; expected vocab_size x (nodes + 1) = ", vocab, " x ", k + 1);
                if (r > 0) at_point[k].push_back(s);
            }
        for (auto& t : at_point) p.tree_pass.push_back(detail::median_of(t));
    }
    detail::floor_first_pass(p);
    validate(p, where);
    return p;
}

/// Chosen only when the drafter or the verifier misses a requirement: reports which one, and
/// the fix, in a static_assert (see diagnostics.hpp), as speculative_decode does.
template <class D, class V>
engine_profile measure_engine_profile(D&, V&, std::span<const token_id>, const profile_measurement& = {}) {
    detail::reject_speculative_call<D, V, std::mt19937_64>();
    return {};
}

/// What measure_batch_profile() measures.
struct batch_profile_measurement {
    /// Target passes are timed over m positions in total (each sequence's draft + 1, summed) at
    /// m = 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... (the points double, with one between) up to
    /// max_positions, which is timed too; the profile is linear between them. \pre >= 1.
    std::size_t max_positions = 64;
    /// Draft calls are timed for n = 1 .. max_sequences sequences (draft_step's entries); a timed
    /// pass holds min(m, max_sequences) sequences, its m positions spread as evenly as possible.
    /// \pre >= 1.
    std::size_t max_sequences = 8;
    /// Tokens each sequence is asked to draft in a timed draft call; the entry is the call's time
    /// divided by the most tokens one sequence drafted. \pre >= 1.
    std::size_t draft_tokens = 4;
    /// Each entry is the median of this many timed calls, timed in rounds (one call at each
    /// point in turn: see measure_batch_profile); a median discards a call that a slow spell of
    /// the machine delayed from 3 on. \pre >= 1.
    std::size_t repeats = 3;
    /// The draft's sampling settings for the measured drafts.
    sampling_config sampling{};
    /// Seed of sequence i's draws is seed + i.
    std::uint64_t seed = 1;
    /// The draft model's catch-up is timed for n = 1 .. catch_up_tokens tokens it has not read
    /// (draft_catch_up's entries), at 1, 2, 3, 4, 6, 8, 12, 16, 24, ... and catch_up_tokens,
    /// linear between: after L plain steps the draft model has L + 1 tokens to read, and the
    /// planner explores every 16 to 256 steps. 0 leaves the table empty (the planner then
    /// charges a draft step per missed token). The contexts must leave room for catch_up_tokens
    /// + 1 more tokens in the draft model's window: what an adapter throws at its window
    /// propagates. \pre <= 2^20 (a profile table's largest size).
    std::size_t catch_up_tokens = 64;
};


/// Measures what a multi-sequence pair costs on this machine, through the calls batch_decoder
/// makes (draft_batch, score_batch), for sequences whose contexts are `contexts` (sequence i
/// uses contexts[i % contexts.size()] and slot i; prompts of realistic length: attention's cost
/// grows with them):
/// - draft_step[n − 1] for n = 1 .. max_sequences: one draft_batch call for n sequences of
///   draft_tokens tokens each, divided by the most tokens a sequence drafted; each timed call
///   follows a score_batch pass over the same sequences, as a draft does in decoding;
/// - target_pass[m − 1] for m = 1 .. max_positions: one score_batch call over m positions in
///   total (see batch_profile_measurement), the drafts being the tokens the drafter proposed for
///   each sequence (repeated when a pass needs more of them); timed at the grid points, linear
///   between them;
/// - tree_pass[m − 1], when the verifier has score_tree_batch (a MultiSequenceTreeVerifier): one
///   score_tree_batch call over m positions in total, spread as above, each sequence's tree of
///   its positions − 1 nodes in two branches below the root; timed at the same points.
/// - draft_catch_up[n − 1] for n = 1 .. catch_up_tokens: one draft_batch call for sequence 0
///   alone, drafting one token at its context plus n of the drafted tokens (repeated when n
///   needs more of them), timed at the points of catch_up_tokens, linear between, each timed
///   call after an untimed one-token draft at the context alone (so that a KV-cached drafter
///   holds the context and must read the n tokens: what it does after plain steps) and a target
///   pass (as a draft step is timed); the table ends at the last point before the first at which
///   the drafter proposes no token, as measure_engine_profile's does. The planner charges S
///   sequences S times one's catch-up (engine_profile::catch_up_cost).
/// Each table is timed in rounds: a first untimed call at each point, then `repeats` rounds that
/// time one call at each point in turn; each entry is its point's median. A timed call follows
/// an untimed one for the same sequences whenever the call before held others (an engine may
/// release the state of a sequence a call leaves out and read its context again when it
/// returns), and each timed draft call follows a pass, as in decoding.
/// Costs in seconds of wall-clock time (steady_clock). The models' caches end holding some of
/// these drafts; a decoding call afterwards rolls them back as any step does.
/// \throws std::invalid_argument for no context, an empty context or a token out of range, a
///         setting below its minimum or above 2^20 (max_positions, catch_up_tokens), models of different vocabularies, bad sampling settings,
///         a drafter that proposes no tokens, or a malformed draft block or packed layout (the
///         adapters' own bugs, named); what the adapters throw propagates.
template <MultiSequenceDrafter D, MultiSequenceVerifier V>
engine_profile measure_batch_profile(D& drafter, V& verifier, std::span<const std::vector<token_id>> contexts,
                                     const batch_profile_measurement& m = {}) {
    constexpr const char* where = "specdec::measure_batch_profile";
    if (contexts.empty()) detail::fail_invalid(where, ": no context; pass at least one prompt (BOS at least)");
    if (m.max_positions < 1 || m.max_sequences < 1 || m.draft_tokens < 1 || m.repeats < 1)
        detail::fail_invalid(where, ": max_positions = ", m.max_positions, ", max_sequences = ", m.max_sequences,
                             ", draft_tokens = ", m.draft_tokens, ", repeats = ", m.repeats, "; each must be at least 1");
    if (m.max_positions > detail::max_profile_entries || m.catch_up_tokens > detail::max_profile_entries)
        detail::fail_invalid(where, ": max_positions = ", m.max_positions, ", catch_up_tokens = ", m.catch_up_tokens,
                             "; a profile table holds at most ", detail::max_profile_entries, " entries");
    validate(m.sampling, where);
    const std::ptrdiff_t vocab = detail::checked_vocab(drafter, verifier, where);
    for (const auto& c : contexts) {
        if (c.empty()) detail::fail_invalid(where, ": a context is empty; pass a prompt (BOS at least)");
        detail::check_token_range(c, vocab, where, "a context");
    }
    using clock = std::chrono::steady_clock;
    const std::size_t most = m.max_sequences;
    const auto context_of = [&](std::size_t i) { return std::span<const token_id>(contexts[i % contexts.size()]); };
    std::vector<draft_block> blocks(most);
    std::vector<std::mt19937_64> gens;
    for (std::size_t i = 0; i < most; ++i) gens.emplace_back(m.seed + i);
    std::vector<draft_request> drafts;
    engine_profile p;

    // Drafts: for n sequences, a first untimed call, then `repeats` timed ones, each after a
    // target pass over the same sequences (one position each), as in decoding, where every draft
    // call follows a pass: a large target evicts the draft's weights from the caches, and a draft
    // timed back to back with itself would be timed warm.
    std::vector<std::vector<token_id>> proposed(most);
    std::vector<score_request> requests;
    packed_logits out;
    const auto pass_before = [&](std::size_t n) {
        requests.clear();
        for (std::size_t i = 0; i < n; ++i) requests.push_back({i, context_of(i), {}});
        const std::span<const score_request> batch(requests);
        out.shape(static_cast<Eigen::Index>(vocab), batch);
        verifier.score_batch(batch, out);
    };
    // (Rounds over n = 1 .. most, the first untimed, each point timed once per round, after an
    // untimed draft for the same sequences and a pass where the call before held others, i.e.
    // whenever most > 1: see the passes below.)
    std::vector<std::vector<double>> draft_times(most);
    const auto draft_for = [&](std::size_t n) {
        drafts.clear();
        for (std::size_t i = 0; i < n; ++i) {
            blocks[i].clear();
            drafts.push_back({i, context_of(i), m.draft_tokens, uniform_source(gens[i]), &blocks[i]});
        }
        const auto t0 = clock::now();
        drafter.draft_batch(std::span<draft_request>(drafts), m.sampling);
        const double s = detail::seconds_since(t0);
        std::size_t longest = 0;
        for (std::size_t i = 0; i < n; ++i)
            longest = std::max(longest, detail::check_draft(blocks[i], m.draft_tokens, vocab, where));
        if (longest == 0)
            detail::fail_invalid(where, ": the drafter proposed no tokens for ", n,
                                 " sequences; measure at contexts where it drafts");
        return s / static_cast<double>(longest);
    };
    for (std::size_t r = 0; r <= m.repeats; ++r)
        for (std::size_t n = 1; n <= most; ++n) {
            if (r > 0 && most > 1) {  // the sequences of the call before were others
                pass_before(n);
                (void)draft_for(n);
            }
            pass_before(n);
            const double s = draft_for(n);
            if (n == most && r == 0)
                for (std::size_t i = 0; i < n; ++i) proposed[i] = blocks[i].tokens;
            if (r > 0) draft_times[n - 1].push_back(s);
        }
    for (auto& t : draft_times) p.draft_step.push_back(detail::median_of(t));
    // A sequence that proposed nothing scores another's tokens (the pass's cost is in its positions).
    for (auto& t : proposed)
        if (t.empty())
            for (const auto& other : proposed)
                if (!other.empty()) t = other;

    // Target passes at the grid points: one untimed call at each, then `repeats` rounds, each
    // timing one call at every point in turn, after an untimed one at that point whenever the
    // pass before held another number of sequences (an engine may release the state of a
    // sequence a pass leaves out and read its context again when it returns: timed, that would
    // be a prefill). Interleaved, so that on a shared machine a slow spell of a second or two
    // costs one call at several points, which their medians discard, where timing each point's
    // calls back to back let it raise a run of neighbouring points and bend the curve the
    // planner reads (measured on the 110M/15M llama2 batch engine: one profile in six had its
    // 6-16 position passes 10-30% above the others', and planned plain steps where speculation
    // paid 1.3x).
    const std::vector<std::size_t> grid = detail::profile_grid(m.max_positions);
    // Each grid point: `total` positions spread over min(total, most) sequences, sequence i
    // given `positions` (its draft or tree + 1) by add(i, positions).
    const auto time_grid = [&](auto& batch_requests, auto add, auto pass, const char* call) {
        using request = typename std::decay_t<decltype(batch_requests)>::value_type;
        const auto requests_at = [&](std::size_t total) {
            const std::size_t k = std::min(total, most);
            batch_requests.clear();
            for (std::size_t i = 0; i < k; ++i) add(i, total / k + (i < total % k ? 1 : 0));
            const std::span<const request> batch(batch_requests);
            out.shape(static_cast<Eigen::Index>(vocab), batch);
            return batch;
        };
        for (const std::size_t total : grid) {  // the untimed calls, whose layouts are checked
            const auto batch = requests_at(total);
            pass(batch);
            detail::check_packed_layout(out, batch, static_cast<Eigen::Index>(vocab), where, call);
        }
        std::vector<std::vector<double>> at_point(grid.size());
        std::size_t held = std::min(grid.back(), most);  // sequences of the pass before
        for (std::size_t r = 0; r < m.repeats; ++r)
            for (std::size_t g = 0; g < grid.size(); ++g) {
                const auto batch = requests_at(grid[g]);
                if (batch.size() != held) pass(batch);  // (untimed: sequences join or leave)
                held = batch.size();
                const auto t0 = clock::now();
                pass(batch);
                at_point[g].push_back(detail::seconds_since(t0));
            }
        std::vector<double> at_grid;
        for (auto& t : at_point) at_grid.push_back(detail::median_of(t));
        return at_grid;
    };
    std::vector<std::vector<token_id>> scored(most);
    const auto chain_times = time_grid(
        requests,
        [&](std::size_t i, std::size_t positions) {
            scored[i].clear();
            for (std::size_t j = 0; j + 1 < positions; ++j) scored[i].push_back(proposed[i][j % proposed[i].size()]);
            requests.push_back({i, context_of(i), scored[i]});
        },
        [&](std::span<const score_request> batch) { verifier.score_batch(batch, out); }, "score_batch");
    detail::fill_from_grid(p.target_pass, grid, chain_times);
    if constexpr (MultiSequenceTreeVerifier<V>) {
        // Tree passes at the same grid points, on trees of two branches.
        std::vector<draft_tree> trees(most);
        std::vector<tree_score_request> tree_requests;
        const auto tree_times = time_grid(
            tree_requests,
            [&](std::size_t i, std::size_t positions) {
                detail::profile_tree(trees[i], proposed[i], positions - 1, vocab);
                tree_requests.push_back({i, context_of(i), &trees[i]});
            },
            [&](std::span<const tree_score_request> batch) { verifier.score_tree_batch(batch, out); },
            "score_tree_batch");
        detail::fill_from_grid(p.tree_pass, grid, tree_times);
    }

    // Catching up on n tokens the draft model has not read, at the points of catch_up_tokens,
    // for sequence 0 (its drafted tokens, repeated when n needs more of them).
    const std::span<const token_id> start = context_of(0);
    std::vector<token_id> grown;
    const auto draft_one = [&](std::span<const token_id> context, double* seconds) {
        blocks[0].clear();
        drafts.clear();
        drafts.push_back({0, context, 1, uniform_source(gens[0]), &blocks[0]});
        const auto t0 = clock::now();
        drafter.draft_batch(std::span<draft_request>(drafts), m.sampling);
        if (seconds) *seconds = detail::seconds_since(t0);
        return detail::check_draft(blocks[0], 1, vocab, where) != 0;
    };
    // (Rounds over the points, each timed once per round; `kept` drops the first point whose
    // call drafted nothing, and every point above it.)
    std::vector<std::size_t> catch_up_grid;
    if (m.catch_up_tokens > 0) catch_up_grid = detail::profile_grid(m.catch_up_tokens);
    std::size_t kept = catch_up_grid.size();
    std::vector<std::vector<double>> catch_up_times(kept);
    for (std::size_t r = 0; r < m.repeats; ++r)
        for (std::size_t g = 0; g < kept; ++g) {
            grown.assign(start.begin(), start.end());
            for (std::size_t j = 0; j < catch_up_grid[g]; ++j) grown.push_back(proposed[0][j % proposed[0].size()]);
            (void)draft_one(start, nullptr);  // back to the context alone
            pass_before(1);
            double s = 0;
            if (draft_one(grown, &s))
                catch_up_times[g].push_back(s);
            else
                kept = g;
        }
    detail::fill_kept(p.draft_catch_up, catch_up_grid, catch_up_times, kept);
    detail::floor_first_pass(p);
    validate(p, where);
    return p;
}

/// Chosen only when the drafter or the verifier is not a multi-sequence adapter: reports which
/// one, and the fix, in a static_assert (see diagnostics.hpp).
template <class D, class V>
engine_profile measure_batch_profile(D&, V&, std::span<const std::vector<token_id>>,
                                     const batch_profile_measurement& = {}) {
    static_assert(detail::diagnose_decoder_drafter<D>() || detail::diagnose_decoder_verifier<V>() ||
                      (MultiSequenceDrafter<D> && MultiSequenceVerifier<V>),
                  "specdec::measure_batch_profile times multi-sequence calls: the drafter must be a "
                  "MultiSequenceDrafter (draft_batch) and the verifier a MultiSequenceVerifier (score_batch); for "
                  "one sequence's adapters, use measure_engine_profile");
    return {};
}

}  // namespace specdec
