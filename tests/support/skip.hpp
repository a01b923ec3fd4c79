#pragma once
// Skipping a test visibly. Catch2 2.13 has no skip: a test that cannot run here prints why and
// passes. Under ctest, which runs each test case in a process of its own, the registration sets
// SPECDEC_TEST_EXIT_ON_SKIP=1 and SKIP_RETURN_CODE 77 (tests/CMakeLists.txt), and the process
// exits with 77 at once, so that ctest reports the case as skipped and counts it in its summary.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "catch.hpp"

namespace specdec_test {

/// Prints "skipped: <why>"; under ctest, ends the process as skipped. Returns otherwise (the
/// caller then returns from the test case).
inline void skip(const std::string& why) {
    std::printf("skipped: %s\n", why.c_str());
    std::fflush(stdout);
    if (const char* env = std::getenv("SPECDEC_TEST_EXIT_ON_SKIP"); env != nullptr && std::string(env) == "1")
        std::_Exit(77);
    WARN("skipped: " << why);
}

}  // namespace specdec_test
