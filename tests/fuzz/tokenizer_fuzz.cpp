// Fuzz harness: the llama2.c tokenizer reader and its encode / decode round trip
// (examples/llama2/tokenizer.hpp).
//
// Input, first byte even ("raw"): a byte choosing the expected vocabulary size (0: read all
// pieces), a text length and the text, then the tokenizer file itself, byte for byte.
// First byte odd ("built"): the harness writes a well-formed file from the input: the 3 special
// and 256 byte-fallback pieces of a llama2.c vocabulary, a " " piece (unless left out), and up
// to 48 more pieces (bytes and scores from the input, NaN scores included, never a '<' so that
// no merge can spell a special or byte piece), with a max_token_length that may be too small
// and an expected size that may be wrong; then the text.
//
// Invariants: the reader throws only std::invalid_argument for a malformed file (never
// runtime_error for a file that exists, never anything else), exactly when the built file is
// malformed; a file it accepts has at least 259 pieces (exactly the expected number when one
// is given), pieces no longer than max_token_length, and find() returns for every piece the
// first id that has it; a built file reads back piece for piece and score for score; piece()
// and decode() throw std::out_of_range outside the vocabulary; encode() returns ids in range,
// BOS and EOS where asked, and for a built vocabulary, pieces (byte-fallback ids read as their
// byte) that spell " " + text, and decode() returns the text exactly.

#include "fuzz_common.hpp"

#include <llama2/tokenizer.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace {

struct built_file {
    std::vector<std::uint8_t> bytes;
    std::vector<std::string> pieces;
    std::vector<float> scores;
    bool malformed = false;
};

void put(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    out.insert(out.end(), b, b + n);
}

built_file build(fuzz::input& in, std::int32_t& expected) {
    built_file f;
    static const char* hex = "0123456789ABCDEF";
    f.pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
    for (int b = 0; b < 256; ++b) f.pieces.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    const std::uint8_t flags = in.byte();
    if ((flags & 1u) == 0) f.pieces.push_back(" ");
    const std::size_t extra = in.byte() % 49;
    for (std::size_t i = 0; i < extra; ++i) {
        std::string p;
        const std::size_t len = in.byte() % 9;
        for (std::size_t k = 0; k < len; ++k) {
            char ch = static_cast<char>(in.byte());
            if (ch == '<') ch = '>';
            p.push_back(ch);
        }
        f.pieces.push_back(p);
    }
    std::size_t longest = 0;
    for (const auto& p : f.pieces) longest = std::max(longest, p.size());
    std::int32_t mtl = static_cast<std::int32_t>(longest) + (flags >> 6);
    if ((flags & 0x30u) == 0x30u) mtl = static_cast<std::int32_t>(longest) - 1 - ((flags >> 1) & 7);
    f.malformed = mtl < static_cast<std::int32_t>(longest) || mtl <= 0;
    const auto count = static_cast<std::int32_t>(f.pieces.size());
    const std::uint8_t e = in.byte();
    expected = e < 200 ? 0 : (e < 230 ? count : count + (e & 1u ? 1 : -1));
    if (expected != 0 && expected != count) f.malformed = true;
    put(f.bytes, &mtl, 4);
    for (std::size_t i = 0; i < f.pieces.size(); ++i) {
        const std::uint8_t s = i < 259 ? 0 : in.byte();
        const float score = s < 240 ? static_cast<float>(s) * 0.5f - 50.0f
                                    : fuzz::special_floats[s % fuzz::special_count];
        f.scores.push_back(score);
        const auto len = static_cast<std::int32_t>(f.pieces[i].size());
        put(f.bytes, &score, 4);
        put(f.bytes, &len, 4);
        put(f.bytes, f.pieces[i].data(), f.pieces[i].size());
    }
    return f;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::temp_file file("tokenizer");
    fuzz::input in(data, size);
    const bool built_mode = (in.byte() & 1u) != 0;
    std::int32_t expected = 0;
    std::string text;
    built_file f;
    std::span<const std::uint8_t> bytes;
    if (built_mode) {
        f = build(in, expected);
        const auto t = in.take(in.byte() % 129);
        text.assign(t.begin(), t.end());
        bytes = f.bytes;
    } else {
        const std::uint8_t e = in.byte();
        expected = e < 128 ? 0 : static_cast<std::int32_t>(e) + 131;  // 259 .. 383
        const auto t = in.take(in.byte() % 65);
        text.assign(t.begin(), t.end());
        bytes = in.rest();
    }
    file.write(bytes);

    std::optional<llama2::tokenizer> tok;
    try {
        tok.emplace(file.path(), expected);
    } catch (const std::invalid_argument&) {
        FUZZ_CHECK(!built_mode || f.malformed);
        return 0;
    }
    FUZZ_CHECK(!built_mode || !f.malformed);
    const std::int32_t V = tok->vocab_size();
    FUZZ_CHECK(V >= 259);
    if (expected > 0) FUZZ_CHECK(V == expected);
    if (built_mode) {
        FUZZ_CHECK(static_cast<std::size_t>(V) == f.pieces.size());
        for (std::int32_t i = 0; i < V; ++i) {
            FUZZ_CHECK(tok->piece(i) == f.pieces[static_cast<std::size_t>(i)]);
            FUZZ_CHECK(same_bits(tok->score(i), f.scores[static_cast<std::size_t>(i)]));
        }
    }
    std::unordered_map<std::string_view, std::int32_t> first;
    for (std::int32_t i = 0; i < V; ++i) {
        const std::string_view p = tok->piece(i);
        FUZZ_CHECK(static_cast<std::int64_t>(p.size()) <= tok->max_token_length());
        first.emplace(p, i);
        const auto id = tok->find(p);
        FUZZ_CHECK(id.has_value() && *id == first.at(p));
    }
    const auto throws_out_of_range = [](auto&& f) {
        try {
            f();
        } catch (const std::out_of_range&) {
            return true;
        }
        return false;
    };
    FUZZ_CHECK(throws_out_of_range([&] { (void)tok->piece(V); }));
    FUZZ_CHECK(throws_out_of_range([&] { (void)tok->piece(-1); }));
    FUZZ_CHECK(throws_out_of_range([&] { (void)tok->decode(llama2::tokenizer::bos_id, V); }));

    const bool bos = (size & 1u) != 0, eos = (size & 2u) != 0;
    std::vector<std::int32_t> ids;
    try {
        ids = tok->encode(text, bos, eos);
    } catch (const std::invalid_argument&) {
        FUZZ_CHECK(!text.empty() && !tok->find(" ").has_value());  // no " " piece
        return 0;
    }
    for (const std::int32_t t : ids) FUZZ_CHECK(t >= 0 && t < V);
    std::size_t lo = 0, hi = ids.size();
    if (bos) FUZZ_CHECK(hi > lo && ids[lo++] == llama2::tokenizer::bos_id);
    if (eos) FUZZ_CHECK(hi > lo && ids[--hi] == llama2::tokenizer::eos_id);
    FUZZ_CHECK(text.empty() == (lo == hi));
    FUZZ_CHECK(hi - lo <= text.size() + 1);
    const std::string decoded = tok->decode(ids);  // in range: never throws
    if (!built_mode) return 0;
    // A built vocabulary: the pieces spell " " + text, and decoding gives the text back.
    std::string spelled;
    for (std::size_t i = lo; i < hi; ++i) {
        const std::int32_t t = ids[i];
        if (t >= llama2::tokenizer::byte_offset && t < llama2::tokenizer::byte_offset + 256)
            spelled.push_back(static_cast<char>(t - llama2::tokenizer::byte_offset));
        else
            spelled += tok->piece(t);
    }
    if (!text.empty()) FUZZ_CHECK(spelled == " " + text);
    FUZZ_CHECK(decoded == text);
    return 0;
}
