/// \file tile_scheduler.cuh
/// \brief Which work tiles a persistent block takes: indices into a list of `total` tiles
/// whose order the stage chooses (under a causal mask, heaviest first).
///
/// A persistent kernel launches one block per SM (or fewer, when there are fewer tiles), and
/// each block loops: take a tile, compute it, take the next. Block b's first tile is tile b.
/// After that the two schedulers differ:
///   StaticScheduler   b + grid, b + 2·grid, … — fixed before the launch. Cheap, but a block
///                     that drew heavy tiles (or runs on a slower SM) finishes last while
///                     the others idle.
///   DynamicScheduler  the first tile no block has taken yet: a block that finishes early
///                     simply takes more. One atomicAdd on a global counter per tile, which
///                     the launcher sets to 0 before every launch (cudaMemsetAsync).
/// Used by one thread of the block (the producer); the tile index reaches the other warps
/// through shared memory. Both take (total, counter), so a kernel can be written once for
/// either; the static one ignores the counter.
///
///   const DynamicScheduler s{total, counter};
///   for (int t = s.first(); s.valid(t); t = s.next(t)) { … }
#pragma once

namespace fa::hopper {

struct StaticScheduler {
  int total;  ///< tiles in the list
  __device__ StaticScheduler(int total_, int*) : total(total_) {}
  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ int next(int t) const { return t + int(gridDim.x); }
  __device__ __forceinline__ bool valid(int t) const { return t < total; }
};

struct DynamicScheduler {
  int total;     ///< tiles in the list
  int* counter;  ///< tiles taken after the first round (0 at launch)
  __device__ DynamicScheduler(int total_, int* counter_) : total(total_), counter(counter_) {}
  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  /// Tiles 0 … grid − 1 are the blocks' first; the counter hands out the rest in order.
  __device__ __forceinline__ int next(int) const { return int(gridDim.x) + atomicAdd(counter, 1); }
  __device__ __forceinline__ bool valid(int t) const { return t < total; }
};

}  // namespace fa::hopper
