// The C ABI: every stage behind plain C functions. Exceptions stop here and become an
// error code plus a thread-local message.
#include "fa_c.h"

#include <stdexcept>
#include <string>

#include "options.h"
#include "stage_list.h"

namespace {

thread_local std::string last_error;

fa::Problem to_problem(const fa_problem* p) {
  if (!p) throw std::invalid_argument("problem pointer is NULL");
  fa::Problem q;
  q.batch = p->batch;
  q.heads = p->heads;
  q.kv_heads = p->kv_heads;
  q.seq_q = p->seq_q;
  q.seq_k = p->seq_k;
  q.head_dim = p->head_dim;
  if (p->causal != 0 && p->causal != 1)
    throw std::invalid_argument("causal = " + std::to_string(p->causal) + " is not 0 or 1");
  q.causal = p->causal == 1;
  q.scale = p->scale;
  return q;
}

fa::Dtype to_dtype(int t) {
  if (t < 0 || t > 2) throw std::invalid_argument("dtype = " + std::to_string(t) + " is not FA_F32, FA_F16 or FA_BF16");
  return fa::Dtype(t);
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// Validates everything a call needs before the stage touches a buffer.
const fa::StageInfo& prepare(const char* name, const fa::Problem& p, fa::Dtype t) {
  require(name != nullptr, "stage name is NULL");
  const fa::StageInfo& s = fa::find_stage(name);
  p.validate(s.name);
  require(s.supports(t), s.name + ": dtype " + fa::dtype_name(t) + " is not supported by this stage");
  require(s.supports_head_dim(p.head_dim),
          s.name + ": head_dim = " + std::to_string(p.head_dim) + " is not supported by this stage");
  return s;
}

template <typename Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    last_error.clear();
    return FA_OK;
  } catch (const std::invalid_argument& e) {
    last_error = e.what();
    return FA_ERR_INVALID;
  } catch (const std::exception& e) {
    last_error = e.what();
    return FA_ERR_RUNTIME;
  } catch (...) {
    last_error = "unknown error";
    return FA_ERR_RUNTIME;
  }
}

void require_buffers(std::initializer_list<const void*> ptrs, bool empty_ok) {
  if (empty_ok) return;
  for (const void* ptr : ptrs) require(ptr != nullptr, "a tensor pointer is NULL");
}

}  // namespace

extern "C" {

int fa_stage_count(void) { return int(fa::all_stages().size()); }

const char* fa_stage_name(int index) {
  const auto& all = fa::all_stages();
  return index >= 0 && index < int(all.size()) ? all[size_t(index)].name.c_str() : nullptr;
}

int fa_stage_has_backward(const char* stage) {
  int r = -1;
  guarded([&] { r = fa::find_stage(stage ? stage : "").has_backward() ? 1 : 0; });
  return r;
}

int fa_stage_is_gpu(const char* stage) {
  int r = -1;
  guarded([&] { r = fa::find_stage(stage ? stage : "").is_gpu ? 1 : 0; });
  return r;
}

const char* fa_last_error(void) { return last_error.c_str(); }

int fa_forward_dtype(const char* stage, const fa_problem* p, fa_dtype dtype, const float* Q,
                     const float* K, const float* V, float* O, float* L) {
  return guarded([&] {
    const fa::Problem q = to_problem(p);
    const auto& s = prepare(stage, q, to_dtype(dtype));
    require_buffers({Q, K, V, O, L}, q.q_elems() == 0 && q.kv_elems() == 0);
    s.forward(q, fa::Dtype(dtype), Q, K, V, O, L);
  });
}

int fa_forward(const char* stage, const fa_problem* p, const float* Q, const float* K,
               const float* V, float* O, float* L) {
  return guarded([&] {
    require(stage != nullptr, "stage name is NULL");
    // A stage that does not compute in fp32 (08, 09) runs in its first dtype.
    const fa::Dtype t = fa::find_stage(stage).dtypes.front();
    const int rc = fa_forward_dtype(stage, p, fa_dtype(int(t)), Q, K, V, O, L);
    if (rc != FA_OK) throw std::runtime_error(last_error);
  });
}

int fa_backward_dtype(const char* stage, const fa_problem* p, fa_dtype dtype, const float* Q,
                      const float* K, const float* V, const float* O, const float* L,
                      const float* dO, float* dQ, float* dK, float* dV) {
  return guarded([&] {
    const fa::Problem q = to_problem(p);
    const auto& s = prepare(stage, q, to_dtype(dtype));
    require(s.has_backward(), s.name + ": this stage has no backward pass");
    require_buffers({Q, K, V, O, L, dO, dQ, dK, dV}, q.q_elems() == 0 && q.kv_elems() == 0);
    s.backward(q, fa::Dtype(dtype), Q, K, V, O, L, dO, dQ, dK, dV);
  });
}

int fa_backward(const char* stage, const fa_problem* p, const float* Q, const float* K,
                const float* V, const float* O, const float* L, const float* dO, float* dQ,
                float* dK, float* dV) {
  return guarded([&] {
    require(stage != nullptr, "stage name is NULL");
    const fa::Dtype t = fa::find_stage(stage).dtypes.front();
    const int rc = fa_backward_dtype(stage, p, fa_dtype(int(t)), Q, K, V, O, L, dO, dQ, dK, dV);
    if (rc != FA_OK) throw std::runtime_error(last_error);
  });
}

int fa_forward_device(const char* stage, const fa_problem* p, fa_dtype dtype, const void* Q,
                      const void* K, const void* V, void* O, float* L, void* stream) {
  return guarded([&] {
    const fa::Problem q = to_problem(p);
    const auto& s = prepare(stage, q, to_dtype(dtype));
    require(bool(s.forward_device), s.name + ": not a GPU stage (use fa_forward with host buffers)");
    require_buffers({Q, K, V, O, L}, q.q_elems() == 0 && q.kv_elems() == 0);
    s.forward_device(q, fa::Dtype(dtype), Q, K, V, O, L, stream);
  });
}

int fa_backward_device(const char* stage, const fa_problem* p, fa_dtype dtype, const void* Q,
                       const void* K, const void* V, const void* O, const float* L,
                       const void* dO, void* dQ, void* dK, void* dV, void* stream) {
  return guarded([&] {
    const fa::Problem q = to_problem(p);
    const auto& s = prepare(stage, q, to_dtype(dtype));
    require(bool(s.backward_device), s.name + ": has no GPU backward");
    require_buffers({Q, K, V, O, L, dO, dQ, dK, dV}, q.q_elems() == 0 && q.kv_elems() == 0);
    s.backward_device(q, fa::Dtype(dtype), Q, K, V, O, L, dO, dQ, dK, dV, stream);
  });
}

int fa_set_option(const char* stage, const char* name, int64_t value) {
  return guarded([&] {
    require(stage != nullptr && name != nullptr, "stage or option name is NULL");
    const auto& s = fa::find_stage(stage);
    require(bool(s.set_option), s.name + ": has no options");
    s.set_option(name, value);
  });
}

int fa_get_counter(const char* stage, const char* name, int64_t* value) {
  return guarded([&] {
    require(stage != nullptr && name != nullptr && value != nullptr, "a pointer argument is NULL");
    const auto& s = fa::find_stage(stage);
    require(bool(s.get_counter), s.name + ": has no counters");
    *value = s.get_counter(name);
  });
}

const char* fa_stage_options(const char* stage) {
  thread_local std::string text;
  const char* out = nullptr;
  guarded([&] {
    require(stage != nullptr, "stage name is NULL");
    const auto& s = fa::find_stage(stage);
    text = s.options != nullptr ? s.options->describe() : std::string();
    out = text.c_str();
  });
  return out;
}

}  // extern "C"
