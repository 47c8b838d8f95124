/// \file key_rows.cuh
/// \brief The Hopper backwards' epilogue: a consumer warpgroup's [64 keys, d] block of dK or dV
/// staged through shared memory and stored in 16-byte pieces. Stage 13's backward uses it.
#pragma once

#include <cstdint>

#include "hopper/ptx.cuh"
#include "hopper/tile_math.cuh"

namespace fa::hopper {

using stage10::fragment_col;
using stage10::fragment_row;
using stage10::pack2;

//! [backward epilogue]
/// The epilogue of one consumer warpgroup, in two halves. stage_key_rows: its [64 keys, d]
/// accumulator times `mul`, rounded to Elem, into `tile` in shared memory ([d/64 column
/// blocks][64 rows][64 columns], 128-byte swizzle as the TMA loads use, so the fragments'
/// 4-byte stores spread over the banks). copy_key_rows, after the warpgroup's barrier: the
/// tile's rows to global memory in 16-byte pieces, consecutive threads along a row, so each
/// warp writes whole 32-byte sectors (stored straight from the fragments, a warp's 4-byte
/// stores filled each sector half). Only the document's keys are stored: rows [0, valid).
template <int d, class Elem>
__device__ inline void stage_key_rows(const float (&acc)[d / 2], float mul, unsigned char* tile) {
#pragma unroll
  for (int j = 0; j < d / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = fragment_row(r), col = fragment_col(j, 0), chunk = col / 8;
      const uint32_t at = (chunk / 8) * column_block_bytes(64) + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
      *reinterpret_cast<uint32_t*>(tile + at + (col % 8) * 2) =
          pack2<Elem>(mul * acc[4 * j + 2 * r], mul * acc[4 * j + 2 * r + 1]);
    }
}

template <int d>
__device__ inline void copy_key_rows(const unsigned char* tile, void* out, int64_t first_row, int valid) {
  auto* rows = static_cast<unsigned char*>(out) + first_row * int64_t(d) * 2;
  for (int i = threadIdx.x % 128; i < 64 * d / 8; i += 128) {
    const int row = i / (d / 8), chunk = i % (d / 8);
    if (row < valid)
      *reinterpret_cast<uint4*>(rows + (int64_t(row) * d + chunk * 8) * 2) = *reinterpret_cast<const uint4*>(
          tile + (chunk / 8) * column_block_bytes(64) + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
  }
}
//! [backward epilogue]

}  // namespace fa::hopper
