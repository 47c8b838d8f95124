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

/// The head dims this kernel is compiled for. Each runs in a kernel instantiated for the
/// next multiple of 32 (16 and 32 → 32, 40 and 64 → 64, 80 and 96 → 96, 128 → 128), the
/// extra columns being zeros in shared memory.
inline const std::vector<int>& supported_head_dims() {
  static const std::vector<int> dims{16, 32, 40, 64, 80, 96, 128};
  return dims;
}

/// O = softmax(scale · Q Kᵀ + mask) V and L = log-sum-exp per row, on DEVICE pointers in
/// fp32 (layouts of docs/design.md §3), launched on `stream`. Asynchronous: returns after the
/// launch. Throws std::invalid_argument for a problem it refuses (bad sizes, a head dim
/// not in supported_head_dims(), a pointer not 16-byte aligned) before touching anything.
void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O,
             float* L, cudaStream_t stream);

/// How a problem is launched; computed on the host, needs no GPU.
struct LaunchShape {
  int head_dim_padded = 0;  ///< D: the head dim the kernel is compiled for
  int block_q = 0;          ///< B_r: query rows per thread block
  int block_k = 0;          ///< B_c: keys per shared-memory tile
  bool pipelined = false;   ///< K_j, V_j copied with cp.async during the previous tile's math
  int variant = 0;          ///< the kernel variant that runs, 1–4 (option `variant`: set_variant)
  bool swizzled = false;    ///< sQ, sK, sP XOR-swizzled without padding (variants 1, 2)
  int barriers = 3;         ///< __syncthreads() per key tile (2: variants 1–3 with cp.async)
  int threads = 0;          ///< threads per block
  long long blocks = 0;     ///< T_r · batch · heads thread blocks (a 1-D grid)
  size_t shared_bytes = 0;  ///< dynamic shared memory per block
};
LaunchShape launch_shape(const Problem& p);

/// The rows the driver prints for `p`: tile shapes, grid, block, shared memory, and, when a
/// GPU is present, registers per thread and theoretical occupancy (fa::describe_launch).
std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p);

/// The stage's options, declared in register.cpp's option table (options.h): these set and
/// read the calling thread's values, which launch_shape, forward and launch_report use.
/// Each setter throws std::invalid_argument for a value the option does not allow.
///
/// B_c of the padded kernel (variants 3, 4), for experiments: 0 (default: 64 for d ≤ 64, 32
/// above), 32 or 64. Set, it also turns variant auto into 4 at d = 128 (see set_variant).
void set_block_k(int block_k);
int block_k_option();

/// Load schedule for experiments: 0 (default) and 1 copy K_j and V_j with cp.async (sm_80+)
/// while the previous tile is being computed: K_{j+1} during P_ij V_j, V_{j+1} during
/// S_{i,j+1} (async_tile_copy.cuh); 2 loads them through registers and then computes the tile.
void set_pipeline(int pipeline);
int pipeline_option();

/// Kernel variant (README.md, "Variants"), each correct for every problem:
///   0  auto, the default: variant 1 at d padded to 128 (unless block_k is set), else 4;
///   1  B_c = 64 always, sQ/sK/sP XOR-swizzled instead of padded (two blocks per SM fit at
///      d = 128), two barriers per key tile with the cp.async schedule;
///   2  as 1 with 256 threads per block (a 16 × 16 thread grid, half the piece per thread);
///      needs d padded to 64 or 128, and runs the default kernel for the other head dims;
///   3  the padded tiles with two barriers per key tile (cp.async schedule): the output is
///      bitwise variant 4's;
///   4  the padded kernel: sQ, sK, sP padded by 4 floats, B_c = 64 for d ≤ 64 and 32 above,
///      three barriers per key tile.
/// block_k applies to variants 3 and 4 only.
void set_variant(int variant);
int variant_option();

StageInfo info();

}  // namespace fa::stage07
