/// \file cuda_emu.h
/// \brief Just enough of CUDA to run stage 14's kernels, unchanged, on CPU threads (the
/// test `stage14_kernels_on_cpu`). A block is 128 std::threads; __syncthreads is a barrier of
/// the block, __shfl_xor_sync a barrier of the warp around a shared slot; cp.async copies at
/// once; __shared__ memory is a static of the kernel (blocks run one after another).
///
/// What it checks: the kernels' index math, masks, splits, merge and paging, on any machine.
/// What it cannot: races between real warps and the timing of cp.async (a copy here lands at
/// once), which compute-sanitizer's racecheck and synccheck check on a GPU.
#pragma once

#define __DEVICE_LAUNCH_PARAMETERS_H__  // threadIdx and blockIdx are the emulator's, below
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace emu {
inline thread_local uint3 thread_idx, block_idx;
inline std::barrier<>* block_barrier = nullptr;
inline std::barrier<>* warp_barriers[32] = {};
inline float warp_slots[32][32];
}  // namespace emu

#define threadIdx (::emu::thread_idx)
#define blockIdx (::emu::block_idx)

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

// Every lane of the warp takes part (as in stage 14's kernels): write, meet, read, meet.
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  emu::warp_slots[warp][lane] = v;
  emu::warp_barriers[warp]->arrive_and_wait();
  const float other = emu::warp_slots[warp][lane ^ unsigned(lane_mask)];
  emu::warp_barriers[warp]->arrive_and_wait();
  return other;
}

template <class T>
inline T min(T a, T b) {
  return a < b ? a : b;
}
