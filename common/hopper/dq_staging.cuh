/// \file dq_staging.cuh
/// \brief Step 11d's dQ handover, which stage 13's backward shares: each consumer
/// warpgroup stages its [64, 64] fp32 block of dQ_i in shared memory (stage_dq), and one
/// writer thread adds the blocks to dQ_accum with bulk reductions, done by L2 on whole
/// lines (write_dq). The staging area holds one block per consumer, filled and drained once
/// per step, on three barriers (dq_full[0], dq_full[1], dq_empty):
///
///   dq_full[c]  consumer c's block is in shared memory (128 arrivals: its threads, each
///               after a fence.proxy.async, since the copy engine reads what they wrote)
///   dq_empty    the writer has read both blocks of the step (1 arrival)
///
/// `Shared` is the block's view of its shared memory: staging_block(c), dq_full[2],
/// dq_empty. dQ_accum is in the blocked layout of dq_layout.h, so a block is 16 KB in a row.
/// For d = 64 and 128 (two consumers, one block each); d = 256 has its own in hopper_bwd_256.cu.
#pragma once

#include <cstdint>

#include "hopper/dq_layout.h"
#include "hopper/ptx.cuh"
#include "hopper/tile_math.cuh"

namespace fa::stage11 {

/// Where one step's blocks are added: a head's dQ_accum (blocked layout) and the first row of
/// the step's query tile in it (a multiple of 64).
struct DqTile {
  float* head;
  int64_t row0;
};

/// The writer (one thread): every step's two dQ blocks from the staging area into dQ_accum,
/// at tile_of(n) for step n.
template <int d, class Shared, class TileOf>
__device__ inline void write_dq(const Shared& sm, int steps, TileOf tile_of) {
  for (int n = 0; n < steps; ++n) {
    const DqTile tile = tile_of(n);
    for (int c = 0; c < 2; ++c) {
      hopper::mbarrier_wait(&sm.dq_full[c], n & 1);
      // Consumer c's block: rows 64c … of dQ_i at d = 64, columns 64c … at d = 128.
      float* block =
          tile.head + (d == 64 ? blocked_offset(tile.row0 + 64 * c, 0, d) : blocked_offset(tile.row0, 64 * c, d));
      hopper::bulk_reduce_add_f32(block, sm.staging_block(c), 64 * 64 * 4);
    }
    hopper::bulk_commit();
    hopper::bulk_wait_read<0>();  // both blocks read: the consumers may refill the staging area
    hopper::mbarrier_arrive(sm.dq_empty);
  }
  hopper::bulk_wait<0>();  // every addition has reached global memory
}

/// A consumer's [64, 64] dQ block (fp32 fragments) → its staging buffer, in the block
/// layout of dq_layout.h.
template <class Shared>
__device__ inline void stage_dq(const float (&dq)[32], const Shared& sm, int c) {
  float* block = sm.staging_block(c);
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float2*>(block + offset_in_block(stage10::fragment_row(r), stage10::fragment_col(j, 0))) =
          make_float2(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
}

}  // namespace fa::stage11
