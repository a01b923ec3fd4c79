#pragma once
/// \file
/// Compile-time diagnosis of arguments, shared by the entry points' checks (specdec/diagnostics.hpp)
/// and the fallback overloads of verify() and verify_tree(): which argument has the wrong type,
/// in a static_assert message that names the requirement and the fix. Here, in detail/, so that
/// verify.hpp and tree_verify.hpp need not include the adapter concepts.
///
/// verify() and verify_tree() each have, beside every overload, an unconstrained one with the
/// same parameters in the same places, constrained on the negation of the real overload's
/// conditions (verify_arguments and the like below, one condition per deduced parameter); so it
/// is chosen only when the real one is not viable, and a call with, say, std::vector<float>
/// logits or a seed in place of the generator reports which argument and the fix, not "no
/// matching function" and a list of candidates.

#include <Eigen/Core>

#include <span>
#include <type_traits>
#include <vector>

#include "uniform_source.hpp"
#include "vocabulary.hpp"

namespace specdec::detail {

/// A false that depends on T, for static_assert in a discarded branch.
template <class...>
inline constexpr bool dependent_false = false;

template <class T>
inline constexpr bool is_std_vector = false;
template <class T, class A>
inline constexpr bool is_std_vector<std::vector<T, A>> = true;

/// An Eigen object (a matrix, array, expression or map): derived from Eigen::EigenBase.
template <class T>
concept eigen_object = std::is_base_of_v<Eigen::EigenBase<std::remove_cvref_t<T>>, std::remove_cvref_t<T>>;

/// Why G is not a random_generator (specdec/random.hpp: uniform_bit_generator of the
/// underlying type).
template <class G>
constexpr bool diagnose_generator() {
    using U = std::remove_cvref_t<G>;
    if constexpr (uniform_bit_generator<U> && std::is_const_v<std::remove_reference_t<G>>) {
        static_assert(dependent_false<G>,
                      "specdec: rng is const: the library draws from it, which changes its state; pass a "
                      "non-const generator (e.g. `std::mt19937_64 rng(seed);`)");
        return true;
    } else if constexpr (uniform_bit_generator<U>) {
        return false;
    } else if constexpr (std::is_arithmetic_v<U>) {
        static_assert(dependent_false<G>,
                      "specdec: rng must be a random generator object, not a number: pass e.g. "
                      "`std::mt19937_64 rng(seed);` (a std::uniform_random_bit_generator)");
        return true;
    } else {
        static_assert(dependent_false<G>,
                      "specdec: rng must satisfy std::uniform_random_bit_generator (e.g. std::mt19937_64): "
                      "result_type an unsigned integer, static min() and max(), and operator()");
        return true;
    }
}

/// A generator argument of a forwarding reference (G as deduced) that the library can draw
/// from: a uniform_bit_generator, not const (specdec::random_generator, random.hpp).
template <class G>
concept drawable_generator = uniform_bit_generator<std::remove_cvref_t<G>> && !std::is_const_v<std::remove_reference_t<G>>;

/// An argument that binds to a `const Eigen::Ref<const Eigen::MatrixXf>&` parameter (L as
/// deduced for a forwarding reference: the argument's type and value category).
template <class L>
concept float_matrix_argument = std::is_convertible_v<L, Eigen::Ref<const Eigen::MatrixXf>>;
/// An argument that converts to a std::span<const token_id> parameter.
template <class T>
concept token_span_argument = std::is_convertible_v<T, std::span<const token_id>>;
/// An argument that converts to a std::span<const float> parameter.
template <class S>
concept float_span_argument = std::is_convertible_v<S, std::span<const float>>;

/// The deduced arguments of each overload of verify() and of verify_tree(): when these hold,
/// the real overload is viable (its other parameters are the fallback's too).
template <class L, class T, class Q, class G>
concept verify_arguments = float_matrix_argument<L> && token_span_argument<T> && float_matrix_argument<Q> &&
                           drawable_generator<G>;
template <class L, class T, class Q, class S, class G>
concept verify_scaled_arguments = verify_arguments<L, T, Q, G> && float_span_argument<S>;
template <class L, class T, class G>
concept verify_point_mass_arguments =
    float_matrix_argument<L> && token_span_argument<T> && drawable_generator<G>;
template <class L, class G>
concept verify_tree_arguments = float_matrix_argument<L> && drawable_generator<G>;

/// target_logits of verify() or verify_tree(): an Eigen matrix of float.
template <class L>
constexpr bool diagnose_target_logits_argument() {
    using T = std::remove_cvref_t<L>;
    if constexpr (float_matrix_argument<L>) {
        return false;
    } else if constexpr (is_std_vector<T>) {
        static_assert(dependent_false<L>,
                      "specdec: target_logits must be an Eigen matrix of float, vocab_size rows and one column "
                      "per position (Eigen::MatrixXf, a block of one, or an Eigen::Map); got std::vector: pass "
                      "Eigen::Map<const Eigen::MatrixXf>(v.data(), vocab, columns) over a column-major float "
                      "buffer");
        return true;
    } else if constexpr (eigen_object<T>) {
        if constexpr (!std::is_same_v<typename T::Scalar, float>) {
            static_assert(dependent_false<L>,
                          "specdec: target_logits must be an Eigen matrix of float; got an Eigen object of "
                          "another scalar type (e.g. Eigen::MatrixXd): pass logits.cast<float>()");
        } else {
            static_assert(dependent_false<L>,
                          "specdec: target_logits must convert to Eigen::Ref<const Eigen::MatrixXf>: pass a "
                          "float matrix (an array: .matrix())");
        }
        return true;
    } else {
        static_assert(dependent_false<L>,
                      "specdec: target_logits must convert to Eigen::Ref<const Eigen::MatrixXf>: an Eigen "
                      "matrix of float (vocab_size rows, one column per position), a block of one, or an "
                      "Eigen::Map over float logits");
        return true;
    }
}

/// draft_tokens of verify(): a contiguous range of token_id.
template <class T>
constexpr bool diagnose_draft_tokens_argument() {
    if constexpr (token_span_argument<T>) {
        return false;
    } else {
        static_assert(dependent_false<T>,
                      "specdec: draft_tokens must be a contiguous range of specdec::token_id (convertible to "
                      "std::span<const specdec::token_id>, e.g. a std::vector<specdec::token_id>); copy tokens "
                      "of another integer type into one");
        return true;
    }
}

/// draft_probs of verify(): an Eigen matrix of float, or the point_mass tag (Q = void: the
/// point-mass overload, nothing to check).
template <class Q>
constexpr bool diagnose_draft_probs_argument() {
    using T = std::remove_cvref_t<Q>;
    if constexpr (std::is_void_v<Q> || float_matrix_argument<Q>) {
        return false;
    } else if constexpr (is_std_vector<T>) {
        static_assert(dependent_false<Q>,
                      "specdec: draft_probs must be an Eigen matrix of float, one draft distribution per column "
                      "(Eigen::MatrixXf, a block of one, or an Eigen::Map); got std::vector: pass "
                      "Eigen::Map<const Eigen::MatrixXf>(v.data(), vocab, gamma) over a column-major float "
                      "buffer, or specdec::point_mass for drafts without distributions");
        return true;
    } else if constexpr (eigen_object<T>) {
        if constexpr (!std::is_same_v<typename T::Scalar, float>) {
            static_assert(dependent_false<Q>,
                          "specdec: draft_probs must be an Eigen matrix of float; got an Eigen object of another "
                          "scalar type (e.g. Eigen::MatrixXd): pass probs.cast<float>()");
        } else {
            static_assert(dependent_false<Q>,
                          "specdec: draft_probs must convert to Eigen::Ref<const Eigen::MatrixXf>: pass a float "
                          "matrix (an array: .matrix())");
        }
        return true;
    } else {
        static_assert(dependent_false<Q>,
                      "specdec: draft_probs must convert to Eigen::Ref<const Eigen::MatrixXf> (vocab_size x "
                      "gamma, column i the distribution draft token i was drawn from), or be specdec::point_mass "
                      "for drafts without distributions");
        return true;
    }
}

/// draft_scales of verify(): a contiguous range of float (S = void: an overload without it).
template <class S>
constexpr bool diagnose_draft_scales_argument() {
    if constexpr (std::is_void_v<S> || float_span_argument<S>) {
        return false;
    } else {
        static_assert(dependent_false<S>,
                      "specdec: draft_scales must be a contiguous range of float, one factor per draft column "
                      "(convertible to std::span<const float>, e.g. a std::vector<float>)");
        return true;
    }
}

/// The deduced arguments of verify() in order, up to the first that fails; true when one was
/// reported. Q = void: the point-mass overload (no draft_probs); S = void: no draft_scales.
template <class L, class T, class Q, class S, class G>
constexpr bool diagnose_verify_call() {
    if constexpr (diagnose_target_logits_argument<L>()) return true;
    else if constexpr (diagnose_draft_tokens_argument<T>()) return true;
    else if constexpr (diagnose_draft_probs_argument<Q>()) return true;
    else if constexpr (diagnose_draft_scales_argument<S>()) return true;
    else return diagnose_generator<G>();
}

/// The deduced arguments of verify_tree() in order, as above.
template <class L, class G>
constexpr bool diagnose_verify_tree_call() {
    if constexpr (diagnose_target_logits_argument<L>()) return true;
    else return diagnose_generator<G>();
}

/// The body of verify()'s fallback overloads: reports the first argument of the wrong type
/// (or, should a failing condition escape the checks, the requirements themselves).
template <class L, class T, class Q, class S, class G>
constexpr void reject_verify_call() {
    static_assert(diagnose_verify_call<L, T, Q, S, G>(),
                  "specdec: verify needs target_logits and draft_probs convertible to "
                  "Eigen::Ref<const Eigen::MatrixXf>, draft_tokens to std::span<const specdec::token_id>, and "
                  "rng a random generator");
}

/// The body of verify_tree()'s fallback overload, as above.
template <class L, class G>
constexpr void reject_verify_tree_call() {
    static_assert(diagnose_verify_tree_call<L, G>(),
                  "specdec: verify_tree needs target_logits convertible to Eigen::Ref<const Eigen::MatrixXf> and "
                  "rng a random generator");
}

}  // namespace specdec::detail
