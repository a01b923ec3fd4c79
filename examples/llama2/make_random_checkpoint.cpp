/// \file
/// make_random_checkpoint: writes a llama2.c version-0 checkpoint with random (seeded) weights
/// at a chosen shape, for benchmarks and tests that need a model of realistic size but not a
/// trained one.
///
///     make_random_checkpoint OUTPUT.bin [--preset NAME] [--dim N] [--hidden-dim N] [--layers N]
///                            [--heads N] [--kv-heads N] [--vocab N] [--seq-len N]
///                            [--separate-classifier] [--seed N]
///
/// Presets (shapes of llama2.c's tinyllamas): stories260K, stories15M (default), stories42M,
/// stories110M. Explicit options override the preset's values.

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "llama2/checkpoint.hpp"

namespace {

void usage(std::FILE* out) {
    std::fputs(
        "usage: make_random_checkpoint OUTPUT.bin [--preset stories260K|stories15M|stories42M|stories110M]\n"
        "           [--dim N] [--hidden-dim N] [--layers N] [--heads N] [--kv-heads N] [--vocab N]\n"
        "           [--seq-len N] [--separate-classifier] [--seed N]\n"
        "Writes a llama2.c version-0 fp32 checkpoint with random weights (default preset stories15M,\n"
        "seed 1). Options after --preset override its shape.\n",
        out);
}

template <class T>
T parse_number(std::string_view option, std::string_view text) {
    T value{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size())
        throw std::invalid_argument("option " + std::string(option) + ": '" + std::string(text) +
                                    "' is not a valid number");
    return value;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string output;
        llama2::config c = *llama2::preset_config("stories15M");
        std::uint64_t seed = 1;
        for (int i = 1; i < argc; ++i) {
            const std::string_view arg = argv[i];
            auto value = [&]() -> std::string_view {
                if (i + 1 >= argc) throw std::invalid_argument("option " + std::string(arg) + " needs a value");
                return argv[++i];
            };
            if (arg == "-h" || arg == "--help") {
                usage(stdout);
                return 0;
            } else if (arg == "--preset") {
                const std::string_view name = value();
                const auto p = llama2::preset_config(name);
                if (!p) throw std::invalid_argument("unknown preset '" + std::string(name) + "'");
                c = *p;
            } else if (arg == "--dim") {
                c.dim = parse_number<std::int32_t>(arg, value());
            } else if (arg == "--hidden-dim") {
                c.hidden_dim = parse_number<std::int32_t>(arg, value());
            } else if (arg == "--layers") {
                c.n_layers = parse_number<std::int32_t>(arg, value());
            } else if (arg == "--heads") {
                c.n_heads = parse_number<std::int32_t>(arg, value());
            } else if (arg == "--kv-heads") {
                c.n_kv_heads = parse_number<std::int32_t>(arg, value());
            } else if (arg == "--vocab") {
                c.vocab_size = parse_number<std::int32_t>(arg, value());
            } else if (arg == "--seq-len") {
                c.seq_len = parse_number<std::int32_t>(arg, value());
            } else if (arg == "--separate-classifier") {
                c.shared_classifier = false;
            } else if (arg == "--seed") {
                seed = parse_number<std::uint64_t>(arg, value());
            } else if (!arg.empty() && arg.front() == '-') {
                throw std::invalid_argument("unknown option " + std::string(arg));
            } else if (output.empty()) {
                output = std::string(arg);
            } else {
                throw std::invalid_argument("more than one output file given");
            }
        }
        if (output.empty()) {
            usage(stderr);
            return 2;
        }
        c.validate("requested shape");
        llama2::write_checkpoint(output, c, llama2::random_weights(c, seed));
        std::printf("wrote %s: %s, %llu parameters, %llu bytes, seed %llu\n", output.c_str(), c.describe().c_str(),
                    static_cast<unsigned long long>(llama2::parameter_count(c)),
                    static_cast<unsigned long long>(llama2::checkpoint_file_size(c)),
                    static_cast<unsigned long long>(seed));
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "make_random_checkpoint: %s\n", e.what());
        return 1;
    }
}
