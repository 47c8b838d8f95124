// Stage 07, from step 07b on: tiles copied with cp.async, so the next K and V tiles travel
// while this tile is computed.
//
// Why: TileCopy (block_tile.cuh, step 07a) reads a tile into registers and then writes it to
// shared memory, so between "fetch" and "store" the block waits the whole global-memory
// latency (hundreds of cycles for the first bytes, and a 32 KiB K + V tile at d = 128 to
// follow) with no work of its own. At d = 128 only three blocks fit on an SM (12 warps), too
// few for the other blocks to hide that wait on every tile. cp.async (sm_80 and later) copies
// global memory straight into shared memory without passing through registers and without
// making the thread wait: the thread issues the copies, computes, and waits only when it
// needs the data. Steps 07b and 07c use it to load K_{j+1} while they compute P_ij V_j, and
// V_{j+1} while they compute S_{i,j+1}: no extra shared memory, since each buffer is refilled
// as soon as the last warp has finished reading it.
//
// TUTORIAL: one cp_async_16(dst, src, n) (common/cp_async.cuh) is the plain copy
//     for (int e = 0; e < 4; ++e) dst[e] = e < n / 4 ? src[e] : 0.f;
// done in the background; cp_async_commit() closes a group of such copies and
// cp_async_wait<N>() returns once at most N of this thread's groups are still in flight.
#pragma once

#include <cstdint>

#include "block_tile.cuh"
#include "sm80/cp_async.cuh"

namespace fa::stage07 {
namespace {

// The same tile as Layout = TileCopy<ROWS, D, STRIDE, THREADS, SWIZZLED> (same thread →
// chunk assignment, same places in shared memory, same zeros for rows ≥ n_rows and columns
// ≥ d), issued as cp.async: rows [row0, row0 + ROWS) of a row-major [n_rows][d] matrix into
// a shared tile of ROWS × STRIDE floats. The copies land only after cp_async_wait and become
// visible to the other threads after __syncthreads().
template <typename Layout>
__device__ __forceinline__ void tile_copy_async(float* dst, const float* src, int64_t row0,
                                                int64_t n_rows, int d) {
  constexpr int ROWS = Layout::kRows, D = Layout::kD, STRIDE = Layout::kStride;
  const int col = 4 * (int(threadIdx.x) % Layout::kChunkCols);
  const int r = int(threadIdx.x) / Layout::kChunkCols;
  if (col >= D) return;  // only for D = 96: lanes past the last column
  const int rows = n_rows - row0 < ROWS ? int(n_rows - row0) : ROWS;  // rows that exist
#pragma unroll
  for (int n = 0; n < Layout::kPerThread; ++n) {
    const int row = r + n * Layout::kRowStep;
    const bool inside = col < d && row < rows;
    // A zero-byte copy reads nothing, but its address is still given: point it at `src`.
    const float* from = inside ? src + (row0 + row) * d + col : src;
    cp_async_16(dst + smem_offset<Layout::kSwizzled, STRIDE>(row, col), from, inside ? 16 : 0);
  }
}

}  // namespace
}  // namespace fa::stage07
