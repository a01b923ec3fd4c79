#pragma once
/// \file
/// Does the same seed give the same tokens? Determinism: check_determinism, which runs
/// speculative_decode and autoregressive_decode twice with one seed, and again after a run with
/// another seed, and compares the tokens; and the batch loop's sequences with their runs alone.
///
/// Part of the conformance kit (specdec/testing.hpp, which includes every check and defines
/// run_conformance). Not included by specdec/specdec.hpp.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../adaptive_gamma.hpp"
#include "../batch_decoder.hpp"
#include "../decode_options.hpp"
#include "../speculative_decode.hpp"
#include "../types.hpp"
#include "report.hpp"

namespace specdec::testing {

namespace detail {

/// Where two runs with the same seed part, in words, and what that points at.
inline std::string difference_text(const std::vector<token_id>& first, const std::vector<token_id>& other) {
    std::size_t i = 0;
    while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
    return "first at token " + std::to_string(i) + " (" + tokens_text(first) + " then " + tokens_text(other) +
           "): hidden randomness (a generator of the adapter's own?) or state a call leaves behind that changes "
           "the next";
}

/// The batch loop against separate runs: batch_decoder with three sequences (the prompt; the
/// prompt with its last token repeated; the prompt again, joining after the first step, so that
/// two sequences share a context), each against its own speculative_decode with the same seed,
/// which must give the same tokens (the loop verifies each sequence with its own generator).
/// Returns the failure in words, or "" when every sequence agrees; counts the runs.
template <kit_drafter D, kit_target V>
std::string batch_difference(D& drafter, V& target, const conformance_options& o, const decode_options& opts,
                             std::size_t& runs) {
    std::vector<std::vector<token_id>> prompts(3, o.prompt);
    if (!o.prompt.empty()) prompts[1].push_back(o.prompt.back());
    batch_decoder dec(drafter, target, opts);
    std::vector<std::size_t> ids;
    ids.push_back(dec.add(prompts[0], std::mt19937_64(o.seed)));
    ids.push_back(dec.add(prompts[1], std::mt19937_64(o.seed + 1)));
    dec.step();
    ids.push_back(dec.add(prompts[2], std::mt19937_64(o.seed + 2)));
    while (dec.active() != 0) dec.step();
    ++runs;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto batched = dec.take(ids[i]).tokens;
        std::mt19937_64 g(o.seed + i);
        const auto alone = speculative_decode(drafter, target, prompts[i], opts, g).tokens;
        ++runs;
        if (batched == alone) continue;
        std::size_t j = 0;
        while (j < batched.size() && j < alone.size() && batched[j] == alone[j]) ++j;
        return "batch_decoder, sequence " + std::to_string(i + 1) + " of 3" + (i == 2 ? " (joined after a step)" : "") +
               ": its tokens differ from its own speculative_decode with the same seed, first at token " +
               std::to_string(j) + " (" + tokens_text(batched) + " in the batch, " + tokens_text(alone) +
               " alone): a sequence's scores or drafts depend on the other sequences of the batch (a "
               "multi-sequence pass that mixes up sequences, or a model whose state one sequence leaves for "
               "another)";
    }
    return {};
}

template <kit_drafter D, kit_target V>
report determinism(D& drafter, V& target, const conformance_options& o) {
    decltype(auto) plain = plain_target(target);  // what plain sampling from the target reads
    const auto t0 = std::chrono::steady_clock::now();
    report r;
    r.check = "determinism";
    decode_options opts = o.decode;
    opts.budget.max_new_tokens = std::max<std::size_t>(o.length, 4 * (longest_draft(step_of<D, V>(o), o) + 1));
    opts.on_step = nullptr;
    // At a fixed γ (or tree depth): the adaptive policy chooses γ from measured times, which
    // differ between runs of a correct adapter and change which uniforms each step uses (exact
    // either way); this check is of the adapters, so nothing but them may vary.
    opts.length.policy = gamma_policy::fixed;
    opts.length.controller = nullptr;
    std::size_t runs = 0, batch_runs = 0;
    const bool batches = o.tolerance <= 1e-4;
    for (const auto& step : steps_to_run<D, V>(o, true)) {
        for (const auto& s : o.samplings) {
            if (!r.passed) break;
            opts.step = step.step;
            opts.sampling = s;
            auto run = [&](std::uint64_t seed, bool spec) {
                std::mt19937_64 g(seed);
                ++runs;
                return spec ? speculative_decode(drafter, target, o.prompt, opts, g).tokens
                            : autoregressive_decode(plain, o.prompt, opts, g).tokens;
            };
            for (const bool spec : {true, false}) {
                const auto first = run(o.seed, spec);
                const auto second = run(o.seed, spec);
                (void)run(o.seed + 1, spec);  // another run in between must leave no trace
                const auto third = run(o.seed, spec);
                for (const auto* other : {&second, &third}) {
                    if (*other == first) continue;
                    r.passed = false;
                    r.failure = std::string(spec ? "speculative_decode" : "autoregressive_decode") + ", " +
                                step.name + ", " + sampling_text(s) + ": the same seed gave different tokens " +
                                (other == &second ? "on a second run" : "after a run with another seed") + ", " +
                                difference_text(first, *other);
                    break;
                }
                if (!r.passed) break;
            }
            // A reduced-precision engine may round a pass differently with other sequences in it.
            if (!r.passed || !batches) continue;
            if (auto why = batch_difference(drafter, target, o, opts, batch_runs); !why.empty()) {
                r.passed = false;
                r.failure = step.name + ", " + sampling_text(s) + ": " + why;
            }
        }
    }
    r.ran = std::to_string(runs) + " runs of " + std::to_string(opts.budget.max_new_tokens) +
            " tokens, speculative and autoregressive, each seed repeated (also after a run with another seed); " +
            (batches ? std::to_string(batch_runs) +
                           " runs of the batch loop (3 sequences, one joining late) and of its sequences alone"
                     : std::string("no batch runs (tolerance above 1e-4: a reduced-precision engine's pass may "
                                   "depend on the batch's composition)"));
    r.seconds = seconds_between(t0);
    return r;
}

}  // namespace detail

/// Determinism: speculative_decode and autoregressive_decode give the same tokens for the same
/// seed, run twice and again after a run with another seed, for every scheme (or the tree step)
/// and sampling config; and each sequence of the batch loop (batch_decoder with three sequences,
/// two of them sharing a context, one joining after a step) gives the tokens of its own
/// speculative_decode with the same seed (skipped when `o.tolerance` is above 1e-4, whose
/// reduced-precision passes may depend on the batch's composition). Always at the fixed γ policy (an adaptive policy that measures times may
/// choose another γ on a second run of a correct adapter). Deterministic: false-alarm rate 0.
template <detail::kit_drafter D, detail::kit_target V>
[[nodiscard]] report check_determinism(D& drafter, V& target, const conformance_options& o = {}) {
    return detail::guarded("determinism", [&] { return detail::determinism(drafter, target, o); });
}

}  // namespace specdec::testing
