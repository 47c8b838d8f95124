/// \file bwd_steps.h
/// \brief How a step file hands its kernels to the launcher (bwd_launch.cu): the dK/dV
/// kernel of the step, the dQ kernel where the step has one, and the tile facts the launch
/// and the report need. Plain C++ (the launcher and the tests include it).
#pragma once

#include "problem.h"
#include "step_kernel.h"

namespace fa::stage09 {

/// The kernels of one step for one (head dim, dtype), each a StepKernel (step_kernel.h).
struct StepKernels {
  /// One block per (batch, kv head, key tile of block_cols keys = B_c), block_rows = B_r
  /// query rows per step of its loop.
  StepKernel dkdv;
  int warps_keys = 0;     ///< the dK/dV warp grid: warps along the keys ...
  int warps_split = 0;    ///< ... × warps along the queries of Sᵀ and the columns of dK, dV
  int warps_mdq = 0;      ///< the warp grid of the dQ product (atomic steps): along B_r ...
  int warps_ndq = 0;      ///< ... × along d
  bool atomic_dq = false; ///< dQ by fp32 atomics into a scratch sum, then converted (09b, 09c)
  /// 09a: the dQ kernel, one block per (batch, head, query tile of block_rows = B_r rows),
  /// block_cols = B_c keys per step.
  StepKernel dq;
};

// One per step file; each throws std::invalid_argument for a head dim or dtype it has no
// kernel for (the launcher checks both first).
StepKernels step_09a(int d, Dtype dtype);  // 09a_dq_pass.cu
StepKernels step_09b(int d, Dtype dtype);  // 09b_dq_atomics.cu
StepKernels step_09c(int d, Dtype dtype);  // tensor_core_bwd.cu (the final design at d = 128)

}  // namespace fa::stage09
