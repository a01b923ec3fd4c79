// specdec-random-pair: speculative decoding timed against plain decoding at real model sizes,
// with random weights and the acceptance rate set by hand, on this machine.
//
//   specdec-random-pair [--tokens 200] [--batch 1] [--alpha 0.8] [--gamma 4|auto] [--max-gamma 6]
//                       [--tree 2,2,1,1 [--siblings 0.45,0.3,0.2]] [--measure-profile FILE | --profile FILE]
//
// The models are made in memory by the example engine's own generator (llama2::random_weights):
// a target at the shape of llama2.c's stories110M and a draft at the shape of stories15M, fixed
// seeds. Random weights agree with nothing, so the drafter is llama2::controlled_drafter
// (controlled_drafter.hpp): it runs the 15M-shape model's real draft pass for its cost, then
// proposes the target's greedy token with probability α per position (a fixed coin per sequence
// and position), another token otherwise. With --tree it drafts trees of that shape (with
// --gamma auto: the planner chooses each step's shape within it), and the r-th child of the
// greedy path's node is right with probability α_r given that the earlier ones were not: α, then
// --siblings. This measures what speculative decoding gains at given acceptance rates and this
// machine's real costs; it is not a measurement of any real draft model.
//
// Each of --batch sequences has a 4-token prompt, prefilled into both models before the timed
// region. At temperature 0 the program decodes --tokens new tokens per sequence, first plainly
// (batched autoregressive decoding: specdec::batch_decoder with chain{.gamma = 0}; its output is
// also the greedy continuation the controlled drafter needs), then speculatively (batch_decoder
// with the controlled drafter), times both with a wall clock, checks that the two outputs are
// the same token for token (exit status 1 otherwise: at temperature 0 speculative decoding must
// give the target's greedy output), and prints the measured figures beside the prediction of
// Leviathan, Kalman & Matias 2023, Thm. 3.8, for the measured α and cost coefficient c.
// A progress line goes to stderr while a timed run goes, when stderr is a terminal.

#include "batch_transformer.hpp"
#include "checkpoint.hpp"
#include "command_line.hpp"
#include "controlled_drafter.hpp"
#include "progress.hpp"
#include "text_file.hpp"
#include "trace_json.hpp"

#include <specdec/analysis.hpp>
#include <specdec/batch_decoder.hpp>
#include <specdec/measure_profile.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace {

using specdec::token_id;

constexpr std::size_t prompt_length = 4;
// The weights' seeds, as the multi-sequence benchmark's.
constexpr std::uint64_t target_seed = 1234, draft_seed = 4321;

struct arguments {
    std::size_t tokens = 200;  // new tokens per sequence
    std::size_t batch = 1;
    double alpha = 0.8;
    bool adaptive = false;   // --gamma auto
    std::size_t gamma = 4;   // fixed γ, or the adaptive policy's largest
    std::size_t max_gamma = 6;
    std::vector<std::size_t> tree;      // --tree: branching per depth (empty: chains)
    std::vector<double> siblings{0.45, 0.3, 0.2};  // --siblings: α of the 2nd, 3rd, ... child
    std::filesystem::path trace;       // --trace: the speculative run's steps (Chrome trace-event JSON)
    std::filesystem::path stats_json;  // --stats-json: the run's summary as JSON
    std::filesystem::path profile;          // --profile: plan --gamma auto from this engine profile
    std::filesystem::path measure_profile;  // --measure-profile: measure it first, save it here
    bool no_drain = false;  // --no-drain: each step's plan for itself, to the batch's end
};

/// A CLI11 validator for a whole number in [low, high], naming the bounds in its message.
/// `why`, when given, follows the message of a number out of range.
CLI::Validator whole_number(std::size_t low, std::size_t high, std::string why = {}) {
    return CLI::Validator(
        [low, high, why](const std::string& v) -> std::string {
            std::size_t n = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            if (ec != std::errc() || end != v.data() + v.size()) return "'" + v + "' is not a whole number";
            if (n < low || n > high)
                return std::to_string(n) + " is outside " + std::to_string(low) + ".." + std::to_string(high) +
                       (why.empty() ? "" : " (" + why + ")");
            return {};
        },
        "N in " + std::to_string(low) + ".." + std::to_string(high));
}

std::variant<arguments, int> parse(int argc, char** argv, std::size_t max_tokens) {
    arguments a;
    std::string gamma = "4";
    CLI::App app("Speculative against plain decoding at the stories110M (target) and stories15M (draft) shapes, "
                 "with random weights and the acceptance rate controlled (not a real draft model): tokens/s of "
                 "both on this machine, their ratio, and Leviathan et al.'s prediction (Thm. 3.8).",
                 "specdec-random-pair");
    specdec_examples::command_line_defaults(app);
    app.add_option("--tokens", a.tokens, "new tokens per sequence")
        ->capture_default_str()
        ->check(whole_number(1, max_tokens,
                             "the prompt's " + std::to_string(prompt_length) + " tokens and the new ones must fit the "
                             "draft model's window of " + std::to_string(max_tokens + prompt_length)));
    app.add_option("--batch", a.batch, "sequences decoded together (one target pass for all)")
        ->capture_default_str()
        ->check(whole_number(1, 64));
    app.add_option("--alpha", a.alpha, "probability that the drafter proposes the target's token, per position")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--gamma", gamma,
                   "draft length N >= 1, or auto: the adaptive policy chooses each step's from 0 to --max-gamma, "
                   "from measured acceptance and timings")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto"}) | whole_number(1, 32));
    app.add_option("--max-gamma", a.max_gamma, "largest draft length of --gamma auto")
        ->capture_default_str()
        ->check(whole_number(1, 32));
    app.add_option("--tree", a.tree,
                   "draft trees instead of chains: branching per depth, e.g. 2,2,1,1 (traversal verification; "
                   "with --gamma auto each step's shape is planned within it: a tree, a chain or a plain step)")
        ->delimiter(',')
        ->check(whole_number(1, 8));
    app.add_option("--siblings", a.siblings,
                   "with --tree: probability that the 2nd, 3rd, ... child of a node on the target's path is the "
                   "target's token, given that the earlier children were not (the last value repeats)")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--trace", a.trace,
                   "write the speculative run's steps to FILE in the Chrome trace-event format "
                   "(scripts/trace_report.py makes a page of charts from it)");
    app.add_option("--stats-json", a.stats_json, "write the run's summary to FILE as JSON");
    app.add_option("--profile", a.profile,
                   "with --gamma auto: plan every step from this engine profile (written by --measure-profile) "
                   "instead of timing the run, so that the plan depends on counts only");
    app.add_option("--measure-profile", a.measure_profile,
                   "with --gamma auto: measure the pair's engine profile first (specdec::measure_batch_profile: "
                   "median timings of draft_batch and score_batch calls, outside the timed runs), save it to FILE, "
                   "and plan from it")
        ->excludes("--profile");
    app.add_flag("--no-drain", a.no_drain,
                 "with --gamma auto: plan each step for its own tokens per unit of time to the batch's end, "
                 "instead of making steps plain where plain steps are predicted to finish the batch sooner "
                 "(adaptive_gamma_options::drain = false: what a serving loop that refills its batch needs)");
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;
    a.adaptive = gamma == "auto";
    if (app.count("--siblings") != 0 && a.tree.empty()) {
        std::fputs("specdec-random-pair: --siblings sets the acceptance of a tree's later children; add --tree\n"
                   "Run with --help for more information.\n",
                   stderr);
        return 2;
    }
    if (a.tree.size() > 8) {
        std::fputs("specdec-random-pair: --tree has more than 8 levels\nRun with --help for more information.\n",
                   stderr);
        return 2;
    }
    if ((!a.profile.empty() || !a.measure_profile.empty()) && !a.adaptive) {
        std::fputs("specdec-random-pair: --profile and --measure-profile plan the steps of --gamma auto; add --gamma "
                   "auto\nRun with --help for more information.\n",
                   stderr);
        return 2;
    }
    if (a.no_drain && !a.adaptive) {
        std::fputs("specdec-random-pair: --no-drain changes how --gamma auto plans a batch's steps; add --gamma auto\n"
                   "Run with --help for more information.\n",
                   stderr);
        return 2;
    }
    a.gamma = !a.tree.empty() ? a.tree.size() : a.adaptive ? a.max_gamma : std::stoull(gamma);
    return a;
}

using llama2::prefill;
using llama2::random_checkpoint;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The draft model, with the wall time and the passes of its draft_batch calls added up (for the
/// cost coefficient c).
class timed_draft_model {
public:
    explicit timed_draft_model(llama2::batch_transformer& m) : m_(&m) {}
    [[nodiscard]] std::ptrdiff_t vocab_size() const { return m_->vocab_size(); }
    void draft_batch(std::span<specdec::draft_request> requests, const specdec::sampling_config& sampling) {
        const auto before = m_->passes();
        const auto t0 = std::chrono::steady_clock::now();
        m_->draft_batch(requests, sampling);
        seconds += seconds_since(t0);
        passes += m_->passes() - before;
    }
    double seconds = 0.0;
    std::uint64_t passes = 0;

private:
    llama2::batch_transformer* m_;
};

/// Steps `dec` until every sequence is done, with a progress line ("LABEL: n/total tokens", all
/// sequences together) when stderr is a terminal. \returns the decoder's steps.
template <class Decoder>
std::size_t run_with_progress(Decoder& dec, const std::vector<std::size_t>& ids, std::size_t total, const char* label) {
    specdec_examples::progress_line progress;
    std::size_t steps = 0;
    for (bool active = true; active;) {
        active = dec.step() != 0;
        ++steps;
        if (progress.enabled()) {
            std::size_t done = 0;
            for (const auto id : ids) done += dec.generated(id).size();
            progress.count(label, done, total);
        }
    }
    return steps;
}

struct plain_run {
    std::vector<std::vector<token_id>> tokens;  // per sequence
    double seconds = 0.0;
    std::size_t passes = 0;  // target passes (decoder steps), each over every sequence
};

struct speculative_run {
    std::vector<std::vector<token_id>> tokens;
    double seconds = 0.0;
    std::size_t passes = 0;
    specdec::decode_stats totals;  // the sequences' counters added up (steps: per sequence)
    std::string explained;         // --gamma auto: the planner's account of its choice at the end
    double draft_seconds = 0.0;    // inside the draft model's passes
    std::uint64_t draft_passes = 0;
};

/// The options of the plain run: batched autoregressive decoding at temperature 0.
specdec::decode_options plain_options(const arguments& a) {
    return {.step = specdec::chain{.gamma = 0},
            .sampling = {.temperature = 0.0f},
            .budget = {.max_new_tokens = a.tokens}};
}

/// The options of the speculative run, built here and only here. With --trace, every step of
/// every sequence is recorded (specdec::step_recorder: no I/O, no allocation inside the timed
/// region) with β estimated at each tested position (the same tokens).
specdec::decode_options speculative_options(const arguments& a, specdec::step_recorder* trace,
                                            const std::optional<specdec::engine_profile>& profile) {
    specdec::decode_options o{
        .step = specdec::chain{.gamma = a.gamma, .estimate_acceptance = trace != nullptr},
        .length = {.policy = a.adaptive ? specdec::gamma_policy::adaptive : specdec::gamma_policy::fixed},
        .sampling = {.temperature = 0.0f},
        .budget = {.max_new_tokens = a.tokens}};
    if (!a.tree.empty())
        o.step = specdec::tree{.shape = {.branching = a.tree}, .estimate_sibling_acceptance = trace != nullptr};
    o.length.adaptive.profile = profile;
    o.length.adaptive.drain = !a.no_drain;
    if (trace) o.on_step = std::ref(*trace);
    return o;
}

/// The most draft tokens a step may hold per sequence: the longest chain, or the tree's nodes.
std::size_t largest_draft(const arguments& a) {
    if (a.tree.empty()) return a.max_gamma;
    return specdec::tree_shape{.branching = a.tree}.nodes();
}

/// With --measure-profile: the engine profile of the pair measured on the prefilled models
/// (passes over up to batch · (nodes + 1) positions — nodes: the longest chain's, or the tree's
/// — and drafts for up to batch sequences), saved
/// to the file; with --profile: loaded from it; otherwise none (the policy times the run).
std::optional<specdec::engine_profile> engine_profile_of(const arguments& a, llama2::batch_transformer& draft_model,
                                                         llama2::batch_transformer& target,
                                                         const std::vector<std::vector<token_id>>& prompts) {
    if (!a.measure_profile.empty()) {
        const auto p = specdec::measure_batch_profile(
            draft_model, target, prompts,
            {.max_positions = a.batch * (largest_draft(a) + 1), .max_sequences = a.batch, .draft_tokens = 4, .repeats = 3,
             .sampling = {.temperature = 0.0f}});
        llama2::write_text_file(a.measure_profile, specdec::to_text(p));
        return p;
    }
    if (a.profile.empty()) return std::nullopt;
    const std::string text = llama2::read_text_file(a.profile, "--profile");  // (its errors name the option)
    try {
        return specdec::parse_engine_profile(text);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("--profile " + a.profile.string() + ": " + e.what());
    }
}

plain_run decode_plain(const std::shared_ptr<const llama2::checkpoint>& target_weights,
                       const std::vector<std::vector<token_id>>& prompts, const arguments& a) {
    llama2::batch_transformer target(target_weights);
    prefill(target, prompts);
    // The target as its own drafter: with γ = 0 it is never asked for a draft.
    specdec::batch_decoder dec(target, target, plain_options(a));
    std::vector<std::size_t> ids;
    for (const auto& p : prompts) ids.push_back(dec.add(p, std::mt19937_64(1)));
    plain_run r;
    const auto t0 = std::chrono::steady_clock::now();
    r.passes = run_with_progress(dec, ids, a.tokens * prompts.size(), "plain");
    r.seconds = seconds_since(t0);
    for (const auto id : ids) r.tokens.push_back(dec.take(id).tokens);
    return r;
}

speculative_run decode_speculative(const std::shared_ptr<const llama2::checkpoint>& target_weights,
                                   const std::shared_ptr<const llama2::checkpoint>& draft_weights,
                                   const std::vector<std::vector<token_id>>& prompts,
                                   const std::vector<std::vector<token_id>>& greedy, const arguments& a,
                                   specdec::step_recorder* trace) {
    llama2::batch_transformer target(target_weights), draft_model(draft_weights);
    prefill(target, prompts);
    prefill(draft_model, prompts);
    const auto profile = engine_profile_of(a, draft_model, target, prompts);  // before the timed run
    timed_draft_model timed(draft_model);
    std::vector<double> alpha{a.alpha};
    alpha.insert(alpha.end(), a.siblings.begin(), a.siblings.end());
    llama2::controlled_drafter<timed_draft_model> drafter(timed, prompts, greedy, std::move(alpha));
    specdec::batch_decoder<llama2::controlled_drafter<timed_draft_model>, llama2::batch_transformer> dec(
        drafter, target, speculative_options(a, trace, profile));
    std::vector<std::size_t> ids;
    std::uint64_t seed = 1;
    for (const auto& p : prompts) ids.push_back(dec.add(p, std::mt19937_64(seed++)));
    speculative_run r;
    const auto t0 = std::chrono::steady_clock::now();
    r.passes = run_with_progress(dec, ids, a.tokens * prompts.size(), "speculative");
    r.seconds = seconds_since(t0);
    r.draft_seconds = timed.seconds;
    r.draft_passes = timed.passes;
    if (const specdec::gamma_controller* c = dec.controller()) r.explained = c->explain(a.batch);
    auto& t = r.totals;
    for (const auto id : ids) {
        auto out = dec.take(id);
        const auto& s = out.stats;
        t.steps += s.steps;
        t.target_calls += s.target_calls;
        t.drafted_tokens += s.drafted_tokens;
        t.accepted_tokens += s.accepted_tokens;
        t.rejected_tokens += s.rejected_tokens;
        if (t.steps_at_gamma.size() < s.steps_at_gamma.size()) t.steps_at_gamma.resize(s.steps_at_gamma.size());
        for (std::size_t g = 0; g < s.steps_at_gamma.size(); ++g) t.steps_at_gamma[g] += s.steps_at_gamma[g];
        r.tokens.push_back(std::move(out.tokens));
    }
    return r;
}

/// The first sequence and position where the two runs differ, or nothing.
std::string first_difference(const std::vector<std::vector<token_id>>& plain,
                             const std::vector<std::vector<token_id>>& spec) {
    for (std::size_t s = 0; s < plain.size(); ++s) {
        const auto& p = plain[s];
        const auto& q = spec[s];
        const std::size_t n = std::min(p.size(), q.size());
        for (std::size_t k = 0; k < n; ++k)
            if (p[k] != q[k])
                return "sequence " + std::to_string(s) + ", token " + std::to_string(k) + ": plain " +
                       std::to_string(p[k]) + ", speculative " + std::to_string(q[k]);
        if (p.size() != q.size())
            return "sequence " + std::to_string(s) + ": plain " + std::to_string(p.size()) + " tokens, speculative " +
                   std::to_string(q.size());
    }
    return {};
}

std::size_t total_tokens(const std::vector<std::vector<token_id>>& runs) {
    std::size_t n = 0;
    for (const auto& r : runs) n += r.size();
    return n;
}

/// What the program measured: print_report prints it, summarize() gives it to --trace and --stats-json.
struct report {
    arguments args;
    double weights_seconds = 0.0;
    plain_run plain;
    speculative_run spec;
};

void print_report(const report& r) {
    const auto& a = r.args;
    const auto& st = r.spec.totals;
    const std::size_t plain_tokens = total_tokens(r.plain.tokens), spec_tokens = total_tokens(r.spec.tokens);
    const double plain_rate = static_cast<double>(plain_tokens) / r.plain.seconds;
    const double spec_rate = static_cast<double>(spec_tokens) / r.spec.seconds;
    // The cost coefficient c of Leviathan et al. (§3.4): one draft-model step over the batch,
    // timed inside the speculative run, relative to one plain target step over the batch.
    const double target_step = r.plain.seconds / static_cast<double>(std::max<std::size_t>(1, r.plain.passes));
    const double draft_step =
        r.spec.draft_passes == 0 ? 0.0 : r.spec.draft_seconds / static_cast<double>(r.spec.draft_passes);
    const double c = draft_step / target_step;
    const std::size_t tested = st.accepted_tokens + st.rejected_tokens;
    const double alpha = st.acceptance_rate();  // accepted / tested
    const double accepted_share =
        st.drafted_tokens == 0 ? 0.0 : static_cast<double>(st.accepted_tokens) / static_cast<double>(st.drafted_tokens);

    std::printf("random weights at the stories110M/15M shapes, acceptance controlled at alpha = %.2f (not a real draft "
                "model)\n",
                a.alpha);
    std::string step = a.adaptive ? "gamma auto, at most " + std::to_string(a.gamma) : "gamma " + std::to_string(a.gamma);
    if (!a.tree.empty()) {
        step = a.adaptive ? "planned within the tree " : "tree ";
        for (std::size_t d = 0; d < a.tree.size(); ++d) step += (d ? "," : "") + std::to_string(a.tree[d]);
        step += " (later children right with probability";
        for (const double x : a.siblings) step += " " + std::to_string(x).substr(0, 4);
        step += ")";
    }
    std::printf("batch %zu, prompt %zu tokens (prefilled), %zu new tokens per sequence, temperature 0, %s; "
                "weights made in %.1f s\n",
                a.batch, prompt_length, a.tokens, step.c_str(), r.weights_seconds);
    std::printf("plain:       %zu tokens in %.2f s, %.2f tokens/s (%zu target passes, %.1f ms each)\n", plain_tokens,
                r.plain.seconds, plain_rate, r.plain.passes, 1e3 * target_step);
    std::printf("speculative: %zu tokens in %.2f s, %.2f tokens/s (%zu target passes)\n", spec_tokens, r.spec.seconds,
                spec_rate, r.spec.passes);
    std::printf("measured speedup %.2fx (speculative / plain tokens/s, wall clock, one run each, this machine)\n",
                spec_rate / plain_rate);
    std::printf("tokens per target pass %.2f per sequence (%zu tokens, %zu steps)\n",
                static_cast<double>(spec_tokens) / static_cast<double>(std::max<std::size_t>(1, st.steps)), spec_tokens,
                st.steps);
    if (a.adaptive) {
        std::printf(a.tree.empty() ? "steps by gamma:" : "steps by depth:");
        for (std::size_t g = 0; g < st.steps_at_gamma.size(); ++g)
            if (st.steps_at_gamma[g] != 0) std::printf(" %zu:%zu", g, st.steps_at_gamma[g]);
        std::printf(" (of %zu steps)\n", st.steps);
        std::printf("plan: %s\n", r.spec.explained.c_str());
        if (!a.measure_profile.empty())
            std::printf("planned from the engine profile measured before the runs, saved to %s\n",
                        a.measure_profile.string().c_str());
        else if (!a.profile.empty())
            std::printf("planned from the engine profile %s\n", a.profile.string().c_str());
    }
    std::printf("measured alpha %.3f (accepted/tested draft tokens, %zu/%zu); accepted/drafted %.3f (%zu/%zu) "
                "understates alpha: it also counts the drafts after a rejection, which are never tested\n",
                alpha, st.accepted_tokens, tested, accepted_share, st.accepted_tokens, st.drafted_tokens);
    std::printf("measured c %.3f (one draft-model step %.1f ms / one plain target step %.1f ms)\n", c, 1e3 * draft_step,
                1e3 * target_step);
    if (!a.tree.empty()) {
        std::printf("Leviathan et al. Thm. 3.8 is for chains: no prediction for trees (the tree planner's is in "
                    "docs/adaptive-gamma.md)\n");
        return;
    }
    if (tested == 0 || !(c >= 0.0)) {
        std::printf("Leviathan et al. Thm. 3.8: no prediction (no draft token was tested)\n");
        return;
    }
    // Leviathan, Kalman & Matias 2023, Thm. 3.8: expected walltime improvement
    // (1 − α^{γ+1}) / ((1 − α)(γc + 1)), for i.i.d. acceptance with mean α and a target pass that
    // costs the same over γ + 1 positions as over one. Under --gamma auto, at the best fixed γ
    // for the measured α and c (§3.5).
    const std::size_t gamma = a.adaptive ? specdec::optimal_gamma(alpha, c, a.max_gamma) : a.gamma;
    std::printf("Leviathan et al. Thm. 3.8 at the measured alpha %.3f and c %.3f, gamma %zu%s: expected speedup %.2fx\n",
                alpha, c, gamma, a.adaptive ? " (the best fixed one)" : "",
                specdec::expected_walltime_improvement(alpha, gamma, c));
    // What the theorem leaves out: its target pass over γ + 1 positions costs one plain step.
    // Here, the speculative run's time outside the draft model per target pass.
    const double verify_pass = (r.spec.seconds - r.spec.draft_seconds) /
                               static_cast<double>(std::max<std::size_t>(1, r.spec.passes));
    std::printf("  (it assumes i.i.d. acceptance and a target pass over gamma + 1 positions that costs one plain step; "
                "a pass of the speculative run, with verification, took %.1f ms = %.2f plain steps)\n",
                1e3 * verify_pass, verify_pass / target_step);
}

/// The run's summary for --trace and --stats-json (the same figures print_report prints).
specdec_examples::run_summary summarize(const report& r) {
    const auto& a = r.args;
    const auto& st = r.spec.totals;
    const std::size_t plain_tokens = total_tokens(r.plain.tokens), spec_tokens = total_tokens(r.spec.tokens);
    char label[160];
    std::snprintf(label, sizeof label,
                  "random weights at the stories110M/15M shapes, acceptance controlled at alpha = %.2f "
                  "(not a real draft model)",
                  a.alpha);
    specdec_examples::run_summary s{.tool = "specdec-random-pair",
                                    .target = "random weights, stories110M shape",
                                    .draft = "random weights, stories15M shape, controlled acceptance",
                                    .label = label,
                                    .temperature = 0.0,
                                    .prompt = "(random prompt tokens)",
                                    .sequences = a.batch,
                                    .new_tokens = spec_tokens,
                                    .seconds = r.spec.seconds,
                                    .baseline = specdec_examples::baseline_run{.tokens = plain_tokens, .seconds = r.plain.seconds},
                                    .gamma_max = a.gamma};
    if (r.plain.seconds > 0.0 && r.spec.seconds > 0.0)
        s.speedup = (static_cast<double>(spec_tokens) / r.spec.seconds) / (static_cast<double>(plain_tokens) / r.plain.seconds);
    if (const std::size_t tested = st.accepted_tokens + st.rejected_tokens; tested > 0) {
        s.alpha = st.acceptance_rate();
        s.alpha_positions = tested;
    }
    const double target_step = r.plain.seconds / static_cast<double>(std::max<std::size_t>(1, r.plain.passes));
    if (r.spec.draft_passes > 0 && target_step > 0.0)
        s.cost_ratio = r.spec.draft_seconds / static_cast<double>(r.spec.draft_passes) / target_step;
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    // The draft model's window bounds the tokens: the prompt and every generated token must fit.
    const auto draft_window = static_cast<std::size_t>(llama2::preset_config("stories15M")->seq_len);
    const auto parsed = parse(argc, argv, draft_window - prompt_length);
    if (const int* rc = std::get_if<int>(&parsed)) return *rc;
    report r;
    r.args = std::get<arguments>(parsed);
    const arguments& a = r.args;
    try {
        const auto t0 = std::chrono::steady_clock::now();
        const auto target_weights = random_checkpoint("stories110M", target_seed);
        const auto draft_weights = random_checkpoint("stories15M", draft_seed);
        r.weights_seconds = seconds_since(t0);
        const auto prompts = llama2::random_prompts(a.batch, prompt_length);
        r.plain = decode_plain(target_weights, prompts, a);
        std::optional<specdec::step_recorder> recorder;
        if (!a.trace.empty()) recorder.emplace();
        r.spec = decode_speculative(target_weights, draft_weights, prompts, r.plain.tokens, a,
                                    recorder ? &*recorder : nullptr);
        if (const auto diff = first_difference(r.plain.tokens, r.spec.tokens); !diff.empty()) {
            std::fprintf(stderr,
                         "specdec-random-pair: the speculative output differs from the plain output at temperature 0 "
                         "(%s): speculative decoding must reproduce the target's greedy output\n",
                         diff.c_str());
            return 1;
        }
        print_report(r);
        std::printf("greedy identity: the speculative output equals the plain output token for token (%zu sequence%s)\n",
                    a.batch, a.batch == 1 ? "" : "s");
        if (recorder || !a.stats_json.empty()) {
            const auto summary = summarize(r);
            if (recorder) {
                // No tokenizer for random weights: each token shows as its id.
                const specdec_examples::piece_function piece = [](std::size_t, token_id t) {
                    return " " + std::to_string(t);
                };
                specdec_examples::write_json_file(a.trace, specdec_examples::chrome_trace(*recorder, summary, piece),
                                                  "--trace");
                std::printf("trace written to %s (%zu steps)\n", a.trace.string().c_str(), recorder->steps().size());
            }
            if (!a.stats_json.empty()) {
                specdec_examples::write_json_file(a.stats_json, {{"run", specdec_examples::run_summary_json(summary)}},
                                                  "--stats-json");
                std::printf("statistics written to %s\n", a.stats_json.string().c_str());
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "specdec-random-pair: %s\n", e.what());
        return 1;
    }
    return 0;
}
