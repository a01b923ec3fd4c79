#pragma once
/// \file
/// The verification core compiled once per instruction set (detail/instance_verify.inc), and
/// the function that runs the copy active_isa_index() names.

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "buffers.hpp"
#include "error_helpers.hpp"
#include "isa_config.hpp"
#include "row_layout.hpp"
#include "sampling_core.hpp"
#include "uniform_source.hpp"
#include "verify_checks.hpp"
#include "verify_vocabulary.hpp"
#include "vocabulary.hpp"

namespace specdec::detail {

/// One verify() call as the core takes it (checked already).
struct verify_call {
    const Eigen::Ref<const Eigen::MatrixXf>& target_logits;  ///< V x (γ + 1)
    std::span<const token_id> draft_tokens;                  ///< x_1..x_γ
    const Eigen::Ref<const Eigen::MatrixXf>* q;              ///< V x γ draft columns; null: point masses
    const float* q_scales;                                   ///< q_i = q_scales[i] · column i; null: 1
    const sampling_config& sampling;
    const verify_options& opts;
    const char* where;  ///< the public function's name, for error messages
};

/// One verify_tree() call as the core takes it (checked already; the arrays by node, the
/// children lists by node + 1, 0 being the root; the draft factors in tree_buffers).
struct tree_call {
    const Eigen::Ref<const Eigen::MatrixXf>& logits;  ///< V x (nodes + 1)
    const token_id* tokens;
    const std::int32_t* parents;
    const std::int32_t* first_child;    ///< first child of each node (−1: none)
    const std::int32_t* next_sibling;   ///< next sibling of each node (−1: none)
    const Eigen::MatrixXf* q;           ///< V x nodes draft columns; null: point masses
    const sampling_config& sampling;
    bool traversal = true;              ///< traversal verification, else recursive rejection
    bool estimate_siblings = false;     ///< record a_k of the root's tested children
    const char* where;                  ///< the public function's name, for error messages
};

}  // namespace specdec::detail

namespace specdec::detail {
SPECDEC_DETAIL_CORE_BEGIN

/// Runs one tree verification on the active copy of the core (result in ws.last_node and
/// ws.next_token). Not a template, for the reason run_verify_core is not.
SPECDEC_DETAIL_CORE_ENTRY void run_tree_core(const tree_call& call, uniform_source& rng, tree_buffers& ws);

/// Runs one verification on the active copy of the core. Not a template: every generator type
/// reaches it through a uniform_source, so the core is compiled once per instruction set (and,
/// in compiled mode, once per program: see SPECDEC_COMPILED in detail/isa_config.hpp).
SPECDEC_DETAIL_CORE_ENTRY verify_result run_verify_core(const verify_call& call, uniform_source& rng,
                                                        verify_buffers& ws);

SPECDEC_DETAIL_CORE_END
}  // namespace specdec::detail

#if !SPECDEC_DETAIL_CORE_DECLARED_ONLY
#define SPECDEC_DETAIL_INSTANCE "instance_verify.inc"
#include "for_each_isa.inc"

namespace specdec::detail {
SPECDEC_DETAIL_CORE_BEGIN

SPECDEC_DETAIL_CORE_ENTRY verify_result run_verify_core(const verify_call& call, uniform_source& rng,
                                                        verify_buffers& ws) {
    SPECDEC_DETAIL_DISPATCH(verify(call, rng, ws))
}

SPECDEC_DETAIL_CORE_ENTRY void run_tree_core(const tree_call& call, uniform_source& rng, tree_buffers& ws) {
    SPECDEC_DETAIL_DISPATCH(verify_tree_on_core(call, rng, ws))
}

SPECDEC_DETAIL_CORE_END
}  // namespace specdec::detail
#endif  // !SPECDEC_DETAIL_CORE_DECLARED_ONLY

namespace specdec::detail {

/// run_verify_core with the caller's generator and workspace.
template <class G, class Workspace>
verify_result run_verify(const verify_call& call, G& rng, Workspace& ws) {
    uniform_source uniforms(rng);
    return run_verify_core(call, uniforms, buffers_access::of(ws));
}

}  // namespace specdec::detail
