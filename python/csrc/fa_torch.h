// What the files of the PyTorch op share (fa_torch.cpp: forward and backward;
// fa_torch_masked.cpp: masked_forward and masked_backward; fa_torch_decode.cpp: decode and
// append_kv): dtype names and codes, the C ABI's status as a Python exception, tensors'
// addresses for the C ABI, and the attention ops' shape checks and fa_problem.
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

// ---- shared by forward/backward (fa_torch.cpp) and masked_forward/backward (fa_torch_masked.cpp) ----

// What the C ABI cannot see through pointers: ranks and shapes that agree, one dtype, one
// device. Written on symbolic sizes so the Meta kernels (torch.compile) check the same.
inline void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                    "attention: q, k, v must be [batch, heads, seq, head_dim]; got shapes ", q.sym_sizes(), ", ",
                    k.sym_sizes(), ", ", v.sym_sizes());
  TORCH_CHECK_VALUE(k.sym_sizes() == v.sym_sizes() && k.sym_size(0) == q.sym_size(0) && k.sym_size(3) == q.sym_size(3),
                    "attention: k ", k.sym_sizes(), " and v ", v.sym_sizes(), " must be [", q.sym_size(0),
                    ", kv_heads, seq_k, ", q.sym_size(3), "] for q ", q.sym_sizes());
  TORCH_CHECK_VALUE(q.device() == k.device() && q.device() == v.device(), "attention: q, k, v on different devices (",
                    q.device(), ", ", k.device(), ", ", v.device(), ")");
  TORCH_CHECK_VALUE(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
                    "attention: q, k, v of different dtypes (", dtype_name(q.scalar_type()), ", ",
                    dtype_name(k.scalar_type()), ", ", dtype_name(v.scalar_type()), ")");
}

// O, L and dO of the backward against q.
inline void check_saved(const at::Tensor& q, const at::Tensor& o, const at::Tensor& lse, const at::Tensor& d_o) {
  const auto rows = q.sym_sizes().slice(0, 3);
  TORCH_CHECK_VALUE(o.sym_sizes() == q.sym_sizes() && d_o.sym_sizes() == q.sym_sizes() && lse.sym_sizes() == rows,
                    "attention backward: O ", o.sym_sizes(), " and dO ", d_o.sym_sizes(), " must be ", q.sym_sizes(),
                    ", L ", lse.sym_sizes(), " must be ", rows);
  TORCH_CHECK_VALUE(o.scalar_type() == q.scalar_type() && d_o.scalar_type() == q.scalar_type(), "attention backward: O ",
                    dtype_name(o.scalar_type()), " and dO ", dtype_name(d_o.scalar_type()), " must be q's dtype, ",
                    dtype_name(q.scalar_type()));
  TORCH_CHECK_VALUE(lse.scalar_type() == at::kFloat, "attention backward: L is ", dtype_name(lse.scalar_type()),
                    "; it must be torch.float32");
  TORCH_CHECK_VALUE(o.device() == q.device() && d_o.device() == q.device() && lse.device() == q.device(),
                    "attention backward: O, L, dO must be on ", q.device());
}

inline fa_problem problem_of(const at::Tensor& q, const at::Tensor& k, bool causal, double scale) {
  const auto narrow = [](int64_t n, const char* what) {
    TORCH_CHECK_VALUE(n >= 0 && n <= INT32_MAX, "attention: ", what, " = ", n, " exceeds 2^31 - 1");
    return int32_t(n);
  };
  return fa_problem{narrow(q.size(0), "batch"),    narrow(q.size(1), "heads"), narrow(k.size(1), "kv_heads"),
                    narrow(q.size(2), "seq_q"),    narrow(k.size(2), "seq_k"), narrow(q.size(3), "head_dim"),
                    causal ? 1 : 0,                float(scale)};
}

}  // namespace fa_torch
