/// \file decode.h
/// \brief Stage 14: decoding at the memory roofline — split-KV, GQA packing, the paged KV
/// cache. The stage's entry points: the CPU step, the CUDA steps, the KV append.
#pragma once

#include <string>
#include <vector>

#include "decode_problem.h"

namespace fa::stage14 {

/// The stage's name (its folder): the first word of every refusal.
inline constexpr const char* kStageName = "14_decode";
/// The stage's idea in one line (the stage map of the docs reads it).
inline constexpr const char* kIdea =
    "decoding at the memory roofline: split-KV with a log-sum-exp combine, GQA packing, a paged KV cache";

// ---------------------------------------------------------------- the CPU step (decode_cpu.cpp)

/// How the CPU step splits the keys. splits = 0: one split per thread.
struct CpuOptions {
  int splits = 0;   ///< key splits per (sequence, KV head): 0 = threads; at most 4096
  int threads = 0;  ///< worker threads: 0 = the machine's; at most 1024
};

/// Split-KV decoding on the CPU: each (sequence, KV head, split) is one task for a pool of
/// threads; a task runs stage 05's row loop over its keys and writes a partial (O, L) per
/// query row; the partials are merged by the log-sum-exp rule. Host fp32 buffers in the
/// layouts of decode_problem.h; `block_table` is the host table of a paged cache (else null).
/// Refuses (std::invalid_argument) a bad problem, table or option before writing anything.
void decode_cpu(const DecodeProblem& p, const float* Q, const float* K_cache, const float* V_cache,
                const int* block_table, float* O, float* L, const CpuOptions& options = {});

/// Writes the new tokens' K/V into a host cache (append_kv_host, after the same refusals as
/// the GPU append: every length ≥ q_len, a valid block table).
void append_kv_cpu(const DecodeProblem& p, const float* K_new, const float* V_new, float* K_cache, float* V_cache,
                   const int* block_table);

/// The number of key splits the CPU step uses for `options`.
int cpu_splits(const CpuOptions& options);

// ---------------------------------------------------------------- the CUDA steps

/// The CUDA steps, in reading order; Auto is the final design (decode.cu, step 14e).
enum class Step { Auto = 0, OneBlock = 1, SplitKV = 2, GqaPacking = 3, Paged = 4, TensorCores = 5 };
/// "14a", "14b", "14c", "14d" ("auto" for Auto); parse_step takes those names back.
std::string step_name(Step s);
Step parse_step(const std::string& name);
inline constexpr Step kSteps[] = {Step::OneBlock, Step::SplitKV, Step::GqaPacking, Step::Paged, Step::TensorCores};
/// Whether step `s` reads a paged cache (14d, 14e and auto read either layout).
inline bool reads_paged(Step s) { return s == Step::Auto || s == Step::Paged || s == Step::TensorCores; }

/// Head dims the CUDA steps are compiled for.
std::vector<int> gpu_head_dims();

struct GpuOptions {
  Step step = Step::Auto;
  int splits = 0;  ///< key splits per sequence: 0 = the split rule (split_rule); ignored by 14a
};

/// Query rows of one tile of the packed steps (14c, 14d): heads of a group × q_len, up to 16.
inline constexpr int kTileRows = 16;
/// Keys per shared-memory tile.
inline constexpr int kTileKeys = 32;

/// The split rule of 14b–14d: enough blocks to fill the GPU (`sms` SMs, `blocks_per_sm`
/// resident blocks each) without splits so short that the combine costs more than they win:
/// every split holds at least kMinKeysPerSplit keys of the longest sequence, and at most
/// kMaxSplits splits. `blocks_without_split` is the grid of one split (batch × KV heads × row tiles).
inline constexpr int kMinKeysPerSplit = 128;
inline constexpr int kMaxSplits = 128;
int split_rule(int64_t blocks_without_split, int max_seqlen, int sms, int blocks_per_sm);

/// The launch facts of one decode call on the current device, for the program's report.
struct LaunchPlan {
  Step step;
  int splits;          ///< key splits per sequence (1 = no combine)
  int row_tiles;       ///< tiles of query rows per KV head
  long long blocks;    ///< blocks of the attention kernel
  int sms;             ///< SMs of the device
  std::string describe() const;
};
LaunchPlan plan(const DecodeProblem& p, const GpuOptions& options);

/// Decoding on the GPU, device buffers: Q, O [batch][heads][q_len][d] and the caches in
/// `dtype` (f16 or bf16), L fp32; `cache_seqlens` (int32 [batch]) and `block_table` (int32
/// [batch][blocks_per_seq], paged only) on the device, holding p.cache_seqlens and the
/// table. A device table is not read on the host: its entries must lie in [0, num_blocks)
/// (decode_gpu checks a host table before it uploads it). Scratch for the split partials
/// comes in stream order (scratch.h). `stream` is a cudaStream_t.
void decode_device(const DecodeProblem& p, Dtype dtype, const void* Q, const void* K_cache, const void* V_cache,
                   const int* cache_seqlens, const int* block_table, void* O, float* L, void* stream,
                   const GpuOptions& options = {});

/// Writes the new tokens' K/V ([batch][kv_heads][q_len][d], device) into the device caches
/// at positions cache_seqlens[b] − q_len + i; every length must be ≥ q_len.
void append_kv_device(const DecodeProblem& p, Dtype dtype, const void* K_new, const void* V_new, void* K_cache,
                      void* V_cache, const int* cache_seqlens, const int* block_table, void* stream);

/// The host-buffer versions (fp32 in and out, converted to `dtype` on the device), for the
/// tests and the program. The block table is a host table, checked before anything is copied.
void decode_gpu(const DecodeProblem& p, Dtype dtype, const float* Q, const float* K_cache, const float* V_cache,
                const int* block_table, float* O, float* L, const GpuOptions& options = {});
/// Appends on the device and copies the caches back into K_cache, V_cache (rounded through dtype).
void append_kv_gpu(const DecodeProblem& p, Dtype dtype, const float* K_new, const float* V_new, float* K_cache,
                   float* V_cache, const int* block_table);

/// Median milliseconds of one decode call (and of a device-to-device copy of as many bytes
/// as the call reads), on device-resident random inputs with a random valid block table.
struct BenchResult {
  double decode_ms;
  double copy_ms;  ///< cudaMemcpy device to device of kv_bytes
  double kv_bytes;
};
BenchResult bench_gpu(const DecodeProblem& p, Dtype dtype, const GpuOptions& options, int repeats);

/// Refuses what the CUDA steps cannot run (before anything is allocated): the problem, the
/// dtype (f16, bf16), the head dim, a paged cache with a step that reads a contiguous one.
void require_gpu_request(const DecodeProblem& p, Dtype dtype, const GpuOptions& options);

}  // namespace fa::stage14
