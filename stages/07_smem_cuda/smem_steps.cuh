/// \file smem_steps.cuh
/// \brief How a step file hands its kernels to the launcher (smem_cuda.cu): one compiled
/// kernel per configuration, with the facts the launch needs.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "block_tile.cuh"
#include "step_kernel.h"

namespace fa::stage07 {

// A step's kernel is a StepKernel (step_kernel.h), launched as fn<<<T_r · batch · heads,
// threads, smem_bytes>>>(Params); barriers counts its __syncthreads() per key tile,
// pipelined says whether K_j, V_j are copied with cp.async during the previous tile's math.

// One per step file; D is the padded head dim, B_c the key tile, `swizzled` the layout of
// sQ, sK, sP (instantiate_config says which combinations are compiled).
StepKernel step_07a(int D, int B_c, bool swizzled);  // 07a_sync_loads.cu
StepKernel step_07b(int D, int B_c, bool swizzled);  // 07b_cp_async.cu
StepKernel step_07c(int D, int B_c, bool swizzled);  // smem_cuda.cu (the final design)

namespace {

/// Calls make(Config<D, B_c, swizzled>{}) for the compiled configuration and returns what it
/// returns: D ∈ {32, 64, 96, 128}; padded tiles with B_c = 32 or 64, swizzled tiles with
/// B_c = 64 (the width they were built for: two blocks per SM at D = 128).
template <class Make>
StepKernel instantiate_config(int D, int B_c, bool swizzled, Make&& make) {
  const bool wide = B_c == 64;
  if (swizzled && wide) {
    switch (D) {
      case 32: return make(Config<32, 64, true>{});
      case 64: return make(Config<64, 64, true>{});
      case 96: return make(Config<96, 64, true>{});
      case 128: return make(Config<128, 64, true>{});
      default: break;
    }
  } else if (!swizzled) {
    switch (D) {
      case 32: return wide ? make(Config<32, 64, false>{}) : make(Config<32, 32, false>{});
      case 64: return wide ? make(Config<64, 64, false>{}) : make(Config<64, 32, false>{});
      case 96: return wide ? make(Config<96, 64, false>{}) : make(Config<96, 32, false>{});
      case 128: return wide ? make(Config<128, 64, false>{}) : make(Config<128, 32, false>{});
      default: break;
    }
  }
  throw std::logic_error("07_smem_cuda: no kernel for D = " + std::to_string(D) + ", B_c = " + std::to_string(B_c) +
                         (swizzled ? ", swizzled" : ", padded"));
}

/// A step's table row: its kernel for configuration C and the step's facts. The L1/shared
/// split is set to the most shared memory (228 KiB on an H100/H200) so that kMinBlocks
/// blocks fit side by side. Little is lost: a block reads each element of Q, K and V from
/// global memory once, so L1 has nothing to reuse.
template <class C, class F>
StepKernel config_step_kernel(F* fn, int barriers, bool pipelined) {
  StepKernel k = make_step_kernel(fn, Threads{kThreads}, BlockRows{kBlockQ}, BlockCols{C::B_c},
                                  SmemBytes{C::kSharedBytes});
  k.barriers = barriers;
  k.pipelined = pipelined;
  k.carveout = int(cudaSharedmemCarveoutMaxShared);
  return k;
}

}  // namespace
}  // namespace fa::stage07
