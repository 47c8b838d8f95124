// Stage 11's host side: what it refuses, the scratch, the tensor maps, and the launches:
// preprocess → the step's main kernel → (deterministic: the dQ kernel) → convert dQ.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "bwd_traits.h"
#include "cuda_utils.h"
#include "hopper/tensor_map.h"
#include "hopper_bwd.h"
#include "hopper_bwd_steps.h"
#include "params.h"
#include "prep.h"
#include "scratch.h"

namespace fa::stage11 {

namespace {

using hopper::make_tensor_map;

/// Every refusal of bad input happens here, before anything is launched or written.
void check_request(const Problem& p, Dtype dtype) {
  require_tensor_core_request(kStageName, p, dtype, kHeadDims);
  require_grid_rows(kStageName, p);  // one grid row per kv head, one layer per batch
}

StepKernel kernel_for(const Options& o, int d, Dtype dtype, bool causal) {
  if (o.deterministic && o.step != Step::Auto && o.step != Step::D)
    throw std::invalid_argument(std::string(kStageName) + ": the deterministic mode is built on step 11d (auto) only (asked: step " +
                                step_names()[size_t(o.step)] + ")");
  switch (o.step) {
    case Step::A: return step_11a(d, dtype, causal);
    case Step::B: return step_11b(d, dtype, causal);
    case Step::C: return step_11c(d, dtype, causal);
    case Step::D:
    case Step::Auto: break;
  }
  return step_11d(d, dtype, causal, !o.deterministic);
}

int64_t key_tiles(const Problem& p, int block_cols) { return (int64_t(p.seq_k) + block_cols - 1) / block_cols; }

/// The main kernels: one block per (key tile, kv head, batch) (bwd_pipeline.cuh, block_work).
dim3 grid_for(const Problem& p, const StepKernel& k) {
  return dim3(unsigned(key_tiles(p, k.block_cols)), unsigned(p.kv_heads), unsigned(p.batch));
}
/// The deterministic dQ kernel: one block per (query tile, head, batch).
dim3 dq_grid_for(const Problem& p, const StepKernel& k) {
  return dim3(unsigned((p.seq_q + k.block_rows - 1) / k.block_rows), unsigned(p.heads), unsigned(p.batch));
}

/// Query rows per (batch, head) in the scratch arrays.
int64_t padded_rows(const Problem& p) { return (int64_t(p.seq_q) + kQueryPad - 1) / kQueryPad * kQueryPad; }

void launch(const StepKernel& k, dim3 grid, BwdParams& params, cudaStream_t stream) {
  void* args[] = {&params};
  fa::launch(k, grid, args, stream);
}

}  // namespace

void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream) {
  backward(p, dtype, Q, K, V, O, L, dO, dQ, dK, dV, stream, current_options());
}

void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
              const Options& options) {
  check_request(p, dtype);
  const char* why = "TMA reads and the kernels write 16-byte-aligned global memory";
  if (p.q_elems() > 0) {
    for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"Q", Q}, {"O", O}, {"dO", dO}, {"dQ", dQ}})
      require_device_pointer(kStageName, name, ptr, 16, why);
    require_device_pointer(kStageName, "L", L, alignof(float), "L is fp32");
  }
  if (p.kv_elems() > 0)
    for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"K", K}, {"V", V}, {"dK", dK}, {"dV", dV}})
      require_device_pointer(kStageName, name, ptr, 16, why);
  if (p.q_elems() == 0 && p.kv_elems() == 0) return;
  require_hopper(kStageName);

  const int d = p.head_dim;
  const StepKernel k = kernel_for(options, d, dtype, p.causal);
  const int64_t heads_total = int64_t(p.batch) * p.heads, kv_total = int64_t(p.batch) * p.kv_heads;
  const int64_t n_q_pad = padded_rows(p), stat_elems = heads_total * n_q_pad;
  if (n_q_pad > INT_MAX)
    throw std::invalid_argument(std::string(kStageName) + ": seq_q = " + std::to_string(p.seq_q) +
                                " rounded up to a multiple of 128 exceeds 2^31 - 1");
  const bool atomics = !options.deterministic;
  const Scratch scratch(size_t(p.seq_q > 0 ? stat_elems * (2 + (atomics ? d : 0)) : 0) * sizeof(float), stream,
                        kStageName, atomics ? "L2, D, dQ_accum" : "L2, D");

  BwdParams params{};
  if (p.seq_q > 0) {
    params.map_q = make_tensor_map(Q, dtype, d, p.seq_q, heads_total, 64, kStageName, "Q");
    params.map_do = make_tensor_map(dO, dtype, d, p.seq_q, heads_total, 64, kStageName, "dO");
  }
  if (p.seq_k > 0) {
    params.map_k = make_tensor_map(K, dtype, d, p.seq_k, kv_total, k.block_cols, kStageName, "K");
    params.map_v = make_tensor_map(V, dtype, d, p.seq_k, kv_total, k.block_cols, kStageName, "V");
  }
  if (p.seq_q == 0) params.map_q = params.map_do = params.map_k;  // never read: no block has a step
  params.L2 = scratch.floats();
  params.D = p.seq_q > 0 ? scratch.floats() + stat_elems : nullptr;
  params.dQ_accum = p.seq_q > 0 && atomics ? scratch.floats() + 2 * stat_elems : nullptr;
  params.dQ = dQ;
  params.dK = dK;
  params.dV = dV;
  set_problem_sizes(params, p);
  params.n_q_pad = int(n_q_pad);
  params.scale = p.softmax_scale();
  params.scale_log2 = params.scale * float(M_LOG2E);

  const bool blocked = options.step == Step::Auto || options.step == Step::D;  // 11d: dq_layout.h
  PrepParams prep{O,       dO, L, scratch.floats(), const_cast<float*>(params.D), params.dQ_accum, dQ, heads_total,
                  p.seq_q, int(n_q_pad), params.scale, blocked};
  if (p.seq_q > 0) {
    launch_preprocess(prep, dtype, d, stream);  // zeroes dQ_accum too (the atomic mode)
  }
  if (p.seq_k > 0) launch(k, grid_for(p, k), params, stream);  // with seq_q = 0 it writes dK = dV = 0
  if (p.seq_q > 0) {
    if (atomics) {
      launch_convert_dq(prep, dtype, d, stream);
    } else {  // with seq_k = 0 its blocks visit no key tile and write dQ = 0
      const StepKernel dq = dq_pass(d, dtype, p.causal);
      if (dq.block_cols != k.block_cols)  // it reads K and V through the main kernel's tensor maps
        throw std::logic_error(std::string(kStageName) + ": the dQ pass and the main kernel disagree on B_c");
      launch(dq, dq_grid_for(p, dq), params, stream);
    }
  }
}

std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype) {
  check_request(p, dtype);
  require_hopper(kStageName);
  const Options o = current_options();
  const StepKernel k = kernel_for(o, p.head_dim, dtype, p.causal);
  prepare_kernel(k);
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("step", o.step == Step::Auto ? "11d (auto)" : step_names()[size_t(o.step)]);
  rows.emplace_back("tile", "B_c = " + std::to_string(k.block_cols) + " keys per block, B_r = " +
                                std::to_string(k.block_rows) + " query rows per step");
  const bool bulk = o.step == Step::Auto || o.step == Step::D;
  rows.emplace_back("dQ", o.deterministic ? "deterministic: a second kernel sums the key tiles in order"
                          : bulk          ? "fp32 blocks added by TMA bulk reductions into a scratch accumulator, then converted"
                                          : "fp32 red.add into a scratch accumulator, then converted");
  const auto launch_rows = describe_launch(k.fn, grid_for(p, k), dim3(unsigned(k.threads)), k.smem_bytes);
  rows.insert(rows.end(), launch_rows.begin(), launch_rows.end());
  if (o.deterministic) {
    const StepKernel dq = dq_pass(p.head_dim, dtype, p.causal);
    prepare_kernel(dq);
    for (auto [key, value] : describe_launch(dq.fn, dq_grid_for(p, dq), dim3(unsigned(dq.threads)), dq.smem_bytes))
      rows.emplace_back("dQ kernel " + key, value);
  }
  return rows;
}

}  // namespace fa::stage11
