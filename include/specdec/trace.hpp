#pragma once
/// \file
/// step_recorder: a per-step trace of a decoding run, for every sequence of a batch — the plan
/// (plain, chain of γ, tree), where the time went (draft, target pass, library), what was drafted
/// and accepted, β per chain position, the acceptance by sibling rank at a tree's root, and the
/// tokens each step appended. Attach it as the on_step callback:
///
/// \code
/// specdec::step_recorder trace;                 // reserves its storage here, once
/// specdec::decode_options o{.on_step = std::ref(trace)};
/// // ... speculative_decode(draft, target, prompt, o, rng), or a batch_decoder with o ...
/// for (const auto& s : trace.steps()) { /* s.accepted, trace.tokens(s), s.target_seconds ... */ }
/// \endcode
///
/// The recorder does no I/O and allocates nothing after its constructor: its capacity is fixed
/// up front, and the steps beyond it are counted (dropped()) rather than kept. Writing a trace
/// to a file (e.g. in the Chrome trace-event format) is the application's part; the llama2
/// example's `specdec-generate --trace FILE` does that (docs/traces.md).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "decode_options.hpp"
#include "tree.hpp"
#include "types.hpp"

namespace specdec {

/// What kind of step a recorded step was.
enum class step_kind : std::uint8_t {
    plain,  ///< no draft: one target step
    chain,  ///< a chain of γ draft tokens
    tree,   ///< a draft tree
};

/// Where a recorded step's last token came from.
enum class next_token_origin : std::uint8_t {
    target,      ///< nothing was drafted: the target's own sample
    correction,  ///< drawn from the residual norm(max(0, p − q)) after a rejection
    bonus,       ///< every draft token of the path was accepted: drawn from p at the end
};

/// One step of one sequence, as step_recorder keeps it.
struct recorded_step {
    std::size_t sequence = 0;  ///< step_event::sequence
    step_kind kind = step_kind::plain;                     ///< plain, chain or tree
    next_token_origin origin = next_token_origin::target;  ///< where next_token came from
    std::size_t gamma = 0;          ///< the γ (chain) or depth (tree) asked for
    std::size_t drafted = 0;        ///< draft tokens proposed (a tree: its nodes)
    std::size_t accepted = 0;       ///< draft tokens accepted
    std::size_t target_passes = 0;  ///< step_event::target_passes
    token_id next_token = 0;        ///< step_event::next_token
    /// When the step began, in seconds since the first recorded step's start.
    double start_seconds = 0.0;
    double draft_seconds = 0.0;    ///< step_timing::draft_seconds
    double target_seconds = 0.0;   ///< step_timing::target_seconds
    double library_seconds = 0.0;  ///< step_timing::library_seconds
    // Ranges in the recorder's shared arrays (read through step_recorder's accessors).
    std::uint32_t tokens_begin = 0, tokens_size = 0;
    std::uint32_t beta_begin = 0, beta_size = 0;
    std::uint32_t sibling_begin = 0, sibling_size = 0;
};

/// Records every step_event it is called with, within a capacity fixed at construction (see the
/// file comment). Not thread-safe; the decoding loops call on_step on the calling thread.
class step_recorder {
public:
    /// How much the recorder keeps: steps, appended tokens, and acceptance values (β and
    /// sibling acceptance together). A step that does not fit whole is dropped (and counted).
    struct capacity {
        std::size_t steps = std::size_t{1} << 16;   ///< steps kept
        std::size_t tokens = std::size_t{1} << 18;  ///< appended tokens, over all steps
        std::size_t values = std::size_t{1} << 18;  ///< acceptance values, over all steps
    };

    step_recorder() : step_recorder(capacity{}) {}
    /// Reserves the storage for `c` (the only allocation the recorder makes).
    explicit step_recorder(capacity c) : cap_(c) {
        // The ranges are 32-bit: larger capacities are cut to what they can address.
        constexpr std::size_t most = 0xFFFFFFFFu;
        cap_.tokens = std::min(cap_.tokens, most);
        cap_.values = std::min(cap_.values, most);
        steps_.reserve(cap_.steps);
        tokens_.reserve(cap_.tokens);
        values_.reserve(cap_.values);
    }

    /// Records `e` (or counts it as dropped when it does not fit). Allocates nothing.
    void record(const step_event& e) noexcept {
        const std::size_t n_values = e.acceptance.size() + e.sibling_acceptance.size();
        if (steps_.size() >= cap_.steps || tokens_.size() + e.emitted.size() > cap_.tokens ||
            values_.size() + n_values > cap_.values) {
            ++dropped_;
            return;
        }
        if (!started_) {
            origin_ = e.timing.start;
            started_ = true;
        }
        recorded_step s;
        s.sequence = e.sequence;
        s.gamma = e.gamma;
        s.accepted = e.accepted;
        s.target_passes = e.target_passes;
        s.next_token = e.next_token;
        s.start_seconds = std::chrono::duration<double>(e.timing.start - origin_).count();
        s.draft_seconds = e.timing.draft_seconds;
        s.target_seconds = e.timing.target_seconds;
        s.library_seconds = e.timing.library_seconds;
        if (e.gamma == 0 && e.draft.empty() && (e.tree == nullptr || e.tree->size() == 0)) {
            s.kind = step_kind::plain;  // (a plain step of a tree run too)
            s.origin = next_token_origin::target;
        } else if (e.tree != nullptr) {
            s.kind = step_kind::tree;
            s.drafted = e.tree->size();
            // Every node of the accepted path was accepted: the next token is a bonus when that
            // path ends at a leaf (there was no child left to test), a correction otherwise.
            bool leaf = true;
            for (const auto parent : e.tree->parents) leaf = leaf && parent != e.last_node;
            s.origin = s.drafted == 0 ? next_token_origin::target
                       : leaf         ? next_token_origin::bonus
                                      : next_token_origin::correction;
        } else {
            s.kind = step_kind::chain;
            s.drafted = e.draft.size();
            s.origin = s.drafted == 0          ? next_token_origin::target
                       : e.accepted == s.drafted ? next_token_origin::bonus
                                                 : next_token_origin::correction;
        }
        s.tokens_begin = static_cast<std::uint32_t>(tokens_.size());
        s.tokens_size = static_cast<std::uint32_t>(e.emitted.size());
        tokens_.insert(tokens_.end(), e.emitted.begin(), e.emitted.end());
        s.beta_begin = static_cast<std::uint32_t>(values_.size());
        s.beta_size = static_cast<std::uint32_t>(e.acceptance.size());
        values_.insert(values_.end(), e.acceptance.begin(), e.acceptance.end());
        s.sibling_begin = static_cast<std::uint32_t>(values_.size());
        s.sibling_size = static_cast<std::uint32_t>(e.sibling_acceptance.size());
        values_.insert(values_.end(), e.sibling_acceptance.begin(), e.sibling_acceptance.end());
        steps_.push_back(s);
    }
    /// record(e): the recorder as an on_step callback (`.on_step = std::ref(recorder)`).
    void operator()(const step_event& e) noexcept { record(e); }

    /// The recorded steps, in the order they were reported (within a batch step, by sequence id).
    [[nodiscard]] std::span<const recorded_step> steps() const noexcept { return steps_; }
    /// The tokens step `s` appended to its sequence's output (step_event::emitted).
    [[nodiscard]] std::span<const token_id> tokens(const recorded_step& s) const noexcept {
        return std::span<const token_id>(tokens_).subspan(s.tokens_begin, s.tokens_size);
    }
    /// β of each chain draft position step `s` tested (step_event::acceptance).
    [[nodiscard]] std::span<const float> acceptance(const recorded_step& s) const noexcept {
        return std::span<const float>(values_).subspan(s.beta_begin, s.beta_size);
    }
    /// a_k of each tested child of a tree step's root (step_event::sibling_acceptance).
    [[nodiscard]] std::span<const float> sibling_acceptance(const recorded_step& s) const noexcept {
        return std::span<const float>(values_).subspan(s.sibling_begin, s.sibling_size);
    }
    /// Steps not kept because the capacity was full.
    [[nodiscard]] std::size_t dropped() const noexcept { return dropped_; }
    /// The capacity the recorder was made with.
    [[nodiscard]] const capacity& limits() const noexcept { return cap_; }
    /// Forgets every step (keeps the storage); the next step recorded starts the clock again.
    void clear() noexcept {
        steps_.clear();
        tokens_.clear();
        values_.clear();
        dropped_ = 0;
        started_ = false;
    }

private:
    capacity cap_;
    std::vector<recorded_step> steps_;
    std::vector<token_id> tokens_;
    std::vector<float> values_;
    std::size_t dropped_ = 0;
    bool started_ = false;
    std::chrono::steady_clock::time_point origin_{};
};

}  // namespace specdec
