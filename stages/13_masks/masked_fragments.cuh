// Stage 13 on Hopper, the consumer's side of one tile, on wgmma accumulator fragments
// (common/hopper/tile_math.cuh gives a thread's view: its two rows fragment_row(0, 1) and its
// columns fragment_col(j, e)): the score modifiers, the element mask of a partial tile, and
// the epilogue with the sink in the normaliser.
#pragma once

#include <cmath>

#include "document_mask.h"
#include "hopper/tile_math.cuh"
#include "masked_params.h"

namespace fa::stage13 {

using stage10::fragment_col;
using stage10::fragment_row;

//! [score functors]
// The score modifiers as compile-time functors. NoScore leaves S as the product Q·Kᵀ and the
// softmax folds the scale into its exponent (stage 10's loop, untouched). ModifiedScore makes
// S the modified logit, s = f(scale·q·k), before the softmax:
//   soft-cap  s ← cap·tanh(s/cap)
//   ALiBi     s ← s + slope_h·(j − diag(i))       (a key k places behind the diagonal loses k·slope)
// and the softmax then works on s itself (its exponent scale is log2 e).
struct NoScore {
  static constexpr bool kIdentity = true;
  template <int B_c>
  __device__ void apply(float (&)[B_c / 2], int, int, const DocumentMask&) const {}
};

template <bool kSoftcap, bool kAlibi>
struct ModifiedScore {
  static constexpr bool kIdentity = false;
  float scale, cap, inv_cap, slope;  // slope: this head's (kAlibi)

  // `row0` and `key0`: the warpgroup's first row and the tile's first key, in the document.
  template <int B_c>
  __device__ void apply(float (&s)[B_c / 2], int row0, int key0, const DocumentMask& doc) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int distance0 = key0 - doc.diagonal(row0 + fragment_row(r));  // column 0: key − diagonal
#pragma unroll
      for (int j = 0; j < B_c / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * r + e];
          x *= scale;
          if constexpr (kSoftcap) x = cap * tanhf(x * inv_cap);
          if constexpr (kAlibi) x += slope * float(distance0 + fragment_col(j, e));
        }
    }
  }
};
//! [score functors]

//! [element mask]
/// S = −inf where the row does not see the key: keep(i, j) of the document mask, for the
/// warpgroup's rows from `row0` and the tile's keys from `key0` (document indices). Asked
/// only of partial tiles. Rows past the document's end see nothing (their output is never
/// stored).
template <int B_c>
__device__ inline void mask_partial_tile(float (&s)[B_c / 2], int row0, int key0, const DocumentMask& doc) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + fragment_row(r);
    int lo = doc.lo(i) - key0, hi = doc.hi(i) - key0;  // the row's keys, as columns of this tile
    if (i >= doc.n_q) hi = lo;
#pragma unroll
    for (int j = 0; j < B_c / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = fragment_col(j, e);
        if (col < lo || col >= hi) s[4 * j + 2 * r + e] = -INFINITY;
      }
  }
}
//! [element mask]

/// Where one warpgroup's 64 rows go: the first row's index in O's and L's rows of its
/// (batch, head), and how many of the rows belong to the document.
struct OutputRows {
  int64_t bh;     ///< batch · heads + head
  int first;      ///< packed row of the warpgroup's row 0
  int valid;      ///< rows [0, valid) are stored; the rest lie past the document's end
};

//! [sink epilogue]
/// The epilogue of one warpgroup (stage 10's, with the sink): with M = mscale·m the row's max
/// in natural-log units (mscale = scale when S is the raw product, 1 when it is the modified
/// logit) and σ the head's sink logit (−inf: no sink),
///   M' = max(M, σ);  l' = e^{M − M'}·l + e^{σ − M'};  O = e^{M − M'}·O_acc / l';  L = M' + ln l'
/// A row that saw no key has O = 0 and L = σ (−inf without a sink). O is rounded to Elem and
/// written through the warpgroup's rows of the Q tile (128-byte swizzle, as the TMA loaded
/// it) in 16-byte pieces; only the document's rows are stored.
template <int d, class Elem>
__device__ inline void write_output_with_sink(float (&o)[d / 2], stage10::RowState st, float mscale, float sink,
                                              Elem* q_tile, int tile_rows, int wg_row0, const MaskedParams& p,
                                              OutputRows out, int barrier_id) {
  float o_scale[2], L[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = st.l[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float M = l == 0.f ? -INFINITY : st.m[r] * mscale;
    const float M_new = fmaxf(M, sink);
    if (M_new == -INFINITY) {  // no key and no sink
      o_scale[r] = 0.f;
      L[r] = -INFINITY;
      continue;
    }
    const float keep = expf(M - M_new);  // 0 for a row that saw no key
    const float l_new = keep * l + expf(sink - M_new);
    o_scale[r] = keep / l_new;
    L[r] = M_new + logf(l_new);
  }
  auto* tile = reinterpret_cast<unsigned char*>(q_tile);
  auto chunk_at = [&](int row, int chunk) {  // byte offset of 16-byte chunk `chunk` of row `row`
    return (chunk / 8) * hopper::column_block_bytes(tile_rows) + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
  };
#pragma unroll
  for (int j = 0; j < d / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = wg_row0 + fragment_row(r), col = fragment_col(j, 0);
      *reinterpret_cast<uint32_t*>(tile + chunk_at(row, col / 8) + (col % 8) * 2) =
          stage10::pack2<Elem>(o[4 * j + 2 * r] * o_scale[r], o[4 * j + 2 * r + 1] * o_scale[r]);
    }
  hopper::named_barrier_sync(barrier_id, 128);  // the warpgroup's 64 rows are in shared memory
  auto* O = static_cast<unsigned char*>(p.O) + (out.bh * p.seq_q + out.first) * int64_t(d) * 2;
  for (int i = threadIdx.x % 128; i < stage10::kRowsPerWarpgroup * d / 8; i += 128) {
    const int row = i / (d / 8), chunk = i % (d / 8);
    if (row < out.valid)
      *reinterpret_cast<uint4*>(O + (int64_t(row) * d + chunk * 8) * 2) =
          *reinterpret_cast<const uint4*>(tile + chunk_at(wg_row0 + row, chunk));
  }
  if (threadIdx.x % 4 == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (fragment_row(r) < out.valid) p.L[out.bh * p.seq_q + out.first + fragment_row(r)] = L[r];
}
//! [sink epilogue]

}  // namespace fa::stage13
