#include "problem.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <stdexcept>

namespace fa {

const char* dtype_name(Dtype t) {
  switch (t) {
    case Dtype::F32: return "f32";
    case Dtype::F16: return "f16";
    case Dtype::BF16: return "bf16";
  }
  return "?";
}

Dtype parse_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32") return Dtype::F32;
  if (s == "f16" || s == "fp16") return Dtype::F16;
  if (s == "bf16") return Dtype::BF16;
  throw std::invalid_argument("dtype '" + s + "' is not one of f32, f16, bf16");
}

void Problem::validate(const std::string& who) const {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(who + ": " + what); };
  auto at_least = [&](const char* name, long value, long min) {
    if (value < min)
      fail(std::string(name) + " = " + std::to_string(value) + " is not allowed (must be >= " +
           std::to_string(min) + ")");
  };
  at_least("batch", batch, 1);
  at_least("heads", heads, 1);
  at_least("kv_heads", kv_heads, 1);
  at_least("seq_q", seq_q, 0);  // empty sequences are valid
  at_least("seq_k", seq_k, 0);
  at_least("head_dim", head_dim, 1);
  if (heads % kv_heads != 0)
    fail("heads = " + std::to_string(heads) + " is not a multiple of kv_heads = " +
         std::to_string(kv_heads) + " (grouped-query attention needs heads % kv_heads == 0)");
  // Every tensor's element count, and its size in bytes at fp32 (the widest element type),
  // must fit in int64_t: offsets are 64-bit, and a count that wraps would make a huge
  // problem look small (or empty) and send a stage past the end of its buffers.
  const auto fits = [&](const char* tensor, const char* dims, std::initializer_list<int64_t> sizes) {
    int64_t elems = 1;
    bool overflow = false;
    for (int64_t n : sizes) overflow = __builtin_mul_overflow(elems, n, &elems) || overflow;
    int64_t bytes = 0;
    overflow = __builtin_mul_overflow(elems, int64_t(sizeof(float)), &bytes) || overflow;
    if (!overflow || std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return;
    std::ostringstream s;
    double product = 1;
    s << tensor << " would hold " << dims << " = ";
    for (auto it = sizes.begin(); it != sizes.end(); ++it) {
      s << (it == sizes.begin() ? "" : " x ") << *it;
      product *= double(*it);
    }
    s << " = " << product << " elements (" << product * double(sizeof(float))
      << " bytes at fp32); at most " << kMaxTensorElems
      << " elements are allowed (their fp32 bytes must fit in a 64-bit size)";
    fail(s.str());
  };
  fits("Q", "batch x heads x seq_q x head_dim", {batch, heads, seq_q, head_dim});
  fits("K", "batch x kv_heads x seq_k x head_dim", {batch, kv_heads, seq_k, head_dim});
  fits("L", "batch x heads x seq_q", {batch, heads, seq_q});
  if (!std::isfinite(scale) || scale < 0.0f) {
    std::ostringstream s;
    s << "scale = " << scale << " is not allowed (must be finite and > 0, or 0 for 1/sqrt(d))";
    fail(s.str());
  }
}

float Problem::softmax_scale() const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(float(head_dim));
}

double Problem::forward_flops() const {
  double f = 4.0 * batch * heads * double(seq_q) * double(seq_k) * head_dim;
  if (causal && seq_q == seq_k) f *= 0.5;
  return f;
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "batch=" << batch << " heads=" << heads << " kv_heads=" << kv_heads << " seq_q=" << seq_q
    << " seq_k=" << seq_k << " d=" << head_dim << (causal ? " causal" : " non-causal")
    << " scale=" << softmax_scale();
  return s.str();
}

namespace {
void require_buffer(const std::string& who, const void* ptr, int64_t elems, const char* name) {
  if (ptr == nullptr && elems > 0)
    throw std::invalid_argument(who + ": " + name + " is a null pointer (" + std::to_string(elems) +
                                " elements expected)");
}
}  // namespace

void require_forward_buffers(const std::string& who, const Problem& p, const float* Q, const float* K,
                             const float* V, const float* O, const float* L) {
  require_buffer(who, Q, p.q_elems(), "Q");
  require_buffer(who, K, p.kv_elems(), "K");
  require_buffer(who, V, p.kv_elems(), "V");
  require_buffer(who, O, p.q_elems(), "O");
  require_buffer(who, L, p.l_elems(), "L");
}

void require_backward_buffers(const std::string& who, const Problem& p, const float* Q, const float* K,
                              const float* V, const float* O, const float* L, const float* dO, const float* dQ,
                              const float* dK, const float* dV) {
  require_forward_buffers(who, p, Q, K, V, O, L);
  require_buffer(who, dO, p.q_elems(), "dO");
  require_buffer(who, dQ, p.q_elems(), "dQ");
  require_buffer(who, dK, p.kv_elems(), "dK");
  require_buffer(who, dV, p.kv_elems(), "dV");
}

}  // namespace fa
