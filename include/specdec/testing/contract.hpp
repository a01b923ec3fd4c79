#pragma once
/// \file
/// Does each logit vector a model returns equal a fresh model's for the same tokens, whatever
/// the calls before it? The adapter contract (concepts.hpp: LanguageModel 1, BatchVerifier 1-2,
/// TreeVerifier 1-3): check_contract and check_contract_with, and the runner of its scenarios
/// (copies, a fresh model, a growing context, rejections, shrinking contexts, arbitrary order,
/// two copies in turn, tree steps).
///
/// Part of the conformance kit (specdec/testing.hpp, which includes every check and defines
/// run_conformance). Not included by specdec/specdec.hpp.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "../concepts.hpp"
#include "../decode_options.hpp"
#include "../tree.hpp"
#include "../types.hpp"
#include "report.hpp"

namespace specdec::testing {

namespace detail {

/// The adapter-contract check (see check_contract).
template <Verifier M, class Make>
class contract_runner {
public:
    contract_runner(M& model, Make& make, const conformance_options& o)
        : model_(model), make_(make), o_(o), rng_(o.seed) {
        vocab_ = static_cast<std::ptrdiff_t>(model.vocab_size());
        r_.check = "adapter contract";
        r_.max_error = 0.0;
    }

    report run() {
        const auto t0 = std::chrono::steady_clock::now();
        if (vocab_ <= 0) {
            fail("vocab_size() = " + std::to_string(vocab_) + " must be positive");
        } else if (o_.max_context < o_.prompt.size() + max_draft() + 2) {
            fail("max_context = " + std::to_string(o_.max_context) + " leaves no room for a context after the " +
                 std::to_string(o_.prompt.size()) + "-token prompt and a draft of " + std::to_string(max_draft()));
        } else {
            for (token_id t : o_.prompt)
                if (t < 0 || t >= vocab_) {
                    fail("the prompt's token " + std::to_string(t) + " is outside [0, " + std::to_string(vocab_) + ")");
                    break;
                }
            if (r_.passed) scenarios();
        }
        std::string reached;
        for (const char* s : reached_) reached += std::string(reached.empty() ? "" : ", ") + s;
        r_.ran = std::to_string(columns_) + " logit vectors compared with a fresh model's (" + std::to_string(calls_) +
                 " calls; scenarios: " + reached + "; draft lengths 0.." + std::to_string(max_draft()) +
                 ", contexts up to " + std::to_string(o_.max_context) + " tokens), tolerance " +
                 number(o_.tolerance) + " in total variation";
        r_.seconds = seconds_between(t0);
        return r_;
    }

private:
    using seq = std::vector<token_id>;

    std::size_t max_draft() const { return longest_draft(o_.decode.step, o_) + 1; }

    void fail(std::string why) {
        if (!r_.passed) return;
        r_.passed = false;
        r_.failure = std::move(why);
    }

    token_id random_token() { return static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)); }
    std::size_t uniform(std::size_t lo, std::size_t hi) {  // in [lo, hi]
        return lo + static_cast<std::size_t>(rng_() % static_cast<std::uint64_t>(hi - lo + 1));
    }
    std::size_t min_len() const { return o_.prompt.size() + 1; }
    /// The longest context a call starts from: room for the longest draft before max_context.
    std::size_t max_len() const { return o_.max_context - max_draft(); }
    seq random_sequence(std::size_t len) {
        seq s = o_.prompt;
        while (s.size() < len) s.push_back(random_token());
        return s;
    }
    seq random_draft(std::size_t room) {
        seq d;
        const std::size_t n = uniform(0, std::min(max_draft(), room));
        for (std::size_t i = 0; i < n; ++i) d.push_back(random_token());
        return d;
    }

    /// A fresh model's distribution after `s` (memoized).
    const std::vector<double>& reference(const seq& s) {
        auto it = refs_.find(s);
        if (it != refs_.end()) return it->second;
        auto fresh = make_();
        const Eigen::VectorXf z = single_logits(fresh, s);
        distribution d;
        if (z.size() != vocab_)
            d.problem = "returned " + std::to_string(z.size()) + " logits; vocab_size() is " + std::to_string(vocab_);
        else
            d = to_distribution(z);
        if (!d.problem.empty()) {
            fail("a fresh model's logits after " + tokens_text(s) + " are invalid: " + d.problem);
            d.p.assign(static_cast<std::size_t>(vocab_), 1.0 / static_cast<double>(vocab_));
        }
        return refs_.emplace(s, std::move(d.p)).first->second;
    }

    /// Compares logits `z` that should follow `prefix` with a fresh model's. `what` names the
    /// call; `where` the scenario and history. On a mismatch, looks for the prefix one token
    /// shorter or longer that they do match (logits shifted by one position).
    bool compare(const Eigen::VectorXf& z, const seq& prefix, const seq& longer, const std::string& what,
                 const std::string& where) {
        ++columns_;
        if (z.size() != vocab_) {
            fail(what + " returned " + std::to_string(z.size()) + " logits; vocab_size() is " + std::to_string(vocab_) +
                 " (" + where + ")");
            return false;
        }
        const auto d = to_distribution(z);
        if (!d.problem.empty()) {
            fail(what + " after " + tokens_text(prefix) + ": " + d.problem + " (" + where + ")");
            return false;
        }
        const auto& ref = reference(prefix);
        if (!r_.passed) return false;
        const double e = total_variation(d.p, ref);
        r_.max_error = std::max(r_.max_error, e);
        if (e <= o_.tolerance) return true;
        std::string why = what + " after " + std::to_string(prefix.size()) + " tokens " + tokens_text(prefix) +
                          " differs from a fresh model's logits for the same tokens: total variation " + number(e) +
                          " > tolerance " + number(o_.tolerance) + " (" + where + ")";
        const std::size_t unhinted = why.size();
        if (prefix.size() >= 2) {
            const seq shorter(prefix.begin(), prefix.end() - 1);
            if (total_variation(d.p, reference(shorter)) <= o_.tolerance)
                why += "; they equal the logits after the first " + std::to_string(shorter.size()) +
                       " tokens: shifted by one position (the logits of position i returned for position i+1; "
                       "check the offset where the scores are sliced)";
        }
        if (longer.size() == prefix.size() + 1 && total_variation(d.p, reference(longer)) <= o_.tolerance)
            why += "; they equal the logits after " + std::to_string(longer.size()) +
                   " tokens: shifted by one position (the logits of position i+1 returned for position i; "
                   "check the offset where the scores are sliced)";
        if (why.size() == unhinted && e < rounding_like_error) why += rounding_hint(e);
        fail(std::move(why));
        return false;
    }

    /// One call the library would make: score(context, draft) (score_into when the verifier has
    /// it) for a BatchVerifier, next_logits per position otherwise; every column is compared.
    /// Sometimes also next_logits(context) alone, which autoregressive_decode calls.
    bool probe(M& m, const seq& context, const seq& draft, const std::string& where, seq& last) {
        ++calls_;
        seq full = context;
        full.insert(full.end(), draft.begin(), draft.end());
        if constexpr (BatchVerifier<M>) {
            Eigen::MatrixXf s;
            if constexpr (InPlaceBatchVerifier<M>) {
                m.score_into(context, draft, scratch_);
                s = scratch_;
            } else {
                s = m.score(context, draft);
            }
            if (s.rows() != vocab_ || s.cols() != static_cast<Eigen::Index>(draft.size() + 1)) {
                fail("score(context of " + std::to_string(context.size()) + " tokens, draft of " +
                     std::to_string(draft.size()) + ") returned " + std::to_string(s.rows()) + " x " +
                     std::to_string(s.cols()) + "; expected " + std::to_string(vocab_) + " x " +
                     std::to_string(draft.size() + 1) + " (" + where + ")");
                return false;
            }
            for (std::size_t j = 0; j <= draft.size(); ++j) {
                const seq prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j));
                const seq longer(full.begin(),
                                 full.begin() + static_cast<std::ptrdiff_t>(context.size() + std::min(j + 1, draft.size())));
                const Eigen::VectorXf col = s.col(static_cast<Eigen::Index>(j));
                if (!compare(col, prefix, longer,
                             "score(context of " + std::to_string(context.size()) + " tokens, draft of " +
                                 std::to_string(draft.size()) + ") column " + std::to_string(j),
                             where))
                    return false;
            }
            last = full;
        }
        if constexpr (LanguageModel<M>) {
            // Without score(), the library calls next_logits once per position (model_verifier).
            const std::size_t upto = BatchVerifier<M> ? (rng_() % 2 == 0 ? 0 : 1) : draft.size() + 1;
            for (std::size_t j = 0; j < upto; ++j) {
                const seq prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j));
                const seq longer(full.begin(),
                                 full.begin() + static_cast<std::ptrdiff_t>(context.size() + std::min(j + 1, draft.size())));
                const Eigen::VectorXf z = m.next_logits(prefix);
                if (!compare(z, prefix, longer, "next_logits(" + std::to_string(prefix.size()) + " tokens)", where))
                    return false;
                last = prefix;
            }
        }
        return true;
    }

    static std::size_t common_prefix(const seq& a, const seq& b) {
        std::size_t k = 0;
        while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
        return k;
    }

    /// How `context` relates to what the model last held, in words.
    static std::string history(const seq& last, const seq& context) {
        const std::size_t k = common_prefix(last, context);
        std::string s = "the model last held " + std::to_string(last.size()) + " tokens; this context has " +
                        std::to_string(context.size()) + " and shares the first " + std::to_string(k) + " of them";
        if (last.empty()) return s;
        if (k == last.size()) return s + ", a plain continuation";
        if (k == context.size())
            return s + ": it is a prefix of what the model held (is the cache cut back when the context gets "
                       "shorter?)";
        return s + ", then differs: " + std::to_string(last.size() - k) +
               " held tokens are dropped for other ones, as after a rejected draft (does the cache roll back to "
               "the longest common prefix of what it holds and the new context?)";
    }

    /// The next context of a sequence whose last call held `last` (context + draft): a
    /// rejection at a random draft position (or all accepted, with `accept_all`), plus a
    /// correction or bonus token. Starts over when the maximum length is near.
    seq next_context(const seq& context, const seq& draft, bool accept_all) {
        seq next = context;
        std::size_t k = draft.size();
        if (!accept_all && !draft.empty()) k = uniform(0, draft.size() - 1);
        next.insert(next.end(), draft.begin(), draft.begin() + static_cast<std::ptrdiff_t>(k));
        token_id c = random_token();
        if (k < draft.size() && vocab_ > 1)
            while (c == draft[k]) c = random_token();  // a correction differs from the rejected token
        next.push_back(c);
        return next;
    }

    /// The scenarios, in order, each on the model as the one before left it (0 to 6, then 7 with
    /// a tree step); a failed call ends them.
    void scenarios() {
        seq last;  // what model_ was last called with
        if (!independent_copies(last) || !fresh_model()) return;
        seq context = last;
        if (!growing_context(context, last) || !rejections(context, last) || !shrinking_contexts(context, last) ||
            !arbitrary_order(context, last) || !two_copies(last))
            return;
        if constexpr (TreeVerifier<M>) {
            if (std::holds_alternative<specdec::tree>(o_.decode.step)) tree_steps();
        }
    }

    /// 0. Copies must not share mutable state: a call on a copy must not change another's answer.
    bool independent_copies(seq& last) {
        reached_.push_back("independent copies");
        const std::size_t lo = min_len(), hi = max_len();
        const seq c1 = random_sequence(uniform(lo, (lo + hi) / 2)), c2 = random_sequence(hi);
        const auto before = to_distribution(single_logits(model_, c1));
        if (!before.problem.empty()) {
            fail("next logits after " + tokens_text(c1) + ": " + before.problem);
            return false;
        }
        {
            auto b = copy_of(model_);
            (void)single_logits(b, c2);
        }
        (void)reference(c2);
        const auto after = to_distribution(single_logits(model_, c1));
        calls_ += 3;
        if (!after.problem.empty() || total_variation(before.p, after.p) > o_.tolerance) {
            fail("the same call on the same model gave different logits after a copy of it (or a fresh "
                 "model) ran on another context: total variation " +
                 (after.problem.empty() ? number(total_variation(before.p, after.p)) : after.problem) +
                 ". The copies share mutable state (a KV cache or buffer behind a pointer, a static), "
                 "or the model has hidden randomness");
            return false;
        }
        last = c1;
        return true;
    }

    /// 1. A fresh model (as given, or as made), then the same call repeated.
    bool fresh_model() {
        reached_.push_back("a fresh model");
        auto fresh = make_();
        seq fresh_last;
        const seq c = random_sequence(uniform(min_len(), max_len()));
        const seq d = random_draft(o_.max_context - c.size());
        return probe(fresh, c, d, "the first call on a fresh model", fresh_last) &&
               probe(fresh, c, d, "the same call repeated on that model", fresh_last);
    }

    /// 2. A growing context: every draft accepted, plus a bonus token (continuing from the
    ///    context of scenario 0).
    bool growing_context(seq& context, seq& last) {
        reached_.push_back("a growing context");
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            if (context.size() > max_len()) break;
            const seq draft = random_draft(o_.max_context - context.size());
            if (!probe(model_, context, draft, "a growing context, every draft accepted; " + history(last, context),
                       last))
                return false;
            context = next_context(context, draft, true);
        }
        return true;
    }

    /// 3. Rejections: the context keeps a random prefix of the last draft, then a correction.
    bool rejections(seq& context, seq& last) {
        reached_.push_back("rejections");
        const std::size_t lo = min_len(), hi = max_len();
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            if (context.size() > hi) context = random_sequence(uniform(lo, (lo + hi) / 2));
            seq draft = random_draft(o_.max_context - context.size());
            // At least one draft token, so that there is something to reject.
            if (draft.empty() && context.size() < o_.max_context) draft.push_back(random_token());
            if (!probe(model_, context, draft,
                       "after rejections: each context keeps part of the last draft, then a correction; " +
                           history(last, context),
                       last))
                return false;
            context = next_context(context, draft, false);
        }
        return true;
    }

    /// 4. The context shrinks (a new request with the same start), then grows again.
    bool shrinking_contexts(seq& context, seq& last) {
        reached_.push_back("shrinking contexts");
        const std::size_t lo = min_len(), hi = max_len();
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            const std::size_t keep = uniform(lo, std::max(lo, std::min(context.size(), hi) - 1));
            context.resize(std::min(keep, context.size()));
            while (context.size() < lo) context.push_back(random_token());
            if (i % 2 == 1) context.push_back(random_token());
            const seq draft = random_draft(o_.max_context - context.size());
            if (!probe(model_, context, draft, "shrinking contexts; " + history(last, context), last)) return false;
        }
        return true;
    }

    /// 5. Arbitrary order: unrelated contexts, and earlier ones again.
    bool arbitrary_order(seq& context, seq& last) {
        reached_.push_back("arbitrary order");
        std::vector<seq> seen;
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            if (!seen.empty() && rng_() % 2 == 0)
                context = seen[static_cast<std::size_t>(rng_() % seen.size())];
            else
                context = random_sequence(uniform(min_len(), max_len()));
            seen.push_back(context);
            const seq draft = random_draft(o_.max_context - context.size());
            if (!probe(model_, context, draft,
                       "calls on unrelated contexts in arbitrary order; " + history(last, context), last))
                return false;
        }
        return true;
    }

    /// 6. Two copies on different sequences, used in turn (as a batch of sequences).
    bool two_copies(seq& last) {
        reached_.push_back("two copies in turn");
        const std::size_t lo = min_len(), hi = max_len();
        auto b = copy_of(model_);
        seq last_b = last, ctx_a = random_sequence(uniform(lo, hi)), ctx_b = random_sequence(uniform(lo, hi));
        for (std::size_t i = 0; i < o_.contract_calls; ++i) {
            const bool on_a = i % 2 == 0;
            seq& ctx = on_a ? ctx_a : ctx_b;
            if (ctx.size() > hi) ctx = random_sequence(uniform(lo, (lo + hi) / 2));
            const seq draft = random_draft(o_.max_context - ctx.size());
            const std::string who = on_a ? "the original" : "the copy";
            if (!probe(on_a ? model_ : b, ctx, draft,
                       "two copies of one model used in turn on different sequences, this call on " + who +
                           " (do the copies share a cache or buffer?); " + history(on_a ? last : last_b, ctx),
                       on_a ? last : last_b))
                return false;
            ctx = next_context(ctx, draft, false);
        }
        return true;
    }

    /// A random tree for a context with `room` tokens left before max_context: every node fits
    /// (context + nodes <= max_context, as an engine whose window holds the whole tree needs).
    draft_tree random_tree(std::size_t room) { return detail::random_tree(rng_, vocab_, max_draft(), room); }

    /// One score_tree(context, tree) call (TreeVerifier 1-2): column 0 must be a fresh model's
    /// logits after the context, column i + 1 those after the context + node i's path. A column
    /// that matches the context + every node before it in index order instead points at the
    /// attention mask.
    bool probe_tree(M& m, const seq& context, const draft_tree& tree, const std::string& where) {
        ++calls_;
        Eigen::MatrixXf s;
        m.score_tree(std::span<const token_id>(context), tree, s);
        const std::string call = "score_tree(context of " + std::to_string(context.size()) + " tokens, tree of " +
                                 std::to_string(tree.size()) + " nodes)";
        if (s.rows() != vocab_ || s.cols() != static_cast<Eigen::Index>(tree.size() + 1)) {
            fail(call + " returned " + std::to_string(s.rows()) + " x " + std::to_string(s.cols()) + "; expected " +
                 std::to_string(vocab_) + " x " + std::to_string(tree.size() + 1) + " (" + where + ")");
            return false;
        }
        std::vector<token_id> path;
        for (std::size_t c = 0; c <= tree.size(); ++c) {
            path_tokens(tree, static_cast<std::int32_t>(c) - 1, path);
            seq prefix = context;
            prefix.insert(prefix.end(), path.begin(), path.end());
            const Eigen::VectorXf col = s.col(static_cast<Eigen::Index>(c));
            const std::string what =
                call + " column " + std::to_string(c) +
                (c == 0 ? std::string(" (the root)")
                        : " (node " + std::to_string(c - 1) + " at depth " + std::to_string(path.size()) + ")");
            if (compare(col, prefix, prefix, what, where)) continue;
            // Node c - 1 read as if the tree were a chain of the nodes in index order: it attends
            // to earlier nodes that are not its ancestors.
            seq in_order = context;
            in_order.insert(in_order.end(), tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(c));
            if (c > 0 && in_order != prefix && r_.failure.find("differs from a fresh model's logits") != std::string::npos) {
                const auto d = to_distribution(col);
                if (d.problem.empty() && total_variation(d.p, reference(in_order)) <= o_.tolerance)
                    r_.failure += "; they equal the logits after the context and every node before it in index "
                                  "order: the node attends to nodes that are not its ancestors (check the tree "
                                  "attention mask: node i may see the context, its ancestors and itself only)";
            }
            return false;
        }
        return true;
    }

    /// 7. score_tree as tree decoding calls it (TreeVerifier 3): requests on fresh models, each
    ///    call's context the last one, then the path to an accepted node of its tree (or none),
    ///    then one more token.
    void tree_steps() {
        reached_.push_back("tree steps");
        const std::size_t lo = min_len(), hi = max_len();
        std::size_t calls = 0;
        while (calls < o_.contract_calls) {
            auto m = make_();
            seq context = random_sequence(uniform(lo, (lo + hi) / 2));
            bool first = true;
            while (calls < o_.contract_calls && context.size() < o_.max_context) {
                ++calls;
                const draft_tree tree = random_tree(o_.max_context - context.size());
                if (!probe_tree(m, context, tree,
                                first ? std::string("the first score_tree call on a fresh model")
                                      : std::string("tree steps: each context is the last one, then the path to "
                                                    "the accepted node of its tree, then one more token")))
                    return;
                first = false;
                std::vector<token_id> path;
                path_tokens(tree, static_cast<std::int32_t>(uniform(0, tree.size())) - 1, path);
                context.insert(context.end(), path.begin(), path.end());
                context.push_back(random_token());
            }
        }
    }

    auto copy_of(M& m) {
        if constexpr (std::copy_constructible<M>)
            return M(m);
        else
            return make_();
    }

    M& model_;
    Make& make_;
    const conformance_options& o_;
    std::mt19937_64 rng_;
    std::ptrdiff_t vocab_ = 0;
    report r_;
    std::size_t columns_ = 0, calls_ = 0;
    std::map<seq, std::vector<double>> refs_;
    Eigen::MatrixXf scratch_;
    std::vector<const char*> reached_;  // the scenarios begun
};

}  // namespace detail

/// Adapter contract (concepts.hpp: LanguageModel 1, BatchVerifier 1-2): every score() column,
/// and every next_logits result, equals (within `o.tolerance` in total variation of the
/// softmax) the logits a fresh model gives for the same tokens. Scenarios, in order: a call on a
/// copy must not change another copy's answer; a fresh model (and the same call repeated); a
/// growing context; rejections (the context drops draft tokens and adds a correction: the
/// classic KV-cache bug); a shrinking context; unrelated contexts in arbitrary order; two copies
/// used in turn on different sequences. Contexts are `o.prompt` followed by random tokens, up to
/// `o.max_context`; drafts have 0 to γ + 1 tokens (the tree's depth + 1 with a tree step). With a
/// tree step (o.decode.step) and a TreeVerifier, also score_tree (TreeVerifier 1-3): random trees
/// (up to depth + 1 levels, the context and every node within `o.max_context`) on fresh models,
/// each call's context the last one, then the path to an accepted node, then one more token;
/// every column is compared. The
/// first mismatch is reported with the scenario, the call, the history and, when the logits
/// match those of a neighbouring position, that they are shifted by one (for a tree node: when
/// they match the context + every earlier node in index order, that the attention mask lets it
/// see nodes that are not its ancestors).
///
/// Deterministic: a model that keeps the contract always passes (false-alarm rate 0).
///
/// \param model  the model under test, as constructed (nothing cached); it is called, and its
///               fresh copies (`M(model)` taken before any call) give the reference logits.
template <Verifier M>
    requires std::copy_constructible<M>
[[nodiscard]] report check_contract(M& model, const conformance_options& o = {}) {
    return detail::guarded("adapter contract", [&] {
        const M pristine(model);
        auto make = [&pristine] { return M(pristine); };
        return detail::contract_runner<M, decltype(make)>(model, make, o).run();
    });
}

/// As above, for a model that cannot be copied: `make()` returns a fresh model (by value) each
/// time it is called; the model under test is one of them.
template <class Make>
    requires std::invocable<Make&> && Verifier<std::invoke_result_t<Make&>>
[[nodiscard]] report check_contract_with(Make make, const conformance_options& o = {}) {
    using M = std::invoke_result_t<Make&>;
    return detail::guarded("adapter contract", [&] {
        M model = make();
        return detail::contract_runner<M, Make>(model, make, o).run();
    });
}

namespace detail {

/// The contract of a target of trees only, through chain_tree_view: its chains stand for
/// score(), and with a tree step its trees are compared with fresh models' chains.
template <class Make>
report tree_only_contract(Make make, const conformance_options& o) {
    using M = std::invoke_result_t<Make&>;
    return detail::guarded("adapter contract", [&] {
        auto make_view = [&make] { return chain_tree_view<M>{make()}; };
        chain_tree_view<M> model = make_view();
        report r = detail::contract_runner<chain_tree_view<M>, decltype(make_view)>(model, make_view, o).run();
        r.ran = "a target of trees only: each score(context, draft) below is score_tree(context, the draft as a "
                "chain); " + r.ran;
        return r;
    });
}

}  // namespace detail

/// The contract of a target that scores trees only (a TreeVerifier with neither score() nor
/// next_logits()): the same scenarios, each score(context, draft) made as score_tree(context,
/// the draft as a chain), whose columns every tree's are compared with (so a node that sees
/// other branches than its own path is caught, as above). Without a tree step in `o.decode.step`
/// the default tree (specdec::tree{}) is used, as decoding such a target needs tree steps.
template <class M>
    requires detail::tree_only_target<M> && std::copy_constructible<M>
[[nodiscard]] report check_contract(M& model, const conformance_options& o = {}) {
    conformance_options with_tree = o;
    if (!std::holds_alternative<specdec::tree>(o.decode.step)) with_tree.decode.step = specdec::tree{};
    const M pristine(model);
    return detail::tree_only_contract([&pristine] { return M(pristine); }, with_tree);
}

/// As above, for a target of trees only that cannot be copied (`make()` returns a fresh one).
template <class Make>
    requires std::invocable<Make&> && detail::tree_only_target<std::invoke_result_t<Make&>>
[[nodiscard]] report check_contract_with(Make make, const conformance_options& o = {}) {
    conformance_options with_tree = o;
    if (!std::holds_alternative<specdec::tree>(o.decode.step)) with_tree.decode.step = specdec::tree{};
    return detail::tree_only_contract(std::move(make), with_tree);
}

}  // namespace specdec::testing
