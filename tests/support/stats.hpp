#pragma once
// The statistics of the test suite are the public ones of the conformance kit
// (specdec/testing/stats.hpp): one implementation, so the suite tests what users run.

#include <specdec/testing/stats.hpp>

namespace specdec_test {

using specdec::testing::chi_square_sf;
using specdec::testing::chi_square_test;
using specdec::testing::chi_square_two_sample_test;
using specdec::testing::gamma_p_series;
using specdec::testing::gamma_q_fraction;
using specdec::testing::gof_result;

}  // namespace specdec_test
