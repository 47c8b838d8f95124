/// \file cp_async.cuh
/// \brief `cp.async` (sm_80 and later): 16-byte copies from global to shared memory that run
/// in the background, without passing through registers. The GPU stages (07, 08, 09) load
/// their tiles with these.
///
/// TUTORIAL: one cp_async_16(dst, src, n) is the plain copy
///     for (int b = 0; b < 16; ++b) dst_bytes[b] = b < n ? src_bytes[b] : 0;
/// done in the background; cp_async_commit() closes a group of such copies, and
/// cp_async_wait<N>() returns once at most N of this thread's groups are still in flight.
/// Only the calling thread's copies are covered: a __syncthreads() must follow before other
/// threads read the data.
#pragma once

#include <cstdint>

namespace fa {

/// The shared-memory address (an offset in the block's shared window, what cp.async and
/// ldmatrix take) of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* ptr) {
  return uint32_t(__cvta_generic_to_shared(ptr));
}

/// Copies 16 bytes from global `src` to shared address `dst` in the background. Bytes past
/// `src_bytes` (0 or 16) are written as zeros, which is how a tail row or a padded column
/// becomes 0 without a branch around the store; a 0-byte copy reads nothing, but `src`
/// must still be an address inside the tensor. ".cg": cached in L2 only (a block reads
/// each element once).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

/// Same, with `dst` a generic pointer into shared memory.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  cp_async_16(shared_address(dst), src, src_bytes);
}

/// Closes the current group of this thread's copies (an empty group is allowed, and keeps
/// the group count uniform at the end of a loop).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace fa
