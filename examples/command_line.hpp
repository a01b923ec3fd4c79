// Command-line parsing shared by the example programs (CLI11): one place that turns a parse
// outcome into the programs' exit convention.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>

namespace specdec_examples {

/// Sets the conventions every example program follows: an option given twice keeps its last
/// value (so a script's defaults can be overridden by arguments appended after them).
inline void command_line_defaults(CLI::App& app) {
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

/// Parses argv into the options registered on `app`.
/// \returns std::nullopt to go on; otherwise the exit status to end with: 0 after --help
///          (printed to stdout), 2 after a usage error (CLI11's message, naming the option, on stderr).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    }
}

}  // namespace specdec_examples
