// A program built with SPECDEC_NO_DISPATCH in its only translation unit (it is a whole-program
// setting: see README, "Instruction sets"). Checks that only the portable copy of the core is
// compiled and offered, that asking for another path is refused with a clear error, and that the
// portable core computes: a standardized row against its double-precision definition, and
// speculative decoding at temperature 0 against the autoregressive baseline. Exits 1 on failure.
#define SPECDEC_NO_DISPATCH
#include <specdec/specdec.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

static_assert(SPECDEC_DETAIL_X86_DISPATCH == 0, "SPECDEC_NO_DISPATCH must turn the AVX2/AVX-512 copies off");

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
    if (!ok) {
        std::printf("FAILED: %s\n", what.c_str());
        ++failures;
    }
}

struct cyclic_model {
    int shift;
    std::ptrdiff_t vocab_size() const { return 64; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id> context) const {
        Eigen::VectorXf z = Eigen::VectorXf::LinSpaced(64, 0.0f, 1.0f);
        z[(context.back() + shift) % 64] = 4.0f;
        return z;
    }
};

}  // namespace

int main() {
    using specdec::isa;
    expect(specdec::isa_supported(isa::portable), "the portable path is supported");
    expect(!specdec::isa_supported(isa::avx2) && !specdec::isa_supported(isa::avx512),
           "no AVX2 or AVX-512 copy is offered");
    expect(specdec::best_isa() == isa::portable && specdec::active_isa() == isa::portable,
           "the active path is the portable one");
    for (const isa other : {isa::avx2, isa::avx512}) {
        bool refused = false;
        try {
            specdec::force_isa(other);
        } catch (const std::invalid_argument& e) {
            refused = std::string(e.what()).find("not available") != std::string::npos;
        }
        expect(refused, std::string("force_isa(") + specdec::isa_name(other) + ") is refused, naming the problem");
    }
    expect(specdec::active_isa() == isa::portable, "a refused force_isa leaves the portable path active");

    // A standardized row (temperature 0.7) against softmax(x / T) computed in double.
    const Eigen::Index n = 1000;
    Eigen::VectorXf logits(n);
    std::mt19937_64 gen(11);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (Eigen::Index i = 0; i < n; ++i) logits[i] = normal(gen);
    Eigen::VectorXf p(n);
    specdec::sampling_workspace ws;
    specdec::standardize(logits, {.temperature = 0.7f}, p, ws);
    double z = 0.0, max_logit = logits.maxCoeff();
    for (Eigen::Index i = 0; i < n; ++i) z += std::exp((double(logits[i]) - max_logit) / 0.7);
    double worst = 0.0;
    for (Eigen::Index i = 0; i < n; ++i) {
        const double ref = std::exp((double(logits[i]) - max_logit) / 0.7) / z;
        worst = std::max(worst, std::abs(double(p[i]) - ref) / ref);
    }
    expect(p.size() == n && worst < 1e-5, "standardize matches softmax(x / T) within 1e-5 relative (worst " +
                                               std::to_string(worst) + ")");

    // Speculative decoding at temperature 0 gives the autoregressive tokens.
    cyclic_model target{5}, draft{5};
    const std::vector<specdec::token_id> prompt{1, 2};
    std::mt19937_64 rng(3);
    const auto spec = specdec::speculative_decode(
        draft, target, prompt, {.step = specdec::chain{.gamma = 4}, .sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 40}}, rng);
    const auto base =
        specdec::autoregressive_decode(target, prompt, {.sampling = {.temperature = 0.0f}, .budget = {.max_new_tokens = 40}}, rng);
    expect(spec.tokens.size() == 40 && spec.tokens == base.tokens,
           "speculative decoding at T = 0 gives the autoregressive tokens");
    expect(spec.stats.steps == 8 && spec.stats.accepted_tokens == 32,
           "a perfect draft: 8 steps of 4 accepted tokens and a bonus token (" + std::to_string(spec.stats.steps) +
               " steps, " + std::to_string(spec.stats.accepted_tokens) + " accepted)");

    if (failures == 0) std::puts("no_dispatch: the portable core only, all checks passed");
    return failures == 0 ? 0 : 1;
}
