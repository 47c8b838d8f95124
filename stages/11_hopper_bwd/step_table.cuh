/// \file step_table.cuh
/// \brief Instantiates a step's kernel for the head dim and dtype asked for at run time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "step_kernel.h"

namespace fa::stage11 {

/// Calls make(std::integral_constant<int, d>{}, Elem{}) for d ∈ {64, 128} and Elem ∈
/// {bf16, f16}; `make` returns the StepKernel of that instance.
template <class Make>
StepKernel make_step_kernel(int d, Dtype dtype, const char* step, Make&& make) {
  auto by_head_dim = [&](auto elem) -> StepKernel {
    if (d == 64) return make(std::integral_constant<int, 64>{}, elem);
    if (d == 128) return make(std::integral_constant<int, 128>{}, elem);
    throw std::invalid_argument(std::string("11_hopper_bwd: step ") + step + " has no kernel for head_dim = " +
                                std::to_string(d) + " (built: 64, 128)");
  };
  if (dtype == Dtype::BF16) return by_head_dim(__nv_bfloat16{});
  if (dtype == Dtype::F16) return by_head_dim(__half{});
  throw std::invalid_argument(std::string("11_hopper_bwd: step ") + step + " takes bf16 or f16");
}

/// A step's table row: the causal or plain instance and its launch shape.
template <class F>
StepKernel step_kernel(bool causal, F* causal_fn, F* plain_fn, int threads, int block_cols, int block_rows,
                       size_t smem_bytes) {
  StepKernel k;
  k.fn = reinterpret_cast<const void*>(causal ? causal_fn : plain_fn);
  k.threads = threads;
  k.block_cols = block_cols;
  k.block_rows = block_rows;
  k.smem_bytes = smem_bytes;
  return k;
}

}  // namespace fa::stage11
