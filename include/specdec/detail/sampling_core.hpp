#pragma once
/// \file
/// The sampling core compiled once per instruction set (detail/instance_sampling.inc), and the
/// functions that run the copy active_isa_index() names.

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "buffers.hpp"
#include "config.hpp"
#include "error_helpers.hpp"
#include "isa_config.hpp"
#include "row_layout.hpp"
#include "vocabulary.hpp"

namespace specdec::detail {

// The functions that run the copy of the core active_isa_index() names (see SPECDEC_COMPILED in
// detail/isa_config.hpp: inline here, or declared here and defined once in the library).
SPECDEC_DETAIL_CORE_BEGIN
SPECDEC_DETAIL_CORE_ENTRY void run_standardize(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                               const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
                                               sampling_buffers& ws, const char* where);
SPECDEC_DETAIL_CORE_ENTRY Eigen::Index run_sample_from_weights(const Eigen::Ref<const Eigen::VectorXf>& w, double u,
                                                               sampling_buffers& ws, const char* where);
SPECDEC_DETAIL_CORE_ENTRY Eigen::Index run_standardize_and_sample(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                                                  const sampling_config& s,
                                                                  Eigen::Ref<Eigen::VectorXf> out, double u,
                                                                  sampling_buffers& ws, const char* where);
SPECDEC_DETAIL_CORE_ENTRY scaled_draw run_standardize_weights_and_sample(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                                                         const sampling_config& s,
                                                                         Eigen::Ref<Eigen::VectorXf> out, double u,
                                                                         sampling_buffers& ws, const char* where);
SPECDEC_DETAIL_CORE_END

}  // namespace specdec::detail

#if !SPECDEC_DETAIL_CORE_DECLARED_ONLY
#define SPECDEC_DETAIL_INSTANCE "instance_sampling.inc"
#include "for_each_isa.inc"

/// `return SPECDEC_DETAIL_NS_X::call` for the copy of the core active_isa_index() names.
#if SPECDEC_DETAIL_X86_DISPATCH
#define SPECDEC_DETAIL_DISPATCH(call)                                              \
    switch (::specdec::detail::active_isa_index()) {                               \
        case ::specdec::detail::isa_avx512: return SPECDEC_DETAIL_NS_AVX512::call; \
        case ::specdec::detail::isa_avx2: return SPECDEC_DETAIL_NS_AVX2::call;     \
        default: return SPECDEC_DETAIL_NS_PORTABLE::call;                          \
    }
#else
#define SPECDEC_DETAIL_DISPATCH(call) return SPECDEC_DETAIL_NS_PORTABLE::call;
#endif

namespace specdec::detail {

/// The portable copy of the core, under a name that does not change with the build's flags
/// (the tests reach the internals through it). Not in compiled mode's translation units.
namespace kernels = SPECDEC_DETAIL_NS_PORTABLE;

SPECDEC_DETAIL_CORE_BEGIN
SPECDEC_DETAIL_CORE_ENTRY void run_standardize(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                               const sampling_config& s, Eigen::Ref<Eigen::VectorXf> out,
                                               sampling_buffers& ws, const char* where) {
    SPECDEC_DETAIL_DISPATCH(standardize(logits, s, out, ws, where))
}
SPECDEC_DETAIL_CORE_ENTRY Eigen::Index run_sample_from_weights(const Eigen::Ref<const Eigen::VectorXf>& w, double u,
                                                               sampling_buffers& ws, const char* where) {
    SPECDEC_DETAIL_DISPATCH(sample_from_weights(w, u, ws, where))
}
SPECDEC_DETAIL_CORE_ENTRY Eigen::Index run_standardize_and_sample(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                                                  const sampling_config& s,
                                                                  Eigen::Ref<Eigen::VectorXf> out, double u,
                                                                  sampling_buffers& ws, const char* where) {
    SPECDEC_DETAIL_DISPATCH(standardize_and_sample(logits, s, out, u, ws, where))
}
SPECDEC_DETAIL_CORE_ENTRY scaled_draw run_standardize_weights_and_sample(const Eigen::Ref<const Eigen::VectorXf>& logits,
                                                                         const sampling_config& s,
                                                                         Eigen::Ref<Eigen::VectorXf> out, double u,
                                                                         sampling_buffers& ws, const char* where) {
    SPECDEC_DETAIL_DISPATCH(standardize_weights_and_sample(logits, s, out, u, ws, where))
}
SPECDEC_DETAIL_CORE_END

}  // namespace specdec::detail
#endif  // !SPECDEC_DETAIL_CORE_DECLARED_ONLY
