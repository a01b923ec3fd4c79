// specdec-conformance: runs the conformance kit (specdec/testing.hpp) on llama2.c checkpoints,
// as a model of how to wire it to an engine of your own. Exits 0 when every check passes, 1 when
// one fails, 2 for a usage error.
//
//   specdec-conformance --models DIR
//   specdec-conformance --target stories260K.bin --draft llama2xs_tok512_279K.bin --tokenizer tok512.bin
//   specdec-conformance --models DIR --drafter early-exit:2 --samples 20000
//   specdec-conformance --models DIR --thorough   (16x the draft blocks, 8x the sequences)
//   specdec-conformance --models DIR --power      (measures what the equivalence check detects)
//   specdec-conformance --models DIR --power-draft [--thorough]   (what the draft check detects)
//   specdec-conformance --models DIR --max-context 200 --min-acceptance 0.5
//
// Checks: the engine's contract (score() against a fresh engine's next_logits, after rollbacks,
// on copies), for the target and the draft model; draft consistency; determinism; and the law
// of the first --length tokens of speculative decoding against plain sampling from the target,
// under token and block verification, at temperature 1 and at 0.6 with top-k 40.

#include "command_line.hpp"
#include "context_limit.hpp"
#include "tokenizer.hpp"
#include "batch_transformer.hpp"
#include "transformer.hpp"

#include <specdec/specdec.hpp>
#include <specdec/testing.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace {

struct arguments {
    std::filesystem::path target, draft, tokenizer;
    std::string prompt = "Once upon a time";
    std::string drafter = "model";
    specdec::testing::conformance_options kit{};
    bool power = false, power_draft = false, thorough = false;
    std::size_t power_runs = 20;
    std::vector<double> power_distances;  // --power-distances (empty: each measurement's own list)
    std::vector<std::size_t> tree;  // --tree: branching per depth (empty: chains)
    std::size_t batch = 0;          // --batch: sequences per pass of the multi-sequence contract (0: off)
    double min_acceptance = 0.0;    // --min-acceptance: fail below this measured acceptance
};

/// Parses the command line; returns the arguments, or the exit status to end with.
std::variant<arguments, int> parse(int argc, char** argv) {
    arguments a;
    std::filesystem::path models;
    if (const char* env = std::getenv("SPECDEC_MODELS_DIR"); env && *env) models = env;
    std::string scheme = "both";
    auto& k = a.kit;

    CLI::App app("Runs the conformance kit (specdec/testing.hpp) on llama2.c checkpoints: the engine's contract, "
                 "draft consistency, determinism, and the law of speculative decoding's first tokens against "
                 "plain sampling from the target. Exit status 0: every check passed; 1: a check failed.",
                 "specdec-conformance");
    specdec_examples::command_line_defaults(app);
    app.add_option("--models", models,
                   "folder with stories260K.bin, llama2xs_tok512_279K.bin and tok512.bin "
                   "(default: the SPECDEC_MODELS_DIR environment variable)");
    app.add_option("--target", a.target, "target checkpoint (overrides --models)");
    app.add_option("--draft", a.draft, "draft checkpoint (overrides --models)");
    app.add_option("--tokenizer", a.tokenizer, "tokenizer file (overrides --models; without one the prompt is BOS)");
    app.add_option("--prompt", a.prompt, "text the generated sequences continue")->capture_default_str();
    app.add_option("--drafter", a.drafter, "model|early-exit:K|bigram|lookup|lookup+model")
        ->capture_default_str()
        ->check(specdec_examples::drafter_validator({"model", "bigram", "lookup", "lookup+model"}));
    app.add_option("--gamma", k.gamma, "draft length")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--length", k.length, "the law of the first N generated tokens is tested")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--samples", k.samples, "sequences per scheme and sampling config")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--draft-blocks", k.draft_blocks, "draft blocks per sampling config (draft consistency)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--significance", k.significance, "false-alarm rate of each statistical test")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--tolerance", k.tolerance, "largest total variation between a score column and a fresh "
                                               "engine's logits")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--max-context", k.max_context,
                   "longest context (prompt included) the contract and draft checks build: raise it to check "
                   "caches that break past a length (at most the models' window)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--min-acceptance", a.min_acceptance,
                   "fail when the fraction of drafted tokens the target accepts in the equivalence runs is "
                   "below this (0: report it only); exactness does not depend on it, speed does")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--scheme", scheme, "verification schemes to test")
        ->capture_default_str()
        ->check(CLI::IsMember({"token", "block", "both"}));
    app.add_option("--seed", k.seed, "seed of the checks")->capture_default_str();
    app.add_option("--tree", a.tree,
                   "decode with draft trees of this branching per depth, e.g. 2,2,1,1 (the decoding checks run "
                   "with a tree step; with --drafter model or early-exit:K the trees branch; the target's "
                   "score_tree is checked by the contract)")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option("--batch", a.batch,
                   "also check the llama2 batch engine's score_batch, score_tree_batch and draft_batch (target "
                   "and draft) with up to N sequences per pass, against each sequence scored alone")
        ->check(CLI::PositiveNumber);
    app.add_flag("--power", a.power,
                 "instead of the checks: how often the equivalence test (token verification, temperature 1) "
                 "detects first-token laws at known total-variation distances");
    app.add_flag("--power-draft", a.power_draft,
                 "instead of the checks: how often the draft check (temperature 1) detects a drafter that samples "
                 "after moving a fraction of q's mass from its likeliest token to the second (reporting q)");
    app.add_option("--power-runs", a.power_runs, "runs per distance of --power and --power-draft")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--power-distances", a.power_distances,
                   "the distances --power (total variation) or --power-draft (mass moved) measures, e.g. "
                   "0,0.01,0.02")
        ->delimiter(',')
        ->check(CLI::Range(0.0, 1.0));
    app.add_flag("--thorough", a.thorough,
                 "the thorough budget (specdec::testing::thorough): 16x the draft blocks, 8x the sequences, 4x the "
                 "contexts of the defaults (or more, where set higher)");
    if (auto rc = specdec_examples::parse_command_line(app, argc, argv)) return *rc;

    if (a.thorough) k = specdec::testing::thorough(k);
    if (!a.tree.empty()) k.decode.step = specdec::tree{.shape = {.branching = a.tree}};
    if (a.batch > 0) k.batch = a.batch;
    if (scheme == "token") k.schemes = {specdec::verification_scheme::token};
    if (scheme == "block") k.schemes = {specdec::verification_scheme::block};
    if (!models.empty()) {
        if (a.target.empty()) a.target = models / "stories260K.bin";
        if (a.draft.empty()) a.draft = models / "llama2xs_tok512_279K.bin";
        if (a.tokenizer.empty()) a.tokenizer = models / "tok512.bin";
    }
    if (a.target.empty()) {
        std::fputs("specdec-conformance: no model: pass --models DIR (or set SPECDEC_MODELS_DIR), or --target "
                   "(and --draft, --tokenizer); scripts/download_models.sh DIR fetches the files\n"
                   "Run with --help for more information.\n",
                   stderr);
        return 2;
    }
    return a;
}

/// A target whose first generated token follows a perturbed law: score() moves total variation
/// `tv` of the first token's distribution (temperature 1) onto token `to`; every other row, and
/// next_logits (which plain sampling reads), are the engine's. Speculative decoding is exact for
/// whatever model scores it, so its output then follows the perturbed first-token law and the
/// target's conditionals after it: a joint law exactly `tv` from the target's.
struct perturbed_target {
    llama2::transformer* engine;
    std::size_t prompt_size;
    double tv;
    specdec::token_id to;
    std::ptrdiff_t vocab_size() const { return engine->vocab_size(); }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id> c) { return engine->next_logits(c); }
    Eigen::MatrixXf score(std::span<const specdec::token_id> c, std::span<const specdec::token_id> d) {
        Eigen::MatrixXf s = engine->score(c, d);
        if (c.size() == prompt_size) {
            auto z = s.col(0);
            const double mx = z.maxCoeff();
            double rest = 0.0;  // Σ_{j≠to} exp(z_j - mx)
            for (Eigen::Index j = 0; j < z.size(); ++j)
                if (j != to) rest += std::exp(double(z[j]) - mx);
            const double pk = std::exp(double(z[to]) - mx) / (rest + std::exp(double(z[to]) - mx));
            const double target_pk = std::min(pk + tv, 1.0 - 1e-12);  // p'(to) = p(to) + tv, the rest scaled down
            z[to] = static_cast<float>(mx + std::log(target_pk / (1.0 - target_pk) * rest));
        }
        return s;
    }
};

/// --power: detection rates of the equivalence check (token verification, temperature 1, the
/// budget of the options) at several distances, in two directions: mass moved onto the most
/// likely first token (the hardest direction for the χ² test) and onto a token of probability
/// near 0 (the easiest).
int measure_power(llama2::transformer& target, llama2::transformer& draft_model, const arguments& a) {
    llama2::context_limited_drafter<llama2::transformer> drafter(draft_model);
    auto o = a.kit;
    o.schemes = {specdec::verification_scheme::token};
    o.samplings = {specdec::sampling_config{}};
    const Eigen::VectorXf z = target.next_logits(o.prompt);
    Eigen::Index top = 0, rare = 0;
    z.maxCoeff(&top);
    z.minCoeff(&rare);
    std::printf("power of the equivalence test (token verification, temperature 1): %zu sequences of %zu tokens, "
                "significance %g; detections in %zu runs with different seeds\n",
                o.samples, o.length, o.significance, a.power_runs);
    // The first token's law at temperature 1.
    Eigen::VectorXf first_law(z.size());
    specdec::sampling_workspace ws;
    specdec::standardize(z, {}, first_law, ws);
    const std::vector<double> first(first_law.data(), first_law.data() + first_law.size());
    std::printf("first token: the likeliest %ld has probability %.4f, the rare one %ld %.2g; a distance beyond "
                "1 - %.4f cannot move onto the likeliest (n/a)\n",
                static_cast<long>(top), first[static_cast<std::size_t>(top)], static_cast<long>(rare),
                first[static_cast<std::size_t>(rare)], first[static_cast<std::size_t>(top)]);
    std::printf("%-10s %-22s %-22s\n", "TV", "onto the likeliest", "onto a rare token");
    const std::vector<double> distances = a.power_distances.empty()
                                              ? std::vector<double>{0.0, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05}
                                              : a.power_distances;
    for (const double tv : distances) {
        std::printf("%-10g", tv);
        for (const Eigen::Index to : {top, rare}) {
            if (tv > 1.0 - first[static_cast<std::size_t>(to)]) {
                std::printf(" %-22s", "n/a");
                continue;
            }
            perturbed_target p{&target, o.prompt.size(), tv, static_cast<specdec::token_id>(to)};
            std::size_t detected = 0;
            for (std::size_t r = 0; r < a.power_runs; ++r) {
                o.seed = 1000 + r;
                if (!specdec::testing::check_equivalence(drafter, p, o)) ++detected;
            }
            std::printf(" %-22s", (std::to_string(detected) + "/" + std::to_string(a.power_runs)).c_str());
            std::fflush(stdout);
        }
        std::printf("\n");
    }
    return 0;
}

/// A drafter over the draft engine that draws each token after moving `moved` of q's mass from
/// its likeliest token to the second likeliest, and reports q itself: a draft whose law is off by
/// a total variation of `moved` per position (0: a right drafter, sampling from the q it reports).
struct mass_moving_drafter {
    llama2::transformer* engine;
    double moved;
    specdec::sampling_workspace ws{};
    Eigen::VectorXf law{};
    std::ptrdiff_t vocab_size() const { return engine->vocab_size(); }
    void draft(std::span<const specdec::token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        std::vector<specdec::token_id> seq(context.begin(), context.end());
        auto& q = out.resize_probs(vocab_size(), static_cast<Eigen::Index>(gamma));
        for (std::size_t i = 0; i < gamma; ++i) {
            auto col = q.col(static_cast<Eigen::Index>(i));
            specdec::standardize(engine->next_logits(seq), s, col, ws);
            law = col;
            Eigen::Index first = 0, second = 0;
            law.maxCoeff(&first);
            const float top = law[first];
            law[first] = -1.0f;
            law.maxCoeff(&second);
            law[first] = top;
            const auto m = static_cast<float>(std::min<double>(moved, top));
            law[first] -= m;
            law[second] += m;
            // The inverse of the moved law's CDF at a uniform.
            const double v = u();
            double below = 0.0;
            Eigen::Index x = 0;
            for (Eigen::Index y = 0; y < law.size(); ++y) {
                if (law[y] <= 0.0f) continue;
                x = y;
                below += law[y];
                if (v < below) break;
            }
            out.tokens.push_back(static_cast<specdec::token_id>(x));
            seq.push_back(static_cast<specdec::token_id>(x));
        }
    }
};

/// --power-draft: detection rates of the draft check (temperature 1, the budget of the options:
/// the defaults, or --thorough) for drafters that move a fraction of q's mass between the two
/// likeliest tokens; the row of 0 counts false alarms of a right drafter.
int measure_draft_power(llama2::transformer& draft_model, const arguments& a) {
    auto o = a.kit;
    o.samplings = {specdec::sampling_config{}};
    std::printf("power of the draft check (temperature 1): up to %zu blocks of %zu tokens per run (sequential: %s), "
                "%zu contexts, significance %g per test; detections in %zu runs with different seeds\n",
                o.draft_blocks, o.gamma, o.sequential ? "yes" : "no", o.draft_contexts, o.significance, a.power_runs);
    std::printf("%-12s %-12s %-16s %-12s\n", "mass moved", "detected", "mean blocks", "mean seconds");
    const std::vector<double> distances =
        a.power_distances.empty() ? std::vector<double>{0.0, 0.005, 0.01, 0.02, 0.03} : a.power_distances;
    for (const double moved : distances) {
        std::size_t detected = 0;
        double blocks = 0.0, seconds = 0.0;
        for (std::size_t r = 0; r < a.power_runs; ++r) {
            mass_moving_drafter d{&draft_model, moved};
            o.seed = 1000 + r;
            const auto rep = specdec::testing::check_draft_consistency(d, o);
            if (!rep) ++detected;
            blocks += std::stod(rep.ran.substr(0, rep.ran.find(' ')));
            seconds += rep.seconds;
        }
        const auto runs = static_cast<double>(a.power_runs);
        std::printf("%-12g %-12s %-16.0f %-12.2f\n", moved,
                    (std::to_string(detected) + "/" + std::to_string(a.power_runs)).c_str(), blocks / runs,
                    seconds / runs);
        std::fflush(stdout);
    }
    return 0;
}

template <class D>
void add_pair_checks(specdec::testing::conformance_report& out, D& drafter, llama2::transformer& target,
                     const specdec::testing::conformance_options& o) {
    for (auto& r : specdec::testing::run_conformance(drafter, target, o).checks) out.checks.push_back(std::move(r));
}

}  // namespace

int main(int argc, char** argv) {
    auto parsed = parse(argc, argv);
    if (const int* rc = std::get_if<int>(&parsed)) return *rc;
    arguments& a = std::get<arguments>(parsed);
    try {
        const auto t0 = std::chrono::steady_clock::now();
        llama2::transformer target(a.target);
        if (!a.tokenizer.empty()) {
            const llama2::tokenizer tok(a.tokenizer, static_cast<std::int32_t>(target.vocab_size()));
            a.kit.prompt = tok.encode(a.prompt, true, false);
        } else {
            a.kit.prompt = {1};  // BOS alone
        }
        const std::size_t asked_context = a.kit.max_context;
        a.kit.max_context = std::min<std::size_t>(a.kit.max_context, static_cast<std::size_t>(target.max_context()));

        std::optional<llama2::transformer> draft_model;
        if (a.drafter == "model" || a.drafter == "lookup+model") {
            if (a.draft.empty()) throw std::invalid_argument("--drafter " + a.drafter + " needs --draft");
            draft_model.emplace(a.draft);
        } else if (a.drafter.rfind("early-exit:", 0) == 0) {
            draft_model.emplace(target.early_exit(std::stoi(a.drafter.substr(11))));
        }
        if (draft_model)
            a.kit.max_context = std::min<std::size_t>(a.kit.max_context, static_cast<std::size_t>(draft_model->max_context()));
        if (a.kit.max_context < asked_context)
            std::printf("--max-context %zu is past the models' window: the checks build contexts of up to %zu tokens\n",
                        asked_context, a.kit.max_context);
        if (a.power) {
            if (!draft_model) throw std::invalid_argument("--power needs a draft model (--drafter model or early-exit:K)");
            return measure_power(target, *draft_model, a);
        }
        if (a.power_draft) {
            if (!draft_model)
                throw std::invalid_argument("--power-draft needs a draft model (--drafter model or early-exit:K)");
            return measure_draft_power(*draft_model, a);
        }

        specdec::testing::conformance_report report;
        if (draft_model) {
            // The draft engine keeps the same contract as the target (its cache rolls back too).
            report.checks.push_back(specdec::testing::check_contract(*draft_model, a.kit));
            report.checks.back().check = "adapter contract (draft model)";
        }
        if (a.batch > 0) {
            // The batch engine over the same weights: every pass against each sequence scored alone.
            llama2::batch_transformer batch_target(target.model());
            report.checks.push_back(specdec::testing::check_multi_sequence_contract(batch_target, a.kit));
            report.checks.back().check = "multi-sequence contract (batch engine, target)";
            if (draft_model) {
                llama2::batch_transformer batch_draft(draft_model->model(), draft_model->n_layers());
                report.checks.push_back(specdec::testing::check_multi_sequence_contract(batch_draft, a.kit));
                report.checks.back().check = "multi-sequence contract (batch engine, draft)";
            }
        }
        const auto vocab = target.vocab_size();
        if (!a.tree.empty() && draft_model) {
            // Trees that branch, cut to fit both models' windows (every node counts).
            llama2::context_limited_tree_drafter<llama2::transformer> d(*draft_model,
                                                                        static_cast<std::size_t>(target.max_context()));
            add_pair_checks(report, d, target, a.kit);
        } else if (a.drafter == "model" || a.drafter.rfind("early-exit:", 0) == 0) {
            llama2::context_limited_drafter<llama2::transformer> d(*draft_model);
            add_pair_checks(report, d, target, a.kit);
        } else if (a.drafter == "bigram") {
            specdec::ngram_model d(vocab, 2);
            add_pair_checks(report, d, target, a.kit);
        } else if (a.drafter == "lookup") {
            specdec::prompt_lookup_drafter d(vocab);
            add_pair_checks(report, d, target, a.kit);
        } else if (a.drafter == "lookup+model") {
            specdec::prompt_lookup_drafter lookup(vocab);
            llama2::context_limited_drafter<llama2::transformer> model(*draft_model);
            specdec::fallback_drafter d(lookup, model);
            add_pair_checks(report, d, target, a.kit);
        }
        std::cout << report;
        // The measured acceptance (of the equivalence check's runs): a draft checkpoint that got
        // worse stays exact, and shows here as a lower rate (a slower decode).
        bool acceptance_ok = true;
        for (const auto& r : report.checks) {
            if (std::isnan(r.acceptance)) continue;
            std::printf("acceptance: %.3f of %zu drafted tokens accepted (%s)\n", r.acceptance, r.drafted,
                        r.check.c_str());
            if (r.acceptance < a.min_acceptance) {
                std::printf("FAIL acceptance %.3f is below --min-acceptance %.3f: the output is still exact, but "
                            "fewer drafted tokens are accepted than required, so decoding is slower (a worse draft "
                            "checkpoint?)\n",
                            r.acceptance, a.min_acceptance);
                acceptance_ok = false;
            }
        }
        const bool ok = report.ok() && acceptance_ok;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%s: %zu checks, drafter %s%s%s, %.1f s\n", ok ? "all passed" : "FAILED",
                    report.checks.size(), a.drafter.c_str(), a.tree.empty() ? "" : ", trees",
                    a.batch > 0 ? ", batch engine" : "", seconds);
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "specdec-conformance: %s\n", e.what());
        return 1;
    }
}
