/// \file
/// One copy of the verification core, for the instruction set SPECDEC_DETAIL_ISA, in the
/// namespace of the same copy of the sampling core (detail/instance_sampling.hpp), whose passes
/// it uses. Its files follow Algorithm 1 (Leviathan et al. 2023) step by step: target rows
/// normalized, draws from them, the residual resampled after a rejection, then the two schemes
/// that put these together (token by token, and block verification).
// No include guard: detail/verify_core.hpp includes it once per instruction set.
#include "target_begin.hpp"
namespace specdec::detail::SPECDEC_DETAIL_NS {
#include "target_rows.hpp"
#include "draws.hpp"
#include "residual.hpp"
#include "token_scheme.hpp"
#include "block_scheme.hpp"

/// One verification: the scheme the options name.
inline verify_result verify(const verify_call& call, uniform_source& rng, verify_buffers& ws) {
    if (call.opts.scheme == verification_scheme::block) return verify_block(call, rng, ws);
    return verify_tokens(call, rng, ws);
}
}  // namespace specdec::detail::SPECDEC_DETAIL_NS
#include "target_end.hpp"
