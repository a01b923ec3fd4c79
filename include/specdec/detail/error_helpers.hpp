#pragma once
/// \file
/// The error helpers of every header, the core's included (specdec/error.hpp states the policy
/// they serve): SPECDEC_ASSERT for internal invariants, detail::fail_invalid for bad input.

#include <cassert>
#include <charconv>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

/// Checks an internal invariant in debug builds. Define SPECDEC_ASSERT before
/// including any specdec header to route it elsewhere (as FMT_ASSERT / eigen_assert).
#ifndef SPECDEC_ASSERT
#define SPECDEC_ASSERT(cond, msg) assert((cond) && (msg))
#endif

namespace specdec::detail {

inline void append_piece(std::string& s, std::string_view v) { s += v; }
inline void append_piece(std::string& s, const char* v) { s += v; }
inline void append_piece(std::string& s, const std::string& v) { s += v; }
// Out of line on the error path (GCC 12's -Wrestrict misreads the append once it is inlined
// into a long fail_invalid; the path is cold anyway).
#if defined(__GNUC__) || defined(__clang__)
#define SPECDEC_DETAIL_COLD [[gnu::cold, gnu::noinline]]
#else
#define SPECDEC_DETAIL_COLD
#endif

template <class T>
    requires std::is_arithmetic_v<T>
SPECDEC_DETAIL_COLD void append_piece(std::string& s, T v) {
    // Shortest round-trip form, so messages show 1e-09 rather than 0.000000.
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    s.append(buf, res.ptr);
}

/// Throws std::invalid_argument with the pieces concatenated:
/// fail_invalid("specdec::verify: ", "gamma = ", 0, " must be >= 1").
template <class... Pieces>
[[noreturn]] SPECDEC_DETAIL_COLD void fail_invalid(const Pieces&... pieces) {
    std::string msg;
    (append_piece(msg, pieces), ...);
    throw std::invalid_argument(msg);
}

}  // namespace specdec::detail
