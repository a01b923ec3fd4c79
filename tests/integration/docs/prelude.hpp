// The declarations that the C++ blocks of README.md and docs/*.md may use without declaring
// them: tests/integration/docs/check_code_blocks.py compiles every such block after this header, inside a
// namespace that sees the names below. Keep it small; a block that needs more declares it.
//
//   toy_model            a LanguageModel over 64 tokens (any copyable, deterministic model would do)
//   target, draft        two toy_models that disagree on some contexts
//   prompt               a short prompt (std::vector<token_id>)
//   load_model(path)     "loads" a toy_model (a stand-in for reading a checkpoint)
//   rng                  a std::mt19937_64
//   my_engine, big, small, tokenize, eos
//                        stand-ins for a user's inference engine, its two loaded models, its
//                        tokenizer and its end-of-text token (the README's adapter)
//   TEST_CASE, CHECK, INFO
//                        stand-ins for a test framework's macros (compiled, never run), so that a
//                        block showing a Catch2 test compiles without Catch2
#pragma once

#include <specdec/specdec.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace docs_prelude {

using specdec::token_id;

/// A toy model over V = 64 tokens: logits favour (last token + step) mod V, less so after a
/// multiple of `weak`.
struct toy_model {
    int step = 3, weak = 5;
    std::ptrdiff_t vocab_size() const { return 64; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) const {
        Eigen::VectorXf z = Eigen::VectorXf::LinSpaced(64, 0.0f, 1.0f);
        const token_id last = context.back();
        z[(last + step) % 64] += last % weak == 0 ? 1.0f : 4.0f;
        z[(last + 1) % 64] += 2.0f;
        return z;
    }
};

inline toy_model target{3, 5}, draft{3, 7};
inline toy_model load_model(const std::string& path) { return toy_model{3, path.size() % 2 == 0 ? 5 : 7}; }
inline std::vector<token_id> prompt{1, 2, 3};
inline std::mt19937_64 rng(42);

/// A stand-in for a user's inference engine: forward(context) returns vocab() logits.
struct my_engine {
    std::vector<float> logits = std::vector<float>(64, 0.0f);
    std::ptrdiff_t vocab() const { return static_cast<std::ptrdiff_t>(logits.size()); }
    const float* forward(std::span<const token_id> context) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        logits[static_cast<std::size_t>(context.back() + 1) % logits.size()] = 3.0f;
        return logits.data();
    }
};
inline my_engine big, small;
inline std::vector<token_id> tokenize(const std::string& text) {
    std::vector<token_id> out{1};
    for (const char c : text) out.push_back(static_cast<token_id>(static_cast<unsigned char>(c) % 64u));
    return out;
}
inline constexpr token_id eos = 2;

}  // namespace docs_prelude

// Test-framework stand-ins (compiled, never run).
#ifndef TEST_CASE
#define DOCS_CONCAT2(a, b) a##b
#define DOCS_CONCAT(a, b) DOCS_CONCAT2(a, b)
#define TEST_CASE(...) [[maybe_unused]] static void DOCS_CONCAT(docs_test_case_, __LINE__)()
#define CHECK(...) static_cast<void>(static_cast<bool>(__VA_ARGS__))
#define INFO(...) static_cast<void>(std::ostringstream{} << __VA_ARGS__)
#endif
