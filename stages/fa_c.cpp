// The C ABI: every stage behind plain C functions. Exceptions stop here and become an
// error code plus a thread-local message (fa_c_entry.h). Stage 13's entries: fa_c_masked.cpp.
#include "fa_c.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "decode.h"
#include "errors.h"
#include "fa_c_entry.h"
#include "options.h"
#include "stage_list.h"
#ifdef FA_HAVE_CUDA
#include "scratch.h"
#endif

// The calling thread's last error (fa_c_entry.h): the message of its last failed call.
namespace {
thread_local std::string last_error;
}  // namespace
std::string& fa::c_abi::last_error_of_this_thread() { return last_error; }

namespace {

using fa::c_abi::guarded;
using fa::c_abi::require;
using fa::c_abi::require_gpu;

// The stage a call names (its full name or a unique prefix).
const fa::StageInfo& stage_named(const char* name) {
  require(name != nullptr, "stage name is NULL");
  return fa::find_stage(name);
}

fa::Problem to_problem(const fa::StageInfo& s, const fa_problem* p) { return fa::c_abi::problem_of(p, s.name); }

// The caller's dtype is read as the int it was passed as, before it becomes an enum: a
// value outside the enum (−1, 7) must not be loaded as a fa_dtype (undefined behaviour).
fa::Dtype to_dtype(const fa::StageInfo& s, const fa_dtype* dtype) {
  static_assert(sizeof(fa_dtype) == sizeof(int32_t), "fa_dtype is passed as a 32-bit int");
  int32_t t = 0;
  std::memcpy(&t, dtype, sizeof t);
  if (t < 0 || t > 2)
    throw std::invalid_argument(s.name + ": dtype = " + std::to_string(t) +
                                " is not FA_F32 (0), FA_F16 (1) or FA_BF16 (2)");
  return fa::Dtype(t);
}

// Validates everything a call needs before the stage touches a buffer.
void prepare(const fa::StageInfo& s, const fa::Problem& p, fa::Dtype t) {
  p.validate(s.name);
  require(s.supports(t), s.name + ": dtype " + fa::dtype_name(t) + " is not supported by this stage");
  require(s.supports_head_dim(p.head_dim),
          s.name + ": head_dim = " + std::to_string(p.head_dim) + " is not supported by this stage");
  if (s.is_gpu && !fa::gpu_available())
    throw fa::NoCudaDevice(s.name + ": no CUDA device is available on this machine (a GPU stage)");
}

// Runs a stage's entry point so that whatever it throws names the stage called (a stage that
// delegates, as 09's forward does to 08's, reports under its own name first).
template <typename Fn>
void run_stage(const fa::StageInfo& s, Fn&& fn) {
  const auto named = [&](const char* what) {
    const std::string m = what;
    return m.compare(0, s.name.size(), s.name) == 0 ? m : s.name + ": " + m;
  };
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(named(e.what()));
  } catch (const std::exception& e) {
    throw std::runtime_error(named(e.what()));
  }
}


// One tensor argument: its name, pointer, and element count under the problem.
struct Buffer {
  const char* name;
  const void* ptr;
  int64_t elems;
};

// Every non-empty tensor needs a pointer; an empty one (seq_k = 0: K, V) may be NULL.
void require_buffers(const fa::StageInfo& s, std::initializer_list<Buffer> buffers) {
  for (const Buffer& b : buffers)
    require(b.ptr != nullptr || b.elems == 0,
            s.name + ": tensor " + b.name + " is NULL (it has " + std::to_string(b.elems) + " elements)");
}

// ---- decoding (stage 14): its own problem, not a stage of the list ----

constexpr const char* kDecodeStage = fa::stage14::kStageName;

// The decode problem with its lengths: a host array, or none (a device call, whose lengths
// stay on the device: every sequence counts as full, which is what the split rule and the
// refusals then see).
fa::DecodeProblem to_decode_problem(const fa_decode_problem* p, const int32_t* host_seqlens) {
  const std::string who = kDecodeStage;
  require(p != nullptr, who + ": problem pointer is NULL");
  fa::DecodeProblem d;
  d.batch = p->batch;
  d.heads = p->heads;
  d.kv_heads = p->kv_heads;
  d.head_dim = p->head_dim;
  d.q_len = p->q_len;
  if (p->causal != 0 && p->causal != 1)
    throw std::invalid_argument(who + ": causal = " + std::to_string(p->causal) + " is not 0 or 1");
  d.causal = p->causal == 1;
  d.scale = p->scale;
  d.capacity = p->capacity;
  d.block_size = p->block_size;
  d.num_blocks = p->num_blocks;
  d.blocks_per_seq = p->blocks_per_seq;
  require(p->batch >= 0, who + ": batch = " + std::to_string(p->batch) + " is not allowed (allowed: 1 or more)");
  if (host_seqlens != nullptr) {
    d.cache_seqlens.assign(host_seqlens, host_seqlens + p->batch);
  } else {
    const int64_t full = std::min<int64_t>(std::max<int64_t>(d.seq_capacity(), 0), INT32_MAX);
    d.cache_seqlens.assign(size_t(p->batch), int(full));
  }
  d.validate(who);
  return d;
}

// The decode calls' dtype, read as the int it was passed as (to_dtype's reason).
fa::Dtype to_decode_dtype(const fa_dtype* dtype) {
  int32_t t = 0;
  std::memcpy(&t, dtype, sizeof t);
  if (t < 0 || t > 2)
    throw std::invalid_argument(std::string(kDecodeStage) + ": dtype = " + std::to_string(t) +
                                " is not FA_F32 (0), FA_F16 (1) or FA_BF16 (2)");
  return fa::Dtype(t);
}

// Every non-empty host tensor of a decode call needs a pointer.
void require_decode_buffers(std::initializer_list<Buffer> buffers) {
  for (const Buffer& b : buffers)
    require(b.ptr != nullptr || b.elems == 0, std::string(kDecodeStage) + ": tensor " + b.name + " is NULL (it has " +
                                                  std::to_string(b.elems) + " elements)");
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
    const fa::StageInfo& s = stage_named(stage);
    const fa::Problem q = to_problem(s, p);
    const fa::Dtype t = to_dtype(s, &dtype);
    prepare(s, q, t);
    require_buffers(s, {{"Q", Q, q.q_elems()}, {"K", K, q.kv_elems()}, {"V", V, q.kv_elems()},
                        {"O", O, q.q_elems()}, {"L", L, q.l_elems()}});
    if (q.q_elems() > 0)  // no query row: nothing to write
      run_stage(s, [&] { s.forward(q, t, Q, K, V, O, L); });
  });
}

int fa_forward(const char* stage, const fa_problem* p, const float* Q, const float* K,
               const float* V, float* O, float* L) {
  // A stage that does not compute in fp32 (08, 09) runs in its first dtype.
  fa::Dtype t = fa::Dtype::F32;
  const int rc = guarded([&] {
    t = stage_named(stage).dtypes.front();
  });
  return rc != FA_OK ? rc : fa_forward_dtype(stage, p, fa_dtype(int(t)), Q, K, V, O, L);
}

int fa_backward_dtype(const char* stage, const fa_problem* p, fa_dtype dtype, const float* Q,
                      const float* K, const float* V, const float* O, const float* L,
                      const float* dO, float* dQ, float* dK, float* dV) {
  return guarded([&] {
    const fa::StageInfo& s = stage_named(stage);
    const fa::Problem q = to_problem(s, p);
    const fa::Dtype t = to_dtype(s, &dtype);
    prepare(s, q, t);
    require(s.has_backward(), s.name + ": this stage has no backward pass");
    const int64_t nq = q.q_elems(), nkv = q.kv_elems();
    require_buffers(s, {{"Q", Q, nq}, {"K", K, nkv}, {"V", V, nkv}, {"O", O, nq}, {"L", L, q.l_elems()},
                        {"dO", dO, nq}, {"dQ", dQ, nq}, {"dK", dK, nkv}, {"dV", dV, nkv}});
    if (nq > 0) {
      run_stage(s, [&] { s.backward(q, t, Q, K, V, O, L, dO, dQ, dK, dV); });
    } else {  // no query row: no gradient reaches a key
      std::fill_n(dK, nkv, 0.0f);
      std::fill_n(dV, nkv, 0.0f);
    }
  });
}

int fa_backward(const char* stage, const fa_problem* p, const float* Q, const float* K,
                const float* V, const float* O, const float* L, const float* dO, float* dQ,
                float* dK, float* dV) {
  fa::Dtype t = fa::Dtype::F32;
  const int rc = guarded([&] {
    t = stage_named(stage).dtypes.front();
  });
  return rc != FA_OK ? rc
                     : fa_backward_dtype(stage, p, fa_dtype(int(t)), Q, K, V, O, L, dO, dQ, dK, dV);
}

int fa_forward_device(const char* stage, const fa_problem* p, fa_dtype dtype, const void* Q,
                      const void* K, const void* V, void* O, float* L, void* stream) {
  return guarded([&] {
    const fa::StageInfo& s = stage_named(stage);
    const fa::Problem q = to_problem(s, p);
    const fa::Dtype t = to_dtype(s, &dtype);
    prepare(s, q, t);
    require(bool(s.forward_device), s.name + ": not a GPU stage (use fa_forward with host buffers)");
    require_buffers(s, {{"Q", Q, q.q_elems()}, {"K", K, q.kv_elems()}, {"V", V, q.kv_elems()},
                        {"O", O, q.q_elems()}, {"L", L, q.l_elems()}});
    if (q.q_elems() > 0)  // no query row: nothing to write (and no grid of 2^30 empty heads)
      run_stage(s, [&] { s.forward_device(q, t, Q, K, V, O, L, stream); });
  });
}

int fa_backward_device(const char* stage, const fa_problem* p, fa_dtype dtype, const void* Q,
                       const void* K, const void* V, const void* O, const float* L,
                       const void* dO, void* dQ, void* dK, void* dV, void* stream) {
  return guarded([&] {
    const fa::StageInfo& s = stage_named(stage);
    const fa::Problem q = to_problem(s, p);
    const fa::Dtype t = to_dtype(s, &dtype);
    prepare(s, q, t);
    require(bool(s.backward_device), s.name + ": has no GPU backward");
    const int64_t nq = q.q_elems(), nkv = q.kv_elems();
    require_buffers(s, {{"Q", Q, nq}, {"K", K, nkv}, {"V", V, nkv}, {"O", O, nq}, {"L", L, q.l_elems()},
                        {"dO", dO, nq}, {"dQ", dQ, nq}, {"dK", dK, nkv}, {"dV", dV, nkv}});
    run_stage(s, [&] { s.backward_device(q, t, Q, K, V, O, L, dO, dQ, dK, dV, stream); });
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

int fa_set_scratch_allocator(fa_allocate_fn allocate, fa_release_fn release, void* context) {
  return guarded([&] {
    require((allocate == nullptr) == (release == nullptr),
            "fa_set_scratch_allocator: allocate and release must both be set, or both NULL (the default pool)");
#ifdef FA_HAVE_CUDA
    fa::set_scratch_allocator({allocate, release, context});
#else
    (void)context;
#endif
  });
}

int fa_decode(const fa_decode_problem* p, const int32_t* cache_seqlens, const float* Q, const float* K_cache,
              const float* V_cache, const int32_t* block_table, float* O, float* L) {
  return guarded([&] {
    require(p == nullptr || p->batch <= 0 || cache_seqlens != nullptr,
            std::string(kDecodeStage) + ": cache_seqlens is NULL");
    const fa::DecodeProblem d = to_decode_problem(p, cache_seqlens);
    require_decode_buffers({{"Q", Q, d.q_elems()}, {"K_cache", K_cache, d.cache_elems()},
                               {"V_cache", V_cache, d.cache_elems()}, {"O", O, d.q_elems()}, {"L", L, d.l_elems()}});
    fa::stage14::decode_cpu(d, Q, K_cache, V_cache, d.paged() ? block_table : nullptr, O, L);
  });
}

int fa_append_kv(const fa_decode_problem* p, const int32_t* cache_seqlens, const float* K_new, const float* V_new,
                 float* K_cache, float* V_cache, const int32_t* block_table) {
  return guarded([&] {
    require(p == nullptr || p->batch <= 0 || cache_seqlens != nullptr,
            std::string(kDecodeStage) + ": cache_seqlens is NULL");
    const fa::DecodeProblem d = to_decode_problem(p, cache_seqlens);
    require_decode_buffers({{"K_new", K_new, d.new_kv_elems()}, {"V_new", V_new, d.new_kv_elems()},
                               {"K_cache", K_cache, d.cache_elems()}, {"V_cache", V_cache, d.cache_elems()}});
    fa::stage14::append_kv_cpu(d, K_new, V_new, K_cache, V_cache, d.paged() ? block_table : nullptr);
  });
}

int fa_decode_device(const fa_decode_problem* p, fa_dtype dtype, const int32_t* cache_seqlens, const void* Q,
                     const void* K_cache, const void* V_cache, const int32_t* block_table, void* O, float* L,
                     void* stream) {
  return guarded([&] {
    const fa::DecodeProblem d = to_decode_problem(p, nullptr);
    const fa::Dtype t = to_decode_dtype(&dtype);
#ifdef FA_HAVE_CUDA
    fa::stage14::require_gpu_request(d, t, {});
    require_gpu(kDecodeStage);
    fa::stage14::decode_device(d, t, Q, K_cache, V_cache, cache_seqlens, d.paged() ? block_table : nullptr, O, L,
                               stream);
#else
    (void)t, (void)cache_seqlens, (void)Q, (void)K_cache, (void)V_cache, (void)block_table, (void)O, (void)L,
        (void)stream;
    throw std::runtime_error(std::string(kDecodeStage) + ": this build has no CUDA (fa_decode takes host buffers)");
#endif
  });
}

int fa_append_kv_device(const fa_decode_problem* p, fa_dtype dtype, const int32_t* cache_seqlens, const void* K_new,
                        const void* V_new, void* K_cache, void* V_cache, const int32_t* block_table, void* stream) {
  return guarded([&] {
    const fa::DecodeProblem d = to_decode_problem(p, nullptr);
    const fa::Dtype t = to_decode_dtype(&dtype);
#ifdef FA_HAVE_CUDA
    require_gpu(kDecodeStage);
    fa::stage14::append_kv_device(d, t, K_new, V_new, K_cache, V_cache, cache_seqlens,
                                  d.paged() ? block_table : nullptr, stream);
#else
    (void)t, (void)cache_seqlens, (void)K_new, (void)V_new, (void)K_cache, (void)V_cache, (void)block_table,
        (void)stream;
    throw std::runtime_error(std::string(kDecodeStage) +
                             ": this build has no CUDA (fa_append_kv takes host buffers)");
#endif
  });
}

}  // extern "C"
