// Stage 13 (masks and score modifiers) as native PyTorch operators:
//
//   masked_forward(q, k, v, causal, scale, window_left, window_right, softcap, alibi_slopes,
//                  sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)  -> (O, L)
//   masked_backward(q, k, v, O, L, dO, causal, scale, window_left, window_right, softcap,
//                   alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k)  -> (dQ, dK, dV, dsinks)
//
// Layouts of forward and backward (fa_torch.cpp); the modifiers are common/modifiers.h's:
//   window_left, window_right  keys before / after each row's diagonal (None: unbounded)
//   softcap                    s <- cap * tanh(s / cap); 0 for none
//   alibi_slopes               [heads], any float dtype, on the CPU or q's device
//   sinks                      [heads] logits, any float dtype, on q's device; learnable: the
//                              backward returns dsinks (float32 [heads]; [0] without sinks)
//   cu_seqlens_q, cu_seqlens_k documents packed into one row (batch 1): int32 or int64
//                              [documents + 1], on the CPU or q's device
//   max_seqlen_q, max_seqlen_k optional; when given, at least the longest document
// Registered like forward and backward, through the C ABI's stage-13 entries (common/fa_c.h):
//   CUDA  float16, bfloat16, head dims 64 and 128: stage 13's Hopper kernels (a 9.x GPU) on
//         torch's current stream. The C ABI takes the modifiers' arrays on the host (the launch
//         builds its work list from the documents), so those given on the GPU are copied to
//         the host first: a copy that waits for the stream, and no CUDA graph capture;
//   CPU   float32: stage 13's CPU step;
//   Meta  shapes only, for torch.compile;
//   Autograd  the forward saves q, k, v, O, L and the modifiers; its backward returns dQ, dK,
//         dV and, with sinks, dsinks in the sinks' dtype. Slopes are not learnable.
// Every value the stage refuses (a negative window, softcap < 0, slopes or sinks not one per
// head, cu_seqlens not from 0, decreasing or past the tensor, documents with batch != 1) comes
// back as the stage's ValueError, before anything is written; this file checks only what the
// C ABI cannot see (ranks, dtypes, devices, and max_seqlen against the documents).
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#ifdef FA_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "fa_c.h"
#include "fa_torch.h"

// A named namespace, not an anonymous one: the op's three files are compiled as one translation
// unit (CMakeLists.txt), where fa_torch.cpp's names and this file's would collide.
namespace fa_torch::masked {

using at::Tensor;
using Forward = std::tuple<Tensor, Tensor>;
using Backward = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using OptTensor = std::optional<Tensor>;
using OptInt = std::optional<int64_t>;

// The modifiers' arguments, as the schemas take them.
struct Args {
  OptInt window_left, window_right;
  double softcap = 0;
  OptTensor alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k;
};

// ---- what the C ABI cannot see: ranks, dtypes, devices (on symbolic sizes, for Meta too);
// q, k, v and the saved tensors by fa_torch.h's check_inputs and check_saved ----

void check_vector(const char* name, const OptTensor& t, const Tensor& q, bool any_device) {
  if (!t) return;
  TORCH_CHECK_VALUE(t->dim() == 1, "attention: ", name, " must be 1-D [heads]; got shape ", t->sym_sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(t->scalar_type()), "attention: ", name, " must be a floating tensor; got ",
                    dtype_name(t->scalar_type()));
  TORCH_CHECK_VALUE(t->device() == q.device() || (any_device && t->is_cpu()), "attention: ", name, " is on ",
                    t->device(), "; it must be on ", q.device(), any_device ? " or the CPU" : " with q");
}

void check_cu_seqlens(const char* name, const OptTensor& t, const Tensor& q) {
  if (!t) return;
  TORCH_CHECK_VALUE(t->dim() == 1, "attention: ", name, " must be 1-D [documents + 1]; got shape ", t->sym_sizes());
  TORCH_CHECK_VALUE(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong, "attention: ", name,
                    " must be torch.int32 or torch.int64; got ", dtype_name(t->scalar_type()));
  TORCH_CHECK_VALUE(t->device() == q.device() || t->is_cpu(), "attention: ", name, " is on ", t->device(),
                    "; it must be on ", q.device(), " or the CPU");
}

void check_args(const Tensor& q, const Args& a) {
  check_vector("alibi_slopes", a.alibi_slopes, q, true);
  check_vector("sinks", a.sinks, q, false);
  check_cu_seqlens("cu_seqlens_q", a.cu_seqlens_q, q);
  check_cu_seqlens("cu_seqlens_k", a.cu_seqlens_k, q);
}

// The dtypes each device's stage-13 entry points take.
void check_device_dtype(const Tensor& q) {
  const auto t = q.scalar_type();
  if (q.is_cuda()) {
    TORCH_CHECK_VALUE(t == at::kHalf || t == at::kBFloat16, "attention: dtype ", dtype_name(t),
                      " is not supported with modifiers on CUDA tensors (float16, bfloat16: stage 13's Hopper kernels)");
  } else {
    TORCH_CHECK_VALUE(q.is_cpu(), "attention: device ", q.device(), " is not supported (cpu, cuda)");
    TORCH_CHECK_VALUE(t == at::kFloat, "attention: dtype ", dtype_name(t),
                      " is not supported on CPU tensors (float32: stage 13's CPU step)");
  }
}

// ---- the modifiers on the host, as fa_modifiers points at them ----

struct HostModifiers {
  fa_modifiers c{};
  std::vector<float> alibi_slopes, sinks;
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
};

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.detach().to(at::kCPU, at::kFloat).contiguous();
  return {h.data_ptr<float>(), h.data_ptr<float>() + h.numel()};
}

std::vector<int32_t> host_ints(const char* name, const Tensor& t) {
  const Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  std::vector<int32_t> out;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const int64_t x = h.data_ptr<int64_t>()[i];
    TORCH_CHECK_VALUE(x >= INT32_MIN && x <= INT32_MAX, "attention: ", name, "[", i, "] = ", x,
                      " does not fit in int32 (offsets into the packed sequence)");
    out.push_back(int32_t(x));
  }
  return out;
}

// fa_modifiers' arrays point into the vectors beside it (filled first, never resized after).
void point(HostModifiers& h) {
  h.c.size = sizeof(fa_modifiers);
  h.c.alibi_slopes = h.alibi_slopes.empty() ? nullptr : h.alibi_slopes.data();
  h.c.n_alibi_slopes = int32_t(h.alibi_slopes.size());
  h.c.sinks = h.sinks.empty() ? nullptr : h.sinks.data();
  h.c.n_sinks = int32_t(h.sinks.size());
  h.c.cu_seqlens_q = h.cu_seqlens_q.empty() ? nullptr : h.cu_seqlens_q.data();
  h.c.cu_seqlens_k = h.cu_seqlens_k.empty() ? nullptr : h.cu_seqlens_k.data();
}

void to_host(const Args& a, HostModifiers& h) {
  h.c.has_window_left = a.window_left.has_value();
  h.c.window_left = a.window_left.value_or(0);
  h.c.has_window_right = a.window_right.has_value();
  h.c.window_right = a.window_right.value_or(0);
  h.c.softcap = a.softcap;
  if (a.alibi_slopes) h.alibi_slopes = host_floats(*a.alibi_slopes);
  if (a.sinks) h.sinks = host_floats(*a.sinks);
  TORCH_CHECK_VALUE(a.cu_seqlens_q.has_value() == a.cu_seqlens_k.has_value(), "attention: ",
                    a.cu_seqlens_q ? "cu_seqlens_q is given without cu_seqlens_k" : "cu_seqlens_k is given without cu_seqlens_q",
                    " (documents need both)");
  if (a.cu_seqlens_q) {
    h.cu_seqlens_q = host_ints("cu_seqlens_q", *a.cu_seqlens_q);
    h.cu_seqlens_k = host_ints("cu_seqlens_k", *a.cu_seqlens_k);
    TORCH_CHECK_VALUE(h.cu_seqlens_q.size() == h.cu_seqlens_k.size(), "attention: cu_seqlens_q has ",
                      h.cu_seqlens_q.size(), " entries and cu_seqlens_k ", h.cu_seqlens_k.size(),
                      " (one per document boundary: as many)");
    h.c.n_cu_seqlens = int32_t(h.cu_seqlens_q.size());
  }
  point(h);
}

// max_seqlen, when given, bounds every document (the whole sequence without documents). Only
// the bound is checked: the stage finds the longest document itself.
void check_max_seqlen(const char* name, const OptInt& max_seqlen, const std::vector<int32_t>& cu, int64_t whole) {
  if (!max_seqlen) return;
  int64_t longest = whole;
  if (!cu.empty()) {
    longest = 0;
    for (size_t i = 1; i < cu.size(); ++i) longest = std::max<int64_t>(longest, int64_t(cu[i]) - cu[i - 1]);
  }
  TORCH_CHECK_VALUE(*max_seqlen >= longest, "attention: ", name, " = ", *max_seqlen, " is less than the longest ",
                    cu.empty() ? "sequence (" : "document (", longest, "); it must be at least that");
}

// ---- the CPU and CUDA kernels: one body each, the device decides the entry point ----

Forward forward_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, bool causal, double scale,
                     OptInt window_left, OptInt window_right, double softcap, const OptTensor& alibi_slopes,
                     const OptTensor& sinks, const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
                     OptInt max_seqlen_q, OptInt max_seqlen_k) {
  const Args a{window_left, window_right, softcap, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k};
  check_inputs(q_in, k_in, v_in);
  check_device_dtype(q_in);
  check_args(q_in, a);
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const fa_problem p = problem_of(q, k, causal, scale);
  HostModifiers h;
  to_host(a, h);
  check_max_seqlen("max_seqlen_q", max_seqlen_q, h.cu_seqlens_q, q.size(2));
  check_max_seqlen("max_seqlen_k", max_seqlen_k, h.cu_seqlens_k, k.size(2));
  Tensor o = at::empty_like(q, at::MemoryFormat::Contiguous);                                 // [b, h, Nq, d]
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));  // [b, h, Nq]
  if (q.is_cpu()) {
    check_status(fa_forward_masked(&p, &h.c, floats(q), floats(k), floats(v), floats(o), floats(lse)));
    return {o, lse};
  }
#ifdef FA_TORCH_CUDA
  const c10::cuda::CUDAGuard device(q.device());
  void* stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  check_status(fa_forward_masked_device(&p, &h.c, dtype_code(q.scalar_type()), address(q), address(k), address(v),
                                        address(o), floats(lse), stream));
#else
  TORCH_CHECK(false, "attention: this build of the op has no CUDA kernels (device ", q.device(), ")");
#endif
  return {o, lse};
}

Backward backward_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& o_in,
                       const Tensor& lse_in, const Tensor& do_in, bool causal, double scale, OptInt window_left,
                       OptInt window_right, double softcap, const OptTensor& alibi_slopes, const OptTensor& sinks,
                       const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k) {
  const Args a{window_left, window_right, softcap, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k};
  check_inputs(q_in, k_in, v_in);
  check_device_dtype(q_in);
  check_saved(q_in, o_in, lse_in, do_in);
  check_args(q_in, a);
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Tensor o = o_in.contiguous(), lse = lse_in.contiguous(), d_o = do_in.contiguous();
  const fa_problem p = problem_of(q, k, causal, scale);
  HostModifiers h;
  to_host(a, h);
  Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous);
  Tensor dk = at::empty_like(k, at::MemoryFormat::Contiguous);
  Tensor dv = at::empty_like(v, at::MemoryFormat::Contiguous);
  Tensor dsinks = at::empty({sinks ? sinks->size(0) : 0}, q.options().dtype(at::kFloat));  // [heads] or [0]
  float* dsinks_ptr = sinks ? floats(dsinks) : nullptr;
  if (q.is_cpu()) {
    check_status(fa_backward_masked(&p, &h.c, floats(q), floats(k), floats(v), floats(o), floats(lse), floats(d_o),
                                    floats(dq), floats(dk), floats(dv), dsinks_ptr));
    return {dq, dk, dv, dsinks};
  }
#ifdef FA_TORCH_CUDA
  const c10::cuda::CUDAGuard device(q.device());
  void* stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  check_status(fa_backward_masked_device(&p, &h.c, dtype_code(q.scalar_type()), address(q), address(k), address(v),
                                         address(o), floats(lse), address(d_o), address(dq), address(dk), address(dv),
                                         dsinks_ptr, stream));
#else
  TORCH_CHECK(false, "attention backward: this build of the op has no CUDA kernels (device ", q.device(), ")");
#endif
  return {dq, dk, dv, dsinks};
}

// ---- Meta: shapes and dtypes only (torch.compile traces with these) ----

Forward forward_meta(const Tensor& q, const Tensor& k, const Tensor& v, bool, double, OptInt window_left,
                     OptInt window_right, double softcap, const OptTensor& alibi_slopes, const OptTensor& sinks,
                     const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k, OptInt, OptInt) {
  check_inputs(q, k, v);
  check_args(q, Args{window_left, window_right, softcap, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k});
  return {at::empty_symint(q.sym_sizes(), q.options()),
          at::empty_symint(q.sym_sizes().slice(0, 3), q.options().dtype(at::kFloat))};
}

Backward backward_meta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                       const Tensor& d_o, bool, double, OptInt window_left, OptInt window_right, double softcap,
                       const OptTensor& alibi_slopes, const OptTensor& sinks, const OptTensor& cu_seqlens_q,
                       const OptTensor& cu_seqlens_k) {
  check_inputs(q, k, v);
  check_saved(q, o, lse, d_o);
  check_args(q, Args{window_left, window_right, softcap, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k});
  const c10::SymInt heads = sinks ? sinks->sym_size(0) : c10::SymInt(0);
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options()),
          at::empty_symint(v.sym_sizes(), v.options()),
          at::empty_symint(c10::SymIntArrayRef(&heads, 1), q.options().dtype(at::kFloat))};
}

// ---- autograd: the forward op below autograd, then the backward op with dO ----

Forward call_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, const Args& a,
                     OptInt max_seqlen_q, OptInt max_seqlen_k) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fa_attention::masked_forward", "")
                             .typed<Forward(const Tensor&, const Tensor&, const Tensor&, bool, double, OptInt, OptInt,
                                            double, const OptTensor&, const OptTensor&, const OptTensor&,
                                            const OptTensor&, OptInt, OptInt)>();
  return op.call(q, k, v, causal, scale, a.window_left, a.window_right, a.softcap, a.alibi_slopes, a.sinks,
                 a.cu_seqlens_q, a.cu_seqlens_k, max_seqlen_q, max_seqlen_k);
}

Backward call_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                       const Tensor& d_o, bool causal, double scale, const Args& a) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fa_attention::masked_backward", "")
                             .typed<Backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                             const Tensor&, bool, double, OptInt, OptInt, double, const OptTensor&,
                                             const OptTensor&, const OptTensor&, const OptTensor&)>();
  return op.call(q, k, v, o, lse, d_o, causal, scale, a.window_left, a.window_right, a.softcap, a.alibi_slopes,
                 a.sinks, a.cu_seqlens_q, a.cu_seqlens_k);
}

// An optional tensor as a saved one (undefined when absent) and back.
Tensor or_undefined(const OptTensor& t) { return t ? *t : Tensor(); }
OptTensor if_defined(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// The inputs of apply(): q, k, v, sinks (the differentiable ones), then the rest of the
// modifiers and the sizes, which get no gradient. An absent optional tensor is no input of the
// graph, and is saved as an undefined tensor.
class MaskedAttention : public torch::autograd::Function<MaskedAttention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& q,
                                                const Tensor& k, const Tensor& v, const OptTensor& sinks, bool causal,
                                                double scale, OptInt window_left, OptInt window_right, double softcap,
                                                const OptTensor& alibi_slopes, const OptTensor& cu_seqlens_q,
                                                const OptTensor& cu_seqlens_k, OptInt max_seqlen_q, OptInt max_seqlen_k) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const Args a{window_left, window_right, softcap, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k};
    auto [o, lse] = call_forward(q, k, v, causal, scale, a, max_seqlen_q, max_seqlen_k);
    ctx->save_for_backward({q, k, v, o, lse, or_undefined(sinks), or_undefined(alibi_slopes),
                            or_undefined(cu_seqlens_q), or_undefined(cu_seqlens_k)});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["softcap"] = softcap;
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // L's gradient stays undefined: no zeros built per call
    return {o, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(14);  // one per input of forward(); undefined: no gradient
    const Tensor& d_o = grads[0];
    if (!d_o.defined()) return out;
    const auto s = ctx->get_saved_variables();  // q, k, v, O, L, sinks, slopes, cu_q, cu_k
    const Args a{ctx->saved_data["window_left"].toOptional<int64_t>(),
                 ctx->saved_data["window_right"].toOptional<int64_t>(),
                 ctx->saved_data["softcap"].toDouble(),
                 if_defined(s[6]),
                 if_defined(s[5]),
                 if_defined(s[7]),
                 if_defined(s[8])};
    auto [dq, dk, dv, dsinks] = call_backward(s[0], s[1], s[2], s[3], s[4], d_o, ctx->saved_data["causal"].toBool(),
                                              ctx->saved_data["scale"].toDouble(), a);
    out[0] = dq;
    out[1] = dk;
    out[2] = dv;
    if (s[5].defined()) out[3] = dsinks.to(s[5].scalar_type());
    return out;
  }
};

// Strided q, k, v are copied above the function, as fa_torch.cpp does, so it saves the copies.
Forward forward_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                         OptInt window_left, OptInt window_right, double softcap, const OptTensor& alibi_slopes,
                         const OptTensor& sinks, const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
                         OptInt max_seqlen_q, OptInt max_seqlen_k) {
  const auto out = MaskedAttention::apply(q.contiguous(), k.contiguous(), v.contiguous(), sinks, causal, scale,
                                          window_left, window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                                          max_seqlen_q, max_seqlen_k);
  return {out[0], out[1]};
}

}  // namespace fa_torch::masked

// The schemas are in fa_torch.cpp's TORCH_LIBRARY(fa_attention): one library, one definition.
TORCH_LIBRARY_IMPL(fa_attention, CPU, m) {
  m.impl("masked_forward", &fa_torch::masked::forward_impl);
  m.impl("masked_backward", &fa_torch::masked::backward_impl);
}

#ifdef FA_TORCH_CUDA
TORCH_LIBRARY_IMPL(fa_attention, CUDA, m) {
  m.impl("masked_forward", &fa_torch::masked::forward_impl);
  m.impl("masked_backward", &fa_torch::masked::backward_impl);
}
#endif

TORCH_LIBRARY_IMPL(fa_attention, Meta, m) {
  m.impl("masked_forward", &fa_torch::masked::forward_meta);
  m.impl("masked_backward", &fa_torch::masked::backward_meta);
}

TORCH_LIBRARY_IMPL(fa_attention, Autograd, m) { m.impl("masked_forward", &fa_torch::masked::forward_autograd); }
