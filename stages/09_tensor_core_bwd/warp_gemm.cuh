// Stage 09: the three shapes of warp-level matrix product the backward is made of.
//
// The forward (stage 08) has two products per tile, S = Q Kᵀ and O += P V. The backward
// has five, and they come in three operand arrangements (four with step 09c's warp
// grid). Each function below is one arrangement, written once and used wherever it
// occurs:
//
//   gemm_abt    C += A·Bᵀ    A [m][k] and B [n][k], both row-major in shared memory
//                            (ldmatrix; A pattern X, B pattern Y — mma.cuh).
//                            Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ (dK/dV kernel);
//                            S = Q_i K_jᵀ, dP = dO_i V_jᵀ (dQ kernel).
//   gemm_acc_b  C += A·B     A is the fp32 accumulator block of an earlier product
//                            (P or dS), rounded to 16 bits in registers; B [k][n]
//                            row-major in shared memory (ldmatrix.trans, pattern X).
//                            dV += Pᵀ dO_i, dK += dSᵀ Q_i (dK/dV kernel); dQ += dS K_j.
//   gemm_atb    C += Aᵀ·B    A stored transposed, [k][m], and B [k][n], both in shared
//                            memory, both through ldmatrix.trans (A pattern Y, B pattern X).
//                            dQ_i = dS K_j from the dSᵀ tile the dK/dV kernel wrote.
//   gemm_ab     C += A·B     A [m][k] and B [k][n], both in shared memory (A: ldmatrix,
//                            pattern X; B: ldmatrix.trans, pattern X). Step 09c only:
//                            dV += Pᵀ dO_i, dK += dSᵀ Q_i from the Pᵀ and dSᵀ tiles.
//
// All four take C as C fragments acc[kM][kN][4]: a [16·kM, 8·kN] block of the warp,
// fp32, thread (g, t) holding rows g, 8+g and columns 2t, 2t+1 of each m16n8 piece.
// kK counts k16 steps. A tile in shared memory is [rows][kLd] 16-bit elements laid out by
// stage 08's smem_offset (swizzled, padded or plain), so one function serves every tile
// shape: K_j, V_j, Q_i, dO_i ([rows][d]) and dSᵀ ([B_c][B_r]).
//
// Stage 08's mma.cuh covers the fragment layouts and the transposed loads already; what
// is new here is only the arrangement. These helpers could move to stage 08's headers.
#pragma once

#include <cstdint>

#include "sm80/mma.cuh"
#include "sm80/smem_tiles.cuh"
#include "sm80/tile_index.h"

namespace fa::stage09 {

using stage08::LdsmLane;
using stage08::SmemLayout;

/// The MMAs of one 16-column block np of B, as ldmatrix_x4 (or its .trans) returns it —
/// {b0, b1} of n8 tile 2np, {b0, b1} of n8 tile 2np+1 — with every A fragment of the step.
template <class Elem, int kM, int kN>
__device__ __forceinline__ void mma_b_block(float (&acc)[kM][kN][4], const uint32_t (&a)[kM][4], const uint32_t (&b)[4],
                                            int np) {
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
    stage08::mma_m16n8k16<Elem>(acc[mi][2 * np], a[mi], b[0], b[1]);
    stage08::mma_m16n8k16<Elem>(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
  }
}

/// For a [k][n] tile at `sB` read by ldmatrix .trans (pattern X) from a run-time first
/// column `col0` (a multiple of 16): this lane's address of each of kBlocks 16-column
/// blocks in k rows 0..15. The rows below are 16 rows' worth of bytes further per k16 step,
/// exact for every layout (the swizzle depends on row mod 8 only).
template <int kLd, SmemLayout kLayout, int kBlocks>
__device__ __forceinline__ void column_block_addresses(uint32_t (&addr)[kBlocks], uint32_t sB, int col0, int lane) {
#pragma unroll
  for (int np = 0; np < kBlocks; ++np)
    addr[np] = stage08::tile_address<kLd, kLayout>(sB, stage08::ldsm_row_x(lane),
                                                   col0 / 8 + 2 * np + stage08::ldsm_chunk_x(lane));
}

/// acc += A·Bᵀ. `sA` is the shared address of A's first row (16·kM rows used), `sB` of
/// B's first row (8·kN rows used); both walk columns [0, 16·kK). The first row of each
/// must be a multiple of 8 rows into its tile, so that the swizzle phase is unchanged.
template <class Elem, int kM, int kN, int kK, int kLdA, int kLdB, SmemLayout kLayout>
__device__ __forceinline__ void gemm_abt(float (&acc)[kM][kN][4], uint32_t sA, uint32_t sB, int lane) {
  static_assert(kN % 2 == 0, "B is loaded 16 rows (two n8 tiles) at a time");
  const LdsmLane<kLdA, kLayout> a_lane(stage08::ldsm_row_x(lane), stage08::ldsm_chunk_x(lane));
  const LdsmLane<kLdB, kLayout> b_lane(stage08::ldsm_row_y(lane), stage08::ldsm_chunk_y(lane));
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    uint32_t a[kM][4];  // A rows 16mi.., columns 16kk..16kk+15
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) stage08::ldmatrix_x4(a[mi], a_lane(sA, mi, kk));
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t b[4];  // {b0, b1} of B rows 16np..16np+7, {b0, b1} of rows 16np+8..16np+15
      stage08::ldmatrix_x4(b, b_lane(sB, np, kk));
      mma_b_block<Elem>(acc, a, b, np);
    }
  }
}

/// acc += A·B, where A [16·kM, 16·kK] is held as fp32 C fragments `a` (two n8 tiles per
/// k16 step) and rounded to Elem on the way in — the FlashAttention-2 register trick of
/// mma.cuh, so P and dS never touch shared memory here. B is rows [0, 16·kK), columns
/// [0, 8·kN) of a tile whose first row is `sB`.
template <class Elem, int kM, int kN, int kK, int kLdB, SmemLayout kLayout>
__device__ __forceinline__ void gemm_acc_b(float (&acc)[kM][kN][4], const float (&a)[kM][2 * kK][4], uint32_t sB,
                                           int lane) {
  static_assert(kN % 2 == 0, "B is loaded 16 columns (two n8 tiles) at a time");
  const LdsmLane<kLdB, kLayout> b_lane(stage08::ldsm_row_x(lane), stage08::ldsm_chunk_x(lane));
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    uint32_t a_frag[kM][4];  // A columns 16kk..16kk+15 = accumulator tiles 2kk and 2kk+1
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
      stage08::accumulators_to_a_fragment<Elem>(a_frag[mi], a[mi][2 * kk], a[mi][2 * kk + 1]);
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t b[4];  // {b0, b1} of B columns 16np..16np+7, {b0, b1} of 16np+8..16np+15
      stage08::ldmatrix_x4_trans(b, b_lane(sB, kk, np));
      mma_b_block<Elem>(acc, a_frag, b, np);
    }
  }
}

/// acc += Aᵀ·B over k rows [0, 16·kK) of two tiles: A stored [k][m] (the warp's m
/// columns start at column `a_col0`), B stored [k][n] (its n columns start at `b_col0`);
/// both column offsets are multiples of 16.
///
/// Here the warp's block of columns starts at a run-time offset, so LdsmLane (which wants
/// compile-time block columns) does not apply; instead each lane computes its address in
/// the first k16 row block once per operand block, and walks down the rows by adding
/// 16 rows' worth of bytes. That is exact for every layout: the swizzle depends on
/// row mod 8 only, which a step of 16 rows leaves unchanged.
template <class Elem, int kM, int kN, int kK, int kLdA, int kLdB, SmemLayout kLayout>
__device__ __forceinline__ void gemm_atb(float (&acc)[kM][kN][4], uint32_t sA, int a_col0, uint32_t sB, int b_col0,
                                         int lane) {
  static_assert(kN % 2 == 0, "B is loaded 16 columns (two n8 tiles) at a time");
  constexpr uint32_t kARowBlockBytes = 2u * 16u * uint32_t(stage08::smem_row_stride(kLdA, kLayout));
  constexpr uint32_t kBRowBlockBytes = 2u * 16u * uint32_t(stage08::smem_row_stride(kLdB, kLayout));
  uint32_t a_addr[kM], b_addr[kN / 2];  // this lane's row of each 16×16 block in k rows 0..15
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
    a_addr[mi] = stage08::tile_address<kLdA, kLayout>(
        sA, stage08::ldsm_row_y(lane), a_col0 / 8 + 2 * mi + stage08::ldsm_chunk_y(lane));
  column_block_addresses<kLdB, kLayout>(b_addr, sB, b_col0, lane);
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    uint32_t a[kM][4];  // Aᵀ rows (m) 16mi.., columns (k) 16kk..: the transposed load of A's [k][m] block
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) stage08::ldmatrix_x4_trans(a[mi], a_addr[mi] + kk * kARowBlockBytes);
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t b[4];
      stage08::ldmatrix_x4_trans(b, b_addr[np] + kk * kBRowBlockBytes);
      mma_b_block<Elem>(acc, a, b, np);
    }
  }
}

/// acc += A·B over k columns [0, 16·kK) of A: A stored [m][k] (`sA` is the shared address
/// of the warp's first row, a multiple of 8 rows into its tile; 16·kM rows used), B stored
/// [k][n] (rows [0, 16·kK) of the tile at `sB`; the warp's 8·kN columns start at `b_col0`,
/// a multiple of 16).
///
/// A is walked as in gemm_abt (block columns known at compile time: LdsmLane); B as in
/// gemm_atb (a run-time first column: one address per 16-column block, computed once, then
/// 16 rows' worth of bytes per k16 step).
template <class Elem, int kM, int kN, int kK, int kLdA, int kLdB, SmemLayout kLayout>
__device__ __forceinline__ void gemm_ab(float (&acc)[kM][kN][4], uint32_t sA, uint32_t sB, int b_col0, int lane) {
  static_assert(kN % 2 == 0, "B is loaded 16 columns (two n8 tiles) at a time");
  constexpr uint32_t kBRowBlockBytes = 2u * 16u * uint32_t(stage08::smem_row_stride(kLdB, kLayout));
  const LdsmLane<kLdA, kLayout> a_lane(stage08::ldsm_row_x(lane), stage08::ldsm_chunk_x(lane));
  uint32_t b_addr[kN / 2];  // this lane's row of each 16×16 block of B in k rows 0..15
  column_block_addresses<kLdB, kLayout>(b_addr, sB, b_col0, lane);
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    uint32_t a[kM][4];  // A rows 16mi.., columns 16kk..16kk+15
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) stage08::ldmatrix_x4(a[mi], a_lane(sA, mi, kk));
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t b[4];  // {b0, b1} of B columns 16np..16np+7, {b0, b1} of 16np+8..16np+15
      stage08::ldmatrix_x4_trans(b, b_addr[np] + kk * kBRowBlockBytes);
      mma_b_block<Elem>(acc, a, b, np);
    }
  }
}

/// The way back: `scale`·acc, a warp's C fragments [16·kM, 8·kN], rounded to Elem into rows
/// row0.., columns col0.. (a multiple of 8) of a shared tile [rows][kLd]. Thread (g, t)
/// holds rows g, 8+g and columns 2t, 2t+1 of each m16n8 piece: one 32-bit store per pair,
/// in chunk col0/8 + nt, at element 2t. The 8 rows of a store lie in 8 different slots of
/// the swizzled layout, so the 32 lanes hit 32 different banks.
template <class Elem, int kLd, SmemLayout kLayout, int kM, int kN>
__device__ __forceinline__ void store_c_fragments(Elem* tile, const float (&acc)[kM][kN][4], int row0, int col0,
                                                  int lane, float scale = 1.0f) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 16 * mi + g + 8 * h;
        *reinterpret_cast<uint32_t*>(tile + stage08::smem_offset(row, col0 / 8 + nt, kLd, kLayout) + 2 * t) =
            stage08::pack_pair<Elem>(scale * acc[mi][nt][2 * h], scale * acc[mi][nt][2 * h + 1]);
      }
}

/// Sets a block of C fragments to zero.
template <int kM, int kN>
__device__ __forceinline__ void zero(float (&acc)[kM][kN][4]) {
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int ni = 0; ni < kN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
}

}  // namespace fa::stage09
