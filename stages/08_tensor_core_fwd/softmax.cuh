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
//    c = scale·log2(e). One FFMA per score, s·c − (m·c), with m·c computed once per row
//    ("exp2 folding"). The ablation kExp2 = false computes scale·s − scale·m and __expf
//    instead, as a first version would.
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

/// Running max and sum of this thread's rows: kMTiles m16 tiles × 2 rows (g, g+8).
/// `kExp2` selects the exponential (see above).
template <int kMTiles, bool kExp2>
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
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        //! [online softmax update]
        // LAB BEGIN: online softmax update — hint: m_new = quad_max of the row; alpha = e^{scale·(m_old − m_new)}; P = e^{scale·(S − m_new)} in place; l = alpha·l + Σ P; O *= alpha
        // m_new = max(m_old, rowmax(S_ij)): this lane's two columns per n8 tile, then the group.
        float m_new = row_max[mi][h];
#pragma unroll
        for (int nt = 0; nt < kNTilesS; ++nt)
          m_new = fmaxf(m_new, fmaxf(S[mi][nt][2 * h], S[mi][nt][2 * h + 1]));
        m_new = quad_max(m_new);
        const float m_old = row_max[mi][h];
        row_max[mi][h] = m_new;

        float alpha, row_tile_sum = 0.0f;
        if constexpr (kExp2) {
          // P = 2^{s·c − m_new·c}; the subtrahend is 0 while the row has seen no key.
          const float m_scaled = m_new == -INFINITY ? 0.0f : m_new * scale_log2;
          alpha = fast_exp2(m_old * scale_log2 - m_scaled);  // e^{scale·(m_old − m_new)}
#pragma unroll
          for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& s = S[mi][nt][2 * h + e];
              s = fast_exp2(fmaf(s, scale_log2, -m_scaled));
              row_tile_sum += s;
            }
        } else {
          // The unfolded version: scale the score, subtract the scaled max, natural exp.
          const float m_scaled = m_new == -INFINITY ? 0.0f : m_new * scale;
          alpha = __expf(m_old * scale - m_scaled);
#pragma unroll
          for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& s = S[mi][nt][2 * h + e];
              s = __expf(s * scale - m_scaled);
              row_tile_sum += s;
            }
        }
        // l ← alpha·l + rowsum(P_ij) (this lane's columns only; the group is summed at the end)
        row_sum[mi][h] = alpha * row_sum[mi][h] + row_tile_sum;
        // O ← alpha·O, before the kernel adds P_ij V_j
#pragma unroll
        for (int dt = 0; dt < kNTilesO; ++dt) {
          O[mi][dt][2 * h] *= alpha;
          O[mi][dt][2 * h + 1] *= alpha;
        }
        // LAB END
        //! [online softmax update]
      }
    }
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
