/// \file step_kernel.h
/// \brief How a step file hands its kernel to the launcher: one table row per
/// (head dim, dtype, causal) instance. Plain C++ (the launcher and the tests include it).
#pragma once

#include <cstddef>

#include "problem.h"

namespace fa::stage10 {

/// A compiled kernel of one step: launched as fn<<<(ceil(seq_q / block_rows), heads, batch),
/// threads, smem_bytes>>>(FwdParams), or, when persistent, on min(SMs, tiles) blocks.
struct StepKernel {
  const void* fn = nullptr;
  int threads = 0;
  int block_rows = 0;  ///< query rows per block
  int block_cols = 0;  ///< B_c, keys per tile
  int stages = 0;      ///< K/V buffers
  size_t smem_bytes = 0;
  /// One block per SM looping over the query tiles (grid: min(SMs, tiles) blocks) instead
  /// of one block per query tile.
  bool persistent = false;
};

// One per step file; each throws std::invalid_argument for a head dim it has no kernel for.
StepKernel step_10a(int d, Dtype dtype, bool causal);  // 10a_tma_wgmma.cu
StepKernel step_10b(int d, Dtype dtype, bool causal);  // 10b_warp_specialized.cu
StepKernel step_10c(int d, Dtype dtype, bool causal);  // 10c_pingpong.cu
StepKernel step_10d(int d, Dtype dtype, bool causal);  // 10d_overlap.cu
StepKernel step_10e(int d, Dtype dtype, bool causal);  // hopper_fwd.cu (the final design)

}  // namespace fa::stage10
