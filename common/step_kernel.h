/// \file step_kernel.h
/// \brief The step contract of the GPU stages (docs/design.md §10): how a step file hands
/// one compiled kernel to its stage's launcher, and the one launch that uses it.
///
/// A step file's table returns, for the (head dim, dtype, causal, …) asked for, a StepKernel
/// made by make_step_kernel. Its launch shape is passed by name: each number has its own
/// type (Threads, BlockRows, BlockCols, SmemBytes), so a call that swaps the query rows and
/// the key columns does not compile. The launcher then calls fa::launch, which allows the
/// kernel's dynamic shared memory once per (kernel, device) rather than before every launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace fa {

/// A compiled kernel of one step and the facts its launch and its launch report need.
/// Launched as fn<<<grid, threads, smem_bytes>>>(params); the stage computes the grid from
/// block_rows or block_cols (a forward block owns query rows, a backward block key columns).
struct StepKernel {
  const void* fn = nullptr;  ///< the __global__ function: one instance of the step's template
  int threads = 0;           ///< per block
  int block_rows = 0;        ///< B_r: query rows per block (forward) or per step of the loop (backward)
  int block_cols = 0;        ///< B_c: keys per tile (forward) or per block (backward)
  size_t smem_bytes = 0;     ///< dynamic shared memory per block
  int stages = 0;            ///< K/V (or Q/dO) buffers in flight; 0 where the stage does not report it
  int barriers = 0;          ///< block-wide barriers per key tile; 0 where the stage does not report it
  bool pipelined = false;    ///< the next tile's loads overlap this tile's math
  bool persistent = false;   ///< one block per SM looping over the tiles, instead of one block per tile
  /// PreferredSharedMemoryCarveout in percent, set with the shared-memory limit; −1 leaves
  /// the driver's choice.
  int carveout = -1;
  std::string description;  ///< the tile, as the launch report prints it
};

/// The launch shape by name: StepKernel's fields, one type each.
struct Threads {
  int value;
};
struct BlockRows {
  int value;
};
struct BlockCols {
  int value;
};
struct SmemBytes {
  size_t value;
};

/// A step's table row: `fn` with its launch shape. The optional facts (stages, barriers,
/// pipelined, persistent, carveout, description) are set on the result by name.
template <class F>
StepKernel make_step_kernel(F* fn, Threads threads, BlockRows rows, BlockCols cols, SmemBytes smem) {
  StepKernel k;
  k.fn = reinterpret_cast<const void*>(fn);
  k.threads = threads.value;
  k.block_rows = rows.value;
  k.block_cols = cols.value;
  k.smem_bytes = smem.value;
  return k;
}

/// The usual row: the causal or the plain instance of the same kernel template.
template <class F>
StepKernel make_step_kernel(bool causal, F* causal_fn, F* plain_fn, Threads threads, BlockRows rows, BlockCols cols,
                            SmemBytes smem) {
  return make_step_kernel(causal ? causal_fn : plain_fn, threads, rows, cols, smem);
}

/// Sets what a launch of `k` needs on the current device (the dynamic shared-memory limit,
/// needed above 48 KB, and the carveout where asked), once per (kernel, device, size):
/// later calls only look it up. Safe when several threads launch at once. The launch
/// report calls it before asking for occupancy.
void prepare_kernel(const StepKernel& k);

/// How a kernel follows the kernel before it on the same stream.
///   Serial: an ordinary launch. No block starts before the previous kernel has finished and
///     its writes are visible.
///   Programmatic: Programmatic Dependent Launch (sm_90; the launch attribute
///     cudaLaunchAttributeProgrammaticStreamSerialization). Blocks may start while the
///     previous kernel still runs, as soon as each of its blocks has executed
///     griddepcontrol.launch_dependents or exited, so this kernel's start (block launch,
///     barrier set-up, loads of inputs that kernel does not write) hides under that kernel's
///     tail. In exchange the kernel must execute griddepcontrol.wait (hopper/ptx.cuh) before
///     it reads anything the previous kernel writes: the wait returns once that kernel has
///     finished and all its writes are visible. Every block must execute it in at least one
///     thread, so that this kernel cannot finish before the one it follows.
enum class StreamOrder { Serial, Programmatic };

/// prepare_kernel(k), then fn<<<grid, k.threads, k.smem_bytes, stream>>>(args...) with
/// `order`. Errors throw (FA_CUDA_CHECK); the caller names the kernel in its FA_CHECK_LAUNCH.
void launch(const StepKernel& k, dim3 grid, void** args, cudaStream_t stream,
            StreamOrder order = StreamOrder::Serial);

/// fn<<<grid, threads, smem_bytes, stream>>>(args...) with `order`, for a kernel outside the
/// step tables (a backward's convert kernel): launch() without prepare_kernel.
void launch_kernel(const void* fn, dim3 grid, dim3 threads, size_t smem_bytes, void** args, cudaStream_t stream,
                   StreamOrder order);

}  // namespace fa
