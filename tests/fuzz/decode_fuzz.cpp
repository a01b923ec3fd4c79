// Fuzz harness: speculative_decode and speculative_step (specdec/speculative_decode.hpp,
// specdec/speculative_step.hpp) with models whose every answer comes from the fuzz input.
//
// Input: an instruction-set byte, a mode byte (decode or a loop of steps; which drafter and
// which verifier), the options (γ, token budget, stop tokens, sampling settings, lenience,
// scheme, fixed or adaptive length with its settings and costs, acceptance estimates, the
// draft-side stop, a callback that may throw), the prompt, the tree byte (a tree step and its
// shape; its bit 2 (value 4): the draft's own sampling settings follow the shape), then the
// script: every call of a model reads its next command and data from it. A command returns
// good logits or draft blocks, or a fault: rows of the wrong size, NaN, +Inf or all -Inf rows,
// score() matrices of the wrong shape, draft blocks with too many tokens, out-of-range tokens,
// malformed or non-normalized columns, bad scales, or an exception of the adapter's own type
// (fuzz_adapter_error). (The layout of the inputs written before the API of decode_options'
// parts is kept: the draft's sampling is read only when bit 2 of the tree byte is set, which
// no seed of tests/fuzz/corpus had.)
//
// Drafters: a block drafter driven by the script, a plain model (through model_drafter),
// prompt lookup, a fallback chain (prompt lookup, then the plain model), an n-gram model, a
// hierarchical drafter (the plain model decoded speculatively with prompt lookup below it).
// Verifiers: a plain model (next_logits per position), a batched score(), an in-place
// score_into(). In decode mode the step is a chain (γ from the input; 0 is a plain target step
// under the fixed policy) or a tree of the input's shape (up to three levels, or a list of its
// nodes' children, tree_shape::children, valid or not) verified with
// either tree scheme, the verifiers scoring it node by node or path by path; either composes
// with the fixed or adaptive length (γ, or the tree's depth, chosen per step), the draft's own
// sampling and the draft-side stop (a tree's node below it gets no children). The chain's
// lenience, scheme and acceptance estimates do not apply to a tree (their bytes are read and
// unused).
//
// Differential: with two plain models, no callback and no caller's controller, the same script
// and generator replayed through compiled mode's loop for plain models
// (detail::decode_models_loop over detail::model_ref) give the same outcome: the same error kind,
// or the same tokens and statistics, after the same model calls.
//
// Invariants. Errors: invalid options, a vocabulary mismatch or a prompt or stop token out of
// range throw std::invalid_argument before any model is called; otherwise std::invalid_argument
// only after the script injected a fault, fuzz_adapter_error only when an adapter or the
// callback threw it, nothing else ever. A model never sees a token outside [0, V), nor a draft
// (or tree path) longer than γ (the tree's depth). speculative_step leaves the sequence and the
// statistics exactly as they were when it throws, and otherwise appends draft[0..accepted) and
// next_token. speculative_decode returns tokens in range, exactly max_new_tokens of them unless
// a stop token (only the last one) ended the run, statistics that add up (steps,
// steps_at_gamma, drafted, accepted and rejected tokens, per-position counts, target calls,
// acceptance estimates in [0, reached], none for trees), and callback events whose emitted
// tokens are the output, whose target passes add up to the target calls, and, for trees, whose
// accepted path is the path of the accepted node of a tree no deeper than the depth asked, in
// which no node has a parent whose draft probability is below the draft-side stop. A
// step_recorder fed the same events (a small capacity, from the prompt and the budget) keeps
// exactly the events that fitted, each as reported, and counts the others as dropped, also when
// the run ended in a fault.

#include "fuzz_common.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <variant>

namespace {

using specdec::token_id;

/// The adapters' own exception type: must reach the caller unchanged.
struct fuzz_adapter_error : std::runtime_error {
    fuzz_adapter_error() : std::runtime_error("fuzz adapter error") {}
};

/// What every adapter reads from and reports to.
struct script {
    fuzz::input in;
    Eigen::Index V = 1;
    std::size_t gamma_max = 1;   // the longest draft a verifier may be asked to score
    std::size_t calls = 0;       // model calls so far
    std::size_t faults = 0;      // malformed answers handed to the library
    std::size_t throws = 0;      // fuzz_adapter_error thrown
    [[noreturn]] void raise() {
        ++throws;
        throw fuzz_adapter_error();
    }
    void check_tokens(std::span<const token_id> tokens) const {
        for (const token_id t : tokens) FUZZ_CHECK(t >= 0 && t < V);
    }
};

/// An ordinary logit: mostly moderate values, sometimes -Inf (a masked token).
float ordinary(fuzz::input& in) {
    const std::uint8_t b = in.byte();
    if (b == 1) return -std::numeric_limits<float>::infinity();
    return (static_cast<float>(b) - 128.0f) * 0.125f;
}

/// One column of logits per the script's command; counts faults.
void logits_column(script& s, Eigen::Ref<Eigen::VectorXf> out) {
    const std::uint8_t cmd = s.in.byte();
    if (cmd < 235) {
        fuzz::fill_cycled(s.in, out, s.in.range(1, 8), ordinary);
    } else {
        fuzz::fill_cycled(s.in, out, s.in.range(1, 8), fuzz::any_float);
    }
    if (cmd >= 220 && cmd < 235 && out.size() > 0) {
        static constexpr float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                                        std::numeric_limits<float>::infinity()};
        out[s.in.byte() % out.size()] = bad[cmd & 1u];
    }
    if (cmd >= 230 && cmd < 235) out.setConstant(-std::numeric_limits<float>::infinity());
    if (fuzz::bad_logit_row(out)) ++s.faults;
}

/// Wrong sizes a command can ask for (0: the right one).
Eigen::Index size_error(script& s) {
    const std::uint8_t b = s.in.byte();
    if (b < 244) return 0;
    return b < 250 ? 1 : -1;
}

/// A plain LanguageModel whose logits come from the script.
struct fuzz_lm {
    script* s;
    Eigen::Index reported_vocab;
    std::ptrdiff_t vocab_size() const { return reported_vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) {
        s->check_tokens(context);
        ++s->calls;
        if (s->in.byte() >= 250) s->raise();
        const Eigen::Index err = size_error(*s);
        if (err != 0) ++s->faults;
        Eigen::VectorXf z(std::max<Eigen::Index>(0, s->V + err));
        logits_column(*s, z);
        return z;
    }
};

/// A BatchVerifier: one score() per step, returning a matrix per the script.
struct fuzz_batch {
    script* s;
    std::ptrdiff_t vocab_size() const { return s->V; }
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        Eigen::MatrixXf out;
        fill(context, draft, out);
        return out;
    }
    void fill(std::span<const token_id> context, std::span<const token_id> draft, Eigen::MatrixXf& out) {
        s->check_tokens(context);
        s->check_tokens(draft);
        FUZZ_CHECK(draft.size() <= s->gamma_max);
        ++s->calls;
        if (s->in.byte() >= 250) s->raise();
        const Eigen::Index rows = s->V + size_error(*s), cols = static_cast<Eigen::Index>(draft.size()) + 1 + size_error(*s);
        if (rows != s->V || cols != static_cast<Eigen::Index>(draft.size()) + 1) ++s->faults;
        out.resize(std::max<Eigen::Index>(rows, 0), std::max<Eigen::Index>(cols, 0));
        for (Eigen::Index j = 0; j < out.cols(); ++j) logits_column(*s, out.col(j));
    }
};

/// A BatchVerifier that also writes in place (InPlaceBatchVerifier).
struct fuzz_inplace : fuzz_batch {
    void score_into(std::span<const token_id> context, std::span<const token_id> draft, Eigen::MatrixXf& out) {
        fill(context, draft, out);
    }
};

/// A BlockDrafter whose blocks come from the script: sampled with distributions (as weights
/// and scales, or normalized), point masses, or one of the faults.
struct fuzz_block_drafter {
    script* s;
    Eigen::Index reported_vocab;
    Eigen::VectorXf z;
    specdec::sampling_workspace sws;
    std::ptrdiff_t vocab_size() const { return reported_vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& sampling,
               specdec::uniform_source& uniforms, specdec::draft_block& out) {
        s->check_tokens(context);
        ++s->calls;
        // The step hands over an empty block.
        FUZZ_CHECK(out.tokens.empty() && out.probs.cols() == 0 && out.scales.empty() && !out.standardized);
        const Eigen::Index V = s->V;
        const std::uint8_t cmd = s->in.byte();
        if (cmd >= 248) s->raise();
        const std::size_t n = cmd >= 190 && cmd < 200 ? gamma + 1 : std::min(gamma, s->in.range(0, 15));
        if (cmd >= 160 && cmd < 200) {  // point masses (and too many of them)
            if (n > gamma) ++s->faults;
            for (std::size_t i = 0; i < n; ++i) out.tokens.push_back(static_cast<token_id>(s->in.byte() % V));
            return;
        }
        const bool scaled = (cmd & 1u) != 0;
        out.resize_probs(V, static_cast<Eigen::Index>(n));
        z.resize(V);
        for (std::size_t i = 0; i < n; ++i) {
            auto q = out.probs.col(static_cast<Eigen::Index>(i));
            logits_column(*s, z);  // a bad row makes the sampling call below throw (a fault)
            if (scaled) {
                const specdec::token_draw d = specdec::standardize_weights_and_sample(z, sampling, q, uniforms(), sws);
                out.tokens.push_back(d.token);
                out.scales.push_back(d.scale);
            } else {
                out.tokens.push_back(
                    static_cast<token_id>(specdec::standardize_and_sample(z, sampling, q, uniforms(), sws)));
            }
        }
        out.standardized = (cmd & 2u) != 0;  // true: the columns did come from standardize
        if (cmd < 200 || n == 0) return;
        // Faults on top of a good block.
        out.standardized = false;
        ++s->faults;
        const std::size_t i = s->in.byte() % n;
        const auto col = static_cast<Eigen::Index>(i);
        switch (cmd / 10) {
            case 20: out.tokens[i] = (cmd & 1u) ? static_cast<token_id>(V) : -1 - s->in.byte(); break;
            case 21: out.resize_probs(V + ((cmd & 2u) ? 1 : 0), static_cast<Eigen::Index>(n) + ((cmd & 2u) ? 0 : 1)); break;
            case 22: out.probs(s->in.byte() % V, col) = fuzz::special_floats[s->in.byte() % fuzz::special_count]; break;
            case 23:
                if (cmd & 4u) out.scales.push_back(1.0f);
                else if (!out.scales.empty()) out.scales[i] = fuzz::special_floats[s->in.byte() % fuzz::special_count];
                else out.scales.assign(n, -1.0f);
                break;
            default: {  // 240..247: columns that are not distributions
                Eigen::VectorXf w(V);
                fuzz::fill_cycled(s->in, w, s->in.range(1, 8), fuzz::any_weight);
                out.probs.col(col) = w;
            }
        }
    }
};

bool same_stats(const specdec::decode_stats& a, const specdec::decode_stats& b) {
    return a.steps == b.steps && a.target_calls == b.target_calls && a.draft_calls == b.draft_calls &&
           a.drafted_tokens == b.drafted_tokens && a.accepted_tokens == b.accepted_tokens &&
           a.rejected_tokens == b.rejected_tokens && a.accepted_at_position == b.accepted_at_position &&
           a.reached_at_position == b.reached_at_position &&
           a.expected_accepted_at_position == b.expected_accepted_at_position && a.steps_at_gamma == b.steps_at_gamma;
}

struct run_settings {
    specdec::decode_options options;
    specdec::step_options step;                 // step mode's
    const specdec::tree* tree = nullptr;        // the options' tree step, if any
    std::size_t longest = 0;                    // the chain's γ or the tree's depth
    std::vector<token_id> prompt;
    bool upfront_invalid = false;  // the options (or prompt, stop tokens, vocabularies) must be rejected
    bool shape_invalid = false;    // a tree shape whose children list decoding refuses
    bool step_mode = false;
    std::size_t callback_throw_at = 0;  // 1-based step whose callback throws; 0: never
    bool verifier_is_lm = false;
};

/// speculative_decode, with every check on its outcome.
template <class D, class Vf>
void run_decode(D& drafter, Vf& verifier, script& s, run_settings& rs) {
    std::vector<specdec::step_event> events;
    std::vector<token_id> emitted;
    std::size_t callback_calls = 0, passes = 0;
    // A step_recorder beside the checks below, its capacity from the prompt and the budget.
    std::size_t trace_seed = rs.options.budget.max_new_tokens * 31u + rs.longest;
    for (const token_id t : rs.prompt) trace_seed = trace_seed * 131u + static_cast<std::size_t>(t);
    fuzz::trace_check trace(trace_seed);
    if (rs.callback_throw_at != 0 || (s.in.byte() & 1u)) {
        rs.options.on_step = [&](const specdec::step_event& e) {
            ++callback_calls;
            trace.record(e);
            FUZZ_CHECK(e.sequence == 0);
            FUZZ_CHECK(e.accepted <= e.draft.size());
            FUZZ_CHECK(e.draft.size() <= e.gamma && e.gamma <= rs.longest);
            FUZZ_CHECK(e.emitted.size() <= e.accepted + 1);
            FUZZ_CHECK(e.acceptance.size() <= e.draft.size());
            FUZZ_CHECK(e.target_passes >= 1);
            s.check_tokens(e.draft);
            s.check_tokens(e.emitted);
            FUZZ_CHECK(e.next_token >= 0 && e.next_token < s.V);
            // Under the tree planner a step planned as a chain (or a plain step) may run as a
            // chain step (batch_decoder's detail::chains_as_chains); with a fixed shape every
            // step is a tree.
            if (rs.tree && e.tree == nullptr)
                FUZZ_CHECK(rs.options.length.policy == specdec::gamma_policy::adaptive &&
                           e.draft.size() <= std::max<std::size_t>(rs.tree->shape.depth(), 1));
            if (e.tree != nullptr) {
                // The accepted path: the path of the accepted node, in a tree no deeper than asked.
                FUZZ_CHECK(rs.tree != nullptr);
                const specdec::draft_tree& t = *e.tree;
                FUZZ_CHECK(e.draft.size() == e.accepted);
                FUZZ_CHECK(e.acceptance.empty());
                // At most the shape's nodes (a block drafter's chain too: it was once drafted as deep
                // as the depth asked, past shape.max_nodes; found by this harness).
                FUZZ_CHECK(t.size() <= rs.tree->shape.nodes());
                FUZZ_CHECK(static_cast<std::size_t>(t.max_depth()) <= e.gamma);
                FUZZ_CHECK((e.last_node < 0) == (e.accepted == 0));
                FUZZ_CHECK(e.last_node >= -1 && e.last_node < static_cast<std::int32_t>(t.size()));
                std::vector<token_id> path;
                specdec::path_tokens(t, e.last_node, path);
                FUZZ_CHECK(std::equal(path.begin(), path.end(), e.draft.begin(), e.draft.end()));
                s.check_tokens(t.tokens);
                if (rs.verifier_is_lm) FUZZ_CHECK(e.target_passes == t.size() + 1);
                // The draft-side stop: a node whose draft probability is below it has no children.
                const float stop = rs.options.draft.stop_below;
                if (stop > 0.0f && t.has_distributions())
                    for (std::size_t i = 0; i < t.size(); ++i) {
                        const std::int32_t p = t.parents[i];
                        if (p >= 0) FUZZ_CHECK(!(t.probs(t.tokens[static_cast<std::size_t>(p)], p) < stop));
                    }
            } else {
                FUZZ_CHECK(e.tree == nullptr && e.last_node == -1);
                FUZZ_CHECK(e.target_passes == (rs.verifier_is_lm ? e.draft.size() + 1 : 1));
            }
            passes += e.target_passes;
            emitted.insert(emitted.end(), e.emitted.begin(), e.emitted.end());
            events.push_back(e);
            if (callback_calls == rs.callback_throw_at) s.raise();
        };
    }
    fuzz::tape_rng rng(s.in.take(s.in.byte()));
    // Two plain models, no callback, no caller's controller (both would carry state from the
    // first run into the second): replay the script and the generator through compiled mode's
    // loop (detail::decode_models_loop over model_ref) and require the same outcome.
    std::optional<script> replay;
    std::optional<fuzz::tape_rng> replay_rng;
    if constexpr (std::is_same_v<D, fuzz_lm> && std::is_same_v<Vf, fuzz_lm>)
        if (!rs.options.on_step && rs.options.length.controller == nullptr) {
            replay = s;
            replay_rng = rng;
        }
    const auto differential = [&](int outcome, const specdec::decode_result* r) {
        if (!replay) return;
        script& s2 = *replay;
        fuzz_lm d2{&s2, drafter.vocab_size()}, v2{&s2, verifier.vocab_size()};
        specdec::detail::model_ref dr(d2), vr(v2);
        specdec::uniform_source uniforms(*replay_rng);
        int outcome2 = 0;
        specdec::decode_result r2;
        try {
            r2 = specdec::detail::decode_models_loop(dr, vr, rs.prompt, rs.options, uniforms);
        } catch (const std::invalid_argument&) {
            outcome2 = 1;
        } catch (const fuzz_adapter_error&) {
            outcome2 = 2;
        }
        FUZZ_CHECK(outcome2 == outcome);
        FUZZ_CHECK(s2.calls == s.calls && s2.faults == s.faults && s2.throws == s.throws);
        if (r != nullptr) {
            FUZZ_CHECK(r2.tokens == r->tokens && r2.stop == r->stop);
            FUZZ_CHECK(same_stats(r2.stats, r->stats));
        }
    };
    specdec::decode_result res;
    try {
        res = specdec::speculative_decode(drafter, verifier, rs.prompt, rs.options, rng);
    } catch (const std::invalid_argument&) {
        differential(1, nullptr);
        FUZZ_CHECK(rs.upfront_invalid || s.faults > 0);
        if (rs.upfront_invalid) FUZZ_CHECK(s.calls == 0 && callback_calls == 0);
        trace.check();
        return;
    } catch (const fuzz_adapter_error&) {
        differential(2, nullptr);
        FUZZ_CHECK(s.throws > 0 && !rs.upfront_invalid);
        trace.check();
        return;
    }
    differential(0, &res);
    FUZZ_CHECK(!rs.upfront_invalid);
    trace.check();
    const auto& o = rs.options;
    const auto& st = res.stats;
    const auto& budget = o.budget;
    s.check_tokens(res.tokens);
    FUZZ_CHECK(res.tokens.size() <= budget.max_new_tokens);
    const auto is_stop = [&](token_id t) {
        return std::find(budget.stop_tokens.begin(), budget.stop_tokens.end(), t) != budget.stop_tokens.end();
    };
    if (res.stop == specdec::stop_reason::max_new_tokens) {
        FUZZ_CHECK(res.tokens.size() == budget.max_new_tokens);
        FUZZ_CHECK(res.tokens.size() == st.accepted_tokens + st.steps);
    } else {
        FUZZ_CHECK(!res.tokens.empty() && is_stop(res.tokens.back()));
        FUZZ_CHECK(res.tokens.size() <= st.accepted_tokens + st.steps);
    }
    for (std::size_t i = 0; i + 1 < res.tokens.size(); ++i) FUZZ_CHECK(!is_stop(res.tokens[i]));
    FUZZ_CHECK((st.steps == 0) == res.tokens.empty());
    FUZZ_CHECK(std::accumulate(st.steps_at_gamma.begin(), st.steps_at_gamma.end(), std::size_t{0}) == st.steps);
    FUZZ_CHECK(st.steps_at_gamma.size() <= rs.longest + 1);
    if (rs.tree) {
        // Trees: one pass per node and the root for a plain model, per root-to-leaf path for
        // score(), so at least one per step and at most one per node and step.
        if (rs.verifier_is_lm) FUZZ_CHECK(st.target_calls == st.drafted_tokens + st.steps);
        else FUZZ_CHECK(st.target_calls >= st.steps && st.target_calls <= st.drafted_tokens + st.steps);
    } else {
        FUZZ_CHECK(st.target_calls == (rs.verifier_is_lm ? st.drafted_tokens + st.steps : st.steps));
    }
    fuzz::check_stats(st);
    const auto* c = std::get_if<specdec::chain>(&o.step);
    const bool estimated = c && (c->estimate_acceptance || o.length.policy == specdec::gamma_policy::adaptive);
    if (!estimated) FUZZ_CHECK(st.expected_accepted_at_position.empty());
    if (o.on_step) {
        FUZZ_CHECK(events.size() == st.steps);
        FUZZ_CHECK(emitted == res.tokens);
        FUZZ_CHECK(passes == st.target_calls);
    }
}

/// A loop of speculative_step calls on one sequence, continuing after errors.
template <class D, class Vf>
void run_steps(D& drafter, Vf& verifier, script& s, run_settings& rs) {
    const specdec::step_options& opts = rs.step;
    std::vector<token_id> sequence = rs.prompt;
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    const std::size_t steps = 1 + s.in.byte() % 12;
    for (std::size_t k = 0; k < steps; ++k) {
        fuzz::tape_rng rng(s.in.take(s.in.byte() % 64));
        const std::vector<token_id> before = sequence;
        const specdec::decode_stats stats_before = stats;
        const std::size_t calls_before = s.calls;
        specdec::step_result r;
        try {
            r = specdec::speculative_step(drafter, verifier, sequence, stats, opts, rng, ws);
        } catch (const std::invalid_argument&) {
            FUZZ_CHECK(rs.upfront_invalid || s.faults > 0);
            if (rs.upfront_invalid) FUZZ_CHECK(s.calls == calls_before);
            FUZZ_CHECK(sequence == before && same_stats(stats, stats_before));  // strong guarantee
            continue;
        } catch (const fuzz_adapter_error&) {
            FUZZ_CHECK(s.throws > 0 && !rs.upfront_invalid);
            FUZZ_CHECK(sequence == before && same_stats(stats, stats_before));  // strong guarantee
            continue;
        }
        FUZZ_CHECK(!rs.upfront_invalid);
        FUZZ_CHECK(r.draft.size() <= opts.gamma && r.accepted <= r.draft.size());
        FUZZ_CHECK(r.next_token >= 0 && r.next_token < s.V);
        s.check_tokens(r.draft);
        FUZZ_CHECK(sequence.size() == before.size() + r.accepted + 1);
        FUZZ_CHECK(std::equal(before.begin(), before.end(), sequence.begin()));
        FUZZ_CHECK(std::equal(r.draft.begin(), r.draft.begin() + static_cast<std::ptrdiff_t>(r.accepted),
                              sequence.begin() + static_cast<std::ptrdiff_t>(before.size())));
        FUZZ_CHECK(sequence.back() == r.next_token);
        FUZZ_CHECK(stats.steps == stats_before.steps + 1);
        FUZZ_CHECK(stats.drafted_tokens == stats_before.drafted_tokens + r.draft.size());
        FUZZ_CHECK(stats.accepted_tokens == stats_before.accepted_tokens + r.accepted);
        FUZZ_CHECK(stats.rejected_tokens == stats_before.rejected_tokens + (r.all_accepted() ? 0 : 1));
        FUZZ_CHECK(stats.target_calls ==
                   stats_before.target_calls + (rs.verifier_is_lm ? r.draft.size() + 1 : 1));
        fuzz::check_stats(stats);
    }
}

template <class D, class Vf>
void run_pair(D& drafter, Vf& verifier, script& s, run_settings& rs) {
    if (rs.step_mode)
        run_steps(drafter, verifier, s, rs);
    else
        run_decode(drafter, verifier, s, rs);
}

template <class D>
void with_verifier(D& drafter, script& s, run_settings& rs, std::uint8_t which) {
    switch (which % 3) {
        case 0: {
            rs.verifier_is_lm = true;
            fuzz_lm v{&s, s.V};
            run_pair(drafter, v, s, rs);
            break;
        }
        case 1: {
            fuzz_batch v{&s};
            run_pair(drafter, v, s, rs);
            break;
        }
        default: {
            fuzz_inplace v{{&s}};
            run_pair(drafter, v, s, rs);
        }
    }
}

float pick(fuzz::input& in, std::initializer_list<float> values, float usual) {
    const std::uint8_t b = in.byte();
    if (b < 160) return usual;
    if (b == 255) return in.raw<float>();
    return values.begin()[b % values.size()];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    script s{fuzz::input(data, size)};
    fuzz::input& in = s.in;
    fuzz::pick_isa(in);
    const std::uint8_t mode = in.byte();
    run_settings rs;
    rs.step_mode = (mode & 1u) != 0;
    const std::uint8_t drafter_kind = ((mode >> 1) & 7u) % 6, verifier_kind = ((mode >> 4) & 7u) % 3;
    const bool large_vocab = (mode & 0x80u) != 0;
    s.V = large_vocab ? 1 + static_cast<Eigen::Index>(in.u16() % 3000) : 1 + in.byte() % 24;
    const Eigen::Index V = s.V;

    auto& o = rs.options;
    const constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    // The chain's settings (step mode's too); the step becomes a tree below when the tree byte
    // says so.
    specdec::chain c{.gamma = in.byte() % 10u};  // 0: plain target steps (fixed policy only; invalid in step mode)
    o.budget.max_new_tokens = in.byte() % 40;
    const std::size_t n_stop = in.byte() % 4;
    bool stop_out_of_range = false;
    for (std::size_t i = 0; i < n_stop; ++i) {
        const std::uint8_t b = in.byte();
        const token_id t = b < 250 ? static_cast<token_id>(in.byte() % V) : static_cast<token_id>(V + b - 252);
        stop_out_of_range = stop_out_of_range || t < 0 || t >= V;
        o.budget.stop_tokens.push_back(t);
    }
    o.sampling = fuzz::sampling(in);
    c.lenience = pick(in, {0.5f, 0.9f, 0.0f, -1.0f, nan, 2.0f}, 1.0f);
    c.scheme = (in.byte() & 1u) ? specdec::verification_scheme::token : specdec::verification_scheme::block;
    c.estimate_acceptance = (in.byte() & 1u) != 0;
    o.draft.stop_below = pick(in, {0.1f, 0.5f, 1.0f, 0.01f, -0.1f, 1.5f, nan}, 0.0f);
    const std::uint8_t policy = in.byte();
    bool adaptive_invalid = false;
    if (policy >= 128) {
        o.length.policy = specdec::gamma_policy::adaptive;
        static constexpr double costs[] = {1.0, 0.1, 10.0, 0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                                           std::numeric_limits<double>::infinity(), 1e300};
        const double draft_cost = costs[in.byte() % 8], pass_base = costs[in.byte() % 8], pass_slope = costs[in.byte() % 8];
        auto& a = o.length.adaptive;
        a.draft_cost = [draft_cost](std::size_t n) { return draft_cost * static_cast<double>(n); };
        if ((policy & 3u) != 3u)  // else one callback only: invalid
            a.pass_cost = [=](std::size_t m) { return pass_base + pass_slope * static_cast<double>(m); };
        a.explore_every = in.byte() % 6;
        a.max_explore_every = in.byte() % 9;
        const bool prior_invalid = fuzz::window_and_prior(in, a);  // window 0 is invalid
        a.explore_budget = (policy & 4u) ? 0.05 : (policy & 8u ? 1.5 : 0.5);  // 1.5 is invalid
        adaptive_invalid = (policy & 3u) == 3u || a.window == 0 || a.explore_budget > 1.0 || prior_invalid;
    }
    const std::size_t prompt_len = in.byte() % 9;
    bool prompt_out_of_range = false;
    for (std::size_t i = 0; i < prompt_len; ++i) {
        const std::uint8_t b = in.byte();
        const token_id t = b < 250 ? static_cast<token_id>(in.byte() % V) : static_cast<token_id>(V + b - 252);
        prompt_out_of_range = prompt_out_of_range || t < 0 || t >= V;
        rs.prompt.push_back(t);
    }
    const bool vocab_lie = in.byte() >= 250;
    const Eigen::Index drafter_vocab = vocab_lie ? V + 1 : V;
    rs.callback_throw_at = in.byte() >= 240 ? 1 + in.byte() % 4 : 0;
    // The tree byte. In decode mode, >= 192: a tree step of up to three levels (a branching of
    // 0 ends it; depth 0 is invalid; or a children list, fuzz::tree_shape_bytes) with a node cap,
    // either scheme. Bit 2 (value 4), in either
    // mode: the draft's own sampling settings follow (after the shape).
    const std::uint8_t tree_byte = in.byte();
    o.step = c;
    if (!rs.step_mode && tree_byte >= 192) {
        specdec::tree t{.shape = {.branching = {}}};
        rs.shape_invalid = fuzz::tree_shape_bytes(in, 1u + tree_byte % 3u, t.shape);
        t.shape.max_nodes = (tree_byte & 8u) ? in.byte() % 8 : 0;
        t.shape.draws = (tree_byte & 16u) ? specdec::sibling_draws::iid : specdec::sibling_draws::without_replacement;
        t.scheme = (tree_byte & 32u) ? specdec::tree_verification_scheme::recursive_rejection
                                     : specdec::tree_verification_scheme::traversal;
        o.step = t;
        rs.tree = &std::get<specdec::tree>(o.step);
    }
    if (tree_byte & 4u) o.draft.sampling = fuzz::sampling(in);
    rs.longest = rs.tree ? rs.tree->shape.depth() : c.gamma;
    s.gamma_max = rs.longest;  // the longest draft (tree path) a verifier may be asked to score
    rs.step = specdec::step_options{.gamma = c.gamma, .sampling = o.sampling, .lenience = c.lenience,
                                    .scheme = c.scheme, .draft_sampling = o.draft.sampling};
    // A controller of the caller's, made for the step's longest draft (or, invalid, one more).
    std::optional<specdec::gamma_controller> controller;
    bool controller_mismatch = false;
    if (o.length.policy == specdec::gamma_policy::adaptive && (policy & 16u) && !adaptive_invalid && rs.longest > 0) {
        const bool wrong = (policy & 32u) != 0;
        const specdec::tree_shape* shape = rs.tree ? &rs.tree->shape : nullptr;
        if (shape && !shape->children.empty() && shape->children_problem() != nullptr) {
            // make_controller refuses a children list that is not a tree (decoding does too).
            bool refused = false;
            try {
                (void)specdec::make_controller(o);
            } catch (const std::invalid_argument&) {
                refused = true;
            }
            FUZZ_CHECK(refused);
        } else if (rs.tree) {  // the tree planner of the step's tree (or, invalid, of one level more)
            if (!wrong) {
                controller.emplace(specdec::make_controller(o));
            } else {
                specdec::tree_plan_limits deeper{.branching = shape->children.empty() ? shape->branching
                                                                                      : shape->widest_per_depth(),
                                                 .max_nodes = shape->max_nodes};
                deeper.branching.resize(rs.longest);
                deeper.branching.push_back(1);
                controller.emplace(deeper, o.length.adaptive);
            }
        } else {
            controller.emplace(wrong ? rs.longest + 1 : rs.longest, o.length.adaptive);
        }
        if (controller) o.length.controller = &*controller;
        controller_mismatch = wrong;
    }

    // Rejected before any model call, in either mode: invalid sampling settings (the target's or
    // the draft's), a vocabulary mismatch, an empty prompt (or sequence, in step mode) or a
    // prompt token out of range.
    const bool draft_sampling_ok = !o.draft.sampling || fuzz::valid_sampling(*o.draft.sampling);
    const bool lenience_ok = c.lenience > 0.0f && c.lenience <= 1.0f &&
                             !(c.lenience != 1.0f && c.scheme == specdec::verification_scheme::block);
    rs.upfront_invalid = !fuzz::valid_sampling(o.sampling) || !draft_sampling_ok || vocab_lie ||
                         prompt_out_of_range || rs.prompt.empty();
    if (rs.step_mode) {
        rs.upfront_invalid = rs.upfront_invalid || c.gamma == 0 || !lenience_ok;
    } else {
        const bool adaptive = o.length.policy == specdec::gamma_policy::adaptive;
        rs.upfront_invalid = rs.upfront_invalid || stop_out_of_range ||
                             !(o.draft.stop_below >= 0.0f && o.draft.stop_below <= 1.0f) ||
                             (adaptive && (adaptive_invalid || controller_mismatch || rs.longest == 0));
        if (rs.tree)  // the chain's lenience and scheme do not apply
            rs.upfront_invalid = rs.upfront_invalid || rs.tree->shape.depth() == 0 || rs.shape_invalid;
        else
            rs.upfront_invalid = rs.upfront_invalid || !lenience_ok;
    }

    switch (drafter_kind) {
        case 0: {
            fuzz_block_drafter d{&s, drafter_vocab, {}, {}};
            with_verifier(d, s, rs, verifier_kind);
            break;
        }
        case 1: {
            fuzz_lm d{&s, drafter_vocab};
            with_verifier(d, s, rs, verifier_kind);
            break;
        }
        case 2: {
            specdec::prompt_lookup_drafter d(drafter_vocab, 1 + in.byte() % 4);
            with_verifier(d, s, rs, verifier_kind);
            break;
        }
        case 3: {
            specdec::prompt_lookup_drafter lookup(drafter_vocab, 2);
            fuzz_lm model{&s, drafter_vocab};
            specdec::fallback_drafter d(lookup, model);
            with_verifier(d, s, rs, verifier_kind);
            break;
        }
        case 5: {
            // Hierarchical: the input's model decoded speculatively with prompt lookup below it.
            specdec::prompt_lookup_drafter lookup(drafter_vocab, 1);
            fuzz_lm model{&s, drafter_vocab};
            specdec::hierarchical_drafter d(lookup, model, {.gamma = 1 + in.byte() % 4u});
            with_verifier(d, s, rs, verifier_kind);
            break;
        }
        default: {
            specdec::ngram_model d(drafter_vocab, 1 + (in.byte() & 1u));
            with_verifier(d, s, rs, verifier_kind);
        }
    }
    return 0;
}
