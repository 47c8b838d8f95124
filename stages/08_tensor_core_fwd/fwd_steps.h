/// \file fwd_steps.h
/// \brief How a step file hands its kernel to the launcher: the compiled kernel for one
/// (head dim, dtype, causal, tile, ablation) and the facts the launch and the report need.
/// Plain C++ (the launcher and the tests include it).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "problem.h"
#include "step_kernel.h"
#include "tensor_core_fwd.h"

namespace fa::stage08 {

// A step's kernel is a StepKernel (step_kernel.h), launched as fn<<<(ceil(seq_q /
// block_rows), heads, batch), threads, smem_bytes>>>(FwdParams); its description is the
// tile for the report: B_r, B_c, warps, buffers, layout, ….

// Host helpers of the launch (fwd_launch.cpp). Every refusal of a problem, dtype or pointer
// happens in check_request and check_pointers, before anything is launched or written.
void check_request(const Problem& p, Dtype dtype);
void check_pointers(const Problem& p, const void* Q, const void* K, const void* V, const void* O, const float* L);
/// One block per (query tile, head, batch).
dim3 grid_of(const Problem& p, int block_rows);
/// The kernel that `o` selects for (p, dtype): step_08a or step_08b.
StepKernel kernel_for(const Problem& p, Dtype dtype, const Options& o);

// One per step file; each throws std::invalid_argument for an ablation it has no kernel for
// (the launcher has checked the head dim and dtype).
StepKernel step_08a(int d, Dtype dtype, bool causal, const Options& o);  // 08a_one_buffer.cu
StepKernel step_08b(int d, Dtype dtype, bool causal, const Options& o);  // tensor_core_fwd.cu

}  // namespace fa::stage08
