#pragma once
/// \file
/// The settings and the result of verify(), and the draft-side constants it checks against.
/// (All but point_mass, which the core does not take, are defined in
/// detail/verify_vocabulary.hpp, and are part of this header through it.)

#include "detail/verify_vocabulary.hpp"  // verification_scheme, verify_options, verify_result, constants
#include "types.hpp"

namespace specdec {

/// Tag for draft blocks without distributions (point-mass drafts: q_i = δ(x_i)).
struct point_mass_t {
    explicit constexpr point_mass_t() = default;
};
/// The point-mass tag value: `verify(logits, tokens, specdec::point_mass, ...)`.
inline constexpr point_mass_t point_mass{};

}  // namespace specdec
