#pragma once
// A generator that counts its calls, for tests of how much randomness a call draws.

#include <cstdint>
#include <random>

namespace specdec_test {

/// std::mt19937_64 that counts the values it returns (specdec::uniform01 takes one per uniform
/// from a 64-bit generator).
struct counting_rng {
    using result_type = std::uint64_t;
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return ~result_type{0}; }
    explicit counting_rng(std::uint64_t seed) : g(seed) {}
    result_type operator()() {
        ++calls;
        return g();
    }
    std::mt19937_64 g;
    int calls = 0;
};

}  // namespace specdec_test
