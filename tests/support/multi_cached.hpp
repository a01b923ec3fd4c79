#pragma once
// A multi-sequence model with a KV cache of the layout serving engines use, for the conformance
// kit's multi-sequence contract: the cached states of every live sequence are rows of one
// compact store, found through a map from slots to rows; a slot absent from a pass has left, and
// its row is freed (the rows after it move down). Logits depend on every token of the context,
// through the cached states (as attention reads every cached key and value). It models
// MultiSequenceVerifier, MultiSequenceTreeVerifier and MultiSequenceDrafter, optionally with
// one of the bugs of real multi-sequence adapters.

#include <specdec/multi_sequence.hpp>
#include <specdec/sampling.hpp>
#include <specdec/tree.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <vector>

namespace specdec_test {

/// What is wrong with a multi_cached_model.
enum class multi_bug {
    none,
    stale_slot_map,   ///< rows are compacted when a sequence leaves, the slot map is not updated
    packed_offset,    ///< score_batch writes sequence i's columns at sequence i - 1's offset
    tree_mask,        ///< score_tree_batch: request 1 of a pass attends to every earlier node
    shared_uniforms,  ///< draft_batch draws every sequence's tokens from request 0's uniforms
};

class multi_cached_model {
public:
    using token_id = specdec::token_id;
    multi_cached_model(int vocab, std::uint64_t seed, multi_bug bug = multi_bug::none)
        : vocab_(vocab), seed_(seed), bug_(bug) {}

    std::ptrdiff_t vocab_size() const { return vocab_; }

    void score_batch(std::span<const specdec::score_request> requests, specdec::packed_logits& out) {
        release_absent(requests);
        auto all = out.all();
        for (std::size_t i = 0; i < requests.size(); ++i) {
            std::vector<token_id> seq(requests[i].context.begin(), requests[i].context.end());
            seq.insert(seq.end(), requests[i].draft.begin(), requests[i].draft.end());
            const auto states = states_of(requests[i].slot, seq);
            const Eigen::Index at = out.offset(bug_ == multi_bug::packed_offset && i > 0 ? i - 1 : i);
            for (std::size_t j = 0; j <= requests[i].draft.size(); ++j)
                all.col(at + static_cast<Eigen::Index>(j)) = logits(states, requests[i].context.size() + j);
        }
    }

    void score_tree_batch(std::span<const specdec::tree_score_request> requests, specdec::packed_logits& out) {
        release_absent(requests);
        std::vector<token_id> path;
        for (std::size_t i = 0; i < requests.size(); ++i) {
            const auto& tree = *requests[i].tree;
            const std::vector<token_id> context(requests[i].context.begin(), requests[i].context.end());
            const auto cached = states_of(requests[i].slot, context);  // a tree's nodes are not cached
            auto cols = out.sequence(i);
            cols.col(0) = logits(cached, context.size());
            for (std::size_t c = 0; c < tree.size(); ++c) {
                if (bug_ == multi_bug::tree_mask && i == 1)
                    path.assign(tree.tokens.begin(), tree.tokens.begin() + static_cast<std::ptrdiff_t>(c + 1));
                else
                    specdec::path_tokens(tree, static_cast<std::int32_t>(c), path);
                auto states = cached;
                for (token_id t : path) states.push_back(next_state(states.back(), t));
                cols.col(static_cast<Eigen::Index>(c + 1)) = logits(states, context.size() + path.size());
            }
        }
    }

    /// Position by position across the sequences, each token sampled from the model's
    /// distribution after the sequence so far, with the request's own uniforms.
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling) {
        std::size_t longest = 0;
        std::vector<std::vector<token_id>> seqs;
        for (auto& r : requests) {
            seqs.emplace_back(r.context.begin(), r.context.end());
            if (r.gamma > 0) r.out->resize_probs(vocab_, static_cast<Eigen::Index>(r.gamma));
            longest = std::max(longest, r.gamma);
        }
        for (std::size_t pos = 0; pos < longest; ++pos)
            for (std::size_t i = 0; i < requests.size(); ++i) {
                auto& r = requests[i];
                if (pos >= r.gamma) continue;
                auto& u = bug_ == multi_bug::shared_uniforms ? requests[0].uniforms : r.uniforms;
                const auto x = specdec::standardize_and_sample(logits_after(seqs[i]), sampling,
                                                               r.out->probs.col(static_cast<Eigen::Index>(pos)), u(), ws_);
                r.out->tokens.push_back(static_cast<token_id>(x));
                seqs[i].push_back(static_cast<token_id>(x));
            }
    }

    /// The logits after `seq`, computed without the cache.
    Eigen::VectorXf logits_after(const std::vector<token_id>& seq) const {
        std::vector<std::uint64_t> states{seed_};
        for (token_id t : seq) states.push_back(next_state(states.back(), t));
        return logits(states, seq.size());
    }

private:
    static std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
        x += 0x9e3779b97f4a7c15ULL;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        return x ^ (x >> 31);
    }
    static std::uint64_t next_state(std::uint64_t s, token_id t) {
        return mix(s ^ (static_cast<std::uint64_t>(t) + 1) * 0x2545f4914f6cdd1dULL);
    }

    /// Logits after the first n tokens: a function of every state up to n.
    Eigen::VectorXf logits(const std::vector<std::uint64_t>& states, std::size_t n) const {
        std::uint64_t s = 0;
        for (std::size_t i = 0; i <= n; ++i) s += states[i] * (2 * i + 1);
        s = mix(s);
        Eigen::VectorXf z(vocab_);
        for (int k = 0; k < vocab_; ++k)
            z[k] = static_cast<float>(static_cast<double>(mix(s + static_cast<std::uint64_t>(k)) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
        return z;
    }

    /// Frees the rows of the slots absent from this pass (their sequences left), compacting the store.
    template <class Request>
    void release_absent(std::span<const Request> requests) {
        std::set<std::size_t> present;
        for (const auto& r : requests) present.insert(r.slot);
        for (auto it = slot_rows_.begin(); it != slot_rows_.end();) {
            if (present.count(it->first)) {
                ++it;
                continue;
            }
            const std::size_t row = it->second;
            if (row < rows_.size()) rows_.erase(rows_.begin() + static_cast<std::ptrdiff_t>(row));
            if (bug_ != multi_bug::stale_slot_map)
                for (auto& [slot, r] : slot_rows_)
                    if (r > row) --r;
            tokens_.erase(it->first);
            it = slot_rows_.erase(it);
        }
    }

    /// The states of `seq` through the slot's cached row: keeps the longest common prefix of what
    /// the slot holds and `seq`, computes the rest.
    std::vector<std::uint64_t> states_of(std::size_t slot, const std::vector<token_id>& seq) {
        if (!slot_rows_.count(slot)) {
            slot_rows_[slot] = rows_.size();
            rows_.emplace_back();
        }
        const std::size_t row = slot_rows_[slot];
        if (row >= rows_.size()) rows_.resize(row + 1);
        auto& st = rows_[row];
        auto& held = tokens_[slot];
        std::size_t keep = 0;
        while (keep < held.size() && keep < seq.size() && keep + 1 < st.size() && held[keep] == seq[keep]) ++keep;
        st.resize(keep + 1);
        if (keep == 0) st[0] = seed_;
        for (std::size_t i = keep; i < seq.size(); ++i) st.push_back(next_state(st.back(), seq[i]));
        held = seq;
        return st;
    }

    int vocab_;
    std::uint64_t seed_;
    multi_bug bug_;
    std::vector<std::vector<std::uint64_t>> rows_;          // the KV store: one row per live sequence
    std::map<std::size_t, std::size_t> slot_rows_;          // slot -> row
    std::map<std::size_t, std::vector<token_id>> tokens_;   // slot -> the tokens its row holds
    specdec::sampling_workspace ws_{};
};

/// The same model with score() of its own (a BatchVerifier too), computed without the cache:
/// the kit's references then come from score().
struct multi_cached_scorer : multi_cached_model {
    using multi_cached_model::multi_cached_model;
    Eigen::MatrixXf score(std::span<const token_id> context, std::span<const token_id> draft) const {
        std::vector<token_id> seq(context.begin(), context.end());
        Eigen::MatrixXf out(vocab_size(), static_cast<Eigen::Index>(draft.size() + 1));
        for (std::size_t j = 0; j <= draft.size(); ++j) {
            out.col(static_cast<Eigen::Index>(j)) = logits_after(seq);
            if (j < draft.size()) seq.push_back(draft[j]);
        }
        return out;
    }
};

}  // namespace specdec_test
