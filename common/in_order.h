/// \file in_order.h
/// \brief Matrix products with every sum taken one term after another, in index order: the
/// second fp32 baseline of the tolerance (compare.h), used by the reference and by the
/// masked reference.
///
/// Every element of C is its sum taken k = 0, 1, … as a plain loop adds. Written as rows of
/// axpys, so the k-sum of each element is still in order while the loop over its row
/// vectorises.
#pragma once

#include <cstdint>

#include "eigen.h"

namespace fa {

/// C = A·B over the first n(i) columns of row i of A   ([rows, K]·[K, cols] → [rows, cols])
template <typename Mat, typename KeysOfRow>
Mat times_in_order(const Mat& A, const Mat& B, KeysOfRow n) {
  Mat C = Mat::Zero(A.rows(), B.cols());
  for (int64_t i = 0; i < A.rows(); ++i)
    for (int64_t k = 0; k < n(i); ++k) C.row(i) += A(i, k) * B.row(k);
  return C;
}

/// C += Aᵀ·B with row i of A taking part over its first n(i) columns, summed over i in order
/// ([rows, K]ᵀ·[rows, cols] → [K, cols]). Each element's sum goes on from the value C holds:
/// called once per query head of a GQA group (and per block of rows), it adds every row of
/// every head one after another into one accumulator, as a plain loop over the group adds
/// dK and dV — not a sum per head added to C, whose sums are a group's size shorter.
template <typename Mat, typename KeysOfRow>
void add_transpose_times_in_order(Mat& C, const Mat& A, const Mat& B, KeysOfRow n) {
  for (int64_t i = 0; i < A.rows(); ++i)
    for (int64_t k = 0; k < n(i); ++k) C.row(k) += A(i, k) * B.row(i);
}

}  // namespace fa
