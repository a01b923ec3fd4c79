#pragma once
/// \file
/// The library's error policy in one place.
///
/// | situation                                | mechanism                                           |
/// |------------------------------------------|-----------------------------------------------------|
/// | wrong type                               | concept failure at the call site                    |
/// | bad caller input (checked once per call) | `std::invalid_argument` naming function, argument, value |
/// | invariant inside a hot loop              | `SPECDEC_ASSERT`: on in debug builds, off under NDEBUG |
/// | stop token / token budget reached        | a `stop_reason` in the result, not an error         |
///
/// Headers never log, abort, exit or read the environment. Exceptions thrown by
/// user adapters propagate unchanged.
///
/// The helpers (SPECDEC_ASSERT, which the caller may define before including specdec, and
/// detail::fail_invalid) are in detail/error_helpers.hpp, which the core includes as well.

#include "detail/error_helpers.hpp"
