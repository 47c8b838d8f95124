// The C ABI's entries of stage 13 (masks and score modifiers), which is not a stage of the
// list: its problem is a Problem plus Modifiers (fa_modifiers), on host fp32 buffers (the CPU
// step) or device f16/bf16 buffers (the Hopper kernels).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "errors.h"
#include "fa_c.h"
#include "fa_c_entry.h"
#include "masks.h"
#include "modifiers.h"
#include "stage_list.h"
#ifdef FA_HAVE_CUDA
#include "masked_hopper.h"
#endif

namespace {

using fa::c_abi::guarded;
using fa::c_abi::require;
using fa::c_abi::require_gpu;

constexpr const char* kMaskedStage = fa::stage13::kStageName;

// The problem of a stage-13 call, checked by Problem's own rule.
fa::Problem to_masked_problem(const fa_problem* p) {
  const fa::Problem q = fa::c_abi::problem_of(p, kMaskedStage);
  q.validate(kMaskedStage);
  return q;
}

// The C struct as stage 13's Modifiers. Here only what C adds is checked (the struct's size,
// flags, counts and pointers); the values are checked by Modifiers::validate, the stage's own
// rule, so the C ABI refuses exactly what the stage refuses, with its messages.
fa::Modifiers to_modifiers(const fa::Problem& p, const fa_modifiers* c) {
  const std::string who = kMaskedStage;
  require(c != nullptr, who + ": modifiers pointer is NULL (a zeroed fa_modifiers with its size set is none)");
  require(c->size == sizeof(fa_modifiers), who + ": fa_modifiers.size = " + std::to_string(c->size) +
                                               " is not sizeof(fa_modifiers) = " + std::to_string(sizeof(fa_modifiers)) +
                                               " (set it to sizeof(fa_modifiers))");
  const auto flag = [&](int32_t v, const char* name) {
    require(v == 0 || v == 1, who + ": " + name + " = " + std::to_string(v) + " is not 0 or 1");
    return v == 1;
  };
  // An array of `n` entries: n >= 0, and a pointer when n > 0.
  const auto array = [&](const void* ptr, int32_t n, const char* name, const char* count) {
    require(n >= 0, who + ": " + count + " = " + std::to_string(n) + " is negative (0: no " + name + ")");
    require(n == 0 || ptr != nullptr, who + ": " + name + " is NULL but " + count + " = " + std::to_string(n));
  };
  fa::Modifiers m;
  if (flag(c->has_window_left, "has_window_left")) m.window_left = c->window_left;
  if (flag(c->has_window_right, "has_window_right")) m.window_right = c->window_right;
  m.softcap = c->softcap;
  array(c->alibi_slopes, c->n_alibi_slopes, "alibi_slopes", "n_alibi_slopes");
  m.alibi_slopes.assign(c->alibi_slopes, c->alibi_slopes + c->n_alibi_slopes);
  array(c->sinks, c->n_sinks, "sinks", "n_sinks");
  m.sinks.assign(c->sinks, c->sinks + c->n_sinks);
  array(c->cu_seqlens_q, c->n_cu_seqlens, "cu_seqlens_q", "n_cu_seqlens");
  array(c->cu_seqlens_k, c->n_cu_seqlens, "cu_seqlens_k", "n_cu_seqlens");
  m.cu_seqlens_q.assign(c->cu_seqlens_q, c->cu_seqlens_q + c->n_cu_seqlens);
  m.cu_seqlens_k.assign(c->cu_seqlens_k, c->cu_seqlens_k + c->n_cu_seqlens);
  m.validate(p, who);
  return m;
}

// The device entries' dtype: the Hopper kernels take f16 and bf16.
fa::Dtype to_masked_dtype(const fa_dtype* dtype) {
  int32_t t = 0;
  std::memcpy(&t, dtype, sizeof t);
  require(t == FA_F16 || t == FA_BF16, std::string(kMaskedStage) + ": dtype = " + std::to_string(t) +
                                           " is not allowed on device buffers (FA_F16 (1) or FA_BF16 (2))");
  return fa::Dtype(t);
}

}  // namespace

extern "C" {

int fa_forward_masked(const fa_problem* p, const fa_modifiers* m, const float* Q, const float* K, const float* V,
                      float* O, float* L) {
  return guarded([&] {
    const fa::Problem q = to_masked_problem(p);
    const fa::Modifiers mods = to_modifiers(q, m);
    fa::require_forward_buffers(kMaskedStage, q, Q, K, V, O, L);
    if (q.q_elems() > 0)  // no query row: nothing to write
      fa::stage13::forward(q, mods, fa::stage13::current_config(), Q, K, V, O, L);
  });
}

int fa_backward_masked(const fa_problem* p, const fa_modifiers* m, const float* Q, const float* K, const float* V,
                       const float* O, const float* L, const float* dO, float* dQ, float* dK, float* dV,
                       float* dsinks) {
  return guarded([&] {
    const fa::Problem q = to_masked_problem(p);
    const fa::Modifiers mods = to_modifiers(q, m);
    const int64_t nq = q.q_elems(), nkv = q.kv_elems();
    fa::require_backward_buffers(kMaskedStage, q, Q, K, V, O, L, dO, dQ, dK, dV);
    require(mods.sinks.empty() || dsinks != nullptr,
            std::string(kMaskedStage) + ": dsinks is NULL, but the modifiers have sinks (their gradient goes there)");
    if (nq > 0) {
      fa::stage13::backward(q, mods, fa::stage13::current_config(), Q, K, V, O, L, dO, dQ, dK, dV,
                            mods.sinks.empty() ? nullptr : dsinks);
    } else {  // no query row: no gradient reaches a key or a sink
      std::fill_n(dK, nkv, 0.0f);
      std::fill_n(dV, nkv, 0.0f);
      std::fill_n(dsinks, mods.sinks.size(), 0.0f);
    }
  });
}

int fa_forward_masked_device(const fa_problem* p, const fa_modifiers* m, fa_dtype dtype, const void* Q, const void* K,
                             const void* V, void* O, float* L, void* stream) {
  return guarded([&] {
    const fa::Problem q = to_masked_problem(p);
    const fa::Modifiers mods = to_modifiers(q, m);
    const fa::Dtype t = to_masked_dtype(&dtype);
#ifdef FA_HAVE_CUDA
    require_gpu(kMaskedStage);
    fa::stage13::forward_hopper(q, mods, t, Q, K, V, O, L, static_cast<cudaStream_t>(stream));
#else
    (void)t, (void)Q, (void)K, (void)V, (void)O, (void)L, (void)stream;
    throw std::runtime_error(std::string(kMaskedStage) +
                             ": this build has no CUDA (fa_forward_masked takes host buffers)");
#endif
  });
}

int fa_backward_masked_device(const fa_problem* p, const fa_modifiers* m, fa_dtype dtype, const void* Q,
                              const void* K, const void* V, const void* O, const float* L, const void* dO, void* dQ,
                              void* dK, void* dV, float* dsinks, void* stream) {
  return guarded([&] {
    const fa::Problem q = to_masked_problem(p);
    const fa::Modifiers mods = to_modifiers(q, m);
    const fa::Dtype t = to_masked_dtype(&dtype);
#ifdef FA_HAVE_CUDA
    require_gpu(kMaskedStage);
    fa::stage13::backward_hopper(q, mods, t, Q, K, V, O, L, dO, dQ, dK, dV, dsinks, static_cast<cudaStream_t>(stream));
#else
    (void)t, (void)Q, (void)K, (void)V, (void)O, (void)L, (void)dO, (void)dQ, (void)dK, (void)dV, (void)dsinks,
        (void)stream;
    throw std::runtime_error(std::string(kMaskedStage) +
                             ": this build has no CUDA (fa_backward_masked takes host buffers)");
#endif
  });
}

}  // extern "C"
