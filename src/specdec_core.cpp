// specdec's compiled mode (SPECDEC_COMPILED; the specdec::compiled CMake target): the one
// translation unit that compiles the hot core — every instruction-set copy of the sampling and
// verification cores (detail/instance_sampling.inc, detail/instance_verify.inc) and the functions
// that dispatch to them —, tree verification, and the decoding loops of speculative_decode and
// autoregressive_decode for plain language models (through detail::model_ref). Every other
// translation unit of a program built in compiled mode only declares those functions, so a
// translation unit that decodes with plain models compiles neither the core nor the loop.
#ifndef SPECDEC_COMPILED
#define SPECDEC_COMPILED 1
#endif
#define SPECDEC_DETAIL_BUILD_CORE 1

#include <specdec/detail/sampling_core.hpp>
#include <specdec/detail/verify_core.hpp>
#include <specdec/tree_verify.hpp>
#include <specdec/speculative_decode.hpp>
