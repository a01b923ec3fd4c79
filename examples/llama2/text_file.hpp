#pragma once
// Reading and writing the small text files the tools exchange (an engine profile): a file a
// user hands us is untrusted, so its size is bounded and every failure names the file and the
// option it came from.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace llama2 {

/// The largest text file read (a profile of a thousand positions is about 25 KB).
inline constexpr std::uintmax_t max_text_file_bytes = std::uintmax_t{1} << 20;

/// The file's contents. \throws std::invalid_argument naming `option` and the file when it is
/// missing, not a regular file, larger than max_text_file_bytes or unreadable.
[[nodiscard]] inline std::string read_text_file(const std::filesystem::path& path, std::string_view option) {
    const std::string what = std::string(option) + " " + path.string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) throw std::invalid_argument(what + ": no such file");
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) throw std::invalid_argument(what + ": cannot read its size: " + ec.message());
    if (size > max_text_file_bytes)
        throw std::invalid_argument(what + ": " + std::to_string(size) + " bytes; at most " +
                                    std::to_string(max_text_file_bytes) + " expected");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument(what + ": cannot open it");
    // Exactly the size found above, and nothing after it: a read that fails part way, or a file
    // that grew meanwhile, is an error rather than a shorter or longer text.
    std::string text(static_cast<std::size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (static_cast<std::uintmax_t>(in.gcount()) != size || in.peek() != std::ifstream::traits_type::eof())
        throw std::invalid_argument(what + ": read failed (the file changed while it was read?)");
    return text;
}

/// Writes `text` to the file (replacing it). \throws std::runtime_error naming the file.
inline void write_text_file(const std::filesystem::path& path, std::string_view text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace llama2
