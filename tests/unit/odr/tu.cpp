// One translation unit of the odr.link_order test. CMakeLists.txt compiles this file twice: as
// specdec_odr_a with the build's flags and as specdec_odr_b with -march=native added, and
// SPECDEC_ODR_TU (a or b) names the entry point, run_a or run_b. Both run the same battery
// through the public API. specdec is header-only: the linker keeps one body of each of its inline
// functions, taken from whichever object comes first, so unless the library gives the same bits
// under any flags, what each entry point returns depends on the link order.
//
// The inputs are built from integers with one float multiply per value, so they are the same bits
// under any flags (nothing to contract into an FMA): a difference in the outputs is the library's.

#include "odr.hpp"

#include <specdec/specdec.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#ifndef SPECDEC_ODR_TU
#error "define SPECDEC_ODR_TU as a or b"
#endif
#define SPECDEC_ODR_CAT2(x, y) x##y
#define SPECDEC_ODR_CAT(x, y) SPECDEC_ODR_CAT2(x, y)

namespace {

using specdec::sampling_config;
using specdec::token_id;
using specdec_odr::item;

/// splitmix64: a fixed sequence of 64-bit words (integer arithmetic only).
struct splitmix64 {
    std::uint64_t s;
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
};

/// The sum of four 16-bit uniforms, centred: an integer in [-131070, 131070] of standard deviation
/// 65536 / sqrt(3) = 37837.
std::int32_t centred(splitmix64& g) {
    const std::uint64_t x = g.next();
    std::int32_t s = 0;
    for (int i = 0; i < 4; ++i) s += static_cast<std::int32_t>((x >> (16 * i)) & 0xffffu);
    return s - 2 * 65535;
}

/// Logit units: centred() times this has a standard deviation of 3.
constexpr float unit = 3.0f / 37837.0f;
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// A vocab x cols matrix of logits, about N(0, 9) each. With inf_every > 0, tokens
/// c, c + inf_every, ... of column c are -inf (masked), in the columns that inf_columns selects
/// (bit c). With drafted set, the logits of the same seed plus noise of standard deviation 1.5:
/// a draft model's view of the same rows.
Eigen::MatrixXf make_logits(Eigen::Index vocab, Eigen::Index cols, std::uint64_t seed, int inf_every,
                            unsigned inf_columns, bool drafted) {
    splitmix64 g{seed}, noise{~seed};
    Eigen::MatrixXf z(vocab, cols);
    for (Eigen::Index c = 0; c < cols; ++c) {
        const bool masked = inf_every > 0 && ((inf_columns >> c) & 1u) != 0;
        for (Eigen::Index i = 0; i < vocab; ++i) {
            std::int32_t v = centred(g);
            if (drafted) v += centred(noise) / 2;
            z(i, c) = masked && (i - c) % inf_every == 0 ? neg_inf : static_cast<float>(v) * unit;
        }
    }
    return z;
}

struct named_config {
    const char* name;
    sampling_config s;
};

const named_config configs[] = {
    {"T1", {}},
    {"T0.7", {.temperature = 0.7f}},
    {"T1-p0.9", {.temperature = 1.0f, .top_p = 0.9f}},
    {"T0.7-k40", {.temperature = 0.7f, .top_k = 40}},
    {"T0", {.temperature = 0.0f}},
};

constexpr Eigen::Index sizes[] = {7, 100, 512, 2049, 32000};
constexpr double uniforms[] = {0.0, 0.1, 0.5, 0.9, 0.999999};

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
std::uint32_t word(Eigen::Index i) { return static_cast<std::uint32_t>(i); }

void append(std::vector<std::uint32_t>& w, const Eigen::Ref<const Eigen::VectorXf>& v) {
    for (Eigen::Index i = 0; i < v.size(); ++i) w.push_back(bits(v[i]));
}

/// standardize (with draws from its result), standardize_and_sample and standardize_weights_and_sample on one row.
void sampling_items(std::vector<item>& items, const Eigen::VectorXf& row, const std::string& row_name) {
    specdec::sampling_workspace ws;
    Eigen::VectorXf out(row.size());
    for (const named_config& c : configs) {
        const std::string suffix = row_name + "/" + c.name;

        item a{"standardize/" + suffix, {}};
        specdec::standardize(row, c.s, out, ws);
        append(a.words, out);
        items.push_back(std::move(a));

        // Draws from that distribution: with 256 uniforms of 53 bits from a fixed sequence, then with
        // uniforms at 64 boundaries between tokens (the running sum in double, left to right, over the
        // total), where a sum taken in another order can give the neighbouring token.
        item w{"sample_from_weights/" + suffix, {}};
        splitmix64 g{0x5eed};
        for (int k = 0; k < 256; ++k) {
            const double u = static_cast<double>(g.next() >> 11) * 0x1.0p-53;
            w.words.push_back(word(specdec::sample_from_weights(out, u, ws)));
        }
        std::vector<double> running(static_cast<std::size_t>(out.size()) + 1, 0.0);
        for (Eigen::Index i = 0; i < out.size(); ++i)
            running[static_cast<std::size_t>(i) + 1] = running[static_cast<std::size_t>(i)] + out[i];
        for (Eigen::Index k = 0; k < 64; ++k) {
            const double u = running[static_cast<std::size_t>(k * out.size() / 64)] / running.back();
            w.words.push_back(word(specdec::sample_from_weights(out, std::min(u, 0x1.fffffffffffffp-1), ws)));
        }
        items.push_back(std::move(w));

        item b{"standardize_and_sample/" + suffix, {}};
        for (const double u : uniforms) b.words.push_back(word(specdec::standardize_and_sample(row, c.s, out, u, ws)));
        append(b.words, out);
        items.push_back(std::move(b));

        item d{"standardize_weights_and_sample/" + suffix, {}};
        for (const double u : uniforms) {
            const specdec::token_draw draw = specdec::standardize_weights_and_sample(row, c.s, out, u, ws);
            d.words.push_back(word(draw.token));
            d.words.push_back(bits(draw.scale));
        }
        append(d.words, out);
        items.push_back(std::move(d));
    }
}

enum class draft_form { probs, weights, point_mass };

/// verify with γ = 4 over `trials` draft blocks: the target's logits are fixed, each trial draws
/// its four draft tokens from the draft columns and verifies them. The words, per trial: the draft
/// tokens, the accepted count, the next token, and the generator's next output, which shows how
/// many uniforms verification used.
item verify_item(Eigen::Index vocab, const named_config& c, specdec::verification_scheme scheme, draft_form form,
                 int trials) {
    constexpr Eigen::Index gamma = 4;
    const std::uint64_t seed = 1000u + static_cast<std::uint64_t>(vocab);
    const Eigen::MatrixXf target = make_logits(vocab, gamma + 1, seed, 11, 0b01010u, false);
    const Eigen::MatrixXf draft_logits = make_logits(vocab, gamma, seed, 11, 0b01010u, true);

    // The draft columns: distributions (standardize), or weights with a scale each.
    specdec::sampling_workspace sws;
    Eigen::MatrixXf q(vocab, gamma);
    std::vector<float> scales(static_cast<std::size_t>(gamma), 1.0f);
    for (Eigen::Index i = 0; i < gamma; ++i) {
        if (form == draft_form::weights)
            scales[static_cast<std::size_t>(i)] =
                specdec::standardize_weights_and_sample(draft_logits.col(i), c.s, q.col(i), 0.5, sws).scale;
        else
            specdec::standardize(draft_logits.col(i), c.s, q.col(i), sws);
    }

    const char* scheme_name = scheme == specdec::verification_scheme::token ? "token" : "block";
    const char* form_name = form == draft_form::probs ? "probs" : form == draft_form::weights ? "weights" : "point";
    item it{"verify/V" + std::to_string(vocab) + "/" + c.name + "/" + scheme_name + "/" + form_name, {}};

    specdec::verify_options opts;
    opts.scheme = scheme;
    specdec::verify_workspace ws;
    std::mt19937_64 rng(seed);
    std::vector<token_id> tokens(static_cast<std::size_t>(gamma));
    for (int t = 0; t < trials; ++t) {
        for (Eigen::Index i = 0; i < gamma; ++i) {
            const Eigen::Index x = specdec::sample_from_weights(q.col(i), specdec::uniform01(rng), sws);
            tokens[static_cast<std::size_t>(i)] = static_cast<token_id>(x);
            it.words.push_back(word(x));
        }
        specdec::verify_result r;
        if (form == draft_form::probs)
            r = specdec::verify(target, std::span<const token_id>(tokens), q, c.s, rng, ws, opts);
        else if (form == draft_form::weights)
            r = specdec::verify(target, std::span<const token_id>(tokens), q, std::span<const float>(scales), c.s,
                                rng, ws, opts);
        else
            r = specdec::verify(target, std::span<const token_id>(tokens), specdec::point_mass, c.s, rng, ws, opts);
        it.words.push_back(static_cast<std::uint32_t>(r.accepted));
        it.words.push_back(static_cast<std::uint32_t>(r.next_token));
        it.words.push_back(static_cast<std::uint32_t>(rng()));
    }
    return it;
}

std::string isa() {
    std::string s;
#if defined(__AVX512F__)
    s += " avx512f";
#endif
#if defined(__AVX512DQ__)
    s += " avx512dq";
#endif
#if defined(__AVX2__)
    s += " avx2";
#endif
#if defined(__FMA__)
    s += " fma";
#endif
#if defined(__AVX__)
    s += " avx";
#endif
#if defined(__SSE2__)
    s += " sse2";
#endif
    return s.empty() ? "none" : s.substr(1);
}

}  // namespace

specdec_odr::battery specdec_odr::SPECDEC_ODR_CAT(run_, SPECDEC_ODR_TU)() {
    battery result{isa(), {}};
    // Rows of every size, plain and with every 7th token masked (-inf).
    for (const Eigen::Index n : sizes) {
        const std::uint64_t seed = static_cast<std::uint64_t>(n);
        const Eigen::VectorXf plain = make_logits(n, 1, seed, 0, 0u, false).col(0);
        const Eigen::VectorXf masked = make_logits(n, 1, seed, 7, 1u, false).col(0);
        const std::string name = std::string("V").append(std::to_string(n));
        sampling_items(result.items, plain, name);
        sampling_items(result.items, masked, name + "-inf");
    }
    // Verification under every configuration but greedy (columns 1 and 3 masked): both schemes, three forms of draft.
    const named_config* verify_configs[] = {&configs[0], &configs[1], &configs[2], &configs[3]};
    for (const Eigen::Index n : sizes)
        for (const named_config* c : verify_configs)
            for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block})
                for (const auto form : {draft_form::probs, draft_form::weights, draft_form::point_mass})
                    result.items.push_back(verify_item(n, *c, scheme, form, 100));
    return result;
}
