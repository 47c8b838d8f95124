// Stage 14 (decoding) as native PyTorch operators: torch.ops.fa_attention.decode / append_kv.
//
//   decode(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale)  -> (O, L)
//   append_kv(k_new, v_new, k_cache!, v_cache!, cache_seqlens, block_table) -> ()
//
// Layouts (common/decode_problem.h, docs/design.md §12):
//   q, O           [batch, heads, q_len, d]        L float32 [batch, heads, q_len]
//   k_new, v_new   [batch, kv_heads, q_len, d]
//   contiguous     k_cache, v_cache [batch, kv_heads, capacity, d]          (block_table None)
//   paged          k_cache, v_cache [num_blocks, kv_heads, block_size, d] and an int32
//                  block_table [batch, blocks_per_seq] on the caches' device
//   cache_seqlens  int32 [batch] on the caches' device: each sequence's tokens, the new ones
//                  included (token i of sequence b sees keys j <= len_b - q_len + i)
// append_kv writes the caches in place (the schema says so: Tensor(a!), Tensor(b!)).
// Registered like forward and backward (fa_torch.cpp), through the C ABI's decode entries:
//   CUDA  float16, bfloat16 (stage 14's CUDA step 14e and its append kernel) on torch's
//         current stream; the split-KV partials come from torch's caching allocator (the
//         scratch allocator fa_torch.cpp installs). Lengths and table stay on the device:
//         nothing is read back, so a CUDA graph can capture both ops;
//   CPU   float32 (stage 14's CPU step, split-KV over threads; the lengths and the table are
//         checked on the host before anything is written);
//   Meta  shapes only, for torch.compile;
//   ADInplaceOrView  append_kv bumps the caches' version counters, as an in-place op must.
// No autograd kernel: decoding is inference.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#ifdef FA_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "fa_c.h"
#include "fa_torch.h"

// A named namespace, not an anonymous one: the op's three files are compiled as one translation
// unit (CMakeLists.txt), where fa_torch.cpp's names and this file's would collide.
namespace fa_torch::decode {

using at::Tensor;
using Decoded = std::tuple<Tensor, Tensor>;
using Table = std::optional<Tensor>;

int32_t narrow(int64_t n, const char* what) {
  TORCH_CHECK_VALUE(n >= 0 && n <= INT32_MAX, "decode: ", what, " = ", n, " exceeds 2^31 - 1");
  return int32_t(n);
}

// The caches, the lengths and the table against `rows` ([batch, heads or kv_heads, q_len, d]:
// q, or k_new): ranks, shapes, dtypes and devices that agree. On symbolic sizes, so the Meta
// kernels check the same. The stage checks the rest (q_len, head dims, lengths, the table).
void check_cache(const char* who, const char* rows_name, const Tensor& rows, const Tensor& k_cache,
                 const Tensor& v_cache, const Tensor& seqlens, const Table& table) {
  TORCH_CHECK_VALUE(rows.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4, who, ": ", rows_name,
                    ", k_cache, v_cache must have 4 dimensions; got shapes ", rows.sym_sizes(), ", ",
                    k_cache.sym_sizes(), ", ", v_cache.sym_sizes());
  TORCH_CHECK_VALUE(k_cache.sym_sizes() == v_cache.sym_sizes(), who, ": k_cache ", k_cache.sym_sizes(),
                    " and v_cache ", v_cache.sym_sizes(), " must have the same shape");
  TORCH_CHECK_VALUE(k_cache.sym_size(3) == rows.sym_size(3), who, ": head_dim of k_cache ", k_cache.sym_sizes(),
                    " and of ", rows_name, " ", rows.sym_sizes(), " differ");
  TORCH_CHECK_VALUE(rows.scalar_type() == k_cache.scalar_type() && rows.scalar_type() == v_cache.scalar_type(), who,
                    ": ", rows_name, ", k_cache, v_cache of different dtypes (", dtype_name(rows.scalar_type()), ", ",
                    dtype_name(k_cache.scalar_type()), ", ", dtype_name(v_cache.scalar_type()), ")");
  TORCH_CHECK_VALUE(rows.device() == k_cache.device() && rows.device() == v_cache.device(), who, ": ", rows_name,
                    ", k_cache, v_cache on different devices (", rows.device(), ", ", k_cache.device(), ", ",
                    v_cache.device(), ")");
  const auto batch = rows.sym_size(0);
  TORCH_CHECK_VALUE(seqlens.dim() == 1 && seqlens.sym_size(0) == batch && seqlens.scalar_type() == at::kInt, who,
                    ": cache_seqlens must be torch.int32 [", batch, "] (one length per sequence); got ",
                    dtype_name(seqlens.scalar_type()), " ", seqlens.sym_sizes());
  TORCH_CHECK_VALUE(seqlens.device() == rows.device(), who, ": cache_seqlens is on ", seqlens.device(),
                    "; it must be on ", rows.device(), " with the caches");
  if (table) {
    TORCH_CHECK_VALUE(table->dim() == 2 && table->sym_size(0) == batch && table->scalar_type() == at::kInt, who,
                      ": block_table must be torch.int32 [", batch, ", blocks_per_seq]; got ",
                      dtype_name(table->scalar_type()), " ", table->sym_sizes());
    TORCH_CHECK_VALUE(table->device() == rows.device(), who, ": block_table is on ", table->device(),
                      "; it must be on ", rows.device(), " with the caches");
  } else {
    TORCH_CHECK_VALUE(k_cache.sym_size(0) == batch, who, ": a contiguous k_cache ", k_cache.sym_sizes(),
                      " must be [", batch, ", kv_heads, capacity, head_dim] (or pass a block_table for a paged one)");
  }
}

// The dtypes each device's entry points take, and caches the op can address in place.
void check_device(const char* who, const Tensor& rows, const Tensor& k_cache, const Tensor& v_cache) {
  const auto t = rows.scalar_type();
  if (rows.is_cuda()) {
    TORCH_CHECK_VALUE(t == at::kHalf || t == at::kBFloat16, who, ": dtype ", dtype_name(t),
                      " is not supported on CUDA tensors (float16, bfloat16: stage 14's CUDA step)");
  } else {
    TORCH_CHECK_VALUE(rows.is_cpu(), who, ": device ", rows.device(), " is not supported (cpu, cuda)");
    TORCH_CHECK_VALUE(t == at::kFloat, who, ": dtype ", dtype_name(t),
                      " is not supported on CPU tensors (float32: stage 14's CPU step)");
  }
  TORCH_CHECK_VALUE(k_cache.is_contiguous() && v_cache.is_contiguous(), who,
                    ": k_cache and v_cache must be contiguous (the op addresses them in place)");
}

fa_decode_problem problem_of(int64_t batch, int64_t heads, int64_t q_len, const Tensor& k_cache, const Table& table,
                             bool causal, double scale) {
  fa_decode_problem p{};
  p.batch = narrow(batch, "batch");
  p.heads = narrow(heads, "heads");
  p.kv_heads = narrow(k_cache.size(1), "kv_heads");
  p.head_dim = narrow(k_cache.size(3), "head_dim");
  p.q_len = narrow(q_len, "q_len");
  p.causal = causal ? 1 : 0;
  p.scale = float(scale);
  if (table) {
    p.block_size = narrow(k_cache.size(2), "block_size");
    p.num_blocks = narrow(k_cache.size(0), "num_blocks");
    p.blocks_per_seq = narrow(table->size(1), "blocks_per_seq");
  } else {
    p.capacity = narrow(k_cache.size(2), "capacity");
  }
  return p;
}

const int32_t* ints(const Tensor& t) { return static_cast<const int32_t*>(address(t)); }

// ---- the CPU and CUDA kernels: one body each, the device decides the entry point ----

Decoded decode_impl(const Tensor& q_in, const Tensor& k_cache, const Tensor& v_cache, const Tensor& seqlens_in,
                    const Table& table_in, bool causal, double scale) {
  check_cache("decode", "q", q_in, k_cache, v_cache, seqlens_in, table_in);
  check_device("decode", q_in, k_cache, v_cache);
  const Tensor q = q_in.contiguous(), seqlens = seqlens_in.contiguous();
  const Table table = table_in ? Table(table_in->contiguous()) : std::nullopt;
  const fa_decode_problem p = problem_of(q.size(0), q.size(1), q.size(2), k_cache, table, causal, scale);
  Tensor o = at::empty_like(q, at::MemoryFormat::Contiguous);                                 // [b, h, q_len, d]
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));  // [b, h, q_len]
  const int32_t* block_table = table ? ints(*table) : nullptr;
  if (q.is_cpu()) {
    check_status(fa_decode(&p, ints(seqlens), floats(q), floats(k_cache), floats(v_cache), block_table, floats(o),
                           floats(lse)));
    return {o, lse};
  }
#ifdef FA_TORCH_CUDA
  const c10::cuda::CUDAGuard device(q.device());
  void* stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  check_status(fa_decode_device(&p, dtype_code(q.scalar_type()), ints(seqlens), address(q), address(k_cache),
                                address(v_cache), block_table, address(o), floats(lse), stream));
#else
  TORCH_CHECK(false, "decode: this build of the op has no CUDA kernels (device ", q.device(), ")");
#endif
  return {o, lse};
}

void append_kv_impl(const Tensor& k_new_in, const Tensor& v_new_in, Tensor& k_cache, Tensor& v_cache,
                    const Tensor& seqlens_in, const Table& table_in) {
  check_cache("append_kv", "k_new", k_new_in, k_cache, v_cache, seqlens_in, table_in);
  TORCH_CHECK_VALUE(v_new_in.sym_sizes() == k_new_in.sym_sizes() && v_new_in.scalar_type() == k_new_in.scalar_type() &&
                        v_new_in.device() == k_new_in.device(),
                    "append_kv: v_new (", dtype_name(v_new_in.scalar_type()), " ", v_new_in.sym_sizes(), " on ",
                    v_new_in.device(), ") must match k_new (", dtype_name(k_new_in.scalar_type()), " ",
                    k_new_in.sym_sizes(), " on ", k_new_in.device(), ")");
  TORCH_CHECK_VALUE(k_new_in.sym_size(1) == k_cache.sym_size(1), "append_kv: k_new ", k_new_in.sym_sizes(),
                    " must be [batch, kv_heads, q_len, head_dim] with the kv_heads of k_cache ", k_cache.sym_sizes());
  check_device("append_kv", k_new_in, k_cache, v_cache);
  const Tensor k_new = k_new_in.contiguous(), v_new = v_new_in.contiguous(), seqlens = seqlens_in.contiguous();
  const Table table = table_in ? Table(table_in->contiguous()) : std::nullopt;
  // heads = kv_heads: the append has no query heads.
  const fa_decode_problem p = problem_of(k_new.size(0), k_new.size(1), k_new.size(2), k_cache, table, true, 0.0);
  const int32_t* block_table = table ? ints(*table) : nullptr;
  if (k_new.is_cpu()) {
    check_status(fa_append_kv(&p, ints(seqlens), floats(k_new), floats(v_new), floats(k_cache), floats(v_cache),
                              block_table));
    return;
  }
#ifdef FA_TORCH_CUDA
  const c10::cuda::CUDAGuard device(k_new.device());
  void* stream = c10::cuda::getCurrentCUDAStream(k_new.get_device()).stream();
  check_status(fa_append_kv_device(&p, dtype_code(k_new.scalar_type()), ints(seqlens), address(k_new),
                                   address(v_new), address(k_cache), address(v_cache), block_table, stream));
#else
  TORCH_CHECK(false, "append_kv: this build of the op has no CUDA kernels (device ", k_new.device(), ")");
#endif
}

// ---- Meta: shapes and dtypes only (torch.compile traces with these) ----

Decoded decode_meta(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& seqlens,
                    const Table& table, bool, double) {
  check_cache("decode", "q", q, k_cache, v_cache, seqlens, table);
  return {at::empty_symint(q.sym_sizes(), q.options()),
          at::empty_symint(q.sym_sizes().slice(0, 3), q.options().dtype(at::kFloat))};
}

void append_kv_meta(const Tensor& k_new, const Tensor& v_new, Tensor& k_cache, Tensor& v_cache, const Tensor& seqlens,
                    const Table& table) {
  check_cache("append_kv", "k_new", k_new, k_cache, v_cache, seqlens, table);
  TORCH_CHECK_VALUE(v_new.sym_sizes() == k_new.sym_sizes(), "append_kv: v_new ", v_new.sym_sizes(),
                    " must match k_new ", k_new.sym_sizes());
}

// ---- ADInplaceOrView: the caches' version counters ----

// An in-place write must bump the version of what it writes, so that autograd notices when a
// tensor it saved has changed since; the dispatcher does it for ATen's in-place ops, and this
// kernel does it for append_kv: the op below this key, then both caches' versions.
void append_kv_inplace_or_view(const Tensor& k_new, const Tensor& v_new, Tensor& k_cache, Tensor& v_cache,
                               const Tensor& seqlens, const Table& table) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fa_attention::append_kv", "")
                             .typed<void(const Tensor&, const Tensor&, Tensor&, Tensor&, const Tensor&, const Table&)>();
  {
    const at::AutoDispatchBelowADInplaceOrView below;
    op.call(k_new, v_new, k_cache, v_cache, seqlens, table);
  }
  torch::autograd::impl::bump_version(k_cache);
  torch::autograd::impl::bump_version(v_cache);
}

}  // namespace fa_torch::decode

// The schemas are in fa_torch.cpp's TORCH_LIBRARY(fa_attention): one library, one definition.
TORCH_LIBRARY_IMPL(fa_attention, CPU, m) {
  m.impl("decode", &fa_torch::decode::decode_impl);
  m.impl("append_kv", &fa_torch::decode::append_kv_impl);
}

#ifdef FA_TORCH_CUDA
TORCH_LIBRARY_IMPL(fa_attention, CUDA, m) {
  m.impl("decode", &fa_torch::decode::decode_impl);
  m.impl("append_kv", &fa_torch::decode::append_kv_impl);
}
#endif

TORCH_LIBRARY_IMPL(fa_attention, Meta, m) {
  m.impl("decode", &fa_torch::decode::decode_meta);
  m.impl("append_kv", &fa_torch::decode::append_kv_meta);
}

TORCH_LIBRARY_IMPL(fa_attention, ADInplaceOrView, m) {
  m.impl("append_kv", &fa_torch::decode::append_kv_inplace_or_view);
}
