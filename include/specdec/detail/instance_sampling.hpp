/// \file
/// One copy of the sampling core, for the instruction set SPECDEC_DETAIL_ISA, in namespace
/// specdec::detail::SPECDEC_DETAIL_NS (see specdec/isa.hpp). Its files, in the order they build
/// on each other: the packet layer, the exp kernels, the row passes, top-k / top-p selection,
/// and the standardized sampling that the public functions of specdec/sampling.hpp run.
// No include guard: detail/sampling_core.hpp includes it once per instruction set.
#include "target_begin.hpp"
namespace specdec::detail::SPECDEC_DETAIL_NS {
#include "simd.hpp"
#include "exp_kernels.hpp"
#include "row_passes.hpp"
#include "selection.hpp"
#include "standardize.hpp"
}  // namespace specdec::detail::SPECDEC_DETAIL_NS
#include "target_end.hpp"
