#pragma once
// A run's trace and statistics as JSON files, for the example programs' --trace and --stats-json
// (docs/traces.md): the steps a specdec::step_recorder kept, in the Chrome trace-event format
// (Perfetto's UI and chrome://tracing open it as a timeline: one track per sequence, spans for
// the draft, the target pass and the library's work, the step's numbers as its arguments), with
// the run's summary under otherData.specdec, which scripts/trace_report.py turns into a page of
// charts. Written with nlohmann-json.

#include <specdec/trace.hpp>
#include <specdec/types.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace specdec_examples {

/// Plain decoding of the same prompt, timed, for the measured speedup.
struct baseline_run {
    std::size_t tokens = 0;
    double seconds = 0.0;
};

/// The run's summary (otherData.specdec of the trace; see docs/traces.md).
struct run_summary {
    std::string tool{};
    std::string target{}, draft{};
    /// A caveat shown with every figure of the report ("" for real models), e.g. random
    /// weights with acceptance controlled by hand.
    std::string label{};
    double temperature = 1.0;
    std::uint64_t seed = 0;
    std::string prompt{};
    std::size_t sequences = 1;
    std::size_t new_tokens = 0;
    double seconds = 0.0;  // the speculative run's wall time
    std::optional<baseline_run> baseline{};
    /// The measured speedup (tokens/s against the baseline's), when measured.
    std::optional<double> speedup{};
    /// The run's acceptance-rate estimate and how many tested positions it rests on.
    std::optional<double> alpha{};
    std::size_t alpha_positions = 0;
    /// c: one draft-model call's time over one plain target step's (Leviathan et al. 2023,
    /// §3.4), when known.
    std::optional<double> cost_ratio{};
    std::size_t gamma_max = 0;
};

namespace detail {

inline nlohmann::json optional_number(const std::optional<double>& x) {
    return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
}

inline const char* kind_name(specdec::step_kind k) {
    switch (k) {
        case specdec::step_kind::plain: return "plain";
        case specdec::step_kind::chain: return "chain";
        case specdec::step_kind::tree: return "tree";
    }
    return "plain";
}

inline const char* origin_name(specdec::next_token_origin o) {
    switch (o) {
        case specdec::next_token_origin::target: return "target";
        case specdec::next_token_origin::correction: return "correction";
        case specdec::next_token_origin::bonus: return "bonus";
    }
    return "target";
}

}  // namespace detail

/// The run's summary as JSON (the trace's otherData.specdec; docs/traces.md lists the fields).
[[nodiscard]] inline nlohmann::json run_summary_json(const run_summary& run, std::size_t dropped_steps = 0) {
    using nlohmann::json;
    json baseline = nullptr;
    if (run.baseline)
        baseline = {{"tokens", run.baseline->tokens},
                    {"seconds", run.baseline->seconds},
                    {"tokens_per_second", run.baseline->seconds > 0.0
                                              ? static_cast<double>(run.baseline->tokens) / run.baseline->seconds
                                              : 0.0}};
    return {
        {"tool", run.tool},
        {"target", run.target},
        {"draft", run.draft},
        {"label", run.label},
        {"temperature", run.temperature},
        {"seed", run.seed},
        {"prompt", run.prompt},
        {"sequences", run.sequences},
        {"new_tokens", run.new_tokens},
        {"seconds", run.seconds},
        {"tokens_per_second", run.seconds > 0.0 ? static_cast<double>(run.new_tokens) / run.seconds : 0.0},
        {"baseline", baseline},
        {"speedup", detail::optional_number(run.speedup)},
        {"alpha", detail::optional_number(run.alpha)},
        {"alpha_positions", run.alpha_positions},
        {"cost_ratio", detail::optional_number(run.cost_ratio)},
        {"gamma_max", run.gamma_max},
        {"dropped_steps", dropped_steps}};
}

/// The text of a token of a sequence, called in each sequence's output order (so a tokenizer
/// can keep the previous token per sequence).
using piece_function = std::function<std::string(std::size_t sequence, specdec::token_id token)>;

/// The trace as a JSON object in the Chrome trace-event format (see the file comment).
[[nodiscard]] inline nlohmann::json chrome_trace(const specdec::step_recorder& trace, const run_summary& run,
                                                 const piece_function& piece) {
    using nlohmann::json;
    json events = json::array();
    events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", 0}, {"name", "process_name"},
                      {"args", {{"name", run.tool + ": " + run.target + " / " + run.draft}}}});
    std::vector<std::size_t> step_of;  // steps so far, per sequence
    for (const auto& s : trace.steps()) {
        if (s.sequence >= step_of.size()) {
            for (std::size_t q = step_of.size(); q <= s.sequence; ++q)
                events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", q + 1}, {"name", "thread_name"},
                                  {"args", {{"name", "sequence " + std::to_string(q)}}}});
            step_of.resize(s.sequence + 1, 0);
        }
        const auto tokens = trace.tokens(s);
        json ids = json::array(), pieces = json::array(), origins = json::array();
        for (std::size_t i = 0; i < tokens.size(); ++i) {
            ids.push_back(tokens[i]);
            pieces.push_back(piece(s.sequence, tokens[i]));
            origins.push_back(i < s.accepted ? "draft" : detail::origin_name(s.origin));
        }
        json beta = json::array(), siblings = json::array();
        for (const float b : trace.acceptance(s)) beta.push_back(b);
        for (const float a : trace.sibling_acceptance(s)) siblings.push_back(a);
        const json args = {{"sequence", s.sequence},
                           {"step", step_of[s.sequence]++},
                           {"plan", detail::kind_name(s.kind)},
                           {"gamma", s.gamma},
                           {"tree_nodes", s.kind == specdec::step_kind::tree ? s.drafted : 0},
                           {"drafted", s.drafted},
                           {"accepted", s.accepted},
                           {"next_kind", detail::origin_name(s.origin)},
                           {"tokens", ids},
                           {"pieces", pieces},
                           {"origins", origins},
                           {"beta", beta},
                           {"sibling_acceptance", siblings},
                           {"target_passes", s.target_passes},
                           {"draft_ms", s.draft_seconds * 1e3},
                           {"target_ms", s.target_seconds * 1e3},
                           {"library_ms", s.library_seconds * 1e3}};
        const double us = 1e6;
        const double t = s.start_seconds * us, draft = s.draft_seconds * us, target = s.target_seconds * us,
                     library = s.library_seconds * us;
        const std::size_t tid = s.sequence + 1;
        auto span = [&](const char* name, double ts, double dur) {
            return json{{"ph", "X"}, {"cat", "specdec"}, {"name", name}, {"pid", 1}, {"tid", tid}, {"ts", ts}, {"dur", dur}};
        };
        json step = span("step", t, draft + target + library);
        step["args"] = args;
        events.push_back(std::move(step));
        if (s.kind != specdec::step_kind::plain) events.push_back(span("draft", t, draft));
        events.push_back(span("target pass", t + draft, target));
        events.push_back(span("verify", t + draft + target, library));
    }
    json summary = run_summary_json(run, trace.dropped());
    return {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}, {"otherData", {{"specdec", summary}}}};
}

/// A run's statistics (decode_stats) as JSON, with the derived rates.
[[nodiscard]] inline nlohmann::json stats_json(const specdec::decode_stats& st) {
    std::vector<double> siblings;
    for (std::size_t k = 0; k < st.reached_at_sibling.size(); ++k) siblings.push_back(st.estimated_sibling_acceptance(k));
    return {{"steps", st.steps},
            {"target_calls", st.target_calls},
            {"draft_calls", st.draft_calls},
            {"drafted_tokens", st.drafted_tokens},
            {"accepted_tokens", st.accepted_tokens},
            {"rejected_tokens", st.rejected_tokens},
            {"acceptance_rate", st.acceptance_rate()},
            {"estimated_acceptance", st.estimated_acceptance()},
            {"tokens_per_step", st.tokens_per_step()},
            {"accepted_at_position", st.accepted_at_position},
            {"reached_at_position", st.reached_at_position},
            {"expected_accepted_at_position", st.expected_accepted_at_position},
            {"reached_at_sibling", st.reached_at_sibling},
            {"expected_accepted_at_sibling", st.expected_accepted_at_sibling},
            {"estimated_sibling_acceptance", siblings},
            {"steps_at_gamma", st.steps_at_gamma}};
}

/// Writes `j` to the file (replacing it). \throws std::runtime_error naming the file and the
/// option it came from.
inline void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, const std::string& option) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    // Invalid UTF-8 in a token's text (a byte-level token cut mid-character) is replaced, not
    // an error.
    out << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    out.close();
    if (!out) throw std::runtime_error(option + " " + path.string() + ": cannot write the file");
}

}  // namespace specdec_examples
