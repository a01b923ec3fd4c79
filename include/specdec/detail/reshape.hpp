#pragma once
/// \file
/// Resizing an Eigen matrix or vector so that a failed allocation leaves it intact.

#include <Eigen/Core>

namespace specdec::detail {

/// Gives `m` rows x cols (contents unspecified). Eigen 3.4's resize() frees the old storage
/// before it allocates the new one, so when that allocation throws std::bad_alloc the object
/// keeps a dangling pointer (freed again by its destructor). Here the new storage is allocated
/// first and swapped in: on a throw `m` is unchanged. No allocation when the size is unchanged.
template <class Dense>
void reshape(Dense& m, Eigen::Index rows, Eigen::Index cols) {
    if (m.rows() == rows && m.cols() == cols) return;
    if (m.size() == rows * cols) {
        m.resize(rows, cols);  // same storage, new shape: no allocation
        return;
    }
    Dense fresh(rows, cols);
    m.swap(fresh);
}

/// The same for a column vector of n entries.
template <class Vector>
void reshape(Vector& v, Eigen::Index n) {
    if (v.size() == n) return;
    Vector fresh(n);
    v.swap(fresh);
}

}  // namespace specdec::detail
