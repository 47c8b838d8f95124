/// \file tensor_core_bwd.h
/// \brief Stage 09: FlashAttention-2's backward on tensor cores, fp16/bf16 in, fp32
/// accumulation: preprocess D, dK/dV with K_j, V_j resident, dQ by atomics or a second pass.
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

/// Kernel variants of the dK/dV kernel for the ablation table. `None` is the full kernel;
/// each other value turns off exactly one optimisation (built for bf16 only).
enum class Ablation {
  None = 0,        ///< the full kernel
  NoPipeline = 1,  ///< one Q_i/dO_i buffer: step i+1 is loaded only after step i is done
  NoSwizzle = 2,   ///< plain row-major shared memory: bank conflicts in ldmatrix
};

/// The ablation names, indexed by the enum's value: "none", "no_pipeline", "no_swizzle".
const std::vector<std::string>& ablation_names();
/// Parses a name from ablation_names(); std::invalid_argument otherwise.
Ablation parse_ablation(const std::string& name);

/// Tile shapes of the dK/dV kernel (see bwd_traits.cuh, DefaultTiles, and the notes).
enum class Tile {
  Wide = 0,    ///< the default: d = 64: B_c = 128, B_r = 128; d = 128: B_c = 128, B_r = 64 (8 warps)
  Narrow = 1,  ///< d = 64: B_r = 64; d = 128: B_c = 64 over 4 warps (two blocks per SM)
};
/// "wide", "narrow".
const std::vector<std::string>& tile_names();

/// How the dK/dV kernel's loop over query tiles synchronises its warps (wide tile only).
enum class Schedule {
  TwoBarriers = 0,  ///< the default: a barrier for Q_i/dO_i, another for the dSᵀ hand-over
  OneBarrier = 1,   ///< dSᵀ double-buffered: one barrier per step publishes both (+16/32 KB smem)
};
/// "two_barriers", "one_barrier".
const std::vector<std::string>& schedule_names();

/// How the dK/dV kernel's warps share the work of a step (wide tile, two_barriers schedule
/// only; see bwd_traits.cuh, DkDvTraits::kWarpsKeys, and the notes, "Two warp layouts").
enum class WarpLayout {
  Auto = 0,   ///< the default: PSmem at d = 128 (where it was measured faster) when the
              ///< options allow it (wide tile, two_barriers, no ablation), PRegs otherwise
  PRegs = 1,  ///< a warp owns 16 keys × all queries; Pᵀ, dSᵀ stay in its registers
  PSmem = 2,  ///< warps 4 (keys) × 2; Pᵀ, dSᵀ go through shared memory (+16/32 KB smem)
};
/// "auto", "p_regs", "p_smem".
const std::vector<std::string>& layout_names();

/// What a backward call runs.
struct Options {
  /// false: dQ_i += dS K_j by fp32 atomicAdd from the dK/dV kernel into a scratch buffer,
  /// then converted (fast; the order of the additions, hence the last bits of dQ, may
  /// change from run to run). true: a separate dQ kernel, one block per query tile,
  /// recomputes dS and sums over the key tiles in a fixed order (bitwise reproducible;
  /// repeats three of the five products). dK and dV are reproducible in both modes.
  bool deterministic = false;
  Ablation ablation = Ablation::None;  ///< built on the wide tile, bf16 only
  Tile tile = Tile::Wide;
  Schedule schedule = Schedule::TwoBarriers;  ///< OneBarrier: wide tile, no ablation
  WarpLayout layout = WarpLayout::Auto;       ///< PSmem: wide tile, two_barriers, no ablation
};
/// The options `backward` uses when none are given: the calling thread's values of the
/// stage's options (register.cpp's option table, options.h), which the command-line flags
/// (--deterministic, --ablation, --tile, --schedule, --layout) and
/// set_option("deterministic" | "ablation" | "tile" | "schedule" | "layout") change.
Options current_options();
void set_options(const Options& o);

/// Head dims with a compiled kernel: 64, 128.
const std::vector<int>& supported_head_dims();

/// dQ, dK, dV of O = softmax(scale·Q Kᵀ + mask) V for the loss whose gradient with respect
/// to O is dO, on DEVICE buffers in `dtype` (BF16 or F16); L (fp32, natural log) is the
/// forward's log-sum-exp, O its output. Layouts of docs/design.md §3; every tensor pointer
/// 16-byte aligned, L 4-byte aligned. For GQA, dK and dV of a kv head sum its query heads.
/// Asynchronous on `stream`: returns after the launches (scratch memory is freed in stream
/// order). Throws std::invalid_argument for a problem, dtype, head dim or pointer it
/// refuses, before anything is written. Uses current_options().
void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream);
/// Same with explicit options (e.g. Options{.deterministic = true}).
void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
              const Options& options);

/// The rows the driver prints for (p, dtype) with the current options: tile shapes, the
/// dQ mode, scratch bytes, and with `with_gpu` the launch facts of the dK/dV kernel (and
/// of the dQ kernel in deterministic mode): grid, block, shared memory, registers,
/// spills, occupancy.
std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype, bool with_gpu);

StageInfo info();

}  // namespace fa::stage09
