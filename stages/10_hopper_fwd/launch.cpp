// Stage 10's host side: what it refuses, the tensor maps, and which step's kernel runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_utils.h"
#include "hopper/tensor_map.h"
#include "hopper/traits.h"
#include "hopper_fwd.h"
#include "hopper_fwd_steps.h"
#include "params.h"
#include "scratch.h"

namespace fa::stage10 {

using hopper::make_tensor_map;

namespace {

/// Every refusal of bad input happens here, before anything is launched or written.
void check_request(const Problem& p, Dtype dtype) {
  require_tensor_core_request(kStageName, p, dtype, kHeadDims);
  require_grid_rows(kStageName, p);  // steps 10a–10d: one grid row per head, one layer per batch
}

/// What `auto` runs: 10f, except at d = 64 with at most 1024 keys, where step 10a is faster
/// (a query tile there visits at most 8 key tiles, so the pipeline of a specialised block
/// barely fills, while 10a runs three small blocks per SM; docs/results/h100_hopper_10f.csv,
/// 10a against 10f at N = 1024: 434–438 against 398–402 TFLOP/s without a mask, 329–333
/// against 296–297 with it, 8–12% faster).
Step resolve(Step step, const Problem& p) {
  if (step != Step::Auto) return step;
  return p.head_dim == 64 && p.seq_k <= 1024 ? Step::A : Step::F;
}

StepKernel kernel_for(Step step, int d, Dtype dtype, bool causal) {
  switch (step) {
    case Step::A: return step_10a(d, dtype, causal);
    case Step::B: return step_10b(d, dtype, causal);
    case Step::C: return step_10c(d, dtype, causal);
    case Step::D: return step_10d(d, dtype, causal);
    case Step::E: return step_10e(d, dtype, causal);
    case Step::F:
    case Step::Auto: break;  // resolve() has chosen by then
  }
  return step_10f(d, dtype, causal);
}

int64_t query_tiles(const Problem& p, const StepKernel& k) {
  return int64_t((p.seq_q + k.block_rows - 1) / k.block_rows) * p.heads * p.batch;
}

dim3 grid_for(const Problem& p, const StepKernel& k) {
  if (k.persistent) {  // one block per SM, each looping over the query tiles
    return dim3(unsigned(std::min<int64_t>(sm_count(), query_tiles(p, k))));
  }
  return dim3(unsigned((p.seq_q + k.block_rows - 1) / k.block_rows), unsigned(p.heads), unsigned(p.batch));
}

/// Step 10f's sections under the causal mask: the largest power of two of (batch, head)
/// pairs whose K and V fit in the L2 together (heads that share a KV head count their share),
/// at least one. A power of two: under the causal mask, sections of half the L2 rounded to whole
/// heads (3, 6 and 12 heads among them) measured 3–11% slower than the powers of two at the same
/// points on an H100 (docs/results/h100_stage10_schedule.md, table 2, "25 MB" against "32 MB");
/// FlashAttention-3 rounds the same way.
int heads_per_section(const Problem& p) {
  int device = 0, l2_bytes = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const double kv_bytes_per_head = 2.0 * p.seq_k * p.head_dim * 2 / (p.heads / p.kv_heads);  // K and V, 2 bytes
  const int64_t fit = int64_t(l2_bytes / std::max(kv_bytes_per_head, 1.0));
  int64_t heads = 1;
  while (2 * heads <= std::min<int64_t>(fit, int64_t(p.heads) * p.batch)) heads *= 2;
  return int(heads);
}

}  // namespace

void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O, float* L,
             cudaStream_t stream) {
  forward(p, dtype, Q, K, V, O, L, stream, current_options());
}

void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O, float* L,
             cudaStream_t stream, const Options& options) {
  check_request(p, dtype);
  if (p.q_elems() == 0) return;  // seq_q = 0: nothing to compute, nothing launched
  const char* why = "TMA reads and the epilogue writes 16-byte-aligned global memory";
  require_device_pointer(kStageName, "Q", Q, 16, why);
  require_device_pointer(kStageName, "O", O, 16, why);
  require_device_pointer(kStageName, "L", L, alignof(float), "L is fp32");
  if (p.kv_elems() > 0) {  // seq_k = 0: K and V are never read
    require_device_pointer(kStageName, "K", K, 16, why);
    require_device_pointer(kStageName, "V", V, 16, why);
  }
  require_hopper(kStageName);

  const Step step = resolve(options.step, p);
  const StepKernel k = kernel_for(step, p.head_dim, dtype, p.causal);
  const int64_t q_heads = int64_t(p.batch) * p.heads, kv_heads = int64_t(p.batch) * p.kv_heads;
  FwdParams params{};
  params.map_q = make_tensor_map(Q, dtype, p.head_dim, p.seq_q, q_heads, kRowsPerWarpgroup, kStageName, "Q");
  if (p.seq_k > 0) {
    params.map_k = make_tensor_map(K, dtype, p.head_dim, p.seq_k, kv_heads, k.block_cols, kStageName, "K");
    params.map_v = make_tensor_map(V, dtype, p.head_dim, p.seq_k, kv_heads, k.block_cols, kStageName, "V");
  } else {  // no key tile is ever loaded; any valid map will do
    params.map_k = params.map_v = params.map_q;
  }
  params.O = O;
  params.L = L;
  set_problem_sizes(params, p);
  const dim3 grid = grid_for(p, k);
  // The schedulers count tiles in an int, up to tiles_total + grid (a block's last look).
  if (query_tiles(p, k) > INT32_MAX - int64_t(grid.x))
    throw std::invalid_argument(std::string(kStageName) + ": " + std::to_string(query_tiles(p, k)) +
                                " query tiles (seq_q / B_r · heads · batch) exceed the tile counter's 2^31 − 1 − " +
                                std::to_string(grid.x));
  params.tiles_total = int(query_tiles(p, k));
  // Step 10f's tile counter: one int of scratch (stream-ordered, so calls on other streams
  // have their own), zeroed before the launch.
  const bool dynamic = step == Step::F;
  const Scratch counter(dynamic ? sizeof(int) : 0, stream, kStageName, "the tile counter");
  if (dynamic) {
    params.tile_counter = static_cast<int*>(counter.data());
    FA_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(int), stream));
  }
  params.heads_per_section = heads_per_section(p);
  params.scale = p.softmax_scale();
  params.scale_log2 = params.scale * float(M_LOG2E);

  void* args[] = {&params};
  launch(k, grid, args, stream);
}

std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype) {
  check_request(p, dtype);
  require_hopper(kStageName);
  const Options o = current_options();
  const Step step = resolve(o.step, p);
  const StepKernel k = kernel_for(step, p.head_dim, dtype, p.causal);
  prepare_kernel(k);
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("step", step_names()[size_t(step)] + (o.step == Step::Auto ? " (auto)" : ""));
  rows.emplace_back("tile", "B_r = " + std::to_string(k.block_rows) + ", B_c = " + std::to_string(k.block_cols) +
                                ", " + std::to_string(k.stages) + " K/V stages");
  const auto shape = describe_launch(k.fn, grid_for(p, k), dim3(unsigned(k.threads)), k.smem_bytes);
  rows.insert(rows.end(), shape.begin(), shape.end());
  return rows;
}

}  // namespace fa::stage10
