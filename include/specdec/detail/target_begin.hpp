/// \file
/// Opens the target region of one copy of the core: every function defined until
/// detail/target_end.hpp is compiled for SPECDEC_DETAIL_ISA (0 portable: the build's own flags,
/// 1 AVX2 + FMA, 2 AVX-512 F + DQ with AVX2 + FMA), whatever the translation unit's flags.
// No include guard: detail/instance_*.hpp include it once per copy.
#if defined(__clang__)
#if SPECDEC_DETAIL_ISA == 1
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif SPECDEC_DETAIL_ISA == 2
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f,avx512dq"))), apply_to = function)
#endif
#elif defined(__GNUC__)
#pragma GCC push_options
#if SPECDEC_DETAIL_ISA == 1
#pragma GCC target("avx2,fma")
#elif SPECDEC_DETAIL_ISA == 2
#pragma GCC target("avx2,fma,avx512f,avx512dq")
#endif
#pragma GCC diagnostic push
// GCC 12 warns falsely that the undefined first operand of AVX-512 intrinsics is used
// uninitialized wherever they are inlined (GCC bug 105593), and that the checked argmax's result
// may point into its scratch (it holds no pointer).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
#endif
