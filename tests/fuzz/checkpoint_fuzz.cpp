// Fuzz harness: the llama2.c checkpoint reader (examples/llama2/checkpoint.hpp), the
// transformer built on it (examples/llama2/transformer.hpp) and one speculative step with it.
//
// Input: 4 control bytes (instruction set; context and draft tokens; early-exit depth and
// drafter; sampling settings, and whether to fit the file to its header's size), then the
// checkpoint file, byte for byte. The file is the input (or, fitted, at most 16 KiB), so a
// header can never make the harness allocate more than that (the reader checks the file's
// size against the header before allocating); libFuzzer's -max_len (scripts/fuzz.sh) bounds it.
//
// Invariants: read_checkpoint throws only std::invalid_argument for a malformed file (never
// runtime_error for a file that exists, never bad_alloc for a file this small); a file it
// accepts has a valid config whose implied size is the file's, weights that pass
// check_weights and hold the file's bytes, and writes back (write_checkpoint) to the same bytes
// outside the legacy RoPE tables. A transformer over it scores at most 2 tokens: score(context,
// draft) has V x 2 logits whose columns equal next_logits of each prefix (both NaN, or equal:
// the determinism the header documents), length_error when seq_len is 1, out_of_range for a
// token outside the vocabulary, invalid_argument for an empty context or a bad early-exit
// depth. One speculative_step (γ = 1) with a transformer as drafter and one as verifier
// either succeeds, appending 1 or 2 tokens in range, or throws std::invalid_argument (only when
// some logits were NaN, +Inf or all -Inf) or std::length_error (only at seq_len 1), leaving the
// sequence and statistics as they were.

#include "fuzz_common.hpp"

#include <llama2/checkpoint.hpp>
#include <llama2/transformer.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>

namespace {

/// Equal as floats, or both NaN.
bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

FUZZ_NO_COVERAGE bool same_columns(const Eigen::VectorXf& a, const Eigen::VectorXf& b) {
    if (a.size() != b.size()) return false;
    for (Eigen::Index i = 0; i < a.size(); ++i)
        if (!same_value(a[i], b[i])) return false;
    return true;
}

std::vector<std::uint8_t> read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class F>
bool throws(F&& f) {
    try {
        f();
    } catch (const std::exception&) {
        return true;
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::temp_file file("checkpoint"), copy("checkpoint-copy");
    fuzz::input in(data, size);
    fuzz::pick_isa(in);
    const std::uint8_t tokens = in.byte(), depth = in.byte(), settings = in.byte();
    std::span<const std::uint8_t> bytes = in.rest();
    // Settings bit 7: fit the file to the size its header implies (padding with the input's own
    // bytes repeated, or cutting), when the header is valid and that size is small, so that
    // mutated headers and weights still make readable checkpoints; else the bytes as they are.
    std::vector<std::uint8_t> fitted;
    if ((settings & 0x80u) != 0 && bytes.size() >= 28) {
        llama2::config c;
        std::int32_t h[7];
        std::memcpy(h, bytes.data(), sizeof h);
        c.dim = h[0], c.hidden_dim = h[1], c.n_layers = h[2], c.n_heads = h[3], c.n_kv_heads = h[4];
        c.vocab_size = h[5] == std::numeric_limits<std::int32_t>::min() ? 0 : (h[5] < 0 ? -h[5] : h[5]);
        c.shared_classifier = h[5] > 0;
        c.seq_len = h[6];
        try {
            c.validate("fit");
            const std::uint64_t want = llama2::checkpoint_file_size(c);
            if (want <= 16384) {
                fitted.resize(static_cast<std::size_t>(want));
                for (std::size_t i = 0; i < fitted.size(); ++i) fitted[i] = bytes[i % bytes.size()];
                bytes = fitted;
            }
        } catch (const std::invalid_argument&) {
        }
    }
    file.write(bytes);

    std::shared_ptr<llama2::checkpoint> ck;
    try {
        ck = std::make_shared<llama2::checkpoint>(llama2::read_checkpoint(file.path()));
    } catch (const std::invalid_argument&) {
        return 0;
    }
    const llama2::config& c = ck->cfg;
    c.validate("fuzz");  // a config the reader accepted is valid
    FUZZ_CHECK(llama2::checkpoint_file_size(c) == bytes.size());
    llama2::check_weights(c, ck->w, "fuzz");
    std::int32_t header[7];
    std::memcpy(header, bytes.data(), sizeof header);
    FUZZ_CHECK(header[0] == c.dim && header[1] == c.hidden_dim && header[2] == c.n_layers &&
               header[3] == c.n_heads && header[4] == c.n_kv_heads && header[6] == c.seq_len);
    FUZZ_CHECK(header[5] == (c.shared_classifier ? c.vocab_size : -c.vocab_size));
    const std::size_t embedding_bytes = ck->w.token_embedding.size() * sizeof(float);
    FUZZ_CHECK(std::memcmp(ck->w.token_embedding.data(), bytes.data() + 28, embedding_bytes) == 0);
    // Written back: the same bytes, except the RoPE tables, which the writer recomputes.
    llama2::write_checkpoint(copy.path(), c, ck->w);
    const std::vector<std::uint8_t> again = read_all(copy.path());
    FUZZ_CHECK(again.size() == bytes.size());
    const std::size_t rope = 2 * llama2::detail::rope_table_floats(c) * sizeof(float);
    const std::size_t tail = c.shared_classifier ? 0 : ck->w.wcls.size() * sizeof(float);
    const std::size_t head = bytes.size() - rope - tail;
    FUZZ_CHECK(std::memcmp(again.data(), bytes.data(), head) == 0);
    FUZZ_CHECK(std::memcmp(again.data() + head + rope, bytes.data() + head + rope, tail) == 0);

    // A transformer: the full model, or an early exit; a depth out of range is an error.
    const int layers = depth % 4 == 3 ? c.n_layers + 1 : static_cast<int>(depth % 4);
    std::optional<llama2::transformer> target;
    try {
        target.emplace(std::shared_ptr<const llama2::checkpoint>(ck), layers > c.n_layers ? layers : 0);
        FUZZ_CHECK(layers <= c.n_layers);
    } catch (const std::invalid_argument&) {
        FUZZ_CHECK(layers > c.n_layers);
        target.emplace(std::shared_ptr<const llama2::checkpoint>(ck));
    }
    llama2::transformer draft = layers >= 1 && layers <= c.n_layers ? target->early_exit(layers) : *target;
    const std::int32_t V = c.vocab_size;
    const std::int32_t t0 = (tokens & 15) % V, t1 = (tokens >> 4) % V;
    const std::vector<std::int32_t> ctx{t0}, two{t0, t1};
    const std::vector<std::int32_t> one_draft{t1};

    FUZZ_CHECK(throws([&] { (void)target->next_logits({}); }));
    FUZZ_CHECK(throws([&] { (void)target->next_logits(std::vector<std::int32_t>{V}); }));
    const Eigen::VectorXf p0 = target->next_logits(ctx);
    FUZZ_CHECK(p0.size() == V);
    if (c.seq_len < 2) {
        try {
            (void)target->score(ctx, one_draft);
            FUZZ_CHECK(false);
        } catch (const std::length_error&) {
        }
    } else {
        const Eigen::MatrixXf scores = target->score(ctx, one_draft);
        FUZZ_CHECK(scores.rows() == V && scores.cols() == 2);
        const Eigen::VectorXf p1 = target->next_logits(two);
        FUZZ_CHECK(same_columns(scores.col(0), p0));
        FUZZ_CHECK(same_columns(scores.col(1), p1));
    }

    // One speculative step with γ = 1: the drafter reads 1 token, the target scores 2. Both are
    // wrapped to record whether any row they returned was one the step must reject.
    bool bad_rows = false;
    struct recording_drafter {
        llama2::transformer* m;
        bool* bad;
        std::ptrdiff_t vocab_size() const { return m->vocab_size(); }
        Eigen::VectorXf next_logits(std::span<const specdec::token_id> context) {
            Eigen::VectorXf z = m->next_logits(context);
            *bad = *bad || fuzz::bad_logit_row(z);
            return z;
        }
    } drafter{&draft, &bad_rows};
    struct recording_verifier {
        llama2::transformer* m;
        bool* bad;
        std::ptrdiff_t vocab_size() const { return m->vocab_size(); }
        Eigen::MatrixXf score(std::span<const specdec::token_id> context, std::span<const specdec::token_id> d) {
            FUZZ_CHECK(context.size() + d.size() <= 2);
            Eigen::MatrixXf z = m->score(context, d);
            for (Eigen::Index j = 0; j < z.cols(); ++j) *bad = *bad || fuzz::bad_logit_row(z.col(j));
            return z;
        }
    } verifier{&*target, &bad_rows};
    static constexpr float temperatures[] = {1.0f, 0.0f, 0.7f, 1e-3f};
    specdec::step_options opts;
    opts.gamma = 1;
    opts.sampling.temperature = temperatures[settings & 3u];
    opts.sampling.top_k = (settings & 4u) ? 2 : 0;
    opts.sampling.top_p = (settings & 8u) ? 0.5f : 1.0f;
    opts.scheme = (settings & 16u) ? specdec::verification_scheme::token : specdec::verification_scheme::block;
    std::vector<specdec::token_id> sequence(ctx.begin(), ctx.end());
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    fuzz::tape_rng rng(bytes.first(std::min<std::size_t>(bytes.size(), 32)));
    try {
        const specdec::step_result r = specdec::speculative_step(drafter, verifier, sequence, stats, opts, rng, ws);
        FUZZ_CHECK(c.seq_len >= 2);
        FUZZ_CHECK(sequence.size() == 1 + r.accepted + 1 && r.accepted <= 1);
        for (const specdec::token_id t : sequence) FUZZ_CHECK(t >= 0 && t < V);
        FUZZ_CHECK(stats.steps == 1);
    } catch (const std::invalid_argument&) {
        FUZZ_CHECK(bad_rows);
        FUZZ_CHECK(sequence == ctx && stats.steps == 0);
    } catch (const std::length_error&) {
        FUZZ_CHECK(c.seq_len < 2);
        FUZZ_CHECK(sequence == ctx && stats.steps == 0);
    }
    return 0;
}
