#pragma once
/// \file
/// Compile-time diagnosis of the entry points' requirements: which part of a concept a type
/// misses, in a static_assert message that names the requirement and the fix. The entry points
/// run it on their arguments; check_drafter and check_verifier run it on an adapter of yours.
///
/// The entry points (speculative_decode, batch_decoder, autoregressive_decode,
/// speculative_step) are constrained on the concepts of concepts.hpp; each also has an
/// unconstrained overload, chosen only when a constraint fails, whose body runs these checks
/// in order and stops at the first that fails. So a call with, say, a `next_logits` that
/// returns std::vector<float> reports
/// "next_logits must return an Eigen vector of float ... got std::vector<float>" instead of
/// "no operand of the disjunction is satisfied". (The fallback overloads make such calls
/// well-formed in unevaluated contexts such as requires-expressions; test the concepts
/// themselves, not the callability of an entry point.)
///
/// verify() and verify_tree() diagnose their arguments the same way (a target_logits that is not
/// an Eigen matrix of float, a generator that is not one, ...): see
/// detail/argument_diagnostics.hpp.

#include <Eigen/Core>

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "concepts.hpp"
#include "detail/argument_diagnostics.hpp"
#include "multi_sequence.hpp"
#include "random.hpp"
#include "tree.hpp"
#include "types.hpp"

namespace specdec::detail {

// (dependent_false, is_std_vector, eigen_object and diagnose_generator are in
// detail/argument_diagnostics.hpp, which verify() and verify_tree() use too.)

template <class M>
concept has_vocab_size = requires(M& m) { m.vocab_size(); };
template <class M>
concept has_integer_vocab_size = requires(M& m) { { m.vocab_size() } -> std::convertible_to<std::ptrdiff_t>; };
// A member of that name, found when it is neither overloaded nor a template (&M::f is then valid).
template <class M>
concept names_next_logits = requires { &M::next_logits; };
template <class M>
concept names_score = requires { &M::score; };
template <class M>
concept names_draft = requires { &M::draft; };
template <class M>
concept next_logits_callable = requires(M& m, std::span<const token_id> c) { m.next_logits(c); };
template <class M>
concept score_callable = requires(M& m, std::span<const token_id> c) { m.score(c, c); };
template <class M>
concept draft_callable = requires(M& m, std::span<const token_id> c, std::size_t g, const sampling_config& s,
                                  uniform_source& u, draft_block& b) { m.draft(c, g, s, u, b); };

// Each diagnose_* function returns true when it reported a failed requirement (its
// static_assert then fails), false when it found nothing wrong.

/// A model's vocab_size(): present on a non-const object, and an integer.
template <class M>
constexpr bool diagnose_vocab_size() {
    if constexpr (!has_vocab_size<M>) {
        static_assert(dependent_false<M>,
                      "specdec: the model has no vocab_size() member function callable on it; add "
                      "`std::ptrdiff_t vocab_size() const` returning the size of the shared vocabulary");
        return true;
    } else if constexpr (!has_integer_vocab_size<M>) {
        static_assert(dependent_false<M>,
                      "specdec: vocab_size() must return an integer (convertible to std::ptrdiff_t)");
        return true;
    } else {
        return false;
    }
}

/// The result of next_logits: an Eigen vector of float.
template <class R>
constexpr bool diagnose_logits_vector() {
    using T = std::remove_cvref_t<R>;
    if constexpr (is_std_vector<T>) {
        static_assert(dependent_false<R>,
                      "specdec: next_logits must return an Eigen vector of float (Eigen::VectorXf or an "
                      "expression of it); got std::vector: return an Eigen::VectorXf, or an "
                      "Eigen::Map<const Eigen::VectorXf>(v.data(), v.size()) over a float buffer that outlives "
                      "the call");
        return true;
    } else if constexpr (eigen_object<T>) {
        if constexpr (!std::is_same_v<typename T::Scalar, float>) {
            static_assert(dependent_false<R>,
                          "specdec: next_logits must return an Eigen vector of float; got an Eigen object of "
                          "another scalar type (e.g. Eigen::VectorXd): return logits.cast<float>()");
            return true;
        } else {
            return false;
        }
    } else if constexpr (!std::convertible_to<R, Eigen::VectorXf>) {
        static_assert(dependent_false<R>,
                      "specdec: next_logits must return an Eigen vector of float (Eigen::VectorXf, an "
                      "expression of it, or an Eigen::Map over float logits); its result does not convert to "
                      "Eigen::VectorXf");
        return true;
    } else {
        return false;
    }
}

/// The result of score: an Eigen matrix of float.
template <class R>
constexpr bool diagnose_logits_matrix() {
    using T = std::remove_cvref_t<R>;
    if constexpr (eigen_object<T>) {
        if constexpr (!std::is_same_v<typename T::Scalar, float>) {
            static_assert(dependent_false<R>,
                          "specdec: score must return an Eigen matrix of float; got an Eigen object of another "
                          "scalar type (e.g. Eigen::MatrixXd): return scores.cast<float>()");
            return true;
        } else {
            return false;
        }
    } else if constexpr (!std::convertible_to<R, Eigen::MatrixXf>) {
        static_assert(dependent_false<R>,
                      "specdec: score(context, draft) must return an Eigen matrix of float (Eigen::MatrixXf, "
                      "vocab_size() rows and draft.size() + 1 columns); its result does not convert to "
                      "Eigen::MatrixXf");
        return true;
    } else {
        return false;
    }
}

template <class M>
using next_logits_result = decltype(std::declval<M&>().next_logits(std::declval<std::span<const token_id>>()));
template <class V>
using score_result = decltype(std::declval<V&>().score(std::declval<std::span<const token_id>>(),
                                                       std::declval<std::span<const token_id>>()));

/// LanguageModel, requirement by requirement.
template <class M>
constexpr bool diagnose_language_model() {
    if constexpr (diagnose_vocab_size<M>()) {
        return true;
    } else if constexpr (!next_logits_callable<M>) {
        if constexpr (names_next_logits<std::remove_const_t<M>>)
            static_assert(dependent_false<M>,
                          "specdec: next_logits cannot be called with the context as a "
                          "std::span<const specdec::token_id>; declare it as "
                          "`Eigen::VectorXf next_logits(std::span<const specdec::token_id> context)`");
        else
            static_assert(dependent_false<M>,
                          "specdec: the model has no next_logits(context) member function callable with a "
                          "std::span<const specdec::token_id>; declare "
                          "`Eigen::VectorXf next_logits(std::span<const specdec::token_id> context)`");
        return true;
    } else {
        return diagnose_logits_vector<next_logits_result<M>>();
    }
}

/// BatchVerifier, requirement by requirement.
template <class V>
constexpr bool diagnose_batch_verifier() {
    if constexpr (diagnose_vocab_size<V>()) {
        return true;
    } else if constexpr (!score_callable<V>) {
        static_assert(dependent_false<V>,
                      "specdec: the verifier's score has the wrong signature; a BatchVerifier needs "
                      "`Eigen::MatrixXf score(std::span<const specdec::token_id> context, "
                      "std::span<const specdec::token_id> draft)` (the logits after context + draft[0..j) in "
                      "column j), or remove it and give the verifier next_logits(context)");
        return true;
    } else {
        return diagnose_logits_matrix<score_result<V>>();
    }
}

/// BlockDrafter, requirement by requirement.
template <class D>
constexpr bool diagnose_block_drafter() {
    if constexpr (diagnose_vocab_size<D>()) {
        return true;
    } else if constexpr (!draft_callable<D>) {
        static_assert(dependent_false<D>,
                      "specdec: the drafter's draft has the wrong signature; a BlockDrafter needs `void "
                      "draft(std::span<const specdec::token_id> context, std::size_t gamma, const "
                      "specdec::sampling_config& sampling, specdec::uniform_source& uniforms, specdec::draft_block& "
                      "out)`");
        return true;
    } else {
        return false;
    }
}

/// Why D is not a Drafter; for a Drafter, only the scalar type of its logits is checked.
template <class D>
constexpr bool diagnose_drafter() {
    using U = std::remove_const_t<D>;
    if constexpr (Drafter<D>) {
        if constexpr (BlockDrafter<D>) {
            return false;
        } else if constexpr (names_draft<U> && BlockDrafter<U>) {
            static_assert(dependent_false<D>,
                          "specdec: the drafter is const, and its draft() is not a const member function: "
                          "decoding would silently ignore draft() and sample from next_logits(); make draft() and "
                          "vocab_size() const, or pass a non-const drafter");
            return true;
        } else if constexpr (names_draft<U>) {
            // A LanguageModel whose draft() misses BlockDrafter's signature: decoding would
            // call next_logits and never the draft() its author meant it to use.
            static_assert(dependent_false<D>,
                          "specdec: the drafter has next_logits() and a draft() that is not a BlockDrafter's, so "
                          "decoding would silently ignore draft(); declare it as `void draft(std::span<const "
                          "specdec::token_id> context, std::size_t gamma, const specdec::sampling_config& "
                          "sampling, specdec::uniform_source& uniforms, specdec::draft_block& out)`, or rename it");
            return true;
        } else {
            return diagnose_logits_vector<next_logits_result<D>>();
        }
    } else if constexpr (std::is_const_v<D> && Drafter<U>) {
        static_assert(dependent_false<D>,
                      "specdec: the drafter is const: its draft() (or next_logits()) and vocab_size() must be "
                      "const member functions, or pass a non-const drafter (models keep state such as a KV "
                      "cache, so they are taken by non-const reference)");
        return true;
    } else if constexpr (names_draft<U> || draft_callable<U>) {
        return diagnose_block_drafter<D>();
    } else if constexpr (names_next_logits<U> || next_logits_callable<U>) {
        return diagnose_language_model<D>();
    } else if constexpr (names_score<U> || score_callable<U>) {
        static_assert(dependent_false<D>,
                      "specdec: the drafter has score() but neither draft() nor next_logits(): it looks like a "
                      "verifier; the drafter comes first: speculative_decode(drafter, verifier, prompt, options, "
                      "rng)");
        return true;
    } else {
        static_assert(dependent_false<D>,
                      "specdec: the drafter has neither `draft(context, gamma, sampling, uniforms, out)` (a "
                      "BlockDrafter) nor `next_logits(context)` (a LanguageModel); see specdec/concepts.hpp");
        return true;
    }
}

/// Why V is not a Verifier; for a Verifier, only the scalar type of its logits is checked.
template <class V>
constexpr bool diagnose_verifier() {
    using U = std::remove_const_t<V>;
    if constexpr (Verifier<V>) {
        if constexpr (BatchVerifier<V>) {
            return diagnose_logits_matrix<score_result<V>>();
        } else if constexpr (score_callable<V>) {
            return diagnose_logits_matrix<score_result<V>>();  // (a score() of the wrong result type)
        } else if constexpr (names_score<U> && BatchVerifier<U>) {
            static_assert(dependent_false<V>,
                          "specdec: the verifier is const, and its score() is not a const member function: "
                          "decoding would silently ignore score() and call next_logits() per position; make "
                          "score() and vocab_size() const, or pass a non-const verifier");
            return true;
        } else if constexpr (names_score<U>) {
            // A LanguageModel whose score() misses BatchVerifier's signature: decoding would
            // call next_logits γ + 1 times per step and never the batched pass.
            static_assert(dependent_false<V>,
                          "specdec: the verifier has next_logits() and a score() that is not a BatchVerifier's, "
                          "so decoding would silently ignore score(); declare it as `Eigen::MatrixXf "
                          "score(std::span<const specdec::token_id> context, std::span<const specdec::token_id> "
                          "draft)` (the logits after context + draft[0..j) in column j), or rename it");
            return true;
        } else {
            return diagnose_logits_vector<next_logits_result<V>>();
        }
    } else if constexpr (std::is_const_v<V> && Verifier<U>) {
        static_assert(dependent_false<V>,
                      "specdec: the model is const: next_logits (or score) and vocab_size must be const member "
                      "functions, or pass a non-const model (models keep state such as a KV cache, so they are "
                      "taken by non-const reference)");
        return true;
    } else if constexpr (names_score<U> || score_callable<U>) {
        return diagnose_batch_verifier<V>();
    } else if constexpr (names_next_logits<U> || next_logits_callable<U>) {
        return diagnose_language_model<V>();
    } else if constexpr (names_draft<U> || draft_callable<U>) {
        static_assert(dependent_false<V>,
                      "specdec: the verifier has draft() but neither score() nor next_logits(): it looks like a "
                      "drafter; the target comes second: speculative_decode(drafter, verifier, prompt, options, "
                      "rng)");
        return true;
    } else {
        static_assert(dependent_false<V>,
                      "specdec: the verifier (target) has neither `score(context, draft)` (a BatchVerifier) nor "
                      "`next_logits(context)` (a LanguageModel); see specdec/concepts.hpp");
        return true;
    }
}

/// The arguments of a speculative entry point, in order (the drafter, the verifier, the
/// generator), up to the first requirement that fails; true when one was reported.
template <class D, class V, class G>
constexpr bool diagnose_speculative_call() {
    if constexpr (diagnose_drafter<D>()) return true;
    else if constexpr (diagnose_verifier<V>()) return true;
    else return diagnose_generator<G>();
}

/// The arguments of autoregressive_decode (the model, the generator), as above.
template <class M, class G>
constexpr bool diagnose_autoregressive_call() {
    if constexpr (diagnose_verifier<M>()) return true;
    else return diagnose_generator<G>();
}

/// The body of an entry point's unconstrained fallback overload: reports the first failed
/// requirement, or (should a failing concept escape the checks) the concepts themselves.
template <class D, class V, class G>
constexpr void reject_speculative_call() {
    static_assert(diagnose_speculative_call<D, V, G>() || (Drafter<D> && Verifier<V> && random_generator<G>),
                  "specdec: the drafter must be a Drafter, the verifier a Verifier and rng a random generator "
                  "(see specdec/concepts.hpp)");
}
template <class M, class G>
constexpr void reject_autoregressive_call() {
    static_assert(diagnose_autoregressive_call<M, G>() || (Verifier<M> && random_generator<G>),
                  "specdec: the model must be a Verifier and rng a random generator (see specdec/concepts.hpp)");
}

template <class M>
concept names_propose_tree = requires { &M::propose_tree; };
template <class M>
concept names_score_tree = requires { &M::score_tree; };
template <class M>
concept names_draft_batch = requires { &M::draft_batch; };
template <class M>
concept names_score_batch = requires { &M::score_batch; };
template <class M>
concept names_score_tree_batch = requires { &M::score_tree_batch; };

/// A drafter that names a member of one of the other drafter concepts (propose_tree,
/// draft_batch) but misses it: which signature was expected.
template <class D>
constexpr bool diagnose_other_drafter() {
    using U = std::remove_const_t<D>;
    if constexpr (names_propose_tree<U> && !TreeDrafter<U>) {
        if constexpr (diagnose_vocab_size<D>()) return true;
        static_assert(dependent_false<D>,
                      "specdec: the drafter's propose_tree has the wrong signature; a TreeDrafter needs `void "
                      "propose_tree(std::span<const specdec::token_id> context, const specdec::tree_shape& shape, "
                      "const specdec::sampling_config& sampling, specdec::uniform_source& uniforms, "
                      "specdec::draft_tree& out)`");
        return true;
    } else if constexpr (names_draft_batch<U> && !MultiSequenceDrafter<U>) {
        if constexpr (diagnose_vocab_size<D>()) return true;
        static_assert(dependent_false<D>,
                      "specdec: the drafter's draft_batch has the wrong signature; a MultiSequenceDrafter needs "
                      "`void draft_batch(std::span<specdec::draft_request> requests, const "
                      "specdec::sampling_config& sampling)`");
        return true;
    } else {
        return false;
    }
}

/// The same for a verifier (score_tree, score_batch).
template <class V>
constexpr bool diagnose_other_verifier() {
    using U = std::remove_const_t<V>;
    if constexpr (names_score_tree<U> && !TreeVerifier<U>) {
        if constexpr (diagnose_vocab_size<V>()) return true;
        static_assert(dependent_false<V>,
                      "specdec: the verifier's score_tree has the wrong signature; a TreeVerifier needs `void "
                      "score_tree(std::span<const specdec::token_id> context, const specdec::draft_tree& tree, "
                      "Eigen::MatrixXf& out)` (out: vocab_size() x (tree.size() + 1), the root first)");
        return true;
    } else if constexpr (names_score_tree_batch<U> && !MultiSequenceTreeVerifier<U>) {
        if constexpr (diagnose_vocab_size<V>()) return true;
        static_assert(dependent_false<V>,
                      "specdec: the verifier's score_tree_batch has the wrong signature; a "
                      "MultiSequenceTreeVerifier needs `void score_tree_batch(std::span<const "
                      "specdec::tree_score_request> requests, specdec::packed_logits& out)`");
        return true;
    } else if constexpr (names_score_batch<U> && !MultiSequenceVerifier<U>) {
        if constexpr (diagnose_vocab_size<V>()) return true;
        static_assert(dependent_false<V>,
                      "specdec: the verifier's score_batch has the wrong signature; a MultiSequenceVerifier needs "
                      "`void score_batch(std::span<const specdec::score_request> requests, specdec::packed_logits& "
                      "out)`");
        return true;
    } else {
        return false;
    }
}

/// Runs Check::run() only when `run` holds (a class template's member function is
/// instantiated only when called, unlike a function template named as an argument).
template <bool run, class Check>
constexpr bool diagnose_if() {
    if constexpr (run) return Check::run();
    else return false;
}
template <class D>
struct drafter_check {
    static constexpr bool run() { return diagnose_drafter<D>(); }
};
template <class D>
struct other_drafter_check {
    static constexpr bool run() { return diagnose_other_drafter<D>(); }
};
template <class V>
struct verifier_check {
    static constexpr bool run() { return diagnose_verifier<V>(); }
};
template <class V>
struct other_verifier_check {
    static constexpr bool run() { return diagnose_other_verifier<V>(); }
};

/// The drafter of speculative_decode or batch_decoder, requirement by requirement; true when
/// one was reported.
template <class D>
constexpr bool diagnose_decoder_drafter() {
    using UD = std::remove_const_t<D>;
    constexpr bool drafter_ok = Drafter<D> || TreeDrafter<D> || MultiSequenceDrafter<D>;
    // (Each check runs only when its condition holds: a check is a function template whose
    // static_assert fires once instantiated, so `condition && check()` would not do.)
    if constexpr (!drafter_ok && std::is_const_v<D> && (TreeDrafter<UD> || MultiSequenceDrafter<UD>)) {
        static_assert(dependent_false<D>,
                      "specdec: the drafter is const: its member functions must be const, or pass a non-const "
                      "drafter (models keep state such as a KV cache, so they are taken by non-const reference)");
        return true;
    } else if constexpr (diagnose_if<!drafter_ok || (names_propose_tree<UD> && !TreeDrafter<UD>) ||
                                         (names_draft_batch<UD> && !MultiSequenceDrafter<UD>),
                                     other_drafter_check<D>>()) {
        // (Also beside an interface that works: a misdeclared propose_tree or draft_batch would
        // otherwise be silently ignored.)
        return true;
    } else {
        // (For a plain LanguageModel drafter: the scalar type of its logits.)
        // (And for any LanguageModel beside a misdeclared draft(): its chain steps would ignore it.)
        return diagnose_if<!drafter_ok || (Drafter<D> && !TreeDrafter<D> && !MultiSequenceDrafter<D>) ||
                               (Drafter<D> && names_draft<UD> && !BlockDrafter<D>),
                           drafter_check<D>>();
    }
}

/// The verifier of speculative_decode or batch_decoder, requirement by requirement.
template <class V>
constexpr bool diagnose_decoder_verifier() {
    using UV = std::remove_const_t<V>;
    constexpr bool verifier_ok =
        Verifier<V> || TreeVerifier<V> || MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>;
    if constexpr (!verifier_ok && std::is_const_v<V> &&
                  (TreeVerifier<UV> || MultiSequenceVerifier<UV> || MultiSequenceTreeVerifier<UV>)) {
        static_assert(dependent_false<V>,
                      "specdec: the verifier is const: its member functions must be const, or pass a non-const "
                      "verifier (models keep state such as a KV cache, so they are taken by non-const reference)");
        return true;
    } else if constexpr (diagnose_if<!verifier_ok || (names_score_tree<UV> && !TreeVerifier<UV>) ||
                                         (names_score_tree_batch<UV> && !MultiSequenceTreeVerifier<UV>) ||
                                         (names_score_batch<UV> && !MultiSequenceVerifier<UV>),
                                     other_verifier_check<V>>()) {
        // (Also beside an interface that works, as for the drafter.)
        return true;
    } else {
        // (And for any LanguageModel beside a misdeclared score(): its chain steps would ignore it.)
        return diagnose_if<!verifier_ok ||
                               (Verifier<V> && !TreeVerifier<V> && !MultiSequenceVerifier<V> &&
                                !MultiSequenceTreeVerifier<V>) ||
                               (Verifier<V> && names_score<UV> && !BatchVerifier<V>),
                           verifier_check<V>>();
    }
}

/// The arguments of speculative_decode and batch_decoder: a drafter that drafts chains or
/// trees for one sequence (Drafter, TreeDrafter) or chains for many (MultiSequenceDrafter), a
/// verifier likewise, and a generator; up to the first requirement that fails.
template <class D, class V, class G>
constexpr bool diagnose_decoder_call() {
    if constexpr (diagnose_decoder_drafter<D>()) return true;
    else if constexpr (diagnose_decoder_verifier<V>()) return true;
    else return diagnose_generator<G>();
}

/// The body of speculative_decode's unconstrained fallback overload (see reject_speculative_call).
template <class D, class V, class G>
constexpr void reject_decoder_call() {
    static_assert(diagnose_decoder_call<D, V, G>() ||
                      ((Drafter<D> || TreeDrafter<D> || MultiSequenceDrafter<D>) &&
                       (Verifier<V> || TreeVerifier<V> || MultiSequenceVerifier<V> || MultiSequenceTreeVerifier<V>) &&
                       random_generator<G>),
                  "specdec: the drafter must be a Drafter, TreeDrafter or MultiSequenceDrafter, the verifier a "
                  "Verifier, TreeVerifier or MultiSequenceVerifier, and rng a random generator (see "
                  "specdec/concepts.hpp, tree.hpp, multi_sequence.hpp)");
}

}  // namespace specdec::detail

namespace specdec {

/// The entry points' compile-time diagnosis of an adapter, for a static_assert of your own next
/// to the adapter: `static_assert(specdec::check_verifier<my_model>());` is true when my_model
/// can be the target of speculative_decode and batch_decoder (a Verifier, TreeVerifier,
/// MultiSequenceVerifier or MultiSequenceTreeVerifier whose logits are float); otherwise the
/// compiler stops at a message that names the requirement missed and the fix (e.g.
/// "next_logits must return an Eigen vector of float ...; got std::vector"), where a concept in a
/// static_assert says only that its constraints are not satisfied.
template <class V>
[[nodiscard]] constexpr bool check_verifier() {
    return !detail::diagnose_decoder_verifier<V>();
}

/// The same for a drafter (a Drafter, TreeDrafter or MultiSequenceDrafter):
/// `static_assert(specdec::check_drafter<my_drafter>());`.
template <class D>
[[nodiscard]] constexpr bool check_drafter() {
    return !detail::diagnose_decoder_drafter<D>();
}

}  // namespace specdec
