#pragma once
/// \file
/// A tiny JSON reader for test data (reference files): objects, arrays, strings with all
/// escapes (\uXXXX and surrogate pairs included), numbers, true / false / null.
/// Not a general-purpose parser: no streaming, numbers are doubles, inputs are trusted.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace json_lite {

/// One JSON value.
struct value {
    enum class kind { null, boolean, number, string, array, object };
    kind type = kind::null;
    bool boolean = false;
    double number = 0.0;
    std::string string;
    std::vector<std::string> keys;  ///< object member names, in file order
    std::vector<value> items;       ///< array elements, or object member values (parallel to keys)

    /// Object member `key`. \throws std::out_of_range when absent or not an object.
    [[nodiscard]] const value& operator[](std::string_view key) const {
        if (type == kind::object)
            for (std::size_t i = 0; i < keys.size(); ++i)
                if (keys[i] == key) return items[i];
        throw std::out_of_range("json_lite: no member \"" + std::string(key) + "\"");
    }
    /// Array element i. \throws std::out_of_range.
    [[nodiscard]] const value& operator[](std::size_t i) const {
        if (type != kind::array || i >= items.size()) throw std::out_of_range("json_lite: bad array index");
        return items[i];
    }
    [[nodiscard]] bool contains(std::string_view key) const {
        if (type != kind::object) return false;
        for (const auto& k : keys)
            if (k == key) return true;
        return false;
    }
    [[nodiscard]] std::size_t size() const noexcept { return items.size(); }
    [[nodiscard]] const std::string& as_string() const {
        if (type != kind::string) throw std::runtime_error("json_lite: not a string");
        return string;
    }
    [[nodiscard]] std::int64_t as_int() const {
        if (type != kind::number || number != double(std::int64_t(number)))
            throw std::runtime_error("json_lite: not an integer");
        return std::int64_t(number);
    }
    /// An array of integers as int32.
    [[nodiscard]] std::vector<std::int32_t> as_int32_vector() const {
        if (type != kind::array) throw std::runtime_error("json_lite: not an array");
        std::vector<std::int32_t> out;
        out.reserve(items.size());
        for (const auto& v : items) out.push_back(std::int32_t(v.as_int()));
        return out;
    }
};

namespace detail {

class parser {
public:
    explicit parser(std::string_view text) : s_(text) {}

    value parse_document() {
        value v = parse_value(0);
        skip_ws();
        if (i_ != s_.size()) fail("trailing characters");
        return v;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw std::runtime_error("json_lite: " + what + " at offset " + std::to_string(i_));
    }
    void skip_ws() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
    }
    char peek() {
        skip_ws();
        if (i_ >= s_.size()) fail("unexpected end of input");
        return s_[i_];
    }
    void expect(char ch) {
        if (peek() != ch) fail(std::string("expected '") + ch + "'");
        ++i_;
    }
    bool literal(std::string_view word) {
        if (s_.substr(i_, word.size()) != word) return false;
        i_ += word.size();
        return true;
    }

    value parse_value(int depth) {
        if (depth > 256) fail("nesting too deep");
        value v;
        const char ch = peek();
        if (ch == '{') {
            v.type = value::kind::object;
            ++i_;
            if (peek() == '}') return ++i_, v;
            for (;;) {
                if (peek() != '"') fail("expected a member name");
                v.keys.push_back(parse_string());
                expect(':');
                v.items.push_back(parse_value(depth + 1));
                if (peek() == ',') { ++i_; continue; }
                expect('}');
                return v;
            }
        }
        if (ch == '[') {
            v.type = value::kind::array;
            ++i_;
            if (peek() == ']') return ++i_, v;
            for (;;) {
                v.items.push_back(parse_value(depth + 1));
                if (peek() == ',') { ++i_; continue; }
                expect(']');
                return v;
            }
        }
        if (ch == '"') {
            v.type = value::kind::string;
            v.string = parse_string();
            return v;
        }
        if (literal("true")) { v.type = value::kind::boolean; v.boolean = true; return v; }
        if (literal("false")) { v.type = value::kind::boolean; return v; }
        if (literal("null")) return v;
        // number
        const std::size_t start = i_;
        while (i_ < s_.size() && std::string_view("+-0123456789.eE").find(s_[i_]) != std::string_view::npos) ++i_;
        if (start == i_) fail("unexpected character");
        const std::string num(s_.substr(start, i_ - start));
        char* end = nullptr;
        v.type = value::kind::number;
        v.number = std::strtod(num.c_str(), &end);
        if (end != num.c_str() + num.size()) fail("bad number \"" + num + "\"");
        return v;
    }

    unsigned hex4() {
        if (s_.size() - i_ < 4) fail("short \\u escape");
        unsigned u = 0;
        for (int k = 0; k < 4; ++k) {
            const char c = s_[i_++];
            u <<= 4;
            if (c >= '0' && c <= '9') u |= unsigned(c - '0');
            else if (c >= 'a' && c <= 'f') u |= unsigned(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') u |= unsigned(c - 'A' + 10);
            else fail("bad hex digit in \\u escape");
        }
        return u;
    }

    static void put_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out += char(cp);
        } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += char(0xE0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        } else {
            out += char(0xF0 | (cp >> 18));
            out += char(0x80 | ((cp >> 12) & 0x3F));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        }
    }

    std::string parse_string() {
        expect('"');
        std::string out;
        for (;;) {
            if (i_ >= s_.size()) fail("unterminated string");
            const char c = s_[i_++];
            if (c == '"') return out;
            if (c != '\\') { out += c; continue; }
            if (i_ >= s_.size()) fail("unterminated escape");
            const char e = s_[i_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
                        const std::size_t save = i_;
                        i_ += 2;
                        const unsigned lo = hex4();
                        if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        else i_ = save;  // lone high surrogate: keep it as is
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: fail(std::string("bad escape \\") + e);
            }
        }
    }

    std::string_view s_;
    std::size_t i_ = 0;
};

}  // namespace detail

/// Parses a JSON document. \throws std::runtime_error with the offset of the problem.
[[nodiscard]] inline value parse(std::string_view text) { return detail::parser(text).parse_document(); }

/// Reads and parses a JSON file. \throws std::runtime_error.
[[nodiscard]] inline value parse_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("json_lite: cannot open " + path.string());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return parse(text);
}

}  // namespace json_lite
