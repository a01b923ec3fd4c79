// Fuzz harness: the engine-profile text format (specdec/engine_profile.hpp): parse_engine_profile
// on untrusted text, to_text, validate, and the costs a parsed profile gives the adaptive policy.
//
// Input: a mode byte, then
//   mode % 3 == 0 ("raw"): the text, byte for byte;
//   mode % 3 == 1 ("built"): the harness writes a text from the input, word by word: the header
//     and its variants (other versions, extra words, case), the three table names and unknown ones,
//     comments, blank lines, numbers from a table of edge cases (-0, subnormals, the largest
//     double and just above it, inf, nan, hex, a leading '+' or '.', exponents without digits,
//     long digit strings) or raw doubles written with %.17g, and separators (space, tab, CRLF, a
//     lone CR, vertical tab, NUL);
//   mode % 3 == 2 ("profile"): three tables of doubles from the input (edge values or raw bits,
//     valid or not; the tree_pass table may be empty), and with bit 3 of the mode byte (value 8)
//     a fourth, draft_catch_up (may be empty), written with to_text() and parsed back.
// Bit 2 of the mode byte (value 4): a parsed profile also goes to a gamma_controller (a chain's
// and a tree planner, whose chains run as chain steps or not), which plans a few steps from it,
// observing tree passes and chain passes; at each, per-sequence plans for a batch whose own
// estimates come from the input, edge values included (plan_sequences, planned_tree_tokens,
// drain_to_plain).
//
// Invariants: parse_engine_profile either returns a profile that passes validate() (target_pass
// and draft_step non-empty, tree_pass and draft_catch_up empty or not, every entry finite and
// >= 0, target_pass[0] and a given tree_pass[0] > 0), whose entries are exactly the numbers of
// its text's target_pass, draft_step, tree_pass and draft_catch_up lines (as strtod reads them),
// and that
// round-trips (to_text, then parse, gives the same doubles bit for bit, and to_text of that the
// same text), or throws std::invalid_argument whose message names the parser and stays short
// (words of the text are echoed cut at 40 characters); nothing else, ever. to_text throws
// std::invalid_argument exactly for a profile validate() rejects. pass_cost, draft_cost and
// tree_pass_cost equal the tables' entries within them and beyond them never decrease and are
// never NaN; without a tree_pass table tree_pass_cost is pass_cost; catch_up_cost is 0 for no
// missed token, never NaN nor negative, and without a draft_catch_up table missed ·
// draft_cost(sequences). A
// controller made with a valid profile plans lengths within its limits.

#include "fuzz_common.hpp"

#include <cstdlib>
#include <iterator>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

/// Whether validate() must accept the profile (its documented conditions, written out anew).
bool valid_profile(const specdec::engine_profile& p) {
    const auto table_ok = [](const std::vector<double>& t) {
        if (t.empty() || t.size() > (std::size_t{1} << 20)) return false;
        for (const double v : t)
            if (!(v >= 0.0) || !(v <= 1e30)) return false;  // finite, and at most 1e30
        return true;
    };
    return table_ok(p.target_pass) && table_ok(p.draft_step) && p.target_pass[0] > 0.0 &&
           (p.tree_pass.empty() || (table_ok(p.tree_pass) && p.tree_pass[0] > 0.0)) &&
           (p.draft_catch_up.empty() || table_ok(p.draft_catch_up));
}

/// The parser's error: std::invalid_argument naming it, with a short message.
void check_parse_error(const std::invalid_argument& e) {
    const std::string_view m = e.what();
    FUZZ_CHECK(m.find("specdec::parse_engine_profile") != std::string_view::npos);
    FUZZ_CHECK(m.size() < 512);
}

/// The numbers of the first line whose first word is `name` (the format allows exactly one),
/// read by strtod: a reference the parser's values must equal.
std::vector<double> reference_table(std::string_view text, std::string_view name) {
    std::vector<double> out;
    while (!text.empty()) {
        const std::size_t end = text.find('\n');
        std::string_view line = text.substr(0, end);
        text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        std::vector<std::string> words;
        std::size_t i = 0;
        while (i < line.size()) {
            while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
            const std::size_t j = i;
            while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
            if (i > j) words.emplace_back(line.substr(j, i - j));
        }
        if (words.empty() || words[0] != name) continue;
        for (std::size_t k = 1; k < words.size(); ++k) out.push_back(std::strtod(words[k].c_str(), nullptr));
        return out;
    }
    return out;
}

/// What a parsed (or built) valid profile promises.
void check_profile(const specdec::engine_profile& p) {
    FUZZ_CHECK(valid_profile(p));
    try {
        specdec::validate(p);
    } catch (const std::invalid_argument&) {
        FUZZ_CHECK(!"validate() rejects a profile the parser returned");
    }
    const std::string text = specdec::to_text(p);
    specdec::engine_profile q;
    try {
        q = specdec::parse_engine_profile(text);
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "parse_engine_profile(to_text(p)) threw: %s\ntext:\n%s\n", e.what(), text.c_str());
        FUZZ_CHECK(!"to_text() wrote a text that parse_engine_profile() rejects");
    }
    FUZZ_CHECK(same_bits(p.target_pass, q.target_pass));
    FUZZ_CHECK(same_bits(p.draft_step, q.draft_step));
    FUZZ_CHECK(same_bits(p.tree_pass, q.tree_pass));
    FUZZ_CHECK(same_bits(p.draft_catch_up, q.draft_catch_up));
    FUZZ_CHECK(specdec::to_text(q) == text);
    // Costs: the entries within the tables; beyond them never decreasing, never NaN.
    const auto check_costs = [](const std::vector<double>& t, auto cost) {
        const std::size_t k = t.size();
        for (std::size_t n : {std::size_t{1}, k}) FUZZ_CHECK(cost(n) == t[n - 1]);
        FUZZ_CHECK(cost(0) == t[0]);
        double prev = t.back();
        for (std::size_t n : {k + 1, k + 2, 2 * k + 7, std::size_t{1} << 20, std::size_t{1} << 40,
                              std::numeric_limits<std::size_t>::max()}) {
            const double c = cost(n);
            FUZZ_CHECK(!std::isnan(c) && c >= prev);
            prev = c;
        }
    };
    check_costs(p.target_pass, [&](std::size_t n) { return p.pass_cost(n); });
    check_costs(p.draft_step, [&](std::size_t n) { return p.draft_cost(n); });
    if (!p.tree_pass.empty()) {
        check_costs(p.tree_pass, [&](std::size_t n) { return p.tree_pass_cost(n); });
    } else {
        for (std::size_t n : {std::size_t{1}, p.target_pass.size() + 3, std::size_t{1} << 30})
            FUZZ_CHECK(p.tree_pass_cost(n) == p.pass_cost(n));
    }
    // Catch-up: nothing for no missed token; never NaN nor negative; without its table a draft
    // step per missed token.
    const std::size_t most = std::numeric_limits<std::size_t>::max();
    for (std::size_t s : {std::size_t{0}, std::size_t{1}, std::size_t{7}, most}) {
        FUZZ_CHECK(p.catch_up_cost(0, s) == 0.0);
        for (std::size_t missed : {std::size_t{1}, std::size_t{2}, p.draft_catch_up.size(), std::size_t{1} << 30,
                                   most - 1, most}) {
            const double c = p.catch_up_cost(missed, s);
            FUZZ_CHECK(!std::isnan(c) && c >= 0.0);
            if (p.draft_catch_up.empty() && missed != 0)
                FUZZ_CHECK(c == static_cast<double>(missed) * p.draft_cost(s));
        }
    }
}

/// A sum of β or a_k as a caller might pass it: usual values, or edge ones (negative, above
/// its count, NaN, infinite, huge).
double fuzzed_sum(fuzz::input& in, std::size_t count) {
    const unsigned v = in.byte();
    switch (v % 8u) {
        case 0: return std::numeric_limits<double>::quiet_NaN();
        case 1: return (v & 8u) ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
        case 2: return -1.0;
        case 3: return 1e300;
        case 4: return static_cast<double>(count) + 3.0;
        default: return static_cast<double>(count) * static_cast<double>(v) / 255.0;
    }
}

/// Per-sequence plans for a batch of 1..4 sequences with fuzzed own estimates (the values
/// batch_decoder passes from decode_stats, or a caller's, edge values included): ragged plans
/// stay within [1, min(γ, limit_i)] (all 0 for γ = 0); a tree planner's planned_tree_tokens
/// is in [1, min(nodes, limit_i) + 1] and not NaN; drain_to_plain never throws, and when it makes a step
/// plain its two predicted times are numbers with plain the smaller.
void plan_sequences_with(specdec::gamma_controller& chain, specdec::gamma_controller& tree, std::size_t g,
                         std::size_t d, fuzz::input& in) {
    using acceptance = specdec::gamma_controller::sequence_acceptance;
    const std::size_t n = 1 + in.byte() % 4u;
    std::vector<std::vector<double>> sums(n), sibling_sums(n);
    std::vector<std::vector<std::size_t>> counts(n), sibling_counts(n);
    std::vector<acceptance> seqs(n);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t positions = in.byte() % 8u, ranks = in.byte() % 4u;
        for (std::size_t k = 0; k < positions; ++k) {
            counts[i].push_back(in.byte() % 50u);
            sums[i].push_back(fuzzed_sum(in, counts[i].back()));
        }
        for (std::size_t k = 0; k < ranks; ++k) {
            sibling_counts[i].push_back(in.byte() % 50u);
            sibling_sums[i].push_back(fuzzed_sum(in, sibling_counts[i].back()));
        }
        seqs[i] = {.expected = sums[i], .reached = counts[i], .limit = in.byte() % 8u,
                   .remaining = in.byte() % 200u, .sibling_expected = sibling_sums[i],
                   .sibling_reached = sibling_counts[i]};
    }
    std::vector<std::size_t> plan(n);
    chain.plan_sequences(g, seqs, plan, (in.byte() & 1u) ? g : 0);
    for (std::size_t i = 0; i < n; ++i) {
        if (g == 0) FUZZ_CHECK(plan[i] == 0);
        else FUZZ_CHECK(plan[i] <= std::min(g, seqs[i].limit) && (plan[i] >= 1 || seqs[i].limit == 0));
    }
    std::size_t nodes = 0, level = 1;
    for (const std::size_t b : tree.planned_shape()) nodes += level *= b;
    if (!tree.planned_children().empty()) {
        nodes = 0;
        for (const std::size_t k : tree.planned_children()) nodes += k;
    }
    for (const auto& q : seqs) {
        const double t = tree.planned_tree_tokens(q);
        FUZZ_CHECK(t >= 1.0 && t <= static_cast<double>(nodes) + 1.0 + 1e-9);
        FUZZ_CHECK(t <= static_cast<double>(q.limit) + 1.0 + 1e-9);  // cut at the sequence's longest draft
        FUZZ_CHECK(chain.planned_tree_tokens(q) == 0.0);
    }
    if (chain.drain_to_plain(seqs, plan)) {
        const auto times = chain.drain_prediction();
        FUZZ_CHECK(times.plain < times.plan);
    }
    if (tree.drain_to_plain(seqs, {})) {
        FUZZ_CHECK(d > 0);
        FUZZ_CHECK(tree.planned_shape().empty());
        const auto times = tree.drain_prediction();
        FUZZ_CHECK(times.plain < times.plan);
    }
}

/// A controller planning from the profile: lengths within the limits asked.
void plan_with(const specdec::engine_profile& p, fuzz::input& in) {
    specdec::adaptive_gamma_options a;
    a.profile = p;
    a.explore_every = in.byte() % 4;
    specdec::gamma_controller chain(1 + in.byte() % 6, a);
    const std::size_t b1 = 1 + in.byte() % 3u, b2 = 1 + in.byte() % 2u, budget = in.byte() % 6u;
    specdec::gamma_controller tree(specdec::tree_plan_limits{.branching = {b1, b2},
                                                             .max_nodes = budget,
                                                             .chains_as_chain_steps = (in.byte() & 1u) != 0},
                                   a);
    std::vector<float> acceptance;
    for (int k = 0; k < 6; ++k) {
        const std::size_t limit = in.byte() % 8, sequences = 1 + in.byte() % 300;
        const std::size_t g = chain.choose(limit, sequences);
        FUZZ_CHECK(g <= std::min(limit, chain.gamma_max()));
        const std::size_t d = tree.choose(limit, sequences);
        FUZZ_CHECK(d <= std::min(limit, tree.gamma_max()));
        FUZZ_CHECK(tree.planned_shape().size() == d);
        // What the steps measured (no times: the profile's costs are used).
        acceptance.assign(std::max(g, d), 0.0f);
        for (float& a : acceptance) a = static_cast<float>(in.byte()) / 255.0f;
        plan_sequences_with(chain, tree, g, d, in);
        chain.observe({.gamma = g, .drafted = g, .emitted = 1, .acceptance = std::span<const float>(acceptance).first(g),
                       .positions = sequences * (g + 1), .first = k == 0});
        tree.observe({.gamma = d, .drafted = d, .emitted = 1,
                      .sibling_acceptance = std::span<const float>(acceptance).first(std::min<std::size_t>(d, 1)),
                      .positions = sequences * (d + 1), .tree_pass = (in.byte() & 1u) != 0, .first = k == 0});
    }
}

/// Parses `text`; checks the outcome.
void parse_and_check(std::string_view text, fuzz::input& in, bool plan) {
    specdec::engine_profile p;
    try {
        p = specdec::parse_engine_profile(text);
    } catch (const std::invalid_argument& e) {
        check_parse_error(e);
        return;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "parse_engine_profile threw %s\n", e.what());
        FUZZ_CHECK(!"parse_engine_profile threw something other than std::invalid_argument");
    }
    check_profile(p);
    FUZZ_CHECK(same_bits(p.target_pass, reference_table(text, "target_pass")));
    FUZZ_CHECK(same_bits(p.draft_step, reference_table(text, "draft_step")));
    FUZZ_CHECK(same_bits(p.tree_pass, reference_table(text, "tree_pass")));
    FUZZ_CHECK(same_bits(p.draft_catch_up, reference_table(text, "draft_catch_up")));
    if (plan) plan_with(p, in);
}

constexpr const char* number_words[] = {
    "0", "-0", "0.01", "0.0102", "1", "2.5", "1e-320", "4.9406564584124654e-324", "2.2250738585072014e-308",
    "1e308", "1.7976931348623157e308", "1.7976931348623159e308", "1e309", "inf", "-inf", "nan", "NaN", "-1",
    "0x10", "0x1p3", "+1", ".5", "1.", "1e", "1e+", "e5", "-", ".", "00000000000000000000000000001", "1e-400",
    "0.1000000000000000055511151231257827", "123456789012345678901234567890", "1_0", "1,5", "１",
    "0.000000000000000000000000000000000000000000000000000000000000001",
};
constexpr const char* other_words[] = {
    "specdec-engine-profile", "specdec-engine-profile 1", "specdec-engine-profile 2", "specdec-engine-profile 01",
    "SPECDEC-ENGINE-PROFILE", "target_pass", "draft_step", "target_pass_", "Target_pass", "#", "# comment",
    "#target_pass 1", "draft", "1", "specdec-engine-profile 1 1", "tree_pass", "tree_pass 1", "tree_passes",
    "draft_catch_up", "draft_catch_up 1", "draft_catch_up_",
};
constexpr std::string_view separators[] = {" ", "\t", "\n", "\r\n", "\r", "\v", std::string_view("\0", 1), "  "};

/// A text written from the input, word by word (see the file comment).
std::string built_text(fuzz::input& in) {
    std::string s;
    const std::size_t words = in.range(0, 200);
    for (std::size_t w = 0; w < words && !in.empty(); ++w) {
        const std::uint8_t b = in.byte();
        switch (b % 4) {
            case 0: s += number_words[in.byte() % std::size(number_words)]; break;
            case 1: s += other_words[in.byte() % std::size(other_words)]; break;
            case 2: {
                char buf[40];
                std::snprintf(buf, sizeof buf, "%.17g", in.raw<double>());
                s += buf;
                break;
            }
            default: s += separators[in.byte() % std::size(separators)];
        }
        if (b & 4u) s += (b & 8u) ? '\n' : ' ';
    }
    return s;
}

double any_double(fuzz::input& in) {
    static constexpr double values[] = {0.01, 0.0102, 1.0, 0.0, -0.0, 1e-320, 4.9406564584124654e-324,
                                        2.2250738585072014e-308, 1e308, std::numeric_limits<double>::max(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        std::numeric_limits<double>::quiet_NaN(), -1.0, 0.1, 3.0};
    const std::uint8_t b = in.byte();
    if (b < 200) return values[b % std::size(values)];
    return in.raw<double>();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::input in(data, size);
    const std::uint8_t mode = in.byte();
    const bool plan = (mode & 4u) != 0;
    switch (mode % 3) {
        case 0: {
            const auto text = in.rest();
            parse_and_check(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()), in, plan);
            break;
        }
        case 1: {
            const std::string text = built_text(in);
            parse_and_check(text, in, plan);
            break;
        }
        default: {
            specdec::engine_profile p;
            const std::size_t n_pass = in.byte() % 9, n_draft = in.byte() % 9;
            for (std::size_t i = 0; i < n_pass; ++i) p.target_pass.push_back(any_double(in));
            for (std::size_t i = 0; i < n_draft; ++i) p.draft_step.push_back(any_double(in));
            const std::size_t n_tree = in.byte() % 9;  // (0 at the input's end: no tree_pass)
            for (std::size_t i = 0; i < n_tree; ++i) p.tree_pass.push_back(any_double(in));
            if ((mode & 8u) != 0) {
                const std::size_t n_catch = in.byte() % 9;
                for (std::size_t i = 0; i < n_catch; ++i) p.draft_catch_up.push_back(any_double(in));
            }
            const bool valid = valid_profile(p);
            bool threw = false;
            try {
                specdec::validate(p);
            } catch (const std::invalid_argument&) {
                threw = true;
            }
            FUZZ_CHECK(threw == !valid);
            std::string text;
            try {
                text = specdec::to_text(p);
            } catch (const std::invalid_argument& e) {
                FUZZ_CHECK(!valid);
                FUZZ_CHECK(std::string_view(e.what()).find("specdec::to_text") != std::string_view::npos);
                return 0;
            }
            FUZZ_CHECK(valid);
            check_profile(p);
            parse_and_check(text, in, plan);
        }
    }
    return 0;
}
