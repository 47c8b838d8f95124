/// \file bwd_math.cuh
/// \brief The backward's tile math on wgmma fragments, shared by the steps: Pᵀ and dSᵀ
/// from Sᵀ and dPᵀ, the dQ reduction into global memory (11a–11c), and the dK/dV epilogue.
/// dSᵀ into shared memory and the dQ product that reads it are in hopper/ds_tile.cuh
/// (stage 13's backward shares them).
///
/// A consumer warpgroup owns 64 keys of the block's tile; its accumulators of Sᵀ and dPᵀ
/// are [64 keys, B_r queries] with the fragment layout of wgmma.cuh: this thread holds rows
/// (keys) 16w + g and 16w + g + 8 and columns (queries) 8j + 2t, 8j + 2t + 1, element
/// 4j + 2r + e. Per-query values (L2, D) are therefore *column* values here, read from
/// shared memory, while in the forward (rows = queries) they were per-row registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "bwd_traits.h"
#include "hopper/ds_tile.cuh"
#include "hopper/ptx.cuh"
#include "hopper/tile_math.cuh"
#include "hopper/wgmma.cuh"

namespace fa::stage11 {

using namespace fa::hopper;
using stage10::fast_exp2;
using stage10::fragment_col;
using stage10::fragment_row;
using stage10::pack2;
using stage10::tile_bytes;

/// In place: Sᵀ becomes Pᵀ = 2^{scale_log2·Sᵀ − L2} for one warpgroup's 64 keys (first
/// key `key0`) against B_r queries (first `query0`); l2 holds the tile's B_r values of L2
/// in shared memory. With kMask, Pᵀ = 0 where the key is past seq_k or (causal) after the
/// row's diagonal. A row that sees no key has L2 = +inf, so its P is 0 without a mask; a
/// NaN in S or L2 stays NaN.
template <int B_r, bool kMask, bool kCausal>
__device__ inline void probabilities(float (&s)[B_r / 2], const float* l2, int key0, int query0, const BwdParams& p) {
#pragma unroll
  for (int j = 0; j < B_r / 8; ++j) {
    const float2 l = *reinterpret_cast<const float2*>(l2 + fragment_col(j, 0));
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * r + e];
        x = fast_exp2(fmaf(x, p.scale_log2, -(e == 0 ? l.x : l.y)));
        if (kMask) {
          const int key = key0 + fragment_row(r), query = query0 + fragment_col(j, e);
          if (key >= p.seq_k || (kCausal && key > query + p.seq_k - p.seq_q)) x = 0.f;
        }
      }
  }
}

/// In place: dPᵀ becomes dSᵀ = Pᵀ∘(dPᵀ − D), D the tile's B_r values of rowsum(dO∘O) in
/// shared memory (a column value here). A NaN in P, dP or D stays NaN.
//! [dS on fragments]
template <int B_r>
__device__ inline void ds_from_dp(const float (&prob)[B_r / 2], float (&dp)[B_r / 2], const float* dd) {
#pragma unroll
  for (int j = 0; j < B_r / 8; ++j) {
    const float2 dv = *reinterpret_cast<const float2*>(dd + fragment_col(j, 0));
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * j + 2 * r + e;
        // LAB BEGIN: dS on fragments — hint: element i of this thread is (key row r, query column 8j + 2t + e); dS = P·(dP − D of that column)
        dp[i] = prob[i] * (dp[i] - (e == 0 ? dv.x : dv.y));
        // LAB END
      }
  }
}
//! [dS on fragments]

/// Both of the above, for the steps that wait for Sᵀ and dPᵀ together (11a, 11b).
template <int B_r, bool kMask, bool kCausal>
__device__ inline void probabilities_and_ds(float (&s)[B_r / 2], float (&dp)[B_r / 2], const float* l2,
                                            const float* dd, int key0, int query0, const BwdParams& p) {
  probabilities<B_r, kMask, kCausal>(s, l2, key0, query0, p);
  ds_from_dp<B_r>(s, dp, dd);
}

/// Adds a warpgroup's dQ block [64, N] to dQ_accum: `rows` points at element (0, 0) of the
/// block, `stride` floats from one row to the next. Blocks of other key tiles add to the
/// same elements at the same time, so the additions are atomic: red.global.add on two
/// floats at a time (no value returned, the warp does not wait).
//! [dq reduction]
template <int N>
__device__ inline void add_dq(const float (&acc)[N / 2], float* rows, int stride) {
  // LAB BEGIN: the dQ reduction — hint: for every j < N/8 and r: row = fragment_row(r), col = fragment_col(j, 0); red_add_f32x2 at rows + row·stride + col with elements 4j + 2r and 4j + 2r + 1
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      red_add_f32x2(rows + fragment_row(r) * stride + fragment_col(j, 0), acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
  // LAB END
}
//! [dq reduction]

/// Writes a warpgroup's [64, kCols] accumulator times `mul` as Elem into rows row0 … row0 +
/// 63, columns col0 … col0 + kCols − 1 of head `head` of out ([heads][rows][d]), skipping
/// rows ≥ rows (dK_j, dV_j; dQ_i in the deterministic pass). kCols < d where warpgroups
/// split the columns (d = 256).
template <int d, class Elem, int kCols = d>
__device__ inline void write_rows(const float (&acc)[kCols / 2], float mul, void* out, int64_t head, int row0, int rows,
                                  int col0 = 0) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int at = row0 + fragment_row(r);
    if (at >= rows) continue;
    auto* row = reinterpret_cast<uint32_t*>(static_cast<Elem*>(out) + (head * rows + at) * int64_t(d) + col0);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) row[fragment_col(j, 0) / 2] = pack2<Elem>(mul * acc[4 * j + 2 * r], mul * acc[4 * j + 2 * r + 1]);
  }
}

}  // namespace fa::stage11
