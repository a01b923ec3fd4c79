// Tests of the llama2.c example engine (examples/llama2): checkpoint I/O, the Eigen
// transformer (golden logits, greedy decoding, batched score vs. single steps, KV-cache
// rollback, context limit, early exit) and the tokenizer.
//
// Tests on real models read them from the folder named by the environment variable
// SPECDEC_MODELS_DIR (stories260K.bin, llama2xs_tok512_279K.bin, tok512.bin, golden/); they
// print "skipped: ..." and pass when it is unset or incomplete. Tests on random checkpoints
// always run.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/catch.hpp"
#include "support/skip.hpp"
#include "llama2/context_limit.hpp"
#include "llama2/summary.hpp"

#include "llama2/checkpoint.hpp"
#include "llama2/tokenizer.hpp"
#include "llama2/transformer.hpp"

#if __has_include(<specdec/concepts.hpp>)
#include <specdec/concepts.hpp>
// The engine plugs into specdec as a target (batched, in place) and as a draft model.
static_assert(specdec::LanguageModel<llama2::transformer>);
static_assert(specdec::BatchVerifier<llama2::transformer>);
static_assert(specdec::InPlaceBatchVerifier<llama2::transformer>);
#endif

namespace {

namespace fs = std::filesystem;
using tokens = std::vector<std::int32_t>;

const char* const target_file = "stories260K.bin";
const char* const draft_file = "llama2xs_tok512_279K.bin";
const char* const tokenizer_file = "tok512.bin";

/// The models folder, or nullopt after printing "skipped: ..." (env unset or a file missing).
std::optional<fs::path> models_dir(std::initializer_list<const char*> needed) {
    const char* env = std::getenv("SPECDEC_MODELS_DIR");
    if (env == nullptr || *env == '\0') {
        specdec_test::skip("SPECDEC_MODELS_DIR is not set (it must name the folder with stories260K.bin, "
                           "llama2xs_tok512_279K.bin, tok512.bin and golden/; scripts/download_models.sh DIR "
                           "fetches them)");
        return std::nullopt;
    }
    const fs::path dir(env);
    for (const char* f : needed)
        if (!fs::exists(dir / f)) {
            specdec_test::skip((dir / f).string() + " not found (SPECDEC_MODELS_DIR=" + env + ")");
            return std::nullopt;
        }
    return dir;
}

/// The golden data, golden/reference.json in the models folder.
nlohmann::json read_reference(const fs::path& dir) {
    const fs::path file = dir / "golden/reference.json";
    std::ifstream in(file);
    if (!in) throw std::runtime_error("cannot open " + file.string());
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(file.string() + ": " + e.what());
    }
}

/// Checkpoints are loaded once per test run.
std::shared_ptr<const llama2::checkpoint> load(const fs::path& file) {
    static std::map<fs::path, std::shared_ptr<const llama2::checkpoint>> cache;
    auto& slot = cache[file];
    if (!slot) slot = std::make_shared<const llama2::checkpoint>(llama2::read_checkpoint(file));
    return slot;
}

/// A temporary file removed at scope exit.
struct temp_file {
    fs::path path;
    explicit temp_file(const std::string& stem) {
        std::random_device rd;
        path = fs::temp_directory_path() / (stem + "_" + std::to_string(rd()) + ".bin");
    }
    ~temp_file() {
        std::error_code ec;
        fs::remove(path, ec);
    }
    temp_file(const temp_file&) = delete;
    temp_file& operator=(const temp_file&) = delete;
};

/// A small random model that exercises every code path: grouped-query attention (6 heads,
/// 2 kv heads), a separate classifier, widths that are not multiples of the SIMD width.
llama2::config small_config(bool shared_classifier = false) {
    llama2::config c;
    c.dim = 60;
    c.hidden_dim = 100;
    c.n_layers = 3;
    c.n_heads = 6;
    c.n_kv_heads = 2;
    c.vocab_size = 300;
    c.seq_len = 48;
    c.shared_classifier = shared_classifier;
    return c;
}

std::shared_ptr<const llama2::checkpoint> small_model(bool shared_classifier = false) {
    auto ck = std::make_shared<llama2::checkpoint>();
    ck->name = "random-small";
    ck->cfg = small_config(shared_classifier);
    ck->w = llama2::random_weights(ck->cfg, 42);
    return ck;
}

tokens random_tokens(std::mt19937& rng, std::size_t n, std::int32_t vocab) {
    std::uniform_int_distribution<std::int32_t> d(3, vocab - 1);
    tokens t(n);
    for (auto& x : t) x = d(rng);
    return t;
}

std::int32_t argmax(const Eigen::VectorXf& v) {
    Eigen::Index best = 0;
    for (Eigen::Index i = 1; i < v.size(); ++i)
        if (v[i] > v[best]) best = i;
    return std::int32_t(best);
}

std::span<const std::int32_t> prefix(const tokens& t, std::size_t n) { return std::span(t).first(n); }

tokens concat(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
    tokens r(a.begin(), a.end());
    r.insert(r.end(), b.begin(), b.end());
    return r;
}

float max_abs_diff(const Eigen::Ref<const Eigen::VectorXf>& a, const Eigen::Ref<const Eigen::VectorXf>& b) {
    return (a - b).cwiseAbs().maxCoeff();
}

/// Speculative-decoding-like traffic: random contexts that grow, diverge and shrink, with
/// drafts of 1..8 tokens. Every column of score() must equal (bit for bit) next_logits on the
/// extended context computed by a second instance, and a cold instance for some of them.
void check_score_matches_steps(const std::shared_ptr<const llama2::checkpoint>& model, int rounds,
                               std::uint32_t seed) {
    llama2::transformer scorer(model), stepper(model);
    std::mt19937 rng(seed);
    const auto vocab = std::int32_t(scorer.vocab_size());
    const auto limit = std::size_t(scorer.max_context());
    tokens ctx{1};
    int rollbacks = 0;
    for (int round = 0; round < rounds; ++round) {
        const int gamma = 1 + int(rng() % 8);
        const int mode = int(rng() % 4);
        if (mode == 0 && ctx.size() > 2) {  // roll back to a shorter context
            ctx.resize(1 + rng() % (ctx.size() - 1));
            ++rollbacks;
        } else if (mode == 1 && ctx.size() > 2) {  // diverge: replace the tail
            const std::size_t keep = 1 + rng() % (ctx.size() - 1);
            ctx.resize(keep);
            const auto extra = random_tokens(rng, 1 + rng() % 4, vocab);
            ctx.insert(ctx.end(), extra.begin(), extra.end());
        } else {  // extend, as after accepting some tokens
            const auto extra = random_tokens(rng, 1 + rng() % 5, vocab);
            ctx.insert(ctx.end(), extra.begin(), extra.end());
        }
        if (ctx.size() + std::size_t(gamma) > limit) ctx.resize(1 + rng() % (limit / 2));
        const tokens draft = random_tokens(rng, std::size_t(gamma), vocab);
        Eigen::MatrixXf m;
        if (round % 2 == 0)
            m = scorer.score(ctx, draft);
        else
            scorer.score_into(ctx, draft, m);  // the in-place variant, same contents
        REQUIRE(m.rows() == scorer.vocab_size());
        REQUIRE(m.cols() == gamma + 1);
        const tokens all = concat(ctx, draft);
        REQUIRE(tokens(scorer.cached_tokens().begin(), scorer.cached_tokens().end()) == all);
        for (int j = 0; j <= gamma; ++j) {
            const Eigen::VectorXf ref = stepper.next_logits(prefix(all, ctx.size() + std::size_t(j)));
            INFO("round " << round << ", context " << ctx.size() << ", gamma " << gamma << ", column " << j);
            REQUIRE(max_abs_diff(m.col(j), ref) == 0.0f);
        }
        if (round % 10 == 0) {  // against a cold instance (no cache reuse)
            llama2::transformer cold(model);
            REQUIRE(max_abs_diff(m.col(gamma), cold.next_logits(all)) == 0.0f);
        }
    }
    CHECK(rollbacks > 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Checkpoint I/O
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2: checkpoint round trip through write_checkpoint (random weights)", "[llama2][checkpoint]") {
    for (const bool shared : {false, true}) {
        const llama2::config c = small_config(shared);
        const llama2::weights w = llama2::random_weights(c, 7);
        temp_file f("llama2_roundtrip");
        llama2::write_checkpoint(f.path, c, w);
        CHECK(fs::file_size(f.path) == llama2::checkpoint_file_size(c));
        const llama2::checkpoint back = llama2::read_checkpoint(f.path);
        CHECK(back.cfg == c);
        CHECK(back.name == f.path.filename().string());
        CHECK(back.w.token_embedding == w.token_embedding);
        CHECK(back.w.wq == w.wq);
        CHECK(back.w.wk == w.wk);
        CHECK(back.w.wv == w.wv);
        CHECK(back.w.wo == w.wo);
        CHECK(back.w.w1 == w.w1);
        CHECK(back.w.w2 == w.w2);
        CHECK(back.w.w3 == w.w3);
        CHECK(back.w.rms_att == w.rms_att);
        CHECK(back.w.rms_ffn == w.rms_ffn);
        CHECK(back.w.rms_final == w.rms_final);
        CHECK(back.w.wcls == w.wcls);
        CHECK(back.w.wcls.empty() == shared);
    }
}

TEST_CASE("llama2: checkpoint errors name the file and the problem", "[llama2][checkpoint]") {
    const llama2::config c = small_config();
    const llama2::weights w = llama2::random_weights(c, 1);

    SECTION("missing file") {
        const fs::path missing = fs::temp_directory_path() / "llama2_no_such_checkpoint.bin";
        REQUIRE_THROWS_AS(llama2::read_checkpoint(missing), std::runtime_error);
        REQUIRE_THROWS_WITH(llama2::read_checkpoint(missing),
                            specdec_test::contains("llama2_no_such_checkpoint.bin") && specdec_test::contains("cannot open"));
    }
    SECTION("truncated file") {
        temp_file f("llama2_truncated");
        llama2::write_checkpoint(f.path, c, w);
        fs::resize_file(f.path, fs::file_size(f.path) - 4);
        REQUIRE_THROWS_AS(llama2::read_checkpoint(f.path), std::invalid_argument);
        REQUIRE_THROWS_WITH(llama2::read_checkpoint(f.path),
                            specdec_test::contains(f.path.filename().string()) && specdec_test::contains("truncated"));
    }
    SECTION("trailing data") {
        temp_file f("llama2_trailing");
        llama2::write_checkpoint(f.path, c, w);
        { std::ofstream(f.path, std::ios::binary | std::ios::app).write("\0\0\0\0", 4); }
        REQUIRE_THROWS_AS(llama2::read_checkpoint(f.path), std::invalid_argument);
    }
    SECTION("invalid header") {
        temp_file f("llama2_badheader");
        {
            const std::int32_t h[7] = {64, 172, 5, 7, 7, 512, 512};  // 7 heads do not divide dim 64
            std::ofstream(f.path, std::ios::binary).write(reinterpret_cast<const char*>(h), sizeof h);
        }
        REQUIRE_THROWS_AS(llama2::read_checkpoint(f.path), std::invalid_argument);
        REQUIRE_THROWS_WITH(llama2::read_checkpoint(f.path), specdec_test::contains("n_heads"));
    }
    SECTION("tensors too large to count") {
        // dim 2^30, 1024 layers: wq alone would hold 2^70 floats (a product that wraps in 64 bits).
        llama2::config huge = c;
        huge.dim = 1 << 30;
        huge.n_layers = 1024;
        huge.hidden_dim = 1;
        huge.n_heads = huge.n_kv_heads = 1 << 29;
        huge.vocab_size = 512;
        huge.seq_len = 1;
        REQUIRE_THROWS_WITH(huge.validate("test"), specdec_test::contains("implausibly large"));
    }
    SECTION("tiny file") {
        temp_file f("llama2_tiny");
        { std::ofstream(f.path, std::ios::binary).write("abc", 3); }
        REQUIRE_THROWS_WITH(llama2::read_checkpoint(f.path), specdec_test::contains("too small"));
    }
    SECTION("weights that do not match the config") {
        llama2::weights bad = w;
        bad.w2.pop_back();
        temp_file f("llama2_badweights");
        REQUIRE_THROWS_AS(llama2::write_checkpoint(f.path, c, bad), std::invalid_argument);
        REQUIRE_THROWS_AS(llama2::transformer(std::make_shared<const llama2::checkpoint>(
                              llama2::checkpoint{"bad", c, bad})),
                          std::invalid_argument);
    }
}

TEST_CASE("llama2: real checkpoints load and survive a round trip", "[llama2][checkpoint]") {
    const auto dir = models_dir({target_file, draft_file});
    if (!dir) return;
    const auto target = load(*dir / target_file);
    const auto draft = load(*dir / draft_file);
    CHECK(target->cfg.dim == 64);
    CHECK(target->cfg.hidden_dim == 172);
    CHECK(target->cfg.n_layers == 5);
    CHECK(target->cfg.n_heads == 8);
    CHECK(target->cfg.n_kv_heads == 4);
    CHECK(target->cfg.vocab_size == 512);
    CHECK(target->cfg.seq_len == 512);
    CHECK(llama2::parameter_count(target->cfg) == 260032);
    CHECK(draft->cfg.hidden_dim == 192);
    CHECK(draft->cfg.seq_len == 256);
    CHECK(llama2::parameter_count(draft->cfg) == 279232);

    temp_file f("llama2_real_roundtrip");
    llama2::write_checkpoint(f.path, target->cfg, target->w);
    CHECK(fs::file_size(f.path) == fs::file_size(*dir / target_file));
    const llama2::checkpoint back = llama2::read_checkpoint(f.path);
    CHECK(back.cfg == target->cfg);
    CHECK(back.w.wq == target->w.wq);
    CHECK(back.w.w2 == target->w.w2);
    CHECK(back.w.token_embedding == target->w.token_embedding);
    llama2::transformer a(target), b(std::make_shared<const llama2::checkpoint>(back));
    const tokens seq{1, 403, 407, 261, 378};
    CHECK(max_abs_diff(a.next_logits(seq), b.next_logits(seq)) == 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Transformer on real models: golden logits and greedy decoding
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2: logits match the float64 reference (token by token and one score pass)",
          "[llama2][golden]") {
    const auto dir = models_dir({target_file, draft_file, "golden/reference.json"});
    if (!dir) return;
    const nlohmann::json ref = read_reference(*dir);
    const tokens seq = ref.at("logits_sequence").get<tokens>();
    REQUIRE(seq.size() == 64);
    for (const char* model_file : {target_file, draft_file}) {
        const std::string stem = fs::path(model_file).stem().string();
        const fs::path golden_file = *dir / "golden" / (stem + ".logits.f32");
        REQUIRE(fs::exists(golden_file));
        REQUIRE(fs::file_size(golden_file) == seq.size() * 512 * sizeof(float));
        Eigen::MatrixXf golden(512, Eigen::Index(seq.size()));  // column t = row t of the file
        std::ifstream(golden_file, std::ios::binary)
            .read(reinterpret_cast<char*>(golden.data()), std::streamsize(golden.size()) * std::streamsize(sizeof(float)));

        const auto model = load(*dir / model_file);
        llama2::transformer stepper(model), scorer(model);
        REQUIRE(stepper.vocab_size() == 512);
        float err_steps = 0.0f, err_score = 0.0f;
        for (std::size_t t = 0; t < seq.size(); ++t)
            err_steps = std::max(err_steps, max_abs_diff(stepper.next_logits(prefix(seq, t + 1)), golden.col(Eigen::Index(t))));
        CHECK(stepper.positions_computed() == seq.size());  // each step ran exactly one new position
        const Eigen::MatrixXf all = scorer.score(prefix(seq, 1), std::span(seq).subspan(1));
        REQUIRE(all.cols() == Eigen::Index(seq.size()));
        err_score = (all - golden).cwiseAbs().maxCoeff();
        std::printf("[llama2] %s: max |logit - golden| over 64x512: token by token %.3g, one score pass %.3g\n",
                    model_file, double(err_steps), double(err_score));
        CHECK(err_steps < 1e-4f);
        CHECK(err_score < 1e-4f);
        // Batched and single-step results are bit-identical (see transformer.hpp, "Determinism").
        const Eigen::VectorXf last = stepper.next_logits(seq);
        CHECK(max_abs_diff(all.col(all.cols() - 1), last) == 0.0f);
    }
}

TEST_CASE("llama2: greedy decoding reproduces the reference stories", "[llama2][golden]") {
    const auto dir = models_dir({target_file, draft_file, tokenizer_file, "golden/reference.json"});
    if (!dir) return;
    const nlohmann::json ref = read_reference(*dir);
    const llama2::tokenizer tok(*dir / tokenizer_file, 512);
    for (const char* model_file : {target_file, draft_file}) {
        const std::string stem = fs::path(model_file).stem().string();
        llama2::transformer model(load(*dir / model_file));
        for (const char* prompt : {"Once upon a time", "<empty>"}) {
            INFO(model_file << ", prompt \"" << prompt << "\"");
            const nlohmann::json& entry = ref.at(stem).at(prompt);
            const std::string text = std::string(prompt) == "<empty>" ? std::string() : std::string(prompt);
            tokens seq = tok.encode(text, true, false);
            REQUIRE(seq == entry.at("prompt_tokens").get<tokens>());
            const tokens expected = entry.at("greedy_tokens").get<tokens>();
            while (seq.size() < 200) {
                const std::int32_t next = argmax(model.next_logits(seq));
                seq.push_back(next);
                if (next == llama2::tokenizer::bos_id || next == llama2::tokenizer::eos_id) break;
            }
            const std::size_t n = std::min(seq.size(), expected.size());
            CHECK(tokens(seq.begin(), seq.begin() + std::ptrdiff_t(n)) ==
                  tokens(expected.begin(), expected.begin() + std::ptrdiff_t(n)));
            CHECK(tok.decode(expected) == entry.at("text").get<std::string>());
            CHECK(tok.decode(seq) == entry.at("text").get<std::string>());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Batched scoring, KV cache, context limit, early exit
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2: score() columns equal next_logits() on the extended contexts (random model)",
          "[llama2][score]") {
    check_score_matches_steps(small_model(false), 120, 11);
    check_score_matches_steps(small_model(true), 60, 12);
}

TEST_CASE("llama2: score() columns equal next_logits() on the extended contexts (real models)",
          "[llama2][score]") {
    const auto dir = models_dir({target_file, draft_file});
    if (!dir) return;
    check_score_matches_steps(load(*dir / target_file), 80, 21);
    check_score_matches_steps(load(*dir / draft_file), 80, 22);
}

TEST_CASE("llama2: the KV cache reuses the common prefix and rolls back", "[llama2][cache]") {
    const auto model = small_model();
    llama2::transformer m(model);
    std::mt19937 rng(5);
    tokens seq{1};
    const tokens rest = random_tokens(rng, 39, 300);
    seq.insert(seq.end(), rest.begin(), rest.end());

    auto fresh = [&](std::span<const std::int32_t> ctx) { return llama2::transformer(model).next_logits(ctx); };

    const Eigen::VectorXf a = m.next_logits(prefix(seq, 30));
    CHECK(m.positions_computed() == 30);
    CHECK(m.cached_tokens().size() == 30);
    CHECK(max_abs_diff(a, fresh(prefix(seq, 30))) == 0.0f);

    // Extending by 10 runs only the 10 new positions.
    const Eigen::VectorXf b = m.next_logits(prefix(seq, 40));
    CHECK(m.positions_computed() == 40);
    CHECK(max_abs_diff(b, fresh(seq)) == 0.0f);

    // The same context again: only the last position (whose logits are needed) is rerun.
    CHECK(max_abs_diff(m.next_logits(seq), b) == 0.0f);
    CHECK(m.positions_computed() == 41);

    // Shorter context: the cache is truncated, one position rerun.
    const Eigen::VectorXf c = m.next_logits(prefix(seq, 20));
    CHECK(m.positions_computed() == 42);
    CHECK(m.cached_tokens().size() == 20);
    CHECK(max_abs_diff(c, fresh(prefix(seq, 20))) == 0.0f);

    // Divergent context: recomputed from the first differing position.
    tokens other = tokens(seq.begin(), seq.begin() + 25);
    other[15] = (other[15] + 1) % 300;
    const Eigen::VectorXf d = m.next_logits(other);
    CHECK(m.positions_computed() == 42 + 10);
    CHECK(max_abs_diff(d, fresh(other)) == 0.0f);

    // score() leaves context + draft cached; a following shorter call rolls back.
    const tokens draft(seq.begin() + 25, seq.begin() + 30);
    const Eigen::MatrixXf s = m.score(prefix(seq, 25), draft);
    CHECK(m.cached_tokens().size() == 30);
    CHECK(max_abs_diff(s.col(5), a) == 0.0f);
    CHECK(max_abs_diff(m.next_logits(prefix(seq, 27)), fresh(prefix(seq, 27))) == 0.0f);
    CHECK(m.cached_tokens().size() == 27);

    m.clear_cache();
    CHECK(m.cached_tokens().empty());
    CHECK(max_abs_diff(m.next_logits(seq), b) == 0.0f);
}

TEST_CASE("llama2: the context-limited drafter drafts as many tokens as the window holds", "[llama2][limits]") {
    // Drafting k tokens after s feeds the model contexts of up to s + k - 1 tokens: k is
    // min(gamma, seq_len - s + 1), so one token is still drafted after a full window.
    const auto model = small_model();  // seq_len 48
    llama2::transformer m(model);
    llama2::context_limited_drafter<llama2::transformer> d(m);
    std::mt19937 rng(3);
    const tokens seq = random_tokens(rng, 50, 300);
    specdec::draft_block block;
    std::mt19937_64 g(1);
    specdec::uniform_source u(g);
    for (const std::size_t s : std::vector<std::size_t>{40, 45, 46, 47, 48, 49, 50}) {
        INFO("context of " << s << " tokens");
        d.draft(prefix(seq, s), 4, {}, u, block);
        CHECK(block.tokens.size() == std::min<std::size_t>(4, s <= 48 ? 48 - s + 1 : 0));
    }
}

TEST_CASE("llama2: fit_tree_to_windows counts every node against both windows", "[llama2][limits][tree]") {
    // 2,2,1,1: levels of 2, 4, 4 and 4 nodes (2, 6, 10, 14 in all). The target scores
    // context + every node; drawing the deepest level, the draft holds context + the nodes above.
    const specdec::tree_shape asked{.branching = {2, 2, 1, 1}};
    specdec::tree_shape got;
    struct expected {
        std::size_t context, draft_window, target_window, nodes, depth;
    };
    for (const auto& e : std::vector<expected>{
             {200, 256, 512, 14, 4},  // room for everything
             {246, 256, 512, 14, 4},  // 246 + 10 above the deepest level = 256
             {247, 256, 512, 10, 3},
             {248, 256, 512, 10, 3},  // the demo's failure: 248 + 10 > 256 with all 14 nodes
             {250, 256, 512, 10, 3},
             {251, 256, 512, 6, 2},   // 10 nodes: 251 + 6 above > 256; 7 to 9 as well
             {254, 256, 512, 6, 2},
             {255, 256, 512, 2, 1},   // 3 to 6 nodes: 255 + 2 above > 256
             {256, 256, 512, 2, 1},   // a full draft window: the first level still fits
             {257, 256, 512, 0, 0},   // nothing: a plain target step
             {300, 256, 512, 0, 0},
             {498, 512, 512, 14, 4},  // the target's window: 498 + 14 = 512
             {499, 512, 512, 13, 4},  // a part of the deepest level (3 of its 4 nodes)
             {506, 512, 512, 6, 2},
             {507, 512, 512, 5, 2},
             {510, 512, 512, 2, 1},
             {511, 512, 512, 1, 1},
             {512, 512, 512, 0, 0},
         }) {
        INFO("context " << e.context << ", windows " << e.draft_window << " (draft) and " << e.target_window
                        << " (target)");
        llama2::fit_tree_to_windows(asked, e.context, e.draft_window, e.target_window, got);
        CHECK(got.nodes() == e.nodes);
        CHECK(got.depth() == e.depth);
        CHECK(got.draws == asked.draws);
    }
    // A node cap of the asked shape is kept; a wide first level takes all the room.
    llama2::fit_tree_to_windows({.branching = {2, 2, 1, 1}, .max_nodes = 5}, 100, 256, 512, got);
    CHECK(got.nodes() == 5);
    const std::size_t wide = std::size_t{1} << 20;
    llama2::fit_tree_to_windows({.branching = {wide, wide, wide}}, 100, 256, 512, got);
    CHECK(got.nodes() == 412);  // the target's room, all in the first level (nothing above it)
    CHECK(got.depth() == 1);
}

namespace {

/// A small random model as above with another context window.
std::shared_ptr<const llama2::checkpoint> small_model_with_window(int seq_len) {
    auto ck = std::make_shared<llama2::checkpoint>();
    ck->name = "random-small-" + std::to_string(seq_len);
    ck->cfg = small_config();
    ck->cfg.seq_len = seq_len;
    ck->w = llama2::random_weights(ck->cfg, 42);
    return ck;
}

}  // namespace

TEST_CASE("llama2: tree decoding with the context-limited tree drafter runs to the end of the target's window",
          "[llama2][limits][tree]") {
    // Draft window 48, target window 64 (the bundled pair's 256 and 512 in small); and a draft
    // with the target's window (an early exit). Every step's tree must fit both windows, or an
    // engine throws std::length_error; at temperature 0 the output is greedy decoding.
    const auto target_model = small_model_with_window(64);
    for (const int draft_window : {48, 64}) {
        INFO("draft window " << draft_window);
        const auto draft_model = small_model_with_window(draft_window);
        llama2::transformer target(target_model), reference(target_model);
        llama2::transformer draft(draft_model, 2);  // the first 2 of 3 layers: a close, different draft
        llama2::context_limited_tree_drafter<llama2::transformer> drafter(draft, 64);
        const tokens prompt{llama2::tokenizer::bos_id, 40, 41};
        const std::size_t n = 64 - prompt.size();  // to the last position of the target's window
        std::mt19937_64 rng(1);
        const specdec::sampling_config greedy{.temperature = 0.0f};
        const auto want = specdec::autoregressive_decode(reference, prompt, {.sampling = greedy, .budget = {.max_new_tokens = n}}, rng);
        for (const auto& branching : std::vector<std::vector<std::size_t>>{{2, 2, 1, 1}, {3, 2, 1, 1}, {4, 4}}) {
            INFO("tree of " << branching.size() << " levels, " << branching[0] << " at the root");
            std::size_t shrunk = 0;
            specdec::decode_options opts{.step = specdec::tree{.shape = {.branching = branching}},
                                         .sampling = greedy,
                                         .budget = {.max_new_tokens = n}};
            opts.on_step = [&](const specdec::step_event& e) {
                // Cut by the windows: fewer nodes than the step asked for (its first e.gamma levels).
                const specdec::tree_shape step{.branching = {branching.begin(), branching.begin() + static_cast<std::ptrdiff_t>(e.gamma)}};
                if (e.gamma > 0 && drafter.last_shape().nodes() < step.nodes()) ++shrunk;
            };
            target.clear_cache();
            draft.clear_cache();
            std::mt19937_64 g(2);
            const auto got = specdec::speculative_decode(drafter, target, prompt, opts, g);
            CHECK(got.tokens == want.tokens);
            CHECK(got.tokens.size() == n);
            CHECK(shrunk > 0);  // the windows did cut some trees
            // At temperature 1 too (no stop tokens: every run reaches the end of the window).
            opts.sampling = {.temperature = 1.0f};
            opts.on_step = nullptr;
            for (std::uint64_t seed = 0; seed < 8; ++seed) {
                std::mt19937_64 gs(seed);
                CHECK(specdec::speculative_decode(drafter, target, prompt, opts, gs).tokens.size() == n);
            }
        }
    }
}

TEST_CASE("llama2: contexts beyond seq_len throw std::length_error naming the model", "[llama2][limits]") {
    const auto model = small_model();  // seq_len 48
    llama2::transformer m(model);
    REQUIRE(m.max_context() == 48);
    std::mt19937 rng(3);
    tokens seq{1};
    const tokens rest = random_tokens(rng, 48, 300);
    seq.insert(seq.end(), rest.begin(), rest.end());  // 49 tokens

    CHECK_NOTHROW((void)m.next_logits(prefix(seq, 48)));
    const tokens cached(m.cached_tokens().begin(), m.cached_tokens().end());
    CHECK_THROWS_AS((void)m.next_logits(seq), std::length_error);
    CHECK_THROWS_WITH((void)m.next_logits(seq), specdec_test::contains("random-small") && specdec_test::contains("49") &&
                                                    specdec_test::contains("48"));
    CHECK_THROWS_AS((void)m.score(prefix(seq, 44), std::span(seq).subspan(44, 5)), std::length_error);
    CHECK(tokens(m.cached_tokens().begin(), m.cached_tokens().end()) == cached);  // unchanged
    CHECK_NOTHROW((void)m.score(prefix(seq, 44), std::span(seq).subspan(44, 4)));

    CHECK_THROWS_AS((void)m.next_logits({}), std::invalid_argument);
    const tokens bad{1, 5, 300};
    CHECK_THROWS_AS((void)m.next_logits(bad), std::out_of_range);
    const tokens neg{1, -1};
    CHECK_THROWS_AS((void)m.score(prefix(seq, 3), neg), std::out_of_range);
}

TEST_CASE("llama2: the draft model's 256-token limit", "[llama2][limits]") {
    const auto dir = models_dir({draft_file});
    if (!dir) return;
    llama2::transformer m(load(*dir / draft_file));
    REQUIRE(m.max_context() == 256);
    const tokens seq(257, 300);
    CHECK_NOTHROW((void)m.next_logits(prefix(seq, 256)));
    CHECK_THROWS_WITH((void)m.next_logits(seq), specdec_test::contains(draft_file) && specdec_test::contains("256"));
    CHECK_THROWS_AS((void)m.score(prefix(seq, 250), std::span(seq).subspan(0, 7)), std::length_error);
}

TEST_CASE("llama2: early-exit variants share the weights", "[llama2][early_exit]") {
    const auto model = small_model();
    llama2::transformer full(model);
    std::mt19937 rng(9);
    tokens seq{1};
    const tokens rest = random_tokens(rng, 20, 300);
    seq.insert(seq.end(), rest.begin(), rest.end());

    // k = n_layers is the full model.
    llama2::transformer same = full.early_exit(3);
    CHECK(same.model() == full.model());
    CHECK(same.n_layers() == 3);
    CHECK(max_abs_diff(same.next_logits(seq), full.next_logits(seq)) == 0.0f);

    // k = 2 equals a checkpoint that holds only the first 2 layers.
    llama2::transformer two = full.early_exit(2);
    CHECK(two.n_layers() == 2);
    CHECK(two.name().find("first 2 of 3") != std::string::npos);
    auto cut = std::make_shared<llama2::checkpoint>(*model);
    cut->cfg.n_layers = 2;
    const auto keep = [](llama2::tensor& v, std::size_t n) { v.resize(v.size() / 3 * n); };
    for (auto* v : {&cut->w.rms_att, &cut->w.wq, &cut->w.wk, &cut->w.wv, &cut->w.wo, &cut->w.rms_ffn, &cut->w.w1,
                    &cut->w.w2, &cut->w.w3})
        keep(*v, 2);
    llama2::transformer truncated(cut);
    const Eigen::VectorXf e2 = two.next_logits(seq);
    CHECK(max_abs_diff(e2, truncated.next_logits(seq)) == 0.0f);
    CHECK(max_abs_diff(e2, full.next_logits(seq)) > 0.0f);

    // Separate caches: interleaved use does not interfere.
    const tokens draft(seq.begin() + 10, seq.begin() + 14);
    const Eigen::MatrixXf s2 = two.score(prefix(seq, 10), draft);
    (void)full.next_logits(prefix(seq, 5));
    CHECK(max_abs_diff(two.next_logits(prefix(seq, 14)), s2.col(4)) == 0.0f);
    CHECK(max_abs_diff(truncated.next_logits(prefix(seq, 14)), s2.col(4)) == 0.0f);

    CHECK_THROWS_AS(full.early_exit(0), std::invalid_argument);
    CHECK_THROWS_AS(full.early_exit(4), std::invalid_argument);
}

TEST_CASE("llama2: early exit on the real target (k = n_layers equals the full model)", "[llama2][early_exit]") {
    const auto dir = models_dir({target_file, "golden/reference.json"});
    if (!dir) return;
    const tokens seq = read_reference(*dir).at("logits_sequence").get<tokens>();
    llama2::transformer full(load(*dir / target_file));
    llama2::transformer all = full.early_exit(full.n_layers());
    CHECK(max_abs_diff(all.next_logits(seq), full.next_logits(seq)) == 0.0f);
    llama2::transformer two = full.early_exit(2);
    const Eigen::MatrixXf s = two.score(prefix(seq, 20), std::span(seq).subspan(20, 5));
    CHECK(s.allFinite());
    CHECK(max_abs_diff(s.col(5), two.next_logits(prefix(seq, 25))) == 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2: tokenizer encodes and decodes like llama2.c", "[llama2][tokenizer]") {
    const auto dir = models_dir({tokenizer_file, "golden/reference.json"});
    if (!dir) return;
    const llama2::tokenizer tok(*dir / tokenizer_file);
    REQUIRE(tok.vocab_size() == 512);
    CHECK(tok.max_token_length() == 7);

    CHECK(tok.encode("Once upon a time", true, false) == tokens{1, 403, 407, 261, 378});
    CHECK(tok.encode("Once upon a time", false, true) == tokens{403, 407, 261, 378, 2});
    CHECK(tok.encode("", true, false) == tokens{1});
    CHECK(tok.encode("", false, false).empty());
    CHECK(tok.decode(1, 403) == "Once");   // leading space stripped after BOS
    CHECK(tok.decode(378, 403) == " Once");
    CHECK(tok.decode(432, 13) == "\n");     // byte fallback <0x0A>
    CHECK(tok.piece(13) == "<0x0A>");

    // Bytes missing from the vocabulary fall back to byte ids (byte + 3); decoding inverts it.
    const std::string unicode = "Zo\xC3\xAB saw a \xE2\x98\x83 and \xF0\x9F\x99\x82!\n\tThe end.";
    const tokens enc = tok.encode(unicode, true, true);
    CHECK(std::any_of(enc.begin(), enc.end(), [](std::int32_t t) { return t >= 3 && t < 259; }));
    CHECK(tok.decode(enc) == unicode);
    for (const char* s : {"Lily and Ben went to the park.", "  two spaces", "a", "\"Hi!\" she said."})
        CHECK(tok.decode(tok.encode(s, true, false)) == s);

    const nlohmann::json ref = read_reference(*dir);
    for (const char* model : {"stories260K", "llama2xs_tok512_279K"})
        for (const char* prompt : {"Once upon a time", "<empty>"}) {
            const nlohmann::json& e = ref.at(model).at(prompt);
            CHECK(tok.decode(e.at("greedy_tokens").get<tokens>()) == e.at("text").get<std::string>());
        }

    CHECK_THROWS_AS(tok.decode(1, 512), std::out_of_range);
    CHECK_THROWS_AS(llama2::tokenizer(*dir / tokenizer_file, 1000), std::invalid_argument);
}

TEST_CASE("llama2: tokenizer file errors", "[llama2][tokenizer]") {
    CHECK_THROWS_AS(llama2::tokenizer(fs::temp_directory_path() / "llama2_no_such_tokenizer.bin"), std::runtime_error);
    temp_file f("llama2_bad_tokenizer");
    {
        std::ofstream out(f.path, std::ios::binary);
        const std::int32_t max_len = 4, len = 9;
        const float score = 0.0f;
        out.write(reinterpret_cast<const char*>(&max_len), 4);
        out.write(reinterpret_cast<const char*>(&score), 4);
        out.write(reinterpret_cast<const char*>(&len), 4);
    }
    CHECK_THROWS_WITH(llama2::tokenizer(f.path),
                      specdec_test::contains(f.path.filename().string()) && specdec_test::contains("length 9"));
    temp_file empty("llama2_empty_tokenizer");
    { std::ofstream(empty.path, std::ios::binary).write("ab", 2); }
    CHECK_THROWS_WITH(llama2::tokenizer(empty.path), specdec_test::contains("while reading the header's max_token_length"));
}

TEST_CASE("llama2: a tokenizer with more pieces than the model's vocabulary is an error", "[llama2][tokenizer]") {
    const auto dir = models_dir({tokenizer_file});
    if (!dir) return;
    // The 512-piece tokenizer read for a 300-token model, and with bytes after its last piece.
    CHECK_THROWS_WITH(llama2::tokenizer(*dir / tokenizer_file, 300), specdec_test::contains("follow piece 299"));
    temp_file f("llama2_tokenizer_trailing");
    fs::copy_file(*dir / tokenizer_file, f.path, fs::copy_options::overwrite_existing);
    { std::ofstream(f.path, std::ios::binary | std::ios::app).write("xyz", 3); }
    CHECK_THROWS_WITH(llama2::tokenizer(f.path, 512), specdec_test::contains("3 bytes follow piece 511"));
    CHECK(llama2::tokenizer(*dir / tokenizer_file, 512).vocab_size() == 512);
}

// ---------------------------------------------------------------------------------------------
// Speculative decoding on the real pair
// ---------------------------------------------------------------------------------------------

TEST_CASE("llama2: speculative decoding at temperature 0 is token-identical to greedy decoding, gamma 1..8",
          "[llama2][speculative]") {
    const auto dir = models_dir({target_file, draft_file, tokenizer_file});
    if (!dir) return;
    const llama2::tokenizer tok(*dir / tokenizer_file, 512);
    llama2::transformer target(load(*dir / target_file)), draft(load(*dir / draft_file));
    const tokens prompt = tok.encode("Once upon a time", true, false);
    const specdec::decode_options greedy{.sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 150}};
    std::mt19937_64 rng(1);
    const auto baseline = specdec::autoregressive_decode(target, prompt, greedy, rng);
    REQUIRE(baseline.tokens.size() == 150);
    for (std::size_t gamma = 1; gamma <= 8; ++gamma) {
        for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
            auto opts = greedy;
            opts.step = specdec::chain{.gamma = gamma, .scheme = scheme};
            const auto r = specdec::speculative_decode(draft, target, prompt, opts, rng);
            INFO("gamma " << gamma);
            CHECK(r.tokens == baseline.tokens);
            CHECK(r.stats.target_calls < baseline.stats.target_calls);
        }
    }
}

TEST_CASE("llama2: adaptive gamma (measured costs) at temperature 0 is token-identical to greedy decoding",
          "[llama2][speculative][adaptive]") {
    const auto dir = models_dir({target_file, draft_file});
    if (!dir) return;
    llama2::transformer target(load(*dir / target_file)), draft(load(*dir / draft_file));
    llama2::context_limited_drafter<llama2::transformer> limited(draft);
    const tokens prompt{llama2::tokenizer::bos_id};
    std::mt19937_64 rng(1);
    specdec::decode_options opts{.step = specdec::chain{.gamma = 8}, .sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 300}};
    const auto g = specdec::autoregressive_decode(target, prompt, opts, rng);
    opts.length.policy = specdec::gamma_policy::adaptive;
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        opts.step = specdec::chain{.gamma = 8, .scheme = scheme};
        opts.draft.stop_below = scheme == specdec::verification_scheme::token ? 0.0f : 0.3f;
        target.clear_cache();
        draft.clear_cache();
        const auto r = specdec::speculative_decode(limited, target, prompt, opts, rng);
        CHECK(r.tokens == g.tokens);
        std::size_t steps = 0;
        for (std::size_t n : r.stats.steps_at_gamma) steps += n;
        CHECK(steps == r.stats.steps);
        CHECK(r.stats.steps_at_gamma.size() >= 2);  // the warm-up drafted, whatever came next
    }
}

TEST_CASE("llama2: drafting stops at the draft's 256-token window and generation goes on to the target's",
          "[llama2][speculative][limits]") {
    const auto dir = models_dir({target_file, draft_file});
    if (!dir) return;
    llama2::transformer target(load(*dir / target_file)), draft(load(*dir / draft_file));
    llama2::context_limited_drafter<llama2::transformer> limited(draft);
    const tokens prompt{llama2::tokenizer::bos_id};
    // No stop tokens: exactly 400 tokens, well past the draft's 256.
    const specdec::decode_options opts{.step = specdec::chain{.gamma = 4}, .sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 400}};
    std::mt19937_64 rng(1);
    const auto r = specdec::speculative_decode(limited, target, prompt, opts, rng);
    const auto g = specdec::autoregressive_decode(target, prompt, opts, rng);
    CHECK(r.tokens.size() == 400);
    CHECK(r.tokens == g.tokens);
    // Without the limit, the draft model itself refuses a context beyond its window.
    CHECK_THROWS_AS(specdec::speculative_decode(draft, target, prompt, opts, rng), std::length_error);
}

TEST_CASE("llama2: the demo's summary shows alpha only from enough positions", "[llama2][summary]") {
    CHECK(llama2::alpha_text(0.71234, 30) == "0.712");
    CHECK(llama2::alpha_text(0.9, 29) == "n/a (only 29 positions tested)");
    CHECK(llama2::alpha_text(1.0, 1) == "n/a (only 1 position tested)");
    CHECK(llama2::alpha_text(0.0, 0) == "n/a (only 0 positions tested)");
    specdec::decode_stats st;
    st.accepted_tokens = 5;
    st.rejected_tokens = 2;
    st.reached_at_position = {4, 3, 1};
    st.expected_accepted_at_position = {3.0, 2.0};  // positions 1 and 2 estimated: 7 tested
    CHECK(llama2::tested_positions(st) == 7);
    CHECK(llama2::estimated_positions(st) == 7);
}

TEST_CASE("llama2: the demo's summary says why the adaptive policy kept speculation off", "[llama2][summary]") {
    using specdec_test::contains;
    // Known costs: a draft token 1.1 target steps (c = 1.1), a target pass 1 whatever its length.
    specdec::gamma_controller slow(8, {.draft_cost = [](std::size_t n) { return 1.1 * static_cast<double>(n); },
                                       .pass_cost = [](std::size_t) { return 1.0; }});
    specdec::decode_stats st;
    st.steps = 100;
    st.steps_at_gamma = {90, 10};
    st.reached_at_position = {10};
    st.expected_accepted_at_position = {7.0};
    // Too few positions for alpha: the policy's own (no observations: its prior 1/2); at alpha
    // 1/2 and c = 1.1 the best is gamma 1, 1.5 / 2.1 = 0.71x.
    auto line = llama2::speculation_off_reason(st, slow);
    REQUIRE(line);
    CHECK_THAT(*line, contains("speculation off in 90 of 100 steps") && contains("c = 1.10 target steps") &&
                          contains("alpha n/a (only 10 positions tested)") && contains("the policy's 0.50") &&
                          contains("0.71x (gamma 1)") && contains("does not pay"));
    // Enough positions: the run's alpha, 28 / 40 = 0.7: 1.7 / 2.1 = 0.81x.
    st.reached_at_position = {40};
    st.expected_accepted_at_position = {28.0};
    line = llama2::speculation_off_reason(st, slow);
    REQUIRE(line);
    CHECK_THAT(*line, contains("at alpha 0.700") && contains("0.81x (gamma 1)") && contains("does not pay"));
    // A cheap draft (c = 0.1) that would pay: the line says so, and what else the policy counts.
    specdec::gamma_controller cheap(8, {.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); },
                                        .pass_cost = [](std::size_t) { return 1.0; }});
    const std::size_t g = specdec::optimal_gamma(0.7, 0.1, 8);
    char want[64];
    std::snprintf(want, sizeof want, "%.2fx (gamma %zu)", specdec::expected_walltime_improvement(0.7, g, 0.1), g);
    line = llama2::speculation_off_reason(st, cheap);
    REQUIRE(line);
    CHECK_THAT(*line, contains("c = 0.10") && contains(want) && contains("catch up"));
    // Speculation on for most steps: nothing to explain.
    st.steps_at_gamma = {50, 50};
    CHECK_FALSE(llama2::speculation_off_reason(st, slow));
    CHECK_FALSE(llama2::speculation_off_reason(specdec::decode_stats{}, slow));
}
