#pragma once
/// \file
/// Compiler switches of the hot core: forced inlining, out-of-line variants, prefetch hints.

/// Forces inlining of the small templates that carry a hot loop's body in a lambda (left to
/// itself GCC keeps them out of line, which costs about 5% of standardize_and_sample).
#if defined(__GNUC__) || defined(__clang__)
#define SPECDEC_ALWAYS_INLINE [[gnu::always_inline]] inline
#elif defined(_MSC_VER)
#define SPECDEC_ALWAYS_INLINE __forceinline
#else
#define SPECDEC_ALWAYS_INLINE inline
#endif
/// Keeps one variant of a hot loop out of line, so that the caller's other variant is compiled
/// as if it did not exist.
#if defined(__GNUC__) || defined(__clang__)
#define SPECDEC_NOINLINE [[gnu::noinline]] inline
#elif defined(_MSC_VER)
#define SPECDEC_NOINLINE __declspec(noinline) inline
#else
#define SPECDEC_NOINLINE inline
#endif

namespace specdec::detail {

/// Asks for the cache line holding p (a hint; never faults). The blockwise passes use it to
/// fetch the next block of a row while the exps of the current one run, so that a row coming
/// from memory rather than cache streams at the rate of the arithmetic.
inline void prefetch(const float* p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 0, 3);
#else
    (void)p;
#endif
}

}  // namespace specdec::detail
