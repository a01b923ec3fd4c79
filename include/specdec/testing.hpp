#pragma once
/// \file
/// The conformance kit: tests that a user's own adapters keep speculative decoding exact.
///
/// specdec's output has the target's distribution (Leviathan et al. 2023, App. A.1) only if
/// the adapters keep the promises of concepts.hpp. The checks here test those promises on the
/// user's models, from the user's own test framework; each returns a `report` (verdict,
/// statistic, p-value or largest error, the first failing case in words, what was run):
///
/// | check                     | what it tests                                                   | false alarms  |
/// |---------------------------|-----------------------------------------------------------------|---------------|
/// | check_contract            | score() column j = a fresh model's logits after context + draft[0..j), after rollbacks, shrinking contexts, any order, on copies; score_tree() column i + 1 = the logits after context + node i's path | none (deterministic) |
/// | check_draft_consistency   | a drafter's tokens (or tree nodes) follow the distributions it reports (χ² per position or depth; for chains also the joint law of consecutive positions), after random contexts and after the drafter's own samples | `significance` per test |
/// | check_equivalence         | the law of the first n tokens of speculative_decode = plain sampling from the target; reports the measured acceptance | `significance` per scheme and sampling config |
/// | check_determinism         | the same seed gives the same tokens                              | none          |
/// | check_multi_sequence_contract | score_batch / score_tree_batch / draft_batch give each request what it gets alone, across joining, leaving, reused slots, shuffled and ragged requests | none (deterministic) |
///
/// `run_conformance` runs them all. The decoding checks run the step of
/// `conformance_options::decode` (decode_options::step): a chain (the default) under each of the
/// chain schemes in `schemes`, or a tree under its own scheme; with a tree step, a tree drafter
/// (TreeDrafter) is checked tree by tree and a tree verifier's score_tree() in the contract. Not
/// included by specdec/specdec.hpp.
///
/// This header includes every check and defines run_conformance; each check also has a header of
/// its own under specdec/testing/: report.hpp (report, conformance_options), contract.hpp,
/// multi_sequence_contract.hpp, draft_consistency.hpp, equivalence.hpp, determinism.hpp, and
/// stats.hpp (the χ² tests).
///
/// \code
/// #include <specdec/testing.hpp>
/// TEST_CASE("my adapters keep speculative decoding exact") {
///     my_engine target = load_target(), draft = load_draft();
///     const auto report = specdec::testing::run_conformance(draft, target, {.prompt = {1}});
///     CHECK(report);  // on failure, Catch2 prints the one-line summary of every check
/// }
/// \endcode

#include <concepts>
#include <optional>
#include <utility>

#include "concepts.hpp"
#include "multi_sequence.hpp"
#include "testing/contract.hpp"
#include "testing/determinism.hpp"
#include "testing/draft_consistency.hpp"
#include "testing/equivalence.hpp"
#include "testing/multi_sequence_contract.hpp"
#include "testing/report.hpp"
#include "testing/stats.hpp"

namespace specdec::testing {

/// Runs every check on the pair: the contract of the target (and of the drafter, when it is a
/// copyable LanguageModel), the multi-sequence contract of a target that models
/// MultiSequenceVerifier or MultiSequenceTreeVerifier (score_batch, score_tree_batch) and of a
/// drafter that models MultiSequenceDrafter (draft_batch), draft consistency, determinism,
/// sequence-level equivalence. A model that cannot be copied skips its contracts (use
/// check_contract_with, check_multi_sequence_contract_with). The drafter may be a TreeDrafter
/// (then the checks run a tree step, see conformance_options::decode) or a MultiSequenceDrafter
/// alone (drafting one sequence through draft_batch), the target a MultiSequenceVerifier or
/// MultiSequenceTreeVerifier alone (plain sampling from it through a pass of one request) or a
/// TreeVerifier alone (its contract, and plain sampling, through score_tree of chains); a drafter
/// or target of trees only runs the default tree when the options ask for a chain.
template <detail::kit_drafter D, detail::kit_target V>
[[nodiscard]] conformance_report run_conformance(D& drafter, V& target, const conformance_options& o = {}) {
    conformance_report out;
    auto add = [&out](report r, const char* name) {
        r.check = name;
        out.checks.push_back(std::move(r));
    };
    // The references of the multi-sequence contracts: copies taken before any call.
    constexpr bool multi_target = (MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>) && std::copy_constructible<V>;
    constexpr bool multi_drafter = MultiSequenceDrafter<D> && std::copy_constructible<D>;
    std::optional<V> pristine_target;
    std::optional<D> pristine_drafter;
    if constexpr (multi_target) pristine_target.emplace(target);
    if constexpr (multi_drafter) pristine_drafter.emplace(drafter);
    // The target's contract with the step the decoding checks run (a drafter of trees only runs
    // a tree step under chain options, and the contract then scores trees too).
    conformance_options stepped = o;
    stepped.decode.step = detail::step_of<D, V>(o);
    if constexpr ((Verifier<V> || TreeVerifier<V>) && std::copy_constructible<V>)
        add(check_contract(target, stepped), "adapter contract (target)");
    if constexpr (LanguageModel<D> && std::copy_constructible<D>) add(check_contract(drafter, o), "adapter contract (draft)");
    if constexpr (multi_target)
        add(detail::multi_sequence_part(target, *pristine_target, o, {.scores = true, .drafts = false}),
            "multi-sequence contract (target)");
    if constexpr (multi_drafter)
        add(detail::multi_sequence_part(drafter, *pristine_drafter, o, {.scores = false, .drafts = true}),
            "multi-sequence contract (draft)");
    out.checks.push_back(check_draft_consistency(drafter, stepped));  // (drafted as decoding drafts)
    out.checks.push_back(check_determinism(drafter, target, o));
    out.checks.push_back(check_equivalence(drafter, target, o));
    return out;
}

}  // namespace specdec::testing
