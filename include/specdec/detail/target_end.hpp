/// \file
/// Closes the target region opened by detail/target_begin.hpp.
// No include guard: detail/instance_*.hpp include it once per copy.
#if defined(__clang__)
#if SPECDEC_DETAIL_ISA >= 1
#pragma clang attribute pop
#endif
#elif defined(__GNUC__)
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
