// Stage 13 on Hopper: the compiled kernels (masked_hopper.cu) as the launcher sees them.
#pragma once

#include <cuda_runtime_api.h>

#include "masked_params.h"
#include "problem.h"
#include "step_kernel.h"

namespace fa::stage13 {

/// The forward kernel for head dim d (64, 128) and dtype (bf16, f16) with the score functor
/// the modifiers need: none, soft-cap, ALiBi, or both. Throws for another d or dtype.
StepKernel masked_hopper_kernel(int d, Dtype dtype, bool softcap, bool alibi);

/// The backward kernel for head dim d (64, 128) and dtype (bf16, f16): one block per (key
/// tile, kv head, batch), built for the score: soft-cap (with or without ALiBi; cap and
/// slope read at run time), ALiBi alone, or the plain score (masked_hopper_bwd.cu).
StepKernel masked_hopper_bwd_kernel(int d, Dtype dtype, bool softcap, bool alibi);
/// Around it: D, L2 (and dσ) into the padded scratch and zeros into dQ_accum before; dQ from
/// dQ_accum after.
void launch_masked_prep(const MaskedBwdParams& p, Dtype dtype, int d, cudaStream_t stream);
void launch_masked_convert_dq(const MaskedBwdParams& p, Dtype dtype, int d, cudaStream_t stream);

}  // namespace fa::stage13
