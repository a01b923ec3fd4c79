// The multi-sequence path allocates nothing per step after warm-up: the packed scores, the
// requests and the per-sequence buffers are reused (counting global operator new, and Eigen's
// allocations through EIGEN_RUNTIME_NO_MALLOC, as allocation_test.cpp does). This file replaces
// the global allocation functions, so it is its own test executable.
#define EIGEN_RUNTIME_NO_MALLOC
#define eigen_assert(x) specdec_test_eigen_assert(static_cast<bool>(x), #x)
void specdec_test_eigen_assert(bool ok, const char* condition);

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include "support/catch.hpp"
#include "support/markov.hpp"
#include "support/skip.hpp"

#include <specdec/batch_decode.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SPECDEC_ALLOCATIONS_COUNTED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPECDEC_ALLOCATIONS_COUNTED 0
#endif
#endif
#ifndef SPECDEC_ALLOCATIONS_COUNTED
#define SPECDEC_ALLOCATIONS_COUNTED 1
#endif

namespace {
std::atomic<std::size_t> g_allocations{0};
std::atomic<bool> g_counting{false};
}  // namespace

void specdec_test_eigen_assert(bool ok, const char* condition) {
    if (ok) return;
    if (std::strstr(condition, "heap allocation is forbidden") != nullptr) {
        g_allocations.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    std::fprintf(stderr, "Eigen assertion failed: %s\n", condition);
    std::abort();
}

#if SPECDEC_ALLOCATIONS_COUNTED
void* operator new(std::size_t size) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace {

using specdec::token_id;
using specdec_test::markov_model;

template <class F>
std::size_t allocations_during(F&& f) {
    g_allocations = 0;
    g_counting = true;
    Eigen::internal::set_is_malloc_allowed(false);
    f();
    Eigen::internal::set_is_malloc_allowed(true);
    g_counting = false;
    return g_allocations.load();
}

/// The logits row of an order-2 Markov model after `context` + `extra` (no allocation).
Eigen::Map<const Eigen::VectorXf> row_after(const markov_model& m, std::span<const token_id> context,
                                            std::span<const token_id> extra) {
    token_id last[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
        const auto from_end = static_cast<std::size_t>(k);  // 0: the last token
        token_id t = 0;
        if (from_end < extra.size()) t = extra[extra.size() - 1 - from_end];
        else if (from_end - extra.size() < context.size()) t = context[context.size() - 1 - (from_end - extra.size())];
        last[1 - k] = t;
    }
    const std::size_t row = m.row_of(std::span<const token_id>(last, 2)) * static_cast<std::size_t>(m.vocab);
    return {m.table.data() + row, m.vocab};
}

struct quiet_verifier {  // a MultiSequenceVerifier that allocates nothing
    const markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
        for (std::size_t i = 0; i < batch.size(); ++i) {
            auto cols = out.sequence(i);
            for (std::size_t j = 0; j <= batch[i].draft.size(); ++j)
                cols.col(static_cast<Eigen::Index>(j)) = row_after(*model, batch[i].context, batch[i].draft.first(j));
        }
    }
};

struct quiet_drafter {  // a MultiSequenceDrafter that allocates nothing after warm-up
    const markov_model* model;
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& s) {
        for (auto& r : batch) {
            r.out->resize_probs(model->vocab, static_cast<Eigen::Index>(r.gamma));
            for (std::size_t i = 0; i < r.gamma; ++i) {
                auto q = r.out->probs.col(static_cast<Eigen::Index>(i));
                const auto d = specdec::standardize_weights_and_sample(
                    row_after(*model, r.context, std::span<const token_id>(r.out->tokens)), s, q, r.uniforms(), sws);
                r.out->scales.push_back(d.scale);
                r.out->tokens.push_back(d.token);
            }
            r.out->standardized = true;
        }
    }
};

}  // namespace

TEST_CASE("A multi-sequence batch step allocates nothing after warm-up", "[batch][multi][allocation]") {
    if (!SPECDEC_ALLOCATIONS_COUNTED) {
        specdec_test::skip("allocation counting is not available under AddressSanitizer");
        return;
    }
    const auto target = markov_model::random(32, 2, 1);
    const auto draft = markov_model::random(32, 2, 2);
    quiet_drafter d{&draft};
    quiet_verifier v{&target};
    for (const std::size_t threads : {1u, 2u}) {
        INFO("threads " << threads);
        specdec::batch_decoder<quiet_drafter, quiet_verifier, std::mt19937_64> dec(
            d, v, {.gamma = 3, .sampling = {.temperature = 1.0f}, .max_new_tokens = 3000}, threads);
        for (token_id p = 0; p < 5; ++p) (void)dec.add(std::vector<token_id>{p, 1}, std::mt19937_64(static_cast<std::uint64_t>(p)));
        for (int s = 0; s < 20; ++s) dec.step();  // warm-up
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) dec.step();
              }) == 0);
        CHECK(dec.active() == 5);

        std::vector<specdec::batch_sequence<std::mt19937_64>> seqs;
        for (token_id p = 0; p < 5; ++p) {
            seqs.push_back({{p, 2}, {}, std::mt19937_64(static_cast<std::uint64_t>(p))});
            seqs.back().tokens.reserve(1000);
        }
        specdec::batch_workspace ws(threads);
        for (int s = 0; s < 20; ++s) specdec::speculative_step_batch(d, v, std::span(seqs), {.gamma = 3}, ws);
        CHECK(allocations_during([&] {
                  for (int s = 0; s < 50; ++s) specdec::speculative_step_batch(d, v, std::span(seqs), {.gamma = 3}, ws);
              }) == 0);
    }
}
