/// \file tile_math.cuh
/// \brief The softmax side of stage 10, on wgmma accumulator fragments: masking, the
/// online softmax, P as A fragments, and the epilogue (O through shared memory and 16-byte
/// stores, L from registers). One warpgroup owns 64 query rows; every function here runs in
/// all 128 of its threads.
///
/// A thread's view (wgmma.cuh): with w = warp in the warpgroup, g = lane / 4, t = lane % 4,
/// it holds rows 16w + g and 16w + g + 8 ("its two rows", r = 0, 1) and, of an N-column
/// accumulator, columns 8j + 2t and 8j + 2t + 1 for every j < N/8: element 4j + 2r + e.
/// A row is spread over the 4 threads of a quad (same g), so row reductions are two
/// shuffles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "hopper/ptx.cuh"
#include "hopper/traits.h"
#include "hopper/wgmma.cuh"

namespace fa::stage10 {

using namespace fa::hopper;

/// Running max m (raw scores) and partial row sum l of a thread's two rows. l is this
/// thread's share of the row's sum; the quad adds its four shares once, in the epilogue.
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
};

/// Row of the warpgroup's 64 that element (r) of this thread belongs to.
__device__ inline int fragment_row(int r) { return 16 * ((threadIdx.x % 128) / 32) + (threadIdx.x % 32) / 4 + 8 * r; }
/// Column of element (j, e) of this thread.
__device__ inline int fragment_col(int j, int e) { return 8 * j + 2 * (threadIdx.x % 4) + e; }

/// 2^x on the special-function unit (ex2.approx, flush-to-zero): e^{scale·s} is computed
/// as 2^{scale·log2(e)·s}, one FFMA and one MUFU per element.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// S = −inf where key `key0 + col` is not visible to query `query0 + row`: past the end of
/// the keys, or (causal) past the diagonal, row i seeing keys ≤ i + seq_k − seq_q.
template <int B_c, bool kCausal>
__device__ inline void mask_tile(float (&s)[B_c / 2], int query0, int key0, int seq_q, int seq_k) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int limit = seq_k - key0;  // columns ≥ limit are masked
    if (kCausal) limit = min(limit, query0 + fragment_row(r) + seq_k - seq_q + 1 - key0);
#pragma unroll
    for (int j = 0; j < B_c / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (fragment_col(j, e) >= limit) s[4 * j + 2 * r + e] = -INFINITY;
  }
}

/// The online softmax on one tile of scores, in place (S becomes P):
///   m' = max(m, rowmax S);  P = 2^{scale_log2·(S − m')};  α = 2^{scale_log2·(m − m')}
///   l ← α·l + rowsum P;  m ← m'
/// Returns α for both rows (O must be rescaled by it before P·V is added). A row that has
/// seen only masked keys keeps m = −inf; its exponent base is taken as 0 so P = 0, not NaN.
//! [softmax on fragments]
template <int B_c>
__device__ inline float2 softmax_tile(float (&s)[B_c / 2], RowState& st, float scale_log2) {
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // LAB BEGIN: online softmax on fragments — hint: row max over this thread's 2·(B_c/8) values and the quad (shuffle xor 1, 2); base = 0 if it is −inf; α = 2^{m·scale_log2 − base}; P = 2^{S·scale_log2 − base} in place; l ← α·l + Σ P
    float row_max = st.m[r];
#pragma unroll
    for (int j = 0; j < B_c / 8; ++j) row_max = fmaxf(row_max, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));  // the quad shares a row
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
    const float base = row_max == -INFINITY ? 0.f : row_max * scale_log2;
    alpha[r] = fast_exp2(st.m[r] * scale_log2 - base);
    st.m[r] = row_max;
    float row_sum = 0.f;
#pragma unroll
    for (int j = 0; j < B_c / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * r + e];
        x = fast_exp2(fmaf(x, scale_log2, -base));
        row_sum += x;
      }
    st.l[r] = st.l[r] * alpha[r] + row_sum;
    // LAB END
  }
  return make_float2(alpha[0], alpha[1]);
}
//! [softmax on fragments]

/// O ← α·O, row by row (α from softmax_tile).
template <int d>
__device__ inline void rescale_o(float (&o)[d / 2], float2 alpha) {
#pragma unroll
  for (int j = 0; j < d / 8; ++j) {
    o[4 * j + 0] *= alpha.x;
    o[4 * j + 1] *= alpha.x;
    o[4 * j + 2] *= alpha.y;
    o[4 * j + 3] *= alpha.y;
  }
}

/// Two fp32 values as one register of two 16-bit values (the first in the low half).
template <class Elem>
__device__ inline uint32_t pack2(float lo, float hi) {
  uint32_t out;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    out = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    out = *reinterpret_cast<uint32_t*>(&v);
  }
  return out;
}

/// P [64, B_c] (fp32 accumulator layout) → B_c/16 A fragments of wgmma: the k16 slice k is
/// accumulator columns 16k … 16k + 15, i.e. elements 8k … 8k + 7 of this thread, in the
/// order (row g, k 2t), (row g + 8, k 2t), (row g, k 2t + 8), (row g + 8, k 2t + 8).
template <int B_c, class Elem>
__device__ inline void pack_p(const float (&s)[B_c / 2], uint32_t (&p)[B_c / 16][4]) {
#pragma unroll
  for (int k = 0; k < B_c / 16; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) p[k][i] = pack2<Elem>(s[8 * k + 2 * i], s[8 * k + 2 * i + 1]);
}

/// Same compiler fence as fence_registers (wgmma.cuh) for A fragments that a running
/// wgmma still reads.
template <int kSlices>
__device__ inline void fence_fragments(uint32_t (&p)[kSlices][4]) {
#pragma unroll
  for (int k = 0; k < kSlices; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(p[k][i])::"memory");
}

/// The epilogue of one warpgroup: O ← O / l, rounded to Elem, written into the warpgroup's
/// own 64 rows of the Q tile in shared memory (its Q is no longer needed) in the 128-byte
/// swizzled layout (conflict-free: a warp's 8 rows of one column block hit 8 different
/// 16-byte chunks), then copied out in 16-byte pieces, a row's d/8 pieces by consecutive
/// threads (coalesced), rows outside [0, seq_q) skipped. L = scale·m + ln l comes straight from
/// registers. A row that saw no key has l = 0: O = 0, L = −inf. `q_tile` is the block's Q
/// tile ([d/64][tile_rows][64]), `wg_row0` this warpgroup's first row in it, `query0` its
/// first query index, `barrier_id` a named barrier for the warpgroup's 128 threads.
template <int d, class Elem>
__device__ inline void write_output(float (&o)[d / 2], RowState st, Elem* q_tile, int tile_rows, int wg_row0,
                                    const FwdParams& p, int query0, int bh, int barrier_id) {
  float inv_l[2], L[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = st.l[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv_l[r] = l == 0.f ? 0.f : 1.f / l;  // NaN stays NaN: a NaN input reaches O and L
    L[r] = l == 0.f ? -INFINITY : st.m[r] * p.scale + logf(l);
  }
  auto* tile = reinterpret_cast<unsigned char*>(q_tile);
  // Byte offset of the 16-byte chunk `chunk` (of d/8) of row `row` of the tile.
  auto chunk_at = [&](int row, int chunk) {
    return (chunk / 8) * column_block_bytes(tile_rows) + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
  };
#pragma unroll
  for (int j = 0; j < d / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = wg_row0 + fragment_row(r), col = fragment_col(j, 0);
      *reinterpret_cast<uint32_t*>(tile + chunk_at(row, col / 8) + (col % 8) * 2) =
          pack2<Elem>(o[4 * j + 2 * r] * inv_l[r], o[4 * j + 2 * r + 1] * inv_l[r]);
    }
  named_barrier_sync(barrier_id, 128);  // the warpgroup's 64 rows are in shared memory
  auto* O = static_cast<unsigned char*>(p.O) + (int64_t(bh) * p.seq_q + query0) * int64_t(d) * 2;
  for (int i = threadIdx.x % 128; i < kRowsPerWarpgroup * d / 8; i += 128) {
    const int row = i / (d / 8), chunk = i % (d / 8);
    if (query0 + row >= 0 && query0 + row < p.seq_q)
      *reinterpret_cast<uint4*>(O + (int64_t(row) * d + chunk * 8) * 2) =
          *reinterpret_cast<const uint4*>(tile + chunk_at(wg_row0 + row, chunk));
  }
  if (threadIdx.x % 4 == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = query0 + fragment_row(r);
      if (q >= 0 && q < p.seq_q) p.L[int64_t(bh) * p.seq_q + q] = L[r];
    }
}

}  // namespace fa::stage10
