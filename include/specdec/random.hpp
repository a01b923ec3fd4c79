#pragma once
/// \file
/// The one place where entropy enters the library: raw generator bits become doubles.
///
/// All randomness comes from the generator the caller passes in, through
/// `uniform01`, the library's own conversion (not std::uniform_real_distribution,
/// whose results differ between standard libraries). The same seed therefore
/// gives the same output on every platform.
///
/// uniform_bit_generator, uniform01 and uniform_source, which the core takes too, are defined in
/// detail/uniform_source.hpp, and are part of this header through it.

#include <type_traits>

#include "detail/uniform_source.hpp"  // uniform_bit_generator, uniform01, uniform_source

namespace specdec {

/// A generator argument taken by forwarding reference: G may be deduced as a reference
/// type, so the concept is applied to the underlying type.
template <class G>
concept random_generator = uniform_bit_generator<std::remove_cvref_t<G>>;

}  // namespace specdec
