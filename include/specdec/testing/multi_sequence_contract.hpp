#pragma once
/// \file
/// Does each request of a multi-sequence pass get what it would get alone? The multi-sequence
/// contract (multi_sequence.hpp: MultiSequenceVerifier 1-2, MultiSequenceTreeVerifier,
/// MultiSequenceDrafter): check_multi_sequence_contract and check_multi_sequence_contract_with,
/// the simulated batch of a serving loop (sequences joining, leaving, reusing slots, sent in any
/// order) and the runner that drives score_batch, score_tree_batch and draft_batch through it.
///
/// Part of the conformance kit (specdec/testing.hpp, which includes every check and defines
/// run_conformance). Not included by specdec/specdec.hpp.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../multi_sequence.hpp"
#include "../random.hpp"
#include "../tree.hpp"
#include "../types.hpp"
#include "report.hpp"

namespace specdec::testing {

namespace detail {

/// The sequences of a simulated batch across passes, as a serving loop keeps them: sequences
/// join (in the lowest free slot, so freed slots are reused; some sharing a prefix with a live
/// sequence), leave (at random, or when their context is full), and are sent in any order.
class batch_schedule {
public:
    using seq = std::vector<token_id>;
    struct member {
        std::size_t id, slot, joined;  // joined: the pass it joined at
        std::string origin;            // where its slot came from
        seq context;
    };

    batch_schedule(std::mt19937_64& rng, std::ptrdiff_t vocab, const conformance_options& o)
        : rng_(rng), vocab_(vocab), o_(o) {}

    std::vector<member> live;

    /// An empty batch, no history: each part of the check starts from here.
    void reset() {
        live.clear();
        next_id_ = 0;
        freed_by_.clear();
        leaves_.clear();
    }

    /// Before pass `pass`: sequences leave and join; contexts leave `room` tokens to max_context.
    void churn(std::size_t pass, std::size_t room) {
        const std::size_t lo = o_.prompt.size() + 1;
        const std::size_t hi = o_.max_context > lo + 1 + room ? o_.max_context - room : lo + 1;
        for (auto it = live.begin(); it != live.end();) {
            if (it->context.size() > hi || (pass > 0 && rng_() % 5 == 0)) {
                leaves_.push_back({pass, "sequence #" + std::to_string(it->id) + " left slot " +
                                             std::to_string(it->slot) + " before pass " + std::to_string(pass)});
                freed_by_[it->slot] = it->id;
                it = live.erase(it);
            } else {
                ++it;
            }
        }
        const std::size_t cap = std::max<std::size_t>(o_.batch, 1);
        const std::size_t want = rng_() % 2 == 0 ? cap : 1 + static_cast<std::size_t>(rng_() % cap);
        while (live.size() < want) join(pass, hi);
    }

    /// The order of the requests: live order, or shuffled.
    std::vector<std::size_t> order() {
        std::vector<std::size_t> out(live.size());
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = i;
        if (rng_() % 3 == 0) std::shuffle(out.begin(), out.end(), rng_);
        return out;
    }

    /// "sequence #5 in slot 3 (joined at pass 4 in the slot sequence #2 left), context of 17 tokens [...]".
    std::string describe(const member& m) const {
        return "sequence #" + std::to_string(m.id) + " in slot " + std::to_string(m.slot) + " (joined at pass " +
               std::to_string(m.joined) + " in " + m.origin + "), context of " + std::to_string(m.context.size()) +
               " tokens " + tokens_text(m.context);
    }

    /// Sequences that left while `m` was in the batch, or left its slot before it: the likeliest
    /// cause when its results depend on more than its request.
    std::string leaves_seen_by(const member& m) const {
        std::string s;
        std::size_t n = 0;
        for (auto it = leaves_.rbegin(); it != leaves_.rend() && it->first >= m.joined && n < 3; ++it, ++n)
            s += (s.empty() ? "" : "; ") + it->second;
        return s;
    }

private:
    void join(std::size_t pass, std::size_t hi) {
        std::size_t slot = 0;
        while (std::any_of(live.begin(), live.end(), [&](const member& m) { return m.slot == slot; })) ++slot;
        const auto f = freed_by_.find(slot);
        member m{next_id_++, slot, pass,
                 f == freed_by_.end() ? std::string("a slot not used before")
                                      : "the slot sequence #" + std::to_string(f->second) + " left",
                 o_.prompt};
        const std::size_t lo = o_.prompt.size() + 1;
        const std::size_t len = lo + static_cast<std::size_t>(rng_() % ((lo + hi) / 2 - lo + 1));
        if (!live.empty() && rng_() % 3 == 0) {  // a prefix shared with a live sequence
            const seq& other = live[static_cast<std::size_t>(rng_() % live.size())].context;
            const std::size_t keep = std::min(other.size(), std::max(lo, len - 1));
            m.context.assign(other.begin(), other.begin() + static_cast<std::ptrdiff_t>(keep));
            m.origin += ", sharing its first " + std::to_string(keep) + " tokens with a live sequence";
        }
        const std::size_t size = std::max(len, m.context.size() + 1);  // at least one token of its own
        while (m.context.size() < size)
            m.context.push_back(static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)));
        live.push_back(std::move(m));
    }

    std::mt19937_64& rng_;
    std::ptrdiff_t vocab_;
    const conformance_options& o_;
    std::size_t next_id_ = 0;
    std::map<std::size_t, std::size_t> freed_by_;                 // slot -> the sequence that last left it
    std::vector<std::pair<std::size_t, std::string>> leaves_;     // (pass, what left)
};

/// Which of a model's multi-sequence functions the check drives (of those it models).
struct multi_sequence_parts {
    bool scores = true;  ///< score_batch and score_tree_batch
    bool drafts = true;  ///< draft_batch
};

/// The multi-sequence contract check (see check_multi_sequence_contract).
template <class M, class Make>
class multi_sequence_runner {
public:
    using seq = std::vector<token_id>;
    using member = batch_schedule::member;
    multi_sequence_runner(M& model, Make& make, const conformance_options& o, multi_sequence_parts p)
        : model_(model), make_(make), o_(o), parts_(p), rng_(o.seed ^ 0x5851f42d4c957f2dULL),
          vocab_(static_cast<std::ptrdiff_t>(model.vocab_size())), batch_(rng_, vocab_, o) {
        r_.check = "multi-sequence contract";
        r_.max_error = 0.0;
    }

    report run() {
        const auto t0 = std::chrono::steady_clock::now();
        if (vocab_ <= 0) fail("vocab_size() = " + std::to_string(vocab_) + " must be positive");
        else if (o_.max_context < o_.prompt.size() + max_draft() + 3)
            fail("max_context = " + std::to_string(o_.max_context) + " leaves no room for a context after the " +
                 std::to_string(o_.prompt.size()) + "-token prompt and a draft of " + std::to_string(max_draft()));
        for (token_id t : o_.prompt)
            if (t < 0 || t >= vocab_) fail("the prompt's token " + std::to_string(t) + " is outside the vocabulary");
        if constexpr (MultiSequenceVerifier<M>)
            if (parts_.scores && r_.passed) chain_passes();
        if constexpr (MultiSequenceTreeVerifier<M>)
            if (parts_.scores && r_.passed) tree_passes();
        if constexpr (MultiSequenceDrafter<M>)
            if (parts_.drafts && r_.passed) draft_passes();
        r_.ran = (ran_.empty() ? std::string("no pass") : ran_) + "; up to " + std::to_string(std::max<std::size_t>(o_.batch, 1)) +
                 " sequences a pass, joining, leaving, in reused slots, in any order, some sharing a prefix; "
                 "tolerance " + number(o_.tolerance) + " in total variation";
        r_.seconds = seconds_between(t0);
        return r_;
    }

private:
    std::size_t max_draft() const { return longest_draft(o_.decode.step, o_) + 1; }
    /// Passes of score_batch; score_tree_batch and draft_batch run half as many (their
    /// references cost more).
    std::size_t passes() const { return 2 * std::max<std::size_t>(o_.contract_calls, 1); }
    std::size_t uniform(std::size_t lo, std::size_t hi) {
        return lo + static_cast<std::size_t>(rng_() % static_cast<std::uint64_t>(hi - lo + 1));
    }
    void fail(std::string why) {
        if (!r_.passed) return;
        r_.passed = false;
        r_.failure = std::move(why);
    }
    void add_ran(const std::string& s) { ran_ += (ran_.empty() ? "" : "; ") + s; }

    /// A ragged draft: empty a quarter of the time, else 0 to max_draft() random tokens.
    seq random_draft(const seq& context) {
        seq d;
        if (rng_() % 4 == 0) return d;
        const std::size_t n = uniform(0, std::min(max_draft(), o_.max_context - context.size()));
        for (std::size_t i = 0; i < n; ++i) d.push_back(static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)));
        return d;
    }

    /// The next context of a sequence: its draft accepted up to a random rejection (or all of
    /// it, half of the time), then a correction or bonus token.
    seq next_context(const seq& context, std::span<const token_id> draft) {
        seq next = context;
        std::size_t k = draft.size();
        if (rng_() % 2 == 0 && !draft.empty()) k = uniform(0, draft.size() - 1);
        next.insert(next.end(), draft.begin(), draft.begin() + static_cast<std::ptrdiff_t>(k));
        token_id c = static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_));
        if (k < draft.size() && vocab_ > 1)
            while (c == draft[k]) c = static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_));
        next.push_back(c);
        return next;
    }

    /// The logits of context + draft[0..j) for every j, from a fresh model that sees this request
    /// alone: its next_logits or score when it has them, else a pass with this one request in
    /// slot 0 (a chain as a tree for a verifier of trees only).
    Eigen::MatrixXf alone(const seq& context, const seq& draft) {
        auto fresh = make_();
        if constexpr (BatchVerifier<M>) {
            return fresh.score(std::span<const token_id>(context), std::span<const token_id>(draft));
        } else if constexpr (LanguageModel<M>) {
            Eigen::MatrixXf s(vocab_, static_cast<Eigen::Index>(draft.size() + 1));
            seq prefix = context;
            for (std::size_t j = 0; j <= draft.size(); ++j) {
                s.col(static_cast<Eigen::Index>(j)) = fresh.next_logits(std::span<const token_id>(prefix));
                if (j < draft.size()) prefix.push_back(draft[j]);
            }
            return s;
        } else if constexpr (MultiSequenceVerifier<M>) {
            const score_request r{0, context, draft};
            packed_logits out;
            out.shape(vocab_, std::span<const score_request>(&r, 1));
            fresh.score_batch(std::span<const score_request>(&r, 1), out);
            return out.sequence(0);
        } else {
            draft_tree chain;
            for (std::size_t j = 0; j < draft.size(); ++j) chain.add(static_cast<std::int32_t>(j) - 1, draft[j]);
            const tree_score_request r{0, context, &chain};
            packed_logits out;
            out.shape(vocab_, std::span<const tree_score_request>(&r, 1));
            fresh.score_tree_batch(std::span<const tree_score_request>(&r, 1), out);
            return out.sequence(0);
        }
    }

    /// Makes sure the reference of every prefix context + draft[0..j) is known (memoized).
    void ensure(const seq& context, const seq& draft) {
        seq full = context;
        full.insert(full.end(), draft.begin(), draft.end());
        bool known = true;
        for (std::size_t j = 0; j <= draft.size() && known; ++j)
            known = refs_.count(seq(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j))) > 0;
        if (known) return;
        const Eigen::MatrixXf s = alone(context, draft);
        if (s.rows() != vocab_ || s.cols() != static_cast<Eigen::Index>(draft.size() + 1))
            return fail("the reference (a fresh model, this request alone) returned " + std::to_string(s.rows()) +
                        " x " + std::to_string(s.cols()) + " logits for a draft of " + std::to_string(draft.size()));
        for (std::size_t j = 0; j <= draft.size(); ++j) {
            auto d = to_distribution(s.col(static_cast<Eigen::Index>(j)));
            const seq prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(context.size() + j));
            if (!d.problem.empty()) {
                fail("a fresh model's logits after " + tokens_text(prefix) + " are invalid: " + d.problem);
                d.p.assign(static_cast<std::size_t>(vocab_), 1.0 / static_cast<double>(vocab_));
            }
            refs_.emplace(prefix, std::move(d.p));
        }
    }

    /// Total variation between logits z and the reference after `prefix` (which ensure() made known).
    double error(const distribution& d, const seq& prefix) { return total_variation(d.p, refs_.at(prefix)); }

    /// Logits a wrong column may hold instead, each with what it means.
    struct candidate {
        seq prefix;
        std::string hint;
    };

    /// Compares column z with the reference after `prefix`; on a mismatch fails naming `what`
    /// and the first candidate whose logits z are (else `otherwise`).
    template <class Candidates>
    bool column_ok(const Eigen::VectorXf& z, const seq& prefix, const std::string& what, Candidates candidates,
                   const std::string& otherwise) {
        ++columns_;
        if (z.size() != vocab_) {
            fail(what + " has " + std::to_string(z.size()) + " rows; vocab_size() is " + std::to_string(vocab_));
            return false;
        }
        const auto d = to_distribution(z);
        if (!d.problem.empty()) {
            fail(what + ": " + d.problem);
            return false;
        }
        const double e = error(d, prefix);
        r_.max_error = std::max(r_.max_error, e);
        if (e <= o_.tolerance) return true;
        std::string hint = otherwise;
        bool matched = false;
        for (const auto& c : candidates())
            if (refs_.count(c.prefix) && error(d, c.prefix) <= o_.tolerance) {
                hint = c.hint;
                matched = true;
                break;
            }
        if (!matched && e < rounding_like_error) hint += rounding_hint(e);
        fail(what + " differs from the logits of this request scored alone on a fresh model (after " +
             std::to_string(prefix.size()) + " tokens " + tokens_text(prefix) + "): total variation " + number(e) +
             " > tolerance " + number(o_.tolerance) + "; " + hint);
        return false;
    }

    /// The hint when a wrong column matches no other logits: what happened to the batch while
    /// the sequence was in it.
    std::string history_hint(const member& m) const {
        const std::string left = batch_.leaves_seen_by(m);
        if (!left.empty())
            return "they match no other request's logits; while it was in the batch, " + left +
                   ": it likely reads the cache of another sequence (check the map from slots to KV-cache rows "
                   "when a sequence leaves and rows are compacted or freed, and when a freed slot is reused)";
        if (m.origin.rfind("the slot sequence", 0) == 0)
            return "they match no other request's logits; its slot was left by another sequence: a stale cache "
                   "read (is a slot's cache rolled back to the longest common prefix of what it holds and the new "
                   "context when another sequence takes the slot?)";
        return "they match no other request's logits: the result depends on the other sequences of the pass or "
               "on the slot's earlier contents (each request's logits must depend on that request alone)";
    }

    /// Candidates for column j of request i of a chain pass: another request's columns (the
    /// packed offsets), the neighbouring columns of its own (the offset within the sequence).
    std::vector<candidate> chain_candidates(std::size_t i, std::size_t j, const std::vector<seq>& fulls,
                                            const std::vector<std::size_t>& contexts) const {
        std::vector<candidate> out;
        const auto prefix = [&](std::size_t k, std::size_t c) {
            return seq(fulls[k].begin(), fulls[k].begin() + static_cast<std::ptrdiff_t>(contexts[k] + c));
        };
        for (std::size_t k = 0; k < fulls.size(); ++k)
            for (std::size_t c = 0; k != i && contexts[k] + c <= fulls[k].size(); ++c)
                out.push_back({prefix(k, c), "they are the logits of request " + std::to_string(k) + "'s column " +
                                                 std::to_string(c) +
                                                 ": the columns of another sequence (written at the wrong offset "
                                                 "in the packed scores, off by one sequence? request i owns the "
                                                 "columns out.offset(i) .. out.offset(i) + out.columns(i) - 1)"});
        if (j > 0)
            out.push_back({prefix(i, j - 1), "they are the logits of its own column " + std::to_string(j - 1) +
                                                 ": shifted by one position (check the offset within the sequence)"});
        if (contexts[i] + j + 1 <= fulls[i].size())
            out.push_back({prefix(i, j + 1), "they are the logits of its own column " + std::to_string(j + 1) +
                                                 ": shifted by one position (check the offset within the sequence)"});
        return out;
    }

    /// Appends " slot:n" to the layout of a pass (appends one by one: GCC 12 misreads the
    /// concatenation of temporaries under -Wrestrict).
    static void add_layout(std::string& layout, std::size_t slot, std::size_t n) {
        layout += ' ';
        layout += std::to_string(slot);
        layout += ':';
        layout += std::to_string(n);
    }

    /// "score_batch, pass 3 of 48 (slots 0, 2, 1 with 3, 0, 5 draft tokens), request 1 of 3: sequence #..."
    std::string where(const char* call, std::size_t pass, std::size_t passes, const std::string& layout,
                      std::size_t i, std::size_t n, const member& m) const {
        return std::string(call) + ", pass " + std::to_string(pass) + " of " + std::to_string(passes) + " (" +
               layout + "), request " + std::to_string(i) + " of " + std::to_string(n) + ": " + batch_.describe(m);
    }

    /// After a call: the layout shape() gave `out` is still there.
    template <class Request>
    bool layout_kept(const packed_logits& out, const std::vector<Request>& req, const char* call, std::size_t pass) {
        try {
            specdec::detail::check_packed_layout(out, std::span<const Request>(req), vocab_,
                                                 "specdec::testing::check_multi_sequence_contract", call);
        } catch (const std::invalid_argument& e) {
            fail("pass " + std::to_string(pass) + ": " + e.what());
            return false;
        }
        return true;
    }

    /// score_batch over passes(): each live sequence sends its context and a ragged draft; every
    /// column is compared; then each context takes an accepted prefix of its draft.
    void chain_passes() {
        batch_.reset();
        std::size_t requests = 0, before = columns_;
        packed_logits out;
        for (std::size_t pass = 0; pass < passes() && r_.passed; ++pass) {
            batch_.churn(pass, max_draft());
            const auto order = batch_.order();
            std::vector<seq> drafts, fulls;
            std::vector<std::size_t> contexts;
            std::vector<score_request> req;
            std::string layout = "slot:draft";
            for (std::size_t k : order) drafts.push_back(random_draft(batch_.live[k].context));
            for (std::size_t i = 0; i < order.size(); ++i) {
                const member& m = batch_.live[order[i]];
                req.push_back({m.slot, m.context, drafts[i]});
                fulls.push_back(m.context);
                fulls.back().insert(fulls.back().end(), drafts[i].begin(), drafts[i].end());
                contexts.push_back(m.context.size());
                add_layout(layout, m.slot, drafts[i].size());
            }
            out.shape(vocab_, std::span<const score_request>(req));
            model_.score_batch(std::span<const score_request>(req), out);
            requests += req.size();
            if (!layout_kept(out, req, "score_batch", pass)) return;
            for (std::size_t i = 0; i < req.size(); ++i) ensure(batch_.live[order[i]].context, drafts[i]);
            for (std::size_t i = 0; i < req.size() && r_.passed; ++i) {
                const member& m = batch_.live[order[i]];
                const auto cols = out.sequence(i);
                for (std::size_t j = 0; j <= drafts[i].size(); ++j) {
                    const std::string what = where("score_batch", pass, passes(), layout, i, req.size(), m) + ", draft " +
                                             tokens_text(drafts[i]) + ", column " + std::to_string(j);
                    const seq prefix(fulls[i].begin(), fulls[i].begin() + static_cast<std::ptrdiff_t>(contexts[i] + j));
                    if (!column_ok(cols.col(static_cast<Eigen::Index>(j)), prefix, what,
                                   [&] { return chain_candidates(i, j, fulls, contexts); }, history_hint(m)))
                        break;
                }
            }
            for (std::size_t i = 0; i < order.size(); ++i) {
                member& m = batch_.live[order[i]];
                m.context = next_context(m.context, drafts[i]);
            }
        }
        add_ran("score_batch: " + std::to_string(columns_ - before) + " columns of " + std::to_string(requests) +
                " requests in " + std::to_string(passes()) + " passes compared with " + reference_name());
    }

    static std::string reference_name() {
        if constexpr (BatchVerifier<M>) return "a fresh model's score() of the request alone";
        else if constexpr (LanguageModel<M>) return "a fresh model's next_logits";
        else return "a fresh model's pass with the request alone";
    }

    /// score_tree_batch over passes(): each live sequence sends its context and a random tree
    /// (some without nodes); column c + 1 of a request is compared with the logits after its
    /// context and node c's path; then each context takes the path to a random node and a token.
    void tree_passes() {
        batch_.reset();
        std::size_t requests = 0, before = columns_;
        packed_logits out;
        for (std::size_t pass = 0; pass < passes() / 2 && r_.passed; ++pass) {
            batch_.churn(pass, 3 * max_draft());
            const auto order = batch_.order();
            std::vector<draft_tree> trees;
            std::vector<tree_score_request> req;
            std::string layout = "slot:nodes";
            for (std::size_t k : order) {
                const std::size_t room = o_.max_context - batch_.live[k].context.size();
                trees.push_back(rng_() % 4 == 0 ? draft_tree{} : random_tree(rng_, vocab_, max_draft(), room));
            }
            for (std::size_t i = 0; i < order.size(); ++i) {
                const member& m = batch_.live[order[i]];
                req.push_back({m.slot, m.context, &trees[i]});
                add_layout(layout, m.slot, trees[i].size());
            }
            out.shape(vocab_, std::span<const tree_score_request>(req));
            model_.score_tree_batch(std::span<const tree_score_request>(req), out);
            requests += req.size();
            if (!layout_kept(out, req, "score_tree_batch", pass)) return;
            for (std::size_t i = 0; i < req.size() && r_.passed; ++i)
                check_tree(out.sequence(i), batch_.live[order[i]], trees[i],
                           where("score_tree_batch", pass, passes() / 2, layout, i, req.size(), batch_.live[order[i]]));
            for (std::size_t i = 0; i < order.size(); ++i) {
                member& m = batch_.live[order[i]];
                seq path;
                path_tokens(trees[i], static_cast<std::int32_t>(uniform(0, trees[i].size())) - 1, path);
                m.context.insert(m.context.end(), path.begin(), path.end());
                m.context.push_back(static_cast<token_id>(rng_() % static_cast<std::uint64_t>(vocab_)));
            }
        }
        add_ran("score_tree_batch: " + std::to_string(columns_ - before) + " columns of " + std::to_string(requests) +
                " requests in " + std::to_string(passes() / 2) + " passes compared with " + reference_name());
    }

    /// The columns of one request of a tree pass; a column that holds the logits after the
    /// context and every earlier node in index order points at the attention mask.
    void check_tree(const Eigen::Ref<const Eigen::MatrixXf>& cols, const member& m, const draft_tree& tree,
                    const std::string& where) {
        std::vector<seq> paths(tree.size() + 1);
        for (std::size_t c = tree.size() + 1; c-- > 0;) {  // the deepest first: their paths cover their parents
            path_tokens(tree, static_cast<std::int32_t>(c) - 1, paths[c]);
            ensure(m.context, paths[c]);
        }
        for (std::size_t c = 0; c <= tree.size() && r_.passed; ++c) {
            seq prefix = m.context, in_order = m.context;
            prefix.insert(prefix.end(), paths[c].begin(), paths[c].end());
            in_order.insert(in_order.end(), tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(c));
            auto cands = [&] {  // only on a mismatch: a reference more
                std::vector<candidate> out;
                if (c == 0 || in_order == prefix) return out;
                ensure(m.context, seq(tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(c)));
                out.push_back({in_order, "they are the logits after the context and every node before it in index "
                                           "order: the node attends to nodes that are not its ancestors (check the "
                                           "tree attention mask of this sequence: node i may see its context, its "
                                           "ancestors and itself only)"});
                return out;
            };
            const std::string what = where + ", tree of " + std::to_string(tree.size()) + " nodes " +
                                     tokens_text(tree.tokens) + ", column " + std::to_string(c) +
                                     (c == 0 ? std::string(" (the root)")
                                             : " (node " + std::to_string(c - 1) + " at depth " +
                                                   std::to_string(paths[c].size()) + ")");
            if (!column_ok(cols.col(static_cast<Eigen::Index>(c)), prefix, what, cands, history_hint(m))) return;
        }
    }

    /// draft_batch over passes() / 2: each live sequence asks for 0 to max_draft() tokens with a
    /// generator of its own; each block must be what a fresh model drafts for that request alone
    /// with the same uniforms. Sampling configs from o.samplings, one per pass in turn.
    void draft_passes() {
        batch_.reset();
        std::size_t requests = 0;
        const std::size_t total = passes() / 2;
        for (std::size_t pass = 0; pass < total && r_.passed; ++pass) {
            batch_.churn(pass, max_draft());
            const auto order = batch_.order();
            const sampling_config s = o_.samplings.empty() ? sampling_config{} : o_.samplings[pass % o_.samplings.size()];
            const std::size_t n = order.size();
            std::vector<std::uint64_t> seeds(n);
            std::vector<std::mt19937_64> gens;
            gens.reserve(n);  // the requests' uniform_sources point into it
            std::vector<draft_block> blocks(n);
            std::vector<draft_request> req;
            std::string layout = "slot:gamma";
            for (std::size_t i = 0; i < n; ++i) gens.emplace_back(seeds[i] = rng_());
            for (std::size_t i = 0; i < n; ++i) {
                const member& m = batch_.live[order[i]];
                const std::size_t gamma = rng_() % 4 == 0 ? 0 : uniform(1, max_draft());
                req.push_back({m.slot, m.context, gamma, uniform_source(gens[i]), &blocks[i]});
                add_layout(layout, m.slot, gamma);
            }
            model_.draft_batch(std::span<draft_request>(req), s);
            requests += n;
            for (std::size_t i = 0; i < n && r_.passed; ++i)
                check_block(where("draft_batch", pass, total, layout, i, n, batch_.live[order[i]]),
                            batch_.live[order[i]].context, req[i].gamma, seeds[i], gens[i], blocks[i], s);
            for (std::size_t i = 0; i < n; ++i) {
                member& m = batch_.live[order[i]];
                m.context = next_context(m.context, blocks[i].tokens);
            }
        }
        add_ran("draft_batch: " + std::to_string(requests) + " blocks in " + std::to_string(total) +
                " passes compared with a fresh model drafting each request alone with the same uniforms");
    }

    /// One block of a draft pass against the same request drafted alone by a fresh model.
    void check_block(const std::string& where, const seq& context, std::size_t gamma, std::uint64_t seed,
                     const std::mt19937_64& after, const draft_block& got, const sampling_config& s) {
        auto fresh = make_();
        std::mt19937_64 g(seed);
        draft_block want;
        draft_request r{0, context, gamma, uniform_source(g), &want};
        fresh.draft_batch(std::span<draft_request>(&r, 1), s);
        std::string diff = block_difference(got, want);
        if (diff.empty() && g != after)
            diff = "it drew another number of uniforms from its generator than drafting it alone does";
        if (diff.empty()) return;
        fail(where + ", gamma " + std::to_string(gamma) + ", " + sampling_text(s) + ": the block " +
             tokens_text(got.tokens) + " differs from drafting this request alone on a fresh model with the same "
             "uniforms (" + tokens_text(want.tokens) + "): " + diff + "; the block depends on the other requests "
             "of the call (draws from another sequence's uniforms, or one generator for the whole batch? another "
             "sequence's tokens, cache or slot?): sequence i must draw only from requests[i].uniforms, in the "
             "order drafting it alone does");
    }

    /// What differs between two blocks, in words (empty when nothing does).
    std::string block_difference(const draft_block& a, const draft_block& b) const {
        for (std::size_t k = 0; k < std::min(a.tokens.size(), b.tokens.size()); ++k)
            if (a.tokens[k] != b.tokens[k])
                return "token " + std::to_string(k) + " is " + std::to_string(a.tokens[k]) + ", alone " +
                       std::to_string(b.tokens[k]);
        if (a.tokens.size() != b.tokens.size())
            return std::to_string(a.tokens.size()) + " tokens, alone " + std::to_string(b.tokens.size());
        if (a.has_distributions() != b.has_distributions())
            return a.has_distributions() ? "it reports distributions, alone none" : "it reports none, alone some";
        if (!a.has_distributions()) return {};
        if (a.probs.rows() != b.probs.rows() || a.probs.cols() < static_cast<Eigen::Index>(a.tokens.size()) ||
            b.probs.cols() < static_cast<Eigen::Index>(b.tokens.size()))
            return "the distributions are " + std::to_string(a.probs.rows()) + " x " + std::to_string(a.probs.cols()) +
                   ", alone " + std::to_string(b.probs.rows()) + " x " + std::to_string(b.probs.cols());
        for (std::size_t k = 0; k < a.tokens.size(); ++k) {
            const double sa = a.scales.size() > k ? a.scales[k] : 1.0, sb = b.scales.size() > k ? b.scales[k] : 1.0;
            double tv = 0.0;
            for (Eigen::Index y = 0; y < a.probs.rows(); ++y)
                tv += std::abs(sa * a.probs(y, static_cast<Eigen::Index>(k)) - sb * b.probs(y, static_cast<Eigen::Index>(k)));
            if (0.5 * tv > o_.tolerance)
                return "the distribution of token " + std::to_string(k) + " differs by total variation " + number(0.5 * tv);
        }
        return {};
    }

    M& model_;
    Make& make_;
    const conformance_options& o_;
    multi_sequence_parts parts_;
    std::mt19937_64 rng_;
    std::ptrdiff_t vocab_;
    batch_schedule batch_;
    report r_;
    std::string ran_;
    std::size_t columns_ = 0;
    std::map<seq, std::vector<double>> refs_;  // reference distributions after each prefix
};

/// The multi-sequence contract of some of `model`'s functions, the references copies of `pristine`.
template <multi_sequence_model M>
report multi_sequence_part(M& model, const M& pristine, const conformance_options& o,
                           multi_sequence_parts parts) {
    auto make = [&pristine] { return M(pristine); };
    return guarded("multi-sequence contract", [&] {
        return multi_sequence_runner<M, decltype(make)>(model, make, o, parts).run();
    });
}

}  // namespace detail

/// Multi-sequence contract (multi_sequence.hpp: MultiSequenceVerifier 1-2,
/// MultiSequenceTreeVerifier, MultiSequenceDrafter): a serving loop's passes, driven as
/// batch_decoder drives them, each request checked against that request alone. Over
/// 2 * `o.contract_calls` passes of score_batch (and half as many of score_tree_batch and of
/// draft_batch, for each the model has), up to `o.batch` sequences a pass: sequences join (in
/// the lowest free slot, so slots that others left are reused; a third of them sharing a prefix
/// with a live sequence) and leave at random, requests come in any order, drafts are ragged
/// (empty a quarter of the time, else up to γ + 1 tokens; trees random, some without nodes), and
/// each context then grows by an accepted prefix of its draft (all of it in some sequences, up to
/// a rejection and a correction in others) or a tree path. Every column of score_batch and
/// score_tree_batch is compared (within `o.tolerance` in total variation) with the logits of
/// that request scored alone by a fresh model: its score() or next_logits when the model has
/// them, else a pass with that request alone in slot 0. Every draft_batch block must equal (tokens,
/// distributions within `o.tolerance`, uniforms drawn) the block a fresh model drafts for that
/// request alone with the same uniforms. The first mismatch names the pass (its slots and draft
/// lengths), the request, its sequence and slot history, the column and the difference, and the
/// likely bug: the logits of another request (packed offsets), of a neighbouring column (shift),
/// of the earlier nodes in index order (tree attention mask), or none after sequences left (a
/// slot map that points at another sequence's cache).
///
/// Deterministic: a model that keeps the contract always passes (false-alarm rate 0).
///
/// \param model  the model under test, as constructed (nothing cached)
/// \param make   returns a fresh model (by value) each call: the references
template <class M, class Make>
    requires detail::multi_sequence_model<M> && std::invocable<Make&> &&
             std::same_as<std::invoke_result_t<Make&>, M>
[[nodiscard]] report check_multi_sequence_contract(M& model, Make make, const conformance_options& o = {}) {
    return detail::guarded("multi-sequence contract", [&] {
        return detail::multi_sequence_runner<M, Make>(model, make, o, {}).run();
    });
}

/// As above, the references fresh copies of the model (`M(model)` taken before any call).
template <detail::multi_sequence_model M>
    requires std::copy_constructible<M>
[[nodiscard]] report check_multi_sequence_contract(M& model, const conformance_options& o = {}) {
    const M pristine(model);
    return check_multi_sequence_contract(model, [&pristine] { return M(pristine); }, o);
}

/// As above, for a model that cannot be copied: `make()` returns a fresh model each call; the
/// model under test is one of them.
template <class Make>
    requires std::invocable<Make&> && detail::multi_sequence_model<std::invoke_result_t<Make&>>
[[nodiscard]] report check_multi_sequence_contract_with(Make make, const conformance_options& o = {}) {
    using M = std::invoke_result_t<Make&>;
    return detail::guarded("multi-sequence contract", [&] {
        M model = make();
        return detail::multi_sequence_runner<M, Make>(model, make, o, {}).run();
    });
}

}  // namespace specdec::testing
