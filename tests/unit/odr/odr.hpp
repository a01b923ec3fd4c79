#pragma once
// The battery that tu.cpp runs. CMakeLists.txt compiles tu.cpp twice with different flags, so
// that the program holds two translation units that include specdec and define run_a and run_b.

#include <cstdint>
#include <string>
#include <vector>

namespace specdec_odr {

/// One result of the battery: the name of the call and every word it produced (the bits of each
/// output float, token ids, counts), in a fixed order.
struct item {
    std::string name;
    std::vector<std::uint32_t> words;
};

struct battery {
    std::string isa;  ///< the vector extensions the translation unit was compiled for
    std::vector<item> items;
};

battery run_a();  // tu.cpp compiled with the build's flags
battery run_b();  // tu.cpp compiled with -march=native added

}  // namespace specdec_odr
