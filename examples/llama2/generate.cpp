// specdec-generate: speculative decoding with llama2.c checkpoints, streamed to the terminal.
//
// Tokens are colored as in Figure 1 of Leviathan et al. 2023: accepted draft tokens green,
// the rejected draft token red (it is not part of the output), the target's corrected or
// bonus token blue. Plain text when the output is not a terminal, or with --no-color.
//
//   specdec-generate --models DIR --prompt "Once upon a time" --gamma 4 --temperature 0.8 --compare
//   specdec-generate --target stories260K.bin --draft llama2xs_tok512_279K.bin --tokenizer tok512.bin ...
//
// Drafters (--drafter): model (the --draft checkpoint, default), early-exit:K (the target's
// first K layers), unigram, bigram (fit on the running context), lookup (prompt lookup),
// lookup+model (prompt lookup, falling back to the draft model).

#include "context_limit.hpp"
#include "tokenizer.hpp"
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
#include <vector>

namespace {

struct arguments {
    std::filesystem::path target, draft, tokenizer;
    std::string prompt = "Once upon a time";
    std::string drafter = "model";
    specdec::decode_options decode{.gamma = 4, .max_new_tokens = 256, .stop_tokens = {1, 2}};
    std::uint64_t seed = 42;
    std::size_t max_gamma = 8;
    bool compare = false;
    bool color = isatty(STDOUT_FILENO) != 0;
};

[[noreturn]] void usage(const char* problem = nullptr) {
    if (problem) std::fprintf(stderr, "specdec-generate: %s\n\n", problem);
    std::fputs(
        "usage: specdec-generate [--models DIR | --target T.bin --draft D.bin --tokenizer TOK.bin]\n"
        "         [--prompt TEXT] [--gamma N|auto] [--max-gamma N] [--draft-stop P] [--temperature T]\n"
        "         [--top-k K] [--top-p P] [--seed S] [--max-tokens N] [--scheme token|block]\n"
        "         [--compare] [--no-color] [--drafter model|early-exit:K|unigram|bigram|lookup|lookup+model]\n"
        "  --gamma auto   choose each step's draft length from measured acceptance and timings,\n"
        "                 from 0 (a plain target step) to --max-gamma (default 8)\n"
        "  --draft-stop P end a draft after a token the draft gives probability below P\n"
        "  --models DIR   folder with stories260K.bin, llama2xs_tok512_279K.bin and tok512.bin\n"
        "                 (default: the SPECDEC_MODELS_DIR environment variable)\n",
        stderr);
    std::exit(2);
}

arguments parse(int argc, char** argv) {
    arguments a;
    std::filesystem::path models;
    if (const char* env = std::getenv("SPECDEC_MODELS_DIR"); env && *env) models = env;
    auto value = [&](int& i) -> std::string {
        if (i + 1 >= argc) usage((std::string("missing value for ") + argv[i]).c_str());
        return argv[++i];
    };
    auto number = [&](int& i, auto parse_fn) {
        const std::string flag = argv[i], v = value(i);
        try {
            std::size_t used = 0;
            auto x = parse_fn(v, &used);
            if (used != v.size()) throw std::invalid_argument(v);
            return x;
        } catch (const std::exception&) {
            usage((flag + ": not a number: " + v).c_str());
        }
    };
    auto to_ull = [](const std::string& s, std::size_t* used) { return std::stoull(s, used); };
    auto to_f = [](const std::string& s, std::size_t* used) { return std::stof(s, used); };
    for (int i = 1; i < argc; ++i) {
        const std::string_view f = argv[i];
        if (f == "--models") models = value(i);
        else if (f == "--target") a.target = value(i);
        else if (f == "--draft") a.draft = value(i);
        else if (f == "--tokenizer") a.tokenizer = value(i);
        else if (f == "--prompt") a.prompt = value(i);
        else if (f == "--drafter") a.drafter = value(i);
        else if (f == "--gamma") {
            // "auto": the adaptive policy, choosing each step's γ in [0, --max-gamma].
            if (i + 1 < argc && std::string_view(argv[i + 1]) == "auto") {
                ++i;
                a.decode.policy = specdec::gamma_policy::adaptive;
                a.decode.gamma = a.max_gamma;
            } else {
                a.decode.policy = specdec::gamma_policy::fixed;
                a.decode.gamma = number(i, to_ull);
            }
        } else if (f == "--max-gamma") a.max_gamma = number(i, to_ull);
        else if (f == "--draft-stop") a.decode.draft_stop_below = number(i, to_f);
        else if (f == "--temperature") a.decode.sampling.temperature = number(i, to_f);
        else if (f == "--top-k") a.decode.sampling.top_k = static_cast<int>(number(i, to_ull));
        else if (f == "--top-p") a.decode.sampling.top_p = number(i, to_f);
        else if (f == "--seed") a.seed = number(i, to_ull);
        else if (f == "--max-tokens") a.decode.max_new_tokens = number(i, to_ull);
        else if (f == "--scheme") {
            const std::string s = value(i);
            if (s == "token") a.decode.scheme = specdec::verification_scheme::token;
            else if (s == "block") a.decode.scheme = specdec::verification_scheme::block;
            else usage("--scheme must be token or block");
        } else if (f == "--compare") a.compare = true;
        else if (f == "--no-color") a.color = false;
        else if (f == "--help" || f == "-h") usage();
        else usage((std::string("unknown option ") + argv[i]).c_str());
    }
    if (a.decode.policy == specdec::gamma_policy::adaptive) a.decode.gamma = a.max_gamma;
    if (!models.empty()) {
        if (a.target.empty()) a.target = models / "stories260K.bin";
        if (a.draft.empty()) a.draft = models / "llama2xs_tok512_279K.bin";
        if (a.tokenizer.empty()) a.tokenizer = models / "tok512.bin";
    }
    if (a.target.empty() || a.tokenizer.empty())
        usage("no model: pass --models DIR (or set SPECDEC_MODELS_DIR), or --target and --tokenizer");
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
    double streamed_seconds = 0;
    specdec::decode_result baseline;
    std::vector<double> spec_rates, base_rates;  // tokens/s of each timed run
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
                const std::vector<specdec::token_id>& prompt, const arguments& a, streamer& out) {
    constexpr int compare_runs = 5;
    run_outcome o;
    auto opts = a.decode;
    opts.on_step = std::ref(out);
    std::mt19937_64 rng(a.seed);
    const auto t0 = std::chrono::steady_clock::now();
    o.result = specdec::speculative_decode(drafter, target, prompt, opts, rng);
    o.streamed_seconds = seconds_since(t0);
    if (!a.compare) return o;
    opts.on_step = nullptr;
    for (int r = 0; r < compare_runs; ++r) {
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
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const arguments a = parse(argc, argv);
    try {
        llama2::transformer target(a.target);
        const llama2::tokenizer tok(a.tokenizer, static_cast<std::int32_t>(target.vocab_size()));
        const std::vector<specdec::token_id> prompt = tok.encode(a.prompt, true, false);
        if (a.decode.max_new_tokens + prompt.size() > static_cast<std::size_t>(target.max_context()))
            throw std::invalid_argument("--max-tokens " + std::to_string(a.decode.max_new_tokens) + " plus the prompt's " +
                                        std::to_string(prompt.size()) + " tokens exceed the target's context of " +
                                        std::to_string(target.max_context()));

        std::optional<llama2::transformer> draft_model;
        if (a.drafter == "model" || a.drafter == "lookup+model") {
            if (a.draft.empty()) throw std::invalid_argument("--drafter " + a.drafter + " needs --draft");
            draft_model.emplace(a.draft);
        } else if (a.drafter.rfind("early-exit:", 0) == 0) {
            draft_model.emplace(target.early_exit(std::stoi(a.drafter.substr(11))));
        }

        std::cout << a.prompt;
        streamer out(tok, a.color, prompt.back());
        run_outcome outcome;
        const auto vocab = target.vocab_size();
        if (a.drafter == "model" || a.drafter.rfind("early-exit:", 0) == 0) {
            llama2::context_limited_drafter<llama2::transformer> d(*draft_model);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out);
        } else if (a.drafter == "unigram" || a.drafter == "bigram") {
            specdec::ngram_model d(vocab, a.drafter == "unigram" ? 1 : 2);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out);
        } else if (a.drafter == "lookup") {
            specdec::prompt_lookup_drafter d(vocab);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out);
        } else if (a.drafter == "lookup+model") {
            specdec::prompt_lookup_drafter lookup(vocab);
            llama2::context_limited_drafter<llama2::transformer> model(*draft_model);
            specdec::fallback_drafter d(lookup, model);
            outcome = run(d, target, draft_model ? &*draft_model : nullptr, prompt, a, out);
        } else {
            usage(("unknown drafter " + a.drafter).c_str());
        }
        const auto& result = outcome.result;
        const auto& st = result.stats;
        std::cout << "\n\n";
        const bool adaptive = a.decode.policy == specdec::gamma_policy::adaptive;
        std::printf("drafter %s, gamma %s%zu, %s verification, temperature %g\n", a.drafter.c_str(),
                    adaptive ? "auto, at most " : "", a.decode.gamma,
                    a.decode.scheme == specdec::verification_scheme::block ? "block" : "token",
                    static_cast<double>(a.decode.sampling.temperature));
        if (adaptive) {
            // The chosen γ's distribution over the steps, and the β-based estimate of α.
            std::printf("steps by gamma:");
            for (std::size_t g = 0; g < st.steps_at_gamma.size(); ++g)
                if (st.steps_at_gamma[g] != 0) std::printf(" %zu:%zu", g, st.steps_at_gamma[g]);
            std::printf(" (of %zu steps); estimated alpha %.3f\n", st.steps, st.estimated_acceptance());
        }
        std::printf("tokens %zu, target calls %zu, tokens per target call %.2f, measured alpha %.3f, %.0f tokens/s "
                    "(streamed)\n",
                    result.tokens.size(), st.target_calls,
                    static_cast<double>(result.tokens.size()) / static_cast<double>(std::max<std::size_t>(1, st.target_calls)),
                    st.acceptance_rate(), static_cast<double>(result.tokens.size()) / outcome.streamed_seconds);
        if (a.compare) {
            const double spec_rate = median(outcome.spec_rates), base_rate = median(outcome.base_rates);
            std::printf("autoregressive: tokens %zu, target calls %zu\n", outcome.baseline.tokens.size(),
                        outcome.baseline.stats.target_calls);
            std::printf("timed without printing, median of %zu interleaved runs: speculative %.0f tokens/s, "
                        "autoregressive %.0f tokens/s; speedup %.2fx\n",
                        outcome.spec_rates.size(), spec_rate, base_rate, spec_rate / base_rate);
        }
    } catch (const std::exception& e) {
        std::cout.flush();
        std::fprintf(stderr, "\nspecdec-generate: %s\n", e.what());
        return 1;
    }
    return 0;
}
