#pragma once
/// \file
/// The llama2 engine for many sequences at once: one forward pass over the new positions of B
/// sequences, each with its own KV cache, as serving engines batch their requests. Every
/// weight matrix is streamed once per pass and multiplied against all packed positions
/// (a matrix-matrix product), so a pass over B·(γ+1) positions costs far less than B passes;
/// attention, which reads each sequence's own cache, runs per sequence.
///
/// It models specdec's MultiSequenceVerifier (score_batch), MultiSequenceTreeVerifier
/// (score_tree_batch: every sequence's draft tree in the same pass, tree attention per
/// sequence) and MultiSequenceDrafter (draft_batch). Determinism carries over from transformer.hpp: every dot product is
/// accumulated in one fixed order whatever the number of packed positions, so sequence i's
/// logits from a pass are bit-for-bit those its own transformer::score() returns.
///
/// Example code, single-threaded, not thread-safe.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include <specdec/multi_sequence.hpp>
#include <specdec/sampling.hpp>

#include "checkpoint.hpp"
#include "transformer.hpp"

namespace llama2 {

/// Y = W X as detail::matmul (W row-major rows x cols, X and Y column-major, k columns), but
/// streaming W from memory once whatever k is: detail::matmul sweeps W once per group of up to
/// detail::max_columns columns, so a pass over many packed positions would read every weight
/// matrix k / 9 times. Here W is taken in panels of rows (about 1 MiB, which stay in cache) and
/// each panel is multiplied against every column group before the next is read. Each output
/// element is the same kernel's accumulation over the same row in the same order, so the result
/// is bit for bit detail::matmul's (see "Determinism" in transformer.hpp).
inline void matmul_streamed_once(const float* w, std::ptrdiff_t rows, std::ptrdiff_t cols, const float* x,
                                 std::ptrdiff_t ldx, std::ptrdiff_t k, float* y, std::ptrdiff_t ldy) {
    if (k <= detail::max_columns) {
        detail::matmul(w, rows, cols, x, ldx, k, y, ldy);
        return;
    }
    constexpr std::ptrdiff_t panel_bytes = std::ptrdiff_t(1) << 20;
    const std::ptrdiff_t panel =
        std::max<std::ptrdiff_t>(16, panel_bytes / (cols * std::ptrdiff_t(sizeof(float))) / 16 * 16);
    for (std::ptrdiff_t r0 = 0; r0 < rows; r0 += panel)
        detail::matmul(w + r0 * cols, std::min(panel, rows - r0), cols, x, ldx, k, y + r0, ldy);
}

/// A llama2.c model serving many sequences: slot s is a transformer of its own (its KV cache),
/// all sharing the weights; score_batch and draft_batch run the new positions of every
/// sequence of a call through the layers together.
///
/// Exceptions: score_batch and draft_batch check every request first (std::invalid_argument
/// for a slot used twice, and transformer's own checks: std::out_of_range for a token outside
/// the vocabulary, std::length_error beyond seq_len), then size everything they need
/// (std::bad_alloc) before any cache changes: on a throw, every slot's cached tokens are as they
/// were (a cache may have grown its capacity), and `out` holds unspecified values.
class batch_transformer {
public:
    /// A model over `model`'s weights (shared); `use_layers` as transformer's (0: all).
    explicit batch_transformer(std::shared_ptr<const checkpoint> model, int use_layers = 0)
        : prototype_(std::move(model), use_layers) {}

    [[nodiscard]] std::ptrdiff_t vocab_size() const noexcept { return prototype_.vocab_size(); }
    [[nodiscard]] std::ptrdiff_t max_context() const noexcept { return prototype_.max_context(); }
    [[nodiscard]] const std::string& name() const noexcept { return prototype_.name(); }

    /// The per-sequence transformer of `slot` (made on first use, with an empty cache).
    transformer& sequence(std::size_t slot) {
        while (slots_.size() <= slot) slots_.emplace_back(prototype_.model(), prototype_.n_layers());
        return slots_[slot];
    }
    /// Slots made so far.
    [[nodiscard]] std::size_t slots() const noexcept { return slots_.size(); }
    /// Passes (score_batch calls, and one per draft position of draft_batch) so far.
    [[nodiscard]] std::uint64_t passes() const noexcept { return passes_; }

    /// specdec's MultiSequenceVerifier: for each request i, out.sequence(i) column j = the logits
    /// after requests[i].context + requests[i].draft[0..j), from one pass over every request's
    /// un-cached positions. Afterwards slot i's cache holds context + draft.
    void score_batch(std::span<const specdec::score_request> requests, specdec::packed_logits& out) {
        if (out.size() != requests.size() || out.vocab() != vocab_size())
            throw std::invalid_argument("llama2::batch_transformer::score_batch: out is shaped for " +
                                        std::to_string(out.size()) + " sequences of " + std::to_string(out.vocab()) +
                                        " rows; " + std::to_string(requests.size()) + " requests of " +
                                        std::to_string(vocab_size()) + " rows need packed_logits::shape first");
        jobs_.clear();
        for (const auto& r : requests) jobs_.push_back({r.slot, r.context, r.draft, nullptr});
        forward_batch("score_batch", out.data());
    }

    /// specdec's MultiSequenceTreeVerifier: for each request i, out.sequence(i) column 0 = the
    /// logits after requests[i].context, column k + 1 = those after the context and the path to
    /// node k of requests[i].tree, from one pass over every request's un-cached context positions
    /// and every node (a node at depth d takes RoPE position context.size() - 1 + d and attends
    /// to the context and its own ancestors, as transformer::score_tree). Every node counts
    /// against seq_len. Afterwards slot i's cache holds the context, and the nodes' keys and
    /// values stay behind it: when the slot's next request's context goes on along a path of
    /// the tree (the accepted path, then the next token), that path's rows move into place
    /// instead of being recomputed (the same values: a node attends to exactly the positions a
    /// linear pass over the path would).
    void score_tree_batch(std::span<const specdec::tree_score_request> requests, specdec::packed_logits& out) {
        if (out.size() != requests.size() || out.vocab() != vocab_size())
            throw std::invalid_argument("llama2::batch_transformer::score_tree_batch: out is shaped for " +
                                        std::to_string(out.size()) + " sequences of " + std::to_string(out.vocab()) +
                                        " rows; " + std::to_string(requests.size()) + " requests of " +
                                        std::to_string(vocab_size()) + " rows need packed_logits::shape first");
        jobs_.clear();
        for (const auto& r : requests) {
            if (r.tree == nullptr)
                throw std::invalid_argument("llama2::batch_transformer::score_tree_batch: request " +
                                            std::to_string(jobs_.size()) + " has no tree");
            const auto& t = *r.tree;
            const auto n = std::ptrdiff_t(t.tokens.size());
            if (std::ptrdiff_t(t.parents.size()) != n || std::ptrdiff_t(t.depths.size()) != n)
                throw std::invalid_argument("llama2::batch_transformer::score_tree_batch: a tree of " +
                                            std::to_string(n) + " tokens has " + std::to_string(t.parents.size()) +
                                            " parents and " + std::to_string(t.depths.size()) + " depths");
            for (std::ptrdiff_t i = 0; i < n; ++i) {
                const std::int32_t par = t.parents[std::size_t(i)];
                if (par < -1 || par >= i || t.depths[std::size_t(i)] != (par < 0 ? 1 : t.depths[std::size_t(par)] + 1))
                    throw std::invalid_argument("llama2::batch_transformer::score_tree_batch: node " +
                                                std::to_string(i) + " has parent " + std::to_string(par) +
                                                "; parents come first and depth is the parent's + 1");
            }
            jobs_.push_back({r.slot, r.context, std::span<const std::int32_t>(t.tokens.data(), t.tokens.size()), r.tree});
        }
        forward_batch("score_tree_batch", out.data());
    }

    /// specdec's MultiSequenceDrafter: γ_i tokens for each request, sampled from the model's
    /// standardized distributions with the request's own uniforms (as specdec's model drafter
    /// does for one sequence), position by position: one pass per draft position over every
    /// sequence still drafting. Honours draft_block::stop_below.
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling) {
        const Eigen::Index V = vocab_size();
        std::size_t longest = 0;
        drafted_.resize(requests.size());
        open_.assign(requests.size(), false);
        for (std::size_t i = 0; i < requests.size(); ++i) {
            auto& r = requests[i];
            drafted_[i].assign(r.context.begin(), r.context.end());
            open_[i] = r.gamma > 0;
            if (r.gamma > 0) r.out->resize_probs(V, static_cast<Eigen::Index>(r.gamma));
            longest = std::max(longest, r.gamma);
        }
        for (std::size_t pos = 0; pos < longest; ++pos) {
            jobs_.clear();
            order_.clear();
            for (std::size_t i = 0; i < requests.size(); ++i) {
                if (!open_[i]) continue;
                jobs_.push_back({requests[i].slot, drafted_[i], {}});
                order_.push_back(i);
            }
            if (jobs_.empty()) break;
            detail::reshape(logits_, V, static_cast<Eigen::Index>(jobs_.size()));
            forward_batch("draft_batch", logits_.data());
            for (std::size_t k = 0; k < order_.size(); ++k) {
                auto& r = requests[order_[k]];
                auto q = r.out->probs.col(static_cast<Eigen::Index>(pos));
                const auto d = specdec::standardize_weights_and_sample(logits_.col(static_cast<Eigen::Index>(k)),
                                                                       sampling, q, r.uniforms(), sampling_ws_,
                                                                       "llama2::batch_transformer::draft_batch");
                r.out->scales.push_back(d.scale);
                r.out->tokens.push_back(d.token);
                r.out->model_calls = pos + 1;
                drafted_[order_[k]].push_back(d.token);
                if (r.out->tokens.size() >= r.gamma ||
                    static_cast<double>(d.scale) * static_cast<double>(q[d.token]) <
                        static_cast<double>(r.out->stop_below))
                    open_[order_[k]] = false;
            }
        }
        for (auto& r : requests)
            if (r.gamma > 0) r.out->standardized = true;
    }

private:
    struct job {
        std::size_t slot;
        std::span<const std::int32_t> context, draft;  // a tree job's draft: its nodes' tokens
        const specdec::draft_tree* tree = nullptr;     // null: a chain
    };
    struct plan {
        transformer* m;
        std::ptrdiff_t p, n, nc, base;  // first new position, positions, context length, first packed column
        std::ptrdiff_t moves_begin, moves_end;  // the slot's tree-path rows to move (moves_)
    };
    /// A key/value row of a tree node (cache slot `from`) that becomes position `to`.
    struct row_move {
        std::ptrdiff_t from, to;
    };

    /// Runs the un-cached positions of every job in one pass and writes the logits of each
    /// job's last draft.size() + 1 positions, job after job, to out (vocab x total, column-major).
    void forward_batch(const char* fn, float* out) {
        const config& c = prototype_.model_config();
        // Checks, before anything changes.
        plans_.clear();
        moves_.clear();
        std::ptrdiff_t T = 0, n_out = 0;
        for (const job& jb : jobs_) (void)sequence(jb.slot);  // every slot made first: plans point into slots_
        for (std::size_t i = 0; i < jobs_.size(); ++i) {
            for (std::size_t k = 0; k < i; ++k)
                if (jobs_[k].slot == jobs_[i].slot)
                    throw std::invalid_argument(std::string("llama2::batch_transformer::") + fn + ": slot " +
                                                std::to_string(jobs_[i].slot) + " is used by requests " +
                                                std::to_string(k) + " and " + std::to_string(i) +
                                                "; each sequence of a pass needs a slot of its own");
            transformer& m = sequence(jobs_[i].slot);
            m.check(fn, jobs_[i].context, jobs_[i].draft);
            const auto nc = std::ptrdiff_t(jobs_[i].context.size());
            const std::ptrdiff_t n = nc + std::ptrdiff_t(jobs_[i].draft.size());
            const job& jb = jobs_[i];
            auto token = [&](std::ptrdiff_t k) {
                return k < nc ? jb.context[std::size_t(k)] : jb.draft[std::size_t(k - nc)];
            };
            std::ptrdiff_t p = 0;
            const auto cached = std::ptrdiff_t(m.cached_.size());
            while (p < cached && p < n && m.cached_[std::size_t(p)] == token(p)) ++p;
            // After a tree pass on this slot, the context may go on along a path of that tree,
            // whose keys and values the pass left at the nodes' slots (cached + node index,
            // already at the path's RoPE positions): they move to the positions that follow the
            // cache instead of being recomputed (as transformer::settle_tree). Planned here,
            // moved after sizing; only when the cache need not grow (growth keeps only rows
            // below p).
            const auto moves_begin = std::ptrdiff_t(moves_.size());
            if (p == cached && m.tree_base_ == cached && m.tree_capacity_ == m.capacity_ && n <= m.capacity_) {
                std::int32_t parent = -1;
                while (p < nc - 1) {
                    const std::ptrdiff_t child = m.tree_child(parent, token(p));
                    if (child < 0) break;
                    moves_.push_back({cached + child, p});
                    parent = std::int32_t(child);
                    ++p;
                }
            }
            p = std::min(p, nc - 1);
            plans_.push_back({&m, p, n, nc, T, moves_begin, std::ptrdiff_t(moves_.size())});
            T += n - p;
            n_out += n - nc + 1;
        }
        if (plans_.empty()) return;
        // Sizing: activations, then caches; nothing else can throw after this.
        const std::ptrdiff_t D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), hs = c.head_size(), V = c.vocab_size,
                             group = c.n_heads / c.n_kv_heads, half = hs / 2;
        for (Eigen::MatrixXf* a : {&x_, &xb_, &q_, &y_}) detail::reshape(*a, D, T);
        detail::reshape(h1_, H, T);
        detail::reshape(h3_, H, T);
        detail::reshape(k_, KV, T);
        detail::reshape(v_, KV, T);
        for (std::size_t i = 0; i < plans_.size(); ++i) {
            transformer& m = *plans_[i].m;
            m.cached_.reserve(std::size_t(plans_[i].n));
            if (const specdec::draft_tree* tree = jobs_[i].tree) {
                m.tree_tokens_.reserve(tree->size());
                m.tree_parents_.reserve(tree->size());
            }
        }
        for (const plan& pl : plans_)
            if (pl.n > pl.m->capacity_)
                pl.m->grow_cache(pl.n, pl.p,
                                 std::max(pl.n, std::min<std::ptrdiff_t>(2 * pl.m->capacity_, pl.m->max_context())));

        const weights& w = prototype_.model()->w;
        const int layers = prototype_.n_layers();
        // The cache: rolled back to p, or extended to p along the last tree's path (its rows
        // moved up in increasing order: a path's node indices grow with depth, so no row is
        // overwritten before it is read); the tree is forgotten either way.
        for (std::size_t i = 0; i < plans_.size(); ++i) {
            const plan& pl = plans_[i];
            transformer& m = *pl.m;
            for (std::ptrdiff_t k = pl.moves_begin; k < pl.moves_end; ++k) {
                const row_move mv = moves_[std::size_t(k)];
                if (mv.to >= pl.p) break;
                m.move_cache_row(mv.from, mv.to);
            }
            if (std::ptrdiff_t(m.cached_.size()) >= pl.p) {
                m.cached_.resize(std::size_t(pl.p));
            } else {
                for (auto pos = std::ptrdiff_t(m.cached_.size()); pos < pl.p; ++pos)
                    m.cached_.push_back(jobs_[i].context[std::size_t(pos)]);  // (reserved: no allocation)
            }
            m.tree_base_ = -1;
        }
        for (std::size_t i = 0; i < plans_.size(); ++i) {
            const plan& pl = plans_[i];
            for (std::ptrdiff_t pos = pl.p; pos < pl.n; ++pos) {
                const std::int32_t tok = pos < pl.nc ? jobs_[i].context[std::size_t(pos)]
                                                     : jobs_[i].draft[std::size_t(pos - pl.nc)];
                std::copy_n(w.token_embedding.data() + std::ptrdiff_t(tok) * D, D, x_.col(pl.base + pos - pl.p).data());
            }
        }
        const float sqrt_hs = std::sqrt(float(hs));  // run.c: score /= sqrtf(head_size)
        for (std::ptrdiff_t l = 0; l < layers; ++l) {
            for (std::ptrdiff_t t = 0; t < T; ++t)
                detail::rmsnorm(xb_.col(t).data(), x_.col(t).data(), w.rms_att.data() + l * D, D);
            // The projections of all packed positions: each weight matrix streamed once.
            matmul_streamed_once(w.wq.data() + l * D * D, D, D, xb_.data(), D, T, q_.data(), D);
            matmul_streamed_once(w.wk.data() + l * KV * D, KV, D, xb_.data(), D, T, k_.data(), KV);
            matmul_streamed_once(w.wv.data() + l * KV * D, KV, D, xb_.data(), D, T, v_.data(), KV);
            for (const plan& pl : plans_) {
                transformer& m = *pl.m;
                const std::ptrdiff_t S = m.capacity_;
                float* kc = m.key_cache_.data() + l * S * KV;
                float* vc = m.value_cache_.data() + l * S * KV;
                const specdec::draft_tree* tree = jobs_[std::size_t(&pl - plans_.data())].tree;
                // RoPE (run.c) at the sequence's own positions (a tree node's: nc - 1 + its depth),
                // then k and v into its cache (a node's at slot nc + its index).
                for (std::ptrdiff_t pos = pl.p; pos < pl.n; ++pos) {
                    const std::ptrdiff_t t = pl.base + pos - pl.p;
                    const std::ptrdiff_t rope =
                        tree && pos >= pl.nc ? pl.nc - 1 + std::ptrdiff_t(tree->depths[std::size_t(pos - pl.nc)]) : pos;
                    const float* cs = m.rope_cos_.data() + rope * half;
                    const float* sn = m.rope_sin_.data() + rope * half;
                    auto rotate = [&](float* v, std::ptrdiff_t len) {
                        for (std::ptrdiff_t i = 0; i < len; i += 2) {
                            const std::ptrdiff_t f = (i % hs) / 2;
                            const float v0 = v[i], v1 = v[i + 1];
                            v[i] = v0 * cs[f] - v1 * sn[f];
                            v[i + 1] = v0 * sn[f] + v1 * cs[f];
                        }
                    };
                    rotate(q_.col(t).data(), D);
                    rotate(k_.col(t).data(), KV);
                    std::copy_n(k_.col(t).data(), KV, kc + pos * KV);
                    std::copy_n(v_.col(t).data(), KV, vc + pos * KV);
                }
                // Causal attention over the sequence's own cache; a tree node attends to the whole
                // context, then its ancestors, then itself (the order of transformer::score_tree).
                for (std::ptrdiff_t pos = pl.p; pos < pl.n; ++pos) {
                    const std::ptrdiff_t t = pl.base + pos - pl.p;
                    attend_.clear();
                    if (!tree || pos < pl.nc) {
                        for (std::ptrdiff_t s = 0; s <= pos; ++s) attend_.push_back(s);
                    } else {
                        for (std::ptrdiff_t s = 0; s < pl.nc; ++s) attend_.push_back(s);
                        const std::size_t mark = attend_.size();
                        for (std::ptrdiff_t v = pos - pl.nc; v >= 0; v = tree->parents[std::size_t(v)])
                            attend_.push_back(pl.nc + v);
                        std::reverse(attend_.begin() + std::ptrdiff_t(mark), attend_.end());
                    }
                    const auto na = std::ptrdiff_t(attend_.size());
                    for (std::ptrdiff_t h = 0; h < c.n_heads; ++h) {
                        const float* qh = q_.col(t).data() + h * hs;
                        const std::ptrdiff_t off = (h / group) * hs;
                        float* att = m.att_.data();
                        float mx = -std::numeric_limits<float>::infinity();
                        for (std::ptrdiff_t j = 0; j < na; ++j) {
                            att[j] = detail::dot(qh, kc + attend_[std::size_t(j)] * KV + off, hs) / sqrt_hs;
                            mx = std::max(mx, att[j]);
                        }
                        float sum = 0.0f;
                        for (std::ptrdiff_t j = 0; j < na; ++j) {
                            att[j] = std::exp(att[j] - mx);
                            sum += att[j];
                        }
                        float* o = xb_.col(t).data() + h * hs;
                        std::fill_n(o, hs, 0.0f);
                        for (std::ptrdiff_t j = 0; j < na; ++j)
                            detail::axpy(att[j] / sum, vc + attend_[std::size_t(j)] * KV + off, o, hs);
                    }
                }
            }
            matmul_streamed_once(w.wo.data() + l * D * D, D, D, xb_.data(), D, T, y_.data(), D);
            x_ += y_;
            // SwiGLU feed-forward: x += w2 (silu(w1 xb) * w3 xb).
            for (std::ptrdiff_t t = 0; t < T; ++t)
                detail::rmsnorm(xb_.col(t).data(), x_.col(t).data(), w.rms_ffn.data() + l * D, D);
            matmul_streamed_once(w.w1.data() + l * H * D, H, D, xb_.data(), D, T, h1_.data(), H);
            matmul_streamed_once(w.w3.data() + l * H * D, H, D, xb_.data(), D, T, h3_.data(), H);
            float* a = h1_.data();
            const float* b = h3_.data();
            for (std::ptrdiff_t i = 0; i < H * T; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
            matmul_streamed_once(w.w2.data() + l * D * H, D, H, h1_.data(), H, T, y_.data(), D);
            x_ += y_;
        }
        // Final norm of the positions whose logits are asked for, packed job after job, and one
        // classifier product for all of them.
        std::ptrdiff_t j = 0;
        for (const plan& pl : plans_)
            for (std::ptrdiff_t pos = pl.nc - 1; pos < pl.n; ++pos, ++j)
                detail::rmsnorm(xb_.col(j).data(), x_.col(pl.base + pos - pl.p).data(), w.rms_final.data(), D);
        matmul_streamed_once(w.classifier(), V, D, xb_.data(), D, n_out, out, V);
        for (std::size_t i = 0; i < plans_.size(); ++i) {
            const plan& pl = plans_[i];
            // (A tree's nodes are not a sequence: only the context stays cached, and the tree is
            // kept so that the next pass can take the accepted path's rows from it.)
            const std::ptrdiff_t kept = jobs_[i].tree ? pl.nc : pl.n;
            for (std::ptrdiff_t pos = pl.p; pos < kept; ++pos)
                pl.m->cached_.push_back(pos < pl.nc ? jobs_[i].context[std::size_t(pos)]
                                                    : jobs_[i].draft[std::size_t(pos - pl.nc)]);
            if (const specdec::draft_tree* tree = jobs_[i].tree) {
                pl.m->tree_base_ = pl.nc;
                pl.m->tree_capacity_ = pl.m->capacity_;
                pl.m->tree_tokens_.assign(tree->tokens.begin(), tree->tokens.end());
                pl.m->tree_parents_.assign(tree->parents.begin(), tree->parents.end());
            }
            ++pl.m->passes_;
            pl.m->positions_computed_ += std::uint64_t(pl.n - pl.p);
        }
        ++passes_;
    }

    transformer prototype_;             // the weights and depth every slot shares
    std::vector<transformer> slots_;    // one per sequence slot: its KV cache
    std::vector<job> jobs_;
    std::vector<plan> plans_;
    std::vector<row_move> moves_;
    std::vector<std::vector<std::int32_t>> drafted_;  // draft_batch: context + tokens drafted so far
    std::vector<bool> open_;
    std::vector<std::ptrdiff_t> attend_;              // the cache slots one position attends to
    std::vector<std::size_t> order_;
    Eigen::MatrixXf x_, xb_, q_, y_, h1_, h3_, k_, v_;  // activations, one column per packed position
    Eigen::MatrixXf logits_;                            // draft_batch: one column per drafting sequence
    specdec::sampling_workspace sampling_ws_;
    std::uint64_t passes_ = 0;
};

}  // namespace llama2
