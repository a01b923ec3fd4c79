#pragma once
/// \file
/// Umbrella header: includes every public header of specdec.

#include "adapters.hpp"
#include "adaptive_gamma.hpp"
#include "analysis.hpp"
#include "batch.hpp"
#include "concepts.hpp"
#include "drafters/fallback.hpp"
#include "drafters/ngram.hpp"
#include "drafters/prompt_lookup.hpp"
#include "error.hpp"
#include "isa.hpp"
#include "random.hpp"
#include "sampling.hpp"
#include "speculative_decode.hpp"
#include "speculative_step.hpp"
#include "types.hpp"
#include "verify.hpp"
#include "version.hpp"
