/* \file fa_c.h
 * \brief The C ABI over every stage: for Python (ctypes), notebooks and side-by-side benchmarks.
 *
 * Stages are named by folder name ("05_one_pass_fused") or a unique prefix ("05").
 * Every call returns 0 on success, or a non-zero code with a message from fa_last_error()
 * (thread-local). Nothing throws across this boundary. This is a stable contract: extend
 * it, never change or remove what is here.
 */
#ifndef FA_C_H
#define FA_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fa_problem {
  int32_t batch, heads, kv_heads, seq_q, seq_k, head_dim;
  int32_t causal; /* 0 or 1 */
  float scale;    /* 0 means 1/sqrt(head_dim) */
} fa_problem;

typedef enum fa_dtype { FA_F32 = 0, FA_F16 = 1, FA_BF16 = 2 } fa_dtype;

/* Error codes. Invalid input (a bad problem, dtype, stage name, or a NULL or misaligned
   tensor) is FA_ERR_INVALID from every entry point, before any buffer is touched; an
   allocation or CUDA failure, or a GPU stage without a CUDA device, is FA_ERR_RUNTIME.
   A tensor with no elements (e.g. K and V when seq_k = 0) may be NULL. */
enum { FA_OK = 0, FA_ERR_INVALID = 1, FA_ERR_UNSUPPORTED = 2, FA_ERR_RUNTIME = 3 };

int fa_stage_count(void);
const char* fa_stage_name(int index); /* NULL when index is out of range */
int fa_stage_has_backward(const char* stage); /* 1, 0, or -1 for an unknown stage */
int fa_stage_is_gpu(const char* stage);       /* 1, 0, or -1 for an unknown stage */
const char* fa_last_error(void);

/* Host buffers, fp32, layouts of docs/design.md §3. GPU stages accept these too (they copy). */
int fa_forward(const char* stage, const fa_problem* p, const float* Q, const float* K,
               const float* V, float* O, float* L);
int fa_backward(const char* stage, const fa_problem* p, const float* Q, const float* K,
                const float* V, const float* O, const float* L, const float* dO, float* dQ,
                float* dK, float* dV);

/* Device buffers, for GPU stages, in any dtype the stage supports (L is always fp32);
   `stream` is a cudaStream_t or NULL. */
int fa_forward_device(const char* stage, const fa_problem* p, fa_dtype dtype, const void* Q,
                      const void* K, const void* V, void* O, float* L, void* stream);
int fa_backward_device(const char* stage, const fa_problem* p, fa_dtype dtype, const void* Q,
                       const void* K, const void* V, const void* O, const float* L,
                       const void* dO, void* dQ, void* dK, void* dV, void* stream);

/* Extensions (added after the first version of this contract). */

/* Host buffers in fp32 for a GPU stage that computes in `dtype` (inputs are rounded to
   it on the device; O comes back rounded through it). */
int fa_forward_dtype(const char* stage, const fa_problem* p, fa_dtype dtype, const float* Q,
                     const float* K, const float* V, float* O, float* L);
int fa_backward_dtype(const char* stage, const fa_problem* p, fa_dtype dtype, const float* Q,
                      const float* K, const float* V, const float* O, const float* L,
                      const float* dO, float* dQ, float* dK, float* dV);

/* Stage-specific settings by name (e.g. stage 06: "block_q", "block_k", "sram_bytes",
   "threads", "count_traffic"); value 0 restores the default. A value the option does not
   allow is refused (FA_ERR_INVALID) with a message naming the allowed values. Options are
   per calling thread: they apply to that thread's later calls, and a thread that never set
   one runs with its default, so threads may run stages with different options at once. */
int fa_set_option(const char* stage, const char* name, int64_t value);
/* Stage-specific counters by name (e.g. stage 06: "reads", "writes" of the calling thread's
   last run), or an option's current value on the calling thread. */
int fa_get_counter(const char* stage, const char* name, int64_t* value);
/* The stage's options, one per line: "name<TAB>default<TAB>allowed values<TAB>help", e.g.
   "threads\t1\t1 to 1024, or 0 for the default (1)\tworker threads ..." or
   "step\t0\t0 auto, 1 11a, 2 11b, 3 11c, 4 11d\t...". "" for a stage without
   options; NULL for an unknown stage (message from fa_last_error). The text stays valid
   until the calling thread calls this function again. */
const char* fa_stage_options(const char* stage);

/* Where the GPU stages take their scratch memory (a backward's D, L·log2(e) and fp32 dQ
   accumulator): allocate(bytes, stream, context) returns device memory of the current device
   for use in stream order on `stream` (a cudaStream_t), or NULL when it cannot;
   release(ptr, stream, context) gives it back in stream order. Installed for the whole
   process, before any thread runs a GPU stage; both NULL restores the library's own
   stream-ordered pool. The PyTorch op installs torch's caching allocator, so scratch shares
   the framework's memory and may be taken inside a CUDA graph capture. Without CUDA in the
   build it is accepted and has no effect. */
typedef void* (*fa_allocate_fn)(size_t bytes, void* stream, void* context);
typedef void (*fa_release_fn)(void* ptr, void* stream, void* context);
int fa_set_scratch_allocator(fa_allocate_fn allocate, fa_release_fn release, void* context);

/* Decoding (stage 14, docs/design.md §12): each sequence's q_len new tokens (1 to 16) against
   its KV cache, not a fa_problem: one length per sequence (cache_seqlens, int32 [batch], the
   new tokens included; token i of sequence b sees keys j <= cache_seqlens[b] - q_len + i when
   causal) and a contiguous or paged cache. Layouts (common/decode_problem.h):
     Q, O         [batch][heads][q_len][head_dim]      L fp32 [batch][heads][q_len]
     K/V new      [batch][kv_heads][q_len][head_dim]   (the append's input)
     contiguous   K/V cache [batch][kv_heads][capacity][head_dim]         (block_size = 0)
     paged        K/V cache [num_blocks][kv_heads][block_size][head_dim] and an int32 block
                  table [batch][blocks_per_seq] (block_size 16 to 256, a power of two;
                  capacity = 0)
   The append writes the new tokens' K/V at positions cache_seqlens[b] - q_len + i, so every
   length it is given is at least q_len. */
typedef struct fa_decode_problem {
  int32_t batch, heads, kv_heads, head_dim, q_len;
  int32_t causal; /* 0 or 1 */
  float scale;    /* 0 means 1/sqrt(head_dim) */
  int32_t capacity, block_size, num_blocks, blocks_per_seq;
} fa_decode_problem;

/* Host buffers, fp32: stage 14's CPU step (split-KV over threads). cache_seqlens and
   block_table (paged only, else NULL) are host arrays, checked before anything is written. */
int fa_decode(const fa_decode_problem* p, const int32_t* cache_seqlens, const float* Q,
              const float* K_cache, const float* V_cache, const int32_t* block_table, float* O,
              float* L);
int fa_append_kv(const fa_decode_problem* p, const int32_t* cache_seqlens, const float* K_new,
                 const float* V_new, float* K_cache, float* V_cache, const int32_t* block_table);

/* Device buffers in FA_F16 or FA_BF16 (L fp32): stage 14's final CUDA step (14e) and the
   append kernel, on `stream`. cache_seqlens and block_table are device arrays and are never
   read on the host (nothing synchronises, so a CUDA graph can capture the calls): the split
   rule takes every sequence as full (seq_capacity), and a length or a table entry out of range
   is not refused but kept inside the cache by the kernels (docs/design.md §12). Scratch for
   the split partials comes from the allocator of fa_set_scratch_allocator. */
int fa_decode_device(const fa_decode_problem* p, fa_dtype dtype, const int32_t* cache_seqlens,
                     const void* Q, const void* K_cache, const void* V_cache,
                     const int32_t* block_table, void* O, float* L, void* stream);
int fa_append_kv_device(const fa_decode_problem* p, fa_dtype dtype, const int32_t* cache_seqlens,
                        const void* K_new, const void* V_new, void* K_cache, void* V_cache,
                        const int32_t* block_table, void* stream);

/* Stage 13 (docs/design.md §13): attention under modifiers, on the layouts of fa_problem.
   What changes one attention into another, as common/modifiers.h defines it: a sliding window
   (row i of a document sees key j when diag - window_left <= j <= diag + window_right, diag =
   i + n_k - n_q the causal alignment; a side not set is unbounded), documents packed into one
   row of the batch (batch = 1) by cu_seqlens_q / cu_seqlens_k (documents + 1 int32 entries
   each: from 0, non-decreasing, the last at most seq_q / seq_k; empty documents allowed; rows
   past the last document see nothing), a logit soft-cap (s <- cap * tanh(s / cap); 0: off),
   ALiBi (s <- s + slope_h * (j - diag)) and attention sinks (a logit per head in every row's
   softmax denominator, learnable: the backward returns its gradient). Every array here is in
   host memory, the device entries' too: the launch builds its work list from the documents
   on the host and uploads it with the slopes and sinks. `size` is sizeof(fa_modifiers) as the
   caller compiled it: later versions append fields and read only what the caller's size
   holds. A zeroed struct with its size set is plain attention. */
typedef struct fa_modifiers {
  uint32_t size;                     /* sizeof(fa_modifiers) */
  int32_t has_window_left;           /* 0 or 1: 0 leaves the left side unbounded */
  int32_t has_window_right;          /* 0 or 1 */
  int32_t n_alibi_slopes;            /* heads, or 0: no ALiBi */
  int64_t window_left, window_right; /* keys before / after the diagonal, >= 0 when set */
  double softcap;                    /* > 0, or 0 for none */
  const float* alibi_slopes;         /* [n_alibi_slopes], or NULL */
  const float* sinks;                /* [n_sinks] logits, or NULL */
  const int32_t* cu_seqlens_q;       /* [n_cu_seqlens], or NULL: the whole sequence is one document */
  const int32_t* cu_seqlens_k;       /* [n_cu_seqlens] */
  int32_t n_sinks;                   /* heads, or 0: no sinks */
  int32_t n_cu_seqlens;              /* documents + 1, or 0 */
} fa_modifiers;

/* Host buffers, fp32: stage 13's CPU step (stage 06's tiled loop under the block mask).
   Everything is checked before anything is written (stage 13's own checks: a negative window,
   softcap < 0 or not finite, slopes or sinks not one per query head, cu_seqlens not from 0,
   decreasing, ending past the tensor, of different lengths, or with batch != 1), refused with
   FA_ERR_INVALID and a message naming the value. The backward returns dsinks ([heads], summed
   over the batch) when sinks are given; dsinks may be NULL without them. */
int fa_forward_masked(const fa_problem* p, const fa_modifiers* m, const float* Q, const float* K,
                      const float* V, float* O, float* L);
int fa_backward_masked(const fa_problem* p, const fa_modifiers* m, const float* Q, const float* K,
                       const float* V, const float* O, const float* L, const float* dO, float* dQ,
                       float* dK, float* dV, float* dsinks);

/* Device buffers in FA_F16 or FA_BF16 (L and dsinks fp32), head_dim 64 or 128, 16-byte
   aligned: stage 13's Hopper kernels on `stream` (a GPU of compute capability 9.x; another is
   FA_ERR_RUNTIME). The modifiers' arrays are host arrays, checked as above before anything is
   launched; the call uploads them (stream-ordered, from pinned memory) and does not
   synchronise. dsinks ([heads], device) is required with sinks. */
int fa_forward_masked_device(const fa_problem* p, const fa_modifiers* m, fa_dtype dtype,
                             const void* Q, const void* K, const void* V, void* O, float* L,
                             void* stream);
int fa_backward_masked_device(const fa_problem* p, const fa_modifiers* m, fa_dtype dtype,
                              const void* Q, const void* K, const void* V, const void* O,
                              const float* L, const void* dO, void* dQ, void* dK, void* dV,
                              float* dsinks, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* FA_C_H */
