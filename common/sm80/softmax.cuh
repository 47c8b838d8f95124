// Stage 08: the online softmax, done on the accumulator fragments.
//
// The math is stage 05's, tile by tile (FlashAttention-2, Algorithm 1):
//     m_new = max(m, rowmax(S_ij))
//     P_ij  = e^{scale·(S_ij − m_new)}
//     l     ← e^{scale·(m − m_new)}·l + rowsum(P_ij)
//     O     ← e^{scale·(m − m_new)}·O            (then O += P_ij V_j, in the kernel)
// and at the end O ← O / l, L = scale·m + log l. Scores S are kept unscaled, so m is a
// maximum of raw scores and scale is applied inside the exponent.
//
// What is particular to tensor cores:
//  - A thread holds two rows of each m16 tile (rows g and g+8, mma.cuh), each spread
//    over the 4 lanes of its group. rowmax needs those 4 lanes to agree: two
//    __shfl_xor_sync steps (xor 1, then xor 2) give every lane of the group the maximum.
//  - rowsum does not need that: l is updated by a factor that is the same on the 4 lanes,
//    so each lane keeps the sum of its own columns and the 4 partial sums are added once,
//    after the last tile.
//  - e^x costs a multiply and a hardware 2^x (ex2): e^{scale·(s − m)} = 2^{s·c − m·c} with
//    c = scale·log2(e). One FFMA per score, s·c − (m·c), with m·c computed once per row:
//    the scale folded into the exponent, as in stage 07.
//  - A row whose scores are all masked so far has m = −inf; using 0 in place of m·c then
//    gives 2^{−inf} = 0 instead of 2^{−inf + inf} = NaN. A row that never sees a key ends
//    with l = 0: O = 0 and L = −inf.
#pragma once

#include <cmath>
#include <cstdint>

namespace fa::stage08 {

/// 2^x by the hardware's approximate exponential (relative error about 2⁻²², far below
/// the 2⁻⁸ or 2⁻¹¹ of the 16-bit P it feeds); 2^{−inf} = 0, NaN stays NaN.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Maximum over the 4 lanes of a group (one row of a C fragment).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/// Sum over the 4 lanes of a group.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Plus {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

/// Reduces this lane's values of row h (g for h = 0, g + 8 for h = 1) of a C-fragment
/// row of tiles — elements 2h and 2h+1 of every n8 tile — with `op`, as a tree: pairs,
/// then pairs of pairs. A running reduction down the row would be a chain of 2·kNTiles
/// dependent instructions, each waiting for the one before; the tree is log2 of that
/// deep, so the warp has independent work to issue while each result is on its way.
template <int kNTiles, class Op>
__device__ __forceinline__ float row_reduce(const float (&S)[kNTiles][4], int h, Op op) {
  float v[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) v[nt] = op(S[nt][2 * h], S[nt][2 * h + 1]);
#pragma unroll
  for (int stride = 1; stride < kNTiles; stride *= 2)
#pragma unroll
    for (int i = 0; i + stride < kNTiles; i += 2 * stride) v[i] = op(v[i], v[i + stride]);
  return v[0];
}

/// Running max and sum of this thread's rows: kMTiles m16 tiles × 2 rows (g, g+8).
/// `kLazyRescale`: whether O is rescaled on every tile or only when a maximum moved
/// (rescale()).
template <int kMTiles, bool kLazyRescale = false>
struct OnlineSoftmax {
  float row_max[kMTiles][2];  // m: max of raw scores seen so far (same on the 4 lanes)
  float row_sum[kMTiles][2];  // l: this lane's part of Σ e^{scale·(s − m)}
  float scale;                // softmax scale
  float scale_log2;           // scale · log2(e)

  __device__ __forceinline__ explicit OnlineSoftmax(float softmax_scale)
      : scale(softmax_scale), scale_log2(softmax_scale * 1.4426950408889634f) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mi][h] = -INFINITY;
        row_sum[mi][h] = 0.0f;
      }
  }

  /// One tile: turns the scores S (C fragments, [16·kMTiles, 8·kNTilesS] of this warp)
  /// into P = e^{scale·(S − m_new)} in place, updates m and l, and rescales the output
  /// accumulators O ([16·kMTiles, 8·kNTilesO]) by e^{scale·(m_old − m_new)}.
  template <int kNTilesS, int kNTilesO>
  __device__ __forceinline__ void update(float (&S)[kMTiles][kNTilesS][4], float (&O)[kMTiles][kNTilesO][4]) {
    float alpha[kMTiles][2];     // e^{scale·(m_old − m_new)} of each of this thread's rows
    float m_scaled[kMTiles][2];  // m_new·c, the subtrahend of every exponent of the row
    const float c = scale_log2;  // e^{scale·x} = 2^{c·x}
    //! [online softmax update]
    // LAB BEGIN: online softmax update — hint: per row: m_new = quad_max of the row and m_old; alpha = e^{scale·(m_old − m_new)}; l *= alpha; O *= alpha; then P = e^{scale·(S − m_new)} in place and l += Σ P
    // 1. The new maxima, and the factors that move the old sums onto them.
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // m_new = max(m_old, rowmax(S_ij)): this lane's columns of the row, then the group.
        const float m_old = row_max[mi][h];
        const float m_new = quad_max(fmaxf(m_old, row_reduce(S[mi], h, Max{})));
        row_max[mi][h] = m_new;
        m_scaled[mi][h] = m_new == -INFINITY ? 0.0f : m_new * c;  // 0 while the row has seen no key
        alpha[mi][h] = fast_exp2(m_old * c - m_scaled[mi][h]);
        row_sum[mi][h] *= alpha[mi][h];  // l ← alpha·l
      }
    // 2. O ← alpha·O, before the exponentials: the multiplies (FMA pipe) then overlap with
    //    the ex2 instructions (special-function unit) instead of delaying P V.
    rescale(O, alpha);
    // 3. P = e^{scale·(S − m_new)} in place, and l += rowsum(P) (this lane's columns only;
    //    the group's four partial sums are added once, after the last tile).
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& s = S[mi][nt][2 * h + e];
            s = fast_exp2(fmaf(s, c, -m_scaled[mi][h]));  // one FFMA, s·c − m·c, and ex2
          }
        row_sum[mi][h] += row_reduce(S[mi], h, Plus{});
      }
    // LAB END
    //! [online softmax update]
  }

  /// O ← alpha·O, row by row. With kLazyRescale the warp first votes on whether any of
  /// its rows' maxima moved (some alpha ≠ 1) and skips the multiplies when none did: once
  /// the maxima settle, most tiles leave every alpha at exactly 1. The vote is
  /// warp-uniform (the branch never splits the warp) and the result is bitwise the same
  /// either way (x·1 = x); only the time depends on the data. It pays off only where
  /// registers are too scarce for the compiler to hide the multiplies among the MMAs
  /// (the notes, "Lazy rescaling").
  template <int kNTilesO>
  __device__ __forceinline__ void rescale(float (&O)[kMTiles][kNTilesO][4], const float (&alpha)[kMTiles][2]) {
    if constexpr (kLazyRescale) {
      bool moved = false;
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) moved = moved || alpha[mi][0] != 1.0f || alpha[mi][1] != 1.0f;
      if (!__any_sync(0xffffffffu, moved)) return;
    }
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int dt = 0; dt < kNTilesO; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[mi][dt][e] *= alpha[mi][e / 2];  // e = 0, 1: row g; 2, 3: row g + 8
  }

  /// After the last tile: O ← O / l and L = scale·m + ln l for this thread's rows
  /// (`lse[mi][h]`). A row that saw no key (l = 0) gets O = 0 and L = −inf; a row that
  /// met a NaN keeps it (l = NaN).
  template <int kNTilesO>
  __device__ __forceinline__ void finalize(float (&O)[kMTiles][kNTilesO][4], float (&lse)[kMTiles][2]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(row_sum[mi][h]);
        const float inv_l = l == 0.0f ? 0.0f : 1.0f / l;
        lse[mi][h] = l == 0.0f ? -INFINITY : row_max[mi][h] * scale + logf(l);
#pragma unroll
        for (int dt = 0; dt < kNTilesO; ++dt) {
          O[mi][dt][2 * h] *= inv_l;
          O[mi][dt][2 * h + 1] *= inv_l;
        }
      }
    }
  }
};

}  // namespace fa::stage08
