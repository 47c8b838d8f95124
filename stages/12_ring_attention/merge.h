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
  // L = max + log(1 + e^{min − max}): the exponent is ≤ 0, so nothing overflows. A NaN on
  // either side fails the comparison and makes L NaN, and with it both weights: NaN reaches
  // the row, as it would in the formula.
  const float L = L_acc >= L_part ? L_acc + log1pf(expf(L_part - L_acc))
                                  : L_part + log1pf(expf(L_acc - L_part));
  return {L, expf(L_acc - L), expf(L_part - L)};
}
//! [merge]

}  // namespace fa::stage12
