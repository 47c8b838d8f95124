/// \file hopper_fwd.h
/// \brief Stage 10: the forward on Hopper's own units (TMA, wgmma, mbarriers, warp
/// specialization), fp16/bf16 in, fp32 accumulation. Plain C++: the stage list, the tests
/// and the C ABI include it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "problem.h"
#include "stage.h"

namespace fa::stage10 {

/// The stage's name (StageInfo::name, its folder): its option table's, and the first
/// word of every refusal.
inline constexpr const char* kStageName = "10_hopper_fwd";

/// The steps of the stage, in reading order; `Auto` runs the final design (10f), or 10a at
/// d = 64 with at most 1024 keys (launch.cpp says why).
///   10a  TMA loads on mbarriers + wgmma, one warpgroup, no specialization
///   10b  warp specialization: a producer warpgroup (one thread issues), two consumer warpgroups, setmaxnreg
///   10c  ping-pong: named barriers let one warpgroup's softmax run under the other's GEMMs
///   10d  intra-warpgroup overlap: the softmax of S_j runs under P_{j+1}·V_{j+1} (tiles run last to first)
///   10e  persistent: one block per SM loops over a list of query tiles, fixed in advance
///   10f  dynamic scheduling: a block that finishes early takes the next tile (a global counter)
enum class Step { Auto = 0, A = 1, B = 2, C = 3, D = 4, E = 5, F = 6 };
const std::vector<std::string>& step_names();  ///< "auto", "10a", …, "10f": the option's names

/// Settings that select a kernel (the option table in register.cpp). Per thread: a
/// thread's options never change what another thread runs.
struct Options {
  Step step = Step::Auto;
};
Options current_options();
void set_options(const Options& o);

/// Head dims with kernels (StageInfo::head_dims).
inline const std::vector<int> kHeadDims{64, 128, 256};

/// O = softmax(scale·Q Kᵀ + mask) V and L (log-sum-exp, fp32) on device buffers in `dtype`
/// (BF16 or F16), with the current options. Layouts of docs/design.md §3; pointers 16-byte aligned
/// (TMA's rule). Asynchronous on `stream`. Throws std::invalid_argument for a problem,
/// dtype, head dim or pointer it refuses and std::runtime_error on a GPU that is not
/// compute capability 9.x (nothing is written then).
void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O,
             float* L, cudaStream_t stream);
void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O,
             float* L, cudaStream_t stream, const Options& options);

/// Launch facts of the kernel `forward` would run (step, tile, grid, block, shared memory,
/// registers, occupancy). Needs a GPU.
std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype);

StageInfo info();

}  // namespace fa::stage10
