// Fuzz harness: the batch loop, specdec::batch_decoder (specdec/batch_decoder.hpp), with small
// random models whose tables come from the fuzz input, sequences joining, leaving and finishing.
//
// Input: an instruction-set byte; the models: a vocabulary size, the target's table (rows of
// logits picked by a hash of the last 0-2 context tokens), whether the draft shares it or has its
// own; a kind byte (drafter: a plain model, a MultiSequenceDrafter with or without draft(), prompt
// lookup; verifier: a plain model, score() with score_tree(), a MultiSequenceVerifier with or
// without score_tree_batch(); whether the drafter reports a vocabulary one too large); the
// options: the step (a chain of γ with its scheme and lenience, or a tree of up to three levels,
// a node cap, either sibling draws and either tree scheme), the target's sampling (valid or not,
// temperature 0 often), the draft's own sampling (or none), the draft-side stop, the options'
// budget and stop tokens (in range or not), the fixed or adaptive length (known costs or an
// engine profile, valid settings or not, a controller of the caller's, of the right length or
// not), the threads (0 is invalid); then the sequences: 1 to 4 added first, each with a prompt
// (empty or out of range now and then), a seed and its own budget or the options'; then a
// script of operations: step, add a sequence, remove or take one (ids in the batch or not).
// Finally the decoder runs until no sequence is active.
//
// Invariants. The constructor throws std::invalid_argument exactly when the options are
// invalid (the documented conditions, written out anew), add() exactly for an empty prompt or a
// prompt or stop token out of range (changing nothing), take() and remove() exactly for an id
// not in the batch; with these well-formed models nothing else ever throws. No model sees a
// token out of range, nor a draft longer than the step's γ (tree: its depth). After every step
// each sequence has generated at most its budget, tokens in range, and exactly what its on_step
// events emitted (a step_recorder fed the same events keeps those that fitted its small
// capacity, each as reported, and counts the rest as dropped); an event's draft is at most its γ, which under the fixed policy is the chain's
// γ (or the tree's depth) capped by the tokens the sequence still needs minus one; a tree event's
// accepted path is the path of its accepted node, the tree no larger than the shape, and no node
// has a parent whose draft probability is below the draft-side stop; a chain's block (from the
// plain model) has no token but its last below the stop. A finished sequence holds exactly its
// budget, or ends with its first stop token; its statistics add up. At target temperature 0 every
// sequence's tokens (also those taken early: a prefix) equal greedy autoregressive_decode of the
// target; under the fixed policy they equal those of a separate speculative_decode run with the
// same seed, prompt and budget, whatever the other sequences did. The loop ends.

#include "fuzz_common.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <variant>

namespace {

using specdec::token_id;

/// Everything the models and the checks share.
struct world {
    Eigen::Index V = 1;
    std::size_t longest = 0;  // the step's γ or the tree's depth: the longest draft a model may see
};

/// A small deterministic model: logits from a table, the row picked by a hash of the last
/// `order` tokens of the context. Checks the tokens it is shown.
struct table_lm {
    world* w = nullptr;
    std::shared_ptr<const std::vector<Eigen::VectorXf>> rows;
    std::size_t order = 1;
    Eigen::Index reported_vocab = 1;

    std::ptrdiff_t vocab_size() const { return reported_vocab; }
    FUZZ_NO_COVERAGE const Eigen::VectorXf& row(std::span<const token_id> context) const {
        std::uint64_t h = 1469598103934665603ull;
        for (const token_id t : context) FUZZ_CHECK(t >= 0 && t < w->V);
        const std::size_t k = std::min(order, context.size());
        for (std::size_t i = context.size() - k; i < context.size(); ++i)
            h = (h ^ static_cast<std::uint64_t>(context[i] + 1)) * 1099511628211ull;
        return (*rows)[h % rows->size()];
    }
    Eigen::VectorXf next_logits(std::span<const token_id> context) const { return row(context); }
    /// The logits after context + extra (scratch: `buf`).
    const Eigen::VectorXf& after(std::span<const token_id> context, std::span<const token_id> extra,
                                 std::vector<token_id>& buf) const {
        for (const token_id t : extra) FUZZ_CHECK(t >= 0 && t < w->V);
        buf.assign(context.begin(), context.end());
        buf.insert(buf.end(), extra.begin(), extra.end());
        return row(buf);
    }
};

/// Chain drafts of all sequences in one call (each drafted as model_drafter drafts it alone).
struct multi_drafter {
    table_lm* m;
    specdec::model_drafter<table_lm> md{*m};
    std::ptrdiff_t vocab_size() const { return m->vocab_size(); }
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& s) {
        for (auto& r : requests) {
            FUZZ_CHECK(r.gamma >= 1 && r.gamma <= m->w->longest);
            FUZZ_CHECK(r.out != nullptr && r.out->tokens.empty());
            md.draft(r.context, r.gamma, s, r.uniforms, *r.out);
        }
    }
};
/// The same, also a BlockDrafter (so trees can draft with it, as chains).
struct multi_block_drafter : multi_drafter {
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        FUZZ_CHECK(gamma <= m->w->longest);
        md.draft(context, gamma, s, u, out);
    }
};

/// A BatchVerifier and TreeVerifier over a table.
struct scoring_verifier {
    table_lm* m;
    std::vector<token_id> buf, path;
    std::ptrdiff_t vocab_size() const { return m->vocab_size(); }
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) {
        FUZZ_CHECK(draft.size() <= m->w->longest);
        Eigen::MatrixXf out(m->w->V, static_cast<Eigen::Index>(draft.size()) + 1);
        for (std::size_t j = 0; j <= draft.size(); ++j)
            out.col(static_cast<Eigen::Index>(j)) = m->after(context, draft.first(j), buf);
        return out;
    }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        out.resize(m->w->V, static_cast<Eigen::Index>(tree.size()) + 1);
        fill_tree(context, tree, out);
    }
    template <class Out>
    void fill_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Out&& out) {
        FUZZ_CHECK(static_cast<std::size_t>(tree.max_depth()) <= m->w->longest);
        out.col(0) = m->after(context, {}, buf);
        for (std::size_t i = 0; i < tree.size(); ++i) {
            specdec::path_tokens(tree, static_cast<std::int32_t>(i), path);
            out.col(static_cast<Eigen::Index>(i) + 1) = m->after(context, path, buf);
        }
    }
};

/// All sequences' chains in one pass (score_batch) only: trees are invalid with it.
struct multi_verifier {
    table_lm* m;
    std::vector<token_id> buf;
    std::ptrdiff_t vocab_size() const { return m->vocab_size(); }
    void score_batch(std::span<const specdec::score_request> requests, specdec::packed_logits& out) {
        FUZZ_CHECK(out.size() == requests.size());
        for (std::size_t k = 0; k < requests.size(); ++k) {
            const auto& r = requests[k];
            FUZZ_CHECK(r.draft.size() <= m->w->longest);
            auto cols = out.sequence(k);
            FUZZ_CHECK(cols.cols() == static_cast<Eigen::Index>(r.draft.size()) + 1);
            for (std::size_t j = 0; j <= r.draft.size(); ++j)
                cols.col(static_cast<Eigen::Index>(j)) = m->after(r.context, r.draft.first(j), buf);
        }
    }
};
/// Chains and trees of all sequences in one pass each.
struct multi_tree_verifier : multi_verifier {
    scoring_verifier trees{m};
    void score_tree_batch(std::span<const specdec::tree_score_request> requests, specdec::packed_logits& out) {
        FUZZ_CHECK(out.size() == requests.size());
        for (std::size_t k = 0; k < requests.size(); ++k) {
            auto cols = out.sequence(k);
            FUZZ_CHECK(cols.cols() == static_cast<Eigen::Index>(requests[k].tree->size()) + 1);
            trees.fill_tree(requests[k].context, *requests[k].tree, cols);
        }
    }
};

/// Counters that must add up after a run: decode_fuzz's checks, and the steps by γ.
void check_stats(const specdec::decode_stats& st) {
    fuzz::check_stats(st);
    std::size_t steps = 0;
    for (const std::size_t n : st.steps_at_gamma) steps += n;
    FUZZ_CHECK(steps == st.steps);
}

/// One sequence as the harness follows it.
struct tracked {
    std::vector<token_id> prompt;
    std::vector<token_id> sequence;  // prompt, then what its events emitted
    specdec::decode_budget budget;
    std::uint64_t seed = 0;
};

struct settings {
    world w;
    specdec::decode_options options;
    bool invalid = false;            // the constructor must throw
    std::size_t threads = 1;
    const specdec::tree* tree = nullptr;
    bool fixed = true;
    table_lm* draft_model = nullptr;  // the plain model behind the drafter (null: prompt lookup)
    table_lm* target = nullptr;
};

/// A prompt of 0-6 tokens; `bad` is set for an empty prompt or a token out of range.
std::vector<token_id> prompt_of(fuzz::input& in, Eigen::Index V, bool& bad) {
    const std::size_t n = in.byte() % 7;
    std::vector<token_id> p;
    bad = n == 0;
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint8_t b = in.byte();
        const token_id t = b < 250 ? static_cast<token_id>(in.byte() % V) : static_cast<token_id>(V + b - 252);
        bad = bad || t < 0 || t >= V;
        p.push_back(t);
    }
    return p;
}

std::vector<token_id> stop_tokens_of(fuzz::input& in, Eigen::Index V, bool& bad) {
    const std::size_t n = in.byte() % 3;
    std::vector<token_id> s;
    bad = false;
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint8_t b = in.byte();
        const token_id t = b < 252 ? static_cast<token_id>(in.byte() % V) : static_cast<token_id>(V + b - 254);
        bad = bad || t < 0 || t >= V;
        s.push_back(t);
    }
    return s;
}

/// The draft's probability of each token of a chain's block, recomputed (-1 where unknown).
FUZZ_NO_COVERAGE float draft_probability(const settings& st, std::span<const token_id> context,
                                         std::span<const token_id> before, token_id x) {
    static thread_local std::vector<token_id> buf;
    static thread_local specdec::sampling_workspace sws;
    const Eigen::VectorXf& z = st.draft_model->after(context, before, buf);
    Eigen::VectorXf q(z.size());
    const specdec::sampling_config& s = st.options.draft.sampling ? *st.options.draft.sampling : st.options.sampling;
    specdec::standardize(z, s, q, sws);
    return q[x];
}

template <class D, class Vf>
void run(D& drafter, Vf& verifier, settings& st, fuzz::input& in) {
    const Eigen::Index V = st.w.V;
    std::vector<std::optional<tracked>> seqs;  // by id
    std::size_t events = 0;
    specdec::batch_decoder<D, Vf>* self = nullptr;
    fuzz::trace_check trace(static_cast<std::size_t>(V) * 7u + st.w.longest * 3u + st.options.budget.max_new_tokens);
    st.options.on_step = [&](const specdec::step_event& e) {
        ++events;
        trace.record(e);
        FUZZ_CHECK(self != nullptr && self->contains(e.sequence));
        FUZZ_CHECK(e.sequence < seqs.size() && seqs[e.sequence]);
        tracked& t = *seqs[e.sequence];
        const std::size_t generated = t.sequence.size() - t.prompt.size();
        FUZZ_CHECK(generated < t.budget.max_new_tokens);
        FUZZ_CHECK(e.gamma <= st.w.longest && e.gamma <= t.budget.max_new_tokens - generated - 1);
        if (st.fixed) FUZZ_CHECK(e.gamma == std::min(st.w.longest, t.budget.max_new_tokens - generated - 1));
        FUZZ_CHECK(e.accepted <= e.draft.size());
        FUZZ_CHECK(e.emitted.size() >= 1 && e.emitted.size() <= e.accepted + 1);
        FUZZ_CHECK(e.next_token >= 0 && e.next_token < V);
        FUZZ_CHECK(e.target_passes >= 1);
        for (const token_id x : e.draft) FUZZ_CHECK(x >= 0 && x < V);
        for (const token_id x : e.emitted) FUZZ_CHECK(x >= 0 && x < V);
        // The emitted tokens: the accepted draft, then the next token, cut after a stop token.
        for (std::size_t i = 0; i < e.emitted.size(); ++i)
            FUZZ_CHECK(e.emitted[i] == (i < e.accepted ? e.draft[i] : e.next_token));
        const std::span<const token_id> context(t.sequence);
        // Under the tree planner a step planned as a chain (or a plain step) may run as a chain
        // step (detail::chains_as_chains); with a fixed shape every step is a tree.
        if (st.tree && e.tree == nullptr)
            FUZZ_CHECK(!st.fixed && e.draft.size() <= std::max<std::size_t>(st.tree->shape.depth(), 1));
        if (e.tree != nullptr) {
            FUZZ_CHECK(st.tree != nullptr);
            const specdec::draft_tree& tr = *e.tree;
            FUZZ_CHECK(e.draft.size() == e.accepted);
            FUZZ_CHECK(tr.size() <= st.tree->shape.nodes());
            FUZZ_CHECK(static_cast<std::size_t>(tr.max_depth()) <= e.gamma);
            FUZZ_CHECK((e.last_node < 0) == (e.accepted == 0));
            FUZZ_CHECK(e.last_node >= -1 && e.last_node < static_cast<std::int32_t>(tr.size()));
            std::vector<token_id> path;
            specdec::path_tokens(tr, e.last_node, path);
            FUZZ_CHECK(std::equal(path.begin(), path.end(), e.draft.begin(), e.draft.end()));
            for (const token_id x : tr.tokens) FUZZ_CHECK(x >= 0 && x < V);
            const float stop = st.options.draft.stop_below;
            if (stop > 0.0f && tr.has_distributions())
                for (std::size_t i = 0; i < tr.size(); ++i) {
                    const std::int32_t p = tr.parents[i];
                    if (p >= 0) FUZZ_CHECK(!(tr.probs(tr.tokens[static_cast<std::size_t>(p)], p) < stop));
                }
        } else {
            FUZZ_CHECK(e.tree == nullptr && e.last_node == -1);
            FUZZ_CHECK(e.draft.size() <= e.gamma);
            FUZZ_CHECK(e.acceptance.size() <= e.draft.size());
            // The draft-side stop on a plain model's block: no token but the last below it
            // (recomputed with standardize(); a margin for the fused draw's rounding).
            const float stop = st.options.draft.stop_below;
            if (stop > 0.0f && st.draft_model && !e.draft.empty())
                for (std::size_t i = 0; i + 1 < e.draft.size(); ++i) {
                    const float q = draft_probability(st, context, e.draft.first(i), e.draft[i]);
                    FUZZ_CHECK(!(q < stop * (1.0f - 1e-4f) - 1e-30f));
                }
        }
        t.sequence.insert(t.sequence.end(), e.emitted.begin(), e.emitted.end());
    };

    // Construction: throws exactly for invalid options.
    std::optional<specdec::batch_decoder<D, Vf>> dec;
    try {
        dec.emplace(drafter, verifier, st.options, st.threads);
    } catch (const std::invalid_argument&) {
        FUZZ_CHECK(st.invalid);
        return;
    }
    FUZZ_CHECK(!st.invalid);
    self = &*dec;
    if (st.options.length.controller) FUZZ_CHECK(dec->controller() == st.options.length.controller);
    if (st.fixed) FUZZ_CHECK(dec->controller() == nullptr);

    // The references a sequence's output must match (see the file comment); `complete`: the
    // sequence finished (else a prefix).
    const auto check_result = [&](const tracked& t, const specdec::decode_result& r, bool complete) {
        for (const token_id x : r.tokens) FUZZ_CHECK(x >= 0 && x < V);
        FUZZ_CHECK(std::equal(r.tokens.begin(), r.tokens.end(), t.sequence.begin() + static_cast<std::ptrdiff_t>(t.prompt.size()),
                              t.sequence.end()));
        FUZZ_CHECK(r.tokens.size() <= t.budget.max_new_tokens);
        check_stats(r.stats);
        const auto is_stop = [&](token_id x) {
            return std::find(t.budget.stop_tokens.begin(), t.budget.stop_tokens.end(), x) != t.budget.stop_tokens.end();
        };
        const std::size_t last_ok = complete && r.stop == specdec::stop_reason::stop_token ? 1 : 0;
        for (std::size_t i = 0; i + last_ok < r.tokens.size(); ++i) FUZZ_CHECK(!is_stop(r.tokens[i]));
        if (complete) {
            if (r.stop == specdec::stop_reason::max_new_tokens) FUZZ_CHECK(r.tokens.size() == t.budget.max_new_tokens);
            else FUZZ_CHECK(!r.tokens.empty() && is_stop(r.tokens.back()));
        }
        specdec::decode_options solo = st.options;
        solo.on_step = nullptr;
        solo.budget = t.budget;
        if (st.options.sampling.temperature == 0.0f) {
            std::mt19937_64 rng(t.seed);
            const auto ar = specdec::autoregressive_decode(*st.target, t.prompt, solo, rng);
            if (complete) FUZZ_CHECK(ar.tokens == r.tokens);
            else FUZZ_CHECK(r.tokens.size() <= ar.tokens.size() && std::equal(r.tokens.begin(), r.tokens.end(), ar.tokens.begin()));
        }
        if (st.fixed) {
            solo.length.controller = nullptr;
            const auto one = specdec::speculative_decode(drafter, verifier, t.prompt, solo, std::mt19937_64(t.seed));
            if (complete) {
                FUZZ_CHECK(one.tokens == r.tokens && one.stop == r.stop);
                FUZZ_CHECK(one.stats.steps == r.stats.steps && one.stats.accepted_tokens == r.stats.accepted_tokens &&
                           one.stats.drafted_tokens == r.stats.drafted_tokens &&
                           one.stats.target_calls == r.stats.target_calls);
            } else {
                FUZZ_CHECK(r.tokens.size() <= one.tokens.size() &&
                           std::equal(r.tokens.begin(), r.tokens.end(), one.tokens.begin()));
            }
        }
    };

    // After every step: budgets, ranges, and the events spelling each sequence's output.
    const auto check_all = [&] {
        std::size_t active = 0;
        for (std::size_t id = 0; id < seqs.size(); ++id) {
            FUZZ_CHECK(dec->contains(id) == seqs[id].has_value());
            if (!seqs[id]) continue;
            const tracked& t = *seqs[id];
            const auto g = dec->generated(id);
            FUZZ_CHECK(g.size() <= t.budget.max_new_tokens);
            FUZZ_CHECK(std::equal(g.begin(), g.end(), t.sequence.begin() + static_cast<std::ptrdiff_t>(t.prompt.size()),
                                  t.sequence.end()));
            if (dec->finished(id)) {
                const bool stopped = !g.empty() && std::find(t.budget.stop_tokens.begin(), t.budget.stop_tokens.end(),
                                                             g.back()) != t.budget.stop_tokens.end();
                FUZZ_CHECK(g.size() == t.budget.max_new_tokens || stopped);
            } else {
                FUZZ_CHECK(g.size() < t.budget.max_new_tokens);
                ++active;
            }
        }
        FUZZ_CHECK(dec->active() == active);
    };

    const auto add = [&] {
        tracked t;
        bool bad_prompt = false, bad_stop = false;
        t.prompt = prompt_of(in, V, bad_prompt);
        t.seed = in.u32();
        const std::uint8_t b = in.byte();
        const bool own_budget = (b & 1u) != 0;
        t.budget = st.options.budget;
        if (own_budget) {
            t.budget.max_new_tokens = in.byte() % 24;
            t.budget.stop_tokens = stop_tokens_of(in, V, bad_stop);
        }
        const std::size_t before = dec->active();
        std::size_t id = 0;
        try {
            id = own_budget ? dec->add(t.prompt, std::mt19937_64(t.seed), t.budget)
                            : dec->add(t.prompt, std::mt19937_64(t.seed));
        } catch (const std::invalid_argument&) {
            FUZZ_CHECK(bad_prompt || bad_stop);
            FUZZ_CHECK(dec->active() == before);
            return;
        }
        FUZZ_CHECK(!bad_prompt && !bad_stop);
        // The lowest free id.
        for (std::size_t k = 0; k < id; ++k) FUZZ_CHECK(k < seqs.size() && seqs[k]);
        FUZZ_CHECK(id >= seqs.size() || !seqs[id]);
        if (id >= seqs.size()) seqs.resize(id + 1);
        t.sequence = t.prompt;
        seqs[id] = std::move(t);
        FUZZ_CHECK(dec->contains(id) && dec->finished(id) == (seqs[id]->budget.max_new_tokens == 0));
    };
    const auto live = [&] {
        std::size_t n = 0;
        for (const auto& s : seqs) n += s.has_value();
        return n;
    };
    const auto step = [&] {
        const std::size_t before = events;
        std::size_t left = 0;
        try {
            left = dec->step();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "batch_decoder::step threw: %s\n", e.what());
            FUZZ_CHECK(!"step() threw with well-formed models");
        }
        FUZZ_CHECK(left == dec->active());
        FUZZ_CHECK(events >= before);
        check_all();
    };

    const std::size_t first = 1 + in.byte() % 4;
    for (std::size_t i = 0; i < first; ++i) add();
    check_all();
    const std::size_t ops = in.byte() % 12;
    for (std::size_t k = 0; k < ops; ++k) {
        const std::uint8_t op = in.byte();
        switch (op % 6) {
            case 3:
                if (live() < 4) add();
                break;
            case 4:
            case 5: {  // remove or take an id, in the batch or not
                const std::size_t id = in.byte() % 6;
                const bool here = id < seqs.size() && seqs[id];
                try {
                    if (op % 6 == 4) {
                        dec->remove(id);
                    } else {
                        const bool complete = dec->finished(id);
                        const specdec::decode_result r = dec->take(id);
                        check_result(*seqs[id], r, complete);
                    }
                } catch (const std::invalid_argument&) {
                    FUZZ_CHECK(!here);
                    break;
                }
                FUZZ_CHECK(here && !dec->contains(id));
                seqs[id].reset();
                check_all();
                break;
            }
            default: step();
        }
    }
    // Until the end: every active sequence gains a token per step.
    std::size_t steps = 0;
    while (dec->active() != 0) {
        step();
        FUZZ_CHECK(++steps <= 64);
    }
    for (std::size_t id = 0; id < seqs.size(); ++id) {
        if (!seqs[id]) continue;
        FUZZ_CHECK(dec->finished(id));
        const specdec::decode_result r = dec->take(id);
        check_result(*seqs[id], r, true);
    }
    trace.check();
}

template <class D>
void with_verifier(D& drafter, settings& st, std::uint8_t which, fuzz::input& in) {
    switch (which % 4) {
        case 0: {
            table_lm v = *st.target;
            run(drafter, v, st, in);
            break;
        }
        case 1: {
            scoring_verifier v{st.target};
            run(drafter, v, st, in);
            break;
        }
        case 2: {
            if (st.tree) st.invalid = true;  // chains only
            multi_verifier v{st.target};
            run(drafter, v, st, in);
            break;
        }
        default: {
            multi_tree_verifier v{{st.target}};
            run(drafter, v, st, in);
        }
    }
}

/// Rows of logits (moderate values, ties and -Inf; never a row all -Inf).
std::shared_ptr<const std::vector<Eigen::VectorXf>> table_of(fuzz::input& in, Eigen::Index V) {
    auto rows = std::make_shared<std::vector<Eigen::VectorXf>>(1 + in.byte() % 6);
    for (Eigen::VectorXf& r : *rows) {
        r.resize(V);
        fuzz::fill_cycled(in, r, in.range(1, 8), [](fuzz::input& i) {
            const std::uint8_t b = i.byte();
            return b == 1 ? -std::numeric_limits<float>::infinity() : (static_cast<float>(b) - 128.0f) * 0.125f;
        });
        if (fuzz::bad_logit_row(r)) r[static_cast<Eigen::Index>(in.byte()) % V] = 0.0f;
    }
    return rows;
}

float pick(fuzz::input& in, std::initializer_list<float> values, float usual) {
    const std::uint8_t b = in.byte();
    if (b < 160) return usual;
    return values.begin()[b % values.size()];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::input in(data, size);
    fuzz::pick_isa(in);
    settings st;
    const std::uint8_t vb = in.byte();
    st.w.V = vb < 250 ? 1 + vb % 24 : 1 + static_cast<Eigen::Index>(in.u16() % 2500);
    const Eigen::Index V = st.w.V;
    table_lm target{&st.w, table_of(in, V), in.byte() % 3u, V};
    const std::uint8_t db = in.byte();
    table_lm draft = target;
    if (db & 1u) draft.rows = table_of(in, V);
    draft.order = (db >> 1) % 3u;
    const std::uint8_t kind = in.byte();
    const bool vocab_lie = (kind & 0x80u) != 0 && in.byte() >= 200;
    draft.reported_vocab = vocab_lie ? V + 1 : V;
    st.target = &target;

    // The options.
    auto& o = st.options;
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    const std::uint8_t step_byte = in.byte();
    specdec::chain c{.gamma = in.byte() % 7u};
    c.scheme = (step_byte & 1u) ? specdec::verification_scheme::token : specdec::verification_scheme::block;
    c.lenience = pick(in, {0.5f, 0.0f, -1.0f, nan, 2.0f}, 1.0f);
    c.estimate_acceptance = (step_byte & 2u) != 0;
    o.step = c;
    st.w.longest = c.gamma;
    bool invalid = false;
    if (step_byte >= 160) {
        specdec::tree t{.shape = {.branching = {}}};
        const bool shape_invalid = fuzz::tree_shape_bytes(in, 1u + step_byte % 3u, t.shape);
        t.shape.max_nodes = (step_byte & 8u) ? in.byte() % 8 : 0;
        t.shape.draws = (step_byte & 16u) ? specdec::sibling_draws::iid : specdec::sibling_draws::without_replacement;
        t.scheme = (step_byte & 32u) ? specdec::tree_verification_scheme::recursive_rejection
                                     : specdec::tree_verification_scheme::traversal;
        t.estimate_sibling_acceptance = (step_byte & 2u) != 0;
        o.step = t;
        st.tree = &std::get<specdec::tree>(o.step);
        st.w.longest = t.shape.depth();
        invalid = invalid || st.w.longest == 0 || shape_invalid;
    } else {
        invalid = invalid || !(c.lenience > 0.0f && c.lenience <= 1.0f) ||
                  (c.lenience != 1.0f && c.scheme == specdec::verification_scheme::block);
    }
    // The target's sampling: temperature 0 half the time (then greedy identity is checked).
    const std::uint8_t sb = in.byte();
    o.sampling = fuzz::sampling(in);
    if (sb < 128) o.sampling.temperature = 0.0f;
    invalid = invalid || !fuzz::valid_sampling(o.sampling);
    if (sb & 1u) {
        o.draft.sampling = fuzz::sampling(in);
        invalid = invalid || !fuzz::valid_sampling(*o.draft.sampling);
    }
    o.draft.stop_below = pick(in, {0.1f, 0.5f, 1.0f, 0.3f, 0.05f, 0.9f, -0.1f, 1.5f, nan}, 0.0f);
    invalid = invalid || !(o.draft.stop_below >= 0.0f && o.draft.stop_below <= 1.0f);
    bool bad_stop = false;
    o.budget.max_new_tokens = in.byte() % 24;
    o.budget.stop_tokens = stop_tokens_of(in, V, bad_stop);
    invalid = invalid || bad_stop || vocab_lie;

    // The length: fixed, or adaptive with known costs or a profile (never timed, so an input
    // replays the same run), valid settings or not, and maybe a controller of the caller's.
    const std::uint8_t policy = in.byte();
    std::optional<specdec::gamma_controller> controller;
    if (policy >= 128) {
        st.fixed = false;
        o.length.policy = specdec::gamma_policy::adaptive;
        auto& a = o.length.adaptive;
        static constexpr double costs[] = {1.0, 0.1, 10.0, 0.0, 0.02, 1e300};
        const double draft_cost = costs[in.byte() % 6], pass_base = costs[in.byte() % 6], pass_slope = costs[in.byte() % 6];
        bool adaptive_invalid = false;
        if (policy & 1u) {
            specdec::engine_profile p;
            const std::size_t n = 1 + in.byte() % 4;
            for (std::size_t i = 0; i < n; ++i) p.target_pass.push_back(pass_base + pass_slope * static_cast<double>(i + 1));
            p.draft_step = {draft_cost};
            // An even table length: tree passes at 1.5x the chain passes (tree_pass).
            if (n % 2 == 0)
                for (const double t : p.target_pass) p.tree_pass.push_back(1.5 * t);
            // Valid: a first pass > 0 and every entry at most 1e30 (the tables only grow).
            adaptive_invalid = !(p.target_pass[0] > 0.0) || !(p.target_pass.back() <= 1e30) ||
                               (!p.tree_pass.empty() && !(p.tree_pass.back() <= 1e30)) || !(draft_cost <= 1e30);
            a.profile = p;
        }
        if (policy & 2u) {
            a.draft_cost = [draft_cost](std::size_t n) { return draft_cost * static_cast<double>(n); };
            if (!(policy & 4u)) a.pass_cost = [=](std::size_t m) { return pass_base + pass_slope * static_cast<double>(m); };
            adaptive_invalid = adaptive_invalid || (policy & 4u) || a.profile.has_value();  // one callback, or both kinds
        } else if (!a.profile) {
            a.profile = specdec::engine_profile{.target_pass = {1.0}, .draft_step = {0.1}};
        }
        a.explore_every = in.byte() % 6;
        a.max_explore_every = in.byte() % 9;
        const bool prior_invalid = fuzz::window_and_prior(in, a);  // window 0 is invalid
        a.explore_budget = (policy & 8u) ? 1.5 : 0.05;  // 1.5 is invalid
        a.per_sequence = (policy & 16u) != 0;
        a.drain = (in.byte() & 1u) != 0;
        adaptive_invalid = adaptive_invalid || a.window == 0 || a.explore_budget > 1.0 || prior_invalid;
        if ((policy & 32u) && st.w.longest > 0) {
            // A controller of the caller's: make_controller's, or one of another length.
            const bool wrong = (policy & 64u) != 0;
            // make_controller refuses a children list that is not a tree (the decoder does too).
            const bool listed_bad = st.tree && !st.tree->shape.children.empty() &&
                                    st.tree->shape.children_problem() != nullptr;
            try {
                if (!wrong) {
                    controller.emplace(specdec::make_controller(o));
                    FUZZ_CHECK(!listed_bad);
                } else if (st.tree) {
                    if (listed_bad) return 0;  // (a controller of one level more: nothing to make it from)
                    const specdec::tree_shape& shape = st.tree->shape;
                    specdec::tree_plan_limits deeper{
                        .branching = shape.children.empty() ? shape.branching : shape.widest_per_depth(),
                        .max_nodes = shape.max_nodes};
                    deeper.branching.resize(st.w.longest);
                    deeper.branching.push_back(1);
                    controller.emplace(deeper, a);
                } else {
                    controller.emplace(st.w.longest + 1, a);
                }
                FUZZ_CHECK(!adaptive_invalid);
            } catch (const std::invalid_argument&) {
                FUZZ_CHECK(adaptive_invalid || listed_bad);
                return 0;
            }
            o.length.controller = &*controller;
            invalid = invalid || wrong;
        } else {
            invalid = invalid || adaptive_invalid;
        }
        invalid = invalid || st.w.longest == 0;  // adaptive needs a draft
    }
    const std::uint8_t tb = in.byte();
    st.threads = tb % 16 == 0 ? 0 : (tb % 16 == 1 ? 2 : 1);
    invalid = invalid || st.threads == 0;
    st.invalid = invalid;

    const std::uint8_t which_verifier = kind & 3u;
    switch ((kind >> 2) % 5) {
        case 0: {
            st.draft_model = &draft;
            with_verifier(draft, st, which_verifier, in);
            break;
        }
        case 1: {  // chains only
            st.draft_model = &draft;
            if (st.tree) st.invalid = true;
            multi_drafter d{&draft};
            with_verifier(d, st, which_verifier, in);
            break;
        }
        case 2: {
            st.draft_model = &draft;
            multi_block_drafter d{{&draft}};
            with_verifier(d, st, which_verifier, in);
            break;
        }
        default: {
            specdec::prompt_lookup_drafter d(draft.reported_vocab, 1 + in.byte() % 3);
            with_verifier(d, st, which_verifier, in);
        }
    }
    return 0;
}
