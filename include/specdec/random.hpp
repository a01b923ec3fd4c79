#pragma once
/// \file
/// The one place where entropy enters the library: raw generator bits become doubles.
///
/// All randomness comes from the generator the caller passes in, through
/// `uniform01`, the library's own conversion (not std::uniform_real_distribution,
/// whose results differ between standard libraries). The same seed therefore
/// gives the same output on every platform and standard library with the same
/// instruction-set path of the core (specdec/isa.hpp): the paths round differently, and a
/// rounding difference near a test's threshold can change a decision or how many uniforms
/// a draw takes, after which the streams part. force_isa() fixes the path.
///
/// uniform_bit_generator, uniform01 and uniform_source, which the core takes too, are defined in
/// detail/uniform_source.hpp, and are part of this header through it.

#include <type_traits>

#include "detail/uniform_source.hpp"  // uniform_bit_generator, uniform01, uniform_source

namespace specdec {

/// A generator argument taken by forwarding reference: G may be deduced as a reference
/// type, so the concept is applied to the underlying type, which must not be const (drawing
/// changes the generator's state).
template <class G>
concept random_generator = uniform_bit_generator<std::remove_cvref_t<G>> && !std::is_const_v<std::remove_reference_t<G>>;

}  // namespace specdec
