// The stages as a native PyTorch operator: torch.ops.fa_attention.forward / backward.
//
//   forward(q, k, v, causal, scale, stage)               -> (O, L)
//   backward(q, k, v, O, L, dO, causal, scale, stage)    -> (dQ, dK, dV)
//
// q, O, dO [b, h, Nq, d]; k, v [b, hkv, Nk, d]; L float32 [b, h, Nq] (natural-log
// log-sum-exp of each row); scale 0 means 1/sqrt(d); `stage` names a stage ("11", "06").
// Registered for three dispatch keys, plus autograd (docs/design.md §11):
//   CUDA  the stage's device entry point on torch's current stream of the tensors' device,
//         outputs and scratch from torch's caching allocator (so it can be graph-captured);
//   CPU   the host entry points on float32 tensors (any stage);
//   Meta  shapes only, for torch.compile's fake tensors;
//   Autograd  forward saves (q, k, v, O, L) and calls backward with dO; L is not
//         differentiable, and no zero gradient is ever built for it.
// Everything per call is what the call needs: the argument checks, two or three output
// tensors, and the stage's launch. The stage's own checks and messages come through the C
// ABI (common/fa_c.h) as Python exceptions: ValueError for what the stage refuses,
// RuntimeError for what failed while running. Stage 13's masked_forward and masked_backward
// (fa_torch_masked.cpp) and stage 14's decode and append_kv (fa_torch_decode.cpp) are in the
// same library.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#ifdef FA_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "fa_c.h"
#include "fa_torch.h"

namespace {

using namespace fa_torch;
using at::Tensor;
using Forward = std::tuple<Tensor, Tensor>;
using Backward = std::tuple<Tensor, Tensor, Tensor>;

// The dtypes each device's entry points take.
void check_device_dtype(const Tensor& q) {
  const auto t = q.scalar_type();
  if (q.is_cuda()) {
    TORCH_CHECK_VALUE(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, "attention: dtype ", dtype_name(t),
                      " is not supported on CUDA tensors (float32, float16, bfloat16)");
  } else {
    TORCH_CHECK_VALUE(q.is_cpu(), "attention: device ", q.device(), " is not supported (cpu, cuda)");
    TORCH_CHECK_VALUE(t == at::kFloat, "attention: dtype ", dtype_name(t),
                      " is not supported on CPU tensors (float32: the host entry points take fp32)");
  }
}

// ---- the CPU and CUDA kernels: one body each, the device decides the entry point ----

Forward forward_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, bool causal, double scale,
                     c10::string_view stage_name) {
  check_inputs(q_in, k_in, v_in);
  check_device_dtype(q_in);
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const fa_problem p = problem_of(q, k, causal, scale);
  const std::string stage(stage_name);
  Tensor o = at::empty_like(q, at::MemoryFormat::Contiguous);                  // [b, h, Nq, d]
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));  // [b, h, Nq]
  if (q.is_cpu()) {
    check_status(fa_forward(stage.c_str(), &p, floats(q), floats(k), floats(v), floats(o), floats(lse)));
    return {o, lse};
  }
#ifdef FA_TORCH_CUDA
  const c10::cuda::CUDAGuard device(q.device());
  void* stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  check_status(fa_forward_device(stage.c_str(), &p, dtype_code(q.scalar_type()), address(q), address(k), address(v),
                                 address(o), floats(lse), stream));
#else
  TORCH_CHECK(false, "attention: this build of the op has no CUDA kernels (device ", q.device(), ")");
#endif
  return {o, lse};
}

Backward backward_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& o_in,
                       const Tensor& lse_in, const Tensor& do_in, bool causal, double scale,
                       c10::string_view stage_name) {
  check_inputs(q_in, k_in, v_in);
  check_device_dtype(q_in);
  check_saved(q_in, o_in, lse_in, do_in);
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Tensor o = o_in.contiguous(), lse = lse_in.contiguous(), d_o = do_in.contiguous();
  const fa_problem p = problem_of(q, k, causal, scale);
  const std::string stage(stage_name);
  Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous);
  Tensor dk = at::empty_like(k, at::MemoryFormat::Contiguous);
  Tensor dv = at::empty_like(v, at::MemoryFormat::Contiguous);
  if (q.is_cpu()) {
    check_status(fa_backward(stage.c_str(), &p, floats(q), floats(k), floats(v), floats(o), floats(lse), floats(d_o),
                             floats(dq), floats(dk), floats(dv)));
    return {dq, dk, dv};
  }
#ifdef FA_TORCH_CUDA
  const c10::cuda::CUDAGuard device(q.device());
  void* stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  check_status(fa_backward_device(stage.c_str(), &p, dtype_code(q.scalar_type()), address(q), address(k),
                                  address(v), address(o), floats(lse), address(d_o), address(dq), address(dk),
                                  address(dv), stream));
#else
  TORCH_CHECK(false, "attention backward: this build of the op has no CUDA kernels (device ", q.device(), ")");
#endif
  return {dq, dk, dv};
}

// ---- Meta: shapes and dtypes only (torch.compile traces with these) ----

Forward forward_meta(const Tensor& q, const Tensor& k, const Tensor& v, bool, double, c10::string_view) {
  check_inputs(q, k, v);
  return {at::empty_symint(q.sym_sizes(), q.options()),
          at::empty_symint(q.sym_sizes().slice(0, 3), q.options().dtype(at::kFloat))};
}

Backward backward_meta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                       const Tensor& d_o, bool, double, c10::string_view) {
  check_inputs(q, k, v);
  check_saved(q, o, lse, d_o);
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options()),
          at::empty_symint(v.sym_sizes(), v.options())};
}

// ---- autograd: the forward op below autograd, then the backward op with dO ----

Forward call_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                     c10::string_view stage) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fa_attention::forward", "")
                             .typed<Forward(const Tensor&, const Tensor&, const Tensor&, bool, double, c10::string_view)>();
  return op.call(q, k, v, causal, scale, stage);
}

Backward call_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                       const Tensor& d_o, bool causal, double scale, c10::string_view stage) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fa_attention::backward", "")
          .typed<Backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          bool, double, c10::string_view)>();
  return op.call(q, k, v, o, lse, d_o, causal, scale, stage);
}

class Attention : public torch::autograd::Function<Attention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& q,
                                                const Tensor& k, const Tensor& v, bool causal, double scale,
                                                c10::string_view stage) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [o, lse] = call_forward(q, k, v, causal, scale, stage);
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["stage"] = std::string(stage);
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // L's gradient stays undefined: no zeros built per call
    return {o, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Tensor& d_o = grads[0];
    if (!d_o.defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    const auto saved = ctx->get_saved_variables();  // q, k, v, O, L
    const std::string stage = ctx->saved_data["stage"].toStringRef();
    auto [dq, dk, dv] = call_backward(saved[0], saved[1], saved[2], saved[3], saved[4], d_o,
                                      ctx->saved_data["causal"].toBool(), ctx->saved_data["scale"].toDouble(), stage);
    return {dq, dk, dv, Tensor(), Tensor(), Tensor()};
  }
};

// Strided inputs (a model's [b, n, h, d] viewed as [b, h, n, d]) are copied here, above the
// function, so that it saves the contiguous copies: the backward then reads them as they are
// instead of copying q, k and v a second time. The copy is differentiable (its gradient passes
// through), and costs nothing for inputs that are contiguous already.
Forward forward_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                         c10::string_view stage) {
  const auto out = Attention::apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale, stage);
  return {out[0], out[1]};
}

#ifdef FA_TORCH_CUDA
// Scratch for the GPU stages from torch's caching allocator (common/fa_c.h).
void* torch_allocate(size_t bytes, void* stream, void*) {
  try {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
  } catch (const std::exception&) {
    return nullptr;  // the stage reports the failure with its own name
  }
}
void torch_release(void* ptr, void*, void*) { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }

[[maybe_unused]] const bool scratch_from_torch = fa_set_scratch_allocator(torch_allocate, torch_release, nullptr) == FA_OK;
#endif

}  // namespace

TORCH_LIBRARY(fa_attention, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, bool causal, float scale, str stage) -> (Tensor, Tensor)");
  m.def(
      "backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, bool causal, float scale, str stage)"
      " -> (Tensor, Tensor, Tensor)");
  // Stage 13, masks and score modifiers (fa_torch_masked.cpp holds the kernels).
  m.def(
      "masked_forward(Tensor q, Tensor k, Tensor v, bool causal, float scale, int? window_left, int? window_right,"
      " float softcap, Tensor? alibi_slopes, Tensor? sinks, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k,"
      " int? max_seqlen_q, int? max_seqlen_k) -> (Tensor, Tensor)");
  m.def(
      "masked_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, bool causal, float scale,"
      " int? window_left, int? window_right, float softcap, Tensor? alibi_slopes, Tensor? sinks,"
      " Tensor? cu_seqlens_q, Tensor? cu_seqlens_k) -> (Tensor, Tensor, Tensor, Tensor)");
  // Stage 14, decoding (fa_torch_decode.cpp holds the kernels). append_kv writes the caches in
  // place: (a!) and (b!) tell the dispatcher and torch.compile that it mutates them.
  m.def(
      "decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, Tensor? block_table=None,"
      " bool causal=True, float scale=0.0) -> (Tensor, Tensor)");
  m.def(
      "append_kv(Tensor k_new, Tensor v_new, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens,"
      " Tensor? block_table=None) -> ()");
}

TORCH_LIBRARY_IMPL(fa_attention, CPU, m) {
  m.impl("forward", &forward_impl);
  m.impl("backward", &backward_impl);
}

#ifdef FA_TORCH_CUDA
TORCH_LIBRARY_IMPL(fa_attention, CUDA, m) {
  m.impl("forward", &forward_impl);
  m.impl("backward", &backward_impl);
}
#endif

TORCH_LIBRARY_IMPL(fa_attention, Meta, m) {
  m.impl("forward", &forward_meta);
  m.impl("backward", &backward_meta);
}

TORCH_LIBRARY_IMPL(fa_attention, Autograd, m) { m.impl("forward", &forward_autograd); }
