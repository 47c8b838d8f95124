/// \file hopper_fwd_steps.h
/// \brief Stage 10's step table: one function per step file, returning the kernel of one
/// (head dim, dtype, causal) instance in the common step contract (step_kernel.h). Plain
/// C++ (the launcher and the tests include it).
///
/// A forward kernel is launched as fn<<<(ceil(seq_q / block_rows), heads, batch), threads,
/// smem_bytes>>>(FwdParams), or, when persistent, on min(SMs, tiles) blocks; block_cols is
/// B_c (keys per K/V tile) and stages the K/V buffers of the ring.
#pragma once

#include "problem.h"
#include "step_kernel.h"

namespace fa::stage10 {

// One per step file; each throws std::invalid_argument for a head dim it has no kernel for.
StepKernel step_10a(int d, Dtype dtype, bool causal);  // 10a_tma_wgmma.cu
StepKernel step_10b(int d, Dtype dtype, bool causal);  // 10b_warp_specialized.cu
StepKernel step_10c(int d, Dtype dtype, bool causal);  // 10c_pingpong.cu
StepKernel step_10d(int d, Dtype dtype, bool causal);  // 10d_overlap.cu
StepKernel step_10e(int d, Dtype dtype, bool causal);  // hopper_fwd.cu (the persistent kernel, static schedule)
StepKernel step_10f(int d, Dtype dtype, bool causal);  // hopper_fwd.cu (the final design: dynamic schedule)

}  // namespace fa::stage10
