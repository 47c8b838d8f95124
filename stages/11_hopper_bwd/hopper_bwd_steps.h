/// \file step_kernel.h
/// \brief How a step file hands its kernel to the launcher: one row per (head dim, dtype,
/// causal) instance. Plain C++ (the launcher and the tests include it).
#pragma once

#include <cstddef>

#include "problem.h"

namespace fa::stage11 {

/// A compiled backward kernel of one step, launched as
/// fn<<<(ceil(seq_k / block_cols), kv_heads, batch), threads, smem_bytes>>>(BwdParams).
struct StepKernel {
  const void* fn = nullptr;
  int threads = 0;
  int block_cols = 0;  ///< B_c, keys per block
  int block_rows = 0;  ///< B_r, query rows per step
  size_t smem_bytes = 0;
};

// One per step file; each throws std::invalid_argument for a head dim or dtype it has no kernel for.
StepKernel step_11a(int d, Dtype dtype, bool causal);  // 11a_one_warpgroup.cu
StepKernel step_11b(int d, Dtype dtype, bool causal);  // 11b_warp_specialized.cu
StepKernel step_11c(int d, Dtype dtype, bool causal);  // 11c_overlap.cu
/// with_dq = false: the deterministic mode's dK/dV kernel, without the dQ product.
StepKernel step_11d(int d, Dtype dtype, bool causal, bool with_dq = true);  // hopper_bwd.cu (the final design)
/// The deterministic mode's dQ kernel: one block per (query tile of 64 rows, head).
StepKernel dq_pass(int d, Dtype dtype, bool causal);  // dq_pass.cu

}  // namespace fa::stage11
