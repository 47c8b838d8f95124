/// \file smem_cuda.h
/// \brief Stage 07: the tiled forward as a CUDA kernel in fp32, tiles in shared memory,
/// scores and output held in registers.
///
/// Plain C++ (no device syntax): the stage list, the tests and the C ABI include it.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "problem.h"
#include "stage.h"

namespace fa::stage07 {

/// The stage's name (StageInfo::name, its folder): its option table's, and the first
/// word of every refusal.
inline constexpr const char* kStageName = "07_smem_cuda";

/// The head dims this kernel is compiled for (StageInfo::head_dims). Each runs in a kernel
/// instantiated for the next multiple of 32 (16 and 32 → 32, 40 and 64 → 64, 80 and 96 → 96,
/// 128 → 128), the extra columns being zeros in shared memory.
inline const std::vector<int> kHeadDims{16, 32, 40, 64, 80, 96, 128};

/// The steps of the stage, in reading order (option `step`); `Auto` runs the final design.
///   07a  K_j, V_j loaded through registers, then the tile computed; three barriers per tile
///   07b  the next K, V tiles copied with cp.async during this tile's math
///   07c  two barriers per tile: the wait for K_{j+1} moves before barrier 3 (smem_cuda.cu)
enum class Step { Auto = 0, SyncLoads = 1, CpAsync = 2, TwoBarriers = 3 };
const std::vector<std::string>& step_names();  ///< "auto", "07a", "07b", "07c": the option's names

/// The layout of sQ, sK, sP (option `smem_layout`): rows padded by 4 floats, or unpadded
/// with 16-byte chunks XOR-swizzled (block_tile.cuh, smem_offset). Auto: swizzled at d = 128
/// (unless block_k = 32), padded elsewhere.
enum class SmemLayout { Auto = 0, Padded = 1, Swizzled = 2 };
const std::vector<std::string>& smem_layout_names();  ///< "auto", "padded", "swizzled"

/// What a forward call runs (register.cpp's option table; per calling thread).
struct Options {
  Step step = Step::Auto;
  int block_k = 0;  ///< B_c: 0 (auto: 64 for d ≤ 64 and for swizzled tiles, else 32), 32 or 64
  SmemLayout smem_layout = SmemLayout::Auto;
};
/// The calling thread's options, and a way to set all of them (each setter of the table
/// throws std::invalid_argument for a value the option does not allow).
Options current_options();
void set_options(const Options& o);

/// O = softmax(scale · Q Kᵀ + mask) V and L = log-sum-exp per row, on DEVICE pointers in
/// fp32 (layouts of docs/design.md §3), launched on `stream` with the current options.
/// Asynchronous: returns after the launch. Throws std::invalid_argument for a problem it
/// refuses (bad sizes, a head dim not in kHeadDims, a pointer not 16-byte
/// aligned, swizzled tiles with block_k = 32) before touching anything.
void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O,
             float* L, cudaStream_t stream);

/// How a problem is launched; computed on the host, needs no GPU.
struct LaunchShape {
  int head_dim_padded = 0;  ///< D: the head dim the kernel is compiled for
  int block_q = 0;          ///< B_r: query rows per thread block
  int block_k = 0;          ///< B_c: keys per shared-memory tile
  int step = 0;             ///< the step that runs: 1 (07a), 2 (07b), 3 (07c)
  bool pipelined = false;   ///< K_j, V_j copied with cp.async during the previous tile's math
  bool swizzled = false;    ///< sQ, sK, sP XOR-swizzled without padding
  int barriers = 0;         ///< __syncthreads() per key tile
  int threads = 0;          ///< threads per block
  long long blocks = 0;     ///< T_r · batch · heads thread blocks (a 1-D grid)
  size_t shared_bytes = 0;  ///< dynamic shared memory per block
};
LaunchShape launch_shape(const Problem& p);  ///< with the current options
LaunchShape launch_shape(const Problem& p, const Options& o);

/// The rows the driver prints for `p`: tile shapes, step, grid, block, shared memory, and,
/// when a GPU is present, registers per thread and theoretical occupancy (fa::describe_launch).
std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p);

StageInfo info();

}  // namespace fa::stage07
