/// \file smem_steps.cuh
/// \brief How a step file hands its kernels to the launcher (smem_cuda.cu): one compiled
/// kernel per configuration, with the facts the launch needs.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "block_tile.cuh"

namespace fa::stage07 {

/// A compiled kernel of one step, launched as fn<<<T_r · batch · heads, threads,
/// shared_bytes>>>(Params).
struct StepKernel {
  const void* fn = nullptr;
  int threads = 0;
  size_t shared_bytes = 0;
  int barriers = 0;        ///< __syncthreads() per key tile
  bool pipelined = false;  ///< K_j, V_j copied with cp.async during the previous tile's math
};

// One per step file; D is the padded head dim, B_c the key tile, `swizzled` the layout of
// sQ, sK, sP (make_step_kernel says which combinations are compiled).
StepKernel step_07a(int D, int B_c, bool swizzled);  // 07a_sync_loads.cu
StepKernel step_07b(int D, int B_c, bool swizzled);  // 07b_cp_async.cu
StepKernel step_07c(int D, int B_c, bool swizzled);  // smem_cuda.cu (the final design)

namespace {

/// Calls make(Config<D, B_c, swizzled>{}) for the compiled configuration and returns what it
/// returns: D ∈ {32, 64, 96, 128}; padded tiles with B_c = 32 or 64, swizzled tiles with
/// B_c = 64 (the width they were built for: two blocks per SM at D = 128).
template <class Make>
StepKernel make_step_kernel(int D, int B_c, bool swizzled, Make&& make) {
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

/// The kernel pointer as the launcher takes it.
template <class F>
const void* kernel_address(F* f) {
  return reinterpret_cast<const void*>(f);
}

}  // namespace
}  // namespace fa::stage07
