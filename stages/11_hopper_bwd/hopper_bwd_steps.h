/// \file hopper_bwd_steps.h
/// \brief Stage 11's step table: one function per step file, returning the kernel of one
/// (head dim, dtype, causal) instance in the common step contract (step_kernel.h). Plain
/// C++ (the launcher and the tests include it).
///
/// A backward kernel is launched as fn<<<(ceil(seq_k / block_cols), kv_heads, batch),
/// threads, smem_bytes>>>(BwdParams): block_cols is B_c (keys per block), block_rows B_r
/// (query rows per step of its loop).
#pragma once

#include "problem.h"
#include "step_kernel.h"

namespace fa::stage11 {

// One per step file; each throws std::invalid_argument for a head dim or dtype it has no kernel for.
StepKernel step_11a(int d, Dtype dtype, bool causal);  // 11a_one_warpgroup.cu
StepKernel step_11b(int d, Dtype dtype, bool causal);  // 11b_warp_specialized.cu
StepKernel step_11c(int d, Dtype dtype, bool causal);  // 11c_overlap.cu
/// with_dq = false: the deterministic mode's dK/dV kernel, without the dQ product.
StepKernel step_11d(int d, Dtype dtype, bool causal, bool with_dq = true);  // hopper_bwd.cu (the final design)
/// Step 11d at d = 256, the columns of dK, dV, dQ split between the consumers (step_11d calls it).
StepKernel step_11d_256(Dtype dtype, bool causal, bool with_dq);  // hopper_bwd_256.cu
/// The deterministic mode's dQ kernel: one block per (query tile of 64 rows, head); its
/// block_rows are the query rows of a block, block_cols the keys per step.
StepKernel dq_pass(int d, Dtype dtype, bool causal);  // dq_pass.cu

}  // namespace fa::stage11
