/// \file step_table.cuh
/// \brief A step file's table: the kernel instance for the head dim and dtype asked for at
/// run time, among those the step is built for.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "problem.h"
#include "step_kernel.h"

namespace fa {

/// Calls make(std::integral_constant<int, d>{}, Elem{}) for d among kHeadDims and Elem ∈
/// {bf16, f16}, and returns the StepKernel it makes; refuses any other head dim or dtype,
/// naming the stage and the step: instantiate_step<64, 128>("11_hopper_bwd", "11a", …).
template <int... kHeadDims, class Make>
StepKernel instantiate_step(const char* stage, const char* step, int d, Dtype dtype, Make&& make) {
  auto by_head_dim = [&](auto elem) -> StepKernel {
    StepKernel k;
    // The plain loop: for each built head dim D, if d == D, k = make(D, elem); || stops at
    // the first that matches.
    const bool built = ((d == kHeadDims ? (k = make(std::integral_constant<int, kHeadDims>{}, elem), true) : false) ||
                        ...);
    if (built) return k;
    std::string dims;
    ((dims += (dims.empty() ? "" : ", ") + std::to_string(kHeadDims)), ...);
    throw std::invalid_argument(std::string(stage) + ": step " + step + " has no kernel for head_dim = " +
                                std::to_string(d) + " (built: " + dims + ")");
  };
  if (dtype == Dtype::BF16) return by_head_dim(__nv_bfloat16{});
  if (dtype == Dtype::F16) return by_head_dim(__half{});
  throw std::invalid_argument(std::string(stage) + ": step " + step + " takes bf16 or f16");
}

}  // namespace fa
