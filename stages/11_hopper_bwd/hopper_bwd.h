/// \file hopper_bwd.h
/// \brief Stage 11: the backward on Hopper's own units (TMA, wgmma, mbarriers, warp
/// specialization), fp16/bf16 in, fp32 accumulation. Its forward is stage 10's. Plain C++:
/// the stage list, the tests and the C ABI include it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "problem.h"
#include "stage.h"

namespace fa::stage11 {

/// The stage's name (StageInfo::name, its folder): its option table's, and the first
/// word of every refusal.
inline constexpr const char* kStageName = "11_hopper_bwd";

/// The steps of the stage, in reading order; `Auto` runs the final design (11d).
///   11a  TMA loads on mbarriers + wgmma, one warpgroup, B_c = 64 keys per block
///   11b  warp specialization: a producer warpgroup (one thread issues), two consumer warpgroups, B_c = 128
///   11c  overlap: exponentials under the dPᵀ product, dQ atomics under dV and dK
///   11d  dQ by a TMA reduction: blocks staged in shared memory, added in L2 by a writer warp
///        (warp 1 of the producer warpgroup); with --deterministic, built without dQ for dq_pass.cu
enum class Step { Auto = 0, A = 1, B = 2, C = 3, D = 4 };
const std::vector<std::string>& step_names();  ///< "auto", "11a", "11b", "11c", "11d": the option's names

/// Settings that select what runs (the option table in register.cpp), per thread.
struct Options {
  Step step = Step::Auto;
  /// false: dQ_i += dS·K_j by fp32 atomics from the main kernel (the order of the
  /// additions, hence dQ's last bits, may change from run to run). true: the main kernel
  /// skips dQ, and a second kernel, one block per query tile, recomputes dS and sums over
  /// the key tiles in a fixed order (bitwise reproducible). dK, dV are reproducible in both.
  bool deterministic = false;
};
Options current_options();
void set_options(const Options& o);

/// Head dims with kernels (StageInfo::head_dims; the forward, stage 10's, is restricted to them).
/// Steps 11a–11c and the deterministic mode have kernels for 64 and 128 only.
inline const std::vector<int> kHeadDims{64, 128, 256};

/// dQ, dK, dV of O = softmax(scale·Q Kᵀ + mask) V for the loss whose gradient with respect
/// to O is dO, on device buffers in `dtype` (BF16 or F16); L (fp32, natural log) and O are
/// the forward's. Layouts of docs/design.md §3; tensor pointers 16-byte aligned, L 4-byte.
/// For GQA, dK and dV of a kv head sum its query heads. Asynchronous on `stream` (scratch
/// is freed in stream order). Throws std::invalid_argument for a problem, dtype, head dim
/// or pointer it refuses, std::runtime_error on a GPU that is not compute capability 9.x;
/// nothing is written then.
void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream);
void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
              const Options& options);

/// Launch facts of the kernels `backward` would run (step, tiles, grid, block, shared
/// memory, registers, occupancy). Needs a GPU.
std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype);

StageInfo info();

}  // namespace fa::stage11
