#pragma once
/// \file
/// The llama2.c tokenizer (a sentencepiece BPE vocabulary exported by llama2.c's tokenizer.py):
/// encoding and decoding with the same rules as llama2.c's run.c.
///
/// Example code: copy it into your project. It depends only on the C++20 standard library.
///
/// File format (tokenizer.bin, little-endian):
///     int32 max_token_length
///     per token id 0, 1, ...:  float32 score, int32 length, `length` bytes (no terminator)
/// The file does not store the vocabulary size: pieces are read until the end of the file
/// (or checked against an expected size).
///
/// Special ids (llama2.c / sentencepiece): 0 = <unk>, 1 = BOS, 2 = EOS, 3 + b = byte-fallback
/// piece "<0xNN>" for byte b.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace llama2 {

/// A llama2.c tokenizer.
class tokenizer {
public:
    static constexpr std::int32_t unk_id = 0;  ///< <unk>
    static constexpr std::int32_t bos_id = 1;  ///< beginning of sequence
    static constexpr std::int32_t eos_id = 2;  ///< end of sequence
    static constexpr std::int32_t byte_offset = 3;  ///< byte b falls back to id b + 3
    /// The largest tokenizer file read (Llama 2's 32,000 pieces take about 0.4 MB; a 256K-piece
    /// vocabulary a few MB): a larger one, or a path that is not a regular file, is refused
    /// before anything is allocated for it.
    static constexpr std::uintmax_t max_file_bytes = std::uintmax_t{1} << 28;

    /// Reads a tokenizer.bin. `expected_vocab_size` > 0 requires exactly that many pieces
    /// (llama2.c takes it from the model header); otherwise all pieces in the file are read.
    ///
    /// The file is untrusted: it is read whole (one allocation of its size), then checked piece
    /// by piece (every length against max_token_length and against the bytes left) before
    /// anything is allocated for the pieces. These then take at most 3.5 times the file's size
    /// (each piece's 8 + length bytes in the file become its bytes, an offset, a score and two
    /// to four slots of the lookup table).
    /// \throws std::runtime_error file cannot be opened or read (or is not a regular file);
    ///         std::invalid_argument malformed file (larger than max_file_bytes, truncated, a length
    ///         out of range, too few or too many pieces); std::bad_alloc
    ///         only when memory for the file's own bytes (and the pieces they hold) runs out.
    ///         Messages name the file.
    explicit tokenizer(const std::filesystem::path& path, std::int32_t expected_vocab_size = 0) {
        const std::string file = "llama2 tokenizer '" + path.string() + "'";
        std::error_code ec;
        if (!std::filesystem::is_regular_file(path, ec))
            throw std::runtime_error(file + ": cannot open file (" +
                                     (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file") + ")");
        const std::uintmax_t size = std::filesystem::file_size(path, ec);
        if (ec) throw std::runtime_error(file + ": cannot determine the file size: " + ec.message());
        if (size > max_file_bytes)
            throw std::invalid_argument(file + ": " + std::to_string(size) + " bytes; a tokenizer of at most " +
                                        std::to_string(max_file_bytes) + " bytes is expected");
        std::ifstream in(path, std::ios::binary);
        if (!in) throw std::runtime_error(file + ": cannot open file");
        std::string data(static_cast<std::size_t>(size), '\0');
        if (!in.read(data.data(), static_cast<std::streamsize>(data.size())))
            throw std::runtime_error(file + ": read error");

        // Pass 1: check the layout and count the pieces, allocating nothing.
        std::size_t off = 0;
        auto read_raw = [&](void* dst, std::size_t n, const char* what, std::size_t piece) {
            if (data.size() - off < n)
                throw std::invalid_argument(file + ": truncated at byte " + std::to_string(off) + " while reading " +
                                            what + (piece == npos ? std::string() : std::to_string(piece)));
            if (dst != nullptr) std::memcpy(dst, data.data() + off, n);
            off += n;
        };
        read_raw(&max_token_length_, 4, "the header's max_token_length", npos);
        if (max_token_length_ <= 0)
            throw std::invalid_argument(file + ": invalid max_token_length " + std::to_string(max_token_length_));
        const std::size_t header = off;
        std::size_t count = 0, text_bytes = 0;
        auto wanted = [&] { return expected_vocab_size <= 0 || count < std::size_t(expected_vocab_size); };
        while (off < data.size() && wanted()) {
            std::int32_t len = 0;
            read_raw(nullptr, 4, "the score of piece ", count);
            read_raw(&len, 4, "the length of piece ", count);
            if (len < 0 || len > max_token_length_)
                throw std::invalid_argument(file + ": piece " + std::to_string(count) + " has length " +
                                            std::to_string(len) + " outside [0, max_token_length = " +
                                            std::to_string(max_token_length_) + "]");
            read_raw(nullptr, std::size_t(len), "the bytes of piece ", count);  // before anything is allocated
            text_bytes += std::size_t(len);
            if (++count > std::size_t(std::numeric_limits<std::int32_t>::max()))
                throw std::invalid_argument(file + ": holds more than 2^31 - 1 pieces");
        }
        if (expected_vocab_size > 0 && count != std::size_t(expected_vocab_size))
            throw std::invalid_argument(file + ": holds " + std::to_string(count) + " pieces, the model expects " +
                                        std::to_string(expected_vocab_size));
        if (off != data.size())  // (only with an expected size: the loop stopped there; a partial piece threw)
            throw std::invalid_argument(file + ": " + std::to_string(data.size() - off) + " bytes follow piece " +
                                        std::to_string(count - 1) + "; the model expects " +
                                        std::to_string(expected_vocab_size) + " pieces");
        if (count < std::size_t(byte_offset + 256))
            throw std::invalid_argument(file + ": holds " + std::to_string(count) +
                                        " pieces, fewer than the 3 special + 256 byte-fallback pieces");

        // Pass 2: the checked pieces, stored contiguously.
        text_.reserve(text_bytes);
        starts_.reserve(count + 1);
        scores_.reserve(count);
        off = header;
        for (std::size_t i = 0; i < count; ++i) {
            float score = 0.0f;
            std::int32_t len = 0;
            std::memcpy(&score, data.data() + off, 4);
            std::memcpy(&len, data.data() + off + 4, 4);
            starts_.push_back(text_.size());
            text_.append(data, off + 8, std::size_t(len));
            scores_.push_back(score);
            off += 8 + std::size_t(len);
        }
        starts_.push_back(text_.size());
        // The piece -> id table: open addressing, linear probing, at most half full. First id
        // wins for duplicated pieces (sentencepiece vocabularies have none).
        std::size_t slots = 16;
        while (slots < 2 * count) slots *= 2;
        slots_.assign(slots, -1);
        for (std::size_t i = 0; i < count; ++i) {
            const std::string_view p = piece_at(i);
            for (std::size_t s = hash_of(p);; ++s) {
                std::int32_t& slot = slots_[s & (slots - 1)];
                if (slot < 0) {
                    slot = std::int32_t(i);
                    break;
                }
                if (piece_at(std::size_t(slot)) == p) break;
            }
        }
    }

    /// Number of pieces.
    [[nodiscard]] std::int32_t vocab_size() const noexcept { return std::int32_t(scores_.size()); }
    /// Longest piece in bytes (from the file header).
    [[nodiscard]] std::int32_t max_token_length() const noexcept { return max_token_length_; }
    /// The raw piece of `id` (e.g. " Once", "<0x0A>", "\n<s>\n"). \pre 0 <= id < vocab_size().
    [[nodiscard]] std::string_view piece(std::int32_t id) const {
        if (id < 0 || id >= vocab_size())
            throw std::out_of_range("llama2::tokenizer::piece: id " + std::to_string(id) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
        return piece_at(std::size_t(id));
    }
    /// The merge score of `id`. \pre 0 <= id < vocab_size().
    [[nodiscard]] float score(std::int32_t id) const { return scores_.at(std::size_t(id)); }
    /// The id whose piece is exactly `p`, if any.
    [[nodiscard]] std::optional<std::int32_t> find(std::string_view p) const {
        if (slots_.empty()) return std::nullopt;
        const std::size_t mask = slots_.size() - 1;
        for (std::size_t s = hash_of(p);; ++s) {
            const std::int32_t id = slots_[s & mask];
            if (id < 0) return std::nullopt;
            if (piece_at(std::size_t(id)) == p) return id;
        }
    }

    /// Encodes `text` (UTF-8) as llama2.c run.c's encode() does:
    ///  1. BOS if `bos`;
    ///  2. for non-empty text, the "dummy prefix" piece " " (sentencepiece's add_dummy_prefix);
    ///  3. each UTF-8 code point (a lead byte plus up to 3 continuation bytes) becomes its piece,
    ///     or, when the vocabulary lacks it, one byte-fallback id (byte + 3) per byte;
    ///  4. repeatedly merge the adjacent pair whose concatenation is a piece with the highest
    ///     score (the leftmost on ties; only scores above -1e10), until no pair merges;
    ///  5. EOS if `eos`.
    [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text, bool bos, bool eos) const {
        std::vector<std::int32_t> tokens;
        tokens.reserve(text.size() + 3);
        if (bos) tokens.push_back(bos_id);
        const std::size_t first = tokens.size();
        if (!text.empty()) {
            const auto space = find(" ");
            if (!space) throw std::invalid_argument("llama2::tokenizer::encode: the vocabulary has no \" \" piece");
            tokens.push_back(*space);
        }
        auto continuation = [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0u) == 0x80u; };
        for (std::size_t i = 0; i < text.size();) {
            // A code point: this byte plus following continuation bytes, at most 4 bytes in all
            // (run.c resets its buffer at every non-continuation byte, so a stray continuation
            // byte forms a unit of its own).
            std::size_t len = 1;
            while (i + len < text.size() && continuation(text[i + len]) && len < 4) ++len;
            const std::string_view unit = text.substr(i, len);
            if (const auto id = find(unit))
                tokens.push_back(*id);
            else
                for (const char b : unit) tokens.push_back(std::int32_t(static_cast<unsigned char>(b)) + byte_offset);
            i += len;
        }
        // Greedy BPE merges by score (run.c). Quadratic, which is fine for prompts.
        std::string pair;
        for (;;) {
            float best_score = -1e10f;
            std::int32_t best_id = -1;
            std::size_t best_at = 0;
            for (std::size_t i = first; i + 1 < tokens.size(); ++i) {
                pair.assign(piece_at(std::size_t(tokens[i])));
                pair.append(piece_at(std::size_t(tokens[i + 1])));
                const auto id = find(pair);
                if (id && scores_[std::size_t(*id)] > best_score) {
                    best_score = scores_[std::size_t(*id)];
                    best_id = *id;
                    best_at = i;
                }
            }
            if (best_id < 0) break;
            tokens[best_at] = best_id;
            tokens.erase(tokens.begin() + std::ptrdiff_t(best_at) + 1);
        }
        if (eos) tokens.push_back(eos_id);
        return tokens;
    }

    /// The text of `token` when it follows `prev_token` (run.c's decode): the piece, without
    /// its leading space when prev_token is BOS (sentencepiece strips the dummy prefix), and the
    /// raw byte for a byte-fallback piece "<0xNN>". Special pieces (BOS, EOS) come back as
    /// stored. \throws std::out_of_range for a token outside the vocabulary.
    [[nodiscard]] std::string decode(std::int32_t prev_token, std::int32_t token) const {
        if (token < 0 || token >= vocab_size())
            throw std::out_of_range("llama2::tokenizer::decode: token " + std::to_string(token) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
        std::string_view p = piece_at(std::size_t(token));
        if (prev_token == bos_id && !p.empty() && p.front() == ' ') p.remove_prefix(1);
        if (p.size() == 6 && p.substr(0, 3) == "<0x" && p[5] == '>') {
            const int hi = hex(p[3]), lo = hex(p[4]);
            if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
        }
        return std::string(p);
    }

    /// The text of a token sequence as llama2.c's generation loop prints it: each token is
    /// decoded after its predecessor (the first after BOS, so a leading dummy-prefix space is
    /// stripped), and BOS / EOS produce no text.
    [[nodiscard]] std::string decode(std::span<const std::int32_t> tokens) const {
        std::string text;
        std::int32_t prev = bos_id;
        for (const std::int32_t t : tokens) {
            if (t != bos_id && t != eos_id) text += decode(prev, t);
            prev = t;
        }
        return text;
    }

private:
    static int hex(char ch) noexcept {
        if (ch >= '0' && ch <= '9') return ch - '0';
        if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
        if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
        return -1;
    }

    static constexpr std::size_t npos = std::size_t(-1);
    static std::size_t hash_of(std::string_view s) noexcept { return std::hash<std::string_view>{}(s); }
    /// Piece i, for i < vocab_size().
    [[nodiscard]] std::string_view piece_at(std::size_t i) const noexcept {
        return std::string_view(text_).substr(starts_[i], starts_[i + 1] - starts_[i]);
    }

    std::int32_t max_token_length_ = 0;
    std::string text_;                  // every piece's bytes, in id order
    std::vector<std::size_t> starts_;   // piece i is text_[starts_[i], starts_[i + 1])
    std::vector<float> scores_;
    std::vector<std::int32_t> slots_;   // hash table of ids by piece (-1: empty), a power of two
};

}  // namespace llama2
