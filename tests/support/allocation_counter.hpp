#pragma once
// Counting heap allocations, for the tests that show zero allocations per step after warm-up.
// Include it first (before any Eigen header) and in one translation unit of an executable only:
// it replaces the global allocation functions.
//
// Eigen allocates its matrices with malloc, which operator new does not see. With
// EIGEN_RUNTIME_NO_MALLOC, Eigen checks every allocation against a flag through eigen_assert;
// this header routes that check here and counts a forbidden allocation like an operator new.

#define EIGEN_RUNTIME_NO_MALLOC
#define eigen_assert(x) specdec_test_eigen_assert(static_cast<bool>(x), #x)
void specdec_test_eigen_assert(bool ok, const char* condition);

// GCC sees malloc/free behind replaced new/delete and warns; that pairing is the point here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <Eigen/Core>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "skip.hpp"

// AddressSanitizer replaces the allocation functions itself, so these replacements are not the
// ones called; the tests then say so and are reported as skipped (the release and debug builds
// run them).
#if defined(__SANITIZE_ADDRESS__)
#define SPECDEC_ALLOCATIONS_COUNTED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPECDEC_ALLOCATIONS_COUNTED 0
#endif
#endif
#ifndef SPECDEC_ALLOCATIONS_COUNTED
#define SPECDEC_ALLOCATIONS_COUNTED 1
#endif

namespace specdec_test::allocations {
inline std::atomic<std::size_t> count{0};
inline std::atomic<bool> counting{false};
}  // namespace specdec_test::allocations

inline void specdec_test_eigen_assert(bool ok, const char* condition) {
    if (ok) return;
    if (std::strstr(condition, "heap allocation is forbidden") != nullptr) {
        specdec_test::allocations::count.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    std::fprintf(stderr, "Eigen assertion failed: %s\n", condition);
    std::abort();
}

#if SPECDEC_ALLOCATIONS_COUNTED
void* operator new(std::size_t size) {
    if (specdec_test::allocations::counting.load(std::memory_order_relaxed))
        specdec_test::allocations::count.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace specdec_test {

/// True when allocations can be counted here; otherwise reports the test as skipped.
inline bool counting_available() {
    if (SPECDEC_ALLOCATIONS_COUNTED) return true;
    skip("allocation counting is not available under AddressSanitizer");
    return false;
}

/// Counts the allocations (operator new and Eigen's) made while `f` runs.
template <class F>
std::size_t allocations_during(F&& f) {
    allocations::count = 0;
    allocations::counting = true;
    Eigen::internal::set_is_malloc_allowed(false);
    f();
    Eigen::internal::set_is_malloc_allowed(true);
    allocations::counting = false;
    return allocations::count.load();
}

}  // namespace specdec_test
