// Stage 13 on Hopper: the compiled kernels (masked_hopper.cu) as the launcher sees them.
#pragma once

#include "problem.h"
#include "step_kernel.h"

namespace fa::stage13 {

/// The forward kernel for head dim d (64, 128) and dtype (bf16, f16) with the score functor
/// the modifiers need: none, soft-cap, ALiBi, or both. Throws for another d or dtype.
StepKernel masked_hopper_kernel(int d, Dtype dtype, bool softcap, bool alibi);

}  // namespace fa::stage13
