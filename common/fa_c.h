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

#ifdef __cplusplus
}
#endif

#endif /* FA_C_H */
