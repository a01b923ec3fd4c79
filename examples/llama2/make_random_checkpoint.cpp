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
/// stories110M. Explicit options override the preset's values (whatever their order).

#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>

#include "command_line.hpp"
#include "llama2/checkpoint.hpp"

namespace {

/// The preset names preset_config knows, for --preset's help and validation.
std::string check_preset(const std::string& name) {
    return llama2::preset_config(name) ? std::string() : "unknown preset '" + name + "'";
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string output, preset = "stories15M";
        std::uint64_t seed = 1;
        std::int32_t dim = 0, hidden_dim = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
        bool separate_classifier = false;
        CLI::App app("Writes a llama2.c version-0 fp32 checkpoint with random weights. Explicit shape options "
                     "override the preset's values.",
                     "make_random_checkpoint");
        specdec_examples::command_line_defaults(app);
        app.add_option("OUTPUT.bin", output, "file to write")->required();
        app.add_option("--preset", preset, "stories260K|stories15M|stories42M|stories110M")
            ->capture_default_str()
            ->check(CLI::Validator(check_preset, "NAME"));
        const auto positive = CLI::Range(1, std::numeric_limits<std::int32_t>::max());
        CLI::Option* const dim_opt = app.add_option("--dim", dim, "model width")->check(positive);
        CLI::Option* const hidden_opt = app.add_option("--hidden-dim", hidden_dim, "feed-forward width")->check(positive);
        CLI::Option* const layers_opt = app.add_option("--layers", layers, "transformer layers")->check(positive);
        CLI::Option* const heads_opt = app.add_option("--heads", heads, "attention heads")->check(positive);
        CLI::Option* const kv_opt = app.add_option("--kv-heads", kv_heads, "key/value heads")->check(positive);
        CLI::Option* const vocab_opt = app.add_option("--vocab", vocab, "vocabulary size")->check(positive);
        CLI::Option* const seq_opt = app.add_option("--seq-len", seq_len, "context length")->check(positive);
        app.add_flag("--separate-classifier", separate_classifier, "an output matrix of its own (not shared)");
        app.add_option("--seed", seed, "random seed")->capture_default_str();
        if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;

        llama2::config c = *llama2::preset_config(preset);
        if (*dim_opt) c.dim = dim;
        if (*hidden_opt) c.hidden_dim = hidden_dim;
        if (*layers_opt) c.n_layers = layers;
        if (*heads_opt) c.n_heads = heads;
        if (*kv_opt) c.n_kv_heads = kv_heads;
        if (*vocab_opt) c.vocab_size = vocab;
        if (*seq_opt) c.seq_len = seq_len;
        if (separate_classifier) c.shared_classifier = false;
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
