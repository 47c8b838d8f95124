// Stage 14's host side of the CUDA steps: the refusals, the launch plan (the grid and the
// split rule on this device), scratch for the partials, the launches, the host-buffer
// wrappers, the KV append and the benchmark.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cuda_utils.h"
#include "decode.h"
#include "decode_params.h"
#include "scratch.h"

namespace fa::stage14 {

namespace {

constexpr int kMaxRequestedSplits = 4096;

Step resolved(Step s) { return s == Step::Auto ? Step::TensorCores : s; }

StepKernel attention_kernel(const DecodeProblem& p, Dtype dtype, Step step) {
  switch (resolved(step)) {
    case Step::OneBlock: return step_14a(p.head_dim, dtype);
    case Step::SplitKV: return step_14b(p.head_dim, dtype);
    case Step::GqaPacking: return step_14c(p.head_dim, dtype);
    case Step::Paged: return step_14d(p.head_dim, dtype, p.paged());
    default: return step_14e(p.head_dim, dtype, p.paged());
  }
}

// SMs of the current device and resident blocks per SM of `k`, asked once per (kernel, device).
std::pair<int, int> device_fill(const StepKernel& k) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, std::pair<int, int>> known;
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find({k.fn, device});
  if (it != known.end()) return it->second;
  int sms = 0, per_sm = 0;
  prepare_kernel(k);  // the dynamic shared-memory limit first: occupancy counts against it
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, k.threads, k.smem_bytes));
  return known[{k.fn, device}] = {sms, std::max(1, per_sm)};
}

int row_tiles_of(const DecodeProblem& p, Step step) {
  const Step s = resolved(step);
  if (s == Step::OneBlock || s == Step::SplitKV) return 1;  // a block takes one head's q_len rows at a time
  return (p.group_size() * p.q_len + kTileRows - 1) / kTileRows;
}

}  // namespace

void require_gpu_request(const DecodeProblem& p, Dtype dtype, const GpuOptions& options) {
  const std::string who = kStageName;
  p.validate(who);
  if (dtype != Dtype::BF16 && dtype != Dtype::F16)
    throw std::invalid_argument(who + ": dtype " + dtype_name(dtype) +
                                " is not supported by the CUDA steps (allowed: bf16, f16)");
  const std::vector<int> dims = gpu_head_dims();
  if (std::find(dims.begin(), dims.end(), p.head_dim) == dims.end())
    throw std::invalid_argument(who + ": head_dim = " + std::to_string(p.head_dim) +
                                " is not supported by the CUDA steps (supported: 64, 128)");
  const Step s = resolved(options.step);
  if (p.paged() && !reads_paged(s))
    throw std::invalid_argument(who + ": step " + step_name(s) + " reads a contiguous cache; block_size = " +
                                std::to_string(p.block_size) + " is a paged one (use step 14d, 14e or auto)");
  if (options.splits < 0 || options.splits > kMaxRequestedSplits)
    throw std::invalid_argument(who + ": splits = " + std::to_string(options.splits) +
                                " is not allowed (allowed: 0 = the split rule, or 1 to " +
                                std::to_string(kMaxRequestedSplits) + ")");
  if (p.batch > 65535 || int64_t(p.kv_heads) * row_tiles_of(p, s) > 65535)
    throw std::invalid_argument(who + ": batch = " + std::to_string(p.batch) + " with kv_heads = " +
                                std::to_string(p.kv_heads) +
                                " is not allowed (the grid holds at most 65535 sequences and 65535 KV-head tiles)");
  if (p.l_elems() > int64_t(INT32_MAX))
    throw std::invalid_argument(who + ": batch x heads x q_len = " + std::to_string(p.l_elems()) +
                                " rows is not allowed (at most 2^31 - 1: one combine block per row)");
}

std::string LaunchPlan::describe() const {
  std::ostringstream s;
  s << "step " << step_name(step) << ": " << blocks << " blocks on " << sms << " SMs (" << splits << " split"
    << (splits > 1 ? "s" : "") << ", " << row_tiles << " row tile" << (row_tiles > 1 ? "s" : "")
    << " per KV head)" << (splits > 1 ? " + combine" : "");
  return s.str();
}

LaunchPlan plan(const DecodeProblem& p, const GpuOptions& options) {
  require_gpu(kStageName);
  LaunchPlan plan;
  plan.step = resolved(options.step);
  plan.row_tiles = row_tiles_of(p, plan.step);
  const auto [sms, per_sm] = device_fill(attention_kernel(p, Dtype::BF16, plan.step));
  plan.sms = sms;
  const int64_t one_split = int64_t(p.batch) * p.kv_heads * plan.row_tiles;
  if (plan.step == Step::OneBlock) {
    plan.splits = 1;
  } else {
    // 14e keeps kStages − 1 tiles of K and V in flight per block, enough for one block to
    // draw an SM's share of the bandwidth from a contiguous cache: it splits for one block
    // per SM (measured faster than two, which halves each split and doubles the partials).
    // From a paged cache two per SM: each block's copies wait on its block-table reads, and
    // the other block's copies fill those waits.
    const int blocks_per_sm = plan.step != Step::TensorCores ? per_sm : p.paged() ? 2 : 1;
    plan.splits = options.splits > 0 ? options.splits : split_rule(one_split, p.max_seqlen(), sms, blocks_per_sm);
  }
  plan.blocks = (long long)(one_split * plan.splits);
  return plan;
}

//! [decode device]
void decode_device(const DecodeProblem& p, Dtype dtype, const void* Q, const void* K_cache, const void* V_cache,
                   const int* cache_seqlens, const int* block_table, void* O, float* L, void* stream_,
                   const GpuOptions& options) {
  require_gpu_request(p, dtype, options);
  const std::string who = kStageName;
  require_device_pointer(who, "Q", Q, 2, "2-byte elements");
  require_device_pointer(who, "K_cache", K_cache, 16, "16-byte cp.async copies");
  require_device_pointer(who, "V_cache", V_cache, 16, "16-byte cp.async copies");
  require_device_pointer(who, "O", O, 2, "2-byte elements");
  require_device_pointer(who, "L", L, 4, "fp32");
  require_device_pointer(who, "cache_seqlens", cache_seqlens, 4, "int32");
  if (p.paged()) require_device_pointer(who, "block_table", block_table, 4, "int32");
  const auto stream = static_cast<cudaStream_t>(stream_);
  const LaunchPlan lp = plan(p, options);
  const StepKernel kernel = attention_kernel(p, dtype, lp.step);

  DecodeParams params = params_of(p);
  params.Q = Q;
  params.K_cache = K_cache;
  params.V_cache = V_cache;
  params.O = O;
  params.L = L;
  params.cache_seqlens = cache_seqlens;
  params.block_table = block_table;
  params.splits = lp.splits;
  params.row_tiles = lp.row_tiles;

  // The partials of every split (splits > 1): fp32 O [splits][rows][d] and L [splits][rows].
  const int64_t rows = p.l_elems();
  const size_t partial_bytes = lp.splits > 1 ? size_t(lp.splits) * size_t(rows) * size_t(p.head_dim + 1) * 4 : 0;
  Scratch partials(partial_bytes, stream, who, "split-KV partials (O_split, L_split)");
  if (lp.splits > 1) {
    params.O_split = partials.floats();
    params.L_split = partials.floats() + int64_t(lp.splits) * rows * p.head_dim;
  }

  void* args[] = {&params};
  const dim3 grid = lp.step == Step::OneBlock ? dim3(p.kv_heads, p.batch)
                                              : dim3(lp.splits, p.kv_heads * lp.row_tiles, p.batch);
  launch(kernel, grid, args, stream);
  FA_CHECK_LAUNCH("decode");
  if (lp.splits > 1) {  // the combine merges each row's partials into O and L
    launch(combine_kernel(p.head_dim, dtype), dim3(unsigned(rows)), args, stream);
    FA_CHECK_LAUNCH("combine");
  }
}
//! [decode device]

void append_kv_device(const DecodeProblem& p, Dtype dtype, const void* K_new, const void* V_new, void* K_cache,
                      void* V_cache, const int* cache_seqlens, const int* block_table, void* stream) {
  const std::string who = std::string(kStageName) + " (append)";
  require_gpu_request(p, dtype, GpuOptions{p.paged() ? Step::Paged : Step::Auto, 0});
  require_gpu(who);
  for (auto [name, ptr] : {std::pair{"K_new", K_new}, {"V_new", V_new}, {"K_cache", (const void*)K_cache},
                           {"V_cache", (const void*)V_cache}})
    require_device_pointer(who, name, ptr, 16, "16-byte copies");
  require_device_pointer(who, "cache_seqlens", cache_seqlens, 4, "int32");
  if (p.paged()) require_device_pointer(who, "block_table", block_table, 4, "int32");
  DecodeParams params = params_of(p);
  params.cache_seqlens = cache_seqlens;
  params.block_table = block_table;
  void* args[] = {&params, &K_new, &V_new, &K_cache, &V_cache};
  launch(append_kernel(p.head_dim), dim3(p.q_len, p.kv_heads, p.batch), args, static_cast<cudaStream_t>(stream));
  FA_CHECK_LAUNCH("append_kv");
}

namespace {

// The inputs of one decode call, on the device.
struct DeviceInputs {
  DeviceBuffer Q, K, V, seqlens, table;
  DeviceInputs(const DecodeProblem& p, Dtype dtype, const float* Q_, const float* K_, const float* V_,
               const int* table_, cudaStream_t stream)
      : Q(size_t(p.q_elems()) * dtype_size(dtype), "Q"),
        K(std::max<size_t>(1, size_t(p.cache_elems()) * dtype_size(dtype)), "K cache"),
        V(std::max<size_t>(1, size_t(p.cache_elems()) * dtype_size(dtype)), "V cache"),
        seqlens(size_t(p.batch) * 4, "cache_seqlens"),
        table(std::max<size_t>(4, size_t(p.table_elems()) * 4), "block table") {
    upload(dtype, Q_, Q.get(), p.q_elems(), stream);
    upload(dtype, K_, K.get(), p.cache_elems(), stream);
    upload(dtype, V_, V.get(), p.cache_elems(), stream);
    FA_CUDA_CHECK(cudaMemcpyAsync(seqlens.get(), p.cache_seqlens.data(), size_t(p.batch) * 4,
                                  cudaMemcpyHostToDevice, stream));
    if (p.paged())
      FA_CUDA_CHECK(cudaMemcpyAsync(table.get(), table_, size_t(p.table_elems()) * 4, cudaMemcpyHostToDevice, stream));
  }
};

}  // namespace

void decode_gpu(const DecodeProblem& p, Dtype dtype, const float* Q, const float* K_cache, const float* V_cache,
                const int* block_table, float* O, float* L, const GpuOptions& options) {
  require_gpu_request(p, dtype, options);
  p.validate_block_table(block_table, kStageName);  // a host table: every entry a sequence uses is checked
  require_gpu(kStageName);
  cudaStream_t stream = nullptr;
  DeviceInputs in(p, dtype, Q, K_cache, V_cache, block_table, stream);
  DeviceBuffer O_dev(size_t(p.q_elems()) * dtype_size(dtype), "O"), L_dev(size_t(p.l_elems()) * 4, "L");
  decode_device(p, dtype, in.Q.get(), in.K.get(), in.V.get(), in.seqlens.as<int>(), in.table.as<int>(), O_dev.get(),
                L_dev.as<float>(), stream, options);
  download(dtype, O_dev.get(), O, p.q_elems(), stream);
  download(Dtype::F32, L_dev.get(), L, p.l_elems(), stream);
}

void append_kv_gpu(const DecodeProblem& p, Dtype dtype, const float* K_new, const float* V_new, float* K_cache,
                   float* V_cache, const int* block_table) {
  const std::string who = std::string(kStageName) + " (append)";
  p.validate(who);
  p.validate_block_table(block_table, who);
  p.validate_append(who);
  require_gpu_request(p, dtype, GpuOptions{p.paged() ? Step::Paged : Step::Auto, 0});
  require_gpu(who);
  cudaStream_t stream = nullptr;
  const size_t elem = dtype_size(dtype);
  DeviceBuffer K_new_dev(size_t(p.new_kv_elems()) * elem, "K new"), V_new_dev(size_t(p.new_kv_elems()) * elem, "V new");
  DeviceBuffer K(size_t(p.cache_elems()) * elem, "K cache"), V(size_t(p.cache_elems()) * elem, "V cache");
  DeviceBuffer seqlens(size_t(p.batch) * 4, "cache_seqlens"), table(std::max<size_t>(4, size_t(p.table_elems()) * 4), "block table");
  upload(dtype, K_new, K_new_dev.get(), p.new_kv_elems(), stream);
  upload(dtype, V_new, V_new_dev.get(), p.new_kv_elems(), stream);
  upload(dtype, K_cache, K.get(), p.cache_elems(), stream);
  upload(dtype, V_cache, V.get(), p.cache_elems(), stream);
  FA_CUDA_CHECK(cudaMemcpyAsync(seqlens.get(), p.cache_seqlens.data(), size_t(p.batch) * 4, cudaMemcpyHostToDevice, stream));
  if (p.paged())
    FA_CUDA_CHECK(cudaMemcpyAsync(table.get(), block_table, size_t(p.table_elems()) * 4, cudaMemcpyHostToDevice, stream));
  append_kv_device(p, dtype, K_new_dev.get(), V_new_dev.get(), K.get(), V.get(), seqlens.as<int>(), table.as<int>(),
                   stream);
  download(dtype, K.get(), K_cache, p.cache_elems(), stream);
  download(dtype, V.get(), V_cache, p.cache_elems(), stream);
}

BenchResult bench_gpu(const DecodeProblem& p, Dtype dtype, const GpuOptions& options, int repeats) {
  require_gpu_request(p, dtype, options);
  require_gpu(kStageName);
  cudaStream_t stream = nullptr;  // a stream of its own: the legacy default stream cannot be captured
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int device = 0, l2 = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  // Several copies of the caches, rotated, so that together they are at least twice the L2
  // and no launch finds its keys there (docs/design.md §7).
  const double cache_bytes = 2.0 * double(std::max<int64_t>(1, p.cache_elems())) * double(dtype_size(dtype));
  const int sets = int(std::clamp(std::ceil(2.0 * l2 / cache_bytes), 1.0, 64.0));
  std::vector<DeviceBuffer> K, V, tables;
  std::mt19937 rng(1);
  for (int s = 0; s < sets; ++s) {
    K.emplace_back(size_t(std::max<int64_t>(1, p.cache_elems())) * dtype_size(dtype), "K cache");
    V.emplace_back(size_t(std::max<int64_t>(1, p.cache_elems())) * dtype_size(dtype), "V cache");
    fill_random(dtype, K.back().get(), p.cache_elems(), 2 * s + 1, stream);
    fill_random(dtype, V.back().get(), p.cache_elems(), 2 * s + 2, stream);
    std::vector<int> table(size_t(std::max<int64_t>(1, p.table_elems())));
    std::iota(table.begin(), table.end(), 0);  // each sequence's blocks scattered over the pool
    std::shuffle(table.begin(), table.end(), rng);
    for (int& e : table) e = p.num_blocks > 0 ? e % p.num_blocks : 0;
    tables.emplace_back(table.size() * 4, "block table");
    FA_CUDA_CHECK(cudaMemcpy(tables.back().get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  }
  DeviceBuffer Q(size_t(p.q_elems()) * dtype_size(dtype), "Q"), O(size_t(p.q_elems()) * dtype_size(dtype), "O");
  DeviceBuffer L(size_t(p.l_elems()) * 4, "L"), seqlens(size_t(p.batch) * 4, "cache_seqlens");
  fill_random(dtype, Q.get(), p.q_elems(), 99, stream);
  FA_CUDA_CHECK(cudaMemcpy(seqlens.get(), p.cache_seqlens.data(), size_t(p.batch) * 4, cudaMemcpyHostToDevice));

  cudaEvent_t start, stop;
  FA_CUDA_CHECK(cudaEventCreate(&start));
  FA_CUDA_CHECK(cudaEventCreate(&stop));
  // Median milliseconds of `run` (one call of `per_run` operations), each timed with events.
  auto time_ms = [&](auto&& run, int n, int per_run) {
    std::vector<float> ms;
    for (int r = 0; r < n; ++r) {
      FA_CUDA_CHECK(cudaEventRecord(start, stream));
      run(r);
      FA_CUDA_CHECK(cudaEventRecord(stop, stream));
      FA_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      FA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t / float(per_run));
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return double(ms[ms.size() / 2]);
  };
  auto decode_once = [&](int r) {
    const int s = r % sets;
    decode_device(p, dtype, Q.get(), K[size_t(s)].get(), V[size_t(s)].get(), seqlens.as<int>(),
                  tables[size_t(s)].as<int>(), O.get(), L.as<float>(), stream, options);
  };
  for (int r = 0; r < std::min(sets, 2) + 1; ++r) decode_once(r);  // warm-up (and the pool's first scratch)
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
  BenchResult result{};
  const double one_ms = time_ms(decode_once, 1, 1);
  if (one_ms >= 1.0) {
    // A long call: the host's part is negligible; time calls one by one, about a second's worth.
    result.decode_ms = time_ms(decode_once, std::clamp(int(1000.0 / one_ms), 3, std::max(3, repeats)), 1);
  } else {
    // A small decode takes a few microseconds, as long as the host takes to check and launch
    // it: timed call by call, the host would be measured. So kCalls calls (rotating over the
    // cache copies) are captured once in a CUDA graph, and the graph's launches are timed.
    constexpr int kCalls = 10;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    FA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < kCalls; ++c) decode_once(c);
    FA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    FA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    FA_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
    result.decode_ms = time_ms([&](int) { FA_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, std::max(repeats, 10), kCalls);
    FA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    FA_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  result.kv_bytes = p.kv_bytes(int(dtype_size(dtype)));

  // The copy bandwidth of the same card in the same run: a device-to-device copy of 1 GiB.
  const size_t copy_bytes = size_t(1) << 30;
  DeviceBuffer from(copy_bytes, "copy source"), to(copy_bytes, "copy destination");
  FA_CUDA_CHECK(cudaMemsetAsync(from.get(), 1, copy_bytes, stream));
  auto copy_once = [&](int) {
    FA_CUDA_CHECK(cudaMemcpyAsync(to.get(), from.get(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  copy_once(0);
  const double copy_ms = time_ms(copy_once, 5, 1);
  result.copy_ms = copy_ms * result.kv_bytes / double(copy_bytes);  // the copy's time for kv_bytes
  FA_CUDA_CHECK(cudaEventDestroy(start));
  FA_CUDA_CHECK(cudaEventDestroy(stop));
  FA_CUDA_CHECK(cudaStreamDestroy(stream));
  return result;
}

}  // namespace fa::stage14
