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

/// Kernel variants the benchmark can select. `None` is the full kernel; each other value
/// turns off exactly one optimisation (instantiated for bf16 at d = 64 and 128 only).
enum class Ablation {
  None = 0,           ///< the full kernel
  NoPipeline = 1,     ///< one K/V buffer: tile j+1 is loaded only after tile j is done
  NoSwizzle = 2,      ///< plain row-major shared memory: 8-way bank conflicts in ldmatrix
  Padded = 3,         ///< conflict-free by 16 bytes of padding per row instead of the swizzle
  NoCausalSplit = 4,  ///< every tile takes the masked path (no mask-free off-band loop)
  NoExp2 = 5,         ///< e^{scale·s − scale·m} by separate multiplies and __expf
};

/// The ablation names, indexed by the enum's value: "none", "no_pipeline", ...
const std::vector<std::string>& ablation_names();
/// Parses a name from ablation_names(); std::invalid_argument otherwise.
Ablation parse_ablation(const std::string& name);

/// Tile shape used at d = 128 (the only head dim with several): B_r = 64, B_c = 64 with
/// Q_i in registers; B_r = 128, B_c = 32 with Q_i re-read from shared memory for every K
/// tile (twice the MMAs per fragment read from shared memory); or B_r = 128, B_c = 64
/// with Q_i in shared memory, FlashAttention-2's own d = 128 tile on sm90 (the same reuse,
/// half the per-tile overhead of B_c = 32, the fewest spare registers). `Auto`, the
/// default, takes the one measured fastest on the H200 for the problem: the wide tile
/// without a causal mask, q_regs with one (the notes, "Choosing the tiles").
enum class TileD128 { Auto = 0, QInRegisters = 1, QInShared = 2, QInSharedWide = 3 };
const std::vector<std::string>& tile_d128_names();  ///< "auto", "q_regs", "q_smem", "q_smem_wide"

/// Settings that select a kernel variant; the stage's options change the current ones.
struct Options {
  Ablation ablation = Ablation::None;
  TileD128 tile_d128 = TileD128::Auto;
};
/// The calling thread's options (register.cpp's option table, options.h: "ablation",
/// "tile_d128"), and a way to set both at once.
Options current_options();
void set_options(const Options& o);

/// Head dims with a compiled kernel: 32, 64, 96, 128, 256.
const std::vector<int>& supported_head_dims();

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
