// Stage 09's host side: what it refuses, the scratch memory, which step's kernels run, and
// their launches: the preprocess (D, L2), the step's dK/dV kernel, then its dQ kernel (09a)
// or the conversion of the atomics' fp32 sums (09b, 09c).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "bwd_kernels.cuh"
#include "bwd_steps.h"
#include "cuda_utils.h"
#include "params.h"
#include "scratch.h"
#include "tensor_core_bwd.h"

namespace fa::stage09 {

namespace {


/// Rows per (batch, head) in the scratch arrays: seq_q rounded up to kQueryPad.
int64_t padded_rows(const Problem& p) { return (int64_t(p.seq_q) + kQueryPad - 1) / kQueryPad * kQueryPad; }

/// Bytes of scratch one call takes.
size_t scratch_bytes(const Problem& p, bool atomic_dq) {
  const int64_t rows = int64_t(p.batch) * p.heads * padded_rows(p);
  return size_t(rows) * sizeof(float) * (2 + (atomic_dq ? p.head_dim : 0));
}

/// The step `o` runs at head dim d: `deterministic` takes 09a; auto takes 09c (the 4 × 2 warp grid) at d = 128, where
/// it was measured 2 to 4 % faster than 09b, and 09b at d = 64, where 09c was 4 to 6 %
/// slower (the notes, "Step 09c").
Step resolved_step(const Options& o, int d) {
  if (o.deterministic) return Step::DqPass;
  if (o.step != Step::Auto) return o.step;
  return d == 128 ? Step::WarpGrid : Step::DqAtomics;
}

StepKernels kernels_for(Step step, int d, Dtype dtype) {
  switch (step) {
    case Step::DqPass: return step_09a(d, dtype);
    case Step::DqAtomics: return step_09b(d, dtype);
    case Step::WarpGrid:
    case Step::Auto: break;
  }
  return step_09c(d, dtype);
}

/// Grid of the dK/dV kernel: one block per (batch, kv head, key tile).
int64_t dkdv_blocks(const Problem& p, int block_n) {
  return int64_t(p.batch) * p.kv_heads * ((int64_t(p.seq_k) + block_n - 1) / block_n);
}
/// Grid of the dQ kernel: one block per (batch, head, query tile).
int64_t dq_blocks(const Problem& p, int block_m) {
  return int64_t(p.batch) * p.heads * ((int64_t(p.seq_q) + block_m - 1) / block_m);
}

/// Every refusal of a problem happens here, before anything is launched or written.
void check_request(const Problem& p, Dtype dtype) {
  require_tensor_core_request(kStageName, p, dtype, kHeadDims);
  const int64_t blocks = std::max(dkdv_blocks(p, 64), dq_blocks(p, 64));  // the smallest tiles give the most blocks
  if (blocks > INT_MAX)
    throw std::invalid_argument(std::string(kStageName) + ": the problem needs " + std::to_string(blocks) +
                                " thread blocks, more than the grid's " + std::to_string(INT_MAX) +
                                " (batch·heads·ceil(seq/64))");
}

void check_pointer(const char* name, const void* ptr, size_t alignment) {
  require_device_pointer(kStageName, name, ptr, alignment,
                         alignment == 16 ? "tiles move in 16-byte copies" : "L is fp32");
}

/// Launches one kernel of a step on `blocks` blocks (fa::launch allows its dynamic shared
/// memory, needed above 48 KB, once per device).
void launch(const StepKernel& k, int64_t blocks, BwdParams& params, cudaStream_t stream, const char* what) {
  void* args[] = {&params};
  fa::launch(k, dim3(unsigned(blocks)), args, stream);
  FA_CHECK_LAUNCH(what);
}

template <class Elem, int d>
void launch_all(const Problem& p, const StepKernels& k, BwdParams& params, cudaStream_t stream) {
  const bool atomic = k.atomic_dq;
  const int64_t n_q_pad = padded_rows(p);
  params.n_q_pad = int(n_q_pad);
  Scratch scratch(scratch_bytes(p, atomic), stream, kStageName, atomic ? "L2, D, dQ_accum" : "L2, D");
  const int64_t stat_elems = int64_t(p.batch) * p.heads * n_q_pad;
  if (scratch.floats() != nullptr) {
    params.L2 = scratch.floats();
    params.D = params.L2 + stat_elems;
    params.dQ_accum = atomic ? params.D + stat_elems : nullptr;
  }

  if (p.seq_q > 0) {
    if (atomic)  // the atomics add to it
      FA_CUDA_CHECK(cudaMemsetAsync(params.dQ_accum, 0, size_t(stat_elems) * d * sizeof(float), stream));
    const int64_t rows = stat_elems, rows_per_block = 256 / 32;
    preprocess_kernel<Elem, d><<<unsigned((rows + rows_per_block - 1) / rows_per_block), 256, 0, stream>>>(params);
    FA_CHECK_LAUNCH("09_tensor_core_bwd: preprocess_kernel");
  }
  // With seq_q = 0 the dK/dV kernel still runs: it writes dK = dV = 0.
  if (p.seq_k > 0)
    launch(k.dkdv, dkdv_blocks(p, k.dkdv.block_cols), params, stream, "09_tensor_core_bwd: dK/dV kernel");
  if (p.seq_q > 0) {
    if (!atomic) {
      launch(k.dq, dq_blocks(p, k.dq.block_rows), params, stream, "09_tensor_core_bwd: dQ kernel");
    } else {
      const int64_t chunks = int64_t(p.batch) * p.heads * p.seq_q * (d / 8);
      const unsigned blocks = unsigned(std::min<int64_t>((chunks + 255) / 256, 132 * 32));
      convert_dq_kernel<Elem, d><<<blocks, 256, 0, stream>>>(params);
      FA_CHECK_LAUNCH("09_tensor_core_bwd: convert_dq_kernel");
    }
  }
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
  if (p.q_elems() > 0) {
    check_pointer("Q", Q, 16);
    check_pointer("O", O, 16);
    check_pointer("dO", dO, 16);
    check_pointer("dQ", dQ, 16);
    check_pointer("L", L, alignof(float));
  }
  if (p.kv_elems() > 0) {
    check_pointer("K", K, 16);
    check_pointer("V", V, 16);
    check_pointer("dK", dK, 16);
    check_pointer("dV", dV, 16);
  }
  if (p.q_elems() == 0 && p.kv_elems() == 0) return;
  BwdParams params{};
  params.Q = Q;
  params.K = K;
  params.V = V;
  params.O = O;
  params.dO = dO;
  params.L = L;
  params.dQ = dQ;
  params.dK = dK;
  params.dV = dV;
  set_problem_sizes(params, p);
  params.causal = p.causal;
  params.scale = p.softmax_scale();
  params.scale_log2 = params.scale * kLog2e;
  const StepKernels k = kernels_for(resolved_step(options, p.head_dim), p.head_dim, dtype);
  with_dtype(dtype, [&](auto tag) {
    using Elem = decltype(tag);
    if (p.head_dim == 64)
      launch_all<Elem, 64>(p, k, params, stream);
    else
      launch_all<Elem, 128>(p, k, params, stream);
  });
}

std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype, bool with_gpu) {
  check_request(p, dtype);
  const Options o = current_options();
  const Step step = resolved_step(o, p.head_dim);
  const StepKernels k = kernels_for(step, p.head_dim, dtype);
  std::vector<std::pair<std::string, std::string>> rows;
  std::ostringstream tile, dq, scratch;
  tile << "dK/dV: B_c=" << k.dkdv.block_cols << " keys per block (" << k.warps_keys * k.warps_split << " warps of "
       << k.dkdv.block_cols / k.warps_keys << " keys), B_r=" << k.dkdv.block_rows
       << " query rows per step, 2 Q/dO stages, swizzled smem, "
       << (k.atomic_dq || k.warps_split > 1 ? "two barriers" : "one barrier") << " per step";
  if (k.warps_split > 1)
    tile << "; warp grid " << k.warps_keys << " (keys) x " << k.warps_split
         << " (queries of Sᵀ, dPᵀ; columns of dK, dV), Pᵀ and dSᵀ through shared memory";
  else
    tile << "; Pᵀ and dSᵀ in registers";
  if (!k.atomic_dq)
    dq << "a second kernel (deterministic), B_r=" << k.dq.block_rows << " rows per block (" << k.dq.threads / 32
       << " warps), B_c=" << k.dq.block_cols << " keys per step";
  else
    dq << "fp32 atomicAdd into dQ_accum (warp grid " << k.warps_mdq << " x " << k.warps_ndq
       << " over [B_r, d]), then a conversion kernel";
  scratch << scratch_bytes(p, k.atomic_dq) << " B (L2, D" << (k.atomic_dq ? ", dQ_accum" : "") << ")";
  rows.push_back({"step", step_names()[size_t(step)] + (o.step == Step::Auto ? std::string(" (auto)") : "")});
  rows.push_back({"tile", tile.str()});
  rows.push_back({"dQ", dq.str()});
  rows.push_back({"scratch", scratch.str()});
  if (!with_gpu) return rows;
  prepare_kernel(k.dkdv);
  for (auto& [key, value] :
       describe_launch(k.dkdv.fn, dim3(unsigned(std::max<int64_t>(1, dkdv_blocks(p, k.dkdv.block_cols)))),
                       dim3(unsigned(k.dkdv.threads)), k.dkdv.smem_bytes))
    rows.push_back({"dK/dV " + key, value});
  if (!k.atomic_dq) {
    prepare_kernel(k.dq);
    const dim3 dq_grid(unsigned(std::max<int64_t>(1, dq_blocks(p, k.dq.block_rows))));
    for (auto& [key, value] : describe_launch(k.dq.fn, dq_grid, dim3(unsigned(k.dq.threads)), k.dq.smem_bytes))
      if (key != "device") rows.push_back({"dQ " + key, value});
  }
  return rows;
}

}  // namespace fa::stage09
