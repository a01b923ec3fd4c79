#pragma once
/// \file
/// The public vocabulary of verification that the core takes as it is: verification_scheme,
/// verify_options, verify_result and the constants of the checks and of the residual draw, in
/// namespace specdec. specdec/verify_types.hpp re-exports them (include that one); they are
/// defined here so that detail/ includes no public header.

#include <Eigen/Core>

#include <cstddef>

#include "vocabulary.hpp"

namespace specdec {

/// Allowed |Σ q − 1| for a draft distribution column; larger deviations are an error.
inline constexpr double draft_probability_tolerance = 1e-3;

/// A residual max(0, p − q) whose total mass is at most this is treated as zero "up to
/// rounding" and resampling falls back to p. Such a residual can only be reached through
/// rounding (p ≈ q), whose effect on the output is of the same order.
inline constexpr double residual_mass_floor = 1e-6;

/// How a draft block is verified.
enum class verification_scheme {
    /// Token by token: accept x_i with probability min(1, p_i(x_i)/q_i(x_i)) until the
    /// first rejection (Leviathan et al. 2023, Alg. 1).
    token,
    /// Jointly: accept the longest prefix that a single draw over the whole block allows
    /// (Sun et al. 2024). Exact, and never fewer expected accepted tokens than token
    /// verification; for γ = 1 identical to it, draw for draw. The default.
    block,
};

/// Settings of one verification beyond the sampling settings.
struct verify_options {
    /// Lenience l in (0, 1] (Leviathan et al. 2023, App. A.5): accept x with probability
    /// min(1, p(x) / (l·q(x))) and, after a rejection, resample from
    /// norm(max(0, p − l·q)). l = 1, the default, is exact speculative sampling.
    /// **Any l < 1 changes the output distribution**: it is no longer the target's. What
    /// remains guaranteed is that no token is emitted with probability above p(x)/l.
    /// At temperature 0 lenience has no effect (p and q are point masses). Lenience is
    /// defined for token verification only: l < 1 with block verification is an error.
    float lenience = 1.0f;
    /// Check every draft distribution column whose token is tested: non-negative, finite,
    /// summing to 1 within draft_probability_tolerance. The column is read in the same pass
    /// as the target row, which then reads twice the bytes: on rows of 32k–152k tokens that
    /// pass costs about 1.1–1.25× an unchecked one (the README's performance section). At
    /// temperature 0 the columns cannot change the outcome (each p_i is a point mass: x_i is
    /// accepted exactly when it is the target's argmax, and the correction is the argmax; under
    /// block verification a column that gives its own token x_i probability 0, which no column
    /// x_i was drawn from does, may stop the block one token early, still greedily), so
    /// only the entries that are read, q_i(x_i) (and under block verification q_i at the
    /// argmax), are checked to be probabilities. Turn off only for distributions the caller
    /// produced with standardize() or its sampling variants (standardize_and_sample,
    /// standardize_weights_and_sample): an unchecked column that is not a distribution makes
    /// the output's distribution wrong, silently.
    bool check_draft_distributions = true;
    /// Token or block verification (block is the default).
    verification_scheme scheme = verification_scheme::block;
};

/// Outcome of one verification.
struct verify_result {
    std::size_t accepted = 0;  ///< n: draft tokens x_1..x_n accepted (0 <= n <= γ)
    token_id next_token = 0;   ///< the token that follows them: a correction after a rejection, or a bonus token
};


/// After a rejection the correction is drawn from the residual by rejection sampling from p,
/// then, if no proposal was accepted, by one exact pass over the residual (see
/// detail::sample_residual). A proposal (a walk down the block, chunk and lane sums, 16
/// exponentials, two uniforms and a read of q, mostly latency) costs about as much as the
/// exact pass does over this many tokens, so V / this many proposals, the budget, cost about
/// one pass. (Measured on one core with an exp of eleven instructions per 16 floats: a proposal
/// 40–140 ns, depending on what of the row is in cache, against 5 µs for the pass at V = 32000;
/// 175 ns against 20 µs at V = 151936. Of 256, 512 and 1024, this value had the smallest worst
/// case in verify_bench's BM_rejection, within 1.15x of the best at every V and R there. The
/// present exp makes the pass about 20% cheaper and the proposals no cheaper; the value has not
/// been chosen again since.) Each proposal is accepted with probability R / a
/// (R the residual mass); a lower bound R_lo on R comes with the rejected token. When a / R_lo
/// is within the budget, 6 a / R_lo proposals are made (all fail with probability <= e^−6);
/// otherwise the budget, then the pass: whatever R is, at most about twice the cost of the
/// better of the two. The budget is at least one proposal, except on rows of one block whose
/// values the pass kept (exponentials, or a truncated distribution), whose exact pass needs no
/// exp: there it is V / this many, so that rows of fewer tokens make none. The count changes
/// the cost, never the distribution.
inline constexpr Eigen::Index residual_proposal_cost = 1024;

}  // namespace specdec
