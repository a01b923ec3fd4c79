#pragma once
/// \file
/// A llama2.c-compatible transformer forward pass in Eigen (float), with a KV cache that
/// follows the caller's token sequence, a batched verification pass (`score`) for
/// speculative decoding, and early-exit variants that share the weights.
///
/// Example code: copy it (with checkpoint.hpp) into your project. Single-threaded.
///
/// The architecture is the one of llama2.c's run.c (Karpathy, MIT):
///   x = token_embedding[token]
///   per layer l:  xb = rmsnorm(x) * rms_att[l];  q = wq xb, k = wk xb, v = wv xb;
///                 RoPE on q and k;  causal multi-head attention with n_kv_heads
///                 key/value heads shared by groups of n_heads / n_kv_heads query heads;
///                 x += wo att;  xb = rmsnorm(x) * rms_ffn[l];  x += w2 (silu(w1 xb) * (w3 xb))
///   logits = wcls (rmsnorm(x) * rms_final)
/// RMSNorm: x / sqrt(mean(x^2) + 1e-5). RoPE (run.c, "rotate consecutive pairs"): for each even
/// index i of a q or k vector, at position pos, the pair (v[i], v[i+1]) is rotated by the angle
/// pos * 10000^(-(i mod head_size) / head_size).
///
/// Determinism: every dot product (weights, attention, norms) is accumulated in one fixed order
/// that depends only on its length, never on how many positions a pass holds or on memory
/// alignment. So, within one build (without -ffast-math), column j of score(context, draft) is
/// bit-for-bit equal to next_logits(context + draft[0..j)), and a greedy speculative decoder
/// reproduces plain greedy decoding exactly.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "checkpoint.hpp"

namespace llama2 {

namespace detail {

/// Eigen's SIMD packet of floats for the instruction set this translation unit is compiled
/// for (4 floats with SSE, 8 with AVX, 16 with AVX-512; 1 when vectorization is disabled).
using packet = Eigen::internal::packet_traits<float>::type;
inline constexpr int packet_size = Eigen::internal::packet_traits<float>::size;

/// Vector registers available: bounds how many accumulators a kernel may keep live.
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_NEON) || defined(__aarch64__)
inline constexpr int vector_registers = 32;
#else
inline constexpr int vector_registers = 16;
#endif

/// Calls f(std::integral_constant<std::size_t, 0>{}) ... f(std::integral_constant<std::size_t, N-1>{}):
/// a guaranteed unroll, so accumulator arrays stay in registers.
template <int N, class F>
EIGEN_STRONG_INLINE void unroll(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (f(std::integral_constant<std::size_t, I>{}), ...);
    }(std::make_index_sequence<std::size_t(N)>{});
}

/// A compile-time index as a signed offset.
template <std::size_t I>
constexpr std::ptrdiff_t off(std::integral_constant<std::size_t, I>) noexcept {
    return std::ptrdiff_t(I);
}

/// The last, partial packet of a vector of length n starting at a (n % packet_size elements,
/// zero-padded). Padding with zeros lets the remainder go through the same packet arithmetic
/// as the body: adding 0 * 0 leaves every lane unchanged, so results do not depend on where
/// the remainder falls, and no scalar code path exists (see "Determinism").
EIGEN_STRONG_INLINE packet load_tail(const float* a, std::ptrdiff_t n) {
    alignas(64) float buf[packet_size];
    const std::ptrdiff_t body = n / packet_size * packet_size, rest = n - body;
    for (std::ptrdiff_t i = 0; i < packet_size; ++i) buf[i] = i < rest ? a[body + i] : 0.0f;
    return Eigen::internal::pload<packet>(buf);
}

/// sum_i a[i] * b[i], accumulated lane-wise in one packet (fixed order), then reduced.
inline float dot(const float* a, const float* b, std::ptrdiff_t n) {
    using namespace Eigen::internal;
    packet acc = pset1<packet>(0.0f);
    const std::ptrdiff_t body = n / packet_size * packet_size;
    for (std::ptrdiff_t j = 0; j < body; j += packet_size)
        acc = pmadd(ploadu<packet>(a + j), ploadu<packet>(b + j), acc);
    if (body < n) acc = pmadd(load_tail(a, n), load_tail(b, n), acc);
    return predux(acc);
}

/// y[i] += alpha * x[i] for i < n.
inline void axpy(float alpha, const float* x, float* y, std::ptrdiff_t n) {
    using namespace Eigen::internal;
    const packet a = pset1<packet>(alpha);
    std::ptrdiff_t j = 0;
    for (; j + packet_size <= n; j += packet_size)
        pstoreu(y + j, pmadd(a, ploadu<packet>(x + j), ploadu<packet>(y + j)));
    for (; j < n; ++j) y[j] += alpha * x[j];
}

/// Largest number of activation columns one sweep over a weight matrix handles.
inline constexpr int max_columns = 9;

/// Rows the K-column kernel computes together (R * K accumulators + R weight packets + one
/// activation packet must fit the register file). Measured on AVX-512 (Zen 5) with weights
/// streamed from DRAM: up to 5 columns, one row at a time (a single memory stream, which the
/// prefetcher serves best); from 6 columns on, two rows (fewer activation loads per FMA).
template <int K>
inline constexpr int rows_per_block = K <= 5 ? 1 : (2 * K + 3 <= vector_registers ? 2 : 1);

/// Software prefetch distance along a weight row, in floats (8 KiB): lets a sweep over a
/// weight matrix that is slowed down by arithmetic (several columns) keep memory busy.
inline constexpr std::ptrdiff_t prefetch_distance = 2048;

/// Y(:, 0..K) = W X(:, 0..K) for all rows of W: a sweep over W in blocks of R rows; each
/// weight packet is loaded once and multiplied against the K activation columns (which stay
/// in L1), so W is streamed from memory exactly once whatever K is. Each (row, column) pair
/// has its own accumulator, fed the packets of the row in order, with the zero-padded
/// remainder last; the result is therefore independent of K and R (see "Determinism").
template <int K, int R = rows_per_block<K>>
EIGEN_DONT_INLINE void gemm_columns(const float* w, std::ptrdiff_t rows, std::ptrdiff_t cols, const float* x,
                                    std::ptrdiff_t ldx, float* y, std::ptrdiff_t ldy) {
    using namespace Eigen::internal;
    const std::ptrdiff_t body = cols / packet_size * packet_size;
    const bool has_tail = body < cols;
    packet x_tail[std::size_t(K)];
    unroll<K>([&](auto c) { x_tail[c] = has_tail ? load_tail(x + off(c) * ldx, cols) : pset1<packet>(0.0f); });

    // Prefetch < B, Prefetch > (row block wb, output yb); prefetching stays inside the matrix.
    auto block = [&]<int B, bool Prefetch>(std::integral_constant<int, B>, std::bool_constant<Prefetch>,
                                           const float* wb, float* yb) {
        packet acc[std::size_t(B)][std::size_t(K)];
        unroll<B>([&](auto r) { unroll<K>([&](auto c) { acc[r][c] = pset1<packet>(0.0f); }); });
        for (std::ptrdiff_t j = 0; j < body; j += packet_size) {
            packet wr[std::size_t(B)];
            unroll<B>([&](auto r) {
                if constexpr (Prefetch) prefetch(wb + off(r) * cols + j + prefetch_distance);
                wr[r] = ploadu<packet>(wb + off(r) * cols + j);
            });
            unroll<K>([&](auto c) {
                const packet xc = ploadu<packet>(x + off(c) * ldx + j);
                unroll<B>([&](auto r) { acc[r][c] = pmadd(wr[r], xc, acc[r][c]); });
            });
        }
        if (has_tail)
            unroll<B>([&](auto r) {
                const packet wt = load_tail(wb + off(r) * cols, cols);
                unroll<K>([&](auto c) { acc[r][c] = pmadd(wt, x_tail[c], acc[r][c]); });
            });
        unroll<B>([&](auto r) { unroll<K>([&](auto c) { yb[off(c) * ldy + off(r)] = predux(acc[r][c]); }); });
    };
    const std::ptrdiff_t blocked = rows / R * R;
    std::ptrdiff_t i = 0;
    for (; i < blocked && (i + R) * cols + prefetch_distance <= rows * cols; i += R)
        block(std::integral_constant<int, R>{}, std::true_type{}, w + i * cols, y + i);
    for (; i < blocked; i += R) block(std::integral_constant<int, R>{}, std::false_type{}, w + i * cols, y + i);
    for (; i < rows; ++i) block(std::integral_constant<int, 1>{}, std::false_type{}, w + i * cols, y + i);
}

/// Y = W X: W row-major [rows, cols] (a PyTorch Linear weight, as stored in the checkpoint),
/// X column-major [cols, k] with leading dimension ldx, Y column-major [rows, k] with leading
/// dimension ldy. Reads W once per group of up to max_columns columns.
///
/// Why not `Y.noalias() = W * X` with Eigen: for the few columns of a verification pass
/// (k = 2..9), Eigen's GEMM packs blocks of W before multiplying and `lazyProduct` walks W
/// once per column; this kernel streams W exactly once. Measured single-threaded on 75 MB of
/// 2048 x 768 matrices (AVX-512 Zen 5, benchmarks/llama2_bench.cpp, llama2/matmul), weight
/// GB/s for k = 1 / 2 / 5 / 9: this kernel 37 / 38 / 32 / 23, Eigen GEMM 32 / 9 / 12 / 11,
/// Eigen lazyProduct 29 / 22 / 14 / 9.
inline void matmul(const float* w, std::ptrdiff_t rows, std::ptrdiff_t cols, const float* x, std::ptrdiff_t ldx,
                   std::ptrdiff_t k, float* y, std::ptrdiff_t ldy) {
    while (k > 0) {
        const std::ptrdiff_t groups = (k + max_columns - 1) / max_columns;
        const std::ptrdiff_t kb = (k + groups - 1) / groups;  // balanced groups: 10 -> 5 + 5
        switch (kb) {
            case 1: gemm_columns<1>(w, rows, cols, x, ldx, y, ldy); break;
            case 2: gemm_columns<2>(w, rows, cols, x, ldx, y, ldy); break;
            case 3: gemm_columns<3>(w, rows, cols, x, ldx, y, ldy); break;
            case 4: gemm_columns<4>(w, rows, cols, x, ldx, y, ldy); break;
            case 5: gemm_columns<5>(w, rows, cols, x, ldx, y, ldy); break;
            case 6: gemm_columns<6>(w, rows, cols, x, ldx, y, ldy); break;
            case 7: gemm_columns<7>(w, rows, cols, x, ldx, y, ldy); break;
            case 8: gemm_columns<8>(w, rows, cols, x, ldx, y, ldy); break;
            default: gemm_columns<9>(w, rows, cols, x, ldx, y, ldy); break;
        }
        x += kb * ldx;
        y += kb * ldy;
        k -= kb;
    }
}

/// Gives `m` the shape rows x cols (contents unspecified), unchanged if that throws: the new
/// storage is allocated before the old is released. (Eigen 3.4's resize() frees first, so a
/// std::bad_alloc there leaves the matrix holding a freed pointer, which its destructor frees
/// again.) No allocation when the number of elements stays the same.
inline void reshape(Eigen::MatrixXf& m, Eigen::Index rows, Eigen::Index cols) {
    if (m.size() == rows * cols) {
        m.resize(rows, cols);
        return;
    }
    Eigen::MatrixXf fresh(rows, cols);
    m.swap(fresh);
}

/// out = rmsnorm(x) * gain over n elements (run.c's rmsnorm: eps 1e-5 inside the root).
inline void rmsnorm(float* out, const float* x, const float* gain, std::ptrdiff_t n) {
    const float ms = dot(x, x, n) / float(n) + 1e-5f;
    const float inv = 1.0f / std::sqrt(ms);
    for (std::ptrdiff_t i = 0; i < n; ++i) out[i] = gain[i] * (inv * x[i]);
}

}  // namespace detail

/// A llama2.c model with a KV cache keyed by the token sequence it has processed.
///
/// Context-length policy: the model's seq_len (max_context()) is a hard limit. A call whose
/// context (plus draft, for score()) holds more than max_context() tokens throws
/// std::length_error naming the model and both lengths; the cache is left unchanged. Callers
/// that need longer generations must stop (or restart with a shorter context) themselves.
///
/// Memory: the KV cache (and the RoPE tables and attention scratch) grow with the positions
/// actually used, not with seq_len: capacity doubles, from 16 positions, up to seq_len, so a
/// generation pays for the context it uses, the copies on growth cost amortized O(1) per
/// position, and a checkpoint whose header claims a huge seq_len costs nothing until used.
/// reserve(n) allocates for n positions up front (a decoding loop that must not allocate).
/// When the cache cannot grow, the call throws std::bad_alloc and leaves the cache unchanged.
///
/// Exceptions: next_logits, score, score_into and reserve give the strong guarantee (clear_cache
/// cannot throw). Whatever such a call throws (the
/// std::invalid_argument, std::out_of_range and std::length_error of its checks, made before
/// anything changes, or a std::bad_alloc from growing the cache or the per-call activations,
/// all allocated before the cache is touched), the cache (cached_tokens(), cache_capacity()) and
/// score_into's `out` are as they were, so the next call returns bit for bit what a fresh
/// engine returns on the same context.
///
/// Not thread-safe (the cache is mutable state); copies share the weights and copy the cache.
class transformer {
    // The multi-sequence engine (batch_transformer.hpp) runs the layers of many instances in
    // one pass over their caches.
    friend class batch_transformer;

public:
    /// A model over `model`'s weights (shared, never copied). `use_layers` = k in
    /// [1, n_layers] runs only the first k blocks before the final norm and classifier (an
    /// early-exit drafter built from the target itself); 0 means all layers.
    /// \throws std::invalid_argument for a null model, invalid weights or use_layers out of range.
    explicit transformer(std::shared_ptr<const checkpoint> model, int use_layers = 0) : model_(std::move(model)) {
        if (!model_) throw std::invalid_argument("llama2::transformer: null checkpoint");
        const config& c = model_->cfg;
        check_weights(c, model_->w, "llama2::transformer '" + model_->name + "'");
        if (use_layers < 0 || use_layers > c.n_layers)
            throw std::invalid_argument("llama2::transformer '" + model_->name + "': use_layers = " +
                                        std::to_string(use_layers) + " is outside [1, " +
                                        std::to_string(c.n_layers) + "] (0 = all layers)");
        layers_ = use_layers == 0 ? c.n_layers : use_layers;
        name_ = model_->name;
        if (layers_ != c.n_layers)
            name_ += " (first " + std::to_string(layers_) + " of " + std::to_string(c.n_layers) + " layers)";
        // The KV cache, RoPE tables and attention scratch are allocated as positions are used
        // (see grow_cache).
    }

    /// Reads the checkpoint at `path` (see read_checkpoint) and wraps it.
    explicit transformer(const std::filesystem::path& path, int use_layers = 0)
        : transformer(std::make_shared<const checkpoint>(read_checkpoint(path)), use_layers) {}

    /// An early-exit variant: the first k layers of this model, sharing its weights, with an
    /// empty cache of its own. k = n_layers of the checkpoint gives the full model.
    [[nodiscard]] transformer early_exit(int k) const {
        if (k < 1) throw std::invalid_argument("llama2::transformer::early_exit: k must be >= 1");
        return transformer(model_, k);
    }

    /// Vocabulary size: the number of logits per position.
    [[nodiscard]] std::ptrdiff_t vocab_size() const noexcept { return model_->cfg.vocab_size; }
    /// Most tokens a context (plus draft) may hold: the model's seq_len.
    [[nodiscard]] std::ptrdiff_t max_context() const noexcept { return model_->cfg.seq_len; }
    /// Layers this instance runs (the early-exit depth, or all).
    [[nodiscard]] int n_layers() const noexcept { return layers_; }
    /// The checkpoint's shapes (n_layers there is the checkpoint's, not n_layers()).
    [[nodiscard]] const config& model_config() const noexcept { return model_->cfg; }
    /// Shared weights.
    [[nodiscard]] const std::shared_ptr<const checkpoint>& model() const noexcept { return model_; }
    /// The checkpoint name, with the early-exit depth when not all layers are used.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// Tokens whose keys/values are cached (positions 0 .. size-1).
    [[nodiscard]] std::span<const std::int32_t> cached_tokens() const noexcept { return cached_; }
    /// Forgets the cache (the next call recomputes from position 0). Its memory is kept.
    void clear_cache() noexcept { cached_.clear(); }
    /// Positions the cache has room for now (it grows on demand up to max_context()).
    [[nodiscard]] std::ptrdiff_t cache_capacity() const noexcept { return capacity_; }
    /// Bytes this instance holds for positions: the KV cache of its layers, the RoPE tables and
    /// the attention scratch, all sized by cache_capacity() (weights and the per-call
    /// activations, a few columns of the model's widths, excluded).
    [[nodiscard]] std::uint64_t cache_bytes() const noexcept {
        return sizeof(float) * (std::uint64_t(key_cache_.capacity()) + value_cache_.capacity() +
                                rope_cos_.capacity() + rope_sin_.capacity() + att_.capacity()) +
               sizeof(std::int32_t) * std::uint64_t(cached_.capacity());
    }
    /// Makes room in the cache for `positions` positions now, so that calls whose context plus
    /// draft holds at most that many tokens never allocate for the cache. Never shrinks it.
    /// \throws std::length_error positions > max_context(); std::bad_alloc (cache unchanged).
    void reserve(std::ptrdiff_t positions) {
        if (positions > max_context())
            throw std::length_error("llama2::transformer '" + name_ + "'::reserve: " + std::to_string(positions) +
                                    " positions exceed the model's seq_len of " + std::to_string(max_context()) +
                                    " tokens");
        if (positions > capacity_) grow_cache(positions, std::ptrdiff_t(cached_.size()), positions);
    }
    /// Positions run through the layers since construction (cache reuse makes this smaller
    /// than the sum of the context lengths).
    [[nodiscard]] std::uint64_t positions_computed() const noexcept { return positions_computed_; }
    /// Forward passes (calls of next_logits / score) since construction.
    [[nodiscard]] std::uint64_t forward_passes() const noexcept { return passes_; }

    /// Bytes of weights one forward pass of up to detail::max_columns positions reads: every
    /// layer matrix and the classifier once, plus one embedding row and the norm gains per
    /// position (counted for one position). The memory-bandwidth floor of a decoding step.
    [[nodiscard]] std::uint64_t streamed_weight_bytes() const noexcept {
        const config& c = model_->cfg;
        const std::uint64_t D = std::uint64_t(c.dim), H = std::uint64_t(c.hidden_dim), KV = std::uint64_t(c.kv_dim()),
                            V = std::uint64_t(c.vocab_size);
        const std::uint64_t per_layer = 2 * D * D + 2 * KV * D + 3 * H * D + 2 * D;
        return sizeof(float) * (std::uint64_t(layers_) * per_layer + V * D + 2 * D);
    }

    /// Logits of the token that follows `context` (the whole sequence so far, BOS first).
    /// Reuses the cached positions shared with `context` (the longest common prefix), drops the
    /// rest of the cache, and runs only the new positions. Afterwards the cache holds `context`.
    /// \throws std::invalid_argument empty context; std::out_of_range token outside the vocabulary;
    ///         std::length_error context longer than max_context(); std::bad_alloc when the cache
    ///         or the activations cannot grow to the context. In every case the cache is unchanged
    ///         (strong guarantee).
    [[nodiscard]] Eigen::VectorXf next_logits(std::span<const std::int32_t> context) {
        check("next_logits", context, {});
        Eigen::VectorXf out(vocab_size());
        forward(context, {}, 1, out.data());
        return out;
    }

    /// The batched verification pass: a vocab_size() x (draft.size() + 1) matrix whose column j
    /// holds the logits of the token following context + draft[0..j). One forward over the
    /// un-cached suffix of context plus the draft, streaming each weight matrix once per group
    /// of up to 9 positions. Afterwards the cache holds context + draft; a later call with a
    /// shorter or different sequence rolls it back.
    /// \throws as next_logits, with the limit applying to context.size() + draft.size().
    [[nodiscard]] Eigen::MatrixXf score(std::span<const std::int32_t> context, std::span<const std::int32_t> draft) {
        check("score", context, draft);
        Eigen::MatrixXf out(vocab_size(), std::ptrdiff_t(draft.size()) + 1);
        forward(context, draft, std::ptrdiff_t(draft.size()) + 1, out.data());
        return out;
    }

    /// score() writing into a caller's matrix: `out` is resized to vocab_size() x
    /// (draft.size() + 1) (no allocation when it already has that shape) and filled as score()
    /// would. Lets a decoding loop run without allocating per step (specdec's
    /// InPlaceBatchVerifier). \throws as score(); on a throw `out` is unchanged, and so is the
    /// cache (strong guarantee).
    void score_into(std::span<const std::int32_t> context, std::span<const std::int32_t> draft, Eigen::MatrixXf& out) {
        check("score_into", context, draft);
        const std::ptrdiff_t cols = std::ptrdiff_t(draft.size()) + 1;
        if (out.rows() == vocab_size() && out.cols() == cols) {
            // forward() writes the logits last, after everything that can throw.
            forward(context, draft, cols, out.data());
            return;
        }
        // Another shape: computed into a matrix of its own, which takes the place of `out` only
        // once complete.
        Eigen::MatrixXf fresh(vocab_size(), cols);
        forward(context, draft, cols, fresh.data());
        out.swap(fresh);
    }

    /// Scores a draft tree in one pass (specdec's TreeVerifier): `out` becomes vocab_size() x
    /// (nodes + 1); column 0 holds the logits after `context`, column i + 1 the logits after
    /// context + the path from the root to node i. Tree attention: node i sits at position
    /// context.size() - 1 + depth(i) (RoPE) in cache slot context.size() + i, and attends to the
    /// context and to its ancestors only, in the order a linear pass would, so its logits equal
    /// next_logits(context + path) bit for bit. One forward over the un-cached suffix of the
    /// context plus every node, streaming each weight matrix once per group of positions.
    /// Afterwards the cache holds `context`, and the nodes' keys and values wait beyond it: the
    /// next call whose context extends `context` along a path of the tree moves that path's rows
    /// into place (positions already right) instead of recomputing them, so the cache keeps the
    /// accepted path only.
    /// `Tree`: anything with `tokens`, `parents` (-1 for the root, otherwise an earlier node) and
    /// `depths` (specdec::draft_tree).
    /// \throws std::invalid_argument for an empty context or a malformed tree; otherwise as
    ///         score_into(), with the limit applying to context.size() + nodes (strong guarantee).
    template <class Tree>
    void score_tree(std::span<const std::int32_t> context, const Tree& tree, Eigen::MatrixXf& out) {
        const auto n = std::ptrdiff_t(tree.tokens.size());
        check("score_tree", context, std::span<const std::int32_t>(tree.tokens.data(), tree.tokens.size()));
        if (std::ptrdiff_t(tree.parents.size()) != n || std::ptrdiff_t(tree.depths.size()) != n)
            throw std::invalid_argument("llama2::transformer '" + name_ + "'::score_tree: " + std::to_string(n) +
                                        " tokens but " + std::to_string(tree.parents.size()) + " parents and " +
                                        std::to_string(tree.depths.size()) + " depths");
        for (std::ptrdiff_t i = 0; i < n; ++i) {
            const std::int32_t par = tree.parents[std::size_t(i)];
            const std::int32_t want = par < 0 ? 1 : tree.depths[std::size_t(par)] + 1;
            if (par < -1 || par >= i || tree.depths[std::size_t(i)] != want)
                throw std::invalid_argument("llama2::transformer '" + name_ + "'::score_tree: node " +
                                            std::to_string(i) + " has parent " + std::to_string(par) + " and depth " +
                                            std::to_string(tree.depths[std::size_t(i)]) +
                                            "; parents come first and depth is the parent's + 1");
        }
        settle_tree(context);
        const auto nc = std::ptrdiff_t(context.size());
        std::ptrdiff_t p = 0;
        const auto cached = std::ptrdiff_t(cached_.size());
        while (p < cached && p < nc && cached_[std::size_t(p)] == context[std::size_t(p)]) ++p;
        p = std::min(p, nc - 1);
        const std::ptrdiff_t T = nc - p + n, cols = n + 1;
        // Everything that can throw first (as forward()).
        tree_tokens_.reserve(std::size_t(n));
        tree_parents_.reserve(std::size_t(n));
        tree_slots_.reserve(std::size_t(nc + n));
        shape_activations(T);
        if (nc + n > capacity_)
            grow_cache(nc + n, p, std::max(nc + n, std::min<std::ptrdiff_t>(2 * capacity_, max_context())));
        Eigen::MatrixXf fresh;
        if (out.rows() != vocab_size() || out.cols() != cols) fresh.resize(vocab_size(), cols);
        float* dst = fresh.size() != 0 ? fresh.data() : out.data();
        cached_.resize(std::size_t(p));
        run_tree_positions(context, tree, p, dst);
        for (std::ptrdiff_t i = p; i < nc; ++i) cached_.push_back(context[std::size_t(i)]);
        tree_base_ = nc;
        tree_capacity_ = capacity_;
        tree_tokens_.assign(tree.tokens.begin(), tree.tokens.end());
        tree_parents_.assign(tree.parents.begin(), tree.parents.end());
        if (fresh.size() != 0) out.swap(fresh);
        ++passes_;
        positions_computed_ += std::uint64_t(T);
    }

private:
    void check(const char* fn, std::span<const std::int32_t> context, std::span<const std::int32_t> draft) const {
        if (context.empty())
            throw std::invalid_argument("llama2::transformer '" + name_ + "'::" + fn +
                                        ": empty context (it must start with BOS = 1)");
        const std::size_t total = context.size() + draft.size();
        if (total > std::size_t(max_context()))
            throw std::length_error("llama2::transformer '" + name_ + "'::" + fn + ": context of " +
                                    std::to_string(context.size()) + " tokens" +
                                    (draft.empty() ? std::string() : " + draft of " + std::to_string(draft.size())) +
                                    " exceeds the model's seq_len of " + std::to_string(max_context()) + " tokens");
        auto check_tokens = [&](std::span<const std::int32_t> s, const char* what) {
            for (std::size_t i = 0; i < s.size(); ++i)
                if (s[i] < 0 || s[i] >= vocab_size())
                    throw std::out_of_range("llama2::transformer '" + name_ + "'::" + fn + ": " + what + "[" +
                                            std::to_string(i) + "] = " + std::to_string(s[i]) +
                                            " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
        };
        check_tokens(context, "context");
        check_tokens(draft, "draft");
    }

    /// Runs the positions of context ++ draft not covered by the cache and writes the logits of
    /// the last n_out positions to out (column-major, vocab x n_out). Strong guarantee: everything
    /// that can throw (growing the cache, sizing the activations) happens before the cache
    /// changes, and `out` is written last.
    void forward(std::span<const std::int32_t> context, std::span<const std::int32_t> draft, std::ptrdiff_t n_out,
                 float* out) {
        settle_tree(context);  // a scored tree's accepted path joins the cache (see score_tree)
        const auto nc = std::ptrdiff_t(context.size());
        const std::ptrdiff_t n = nc + std::ptrdiff_t(draft.size());
        auto token = [&](std::ptrdiff_t i) { return i < nc ? context[std::size_t(i)] : draft[std::size_t(i - nc)]; };
        // Longest common prefix with the cache; the positions whose logits are requested
        // (nc-1 .. n-1) are always recomputed since logits are not cached.
        std::ptrdiff_t p = 0;
        const auto cached = std::ptrdiff_t(cached_.size());
        while (p < cached && p < n && cached_[std::size_t(p)] == token(p)) ++p;
        p = std::min(p, nc - 1);
        shape_activations(n - p);  // scratch, sized first: if the cache then cannot grow, nothing has changed
        if (n > capacity_) grow_cache(n, p, std::max(n, std::min<std::ptrdiff_t>(2 * capacity_, max_context())));
        cached_.resize(std::size_t(p));  // roll back: the keys/values beyond p are simply stale
        run_positions(token, p, n, n_out, out);
        for (std::ptrdiff_t i = p; i < n; ++i) cached_.push_back(token(i));
        ++passes_;
        positions_computed_ += std::uint64_t(n - p);
    }

    /// Reallocates the cache for `capacity` positions (need <= capacity <= max_context(); at
    /// least min_capacity when the model allows), keeping the keys and values of positions
    /// 0 .. keep-1. Everything is allocated before anything changes: on std::bad_alloc the
    /// cache is as it was. The RoPE entries of the new positions are computed here.
    void grow_cache(std::ptrdiff_t need, std::ptrdiff_t keep, std::ptrdiff_t capacity) {
        static constexpr std::ptrdiff_t min_capacity = 16;
        const config& c = model_->cfg;
        const std::ptrdiff_t C = std::min<std::ptrdiff_t>(std::max({need, capacity, min_capacity}), c.seq_len);
        const std::ptrdiff_t KV = c.kv_dim(), half = c.head_size() / 2, old = capacity_;
        tensor k(static_cast<std::size_t>(layers_ * C * KV)), v(k.size());
        std::vector<float> cs(static_cast<std::size_t>(C * half)), sn(cs.size()), att(static_cast<std::size_t>(C));
        std::vector<std::int32_t> tokens;
        tokens.reserve(std::size_t(C));
        tokens.assign(cached_.begin(), cached_.end());
        // Each layer's rows 0 .. keep-1 move to the new stride C * KV (position-major per layer).
        for (std::ptrdiff_t l = 0; l < layers_; ++l) {
            std::copy_n(key_cache_.data() + l * old * KV, keep * KV, k.data() + l * C * KV);
            std::copy_n(value_cache_.data() + l * old * KV, keep * KV, v.data() + l * C * KV);
        }
        // RoPE in double precision: angle(pos, i) = pos * 10000^(-2i / head_size).
        std::copy(rope_cos_.begin(), rope_cos_.end(), cs.begin());
        std::copy(rope_sin_.begin(), rope_sin_.end(), sn.begin());
        for (std::ptrdiff_t pos = old; pos < C; ++pos)
            for (std::ptrdiff_t i = 0; i < half; ++i) {
                const double angle = double(pos) * std::pow(10000.0, -2.0 * double(i) / double(c.head_size()));
                cs[std::size_t(pos * half + i)] = float(std::cos(angle));
                sn[std::size_t(pos * half + i)] = float(std::sin(angle));
            }
        key_cache_.swap(k);
        value_cache_.swap(v);
        rope_cos_.swap(cs);
        rope_sin_.swap(sn);
        att_.swap(att);
        cached_.swap(tokens);
        capacity_ = C;
    }

    /// Sizes the activations for T positions (each unchanged if that throws).
    void shape_activations(std::ptrdiff_t T) {
        const config& c = model_->cfg;
        detail::reshape(x_, c.dim, T);
        detail::reshape(xb_, c.dim, T);
        detail::reshape(q_, c.dim, T);
        detail::reshape(y_, c.dim, T);
        detail::reshape(h1_, c.hidden_dim, T);
        detail::reshape(h3_, c.hidden_dim, T);
    }

    /// Runs positions p .. n-1 (activations sized by shape_activations(n - p)); cannot throw.
    template <class Token>
    void run_positions(const Token& token, std::ptrdiff_t p, std::ptrdiff_t n, std::ptrdiff_t n_out, float* out) {
        const config& c = model_->cfg;
        const weights& w = model_->w;
        const std::ptrdiff_t D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), hs = c.head_size(), S = capacity_,
                             V = c.vocab_size, T = n - p, group = c.n_heads / c.n_kv_heads, half = hs / 2;
        for (std::ptrdiff_t t = 0; t < T; ++t)
            std::copy_n(w.token_embedding.data() + std::ptrdiff_t(token(p + t)) * D, D, x_.col(t).data());

        const float sqrt_hs = std::sqrt(float(hs));  // run.c: score /= sqrtf(head_size)
        for (std::ptrdiff_t l = 0; l < layers_; ++l) {
            float* kc = key_cache_.data() + l * S * KV;  // [capacity, kv_dim]: position-major
            float* vc = value_cache_.data() + l * S * KV;
            for (std::ptrdiff_t t = 0; t < T; ++t)
                detail::rmsnorm(xb_.col(t).data(), x_.col(t).data(), w.rms_att.data() + l * D, D);
            // q, and k, v straight into the cache rows p .. n-1 (a kv_dim x T column-major block).
            detail::matmul(w.wq.data() + l * D * D, D, D, xb_.data(), D, T, q_.data(), D);
            detail::matmul(w.wk.data() + l * KV * D, KV, D, xb_.data(), D, T, kc + p * KV, KV);
            detail::matmul(w.wv.data() + l * KV * D, KV, D, xb_.data(), D, T, vc + p * KV, KV);
            // RoPE (run.c): rotate pairs (i, i+1) of q (all heads) and k (kv heads).
            for (std::ptrdiff_t t = 0; t < T; ++t) {
                const float* cs = rope_cos_.data() + (p + t) * half;
                const float* sn = rope_sin_.data() + (p + t) * half;
                auto rotate = [&](float* v, std::ptrdiff_t len) {
                    for (std::ptrdiff_t i = 0; i < len; i += 2) {
                        const std::ptrdiff_t f = (i % hs) / 2;
                        const float v0 = v[i], v1 = v[i + 1];
                        v[i] = v0 * cs[f] - v1 * sn[f];
                        v[i + 1] = v0 * sn[f] + v1 * cs[f];
                    }
                };
                rotate(q_.col(t).data(), D);
                rotate(kc + (p + t) * KV, KV);
            }
            // Causal attention; xb receives the concatenated head outputs.
            for (std::ptrdiff_t t = 0; t < T; ++t) {
                const std::ptrdiff_t pos = p + t;
                for (std::ptrdiff_t h = 0; h < c.n_heads; ++h) {
                    const float* qh = q_.col(t).data() + h * hs;
                    const std::ptrdiff_t off = (h / group) * hs;
                    float* att = att_.data();
                    float mx = -std::numeric_limits<float>::infinity();
                    for (std::ptrdiff_t s = 0; s <= pos; ++s) {
                        att[s] = detail::dot(qh, kc + s * KV + off, hs) / sqrt_hs;
                        mx = std::max(mx, att[s]);
                    }
                    float sum = 0.0f;
                    for (std::ptrdiff_t s = 0; s <= pos; ++s) {
                        att[s] = std::exp(att[s] - mx);
                        sum += att[s];
                    }
                    float* o = xb_.col(t).data() + h * hs;
                    std::fill_n(o, hs, 0.0f);
                    for (std::ptrdiff_t s = 0; s <= pos; ++s) detail::axpy(att[s] / sum, vc + s * KV + off, o, hs);
                }
            }
            detail::matmul(w.wo.data() + l * D * D, D, D, xb_.data(), D, T, y_.data(), D);
            x_ += y_;
            // SwiGLU feed-forward: x += w2 (silu(w1 xb) * w3 xb).
            for (std::ptrdiff_t t = 0; t < T; ++t)
                detail::rmsnorm(xb_.col(t).data(), x_.col(t).data(), w.rms_ffn.data() + l * D, D);
            detail::matmul(w.w1.data() + l * H * D, H, D, xb_.data(), D, T, h1_.data(), H);
            detail::matmul(w.w3.data() + l * H * D, H, D, xb_.data(), D, T, h3_.data(), H);
            float* a = h1_.data();
            const float* b = h3_.data();
            for (std::ptrdiff_t i = 0; i < H * T; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
            detail::matmul(w.w2.data() + l * D * H, D, H, h1_.data(), H, T, y_.data(), D);
            x_ += y_;
        }
        // Final norm and classifier, only for the positions whose logits are requested.
        for (std::ptrdiff_t j = 0; j < n_out; ++j)
            detail::rmsnorm(xb_.col(j).data(), x_.col(T - n_out + j).data(), w.rms_final.data(), D);
        detail::matmul(w.classifier(), V, D, xb_.data(), D, n_out, out, V);
    }

    /// The child of node `parent` (−1: the root) of the last scored tree whose token is `token`;
    /// −1 when there is none.
    [[nodiscard]] std::ptrdiff_t tree_child(std::int32_t parent, std::int32_t token) const noexcept {
        for (std::size_t c = 0; c < tree_tokens_.size(); ++c)
            if (tree_parents_[c] == parent && tree_tokens_[c] == token) return std::ptrdiff_t(c);
        return -1;
    }

    /// Copies the keys and values of cache slot `from` to slot `to`, in every layer.
    void move_cache_row(std::ptrdiff_t from, std::ptrdiff_t to) noexcept {
        if (from == to) return;
        const std::ptrdiff_t KV = model_->cfg.kv_dim(), S = capacity_;
        for (std::ptrdiff_t l = 0; l < layers_; ++l) {
            std::copy_n(key_cache_.data() + (l * S + from) * KV, KV, key_cache_.data() + (l * S + to) * KV);
            std::copy_n(value_cache_.data() + (l * S + from) * KV, KV, value_cache_.data() + (l * S + to) * KV);
        }
    }

    /// After score_tree: when `context` extends the scored context along a path of the tree,
    /// moves that path's keys and values from the nodes' slots to the positions that follow the
    /// context (their RoPE positions already are those) and appends its tokens to the cache;
    /// forgets the tree in any case. Rows move to lower slots in increasing order, and a path's
    /// node indices increase with depth, so no row is overwritten before it is read.
    void settle_tree(std::span<const std::int32_t> context) {
        if (tree_base_ < 0) return;
        const std::ptrdiff_t base = tree_base_;
        tree_base_ = -1;
        if (std::ptrdiff_t(cached_.size()) != base || capacity_ != tree_capacity_) return;
        const auto nc = std::ptrdiff_t(context.size());
        if (nc <= base || !std::equal(cached_.begin(), cached_.end(), context.begin())) return;
        std::int32_t parent = -1;
        for (std::ptrdiff_t k = base; k < nc; ++k) {
            const std::ptrdiff_t child = tree_child(parent, context[std::size_t(k)]);
            if (child < 0) break;
            move_cache_row(base + child, k);
            cached_.push_back(context[std::size_t(k)]);
            parent = std::int32_t(child);
        }
    }

    /// run_positions for score_tree: positions p .. nc-1 of the context, then the tree's nodes
    /// (slot nc + i, RoPE position nc - 1 + depth(i), attending to the context and its
    /// ancestors). Writes the logits of position nc - 1 and of every node to out. Cannot throw.
    template <class Tree>
    void run_tree_positions(std::span<const std::int32_t> context, const Tree& tree, std::ptrdiff_t p, float* out) {
        const config& c = model_->cfg;
        const weights& w = model_->w;
        const auto nc = std::ptrdiff_t(context.size()), n = std::ptrdiff_t(tree.tokens.size());
        const std::ptrdiff_t D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), hs = c.head_size(), S = capacity_,
                             V = c.vocab_size, T = nc - p + n, group = c.n_heads / c.n_kv_heads, half = hs / 2,
                             n_out = n + 1;
        auto token = [&](std::ptrdiff_t t) {
            return p + t < nc ? context[std::size_t(p + t)] : tree.tokens[std::size_t(p + t - nc)];
        };
        auto rope_position = [&](std::ptrdiff_t t) {
            return p + t < nc ? p + t : nc - 1 + std::ptrdiff_t(tree.depths[std::size_t(p + t - nc)]);
        };
        for (std::ptrdiff_t t = 0; t < T; ++t)
            std::copy_n(w.token_embedding.data() + std::ptrdiff_t(token(t)) * D, D, x_.col(t).data());

        const float sqrt_hs = std::sqrt(float(hs));
        for (std::ptrdiff_t l = 0; l < layers_; ++l) {
            float* kc = key_cache_.data() + l * S * KV;
            float* vc = value_cache_.data() + l * S * KV;
            for (std::ptrdiff_t t = 0; t < T; ++t)
                detail::rmsnorm(xb_.col(t).data(), x_.col(t).data(), w.rms_att.data() + l * D, D);
            detail::matmul(w.wq.data() + l * D * D, D, D, xb_.data(), D, T, q_.data(), D);
            detail::matmul(w.wk.data() + l * KV * D, KV, D, xb_.data(), D, T, kc + p * KV, KV);
            detail::matmul(w.wv.data() + l * KV * D, KV, D, xb_.data(), D, T, vc + p * KV, KV);
            for (std::ptrdiff_t t = 0; t < T; ++t) {
                const float* cs = rope_cos_.data() + rope_position(t) * half;
                const float* sn = rope_sin_.data() + rope_position(t) * half;
                auto rotate = [&](float* v, std::ptrdiff_t len) {
                    for (std::ptrdiff_t i = 0; i < len; i += 2) {
                        const std::ptrdiff_t f = (i % hs) / 2;
                        const float v0 = v[i], v1 = v[i + 1];
                        v[i] = v0 * cs[f] - v1 * sn[f];
                        v[i + 1] = v0 * sn[f] + v1 * cs[f];
                    }
                };
                rotate(q_.col(t).data(), D);
                rotate(kc + (p + t) * KV, KV);
            }
            for (std::ptrdiff_t t = 0; t < T; ++t) {
                // The slots this position attends to, in the order of a linear pass: the context
                // up to itself; for a node, the whole context, then its ancestors, then itself.
                tree_slots_.clear();
                const std::ptrdiff_t slot = p + t;
                if (slot < nc) {
                    for (std::ptrdiff_t s = 0; s <= slot; ++s) tree_slots_.push_back(s);
                } else {
                    for (std::ptrdiff_t s = 0; s < nc; ++s) tree_slots_.push_back(s);
                    const std::size_t mark = tree_slots_.size();
                    for (std::ptrdiff_t v = slot - nc; v >= 0; v = tree.parents[std::size_t(v)]) tree_slots_.push_back(nc + v);
                    std::reverse(tree_slots_.begin() + std::ptrdiff_t(mark), tree_slots_.end());
                }
                const auto m = std::ptrdiff_t(tree_slots_.size());
                for (std::ptrdiff_t h = 0; h < c.n_heads; ++h) {
                    const float* qh = q_.col(t).data() + h * hs;
                    const std::ptrdiff_t off = (h / group) * hs;
                    float* att = att_.data();
                    float mx = -std::numeric_limits<float>::infinity();
                    for (std::ptrdiff_t j = 0; j < m; ++j) {
                        att[j] = detail::dot(qh, kc + tree_slots_[std::size_t(j)] * KV + off, hs) / sqrt_hs;
                        mx = std::max(mx, att[j]);
                    }
                    float sum = 0.0f;
                    for (std::ptrdiff_t j = 0; j < m; ++j) {
                        att[j] = std::exp(att[j] - mx);
                        sum += att[j];
                    }
                    float* o = xb_.col(t).data() + h * hs;
                    std::fill_n(o, hs, 0.0f);
                    for (std::ptrdiff_t j = 0; j < m; ++j)
                        detail::axpy(att[j] / sum, vc + tree_slots_[std::size_t(j)] * KV + off, o, hs);
                }
            }
            detail::matmul(w.wo.data() + l * D * D, D, D, xb_.data(), D, T, y_.data(), D);
            x_ += y_;
            for (std::ptrdiff_t t = 0; t < T; ++t)
                detail::rmsnorm(xb_.col(t).data(), x_.col(t).data(), w.rms_ffn.data() + l * D, D);
            detail::matmul(w.w1.data() + l * H * D, H, D, xb_.data(), D, T, h1_.data(), H);
            detail::matmul(w.w3.data() + l * H * D, H, D, xb_.data(), D, T, h3_.data(), H);
            float* a = h1_.data();
            const float* b = h3_.data();
            for (std::ptrdiff_t i = 0; i < H * T; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
            detail::matmul(w.w2.data() + l * D * H, D, H, h1_.data(), H, T, y_.data(), D);
            x_ += y_;
        }
        for (std::ptrdiff_t j = 0; j < n_out; ++j)
            detail::rmsnorm(xb_.col(j).data(), x_.col(T - n_out + j).data(), w.rms_final.data(), D);
        detail::matmul(w.classifier(), V, D, xb_.data(), D, n_out, out, V);
    }

    std::shared_ptr<const checkpoint> model_;
    int layers_ = 0;
    std::string name_;
    std::ptrdiff_t capacity_ = 0;             // positions the cache, RoPE tables and att_ hold
    std::vector<float> rope_cos_, rope_sin_;  // [capacity, head_size / 2]
    tensor key_cache_, value_cache_;  // [layers, capacity, kv_dim], 64-byte aligned
    std::vector<std::int32_t> cached_;  // tokens at cached positions
    std::vector<float> att_;            // attention scores of one head [capacity]
    Eigen::MatrixXf x_, xb_, q_, y_, h1_, h3_;  // activations, one column per position
    std::uint64_t positions_computed_ = 0, passes_ = 0;
    // score_tree: the scored context's length (-1: no tree waiting), the capacity then, the
    // tree's tokens and parents, and the slots one position attends to.
    std::ptrdiff_t tree_base_ = -1, tree_capacity_ = 0;
    std::vector<std::int32_t> tree_tokens_, tree_parents_;
    std::vector<std::ptrdiff_t> tree_slots_;
};

}  // namespace llama2
