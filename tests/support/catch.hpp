#pragma once
// Catch2 v3 when installed, otherwise the v2 single header.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;
#define SPECDEC_CATCH3 1
#else
#include <catch2/catch.hpp>
#endif

#include <string>

namespace specdec_test {
/// Matcher for exception messages that contain `s` (named differently in v2 and v3).
inline auto contains(const std::string& s) {
#if defined(SPECDEC_CATCH3)
    return Catch::Matchers::ContainsSubstring(s);
#else
    return Catch::Matchers::Contains(s);
#endif
}
}  // namespace specdec_test
