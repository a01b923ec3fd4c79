// Fuzz harness: token and block verification (specdec/verify.hpp) with arbitrary target rows,
// draft tokens, draft distributions (or weights with scales, or point masses) and uniforms.
//
// Input: an instruction-set byte, a mode byte (scheme, draft kind, whether draft columns are
// checked, a shape error to inject), a lenience byte, the sampling settings, the vocabulary size
// V, the draft length γ (0..8), the γ+1 target columns (each a repeated pattern of
// fuzz::any_float values), the γ draft tokens (mostly in range, sometimes raw int32), the draft
// columns (standardized from fuzz logits, point-like, or raw weights) and their scales; the rest
// of the input is the generator's tape, so the input chooses the uniforms too.
//
// Invariants: std::invalid_argument when and only when the documented conditions allow it
// (shapes, token range, settings, lenience, scales: always; a bad first target row, or at
// temperature > 0 a bad first checked draft column: always; bad later rows or columns: may);
// no other exception. Otherwise: accepted <= γ, next_token in [0, V), every accepted token and
// the next token have positive target probability, a draft token with q(x) = 0 is never
// accepted, temperature 0 is greedy (accept while the draft token is the argmax, then the
// argmax), and the same generator state gives the same result with a reused workspace, also
// after a call with a shorter draft.

#include "fuzz_common.hpp"

#include <optional>
#include <stdexcept>

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

enum class draft_kind { point_mass, probs, scaled, unchecked_garbage };

struct verify_case {
    Eigen::MatrixXf target;  // V x (γ + 1), or a wrong shape
    std::vector<specdec::token_id> tokens;
    Eigen::MatrixXf probs;   // V x γ, or a wrong shape (unused for point masses)
    std::vector<float> scales;
    draft_kind kind = draft_kind::probs;
    specdec::sampling_config sampling;
    specdec::verify_options opts;
};

/// Whether draft column i (with its scale) is one verification's check rejects.
FUZZ_NO_COVERAGE bool bad_column(const Eigen::MatrixXf& q, Eigen::Index i, float c) {
    double s = 0.0;
    const float* col = q.col(i).data();  // (raw pointer: see fuzz::fill_cycled)
    for (Eigen::Index k = 0; k < q.rows(); ++k) {
        const float v = col[k];
        if (!(v >= 0.0f) || !std::isfinite(v)) return true;
        const float entry = c * v;
        if (!(entry >= 0.0f && entry <= 1.0f)) return true;
        s += v;
    }
    return std::abs(s * c - 1.0) > specdec::draft_probability_tolerance;
}

/// The standardized target distribution of column j (settings known valid, row known good).
Eigen::VectorXf target_probs(const verify_case& c, Eigen::Index j, specdec::sampling_workspace& sws) {
    Eigen::VectorXf p(c.target.rows());
    specdec::standardize(c.target.col(j), c.sampling, p, sws);
    return p;
}

specdec::verify_result run(const verify_case& c, std::span<const std::uint8_t> tape, specdec::verify_workspace& ws) {
    fuzz::tape_rng rng(tape);
    switch (c.kind) {
        case draft_kind::point_mass:
            return specdec::verify(c.target, c.tokens, specdec::point_mass, c.sampling, rng, ws, c.opts);
        case draft_kind::scaled:
            return specdec::verify(c.target, c.tokens, c.probs, std::span<const float>(c.scales), c.sampling, rng, ws,
                                   c.opts);
        default:
            return specdec::verify(c.target, c.tokens, c.probs, c.sampling, rng, ws, c.opts);
    }
}

/// Whether token t is in the support of column j's target distribution. Standardizing in
/// float flushes a probability below about 1e-45 to 0, while the sampler works with the
/// unnormalized weights exp((l - max) / T) and so can draw a token whose float probability is
/// 0 (with a uniform at or next to 0: a chance of about 2^-53 per draw). Such a token is in
/// the support (its true probability is positive, below 1e-30), so it counts when its logit is
/// finite and the top-k filter keeps it; the other filters cannot drop a token that small
/// without it being below 1e-30 of the mass either way.
FUZZ_NO_COVERAGE bool in_support(const verify_case& c, Eigen::Index j, const Eigen::VectorXf& p, specdec::token_id t) {
    if (p[t] > 0.0f) return true;
    const Eigen::VectorXf col = c.target.col(j);
    const float l = col[t];
    if (!std::isfinite(l) || c.sampling.temperature == 0.0f) return false;
    const double weight = std::exp((static_cast<double>(l) - static_cast<double>(col.maxCoeff())) /
                                   static_cast<double>(c.sampling.temperature));
    if (!(weight < 1e-30)) return false;
    if (c.sampling.top_k > 0 && c.sampling.top_k < col.size()) {
        std::vector<float> sorted(col.data(), col.data() + col.size());
        std::nth_element(sorted.begin(), sorted.begin() + (c.sampling.top_k - 1), sorted.end(), std::greater<>());
        if (l < sorted[static_cast<std::size_t>(c.sampling.top_k - 1)]) return false;
    }
    return true;
}

/// Verifies the case and checks the outcome; returns it (nullopt after an error).
std::optional<specdec::verify_result> check(const verify_case& c, std::span<const std::uint8_t> tape,
                                            specdec::verify_workspace& ws) {
    const Eigen::Index V = c.target.rows();
    const std::size_t gamma = c.tokens.size();
    const auto g = static_cast<Eigen::Index>(gamma);
    const bool with_q = c.kind != draft_kind::point_mass;
    const bool checked = with_q && c.opts.check_draft_distributions;
    const auto scale = [&](Eigen::Index i) {
        return c.kind == draft_kind::scaled ? c.scales[static_cast<std::size_t>(i)] : 1.0f;
    };

    // Conditions checked up front, whatever the random path.
    bool upfront = V == 0 || !fuzz::valid_sampling(c.sampling) ||
                   !(c.opts.lenience > 0.0f && c.opts.lenience <= 1.0f) ||
                   (c.opts.lenience != 1.0f && c.opts.scheme == specdec::verification_scheme::block) ||
                   c.target.cols() != g + 1 || (with_q && (c.probs.rows() != V || c.probs.cols() != g));
    for (const specdec::token_id t : c.tokens) upfront = upfront || t < 0 || t >= V;
    if (c.kind == draft_kind::scaled) {
        upfront = upfront || c.scales.size() != gamma;
        for (const float sc : c.scales) upfront = upfront || !(sc > 0.0f && sc < inf);
    }

    // Rows and columns verification may read: the first always, the others depending on the draws.
    bool first_bad = false, any_bad = false, q_bad = false;
    if (!upfront) {
        first_bad = fuzz::bad_logit_row(c.target.col(0));
        for (Eigen::Index j = 0; j <= g; ++j) any_bad = any_bad || fuzz::bad_logit_row(c.target.col(j));
        if (with_q)
            for (Eigen::Index i = 0; i < g; ++i) q_bad = q_bad || bad_column(c.probs, i, scale(i));
        if (checked && g >= 1 && c.sampling.temperature > 0.0f && bad_column(c.probs, 0, scale(0))) first_bad = true;
    }
    const bool must_throw = upfront || first_bad;
    const bool may_throw = must_throw || any_bad || (checked && q_bad);

    specdec::verify_result r;
    bool threw = false;
    try {
        r = run(c, tape, ws);
    } catch (const std::invalid_argument&) {
        threw = true;
    }
    FUZZ_CHECK(!threw || may_throw);
    FUZZ_CHECK(threw || !must_throw);
    if (threw) return std::nullopt;

    FUZZ_CHECK(r.accepted <= gamma);
    FUZZ_CHECK(r.next_token >= 0 && r.next_token < V);
    if (any_bad || q_bad) return r;  // unchecked columns that are not distributions: nothing more is promised

    // Every row is good from here on: compare with the target's standardized distributions.
    specdec::sampling_workspace sws;
    for (std::size_t i = 0; i < r.accepted; ++i) {
        const auto col = static_cast<Eigen::Index>(i);
        const Eigen::VectorXf p = target_probs(c, col, sws);
        FUZZ_CHECK(in_support(c, col, p, c.tokens[i]));
        if (with_q) FUZZ_CHECK(scale(col) * c.probs(c.tokens[i], col) > 0.0f);  // q(x) = 0 is rejected
    }
    const auto a = static_cast<Eigen::Index>(r.accepted);
    const Eigen::VectorXf p_next = target_probs(c, a, sws);
    FUZZ_CHECK(in_support(c, a, p_next, r.next_token));
    if (c.sampling.temperature == 0.0f) {
        // Greedy: every accepted token is its row's argmax (ties to the lowest id), and so is the
        // next token. Token verification accepts exactly while x_i is the argmax with q_i(x_i) > 0.
        // Block verification does too, except that it cannot accept the prefix before a rejected
        // x_{k+1} when q_{k+1} gives the argmax probability 1 (then R_k = 0 and h_k = 0): that
        // happens only for a draft token outside its own column's support, or a column that
        // rounds above 1 within the tolerance; then it may accept fewer, never more.
        std::size_t expect = 0;
        for (; expect < gamma; ++expect) {
            const auto i = static_cast<Eigen::Index>(expect);
            Eigen::Index best = 0;
            c.target.col(i).maxCoeff(&best);
            if (c.tokens[expect] != best) break;
            if (with_q && !(scale(i) * c.probs(c.tokens[expect], i) > 0.0f)) break;
        }
        for (std::size_t i = 0; i < r.accepted; ++i) {
            Eigen::Index best = 0;
            c.target.col(static_cast<Eigen::Index>(i)).maxCoeff(&best);
            FUZZ_CHECK(c.tokens[i] == best);
        }
        bool exact = c.opts.scheme == specdec::verification_scheme::token || expect == gamma || !with_q;
        if (!exact) {
            const auto k = static_cast<Eigen::Index>(expect);
            Eigen::Index best = 0;
            c.target.col(k).maxCoeff(&best);
            exact = scale(k) * c.probs(best, k) < 1.0f;
        }
        FUZZ_CHECK(r.accepted <= expect);
        if (exact) FUZZ_CHECK(r.accepted == expect);
        Eigen::Index best = 0;
        c.target.col(a).maxCoeff(&best);
        FUZZ_CHECK(r.next_token == best);
    }
    return r;
}

float lenience(fuzz::input& in) {
    static constexpr float values[] = {0.5f, 0.3f, 1e-30f, 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                                       1.5f, 0.999f};
    const std::uint8_t b = in.byte();
    if (b < 160) return 1.0f;
    if (b < 250) return values[b % 8];
    return in.raw<float>();
}

float scale(fuzz::input& in, Eigen::Index V) {
    static constexpr float values[] = {0.5f, 2.0f, 1e-30f, 1e30f, 0.0f, -1.0f, inf,
                                       std::numeric_limits<float>::quiet_NaN(), 0.25f, 3.0f};
    const std::uint8_t b = in.byte();
    if (b < 100) return 1.0f;
    if (b < 180) return 1.0f / static_cast<float>(V);
    if (b < 250) return values[b % 10];
    return in.raw<float>();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::input in(data, size);
    fuzz::pick_isa(in);
    const std::uint8_t mode = in.byte();
    verify_case c;
    c.opts.scheme = (mode & 1u) != 0 ? specdec::verification_scheme::token : specdec::verification_scheme::block;
    c.kind = static_cast<draft_kind>((mode >> 1) & 3u);
    c.opts.check_draft_distributions = c.kind != draft_kind::unchecked_garbage && (mode & 8u) == 0;
    const std::uint8_t shape_error = (mode >> 4) & 7u;  // 0..4: none; 5, 6, 7: one shape wrong
    c.opts.lenience = lenience(in);
    c.sampling = fuzz::sampling(in);
    const Eigen::Index V = fuzz::vocab_size(in);
    const auto gamma = static_cast<std::size_t>(in.byte() % 9);
    const auto g = static_cast<Eigen::Index>(gamma);

    c.target.resize(V, g + 1 + (shape_error == 5 ? 1 : 0));
    for (Eigen::Index j = 0; j < c.target.cols(); ++j) {
        Eigen::VectorXf col(V);
        fuzz::fill_cycled(in, col, in.range(1, 16), fuzz::any_float);
        c.target.col(j) = col;
    }
    for (std::size_t i = 0; i < gamma; ++i) {
        const std::uint8_t b = in.byte();
        c.tokens.push_back(b < 240 ? static_cast<specdec::token_id>(in.byte() % V) : in.raw<std::int32_t>());
    }
    if (c.kind != draft_kind::point_mass) {
        c.probs.resize(V + (shape_error == 6 ? 1 : 0), g + (shape_error == 7 ? 1 : 0));
        specdec::sampling_workspace sws;
        for (Eigen::Index i = 0; i < c.probs.cols(); ++i) {
            Eigen::VectorXf col(c.probs.rows());
            const std::uint8_t how = in.byte();
            if (c.kind == draft_kind::unchecked_garbage || how >= 240) {
                fuzz::fill_cycled(in, col, in.range(1, 16), fuzz::any_weight);
            } else if (how >= 200) {  // most of the mass on one token, the token drafted or not
                col.setConstant(0.0f);
                col[in.byte() % col.size()] = 1.0f;
            } else {  // a distribution the way a drafter makes one: standardized fuzz logits
                Eigen::VectorXf z(col.size());
                fuzz::fill_cycled(in, z, in.range(1, 16), fuzz::any_float);
                specdec::sampling_config s = fuzz::valid_sampling(c.sampling) ? c.sampling : specdec::sampling_config{};
                if ((how & 1u) != 0) s = {};
                try {
                    specdec::standardize(z, s, col, sws);
                } catch (const std::invalid_argument&) {
                    col.setConstant(1.0f / static_cast<float>(col.size()));
                }
            }
            c.probs.col(i) = col;
        }
        if (c.kind == draft_kind::scaled) {
            for (Eigen::Index i = 0; i < c.probs.cols(); ++i) {
                const float sc = scale(in, V);
                c.scales.push_back(sc);
                if (sc > 0.0f && sc < inf) c.probs.col(i) /= sc;  // weights w with q = sc · w
            }
            if (in.byte() >= 250) c.scales.push_back(1.0f);  // one too many
        }
    }
    const std::span<const std::uint8_t> tape = in.rest();

    specdec::verify_workspace ws;
    const std::optional<specdec::verify_result> first = check(c, tape, ws);
    // The same workspace, a shorter draft of the same case, then the full one again: the same
    // generator state gives the same result (also when the first call threw).
    if (gamma > 0) {
        const auto shorter = static_cast<Eigen::Index>(tape.empty() ? 0 : tape[0] % gamma);
        verify_case sub = c;
        sub.target = c.target.leftCols(std::min(shorter + 1, c.target.cols()));
        sub.tokens.resize(static_cast<std::size_t>(shorter));
        if (c.kind != draft_kind::point_mass) sub.probs = c.probs.leftCols(std::min(shorter, c.probs.cols()));
        if (c.kind == draft_kind::scaled) sub.scales.resize(std::min(sub.scales.size(), std::size_t(shorter)));
        check(sub, tape, ws);
        const std::optional<specdec::verify_result> again = check(c, tape, ws);
        FUZZ_CHECK(first.has_value() == again.has_value());
        if (first) FUZZ_CHECK(first->accepted == again->accepted && first->next_token == again->next_token);
    }
    return 0;
}
