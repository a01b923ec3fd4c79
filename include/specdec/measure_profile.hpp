#pragma once
/// \file
/// measure_engine_profile(): the documented routine that measures an engine_profile once, for a
/// drafter and a verifier of one sequence, through the calls a decoding step makes (the same
/// adapters, the same workspaces), so that the adaptive policy can plan from the first step and
/// reproducibly (adaptive_gamma_options::profile). Store the result with to_text() and load it
/// with parse_engine_profile() for later runs of the same pair on the same machine.
///
/// Timings depend on the machine and on what else runs on it: each entry is the median of
/// several calls, but a profile measured on a busy machine plans for a busy machine.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <random>
#include <span>
#include <vector>

#include "diagnostics.hpp"
#include "engine_profile.hpp"
#include "sampling.hpp"
#include "speculative_step.hpp"

namespace specdec {

/// What measure_engine_profile() measures.
struct profile_measurement {
    /// Target passes over 1 .. max_positions positions are timed (one sequence's γ + 1; the
    /// profile extends beyond along the last slope). \pre >= 2.
    std::size_t max_positions = 9;
    /// Each entry is the median of this many timed calls (after one untimed call). \pre >= 1.
    std::size_t repeats = 7;
    /// The draft's sampling settings for the measured drafts.
    sampling_config sampling{};
    /// Seed of the draws of the measured drafts (their tokens are what the target then scores).
    std::uint64_t seed = 1;
};

/// Measures what the pair costs on this machine, at `context` (a prompt of realistic length:
/// attention's cost grows with it):
/// - draft_step[0]: a draft of max_positions − 1 tokens, timed as one call, divided by its
///   tokens (so a drafter's per-call overhead is spread over them, as in a long step);
/// - target_pass[m − 1] for m = 1 .. max_positions: the verifier scoring `context` plus the
///   first m − 1 of those draft tokens, as a step does (a KV-cached engine rolls back to
///   `context` between calls, so each call runs m new positions).
/// The models' caches end holding a prefix of `context` plus some draft tokens; a decoding
/// call afterwards rolls them back as any step does.
/// \throws std::invalid_argument for an empty context, max_positions < 2, repeats = 0, bad
///         sampling settings, or a drafter that proposes no tokens at this context (nothing to
///         time); what the adapters throw propagates.
template <Drafter D, Verifier V>
engine_profile measure_engine_profile(D& drafter, V& verifier, std::span<const token_id> context,
                                      const profile_measurement& m = {}) {
    constexpr const char* where = "specdec::measure_engine_profile";
    if (context.empty()) detail::fail_invalid(where, ": the context is empty; pass a prompt (BOS at least)");
    if (m.max_positions < 2)
        detail::fail_invalid(where, ": max_positions = ", m.max_positions, "; at least 2 (a draft token and the bonus)");
    if (m.repeats == 0) detail::fail_invalid(where, ": repeats = 0; at least 1 is needed");
    validate(m.sampling, where);
    const std::ptrdiff_t vocab = detail::checked_vocab(drafter, verifier, where);
    detail::check_token_range(context, vocab, where, "the context");

    using clock = std::chrono::steady_clock;
    const auto median = [](std::vector<double>& v) {
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
        return v[v.size() / 2];
    };
    step_workspace ws;
    std::mt19937_64 rng(m.seed);
    const std::size_t gamma = m.max_positions - 1;
    std::vector<double> times;

    // The draft: one untimed call (the draft model reads the prompt), then `repeats` timed ones.
    std::vector<token_id> tokens;
    for (std::size_t r = 0; r <= m.repeats; ++r) {
        uniform_source uniforms(rng);
        detail::begin_draft(ws.draft, nullptr);
        const auto t0 = clock::now();
        detail::run_drafter(drafter, context, gamma, m.sampling, uniforms, ws);
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
    p.draft_step = {median(times)};

    // The target passes, over 1 .. 1 + tokens.size() positions (one untimed call first).
    const std::span<const token_id> draft(tokens);
    detail::run_verifier(verifier, context, draft.first(0), ws, vocab);
    for (std::size_t k = 0; k <= draft.size(); ++k) {
        times.clear();
        for (std::size_t r = 0; r < m.repeats; ++r) {
            const auto t0 = clock::now();
            detail::run_verifier(verifier, context, draft.first(k), ws, vocab);
            times.push_back(detail::seconds_since(t0));
        }
        p.target_pass.push_back(median(times));
    }
    // A clock too coarse for the first pass: the smallest positive time it measured.
    if (!(p.target_pass[0] > 0.0)) {
        double smallest = 0.0;
        for (const double t : p.target_pass)
            if (t > 0.0 && (smallest == 0.0 || t < smallest)) smallest = t;
        p.target_pass[0] = smallest > 0.0 ? smallest : 1e-9;
    }
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

}  // namespace specdec
