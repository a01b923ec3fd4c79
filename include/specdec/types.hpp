#pragma once
/// \file
/// Basic vocabulary types, sampling settings and statistics shared by every header.
/// (token_id and sampling_config, which the core takes too, are defined in
/// detail/vocabulary.hpp, and are part of this header through it.)

#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail/vocabulary.hpp"  // token_id, sampling_config

namespace specdec {

/// Why a decoding loop ended.
enum class stop_reason {
    max_new_tokens,  ///< exactly max_new_tokens tokens were generated
    stop_token,      ///< a stop token was generated (and is included in the output)
    unfinished,      ///< neither yet: batch_decoder::take() of a sequence still generating
};

/// Counters of one decoding run (or of several steps, when the caller accumulates them).
struct decode_stats {
    std::size_t steps = 0;            ///< verification passes (iterations of Algorithm 1)
    /// Forward passes of the target model: 1 per step with a batched score() (or what the
    /// verifier's calls_per_score says, see BatchVerifier), γ+1 with a plain model.
    std::size_t target_calls = 0;
    /// Calls into the draft model: the forward passes a drafter reports in
    /// draft_block::model_calls (model_drafter and a plain LanguageModel drafter: one per
    /// draft token; prompt_lookup_drafter: 0); for a drafter that reports nothing, one per
    /// draft() that proposed tokens.
    std::size_t draft_calls = 0;
    std::size_t drafted_tokens = 0;   ///< draft tokens proposed
    std::size_t accepted_tokens = 0;  ///< draft tokens accepted
    std::size_t rejected_tokens = 0;  ///< draft tokens tested and rejected (at most one per step)
    /// accepted_at_position[i]: in how many steps the draft token at position i
    /// (0-based) was accepted. Its size is the largest draft length seen.
    std::vector<std::size_t> accepted_at_position;
    /// reached_at_position[i]: in how many steps the draft token at position i was
    /// tested, i.e. all earlier draft tokens had been accepted.
    std::vector<std::size_t> reached_at_position;
    /// expected_accepted_at_position[i]: the sum, over the steps in which draft position i
    /// was tested, of β_i = Σ_x min(p_i(x), q_i(x)) (p_i(x_i) for a point-mass draft), the
    /// probability that token verification accepts that position (Leviathan et al. 2023,
    /// Def. 3.1). Filled only when acceptance is estimated (the adaptive γ policy, or
    /// chain::estimate_acceptance); empty otherwise. Divided by
    /// reached_at_position[i] it estimates α at position i with far less variance than
    /// accepted_at_position does, and unlike it, it is valid under block verification too.
    std::vector<double> expected_accepted_at_position;
    /// Tree steps whose sibling acceptance was estimated (the tree planner, or
    /// tree::estimate_sibling_acceptance): reached_at_sibling[k], the steps whose root tested
    /// its child k + 1 (children 1..k were not accepted), and expected_accepted_at_sibling[k],
    /// the sum of a_{k+1} over them (tree_verify_result::sibling_acceptance). Their ratio
    /// estimates P(child k + 1 accepted | children 1..k not), the acceptance by sibling rank.
    /// The tree planner's steps that run as chains count at rank 0 (β at the first position
    /// is a_1); under a tree step the per-position β above stays empty.
    std::vector<std::size_t> reached_at_sibling;
    std::vector<double> expected_accepted_at_sibling;  ///< see reached_at_sibling
    /// steps_at_gamma[g]: how many steps asked the drafter for g tokens (the γ in use, which
    /// the adaptive policy chooses per step; the drafter may propose fewer).
    std::vector<std::size_t> steps_at_gamma;

    /// Empirical acceptance rate: accepted / (accepted + rejected) draft tokens, the fraction
    /// of acceptance tests that passed (0 when none was made). Drafts that were never tested,
    /// because an earlier one was rejected, do not count. Under token verification, for
    /// i.i.d. acceptances (Leviathan et al. Sec. 3.1), this estimates alpha = E(beta). Block
    /// verification (the default) accepts more drafts than that, so its rate overstates
    /// alpha, and Eq. 1 with it overstates tokens per step: to measure alpha for the analysis
    /// functions, decode with verification_scheme::token.
    [[nodiscard]] double acceptance_rate() const noexcept {
        const std::size_t tested = accepted_tokens + rejected_tokens;
        return tested == 0 ? 0.0 : static_cast<double>(accepted_tokens) / static_cast<double>(tested);
    }
    /// Estimated α from the β of every tested draft position: Σ expected_accepted_at_position
    /// / Σ reached_at_position (0 when acceptance was not estimated). Valid under both schemes.
    [[nodiscard]] double estimated_acceptance() const noexcept {
        double expected = 0.0;
        std::size_t tested = 0;
        for (std::size_t i = 0; i < expected_accepted_at_position.size(); ++i) {
            expected += expected_accepted_at_position[i];
            tested += i < reached_at_position.size() ? reached_at_position[i] : 0;
        }
        return tested == 0 ? 0.0 : expected / static_cast<double>(tested);
    }
    /// The estimated acceptance of a root's child k + 1 given that the earlier ones were not
    /// accepted (k = 0: the first child): expected_accepted_at_sibling[k] /
    /// reached_at_sibling[k]; 0 when no step tested that rank.
    [[nodiscard]] double estimated_sibling_acceptance(std::size_t k) const noexcept {
        if (k >= reached_at_sibling.size() || k >= expected_accepted_at_sibling.size() || reached_at_sibling[k] == 0)
            return 0.0;
        return expected_accepted_at_sibling[k] / static_cast<double>(reached_at_sibling[k]);
    }
    /// Mean tokens produced per verification pass: (accepted + steps) / steps.
    [[nodiscard]] double tokens_per_step() const noexcept {
        return steps == 0 ? 0.0 : static_cast<double>(accepted_tokens + steps) / static_cast<double>(steps);
    }
};

}  // namespace specdec
