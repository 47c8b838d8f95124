/// \file dq_layout.h
/// \brief Where dQ_accum keeps element (row, column) of a head: row-major for steps 11a–11c
/// (each thread adds its own values with atomics), in [64, 64] blocks for step 11d and stage
/// 13's backward (the copy engine adds a whole block with one bulk reduction, which needs it
/// contiguous). Plain integer math shared by the kernels (device and host).
///
/// Inside a block, row r keeps its 8 groups of 8 columns in the order g ^ (r % 8): a warp's
/// stores of a fragment (8 rows, the same 8 columns each) then fall in 8 different 32-byte
/// groups, two wavefronts for 256 bytes (a wavefront is one pass through the 32 banks of
/// 4 bytes, 128 bytes at most, so two is the minimum), as for a padded row, without leaving
/// gaps that a bulk copy would have to skip.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA11_LAYOUT_FN __host__ __device__ __forceinline__
#else
#define FA11_LAYOUT_FN inline
#endif

namespace fa::stage11 {

/// Offset of (row, column) inside a [64, 64] block.
FA11_LAYOUT_FN int offset_in_block(int row, int col) { return row * 64 + ((((col / 8) ^ (row % 8)) * 8) | (col % 8)); }

/// Offset of (row, column) of one head's dQ_accum in the blocked layout of step 11d: the
/// blocks of a 64-row tile lie side by side, column block after column block.
FA11_LAYOUT_FN int64_t blocked_offset(int64_t row, int col, int d) {
  return ((row / 64) * (d / 64) + col / 64) * 4096 + offset_in_block(int(row % 64), col % 64);
}

}  // namespace fa::stage11
