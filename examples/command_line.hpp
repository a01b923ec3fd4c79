// Command-line parsing shared by the example programs (CLI11): one place that turns a parse
// outcome into the programs' exit convention.
#pragma once

#include <CLI/CLI.hpp>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

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

/// A validator for --drafter: one of the fixed names, or early-exit:K with K a positive
/// integer. Its message lists them all.
inline CLI::Validator drafter_validator(std::initializer_list<const char*> fixed) {
    std::string list = "early-exit:K (K >= 1)";
    for (const char* name : fixed) list += std::string(", ") + name;
    std::vector<std::string> names(fixed.begin(), fixed.end());
    return CLI::Validator(
        [names, list](const std::string& name) -> std::string {
            for (const auto& known : names)
                if (name == known) return {};
            if (name.rfind("early-exit:", 0) == 0) {
                const std::string k = name.substr(11);
                if (!k.empty() && k.size() < 9 && k.find_first_not_of("0123456789") == std::string::npos &&
                    std::stoi(k) > 0)
                    return {};
            }
            return "'" + name + "' is not a drafter: " + list;
        },
        "DRAFTER");
}

}  // namespace specdec_examples
