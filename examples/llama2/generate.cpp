// specdec-generate: speculative decoding with llama2.c checkpoints, streamed to the terminal.
//
// Tokens are colored as in Figure 1 of Leviathan et al. 2023: accepted draft tokens green,
// the rejected draft token red (it is not part of the output), the target's corrected or
// bonus token blue. Plain text when the output is not a terminal, or with --no-color.
//
//   specdec-generate --models DIR --prompt "Once upon a time" --gamma 4 --temperature 0.8 --compare
//   specdec-generate --models DIR --tree 2,2,1,1 --gamma auto
//   specdec-generate --models DIR --tree-children 3,2,1,0,1
//   specdec-generate --models DIR --draft-temperature 1.2 --draft-stop 0.05   (draft-side options, exact)
//   specdec-generate --models DIR --gamma auto --measure-profile pair.profile   (then --profile pair.profile)
//   specdec-generate --models DIR --compare --trace run.json --stats-json stats.json   (docs/traces.md)
//   specdec-generate --target stories260K.bin --draft llama2xs_tok512_279K.bin --tokenizer tok512.bin ...
//
// Drafters (--drafter): model (the --draft checkpoint, default), early-exit:K (the target's
// first K layers), unigram, bigram (fit on the running context), lookup (prompt lookup),
// lookup+model (prompt lookup, falling back to the draft model), lookup>model (hierarchical: the
// draft model sped up by prompt lookup, Leviathan et al. 2023, §6).

#include "command_line.hpp"
#include "context_limit.hpp"
#include "progress.hpp"
#include "summary.hpp"
#include "text_file.hpp"
#include "tokenizer.hpp"
#include "trace_json.hpp"
#include "transformer.hpp"

#include <specdec/specdec.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unistd.h>
#include <variant>
#include <vector>

namespace {

struct arguments {
    std::filesystem::path target, draft, tokenizer;
    std::string prompt = "Once upon a time";
    std::string drafter = "model";
    // The step (chain or tree) and its length policy are set from --gamma, --max-gamma, --scheme
    // and --tree after parsing.
    specdec::decode_options decode{.budget = {.max_new_tokens = 256, .stop_tokens = {1, 2}}};
    std::uint64_t seed = 42;
    std::size_t max_gamma = 8;
    std::vector<std::size_t> tree;  // --tree: branching per depth (empty: chains)
    std::vector<std::size_t> tree_children;  // --tree-children: each node's children, breadth first
    bool compare = false;
    bool color = isatty(STDOUT_FILENO) != 0;
    std::filesystem::path profile;          // --profile: load the engine profile from this file
    std::filesystem::path measure_profile;  // --measure-profile: measure it, save it here
    std::filesystem::path trace;            // --trace: the streamed run's steps, Chrome trace-event JSON
    std::filesystem::path stats_json;       // --stats-json: the run's statistics as JSON
};

/// Parses the command line; returns the arguments, or the exit status to end with.
std::variant<arguments, int> parse(int argc, char** argv) {
    arguments a;
    std::filesystem::path models;
    if (const char* env = std::getenv("SPECDEC_MODELS_DIR"); env && *env) models = env;
    std::string gamma = "4", scheme = "block";
    float draft_temperature = -1.0f, lenience = 1.0f;
    std::size_t max_tokens = a.decode.budget.max_new_tokens;
    bool no_color = false;

    CLI::App app("Speculative decoding with llama2.c checkpoints, streamed to the terminal: accepted draft "
                 "tokens green, the rejected draft token red, the target's own token blue.",
                 "specdec-generate");
    specdec_examples::command_line_defaults(app);
    app.add_option("--models", models,
                   "folder with stories260K.bin, llama2xs_tok512_279K.bin and tok512.bin "
                   "(default: the SPECDEC_MODELS_DIR environment variable)");
    app.add_option("--target", a.target, "target checkpoint (overrides --models)");
    app.add_option("--draft", a.draft, "draft checkpoint (overrides --models)");
    app.add_option("--tokenizer", a.tokenizer, "tokenizer file (overrides --models)");
    app.add_option("--prompt", a.prompt, "text to continue")->capture_default_str();
    app.add_option("--drafter", a.drafter,
                   "model|early-exit:K|unigram|bigram|lookup|lookup+model|lookup>model (hierarchical: the draft "
                   "model itself decoded speculatively with prompt lookup below it; quote it in a shell)")
        ->capture_default_str()
        ->check(specdec_examples::drafter_validator({"model", "unigram", "bigram", "lookup", "lookup+model", "lookup>model"}));
    app.add_option("--gamma", gamma,
                   "draft length N, or auto: choose each step's draft length from measured acceptance and "
                   "timings, from 0 (a plain target step) to --max-gamma; with --tree, auto plans each step's "
                   "shape within the tree's: a tree, a chain or a plain step (N is unused: the tree's own depth)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto"}) | CLI::TypeValidator<std::size_t>("N"));
    app.add_option("--max-gamma", a.max_gamma, "largest draft length of --gamma auto")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--draft-stop", a.decode.draft.stop_below,
                   "end a draft after a token the draft gives probability below P (in a tree: such a node gets "
                   "no children)")
        ->check(CLI::Range(0.0f, 1.0f));
    app.add_option("--draft-temperature", draft_temperature,
                   "draft-side sampling: the draft samples its proposals at temperature T (with the target's "
                   "top-k and top-p) instead of the target's; exact either way (verification uses the q the "
                   "draft tokens were drawn from)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--lenience", lenience,
                   "lenient verification of chains, L in (0, 1] (token scheme): L < 1 accepts more draft tokens "
                   "and CHANGES the output distribution (no longer the target's; Leviathan et al. App. A.5); "
                   "1, the default, is exact")
        ->capture_default_str()
        ->check(CLI::Range(0.0f, 1.0f));
    app.add_option("--temperature", a.decode.sampling.temperature, "sampling temperature (0: greedy)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--top-k", a.decode.sampling.top_k, "keep the K most probable tokens (0: all)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--top-p", a.decode.sampling.top_p, "nucleus sampling mass, in (0, 1]")
        ->capture_default_str()
        ->check(CLI::Range(0.0f, 1.0f) & CLI::Validator(
                                                [](std::string& v) {
                                                    return std::strtod(v.c_str(), nullptr) > 0.0
                                                               ? std::string()
                                                               : std::string("must be above 0");
                                                },
                                                "> 0"));
    app.add_option("--seed", a.seed, "random seed")->capture_default_str();
    app.add_option("--max-new-tokens", max_tokens, "tokens to generate")->capture_default_str();
    app.add_option("--max-tokens", max_tokens, "old spelling of --max-new-tokens")->group("");
    app.add_option("--scheme", scheme, "verification scheme of chains (trees use traversal verification)")
        ->capture_default_str()
        ->check(CLI::IsMember({"token", "block"}));
    app.add_option("--tree", a.tree,
                   "draft a tree instead of a chain: branching per depth, e.g. 3,2,1,1 (model drafters; "
                   "traversal verification, exact; with --gamma auto each step's shape is planned within it)")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option("--tree-children", a.tree_children,
                   "draft this tree: the children of each node, breadth first, the root first, e.g. 3,2,0,0,1 "
                   "(specdec::tree_shape::from_children; compare-trees prints the best trees of the pair)")
        ->delimiter(',')
        ->excludes("--tree");
    app.add_option("--profile", a.profile,
                   "with --gamma auto: plan every step from this engine profile (written by --measure-profile) "
                   "instead of timing the run, so the same seed gives the same tokens");
    app.add_option("--measure-profile", a.measure_profile,
                   "with --gamma auto: measure the engine profile of this drafter and target first (median "
                   "timings of the real calls), save it to FILE, and plan from it")
        ->excludes("--profile");
    app.add_flag("--compare", a.compare, "also run the autoregressive baseline and time both");
    app.add_option("--trace", a.trace,
                   "write the generation's steps to FILE in the Chrome trace-event format (Perfetto, "
                   "chrome://tracing; scripts/trace_report.py makes a page of charts from it); turns on the "
                   "acceptance estimates it records (the same tokens)");
    app.add_option("--stats-json", a.stats_json, "write the run's statistics to FILE as JSON");
    app.add_flag("--no-color", no_color, "plain text output");
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;

    // --gamma auto: the adaptive policy chooses each step's γ in [0, --max-gamma], or with --tree
    // plans each step's shape within the tree's (a tree, a chain or a plain step).
    const bool adaptive = gamma == "auto";
    a.decode.length.policy = adaptive ? specdec::gamma_policy::adaptive : specdec::gamma_policy::fixed;
    if (!a.tree_children.empty()) {
        specdec::tree_shape shape;
        try {
            shape = specdec::tree_shape::from_children(a.tree_children);
        } catch (const std::invalid_argument& e) {
            std::fprintf(stderr, "specdec-generate: --tree-children: %s\n", e.what());
            return 2;
        }
        a.tree = shape.branching;  // (its widest node per depth: a tree step)
        a.decode.step = specdec::tree{.shape = std::move(shape)};
    } else if (!a.tree.empty()) {
        a.decode.step = specdec::tree{.shape = {.branching = a.tree}};
    } else {
        a.decode.step = specdec::chain{
            .gamma = adaptive ? a.max_gamma : std::stoull(gamma),
            .scheme = scheme == "block" ? specdec::verification_scheme::block : specdec::verification_scheme::token};
    }
    a.decode.budget.max_new_tokens = max_tokens;
    if (draft_temperature >= 0.0f) {
        a.decode.draft.sampling = a.decode.sampling;
        a.decode.draft.sampling->temperature = draft_temperature;
    }
    if (lenience != 1.0f) {
        auto* c = std::get_if<specdec::chain>(&a.decode.step);
        if (c == nullptr || scheme != "token" || lenience <= 0.0f) {
            std::fputs("specdec-generate: --lenience L needs chains with --scheme token and 0 < L <= 1\n"
                       "Run with --help for more information.\n",
                       stderr);
            return 2;
        }
        c->lenience = lenience;
    }
    if (!a.trace.empty()) {
        // A trace carries β per tested chain position and the sibling acceptance at each tree
        // root: estimated only on request (a standardization per tested row; the tokens are
        // the same).
        if (auto* c = std::get_if<specdec::chain>(&a.decode.step)) c->estimate_acceptance = true;
        if (auto* t = std::get_if<specdec::tree>(&a.decode.step)) t->estimate_sibling_acceptance = true;
    }
    if (no_color) a.color = false;
    if ((!a.profile.empty() || !a.measure_profile.empty()) && !adaptive) {
        std::fputs("specdec-generate: --profile and --measure-profile plan the steps of --gamma auto; add --gamma auto\n"
                   "Run with --help for more information.\n",
                   stderr);
        return 2;
    }
    if (!models.empty()) {
        if (a.target.empty()) a.target = models / "stories260K.bin";
        if (a.draft.empty()) a.draft = models / "llama2xs_tok512_279K.bin";
        if (a.tokenizer.empty()) a.tokenizer = models / "tok512.bin";
    }
    if (a.target.empty() || a.tokenizer.empty()) {
        std::fputs("specdec-generate: no model: pass --models DIR (or set SPECDEC_MODELS_DIR), or --target and "
                   "--tokenizer; scripts/download_models.sh DIR fetches the files\n"
                   "Run with --help for more information.\n",
                   stderr);
        return 2;
    }
    return a;
}

constexpr const char* green = "\x1b[32m";
constexpr const char* red = "\x1b[31m";
constexpr const char* blue = "\x1b[34m";
constexpr const char* reset = "\x1b[0m";

/// Prints tokens as they are produced, tracking the previous token for decoding.
class streamer {
public:
    streamer(const llama2::tokenizer& tok, bool color, specdec::token_id last_prompt_token)
        : tok_(tok), color_(color), prev_(last_prompt_token) {}

    void text(specdec::token_id t, const char* c) {
        if (t == llama2::tokenizer::bos_id || t == llama2::tokenizer::eos_id) return;
        const std::string s = tok_.decode(prev_, t);
        if (color_) std::cout << c << s << reset;
        else std::cout << s;
        prev_ = t;
    }
    /// A rejected draft token: shown in color only, and not part of the text.
    void rejected(specdec::token_id t) {
        if (!color_ || t == llama2::tokenizer::bos_id || t == llama2::tokenizer::eos_id) return;
        std::cout << red << tok_.decode(prev_, t) << reset;
    }
    void operator()(const specdec::step_event& e) {
        for (std::size_t i = 0; i < e.emitted.size(); ++i) {
            const bool drafted = i < e.accepted;
            if (!drafted && e.accepted < e.draft.size()) rejected(e.draft[e.accepted]);
            text(e.emitted[i], drafted ? green : blue);
        }
        std::cout.flush();
    }

private:
    const llama2::tokenizer& tok_;
    bool color_;
    specdec::token_id prev_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// What a run measured: the streamed generation, and with --compare the timed runs.
struct run_outcome {
    specdec::decode_result result;
    /// The adaptive policy's controller of the streamed run (its estimates explain its choices).
    std::optional<specdec::gamma_controller> controller;
    double streamed_seconds = 0;
    specdec::decode_result baseline;
    std::vector<double> spec_rates, base_rates;  // tokens/s of each timed run
    std::string profile_note;  // where the adaptive policy's costs came from, when from a profile
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

/// The streamed generation; then, with --compare, `compare_runs` timed runs of speculative
/// and autoregressive decoding, interleaved, with fresh KV caches and no printing (the same
/// seed, so each repeats the streamed text).
template <class D>
run_outcome run(D& drafter, llama2::transformer& target, llama2::transformer* draft_model,
                const std::vector<specdec::token_id>& prompt, const arguments& a, streamer& out,
                specdec::step_recorder* trace) {
    constexpr int compare_runs = 5;
    run_outcome o;
    auto opts = a.decode;
    if (trace)
        opts.on_step = [&out, trace](const specdec::step_event& e) {
            out(e);
            trace->record(e);
        };
    else
        opts.on_step = std::ref(out);
    if (opts.length.policy == specdec::gamma_policy::adaptive && !a.measure_profile.empty()) {
        // Measured once, before decoding, through the same calls a step makes; saved for
        // --profile. Up to the most positions a step's pass holds: a chain's draft or a tree's
        // nodes, and the bonus position.
        const auto* t = std::get_if<specdec::tree>(&opts.step);
        const std::size_t longest = t ? t->shape.nodes() : std::get<specdec::chain>(opts.step).gamma;
        const specdec::profile_measurement how{.max_positions = longest + 1, .sampling = opts.sampling, .seed = a.seed};
        specdec::engine_profile p;
        if constexpr (specdec::Drafter<D>) p = specdec::measure_engine_profile(drafter, target, prompt, how);
        else p = specdec::measure_engine_profile(*draft_model, target, prompt, how);  // a tree drafter: its model
        llama2::write_text_file(a.measure_profile, specdec::to_text(p));
        opts.length.adaptive.profile = p;
        o.profile_note = "profile measured and saved to " + a.measure_profile.string();
    } else if (opts.length.policy == specdec::gamma_policy::adaptive && !a.profile.empty()) {
        const std::string text = llama2::read_text_file(a.profile, "--profile");  // (its errors name the option)
        try {
            opts.length.adaptive.profile = specdec::parse_engine_profile(text);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument("--profile " + a.profile.string() + ": " + e.what());
        }
        o.profile_note = "planned from the profile " + a.profile.string();
    }
    if (opts.length.policy == specdec::gamma_policy::adaptive) {
        // The streamed run's controller, made as speculative_decode makes its own, kept for the
        // summary.
        opts.length.controller = &o.controller.emplace(specdec::make_controller(opts));
    }
    std::mt19937_64 rng(a.seed);
    const auto t0 = std::chrono::steady_clock::now();
    o.result = specdec::speculative_decode(drafter, target, prompt, opts, rng);
    o.streamed_seconds = seconds_since(t0);
    if (!a.compare) return o;
    opts.on_step = nullptr;
    opts.length.controller = nullptr;  // each timed run with a fresh one, as the streamed run had
    specdec_examples::progress_line progress;  // on a terminal only; never inside a timed run
    for (int r = 0; r < compare_runs; ++r) {
        progress.show(true, "timing: run %d/%d (speculative, then autoregressive)", r + 1, compare_runs);
        target.clear_cache();
        if (draft_model) draft_model->clear_cache();
        std::mt19937_64 spec_rng(a.seed);
        const auto t1 = std::chrono::steady_clock::now();
        const auto spec = specdec::speculative_decode(drafter, target, prompt, opts, spec_rng);
        o.spec_rates.push_back(static_cast<double>(spec.tokens.size()) / seconds_since(t1));
        target.clear_cache();
        std::mt19937_64 base_rng(a.seed);
        const auto t2 = std::chrono::steady_clock::now();
        o.baseline = specdec::autoregressive_decode(target, prompt, opts, base_rng);
        o.base_rates.push_back(static_cast<double>(o.baseline.tokens.size()) / seconds_since(t2));
    }
    progress.clear();
    return o;
}

/// The run's summary for --trace and --stats-json: α from the β estimates when the run made
/// them, else from the acceptance tests; c from the draft calls' recorded time against a plain
/// target step (the baseline's, with --compare; else the run's own plain steps, if any).
specdec_examples::run_summary summarize(const arguments& a, const run_outcome& o, const specdec::step_recorder* trace) {
    const auto& st = o.result.stats;
    specdec_examples::run_summary r{.tool = "specdec-generate",
                                    .target = a.target.filename().string(),
                                    .draft = a.drafter == "model" ? a.draft.filename().string() : a.drafter,
                                    .temperature = static_cast<double>(a.decode.sampling.temperature),
                                    .seed = a.seed,
                                    .prompt = a.prompt,
                                    .new_tokens = o.result.tokens.size(),
                                    .seconds = o.streamed_seconds};
    if (const auto* c = std::get_if<specdec::chain>(&a.decode.step)) r.gamma_max = c->gamma;
    else r.gamma_max = std::get<specdec::tree>(a.decode.step).shape.depth();
    if (const std::size_t n = llama2::estimated_positions(st); n > 0) {
        r.alpha = st.estimated_acceptance();
        r.alpha_positions = n;
    } else if (const std::size_t m = llama2::tested_positions(st); m > 0) {
        r.alpha = st.acceptance_rate();
        r.alpha_positions = m;
    }
    double plain_step = 0.0;
    if (a.compare) {
        const double spec_rate = median(o.spec_rates), base_rate = median(o.base_rates);
        if (base_rate > 0.0) {
            r.baseline = specdec_examples::baseline_run{
                .tokens = o.baseline.tokens.size(),
                .seconds = static_cast<double>(o.baseline.tokens.size()) / base_rate};
            r.speedup = spec_rate / base_rate;
            plain_step = 1.0 / base_rate;
        }
    }
    if (trace) {
        double draft = 0.0, plain = 0.0;
        std::size_t plain_steps = 0;
        for (const auto& s : trace->steps()) {
            draft += s.draft_seconds;
            if (s.kind == specdec::step_kind::plain) {
                plain += s.target_seconds;
                ++plain_steps;
            }
        }
        if (plain_step == 0.0 && plain_steps > 0) plain_step = plain / static_cast<double>(plain_steps);
        if (plain_step > 0.0 && st.draft_calls > 0 && draft > 0.0)
            r.cost_ratio = draft / static_cast<double>(st.draft_calls) / plain_step;
    }
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    const auto parsed = parse(argc, argv);
    if (const int* rc = std::get_if<int>(&parsed)) return *rc;
    const arguments& a = std::get<arguments>(parsed);
    try {
        llama2::transformer target(a.target);
        const llama2::tokenizer tok(a.tokenizer, static_cast<std::int32_t>(target.vocab_size()));
        const std::vector<specdec::token_id> prompt = tok.encode(a.prompt, true, false);
        if (a.decode.budget.max_new_tokens + prompt.size() > static_cast<std::size_t>(target.max_context()))
            throw std::invalid_argument("--max-new-tokens " + std::to_string(a.decode.budget.max_new_tokens) +
                                        " plus the prompt's " +
                                        std::to_string(prompt.size()) + " tokens exceed the target's context of " +
                                        std::to_string(target.max_context()));

        std::optional<llama2::transformer> draft_model;
        if (a.drafter == "model" || a.drafter == "lookup+model" || a.drafter == "lookup>model") {
            if (a.draft.empty()) throw std::invalid_argument("--drafter " + a.drafter + " needs --draft");
            draft_model.emplace(a.draft);
        } else if (a.drafter.rfind("early-exit:", 0) == 0) {
            draft_model.emplace(target.early_exit(std::stoi(a.drafter.substr(11))));
        }

        std::cout << a.prompt;
        streamer out(tok, a.color, prompt.back());
        std::optional<specdec::step_recorder> recorder;
        if (!a.trace.empty()) recorder.emplace();
        specdec::step_recorder* trace = recorder ? &*recorder : nullptr;
        run_outcome outcome;
        const auto vocab = target.vocab_size();
        if (!a.tree.empty()) {
            if (!draft_model || a.drafter == "lookup+model")
                throw std::invalid_argument("--tree needs a model drafter: --drafter model or early-exit:K");
            // The draft model's trees, cut to fit both models' windows; one score_tree pass per step.
            llama2::context_limited_tree_drafter<llama2::transformer> d(
                *draft_model, static_cast<std::size_t>(target.max_context()));
            outcome = run(d, target, &*draft_model, prompt, a, out, trace);
        } else if (a.drafter == "model" || a.drafter.rfind("early-exit:", 0) == 0) {
            llama2::context_limited_drafter<llama2::transformer> d(*draft_model);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out, trace);
        } else if (a.drafter == "unigram" || a.drafter == "bigram") {
            specdec::ngram_model d(vocab, a.drafter == "unigram" ? 1 : 2);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out, trace);
        } else if (a.drafter == "lookup") {
            specdec::prompt_lookup_drafter d(vocab);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out, trace);
        } else if (a.drafter == "lookup+model") {
            specdec::prompt_lookup_drafter lookup(vocab);
            llama2::context_limited_drafter<llama2::transformer> model(*draft_model);
            specdec::fallback_drafter d(lookup, model);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out, trace);
        } else if (a.drafter == "lookup>model") {
            // The draft model decoded by speculative decoding with prompt lookup proposing for it
            // (inner γ = 4), within the draft model's window (its inner loop scores 3 tokens past
            // the block at most).
            constexpr std::size_t inner_gamma = 4;
            specdec::prompt_lookup_drafter lookup(vocab);
            specdec::hierarchical_drafter layered(lookup, *draft_model, {.gamma = inner_gamma});
            llama2::window_limited_drafter d(layered, static_cast<std::size_t>(draft_model->max_context()),
                                             inner_gamma - 1);
            outcome = run(d, target, &*draft_model, prompt, a, out, trace);
        } else {
            throw std::invalid_argument("unknown drafter " + a.drafter);
        }
        const auto& result = outcome.result;
        const auto& st = result.stats;
        std::cout << "\n\n";
        const bool adaptive = a.decode.length.policy == specdec::gamma_policy::adaptive;
        if (const auto* t = std::get_if<specdec::tree>(&a.decode.step)) {
            std::printf("drafter %s, tree", a.drafter.c_str());
            if (!a.tree_children.empty()) std::printf(" of children");
            const auto& listed = a.tree_children.empty() ? a.tree : a.tree_children;
            for (std::size_t i = 0; i < listed.size(); ++i) std::printf("%s%zu", i ? "," : " ", listed[i]);
            std::printf(" (%zu nodes)%s, traversal verification, temperature %g\n", t->shape.nodes(),
                        adaptive ? ", shape planned per step" : "", static_cast<double>(a.decode.sampling.temperature));
        } else {
            const auto& c = std::get<specdec::chain>(a.decode.step);
            std::printf("drafter %s, gamma %s%zu, %s verification, temperature %g\n", a.drafter.c_str(),
                        adaptive ? "auto, at most " : "", c.gamma,
                        c.scheme == specdec::verification_scheme::block ? "block" : "token",
                        static_cast<double>(a.decode.sampling.temperature));
            if (c.lenience < 1.0f)
                std::printf("lenience %g: NOT the target's distribution (more draft tokens accepted)\n",
                            static_cast<double>(c.lenience));
        }
        if (a.decode.draft.sampling)
            std::printf("draft-side sampling at temperature %g (exact)\n",
                        static_cast<double>(a.decode.draft.sampling->temperature));
        if (a.decode.draft.stop_below > 0.0f)
            std::printf("draft-side stop below q = %g (exact)\n", static_cast<double>(a.decode.draft.stop_below));
        if (adaptive) {
            // The chosen γ's (or tree depth's) distribution over the steps, for chains the β-based
            // estimate of α, and why speculation stayed off when it mostly did.
            const bool tree = !a.tree.empty();
            std::printf("steps by %s:", tree ? "depth" : "gamma");
            for (std::size_t g = 0; g < st.steps_at_gamma.size(); ++g)
                if (st.steps_at_gamma[g] != 0) std::printf(" %zu:%zu", g, st.steps_at_gamma[g]);
            std::printf(" (of %zu steps)", st.steps);
            if (!tree)
                std::printf("; estimated alpha %s",
                            llama2::alpha_text(st.estimated_acceptance(), llama2::estimated_positions(st)).c_str());
            std::printf("\n");
            if (outcome.controller) {
                if (!outcome.controller->plans_trees())  // (a tree planner's line below says it)
                    if (const auto why = llama2::speculation_off_reason(st, *outcome.controller))
                        std::printf("%s\n", why->c_str());
                // What the policy would choose now, and why, from its final estimates.
                std::printf("plan: %s\n", outcome.controller->explain().c_str());
            }
            std::printf("%s\n", outcome.profile_note.empty()
                                    ? "costs timed during the run: the plan depends on timings, so a seed need not "
                                      "repeat the tokens (--measure-profile FILE, then --profile FILE, makes runs "
                                      "reproducible)"
                                    : (outcome.profile_note + ": the same seed gives the same tokens").c_str());
        }
        std::printf("tokens %zu, target calls %zu, tokens per target call %.2f, measured alpha %s, %.0f tokens/s "
                    "(streamed)\n",
                    result.tokens.size(), st.target_calls,
                    static_cast<double>(result.tokens.size()) / static_cast<double>(std::max<std::size_t>(1, st.target_calls)),
                    llama2::alpha_text(st.acceptance_rate(), llama2::tested_positions(st)).c_str(),
                    static_cast<double>(result.tokens.size()) / outcome.streamed_seconds);
        if (a.compare) {
            const double spec_rate = median(outcome.spec_rates), base_rate = median(outcome.base_rates);
            std::printf("autoregressive: tokens %zu, target calls %zu\n", outcome.baseline.tokens.size(),
                        outcome.baseline.stats.target_calls);
            std::printf("timed without printing, median of %zu interleaved runs: speculative %.0f tokens/s, "
                        "autoregressive %.0f tokens/s; speedup %.2fx\n",
                        outcome.spec_rates.size(), spec_rate, base_rate, spec_rate / base_rate);
        }
        if (!a.trace.empty() || !a.stats_json.empty()) {
            const auto run = summarize(a, outcome, recorder ? &*recorder : nullptr);
            if (recorder) {
                specdec::token_id prev = prompt.back();  // one sequence: decode in output order
                const specdec_examples::piece_function piece = [&](std::size_t, specdec::token_id t) {
                    if (t == llama2::tokenizer::bos_id || t == llama2::tokenizer::eos_id) return std::string();
                    std::string text = tok.decode(prev, t);
                    prev = t;
                    return text;
                };
                specdec_examples::write_json_file(a.trace, specdec_examples::chrome_trace(*recorder, run, piece), "--trace");
                std::printf("trace written to %s (%zu steps; python3 scripts/trace_report.py %s makes its report)\n",
                            a.trace.string().c_str(), recorder->steps().size(), a.trace.string().c_str());
            }
            if (!a.stats_json.empty()) {
                nlohmann::json j = {{"stats", specdec_examples::stats_json(st)}};
                if (a.compare) j["baseline_stats"] = specdec_examples::stats_json(outcome.baseline.stats);
                j["run"] = specdec_examples::run_summary_json(run);
                specdec_examples::write_json_file(a.stats_json, j, "--stats-json");
                std::printf("statistics written to %s\n", a.stats_json.string().c_str());
            }
        }
    } catch (const std::exception& e) {
        std::cout.flush();
        std::fprintf(stderr, "\nspecdec-generate: %s\n", e.what());
        return 1;
    }
    return 0;
}
