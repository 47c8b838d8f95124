/// \file tensor_core_bwd.h
/// \brief Stage 09: FlashAttention-2's backward on tensor cores, fp16/bf16 in, fp32
/// accumulation: preprocess D, dK/dV with K_j, V_j resident, dQ by a second pass or by atomics.
///
/// Plain C++ (no device syntax): the stage list, the tests and the C ABI include it. The
/// stage's forward is stage 08's (tensor_core_fwd.h), restricted to this stage's head dims.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "problem.h"
#include "stage.h"

namespace fa::stage09 {

/// The stage's name (StageInfo::name, its folder): its option table's, and the first
/// word of every refusal.
inline constexpr const char* kStageName = "09_tensor_core_bwd";

/// The steps of the stage, in reading order (option `step`). Each is a complete backward
/// (preprocess, dK/dV kernel, dQ); `Auto` runs 09b at d = 64 and 09c at d = 128, the faster
/// of the two at each head dim.
///   09a  dK/dV with K_j, V_j resident; dQ by a second kernel looping over the key tiles:
///        bitwise reproducible (09a_dq_pass.cu)
///   09b  dQ by fp32 atomics from the dK/dV kernel, summed in a scratch buffer and
///        converted; the last bits of dQ may change from run to run (09b_dq_atomics.cu)
///   09c  the warps as a 4 (keys) × 2 grid, Pᵀ and dSᵀ through shared memory: fewer
///        shared-memory reads per step (tensor_core_bwd.cu)
/// dK and dV are bitwise reproducible in every step.
enum class Step { Auto = 0, DqPass = 1, DqAtomics = 2, WarpGrid = 3 };
const std::vector<std::string>& step_names();  ///< "auto", "09a", "09b", "09c": the option's names

/// What a backward call runs (register.cpp's option table; per calling thread).
struct Options {
  Step step = Step::Auto;
  /// true: step 09a whatever `step` says, for a caller that needs the same bits on every run
  /// rather than a particular step (stage 12's ring). Not an option of the table: a field of
  /// the Options passed to backward.
  bool deterministic = false;
};
/// The options `backward` uses when none are given: the calling thread's values of the
/// stage's options (the command line's --step, set_option("step", k)).
Options current_options();
void set_options(const Options& o);

/// Head dims with a compiled kernel (StageInfo::head_dims; the forward, stage 08's, is
/// restricted to them).
inline const std::vector<int> kHeadDims{64, 128};

/// dQ, dK, dV of O = softmax(scale·Q Kᵀ + mask) V for the loss whose gradient with respect
/// to O is dO, on DEVICE buffers in `dtype` (BF16 or F16); L (fp32, natural log) is the
/// forward's log-sum-exp, O its output. Layouts of docs/design.md §3; every tensor pointer
/// 16-byte aligned, L 4-byte aligned. For GQA, dK and dV of a kv head sum its query heads.
/// Asynchronous on `stream`: returns after the launches (scratch memory is freed in stream
/// order). Throws std::invalid_argument for a problem, dtype, head dim or pointer it
/// refuses, before anything is written. Uses current_options().
void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream);
/// Same with explicit options (e.g. Options{Step::DqPass}: the reproducible backward).
void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
              const Options& options);

/// The rows the driver prints for (p, dtype) with the current options: the step, tile
/// shapes, how dQ is summed, scratch bytes, and with `with_gpu` the launch facts of the
/// dK/dV kernel (and of the dQ kernel in step 09a): grid, block, shared memory, registers,
/// spills, occupancy.
std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype, bool with_gpu);

StageInfo info();

}  // namespace fa::stage09
