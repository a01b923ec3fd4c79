// The one compiled test main shared by every test executable: built once as a
// static library, so no test file pays for Catch2's runner again.
// With Catch2 v3 the main comes from Catch2::Catch2WithMain and this file is unused.
#if !__has_include(<catch2/catch_all.hpp>)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif
