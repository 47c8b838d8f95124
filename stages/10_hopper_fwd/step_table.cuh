/// \file step_table.cuh
/// \brief Instantiates a step's kernel for the head dim and dtype asked for at run time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "step_kernel.h"

namespace fa::stage10 {

/// Calls make(std::integral_constant<int, d>{}, Elem{}) for d ∈ {64, 128, 256} and
/// Elem ∈ {bf16, f16}; `make` returns the StepKernel of that instance.
template <class Make>
StepKernel make_step_kernel(int d, Dtype dtype, const char* step, Make&& make) {
  auto by_head_dim = [&](auto elem) -> StepKernel {
    switch (d) {
      case 64: return make(std::integral_constant<int, 64>{}, elem);
      case 128: return make(std::integral_constant<int, 128>{}, elem);
      case 256: return make(std::integral_constant<int, 256>{}, elem);
      default: break;
    }
    throw std::invalid_argument(std::string("10_hopper_fwd: step ") + step + " has no kernel for head_dim = " +
                                std::to_string(d) + " (built: 64, 128, 256)");
  };
  if (dtype == Dtype::BF16) return by_head_dim(__nv_bfloat16{});
  if (dtype == Dtype::F16) return by_head_dim(__half{});
  throw std::invalid_argument(std::string("10_hopper_fwd: step ") + step + " takes bf16 or f16");
}

/// The kernel pointer of `Kernel<..., true>` or `<..., false>` as the launcher takes it.
template <class F>
const void* kernel_address(F* f) {
  return reinterpret_cast<const void*>(f);
}

/// A step's table row: the causal or plain instance and its launch shape.
template <class F>
StepKernel step_kernel(bool causal, F* causal_fn, F* plain_fn, int threads, int block_rows, int block_cols,
                       int stages, size_t smem_bytes, bool persistent = false) {
  StepKernel k;
  k.fn = causal ? kernel_address(causal_fn) : kernel_address(plain_fn);
  k.threads = threads;
  k.block_rows = block_rows;
  k.block_cols = block_cols;
  k.stages = stages;
  k.smem_bytes = smem_bytes;
  k.persistent = persistent;
  return k;
}

}  // namespace fa::stage10
