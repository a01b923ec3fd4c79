// The llama2 readers and engine on untrusted files: forged tokenizer.bin and checkpoint files,
// written by the tests themselves into a temporary folder, must be rejected with the
// documented exception types (std::invalid_argument naming the file and the field), or
// accepted at a memory cost bounded by the file's size and by the context actually used.
//
// Memory is measured with counting global allocation functions (so this file is a test
// executable of its own): the peak of live heap bytes while a reader or the engine runs. Eigen
// allocates its (small, per-call) activation matrices with malloc, which these do not see; the
// weights, KV cache, RoPE tables and every container do go through operator new.

// GCC sees malloc/free behind replaced new/delete and warns; that pairing is the point here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/catch.hpp"

#include "llama2/checkpoint.hpp"
#include "llama2/tokenizer.hpp"
#include "llama2/transformer.hpp"

// AddressSanitizer replaces the allocation functions itself; the memory bounds are then not
// checked (the tests say so), the error checks still are.
#if defined(__SANITIZE_ADDRESS__)
#define LLAMA2_FILES_COUNTED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LLAMA2_FILES_COUNTED 0
#endif
#endif
#ifndef LLAMA2_FILES_COUNTED
#define LLAMA2_FILES_COUNTED 1
#endif

namespace {
std::atomic<std::size_t> g_live{0}, g_peak{0};
}  // namespace

#if LLAMA2_FILES_COUNTED
namespace {
/// Each block carries its size and header length just before the pointer returned.
void* counted_new(std::size_t size, std::size_t align) {
    align = std::max(align, alignof(std::max_align_t));
    const std::size_t header = std::max<std::size_t>(align, 2 * sizeof(std::size_t));
    const std::size_t total = (size + header + align - 1) / align * align;
    if (total < size) throw std::bad_alloc();  // (wrapped)
    void* base = std::aligned_alloc(align, total);
    if (base == nullptr) throw std::bad_alloc();
    auto* p = static_cast<unsigned char*>(base) + header;
    std::size_t* meta = reinterpret_cast<std::size_t*>(p) - 2;
    meta[0] = header;
    meta[1] = size;
    const std::size_t live = g_live.fetch_add(size, std::memory_order_relaxed) + size;
    std::size_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return p;
}
void counted_delete(void* ptr) noexcept {
    if (ptr == nullptr) return;
    auto* p = static_cast<unsigned char*>(ptr);
    const std::size_t* meta = reinterpret_cast<const std::size_t*>(p) - 2;
    g_live.fetch_sub(meta[1], std::memory_order_relaxed);
    std::free(p - meta[0]);
}
}  // namespace

void* operator new(std::size_t size) { return counted_new(size, alignof(std::max_align_t)); }
void* operator new[](std::size_t size) { return counted_new(size, alignof(std::max_align_t)); }
void* operator new(std::size_t size, std::align_val_t a) { return counted_new(size, std::size_t(a)); }
void* operator new[](std::size_t size, std::align_val_t a) { return counted_new(size, std::size_t(a)); }
void operator delete(void* p) noexcept { counted_delete(p); }
void operator delete[](void* p) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_delete(p); }
#endif

namespace {

namespace fs = std::filesystem;
using specdec_test::contains;
using tokens = std::vector<std::int32_t>;

/// The largest number of heap bytes live at once, above those live at construction, while
/// the meter exists.
struct peak_meter {
    std::size_t base = g_live.load();
    peak_meter() { g_peak.store(base); }
    [[nodiscard]] std::size_t bytes() const { return g_peak.load() - base; }
};

/// True when the memory bounds can be checked; otherwise warns once per call site.
bool counting() {
    if (LLAMA2_FILES_COUNTED) return true;
    WARN("memory bounds not checked: allocation counting is not available under AddressSanitizer");
    return false;
}

/// A fresh folder under the system's temporary folder, removed with everything in it.
struct temp_dir {
    fs::path path;
    temp_dir() {
        std::random_device rd;
        path = fs::temp_directory_path() / ("llama2_files_test_" + std::to_string(rd()) + std::to_string(rd()));
        fs::create_directories(path);
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    [[nodiscard]] fs::path operator/(const std::string& name) const { return path / name; }
};

/// Bytes of a file being forged.
struct bytes {
    std::string data;
    bytes& i32(std::int32_t v) { return raw(&v, 4); }
    bytes& f32(float v) { return raw(&v, 4); }
    bytes& text(const std::string& s) { return raw(s.data(), s.size()); }
    bytes& zeros(std::size_t n) {
        data.append(n, '\0');
        return *this;
    }
    bytes& raw(const void* p, std::size_t n) {
        data.append(static_cast<const char*>(p), n);
        return *this;
    }
    void write(const fs::path& path) const {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(data.data(), std::streamsize(data.size()));
        REQUIRE(out.good());
    }
};

/// A valid tokenizer.bin of `n` >= 259 pieces: <unk>, <s>, </s>, the 256 byte pieces
/// "<0xNN>", then the decimal numbers 0, 1, ... as pieces.
bytes valid_tokenizer(int n) {
    bytes b;
    b.i32(16);
    auto piece = [&](const std::string& p, float score) { b.f32(score).i32(std::int32_t(p.size())).text(p); };
    piece("<unk>", 0.0f);
    piece("\n<s>\n", 0.0f);
    piece("\n</s>\n", 0.0f);
    const char* hex = "0123456789ABCDEF";
    for (int i = 0; i < 256; ++i) piece(std::string("<0x") + hex[i / 16] + hex[i % 16] + ">", 0.0f);
    for (int i = 259; i < n; ++i) piece(std::to_string(i - 259), -float(i));
    return b;
}

/// The header of a llama2.c checkpoint.
bytes header(std::int32_t dim, std::int32_t hidden, std::int32_t layers, std::int32_t heads, std::int32_t kv_heads,
             std::int32_t vocab, std::int32_t seq_len) {
    return bytes{}.i32(dim).i32(hidden).i32(layers).i32(heads).i32(kv_heads).i32(vocab).i32(seq_len);
}

/// The checkpoint of the first bullet of the hardening issue: 0.9 MB, dim 2, 8000 layers (a
/// KV cache of 128 KB per position), seq_len `seq_len`.
llama2::config deep_narrow_config(std::int32_t seq_len) {
    llama2::config c;
    c.dim = 2;
    c.hidden_dim = 1;
    c.n_layers = 8000;
    c.n_heads = 1;
    c.n_kv_heads = 1;
    c.vocab_size = 8;
    c.seq_len = seq_len;
    c.shared_classifier = true;
    return c;
}

/// A small model with every feature (grouped-query attention, separate classifier).
llama2::config small_config() {
    llama2::config c;
    c.dim = 24;
    c.hidden_dim = 40;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 50;
    c.seq_len = 200;
    c.shared_classifier = false;
    return c;
}

/// Loads `path` and scores the two-token context {BOS, 3}: the logits, with the engine's
/// cache bytes and capacity afterwards.
struct two_tokens {
    Eigen::MatrixXf logits;
    std::uint64_t cache_bytes = 0;
    std::ptrdiff_t capacity = 0;
};
two_tokens load_and_score_two(const fs::path& path) {
    llama2::transformer m{path};
    const tokens ctx{1, 3};
    two_tokens r;
    r.logits = m.score(std::span(ctx).first(1), std::span(ctx).subspan(1));
    r.cache_bytes = m.cache_bytes();
    r.capacity = m.cache_capacity();
    return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// tokenizer.bin
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2 files: a 12-byte tokenizer whose piece claims 2^31-1 bytes is rejected without allocating them",
          "[llama2][files][tokenizer]") {
    // max_token_length = 2^31 - 1, one piece (score 0) of length 2^31 - 1, and no bytes after:
    // the length is within max_token_length, so only the bytes left can refute it. Reading the
    // piece into a string of its claimed length first costs 2 GiB (or std::bad_alloc).
    temp_dir dir;
    const fs::path file = dir / "forged_tokenizer.bin";
    constexpr std::int32_t big = std::numeric_limits<std::int32_t>::max();
    bytes{}.i32(big).f32(0.0f).i32(big).write(file);
    REQUIRE(fs::file_size(file) == 12);
    const peak_meter meter;
    CHECK_THROWS_AS(llama2::tokenizer(file), std::invalid_argument);
    CHECK_THROWS_WITH(llama2::tokenizer(file), contains("forged_tokenizer.bin") &&
                                                   contains("truncated at byte 12 while reading the bytes of piece 0"));
    if (counting()) CHECK(meter.bytes() < 64 * 1024);
}

TEST_CASE("llama2 files: a tokenizer path that is a folder, or a file larger than any tokenizer, is refused before "
          "reading it",
          "[llama2][files][tokenizer]") {
    temp_dir dir;
    // A folder: its size may read as 2^63 - 1 through a stream (a length_error naming nothing).
    CHECK_THROWS_AS(llama2::tokenizer(dir.path), std::runtime_error);
    CHECK_THROWS_WITH(llama2::tokenizer(dir.path), contains("llama2 tokenizer") && contains("not a regular file"));
    CHECK_THROWS_WITH(llama2::tokenizer(dir / "missing.bin"), contains("missing.bin") && contains("no such file"));
    // A sparse file one byte over the limit (no disk space used): refused by its size, without
    // allocating for it.
    const fs::path huge = dir / "huge_tokenizer.bin";
    bytes{}.i32(16).write(huge);
    fs::resize_file(huge, llama2::tokenizer::max_file_bytes + 1);
    const peak_meter meter;
    CHECK_THROWS_AS(llama2::tokenizer(huge), std::invalid_argument);
    CHECK_THROWS_WITH(llama2::tokenizer(huge), contains("huge_tokenizer.bin") && contains("bytes; a tokenizer of at most"));
    if (counting()) CHECK(meter.bytes() < 64 * 1024);
}

TEST_CASE("llama2 files: a tokenizer takes at most a small multiple of its file's size", "[llama2][files][tokenizer]") {
    // 200,000 short pieces (8 bytes of score and length plus 1..6 bytes each): the file's
    // smallest bytes per piece, so per-piece overhead (a std::string and a hash node each
    // costs 10-15 times the bytes) shows most. Bound: 6 times the file.
    temp_dir dir;
    const fs::path file = dir / "many_pieces.bin";
    valid_tokenizer(200000).write(file);
    const std::size_t size = fs::file_size(file);
    const peak_meter meter;
    const llama2::tokenizer tok(file);
    const std::size_t peak = meter.bytes();
    REQUIRE(tok.vocab_size() == 200000);
    // It still works: lookups, merges and decoding.
    CHECK(tok.find("12345") == 259 + 12345);
    CHECK(tok.piece(259 + 777) == "777");
    CHECK(tok.find("<0x41>") == 3 + 0x41);
    CHECK_FALSE(tok.find("not a piece"));
    CHECK(tok.decode(1, 3 + 'A') == "A");
    CHECK_THROWS_AS(tok.piece(200000), std::out_of_range);
    if (counting()) {
        INFO("file " << size << " bytes, peak while reading " << peak << " bytes");
        CHECK(peak <= 6 * size);
    }
}

TEST_CASE("llama2 files: every truncation of a tokenizer.bin is an invalid_argument naming the file",
          "[llama2][files][tokenizer]") {
    // Each prefix of a valid 300-piece file, read with the model's vocabulary size 300: cut
    // inside the header, a score, a length or a piece's bytes it is "truncated"; cut at a piece
    // boundary it "holds k pieces" (or, below 259, fewer than the special and byte pieces).
    // Without a vocabulary size, a cut after k >= 259 whole pieces is a valid k-piece file.
    temp_dir dir;
    const bytes whole = valid_tokenizer(300);
    const fs::path full = dir / "whole.bin";
    whole.write(full);
    REQUIRE(llama2::tokenizer(full).vocab_size() == 300);
    REQUIRE(llama2::tokenizer(full, 300).vocab_size() == 300);
    const fs::path cut = dir / "cut_tokenizer.bin";
    int truncated = 0, boundaries = 0, accepted = 0;
    for (std::size_t n = 0; n < whole.data.size(); ++n) {
        bytes{whole.data.substr(0, n)}.write(cut);
        INFO("first " << n << " bytes");
        try {
            (void)llama2::tokenizer(cut, 300);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            REQUIRE(what.find("cut_tokenizer.bin") != std::string::npos);
            const bool is_truncated = what.find("truncated at byte") != std::string::npos;
            const bool is_boundary = what.find("pieces, the model expects 300") != std::string::npos;
            REQUIRE((is_truncated || is_boundary));
            truncated += is_truncated;
            boundaries += is_boundary;
        }
        try {
            const llama2::tokenizer tok(cut);
            ++accepted;
            REQUIRE(tok.vocab_size() >= 259);
            REQUIRE(tok.vocab_size() < 300);
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            REQUIRE(what.find("cut_tokenizer.bin") != std::string::npos);
            REQUIRE((what.find("truncated at byte") != std::string::npos ||
                     what.find("fewer than the 3 special + 256") != std::string::npos));
        }
    }
    CHECK(truncated + boundaries == int(whole.data.size()));
    CHECK(boundaries == 300);  // after the header and after each of the first 299 pieces
    CHECK(accepted == 300 - 259);
}

TEST_CASE("llama2 files: tokenizer lengths out of range", "[llama2][files][tokenizer]") {
    temp_dir dir;
    const fs::path file = dir / "bad_lengths.bin";
    SECTION("a negative piece length") {
        bytes{}.i32(8).f32(0.0f).i32(-1).write(file);
        CHECK_THROWS_WITH(llama2::tokenizer(file), contains("bad_lengths.bin") && contains("piece 0 has length -1"));
    }
    SECTION("a length above max_token_length, with the bytes present") {
        bytes{}.i32(4).f32(0.0f).i32(5).text("abcde").write(file);
        CHECK_THROWS_WITH(llama2::tokenizer(file), contains("length 5 outside [0, max_token_length = 4]"));
    }
    SECTION("max_token_length not positive") {
        bytes{}.i32(std::numeric_limits<std::int32_t>::min()).write(file);
        CHECK_THROWS_WITH(llama2::tokenizer(file), contains("bad_lengths.bin") && contains("invalid max_token_length"));
        bytes{}.i32(0).write(file);
        CHECK_THROWS_WITH(llama2::tokenizer(file), contains("invalid max_token_length 0"));
    }
}

// ---------------------------------------------------------------------------------------------
// checkpoints
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2 files: the 0.9 MB checkpoint with 8000 layers and seq_len 8000 scores two tokens in little memory",
          "[llama2][files][checkpoint][cache]") {
    // Valid, but its KV cache at seq_len positions is 8000 layers x 8000 positions x 2 floats
    // x 2 (keys, values) = 1 GB: allocated up front, the engine took 984 MB before the first
    // token. Growing with the context, two tokens cost 16 positions' worth (2 MB).
    temp_dir dir;
    const fs::path file = dir / "deep_narrow.bin";
    const llama2::config c = deep_narrow_config(8000);
    llama2::write_checkpoint(file, c, llama2::random_weights(c, 5));
    const std::size_t size = fs::file_size(file);
    REQUIRE(size < 1000000);
    const peak_meter meter;
    const two_tokens r = load_and_score_two(file);
    const std::size_t peak = meter.bytes();
    REQUIRE(r.logits.rows() == 8);
    REQUIRE(r.logits.cols() == 2);
    CHECK(r.logits.allFinite());
    CHECK(r.capacity == 16);
    CHECK(r.cache_bytes < 3u << 20);
    if (counting()) {
        INFO("file " << size << " bytes, peak while loading and scoring " << peak << " bytes");
        CHECK(peak < 4 * size + (4u << 20));
    }
}

TEST_CASE("llama2 files: a checkpoint claiming 2^20 positions loads and scores without allocating for them",
          "[llama2][files][checkpoint][cache]") {
    // 9 MB (the legacy RoPE tables of 2^20 positions are most of it); the full KV cache would
    // be 134 GB, std::bad_alloc when allocated up front.
    temp_dir dir;
    const fs::path file = dir / "long_context.bin";
    const llama2::config c = deep_narrow_config(1 << 20);
    llama2::write_checkpoint(file, c, llama2::random_weights(c, 6));
    const std::size_t size = fs::file_size(file);
    const peak_meter meter;
    const two_tokens r = load_and_score_two(file);
    const std::size_t peak = meter.bytes();
    CHECK(r.logits.allFinite());
    CHECK(r.capacity == 16);
    CHECK(r.cache_bytes < 3u << 20);
    if (counting()) {
        INFO("file " << size << " bytes, peak while loading and scoring " << peak << " bytes");
        CHECK(peak < size + (4u << 20));
    }
}

TEST_CASE("llama2 files: header fields that are not positive are rejected naming the file and the field",
          "[llama2][files][checkpoint]") {
    // A valid header (dim 8, hidden 16, 2 layers, 2 heads, 1 kv head, vocab 10, seq_len 4) with
    // one field replaced; only the 28-byte header is written, since the header is checked first.
    temp_dir dir;
    const fs::path file = dir / "bad_field.bin";
    const char* const names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    const std::int32_t valid[7] = {8, 16, 2, 2, 1, 10, 4};
    for (int field = 0; field < 7; ++field)
        for (const std::int32_t bad : {0, -1, -7, std::numeric_limits<std::int32_t>::min()}) {
            if (field == 5 && bad != 0 && bad != std::numeric_limits<std::int32_t>::min())
                continue;  // a negative vocab_size is valid: a separate classifier
            std::int32_t h[7];
            std::copy(std::begin(valid), std::end(valid), h);
            h[field] = bad;
            bytes{}.raw(h, sizeof h).write(file);
            INFO(names[field] << " = " << bad);
            CHECK_THROWS_AS(llama2::read_checkpoint(file), std::invalid_argument);
            CHECK_THROWS_WITH(llama2::read_checkpoint(file),
                              contains("bad_field.bin") && contains(std::string(names[field]) + " = "));
        }
    // Inconsistent heads.
    header(8, 16, 2, 3, 1, 10, 4).write(file);
    CHECK_THROWS_WITH(llama2::read_checkpoint(file),
                      contains("bad_field.bin") && contains("dim is not a multiple of n_heads"));
    header(8, 16, 2, 2, 4, 10, 4).write(file);
    CHECK_THROWS_WITH(llama2::read_checkpoint(file), contains("n_kv_heads must divide n_heads"));
    header(6, 16, 2, 2, 1, 10, 4).write(file);  // head_size 3: RoPE rotates pairs
    CHECK_THROWS_WITH(llama2::read_checkpoint(file), contains("head_size"));
}

TEST_CASE("llama2 files: headers whose shapes no machine could hold are rejected before any allocation",
          "[llama2][files][checkpoint]") {
    // Each is a 28-byte file; what the header implies overflows 64-bit arithmetic when
    // computed naively, or exceeds 2^40 floats per tensor. The message names the field.
    temp_dir dir;
    const fs::path file = dir / "huge.bin";
    constexpr std::int32_t max = std::numeric_limits<std::int32_t>::max();
    struct forged {
        bytes h;
        const char* field;
    };
    const forged cases[] = {
        {header(1 << 30, 1, 1024, 1 << 29, 1 << 29, 512, 1), "wq [n_layers, dim, dim]"},  // 2^70 floats
        {header(4096, max, 100, 32, 32, 32000, 4096), "w1 [n_layers, hidden_dim, dim]"},  // 2^50 floats
        {header(1 << 20, 1, 1, 1 << 19, 1 << 19, max, 1), "token_embedding [vocab_size, dim]"},  // 2^51 floats
        {header(2, 1, max, 1, 1, 8, max), "KV cache at seq_len positions [n_layers, seq_len, kv_dim]"},  // 2^63
        {header(2, 1, 1, 1, 1, 8, max), nullptr},  // plausible shapes, 16 GB of RoPE tables: truncated
    };
    for (const auto& [h, field] : cases) {
        h.write(file);
        INFO("expects " << (field ? field : "truncated"));
        const peak_meter meter;
        CHECK_THROWS_AS(llama2::read_checkpoint(file), std::invalid_argument);
        if (field)
            CHECK_THROWS_WITH(llama2::read_checkpoint(file),
                              contains("huge.bin") && contains("implausibly large") && contains(field));
        else
            CHECK_THROWS_WITH(llama2::read_checkpoint(file), contains("huge.bin") && contains("truncated"));
        if (counting()) CHECK(meter.bytes() < 64 * 1024);
    }
    // The shapes of a 7B model in a 28-byte file: checked against the file's size first.
    header(4096, 11008, 32, 32, 32, 32000, 4096).write(file);
    const peak_meter meter;
    CHECK_THROWS_WITH(llama2::read_checkpoint(file), contains("huge.bin") && contains("truncated"));
    if (counting()) CHECK(meter.bytes() < 64 * 1024);
}

namespace {

/// small_config()'s checkpoint with random weights, written to a fresh folder, and its bytes.
struct written_checkpoint {
    temp_dir dir;
    llama2::config c = small_config();
    fs::path whole = dir / "whole.bin";
    std::uint64_t size = llama2::checkpoint_file_size(c);
    std::string data;
    explicit written_checkpoint(std::uint64_t seed) {
        llama2::write_checkpoint(whole, c, llama2::random_weights(c, seed));
        REQUIRE(fs::file_size(whole) == size);
        data.assign(size, '\0');
        std::ifstream(whole, std::ios::binary).read(data.data(), std::streamsize(size));
    }
};

}  // namespace

TEST_CASE("llama2 files: a checkpoint cut at any tensor boundary, or longer than its header says, is rejected",
          "[llama2][files][checkpoint]") {
    const written_checkpoint w(9);
    const temp_dir& dir = w.dir;
    const llama2::config& c = w.c;
    const fs::path& whole = w.whole;
    const std::uint64_t size = w.size;
    const std::string& data = w.data;

    // Tensor boundaries in file order: the header, the tensors, the two RoPE tables, wcls.
    std::vector<std::uint64_t> ends{28};
    llama2::weights none;
    llama2::detail::for_each_tensor(
        c, none, [&](auto&, std::size_t n) { ends.push_back(ends.back() + 4 * n); }, false);
    const std::uint64_t rope = 4 * llama2::detail::rope_table_floats(c);
    ends.push_back(ends.back() + rope);
    ends.push_back(ends.back() + rope);
    ends.push_back(ends.back() + 4u * std::uint64_t(c.vocab_size) * std::uint64_t(c.dim));
    REQUIRE(ends.back() == size);
    ends.pop_back();
    ends.push_back(size - 1);  // and inside the last float

    const fs::path cut = dir / "cut.bin";
    for (const std::uint64_t n : ends) {
        bytes{data.substr(0, n)}.write(cut);
        INFO("first " << n << " of " << size << " bytes");
        CHECK_THROWS_AS(llama2::read_checkpoint(cut), std::invalid_argument);
        CHECK_THROWS_WITH(llama2::read_checkpoint(cut), contains("cut.bin") && contains("truncated"));
    }
    // Inside the header.
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{27}}) {
        bytes{data.substr(0, n)}.write(cut);
        CHECK_THROWS_WITH(llama2::read_checkpoint(cut), contains("cut.bin") && contains("too small"));
    }
    // Oversized: one byte, and one whole classifier more (a shared-classifier header before a
    // file that has wcls, or trailing data of any kind).
    bytes{data + "x"}.write(cut);
    CHECK_THROWS_WITH(llama2::read_checkpoint(cut), contains("cut.bin") && contains("trailing data"));
    bytes over{data};
    over.zeros(4u * std::size_t(c.vocab_size) * std::size_t(c.dim));
    over.write(cut);
    CHECK_THROWS_WITH(llama2::read_checkpoint(cut), contains("trailing data"));
    // The header of the same model with a shared classifier: the file is one wcls too long.
    std::string shared = data;
    const std::int32_t vocab = c.vocab_size;
    std::memcpy(shared.data() + 20, &vocab, 4);
    bytes{shared}.write(cut);
    CHECK_THROWS_WITH(llama2::read_checkpoint(cut), contains("trailing data"));
    // The whole file still loads.
    CHECK(llama2::read_checkpoint(whole).cfg == c);
}

TEST_CASE("llama2 files: a NaN or infinite weight is rejected at load, naming the tensor and the element",
          "[llama2][files][checkpoint]") {
    const written_checkpoint w(11);
    const llama2::config& c = w.c;
    const std::uint64_t size = w.size;
    const std::string& data = w.data;
    // The third tensor (wq) starts after the header, the embedding and rms_att.
    const std::uint64_t wq = 28 + 4u * (std::uint64_t(c.vocab_size) * std::uint64_t(c.dim) +
                                        std::uint64_t(c.n_layers) * std::uint64_t(c.dim));
    const fs::path forged = w.dir / "forged.bin";
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
        std::string d = data;
        std::memcpy(d.data() + wq + 4 * 5, &bad, 4);  // its sixth element
        bytes{d}.write(forged);
        INFO(bad);
        CHECK_THROWS_AS(llama2::read_checkpoint(forged), std::invalid_argument);
        CHECK_THROWS_WITH(llama2::read_checkpoint(forged),
                          contains("forged.bin") && contains("weight tensor wq element 5 is ") &&
                              contains(std::isnan(bad) ? "NaN" : "infinite"));
    }
    // The classifier, read after the RoPE tables: its last element.
    std::string d = data;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(d.data() + size - 4, &nan, 4);
    bytes{d}.write(forged);
    CHECK_THROWS_WITH(llama2::read_checkpoint(forged), contains("weight tensor wcls element"));
    CHECK(llama2::read_checkpoint(w.whole).cfg == c);
}

// ---------------------------------------------------------------------------------------------
// the KV cache grows with the context used
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2 files: a growing KV cache gives the logits of one reserved at seq_len, bit for bit",
          "[llama2][files][cache]") {
    // One instance grows its cache (16, 32, 64, 128, 200 positions), the other reserves all
    // 200 positions first (the layout of an up-front allocation). Contexts grow one token at a
    // time and in drafts of 1-8, and roll back across growth points.
    auto model = std::make_shared<llama2::checkpoint>();
    model->name = "random-growth";
    model->cfg = small_config();
    model->w = llama2::random_weights(model->cfg, 11);
    llama2::transformer growing(model), reserved(model);
    CHECK(growing.cache_capacity() == 0);
    CHECK(growing.cache_bytes() == 0);
    reserved.reserve(reserved.max_context());
    CHECK(reserved.cache_capacity() == 200);
    const std::uint64_t full_bytes = reserved.cache_bytes();
    CHECK_THROWS_AS(reserved.reserve(201), std::length_error);

    std::mt19937 rng(3);
    std::uniform_int_distribution<std::int32_t> tok(3, model->cfg.vocab_size - 1);
    tokens ctx{1};
    std::vector<std::ptrdiff_t> capacities;
    std::ptrdiff_t most = 0;  // the most positions a call has held
    while (ctx.size() < 190) {
        tokens draft(1 + rng() % 8);
        for (auto& t : draft) t = tok(rng);
        most = std::max(most, std::ptrdiff_t(ctx.size() + draft.size()));
        const Eigen::MatrixXf a = growing.score(ctx, draft), b = reserved.score(ctx, draft);
        REQUIRE(a.cols() == b.cols());
        REQUIRE((a.array() == b.array()).all());
        // Accept part of the draft, sometimes roll back a few tokens.
        const std::size_t keep = rng() % (draft.size() + 1);
        ctx.insert(ctx.end(), draft.begin(), draft.begin() + std::ptrdiff_t(keep));
        ctx.push_back(tok(rng));
        if (rng() % 5 == 0 && ctx.size() > 20) ctx.resize(ctx.size() - 1 - rng() % 15);
        if (capacities.empty() || capacities.back() != growing.cache_capacity())
            capacities.push_back(growing.cache_capacity());
        // Never less than the positions used, nor more than twice as many (at least 16).
        REQUIRE(growing.cache_capacity() >= most);
        REQUIRE(growing.cache_capacity() <= std::max<std::ptrdiff_t>(16, 2 * most));
    }
    CHECK(capacities == std::vector<std::ptrdiff_t>{16, 32, 64, 128, 200});
    CHECK(growing.cache_bytes() == full_bytes);
    // Logits of single steps agree too, after all that.
    CHECK((growing.next_logits(ctx).array() == reserved.next_logits(ctx).array()).all());
    // An early-exit copy starts empty; a copy keeps the cache.
    const llama2::transformer copy = growing;
    CHECK(copy.cache_capacity() == growing.cache_capacity());
    CHECK(growing.early_exit(1).cache_capacity() == 0);
}
