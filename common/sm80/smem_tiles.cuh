// Stage 08: moving tiles between global and shared memory.
//
//  - cp.async (common/cp_async.cuh): a 16-byte copy global → shared that does not pass
//    through registers and does not block the thread. Copies are grouped (commit_group)
//    and waited for by group (wait_group N: "all but the N most recent groups have
//    landed"), which is what lets tile j+1 travel while tile j is being computed on.
//  - Tails: a chunk whose row lies past the end of the tensor is copied with source size
//    0: it reads nothing and writes 16 zero bytes. The caller never pads; zero rows of K
//    give scores that the mask removes, zero rows of V add 0·0 to O.
//  - Layout: every address goes through smem_offset (tile_index.h), the single function
//    that writers (cp.async) and readers (ldmatrix) share, swizzled or padded.
//
// Reusable as is: stage 09 loads its Q, dO, K, V tiles with the same functions.
#pragma once

#include <cstdint>

#include "sm80/cp_async.cuh"  // cp_async_16, cp_async_commit, cp_async_wait
#include "sm80/mma.cuh"
#include "sm80/tile_index.h"

namespace fa::stage08 {

/// Shared-memory byte address of (row, chunk) in a tile starting at `tile` (a u32 address).
template <int kHeadDim, SmemLayout kLayout>
__device__ __forceinline__ uint32_t tile_address(uint32_t tile, int row, int chunk) {
  return tile + 2u * uint32_t(smem_offset(row, chunk, kHeadDim, kLayout));
}

/// The lane-dependent part of this lane's ldmatrix addresses while it walks a
/// [rows, kHeadDim] tile in 16×16 blocks (tile_index.h, ldsm_lane_offset): V registers,
/// computed once; each access is then a register plus a compile-time constant.
template <int kHeadDim, SmemLayout kLayout>
struct LdsmLane {
  static constexpr int kVariants = ldsm_variants(kHeadDim, kLayout);
  uint32_t offset[kVariants];  // bytes

  /// `lane_row` < 16 and `lane_chunk` < 2 from mma.cuh's pattern X or Y.
  __device__ __forceinline__ LdsmLane(int lane_row, int lane_chunk) {
#pragma unroll
    for (int v = 0; v < kVariants; ++v) offset[v] = 2u * ldsm_lane_offset(lane_row, lane_chunk, v, kHeadDim, kLayout);
  }

  /// Byte address of this lane's row of block (br, bc) in the tile starting at `tile`.
  /// br and bc should be compile-time constants (unrolled loops).
  __device__ __forceinline__ uint32_t operator()(uint32_t tile, int br, int bc) const {
    return tile + offset[bc % kVariants] + 2u * ldsm_block_offset(br, bc, kHeadDim, kLayout);
  }
};

/// Issue the cp.async copies of one [kRows, kHeadDim] tile: rows [0, rows_valid) from
/// `src` (row-major, row stride kHeadDim elements), zeros for rows past rows_valid
/// (rows_valid ≥ 1). All kThreads threads of the block call it; thread `tid` copies
/// chunks tid, tid + kThreads, ... so that consecutive threads read consecutive 16-byte
/// chunks of a row (coalesced) and write 8 distinct slots of a line (no bank conflict).
template <int kRows, int kHeadDim, SmemLayout kLayout, int kThreads, class Elem>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const Elem* src, int rows_valid, int tid) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "each thread copies the same number of chunks");
  if constexpr (kThreads % kChunksPerRow == 0) {
    // One pass of the block copies kRowsPerPass whole rows; thread tid always copies
    // chunk tid % kChunksPerRow, of rows tid / kChunksPerRow + it·kRowsPerPass.
    constexpr int kRowsPerPass = kThreads / kChunksPerRow;
    const int row = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
    const Elem* from = src + int64_t(row) * kHeadDim + chunk * 8;
    // When a pass spans whole swizzle periods (8 rows), every pass has the same swizzle,
    // so the destination is one register plus a constant per pass.
    constexpr bool kSamePattern = kLayout != SmemLayout::Swizzled || kRowsPerPass % 8 == 0;
    const uint32_t to = tile_address<kHeadDim, kLayout>(tile, row, chunk);
#pragma unroll
    for (int it = 0; it < kChunks / kThreads; ++it) {
      const uint32_t dst = kSamePattern ? to + 2u * it * kRowsPerPass * smem_row_stride(kHeadDim, kLayout)
                                        : tile_address<kHeadDim, kLayout>(tile, row + it * kRowsPerPass, chunk);
      // A row past the end reads nothing and is zero-filled; the tile's first row stands
      // in for its address, so no address outside the tensor is ever formed.
      const bool valid = row + it * kRowsPerPass < rows_valid;
      cp_async_16(dst, valid ? from + it * kRowsPerPass * kHeadDim : src, valid ? 16 : 0);
    }
  } else {  // rows of a chunk count that does not divide the block (d = 96): general form
#pragma unroll
    for (int it = 0; it < kChunks / kThreads; ++it) {
      const int c = tid + it * kThreads;
      const int row = c / kChunksPerRow, chunk = c % kChunksPerRow;
      const bool valid = row < rows_valid;
      cp_async_16(tile_address<kHeadDim, kLayout>(tile, row, chunk),
                  valid ? src + int64_t(row) * kHeadDim + chunk * 8 : src, valid ? 16 : 0);
    }
  }
}

/// Copy rows [0, rows_valid) of a [kRows, kHeadDim] shared tile to global `dst` (row
/// stride kHeadDim), 16 bytes per access. Called by `kThreads` threads with `index` in
/// [0, kThreads) — a whole block, or one warp copying its own rows.
template <int kRows, int kHeadDim, SmemLayout kLayout, int kThreads, class Elem>
__device__ __forceinline__ void store_tile(Elem* dst, const Elem* tile, int rows_valid, int index) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "each thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int c = index + it * kThreads;
    const int row = c / kChunksPerRow, chunk = c % kChunksPerRow;
    if (row < rows_valid) {
      const uint4 v = *reinterpret_cast<const uint4*>(tile + smem_offset(row, chunk, kHeadDim, kLayout));
      *reinterpret_cast<uint4*>(dst + int64_t(row) * kHeadDim + chunk * 8) = v;
    }
  }
}

}  // namespace fa::stage08
