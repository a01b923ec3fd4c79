#pragma once
/// \file
/// uniform01 and uniform_source, in namespace specdec: how the caller's generator becomes the
/// uniforms the core draws with. specdec/random.hpp re-exports them (include that one; it says
/// how randomness enters the library); they are defined here so that detail/ includes no public
/// header.

#include <bit>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace specdec {

namespace detail {

/// Number of whole random bits one accepted call of G delivers: b with 2^b <= max() - min() + 1
/// < 2^(b+1). When the range is a power of two every call is accepted; otherwise a call whose
/// offset from min() is 2^b or more is drawn again (see uniform01).
template <class G>
constexpr int generator_bits() noexcept {
    constexpr std::uint64_t span =
        static_cast<std::uint64_t>(std::remove_cvref_t<G>::max() - std::remove_cvref_t<G>::min());
    if (span == std::numeric_limits<std::uint64_t>::max()) return 64;
    return static_cast<int>(std::bit_width(span + 1)) - 1;
}

}  // namespace detail

/// The standard's uniform random bit generator requirements (std::uniform_random_bit_generator,
/// [rand.req.urng]), restated so that this header does not need <random>: every standard
/// engine and any generator of the caller's that models the standard concept models this one.
template <class G>
concept uniform_bit_generator = std::invocable<G&> && std::unsigned_integral<std::invoke_result_t<G&>> &&
                                requires {
                                    { G::min() } -> std::same_as<std::invoke_result_t<G&>>;
                                    { G::max() } -> std::same_as<std::invoke_result_t<G&>>;
                                    requires std::bool_constant<(G::min() < G::max())>::value;
                                };

/// Draws a double uniformly from [0, 1) with 53 random bits, built from as many
/// calls of `g` as needed (one for a 64-bit generator, two for a 32-bit one).
///
/// Any std::uniform_random_bit_generator works. A generator whose range max() - min() + 1 is
/// a power of two 2^b (the Mersenne twisters, the ranlux engines) gives b bits a call. For
/// another range (std::minstd_rand, std::knuth_b: 2^31 − 2 values) a call is used only when
/// its offset from min() is below 2^b, the largest power of two in the range, and is drawn
/// again otherwise (fewer than two calls per b bits on average); the bits stay exactly
/// uniform and the result depends only on the generator's output, as everywhere here.
template <uniform_bit_generator G>
[[nodiscard]] double uniform01(G& g) {
    constexpr auto lo = G::min();
    constexpr std::uint64_t span = static_cast<std::uint64_t>(G::max() - lo);
    constexpr int bits = detail::generator_bits<G>();
    static_assert(bits >= 1, "specdec::uniform01: the generator must deliver at least two values");
    constexpr bool whole_range = (span & (span + 1)) == 0;  // max() - min() + 1 is 2^bits
    std::uint64_t acc = 0;
    int have = 0;
    while (have < 53) {
        const std::uint64_t x = static_cast<std::uint64_t>(g() - lo);
        if constexpr (!whole_range) {
            if ((x >> bits) != 0) continue;  // outside [0, 2^bits): draw again
        }
        // Take the most significant bits of each draw until 53 are collected.
        const int take = bits < 53 - have ? bits : 53 - have;
        acc = (acc << take) | (x >> (bits - take));
        have += take;
    }
    return static_cast<double>(acc) * 0x1.0p-53;
}

/// A non-owning, type-erased reference to the caller's generator that hands out
/// uniforms in [0, 1) through uniform01. Drafters receive one so that they sample
/// from the caller's stream without being templates on the generator type.
/// It must not outlive the generator it refers to.
class uniform_source {
public:
    template <uniform_bit_generator G>
        requires(!std::same_as<std::remove_cvref_t<G>, uniform_source>)
    explicit uniform_source(G& g) noexcept
        : gen_(static_cast<void*>(&g)), draw_([](void* p) { return uniform01(*static_cast<G*>(p)); }) {}

    /// The next uniform double in [0, 1).
    double operator()() { return draw_(gen_); }

private:
    void* gen_;
    double (*draw_)(void*);
};

/// The next uniform of a uniform_source (as uniform01 of the generator it refers to).
inline double uniform01(uniform_source& s) { return s(); }

}  // namespace specdec
