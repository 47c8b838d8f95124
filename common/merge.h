/// \file merge.h
/// \brief The merge of two partial attention results of the same rows, written once for
/// stage 12's rings (ring_cpu.cpp, ring_gpu.cu) and stage 14's split-KV decoding (its CPU
/// step and its combine kernel). Stage 12 introduced it, so it keeps stage 12's namespace.
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
#define FA_MERGE_HOST_DEVICE __host__ __device__
#else
#define FA_MERGE_HOST_DEVICE
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
FA_MERGE_HOST_DEVICE inline MergeWeights merge_weights(float L_acc, float L_part) {
  const float inf = INFINITY;
  // A side that saw no key (L = −∞, O = 0) has no weight. Written out, so that two such
  // sides give L = −∞ rather than −∞ − (−∞) = NaN.
  if (L_part == -inf) return {L_acc, 1.0f, 0.0f};
  if (L_acc == -inf) return {L_part, 0.0f, 1.0f};
  // With t = e^{L_small − L_big} ≤ 1 (nothing overflows):
  //   L = L_big + log(1 + t),  w_big = 1 / (1 + t),  w_small = t / (1 + t).
  // These are e^{L_big − L} and e^{L_small − L}, computed without the rounded L: at L ≈ 560
  // (fp32 ulp 6·10⁻⁵) one rounding of L is up to 3·10⁻⁵, and e^{L_x − L} would carry it into
  // every element of O.
  // A NaN on either side fails the comparison and makes t, L and both weights NaN.
  const bool acc_bigger = L_acc >= L_part;
  const float t = acc_bigger ? expf(L_part - L_acc) : expf(L_acc - L_part);
  const float L = (acc_bigger ? L_acc : L_part) + log1pf(t);
  const float w_big = 1.0f / (1.0f + t), w_small = t / (1.0f + t);
  return acc_bigger ? MergeWeights{L, w_big, w_small} : MergeWeights{L, w_small, w_big};
}
//! [merge]

//! [merge many]
/// Many partial results of the same row merged one after another: stage 05's online update,
/// with each partial as one "key" whose score is its L_s and whose value is its O_s. The
/// caller keeps O_acc = Σ_s e^{L_s − L_max}·O_s (unnormalised); `sum` = Σ_s e^{L_s − L_max}.
/// At the end O = O_acc / sum and L = L_max + log(sum), L rounded once. (A fold of pairwise
/// merges, merge_weights above, rounds L at every step: after a thousand splits of one row
/// its error has grown about thirty-fold.) The weights are e^{L_s − L_max} of exact inputs.
struct MergeMany {
  float L_max = -INFINITY;  ///< the largest L so far (the "row max" of the partials)
  float sum = 0.0f;         ///< Σ e^{L_s − L_max}

  /// The factors for adding a partial with log-sum-exp `L_s`:
  /// O_acc ← rescale·O_acc + weight·O_s.
  struct Factors {
    float rescale, weight;
  };
  FA_MERGE_HOST_DEVICE Factors add(float L_s) {
    const float max_new = (L_s > L_max || L_s != L_s) ? L_s : L_max;  // L_s != L_s: NaN reaches the row
    // While every partial so far saw no key, L_max = −inf: subtract 0 (as stage 05 does).
    const float shift = max_new == -INFINITY ? 0.0f : max_new;
    const Factors f{expf(L_max - shift), expf(L_s - shift)};
    sum = f.rescale * sum + f.weight;
    L_max = max_new;
    return f;
  }
  /// The merged L: −inf when no partial saw a key.
  FA_MERGE_HOST_DEVICE float L() const { return sum == 0.0f ? -INFINITY : L_max + logf(sum); }
  /// The factor that normalises O_acc: 1/sum, 0 when no partial saw a key (O = 0).
  FA_MERGE_HOST_DEVICE float normaliser() const { return sum == 0.0f ? 0.0f : 1.0f / sum; }
};
//! [merge many]

}  // namespace fa::stage12
