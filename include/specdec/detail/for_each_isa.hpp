/// \file
/// Includes the file named by SPECDEC_DETAIL_INSTANCE once per instruction set this build
/// compiles the core for (see specdec/isa.hpp), with SPECDEC_DETAIL_ISA and SPECDEC_DETAIL_NS set for
/// each: 0 in the portable namespace, then, with GCC or Clang on x86-64, 1 (AVX2) and 2 (AVX-512).
// No include guard: sampling_core.hpp and verify_core.hpp include it once each.
#define SPECDEC_DETAIL_ISA 0
#define SPECDEC_DETAIL_NS SPECDEC_DETAIL_NS_PORTABLE
#include SPECDEC_DETAIL_INSTANCE
#undef SPECDEC_DETAIL_NS
#undef SPECDEC_DETAIL_ISA
#if SPECDEC_DETAIL_X86_DISPATCH
#define SPECDEC_DETAIL_ISA 1
#define SPECDEC_DETAIL_NS SPECDEC_DETAIL_NS_AVX2
#include SPECDEC_DETAIL_INSTANCE
#undef SPECDEC_DETAIL_NS
#undef SPECDEC_DETAIL_ISA
#define SPECDEC_DETAIL_ISA 2
#define SPECDEC_DETAIL_NS SPECDEC_DETAIL_NS_AVX512
#include SPECDEC_DETAIL_INSTANCE
#undef SPECDEC_DETAIL_NS
#undef SPECDEC_DETAIL_ISA
#endif
#undef SPECDEC_DETAIL_INSTANCE
