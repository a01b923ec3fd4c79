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
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llama2 {

/// A llama2.c tokenizer.
class tokenizer {
public:
    static constexpr std::int32_t unk_id = 0;  ///< <unk>
    static constexpr std::int32_t bos_id = 1;  ///< beginning of sequence
    static constexpr std::int32_t eos_id = 2;  ///< end of sequence
    static constexpr std::int32_t byte_offset = 3;  ///< byte b falls back to id b + 3

    /// Reads a tokenizer.bin. `expected_vocab_size` > 0 requires exactly that many pieces
    /// (llama2.c takes it from the model header); otherwise all pieces in the file are read.
    /// \throws std::runtime_error file cannot be opened; std::invalid_argument malformed file
    ///         or wrong size. Messages name the file.
    explicit tokenizer(const std::filesystem::path& path, std::int32_t expected_vocab_size = 0) {
        const std::string file = "llama2 tokenizer '" + path.string() + "'";
        std::ifstream in(path, std::ios::binary);
        if (!in) throw std::runtime_error(file + ": cannot open file");
        const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::size_t off = 0;
        auto read_raw = [&](void* dst, std::size_t n, const std::string& what) {
            if (data.size() - off < n)
                throw std::invalid_argument(file + ": truncated at byte " + std::to_string(off) + " while reading " +
                                            what);
            std::memcpy(dst, data.data() + off, n);
            off += n;
        };
        read_raw(&max_token_length_, 4, "the header's max_token_length");
        if (max_token_length_ <= 0)
            throw std::invalid_argument(file + ": invalid max_token_length " + std::to_string(max_token_length_));
        while (off < data.size() && (expected_vocab_size <= 0 || std::int32_t(pieces_.size()) < expected_vocab_size)) {
            float score = 0.0f;
            std::int32_t len = 0;
            const std::string of_piece = " of piece " + std::to_string(pieces_.size());
            read_raw(&score, 4, "the score" + of_piece);
            read_raw(&len, 4, "the length" + of_piece);
            if (len < 0 || len > max_token_length_)
                throw std::invalid_argument(file + ": piece " + std::to_string(pieces_.size()) + " has length " +
                                            std::to_string(len) + " outside [0, max_token_length = " +
                                            std::to_string(max_token_length_) + "]");
            std::string piece(std::size_t(len), '\0');
            read_raw(piece.data(), std::size_t(len), "the bytes" + of_piece);
            scores_.push_back(score);
            pieces_.push_back(std::move(piece));
        }
        if (expected_vocab_size > 0 && std::int32_t(pieces_.size()) != expected_vocab_size)
            throw std::invalid_argument(file + ": holds " + std::to_string(pieces_.size()) +
                                        " pieces, the model expects " + std::to_string(expected_vocab_size));
        if (off != data.size())  // (only with an expected size: the loop stopped there; a partial piece threw)
            throw std::invalid_argument(file + ": " + std::to_string(data.size() - off) + " bytes follow piece " +
                                        std::to_string(pieces_.size() - 1) + "; the model expects " +
                                        std::to_string(expected_vocab_size) + " pieces");
        if (pieces_.size() < std::size_t(byte_offset + 256))
            throw std::invalid_argument(file + ": holds " + std::to_string(pieces_.size()) +
                                        " pieces, fewer than the 3 special + 256 byte-fallback pieces");
        // First id wins for duplicated pieces (sentencepiece vocabularies have none).
        for (std::size_t i = 0; i < pieces_.size(); ++i) ids_.emplace(pieces_[i], std::int32_t(i));
    }

    /// Number of pieces.
    [[nodiscard]] std::int32_t vocab_size() const noexcept { return std::int32_t(pieces_.size()); }
    /// Longest piece in bytes (from the file header).
    [[nodiscard]] std::int32_t max_token_length() const noexcept { return max_token_length_; }
    /// The raw piece of `id` (e.g. " Once", "<0x0A>", "\n<s>\n"). \pre 0 <= id < vocab_size().
    [[nodiscard]] std::string_view piece(std::int32_t id) const { return pieces_.at(std::size_t(id)); }
    /// The merge score of `id`. \pre 0 <= id < vocab_size().
    [[nodiscard]] float score(std::int32_t id) const { return scores_.at(std::size_t(id)); }
    /// The id whose piece is exactly `p`, if any.
    [[nodiscard]] std::optional<std::int32_t> find(std::string_view p) const {
        const auto it = ids_.find(p);
        return it == ids_.end() ? std::nullopt : std::optional<std::int32_t>(it->second);
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
                pair.assign(pieces_[std::size_t(tokens[i])]);
                pair.append(pieces_[std::size_t(tokens[i + 1])]);
                const auto it = ids_.find(pair);
                if (it != ids_.end() && scores_[std::size_t(it->second)] > best_score) {
                    best_score = scores_[std::size_t(it->second)];
                    best_id = it->second;
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
        std::string_view p = pieces_[std::size_t(token)];
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

    std::int32_t max_token_length_ = 0;
    std::vector<std::string> pieces_;
    std::vector<float> scores_;
    /// Hash accepting std::string_view, so lookups do not allocate (C++20 heterogeneous lookup).
    struct piece_hash {
        using is_transparent = void;
        std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
    };
    std::unordered_map<std::string, std::int32_t, piece_hash, std::equal_to<>> ids_;
};

}  // namespace llama2
