// What the two files of the PyTorch op share (fa_torch.cpp: forward and backward;
// fa_torch_decode.cpp: decode and append_kv): dtype names and codes, the C ABI's status as a
// Python exception, tensors' addresses for the C ABI.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "fa_c.h"

namespace fa_torch {

// Python's names for the dtypes a message may mention.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// A C ABI status as a Python exception carrying the stage's message.
inline void check_status(int rc) {
  if (rc == FA_OK) return;
  TORCH_CHECK_VALUE(rc != FA_ERR_INVALID, fa_last_error());
  TORCH_CHECK(false, fa_last_error());
}

inline fa_dtype dtype_code(at::ScalarType t) {
  return t == at::kHalf ? FA_F16 : t == at::kBFloat16 ? FA_BF16 : FA_F32;
}

// A tensor's address for the C ABI; NULL for one with no elements (allowed there).
inline const void* address(const at::Tensor& t) { return t.numel() > 0 ? t.data_ptr() : nullptr; }
inline void* address(at::Tensor& t) { return t.numel() > 0 ? t.data_ptr() : nullptr; }
inline const float* floats(const at::Tensor& t) { return static_cast<const float*>(address(t)); }
inline float* floats(at::Tensor& t) { return static_cast<float*>(address(t)); }

}  // namespace fa_torch
