#pragma once
/// \file
/// What an engine's calls cost, measured once and reused: the cost of a target pass as a
/// function of the positions it holds (over every sequence of a batch together), of a tree pass
/// (the verifier's score_tree or score_tree_batch) by the same measure, of one draft step as
/// a function of the sequences it drafts for, and of a draft call that first reads the tokens
/// the draft model missed (its catch-up after plain steps). With a profile the adaptive
/// policy (gamma_controller) plans from the first step without timing anything, so its
/// choices, and the tokens, depend only on the seed (see adaptive_gamma_options::profile).
///
/// The cost model is Leviathan et al. 2023, §3.5 / Thm. 3.8 (a step of γ drafted tokens costs
/// γ draft steps and one target pass over γ + 1 positions), with the pass's cost taken at the
/// batch's total positions, as SmartSpec (Liu et al. 2024) does for batches: a pass that
/// stays flat while reading the weights dominates makes speculation pay; one that grows
/// linearly with the positions of a large batch does not.
///
/// A profile is a plain struct; to_text() and parse_engine_profile() store and load it as a
/// short text (no I/O here: the caller reads and writes the file). Text handed to the parser is
/// untrusted: every malformed line gets an error naming the line.
///
/// \code
/// specdec::engine_profile prof{.target_pass = {0.010, 0.0102, 0.0105, 0.0109, 0.0114},
///                              .draft_step = {0.0011}};
/// std::string saved = specdec::to_text(prof);
/// specdec::engine_profile loaded = specdec::parse_engine_profile(saved);
/// \endcode

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "error.hpp"

namespace specdec {

/// The measured costs of an engine, in seconds (or any unit, the same for both tables).
struct engine_profile {
    /// target_pass[m − 1]: one target pass over m positions in total (every sequence of a
    /// batch together; one sequence's pass over γ + 1 positions is m = γ + 1). At least one
    /// entry; each finite, >= 0 and at most 1e30, the first > 0.
    std::vector<double> target_pass{};
    /// draft_step[n − 1]: one draft step, a token for each of n sequences (a draft model's
    /// batched call). At least one entry; each finite, >= 0 and at most 1e30.
    std::vector<double> draft_step{};
    /// tree_pass[m − 1]: one target pass through the tree call (score_tree, score_tree_batch)
    /// over m positions in total (each sequence's nodes + 1, summed). An engine's tree pass can
    /// cost more than its chain pass over as many positions (a tree attention mask, a cache
    /// laid out for a tree), and the tree planner weighs tree steps with this table. Optional:
    /// empty, a tree pass costs what target_pass says. Otherwise as target_pass (the first > 0).
    std::vector<double> tree_pass{};
    /// draft_catch_up[n − 1]: one draft call for one sequence, drafting one token, whose context
    /// ends in n tokens the draft model has not read. A draft step in decoding reads one (the
    /// token verification emitted); after L plain steps, during which the draft model was idle,
    /// it reads L + 1, and an engine that reads them in one forward pass (a KV-cached model does)
    /// pays far less than L draft steps. The planner charges resuming speculation after L plain
    /// steps catch_up_cost(L, sequences) (adaptive_gamma_options::profile). Optional: empty, a
    /// missed token costs a draft step (the conservative guess). Otherwise each entry finite,
    /// >= 0 and at most 1e30. measure_engine_profile() and measure_batch_profile()
    /// fill it (the latter unless told catch_up_tokens = 0).
    std::vector<double> draft_catch_up{};

    /// The cost of a target pass over `positions` (>= 1) positions: the table's entry;
    /// beyond the table, extended along the slope of its last two entries (never
    /// decreasing). A table of one entry extends in proportion to the positions.
    [[nodiscard]] double pass_cost(std::size_t positions) const { return at(target_pass, positions); }
    /// The cost of one draft step for `sequences` (>= 1) sequences, extended like pass_cost.
    [[nodiscard]] double draft_cost(std::size_t sequences) const { return at(draft_step, sequences); }
    /// The cost of a tree pass over `positions` (>= 1) positions: tree_pass's entry, extended
    /// like pass_cost; pass_cost(positions) when tree_pass is empty.
    [[nodiscard]] double tree_pass_cost(std::size_t positions) const {
        return tree_pass.empty() ? pass_cost(positions) : at(tree_pass, positions);
    }
    /// What a draft model's first draft call after `missed` tokens it did not read (the tokens
    /// of the plain steps since it last drafted) costs beyond a draft step, for `sequences`
    /// sequences: with draft_catch_up, sequences · (draft_catch_up(missed + 1) − draft_catch_up(1))
    /// (each sequence reading its tokens in its own call; a batch engine that reads them all in
    /// one pass pays less), the table extended like pass_cost; without it, missed ·
    /// draft_cost(sequences) (one batched draft step per missed token).
    [[nodiscard]] double catch_up_cost(std::size_t missed, std::size_t sequences) const {
        if (missed == 0) return 0.0;
        if (draft_catch_up.empty()) return static_cast<double>(missed) * draft_cost(sequences);
        const std::size_t read = missed + (missed < std::numeric_limits<std::size_t>::max() ? 1 : 0);
        return static_cast<double>(std::max<std::size_t>(sequences, 1)) *
               std::max(0.0, at(draft_catch_up, read) - at(draft_catch_up, 1));
    }

private:
    [[nodiscard]] static double at(const std::vector<double>& table, std::size_t n) {
        if (table.empty()) return 0.0;
        n = std::max<std::size_t>(n, 1);
        if (n <= table.size()) return table[n - 1];
        const std::size_t k = table.size();
        if (k == 1) return table[0] * static_cast<double>(n);
        const double slope = std::max(0.0, table[k - 1] - table[k - 2]);
        return table[k - 1] + slope * static_cast<double>(n - k);
    }
};

namespace detail {

/// The most entries a table may have (a pass of a million positions is beyond any engine).
inline constexpr std::size_t max_profile_entries = std::size_t{1} << 20;
/// The largest entry (in any unit: 1e30 seconds is beyond any engine): the planner's sums of
/// costs over a batch's steps stay finite, where entries near a double's limit would overflow
/// to infinity (and infinity minus infinity, to NaN).
inline constexpr double max_profile_value = 1e30;

inline void check_profile_table(const std::vector<double>& table, const char* where, const char* name,
                                bool first_positive) {
    if (table.empty()) fail_invalid(where, ": engine_profile.", name, " is empty; at least one entry is needed");
    if (table.size() > max_profile_entries)
        fail_invalid(where, ": engine_profile.", name, " has ", table.size(), " entries; at most ",
                     max_profile_entries);
    for (std::size_t i = 0; i < table.size(); ++i)
        if (!(table[i] >= 0.0) || !(table[i] <= max_profile_value))
            fail_invalid(where, ": engine_profile.", name, "[", i, "] = ", table[i],
                         " must be finite, >= 0 and at most 1e30");
    if (first_positive && !(table[0] > 0.0))
        fail_invalid(where, ": engine_profile.", name, "[0] = 0; a pass over one position must cost something");
}

}  // namespace detail

/// Checks a profile: target_pass and draft_step non-empty, tree_pass and draft_catch_up empty or
/// not, at most 2^20 entries each, every entry finite, >= 0 and at most 1e30, target_pass[0] > 0 and (when
/// given) tree_pass[0] > 0. \throws std::invalid_argument naming `where` and the entry.
inline void validate(const engine_profile& p, const char* where = "specdec::validate(engine_profile)") {
    detail::check_profile_table(p.target_pass, where, "target_pass", true);
    detail::check_profile_table(p.draft_step, where, "draft_step", false);
    if (!p.tree_pass.empty()) detail::check_profile_table(p.tree_pass, where, "tree_pass", true);
    if (!p.draft_catch_up.empty()) detail::check_profile_table(p.draft_catch_up, where, "draft_catch_up", false);
}

/// The profile as text: a header line, then one line per table (tree_pass and draft_catch_up
/// only when they have entries), e.g.
/// ```
/// specdec-engine-profile 1
/// target_pass 0.01 0.0102 0.0105
/// draft_step 0.0011
/// tree_pass 0.0101 0.0104 0.0108
/// draft_catch_up 0.0011 0.0012
/// ```
/// Numbers are written in their shortest form that reads back as the same double (std::to_chars,
/// whatever the C locale: a program that set a locale with a decimal comma writes the same
/// text), so parse_engine_profile() gives back the same doubles. \throws std::invalid_argument
/// for a profile validate() rejects.
[[nodiscard]] inline std::string to_text(const engine_profile& p) {
    validate(p, "specdec::to_text(engine_profile)");
    std::string out = "specdec-engine-profile 1\n";
    const auto line = [&out](const char* name, const std::vector<double>& table) {
        out += name;
        char buf[40];
        for (const double v : table) {
            buf[0] = ' ';
            const auto r = std::to_chars(buf + 1, buf + sizeof buf, v);  // (validate(): finite)
            out.append(buf, r.ptr);
        }
        out += '\n';
    };
    line("target_pass", p.target_pass);
    line("draft_step", p.draft_step);
    if (!p.tree_pass.empty()) line("tree_pass", p.tree_pass);
    if (!p.draft_catch_up.empty()) line("draft_catch_up", p.draft_catch_up);
    return out;
}

/// Reads a profile written by to_text(). Blank lines and lines starting with '#' are
/// skipped; target_pass and draft_step appear exactly once, tree_pass and draft_catch_up at most
/// once each; the result
/// passes validate().
/// \throws std::invalid_argument naming the line (1-based) and what is wrong with it.
[[nodiscard]] inline engine_profile parse_engine_profile(std::string_view text) {
    constexpr const char* where = "specdec::parse_engine_profile";
    engine_profile p;
    bool header = false, has_pass = false, has_draft = false, has_tree = false, has_catch_up = false;
    std::size_t line_no = 0;
    while (!text.empty()) {
        const std::size_t end = text.find('\n');
        std::string_view line = text.substr(0, end);
        text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        // Words are read one at a time, so that a long line costs no more memory than its
        // entries (it is refused once it has more than max_profile_entries).
        std::size_t pos = 0;
        const auto next_word = [&line, &pos]() -> std::string_view {
            while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
            const std::size_t first = pos;
            while (pos < line.size() && line[pos] != ' ' && line[pos] != '\t') ++pos;
            return line.substr(first, pos - first);
        };
        const std::string_view name = next_word();
        if (name.empty() || name.front() == '#') continue;
        if (!header) {
            const std::string_view version = next_word();
            if (name != "specdec-engine-profile" || version.empty() || !next_word().empty())
                detail::fail_invalid(where, ": line ", line_no, ": expected the header 'specdec-engine-profile 1'");
            if (version != "1")
                detail::fail_invalid(where, ": line ", line_no, ": format version '", version.substr(0, 40), "' is not supported (1 is)");
            header = true;
            continue;
        }
        std::vector<double>* table = nullptr;
        if (name == "target_pass") {
            if (has_pass) detail::fail_invalid(where, ": line ", line_no, ": target_pass appears twice");
            has_pass = true;
            table = &p.target_pass;
        } else if (name == "draft_step") {
            if (has_draft) detail::fail_invalid(where, ": line ", line_no, ": draft_step appears twice");
            has_draft = true;
            table = &p.draft_step;
        } else if (name == "tree_pass") {
            if (has_tree) detail::fail_invalid(where, ": line ", line_no, ": tree_pass appears twice");
            has_tree = true;
            table = &p.tree_pass;
        } else if (name == "draft_catch_up") {
            if (has_catch_up) detail::fail_invalid(where, ": line ", line_no, ": draft_catch_up appears twice");
            has_catch_up = true;
            table = &p.draft_catch_up;
        } else {
            detail::fail_invalid(where, ": line ", line_no, ": unknown table '", name.substr(0, 40),
                         "' (expected target_pass, draft_step, tree_pass or draft_catch_up)");
        }
        std::size_t i = 0;
        for (std::string_view word = next_word(); !word.empty(); word = next_word()) {
            if (++i > detail::max_profile_entries)
                detail::fail_invalid(where, ": line ", line_no, ": ", name, " has more than ",
                                     detail::max_profile_entries, " entries");
            double v = 0.0;
            const char* first = word.data();
            const char* last = first + word.size();
            const auto [ptr, ec] = std::from_chars(first, last, v);
            if (ec == std::errc::result_out_of_range && ptr == last)
                detail::fail_invalid(where, ": line ", line_no, ": entry ", i, " of ", name, " ('",
                                     word.substr(0, 40), word.size() > 40 ? "..." : "",
                                     "') is out of the range of a double");
            if (ec != std::errc{} || ptr != last || !std::isfinite(v) || v < 0.0)
                detail::fail_invalid(where, ": line ", line_no, ": entry ", i, " of ", name, " ('",
                             word.substr(0, 40), word.size() > 40 ? "...": "",
                             "') is not a finite number >= 0");
            table->push_back(v);
        }
        if (i == 0) detail::fail_invalid(where, ": line ", line_no, ": ", name, " has no entries");
    }
    if (!header) detail::fail_invalid(where, ": the text is empty; expected the header 'specdec-engine-profile 1'");
    if (!has_pass) detail::fail_invalid(where, ": no target_pass line");
    if (!has_draft) detail::fail_invalid(where, ": no draft_step line");
    validate(p, where);
    return p;
}

}  // namespace specdec
