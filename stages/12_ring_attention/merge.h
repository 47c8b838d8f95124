/// \file merge.h
/// \brief Stage 12: the merge of two partial attention results of the same rows, written
/// once for the CPU ring (ring_cpu.cpp) and the GPU ring's merge kernel (ring_gpu.cu).
///
/// A partial result of a query row over a set of keys A is its normalised output O_A and its
/// log-sum-exp L_A = log Σ_{j∈A} e^{s_j}. Over two disjoint sets A and B:
///
///     L = log(e^{L_A} + e^{L_B}),   O = e^{L_A − L}·O_A + e^{L_B − L}·O_B
///
/// (the README derives it from stage 05's update). It is exact, commutative and associative,
/// and (O = 0, L = −∞), the result over no key, is its identity.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define FA_HOST_DEVICE __host__ __device__
#else
#define FA_HOST_DEVICE
#endif

namespace fa::stage12 {

/// The merged log-sum-exp and the weight of each side's output: O = w_acc·O_acc + w_part·O_part.
struct MergeWeights {
  float L;       ///< log(e^{L_acc} + e^{L_part})
  float w_acc;   ///< e^{L_acc − L}
  float w_part;  ///< e^{L_part − L}
};

//! [merge]
/// The weights for merging a partial result (O_part, L_part) into (O_acc, L_acc), in fp32.
FA_HOST_DEVICE inline MergeWeights merge_weights(float L_acc, float L_part) {
  const float inf = INFINITY;
  // A side that saw no key (L = −∞, O = 0) has no weight. Written out, so that two such
  // sides give L = −∞ rather than −∞ − (−∞) = NaN.
  if (L_part == -inf) return {L_acc, 1.0f, 0.0f};
  if (L_acc == -inf) return {L_part, 0.0f, 1.0f};
  // With t = e^{L_small − L_big} ≤ 1 (nothing overflows):
  //   L = L_big + log(1 + t),  w_big = 1 / (1 + t),  w_small = t / (1 + t).
  // These are e^{L_big − L} and e^{L_small − L}, computed without the rounded L: at L ≈ 500 one
  // rounding of L is 3·10⁻⁵, and e^{L_x − L} would carry it into every element of O.
  // A NaN on either side fails the comparison and makes t, L and both weights NaN.
  const bool acc_bigger = L_acc >= L_part;
  const float t = acc_bigger ? expf(L_part - L_acc) : expf(L_acc - L_part);
  const float L = (acc_bigger ? L_acc : L_part) + log1pf(t);
  const float w_big = 1.0f / (1.0f + t), w_small = t / (1.0f + t);
  return acc_bigger ? MergeWeights{L, w_big, w_small} : MergeWeights{L, w_small, w_big};
}
//! [merge]

}  // namespace fa::stage12
