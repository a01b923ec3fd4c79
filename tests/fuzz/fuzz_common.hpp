#pragma once
// Shared pieces of the libFuzzer harnesses in this folder (see scripts/fuzz.sh): a reader that
// turns the fuzz input into values, a generator whose bits come from the input, float and
// sampling-setting decoders that reach the special values (NaN, ±Inf, subnormals, the largest
// floats), and the invariant check that stops the process on a violation.
//
// Every harness decodes its input with `input`: reading past the end yields zeros, so every
// byte string is a valid input, and short inputs mean "small, default" cases.

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

/// For the harnesses' own per-element loops (filling rows, checking results): no coverage
/// tracing there, which would otherwise cost more than the library calls under test; the
/// sanitizers stay on.
#if defined(__clang__)
#define FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define FUZZ_NO_COVERAGE
#endif

namespace fuzz {

/// Stops the process (a libFuzzer finding) when an invariant does not hold.
[[noreturn]] inline void fail(const char* what, const char* file, int line) {
    std::fprintf(stderr, "\nINVARIANT VIOLATED at %s:%d: %s\n", file, line, what);
    std::fflush(stderr);
    std::abort();
}

}  // namespace fuzz

/// The harnesses' assertion: active in every build (not tied to NDEBUG).
#define FUZZ_CHECK(cond)                                     \
    do {                                                     \
        if (!(cond)) ::fuzz::fail(#cond, __FILE__, __LINE__); \
    } while (false)

namespace fuzz {

/// Reads values off the fuzz input; past its end every read gives 0.
class input {
public:
    input(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}

    [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
    [[nodiscard]] std::size_t left() const noexcept { return n_; }

    std::uint8_t byte() {
        if (n_ == 0) return 0;
        --n_;
        return *p_++;
    }
    bool flag() { return (byte() & 1u) != 0; }
    template <class T>
    T raw() {
        T v{};
        unsigned char buf[sizeof(T)] = {};
        const std::size_t k = n_ < sizeof(T) ? n_ : sizeof(T);
        if (k != 0) std::memcpy(buf, p_, k);
        p_ += k;
        n_ -= k;
        std::memcpy(&v, buf, sizeof(T));
        return v;
    }
    std::uint16_t u16() { return raw<std::uint16_t>(); }
    std::uint32_t u32() { return raw<std::uint32_t>(); }
    std::uint64_t u64() { return raw<std::uint64_t>(); }
    /// An integer in [lo, hi] from one byte (hi - lo < 256) or two.
    std::size_t range(std::size_t lo, std::size_t hi) {
        const std::size_t span = hi - lo + 1;
        const std::size_t v = span <= 256 ? byte() : u16();
        return lo + v % span;
    }
    /// The next `k` bytes (fewer at the end).
    std::span<const std::uint8_t> take(std::size_t k) {
        if (k > n_) k = n_;
        std::span<const std::uint8_t> s(p_, k);
        p_ += k;
        n_ -= k;
        return s;
    }
    std::span<const std::uint8_t> rest() { return take(n_); }

private:
    const std::uint8_t* p_;
    std::size_t n_;
};

/// Floats a harness should meet often: NaN, ±Inf, ±0, subnormals, the extremes, and values
/// around exp's overflow and underflow thresholds.
inline constexpr float special_floats[] = {
    std::numeric_limits<float>::quiet_NaN(),
    -std::numeric_limits<float>::quiet_NaN(),
    std::numeric_limits<float>::infinity(),
    -std::numeric_limits<float>::infinity(),
    0.0f,
    -0.0f,
    std::numeric_limits<float>::denorm_min(),
    -std::numeric_limits<float>::denorm_min(),
    std::numeric_limits<float>::min(),
    -std::numeric_limits<float>::min(),
    std::numeric_limits<float>::max(),
    std::numeric_limits<float>::lowest(),
    1.0f,
    -1.0f,
    88.72f,
    -103.97f,
    1e30f,
    -1e30f,
    0x1.fffffep-1f,
    16777216.0f,
    -87.3f,
    4.2e-39f,
    1e-45f,
    3.0e38f,
};
inline constexpr std::size_t special_count = sizeof(special_floats) / sizeof(special_floats[0]);

/// A float from the input: one tag byte picks a special value, a small multiple of 1/4 (the
/// common case: ordinary logits), or (tag 255) the next four bytes as raw bits.
inline float any_float(input& in) {
    const std::uint8_t tag = in.byte();
    if (tag < special_count) return special_floats[tag];
    if (tag == 255) return in.raw<float>();
    return (static_cast<float>(tag) - 140.0f) * 0.25f;
}

/// A non-negative float mostly in [0, 1] (draft probabilities, weights), with the same escape
/// to specials and raw bits.
inline float any_weight(input& in) {
    const std::uint8_t tag = in.byte();
    if (tag < special_count) return special_floats[tag];
    if (tag == 255) return in.raw<float>();
    return static_cast<float>(tag - special_count) / 128.0f;
}

/// Fills `v` (already sized) from a pattern of floats read off the input, repeated: lets a short
/// input describe a long row (several 2048-float blocks) and exercise the blocked passes.
/// (Raw pointers in the per-element loops of this folder: Eigen's index assertions, which stay on
/// for the library, would otherwise dominate the harnesses' own time.)
template <class Vec, class Read>
FUZZ_NO_COVERAGE void fill_cycled(input& in, Vec&& v, std::size_t pattern, Read read) {
    const auto n = static_cast<std::size_t>(v.size());
    if (n == 0) return;
    std::vector<float> pat(pattern == 0 ? 1 : pattern);
    for (float& x : pat) x = read(in);
    float* out = v.data();
    for (std::size_t i = 0, k = 0; i < n; ++i) {
        out[i] = pat[k];
        if (++k == pat.size()) k = 0;
    }
}

/// A vocabulary size: mostly small (fast, and every value below 64 hits the row tails), now and
/// then long enough for several 2048-float blocks.
inline Eigen::Index vocab_size(input& in, Eigen::Index small_max = 64, Eigen::Index large_max = 9000) {
    const std::uint8_t kind = in.byte();
    if (kind < 200) return 1 + static_cast<Eigen::Index>(in.byte()) % small_max;
    if (kind < 250) return 1 + static_cast<Eigen::Index>(in.u16()) % 600;
    return 1 + static_cast<Eigen::Index>(in.u16()) % large_max;
}

/// Sampling settings, valid or not: each field from a table of ordinary and edge values, or raw.
inline specdec::sampling_config sampling(input& in) {
    static constexpr float temperatures[] = {1.0f, 0.0f, 0.6f, 2.0f, 1e-3f, 5.9e-39f, 5.8e-39f, 1e-38f,
                                             std::numeric_limits<float>::min(), 3.0e38f, -1.0f,
                                             std::numeric_limits<float>::infinity(),
                                             std::numeric_limits<float>::quiet_NaN(),
                                             std::numeric_limits<float>::denorm_min(), 1e-30f, 100.0f};
    static constexpr float probs[] = {1.0f, 0.9f, 0.5f, 0.0f, 1e-7f, 0.999999f, 1.0000001f, -0.5f,
                                      std::numeric_limits<float>::quiet_NaN(), 0.1f, 0.01f,
                                      std::numeric_limits<float>::denorm_min(), 0.3f, 0.7f, 2.0f, 0.05f};
    specdec::sampling_config s;
    const std::uint8_t t = in.byte();
    s.temperature = t < 224 ? temperatures[t % 16] : in.raw<float>();
    const std::uint8_t k = in.byte();
    s.top_k = k < 128 ? 0 : (k < 250 ? k % 40 : static_cast<int>(in.u32()));
    const std::uint8_t p = in.byte();
    s.top_p = p < 128 ? 1.0f : (p < 250 ? probs[p % 16] : in.raw<float>());
    const std::uint8_t m = in.byte();
    s.min_p = m < 128 ? 0.0f : (m < 250 ? probs[m % 16] : in.raw<float>());
    return s;
}

/// A tree step's shape from the input, after its first `levels` - 1 levels: `levels` bytes,
/// each % 4 a level's branching (a 0 ends the tree). A first byte >= 128 instead lists the
/// children of 1 + byte % 8 nodes breadth first (tree_shape::children, each entry byte % 4),
/// with `branching` the list's widest node per depth when bit 64 is clear, else {1, 1}.
/// Returns whether decoding must refuse the shape for its list (a node that does not exist
/// given children, no node, or a branching that is not the list's widths); false without one.
inline bool tree_shape_bytes(input& in, std::size_t levels, specdec::tree_shape& shape) {
    const std::uint8_t first = in.byte();
    shape.branching.clear();
    shape.children.clear();
    if (first < 128) {
        shape.branching.push_back(first % 4u);
        for (std::size_t d = 1; d < levels; ++d) shape.branching.push_back(in.byte() % 4u);
        return false;
    }
    for (std::size_t i = 0; i < 1u + first % 8u; ++i) shape.children.push_back(in.byte() % 4u);
    const bool listed_ok = shape.children_problem() == nullptr;
    if (listed_ok && !(first & 64u)) shape.branching = shape.widest_per_depth();
    else shape.branching = {1, 1};
    return !listed_ok || shape.branching != shape.widest_per_depth();
}

/// adaptive_gamma_options::window from a byte (% 5: 0 is invalid); a byte >= 128 also gives an
/// acceptance prior of 1 + byte % 3 entries (one byte each: % 5 / 4, or 1.5, invalid, for 255).
/// Returns whether the prior is invalid.
inline bool window_and_prior(input& in, specdec::adaptive_gamma_options& a) {
    const std::uint8_t w = in.byte();
    a.window = w % 5u;
    a.acceptance_prior.clear();
    bool invalid = false;
    if (w >= 128) {
        for (std::size_t i = 0; i < 1u + w % 3u; ++i) {
            const std::uint8_t v = in.byte();
            a.acceptance_prior.push_back(v == 255 ? 1.5 : static_cast<double>(v % 5u) / 4.0);
            invalid = invalid || v == 255;
        }
    }
    return invalid;
}

/// Whether specdec::validate() must accept `s` (its documented conditions, written out anew).
inline bool valid_sampling(const specdec::sampling_config& s) {
    const float t = s.temperature;
    const bool t_ok = t == 0.0f || (t > 0.0f && std::isfinite(t) && std::isfinite(2.0f / t));
    return t_ok && s.top_k >= 0 && s.top_p > 0.0f && s.top_p <= 1.0f && s.min_p >= 0.0f && s.min_p <= 1.0f;
}

/// Pins the hot core to an instruction set this CPU runs, chosen by one byte (every path the
/// CPU supports is covered; the others are skipped).
inline void pick_isa(input& in) {
    static const std::vector<specdec::isa> supported = [] {
        std::vector<specdec::isa> v;
        for (const specdec::isa i : {specdec::isa::portable, specdec::isa::avx2, specdec::isa::avx512})
            if (specdec::isa_supported(i)) v.push_back(i);
        return v;
    }();
    const specdec::isa i = supported[in.byte() % supported.size()];
    specdec::force_isa(i);
    FUZZ_CHECK(specdec::active_isa() == i);
}

/// A uniform_random_bit_generator whose words come from a tape of fuzz bytes (so the input
/// chooses the uniforms: 0, values just below 1, ...), then, once the tape is used up, from
/// splitmix64 seeded by the tape.
class tape_rng {
public:
    using result_type = std::uint64_t;
    explicit tape_rng(std::span<const std::uint8_t> tape) : tape_(tape) {
        for (const std::uint8_t b : tape) state_ = state_ * 0x100000001B3ull ^ b;
    }
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
    result_type operator()() {
        if (pos_ + 8 <= tape_.size()) {
            result_type v;
            std::memcpy(&v, tape_.data() + pos_, 8);
            pos_ += 8;
            return v;
        }
        std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

private:
    std::span<const std::uint8_t> tape_;
    std::size_t pos_ = 0;
    std::uint64_t state_ = 0xCBF29CE484222325ull;
};

/// A file of this process's own in the temporary folder (the readers take paths); removed when
/// the process exits normally.
class temp_file {
public:
    explicit temp_file(const char* tag) {
        std::error_code ec;
        std::filesystem::path dir = "/dev/shm";
        if (!std::filesystem::is_directory(dir, ec)) dir = std::filesystem::temp_directory_path();
        path_ = dir / ("specdec-fuzz-" + std::string(tag) + "-" + std::to_string(::getpid()) + ".bin");
    }
    ~temp_file() {
        std::error_code ec;
        std::filesystem::remove(path_, ec);
    }
    temp_file(const temp_file&) = delete;
    temp_file& operator=(const temp_file&) = delete;

    /// Replaces the file's contents with `bytes`.
    const std::filesystem::path& write(std::span<const std::uint8_t> bytes) {
        std::ofstream out(path_, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        out.close();
        FUZZ_CHECK(out.good());
        return path_;
    }
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

private:
    std::filesystem::path path_;
};

/// Whether a row of logits is one verification or standardization must reject: NaN or +Inf
/// somewhere, or every entry -Inf (an empty row included).
/// `row` is a contiguous vector or matrix column.
template <class Row>
FUZZ_NO_COVERAGE bool bad_logit_row(const Row& row) {
    bool finite_or_masked = true, all_masked = true;
    const float* z = row.data();
    for (Eigen::Index i = 0; i < row.size(); ++i) {
        const float v = z[i];
        if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) finite_or_masked = false;
        if (v != -std::numeric_limits<float>::infinity()) all_masked = false;
    }
    return !finite_or_masked || all_masked;
}

/// Counters of decode_stats that must add up after any run of steps (one sequence's).
inline void check_stats(const specdec::decode_stats& st) {
    FUZZ_CHECK(st.accepted_tokens + st.rejected_tokens <= st.drafted_tokens);
    FUZZ_CHECK(st.rejected_tokens <= st.steps);
    FUZZ_CHECK(st.accepted_at_position.size() == st.reached_at_position.size());
    std::size_t acc = 0, reached = 0;
    for (std::size_t i = 0; i < st.reached_at_position.size(); ++i) {
        FUZZ_CHECK(st.accepted_at_position[i] <= st.reached_at_position[i]);
        FUZZ_CHECK(st.reached_at_position[i] <= st.steps);
        if (i + 1 < st.reached_at_position.size()) FUZZ_CHECK(st.reached_at_position[i + 1] <= st.accepted_at_position[i]);
        acc += st.accepted_at_position[i];
        reached += st.reached_at_position[i];
    }
    FUZZ_CHECK(acc == st.accepted_tokens);
    FUZZ_CHECK(reached == st.accepted_tokens + st.rejected_tokens);
    FUZZ_CHECK(st.expected_accepted_at_position.empty() ||
               st.expected_accepted_at_position.size() == st.reached_at_position.size());
    for (std::size_t i = 0; i < st.expected_accepted_at_position.size(); ++i) {
        const double e = st.expected_accepted_at_position[i];
        FUZZ_CHECK(e >= 0.0 && e <= static_cast<double>(st.reached_at_position[i]) * (1.0 + 1e-6));
    }
}

/// A step_recorder of a small capacity (so that steps are dropped as well as kept), fed every
/// step_event beside a copy of what each event held; check() then compares the recorder with
/// the copies: the steps kept are those that fitted when they came (each field, token and
/// acceptance value as reported), the others are counted as dropped. The capacity is a function
/// of `seed`, a value the harness has read already (so the layout of its inputs is unchanged).
class trace_check {
public:
    explicit trace_check(std::size_t seed)
        : recorder_(specdec::step_recorder::capacity{.steps = seed % 9u,
                                                     .tokens = (seed / 9u) % 48u,
                                                     .values = (seed / 432u) % 24u}) {}

    /// Call from on_step with every event.
    void record(const specdec::step_event& e) {
        const auto& cap = recorder_.limits();
        const std::size_t values = e.acceptance.size() + e.sibling_acceptance.size();
        copy c;
        c.fits = kept_ < cap.steps && tokens_ + e.emitted.size() <= cap.tokens && values_ + values <= cap.values;
        if (c.fits) {
            ++kept_;
            tokens_ += e.emitted.size();
            values_ += values;
        }
        c.sequence = e.sequence;
        c.gamma = e.gamma;
        c.accepted = e.accepted;
        c.passes = e.target_passes;
        c.next_token = e.next_token;
        c.tree = e.tree != nullptr;
        c.drafted = e.tree != nullptr ? e.tree->size() : e.draft.size();
        c.emitted.assign(e.emitted.begin(), e.emitted.end());
        c.beta.assign(e.acceptance.begin(), e.acceptance.end());
        c.siblings.assign(e.sibling_acceptance.begin(), e.sibling_acceptance.end());
        copies_.push_back(std::move(c));
        recorder_.record(e);
    }

    /// After the run (or a fault that ended it): every event recorded as described above.
    void check() const {
        const auto steps = recorder_.steps();
        FUZZ_CHECK(steps.size() + recorder_.dropped() == copies_.size());
        std::size_t k = 0;
        for (const copy& c : copies_) {
            if (!c.fits) continue;
            FUZZ_CHECK(k < steps.size());
            const specdec::recorded_step& s = steps[k++];
            FUZZ_CHECK(s.sequence == c.sequence && s.gamma == c.gamma && s.accepted == c.accepted);
            FUZZ_CHECK(s.target_passes == c.passes && s.next_token == c.next_token);
            const auto tokens = recorder_.tokens(s);
            FUZZ_CHECK(std::equal(tokens.begin(), tokens.end(), c.emitted.begin(), c.emitted.end()));
            const auto beta = recorder_.acceptance(s), siblings = recorder_.sibling_acceptance(s);
            FUZZ_CHECK(std::equal(beta.begin(), beta.end(), c.beta.begin(), c.beta.end(), same_value));
            FUZZ_CHECK(std::equal(siblings.begin(), siblings.end(), c.siblings.begin(), c.siblings.end(), same_value));
            if (c.gamma == 0 && c.drafted == 0) {
                FUZZ_CHECK(s.kind == specdec::step_kind::plain && s.origin == specdec::next_token_origin::target);
            } else {
                FUZZ_CHECK(s.kind == (c.tree ? specdec::step_kind::tree : specdec::step_kind::chain));
                FUZZ_CHECK(s.drafted == c.drafted);
                FUZZ_CHECK((s.origin == specdec::next_token_origin::target) == (c.drafted == 0));
                if (!c.tree && c.drafted > 0)
                    FUZZ_CHECK((s.origin == specdec::next_token_origin::bonus) == (c.accepted == c.drafted));
            }
            FUZZ_CHECK(s.start_seconds >= 0.0 && s.draft_seconds >= 0.0 && s.target_seconds >= 0.0);
        }
        FUZZ_CHECK(k == steps.size());
    }

private:
    struct copy {
        bool fits = false, tree = false;
        std::size_t sequence = 0, gamma = 0, accepted = 0, passes = 0, drafted = 0;
        specdec::token_id next_token = 0;
        std::vector<specdec::token_id> emitted;
        std::vector<float> beta, siblings;
    };
    static bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

    specdec::step_recorder recorder_;
    std::vector<copy> copies_;
    std::size_t kept_ = 0, tokens_ = 0, values_ = 0;
};

}  // namespace fuzz
