#pragma once
/// \file
/// Reading and writing llama2.c checkpoints ("version 0", the legacy fp32 export).
///
/// Example code: copy it into your project. It depends only on the C++20 standard library.
///
/// File layout, as written by llama2.c's export.py (legacy_export) and read by run.c:
///
///     int32 header[7] = { dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len }
///     float32 token_embedding [vocab, dim]
///     float32 rms_att         [layers, dim]
///     float32 wq              [layers, dim, dim]
///     float32 wk              [layers, kv_dim, dim]
///     float32 wv              [layers, kv_dim, dim]
///     float32 wo              [layers, dim, dim]
///     float32 rms_ffn         [layers, dim]
///     float32 w1              [layers, hidden, dim]
///     float32 w2              [layers, dim, hidden]
///     float32 w3              [layers, hidden, dim]
///     float32 rms_final       [dim]
///     float32 freq_cis_real   [seq_len, head_size / 2]   (legacy RoPE table, ignored on load)
///     float32 freq_cis_imag   [seq_len, head_size / 2]   (legacy RoPE table, ignored on load)
///     float32 wcls            [vocab, dim]               (only when header vocab_size < 0)
///
/// with kv_dim = dim * n_kv_heads / n_heads and head_size = dim / n_heads. A negative
/// vocab_size in the header means "the classifier is stored separately" (run.c:
/// `shared_weights = vocab_size > 0`). Matrices are PyTorch Linear weights: row-major
/// [out_features, in_features]. All values are little-endian.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>  // madvise(MADV_HUGEPAGE) for large tensors
#endif

namespace llama2 {

static_assert(std::endian::native == std::endian::little,
              "llama2 checkpoints are little-endian; this example code reads them directly");

/// Minimal allocator returning 64-byte aligned storage (one cache line, one AVX-512 packet),
/// so that the SIMD kernels of transformer.hpp load whole, aligned packets from the weights.
/// On Linux, blocks of 4 MiB or more are 2 MiB aligned and marked MADV_HUGEPAGE: streaming
/// hundreds of MB of weights per token then walks far fewer pages (about 5% faster decoding
/// steps where transparent huge pages are set to "madvise").
template <class T, std::size_t Align = 64>
struct aligned_allocator {
    using value_type = T;
    template <class U>
    struct rebind {
        using other = aligned_allocator<U, Align>;
    };
    aligned_allocator() noexcept = default;
    template <class U>
    aligned_allocator(const aligned_allocator<U, Align>&) noexcept {}

    [[nodiscard]] T* allocate(std::size_t n) {
        const std::size_t bytes = n * sizeof(T);
        if (is_huge(bytes)) {
            void* p = ::operator new(round_up(bytes), std::align_val_t(huge_page));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
            (void)::madvise(p, round_up(bytes), MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
            return static_cast<T*>(p);
        }
        return static_cast<T*>(::operator new(bytes, std::align_val_t(Align)));
    }
    void deallocate(T* p, std::size_t n) noexcept {
        ::operator delete(p, std::align_val_t(is_huge(n * sizeof(T)) ? huge_page : Align));
    }
    template <class U>
    bool operator==(const aligned_allocator<U, Align>&) const noexcept {
        return true;
    }

private:
    static constexpr std::size_t huge_page = std::size_t{2} << 20;
    static constexpr bool is_huge(std::size_t bytes) noexcept {
#if defined(__linux__)
        return bytes >= 2 * huge_page;
#else
        (void)bytes;
        return false;
#endif
    }
    static constexpr std::size_t round_up(std::size_t bytes) noexcept {
        return (bytes + huge_page - 1) / huge_page * huge_page;
    }
};

/// One weight tensor, flattened row-major, 64-byte aligned.
using tensor = std::vector<float, aligned_allocator<float>>;

/// Hyper-parameters of a llama2.c model (the 7-int32 header, plus whether the classifier
/// is shared with the token embedding).
struct config {
    std::int32_t dim = 0;         ///< model (residual stream) width
    std::int32_t hidden_dim = 0;  ///< SwiGLU inner width
    std::int32_t n_layers = 0;    ///< transformer blocks
    std::int32_t n_heads = 0;     ///< query heads
    std::int32_t n_kv_heads = 0;  ///< key/value heads (grouped-query attention when < n_heads)
    std::int32_t vocab_size = 0;  ///< always positive here; the sign of the file header is `shared_classifier`
    std::int32_t seq_len = 0;     ///< maximum number of positions (the model's hard context limit)
    bool shared_classifier = true;  ///< classifier == token embedding (header vocab_size > 0)

    /// Width of one attention head.
    [[nodiscard]] std::int32_t head_size() const noexcept { return n_heads > 0 ? dim / n_heads : 0; }
    /// Width of the key/value projections: dim * n_kv_heads / n_heads.
    [[nodiscard]] std::int32_t kv_dim() const noexcept { return n_heads > 0 ? dim / n_heads * n_kv_heads : 0; }

    /// Largest number of floats one tensor may hold, including the KV cache of a transformer
    /// at seq_len positions: 2^40 (4 TiB), far beyond any machine's memory, so that a header
    /// that no machine could hold is rejected before anything is allocated, and so that every
    /// size computed from a valid config fits in 64 bits with room to spare.
    static constexpr std::uint64_t max_tensor_floats = std::uint64_t{1} << 40;

    /// Throws std::invalid_argument (message prefixed by `what`, naming the field) unless the
    /// shapes are usable: all positive, n_heads divides dim, n_kv_heads divides n_heads,
    /// head_size is even (RoPE rotates pairs), and no tensor, nor the KV cache of all layers at
    /// seq_len positions, holds more than max_tensor_floats elements ("implausibly large").
    void validate(std::string_view what) const {
        auto fail = [&](const std::string& problem) {
            throw std::invalid_argument(std::string(what) + ": invalid llama2 config (" + describe() + "): " + problem);
        };
        const std::pair<const char*, std::int32_t> fields[] = {
            {"dim", dim},         {"hidden_dim", hidden_dim}, {"n_layers", n_layers}, {"n_heads", n_heads},
            {"n_kv_heads", n_kv_heads}, {"vocab_size", vocab_size}, {"seq_len", seq_len}};
        for (const auto& [field, value] : fields)
            if (value <= 0) fail(std::string(field) + " = " + std::to_string(value) + ": every dimension must be positive");
        if (dim % n_heads != 0) fail("dim is not a multiple of n_heads");
        if (n_kv_heads > n_heads || n_heads % n_kv_heads != 0) fail("n_kv_heads must divide n_heads");
        if (head_size() % 2 != 0) fail("head_size = dim / n_heads must be even (RoPE rotates pairs)");
        // Every factor is positive and below 2^31, so a product of two cannot overflow 64 bits;
        // the third factor is checked by division.
        auto check = [&](const char* name, const char* fields_named, std::uint64_t a, std::uint64_t b,
                         std::uint64_t c) {
            if (a * b > max_tensor_floats || c > max_tensor_floats / (a * b))
                fail(std::string(name) + " [" + fields_named + "] would hold more than 2^40 floats: "
                     "tensors are implausibly large");
        };
        const auto L = std::uint64_t(n_layers), D = std::uint64_t(dim), H = std::uint64_t(hidden_dim),
                   KV = std::uint64_t(kv_dim()), V = std::uint64_t(vocab_size), S = std::uint64_t(seq_len);
        check("token_embedding", "vocab_size, dim", V, D, 1);
        check("wq", "n_layers, dim, dim", L, D, D);
        check("w1", "n_layers, hidden_dim, dim", L, H, D);
        check("the RoPE tables", "seq_len, head_size", S, std::uint64_t(head_size()), 1);
        check("the KV cache at seq_len positions", "n_layers, seq_len, kv_dim", L, S, KV);
    }

    /// "dim=64 hidden_dim=172 n_layers=5 n_heads=8 n_kv_heads=4 vocab_size=512 seq_len=512 shared_classifier=1"
    [[nodiscard]] std::string describe() const {
        return "dim=" + std::to_string(dim) + " hidden_dim=" + std::to_string(hidden_dim) +
               " n_layers=" + std::to_string(n_layers) + " n_heads=" + std::to_string(n_heads) +
               " n_kv_heads=" + std::to_string(n_kv_heads) + " vocab_size=" + std::to_string(vocab_size) +
               " seq_len=" + std::to_string(seq_len) + " shared_classifier=" + (shared_classifier ? "1" : "0");
    }

    friend bool operator==(const config&, const config&) = default;
};

/// All weights of a model, each tensor flattened row-major in file order (see the file comment).
struct weights {
    tensor token_embedding;  ///< [vocab, dim]
    tensor rms_att;          ///< [layers, dim]
    tensor wq;               ///< [layers, dim, dim]
    tensor wk;               ///< [layers, kv_dim, dim]
    tensor wv;               ///< [layers, kv_dim, dim]
    tensor wo;               ///< [layers, dim, dim]
    tensor rms_ffn;          ///< [layers, dim]
    tensor w1;               ///< [layers, hidden, dim]
    tensor w2;               ///< [layers, dim, hidden]
    tensor w3;               ///< [layers, hidden, dim]
    tensor rms_final;        ///< [dim]
    tensor wcls;             ///< [vocab, dim]; empty when the classifier is shared

    /// The classifier matrix [vocab, dim]: `wcls`, or the token embedding when shared.
    [[nodiscard]] const float* classifier() const noexcept {
        return wcls.empty() ? token_embedding.data() : wcls.data();
    }
};

/// A loaded model: its name (for messages), its shapes and its weights.
struct checkpoint {
    std::string name;  ///< file name (or any label), used in error messages
    config cfg;
    weights w;
};

namespace detail {

/// Calls f(tensor, element_count) for every stored tensor of `w`, in file order, skipping
/// the legacy RoPE tables (the caller handles them between rms_final and wcls).
/// `W` is `weights` or `const weights`.
template <class W, class F>
void for_each_tensor(const config& c, W& w, F&& f, bool include_classifier) {
    // (Sizes are products of header fields bounded by config::validate's 2^40 floats: they need
    // a 64-bit size_t.)
    static_assert(sizeof(std::size_t) >= 8, "llama2 checkpoints need a 64-bit size_t");
    const auto L = std::size_t(c.n_layers), D = std::size_t(c.dim), H = std::size_t(c.hidden_dim),
               KV = std::size_t(c.kv_dim()), V = std::size_t(c.vocab_size);
    f(w.token_embedding, V * D);
    f(w.rms_att, L * D);
    f(w.wq, L * D * D);
    f(w.wk, L * KV * D);
    f(w.wv, L * KV * D);
    f(w.wo, L * D * D);
    f(w.rms_ffn, L * D);
    f(w.w1, L * H * D);
    f(w.w2, L * D * H);
    f(w.w3, L * H * D);
    f(w.rms_final, D);
    if (include_classifier) f(w.wcls, V * D);
}

/// The tensors' names, in the order for_each_tensor visits them (the file's order).
inline constexpr const char* tensor_names[] = {"token_embedding", "rms_att", "wq", "wk", "wv", "wo",
                                               "rms_ffn", "w1", "w2", "w3", "rms_final", "wcls"};

/// Number of floats in one legacy RoPE table: seq_len * head_size / 2.
inline std::uint64_t rope_table_floats(const config& c) {
    return std::uint64_t(c.seq_len) * std::uint64_t(c.head_size()) / 2;
}

}  // namespace detail

/// Exact size in bytes of a version-0 checkpoint file with config `c` (c must be valid).
[[nodiscard]] inline std::uint64_t checkpoint_file_size(const config& c) {
    std::uint64_t floats = 0;
    weights none;
    detail::for_each_tensor(c, none, [&](auto&, std::size_t n) { floats += n; }, !c.shared_classifier);
    floats += 2 * detail::rope_table_floats(c);
    return 7 * sizeof(std::int32_t) + floats * sizeof(float);
}

/// Number of parameters (the RoPE tables excluded; a shared classifier counted once).
[[nodiscard]] inline std::uint64_t parameter_count(const config& c) {
    return (checkpoint_file_size(c) - 7 * sizeof(std::int32_t)) / sizeof(float) - 2 * detail::rope_table_floats(c);
}

/// Reads a llama2.c version-0 checkpoint.
///
/// The file is untrusted: the header is validated (config::validate, with overflow-safe size
/// arithmetic) and the file's size compared with the size the header implies before any tensor
/// is allocated, so the weights never take more memory than the file's own bytes.
///
/// \throws std::runtime_error     the file cannot be opened or read
/// \throws std::invalid_argument  the header is invalid (a field that is not positive,
///                                inconsistent heads, shapes no machine could hold; the message
///                                names the field), the file size does not match the header
///                                (truncated file, trailing data, other format version), or a
///                                weight is NaN or infinite (the message names the tensor and
///                                the element)
/// \throws std::bad_alloc         only when memory for the weights the file holds runs out
/// Every message names the file.
[[nodiscard]] inline checkpoint read_checkpoint(const std::filesystem::path& path) {
    const std::string file = "llama2 checkpoint '" + path.string() + "'";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(file + ": cannot open file");
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) throw std::runtime_error(file + ": cannot determine file size: " + ec.message());
    if (size < 7 * sizeof(std::int32_t))
        throw std::invalid_argument(file + ": file has " + std::to_string(size) +
                                    " bytes, too small for the 28-byte header");
    std::int32_t h[7];
    if (!in.read(reinterpret_cast<char*>(h), sizeof h)) throw std::runtime_error(file + ": cannot read header");

    checkpoint ck;
    ck.name = path.filename().string();
    config& c = ck.cfg;
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    if (h[5] == std::numeric_limits<std::int32_t>::min())  // (its negation overflows)
        throw std::invalid_argument(file + ": invalid llama2 header: vocab_size = " + std::to_string(h[5]) +
                                    " is out of range");
    c.shared_classifier = h[5] > 0;  // run.c: negative vocab_size => separate classifier
    c.vocab_size = h[5] < 0 ? -h[5] : h[5];
    c.seq_len = h[6];
    c.validate(file);
    const std::uint64_t expected = checkpoint_file_size(c);
    if (size != expected)
        throw std::invalid_argument(file + ": file has " + std::to_string(size) + " bytes but the header (" +
                                    c.describe() + ") implies " + std::to_string(expected) +
                                    " bytes for a llama2.c version-0 fp32 checkpoint" +
                                    (size < expected ? " (truncated?)" : " (trailing data or another format version?)"));

    // Each tensor in file order; a weight that is not a finite number (NaN, ±inf) is refused
    // here, naming the tensor and the element, rather than surfacing later as NaN logits.
    std::size_t index = 0;
    auto read_into = [&](tensor& v, std::size_t n) {
        v.resize(n);
        if (!in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(float))))
            throw std::runtime_error(file + ": read error in weight tensor " + detail::tensor_names[index]);
        for (std::size_t i = 0; i < n; ++i)
            if (!std::isfinite(v[i]))
                throw std::invalid_argument(file + ": weight tensor " + detail::tensor_names[index] + " element " +
                                            std::to_string(i) + " is " + (std::isnan(v[i]) ? "NaN" : "infinite") +
                                            "; weights must be finite numbers");
        ++index;
    };
    detail::for_each_tensor(c, ck.w, read_into, false);
    // Skip the two legacy RoPE tables; this code recomputes RoPE (see transformer.hpp).
    if (!in.seekg(std::streamoff(2 * detail::rope_table_floats(c) * sizeof(float)), std::ios::cur))
        throw std::runtime_error(file + ": read error past the RoPE tables");
    if (!c.shared_classifier) read_into(ck.w.wcls, std::size_t(c.vocab_size) * std::size_t(c.dim));
    return ck;
}

/// Throws std::invalid_argument unless every tensor of `w` has the size `c` requires
/// (`wcls` must be empty exactly when the classifier is shared).
inline void check_weights(const config& c, const weights& w, std::string_view what) {
    c.validate(what);
    auto check = [&](const tensor& v, std::size_t n) {
        if (v.size() != n)
            throw std::invalid_argument(std::string(what) + ": a weight tensor has " + std::to_string(v.size()) +
                                        " elements, the config (" + c.describe() + ") requires " + std::to_string(n));
    };
    detail::for_each_tensor(c, w, check, !c.shared_classifier);
    if (c.shared_classifier && !w.wcls.empty())
        throw std::invalid_argument(std::string(what) + ": wcls must be empty when the classifier is shared");
}

/// Writes a llama2.c version-0 checkpoint (readable by llama2.c's run.c and by read_checkpoint).
/// The legacy RoPE tables are filled as export.py does: cos / sin of pos * 10000^(-2i/head_size).
///
/// \throws std::invalid_argument  `w` does not match `c`
/// \throws std::runtime_error     the file cannot be written
inline void write_checkpoint(const std::filesystem::path& path, const config& c, const weights& w) {
    const std::string file = "llama2 checkpoint '" + path.string() + "'";
    check_weights(c, w, file);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(file + ": cannot open file for writing");
    const std::int32_t h[7] = {c.dim,        c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                               c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
    out.write(reinterpret_cast<const char*>(h), sizeof h);
    auto write = [&](const tensor& v, std::size_t) {
        out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    };
    detail::for_each_tensor(c, w, write, false);
    const std::size_t half = std::size_t(c.head_size()) / 2;
    tensor re(std::size_t(c.seq_len) * half), im(re.size());
    for (std::size_t p = 0; p < std::size_t(c.seq_len); ++p)
        for (std::size_t i = 0; i < half; ++i) {
            const double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / double(c.head_size()));
            re[p * half + i] = float(std::cos(angle));
            im[p * half + i] = float(std::sin(angle));
        }
    write(re, 0);
    write(im, 0);
    if (!c.shared_classifier) write(w.wcls, 0);
    out.flush();
    if (!out) throw std::runtime_error(file + ": write error");
}

/// Shapes of Karpathy's tinyllamas models for llama2.c (the shapes only; pair them with
/// random_weights for benchmarks): "stories260K" (dim 64, 5 layers, 8 heads, 4 kv heads, hidden
/// 172, vocab 512, seq_len 512), "stories15M" (dim 288, 6 layers, 6 heads, hidden 768, vocab
/// 32000, seq_len 256), "stories42M" (dim 512, 8 layers, 8 heads, hidden 1376, vocab 32000,
/// seq_len 1024), "stories110M" (dim 768, 12 layers, 12 heads, hidden 2048, vocab 32000,
/// seq_len 1024). All with a shared classifier. nullopt for an unknown name.
[[nodiscard]] inline std::optional<config> preset_config(std::string_view name) {
    auto make = [](std::int32_t dim, std::int32_t hidden, std::int32_t layers, std::int32_t heads,
                   std::int32_t kv_heads, std::int32_t vocab, std::int32_t seq_len) {
        config c;
        c.dim = dim;
        c.hidden_dim = hidden;
        c.n_layers = layers;
        c.n_heads = heads;
        c.n_kv_heads = kv_heads;
        c.vocab_size = vocab;
        c.seq_len = seq_len;
        c.shared_classifier = true;
        return c;
    };
    if (name == "stories260K") return make(64, 172, 5, 8, 4, 512, 512);
    if (name == "stories15M") return make(288, 768, 6, 6, 6, 32000, 256);
    if (name == "stories42M") return make(512, 1376, 8, 8, 8, 32000, 1024);
    if (name == "stories110M") return make(768, 2048, 12, 12, 12, 32000, 1024);
    return std::nullopt;
}

/// Random weights for config `c` (deterministic for a given seed): matrices uniform in
/// [-a, a] with a = sqrt(3 / fan_in) (unit-variance outputs for unit-variance inputs),
/// embeddings uniform in [-1, 1], RMSNorm gains 1. Meant for benchmarks and tests only.
[[nodiscard]] inline weights random_weights(const config& c, std::uint64_t seed) {
    c.validate("llama2::random_weights");
    std::uint64_t state = seed;
    auto next = [&state]() {  // splitmix64
        std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    auto fill = [&](tensor& v, std::size_t n, float a) {
        v.resize(n);
        for (float& x : v) x = a * (float(next() >> 40) * (2.0f / 16777216.0f) - 1.0f);
    };
    const auto L = std::size_t(c.n_layers), D = std::size_t(c.dim), H = std::size_t(c.hidden_dim),
               KV = std::size_t(c.kv_dim()), V = std::size_t(c.vocab_size);
    const float in_d = std::sqrt(3.0f / float(D)), in_h = std::sqrt(3.0f / float(H));
    weights w;
    fill(w.token_embedding, V * D, 1.0f);
    w.rms_att.assign(L * D, 1.0f);
    fill(w.wq, L * D * D, in_d);
    fill(w.wk, L * KV * D, in_d);
    fill(w.wv, L * KV * D, in_d);
    fill(w.wo, L * D * D, in_d);
    w.rms_ffn.assign(L * D, 1.0f);
    fill(w.w1, L * H * D, in_d);
    fill(w.w2, L * D * H, in_h);
    fill(w.w3, L * H * D, in_d);
    w.rms_final.assign(D, 1.0f);
    if (!c.shared_classifier) fill(w.wcls, V * D, in_d);
    return w;
}

}  // namespace llama2
