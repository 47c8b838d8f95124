/// \file ds_tile.cuh
/// \brief Stage 11's dSᵀ tile in shared memory, which stage 13's backward shares: a consumer
/// warpgroup's dSᵀ fragments stored into it (store_ds), and the dQ product that reads it
/// transposed (gemm_dq). The fragment layout is wgmma.cuh's: a warpgroup's accumulator of
/// dSᵀ is [64 keys, B_r queries], element 4j + 2r + e at key fragment_row(r), query
/// fragment_col(j, e).
#pragma once

#include <cstdint>

#include "hopper/ptx.cuh"
#include "hopper/tile_math.cuh"
#include "hopper/wgmma.cuh"

namespace fa::stage11 {

using namespace fa::hopper;
using stage10::fragment_col;
using stage10::fragment_row;
using stage10::pack2;

/// A warpgroup's dSᵀ [64 keys, B_r queries] (fp32 fragments) → the block's dSᵀ tile in
/// shared memory, rounded to Elem: [column blocks of 64 queries][B_c keys][64 queries],
/// 128-byte swizzled, rows key_row0 … key_row0 + 63 (a multiple of 8), columns col0 …
/// col0 + B_r − 1 (col0 a multiple of 8). One stmatrix.x4 stores 16 columns of the warp's 16
/// rows: the four 8×8 pieces (j, r) = (j0, 0), (j0, 1), (j0 + 1, 0), (j0 + 1, 1), whose rows
/// are 16 bytes in one chunk of the swizzle; the 8 rows of a piece land in 8 different chunks
/// of their lines, so no bank conflict. The dQ product reads this tile MN-major.
template <int B_c, int B_r, class Elem>
__device__ inline void store_ds(const float (&ds)[B_r / 2], Elem* tile, int key_row0, int col0 = 0) {
  static_assert(B_r % 16 == 0, "stmatrix.x4 stores 16 columns at a time");
  auto* bytes = reinterpret_cast<unsigned char*>(tile);
  const int lane = threadIdx.x % 32, piece = lane / 8;  // this lane addresses a row of piece `piece`
  const int row = key_row0 + 16 * ((threadIdx.x % 128) / 32) + 8 * (piece % 2) + lane % 8;
#pragma unroll
  for (int j0 = 0; j0 < B_r / 8; j0 += 2) {
    const int col = col0 + 8 * (j0 + piece / 2);
    const uint32_t offset = (col / 64) * column_block_bytes(B_c) + row * 128 + ((((col % 64) / 8) ^ (row % 8)) * 16);
    stmatrix_x4(bytes + offset, pack2<Elem>(ds[4 * j0], ds[4 * j0 + 1]), pack2<Elem>(ds[4 * j0 + 2], ds[4 * j0 + 3]),
                pack2<Elem>(ds[4 * j0 + 4], ds[4 * j0 + 5]), pack2<Elem>(ds[4 * j0 + 6], ds[4 * j0 + 7]));
  }
}

/// dQ block [64 queries, N columns] = dS · K_j over the tile's B_c keys: A = dS, read as
/// the transpose of column block `m_block` of the dSᵀ tile; B = columns 64·n_block … of
/// K_j, whose rows are the keys (the reduction) and whose columns are contiguous: both
/// operands MN-major, so the instruction transposes both (wgmma_ss_tt).
//! [gemm dq]
template <int B_c, int N, class Elem>
__device__ inline void gemm_dq(float (&acc)[N / 2], const Elem* ds_t, int m_block, const Elem* k, int n_block) {
  const auto* a_bytes = reinterpret_cast<const unsigned char*>(ds_t) + m_block * column_block_bytes(B_c);
  const auto* b_bytes = reinterpret_cast<const unsigned char*>(k) + n_block * column_block_bytes(B_c);
#pragma unroll
  for (int kk = 0; kk < B_c / 16; ++kk) {  // 16 keys per instruction: 16 rows of 128 bytes
    const uint64_t da = smem_descriptor(a_bytes + kk * 16 * 128, column_block_bytes(B_c), 1024);
    const uint64_t db = smem_descriptor(b_bytes + kk * 16 * 128, column_block_bytes(B_c), 1024);
    wgmma_ss_tt(WgmmaShape<N>{}, Elem{}, acc, da, db, kk > 0);
  }
}
//! [gemm dq]

}  // namespace fa::stage11
