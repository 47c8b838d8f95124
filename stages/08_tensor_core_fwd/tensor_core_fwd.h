/// \file tensor_core_fwd.h
/// \brief Stage 08: FlashAttention-2's forward on tensor cores, fp16/bf16 in, fp32 accumulation.
///
/// Plain C++ (no device syntax): the stage list, the tests and the C ABI include it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "problem.h"
#include "stage.h"

namespace fa::stage08 {

/// The stage's name (StageInfo::name, its folder): its option table's, and the first
/// word of every refusal.
inline constexpr const char* kStageName = "08_tensor_core_fwd";

/// The steps of the stage, in reading order (option `step`); `Auto` runs the final design.
///   08a  one K/V buffer: tile j+1 is loaded once every warp is done with tile j
///        (08a_one_buffer.cu)
///   08b  two K/V buffers: tile j+1 travels (cp.async) while tile j is computed
///        (tensor_core_fwd.cu)
enum class Step { Auto = 0, OneBuffer = 1, DoubleBuffer = 2 };
const std::vector<std::string>& step_names();  ///< "auto", "08a", "08b": the option's names

/// Data-only ablations of step 08b for the benchmark's ablation table: each turns exactly one
/// optimisation off by changing a layout or a bound, not the code (instantiated for bf16 at
/// d = 64 and 128, on the q_regs tile). The values are those of the option `ablation`.
enum class Ablation {
  None = 0,           ///< the full kernel
  NoSwizzle = 2,      ///< plain row-major shared memory: 8-way bank conflicts in ldmatrix
  Padded = 3,         ///< conflict-free by 16 bytes of padding per row instead of the swizzle
  NoCausalSplit = 4,  ///< every tile takes the masked path (no mask-free off-band loop)
};
/// The option's values and names: {0, "none"}, {2, "no_swizzle"}, {3, "padded"}, {4, "no_causal_split"}.
const std::vector<std::pair<int64_t, std::string>>& ablation_values();
/// The name of an ablation ("none", "no_swizzle", ...).
std::string ablation_name(Ablation a);
/// Parses a name from ablation_values(); std::invalid_argument otherwise.
Ablation parse_ablation(const std::string& name);

/// Tile shape used at d = 128 (the only head dim with two): B_r = 64, B_c = 64 with Q_i in
/// registers (q_regs), or B_r = 128, B_c = 64 with Q_i re-read from shared memory
/// (q_smem_wide, FlashAttention-2's own d = 128 tile on sm90: twice the MMAs per fragment
/// read from shared memory, the fewest spare registers). `Auto`, the default, takes the one
/// measured fastest on the H200: the wide tile without a causal mask, q_regs with one (the
/// notes, "Choosing the tiles"). The values are those of the option `tile_d128`.
enum class TileD128 { Auto = 0, QInRegisters = 1, QInSharedWide = 3 };
/// {0, "auto"}, {1, "q_regs"}, {3, "q_smem_wide"}.
const std::vector<std::pair<int64_t, std::string>>& tile_d128_values();

/// What a forward call runs (register.cpp's option table; per calling thread).
struct Options {
  Step step = Step::Auto;
  Ablation ablation = Ablation::None;
  TileD128 tile_d128 = TileD128::Auto;
};
/// The calling thread's options (register.cpp's option table, options.h: "step",
/// "ablation", "tile_d128"), and a way to set all of them at once.
Options current_options();
void set_options(const Options& o);

/// Head dims with a compiled kernel (StageInfo::head_dims).
inline const std::vector<int> kHeadDims{32, 64, 96, 128, 256};

/// O = softmax(scale·Q Kᵀ + mask) V and L = log-sum-exp per row, on device buffers in
/// `dtype` (BF16 or F16; L always fp32), with the current options. Layouts of docs/design.md §3;
/// every pointer 16-byte aligned. Asynchronous on `stream`. Throws std::invalid_argument
/// for a problem, dtype, head dim or pointer it refuses (nothing is written then).
void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O,
             float* L, cudaStream_t stream);
/// Same with explicit options.
void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O,
             float* L, cudaStream_t stream, const Options& options);

/// Launch facts of the kernel `forward` would run for (p, dtype): tile shape, grid, block,
/// shared memory, registers, occupancy. Needs a GPU.
std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype);

StageInfo info();

}  // namespace fa::stage08
