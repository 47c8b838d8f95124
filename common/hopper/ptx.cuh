/// \file ptx.cuh
/// \brief Stage 10's Hopper instructions other than wgmma: mbarriers, TMA copies, proxy
/// fences, named barriers and register reallocation, one small inline-PTX function each.
///
/// Why raw PTX: each function is one instruction of the PTX ISA, so a student can read the
/// ISA section beside it (the names below are the ISA's). Nothing here knows attention.
///
/// **mbarrier** (a 64-bit object in shared memory) counts two things per *phase*: arrivals
/// (threads calling arrive) and transaction bytes (the copy engine reporting bytes landed).
/// A phase completes when both reach zero; the barrier then flips its phase parity 0 ↔ 1
/// and re-arms with the same arrival count. A waiter names the parity of the phase it waits
/// for, so a loop over a ring of kStages buffers waits for parity (iteration / kStages) & 1:
///
///     fills:  tile 0   tile kStages   tile 2·kStages   tile 3·kStages   (buffer 0 of the ring)
///     phase:     0          1               2                3          ...
///     parity:    0          1               0                1
///
/// Waiting for the parity of the phase *before* the current one returns at once; that is
/// how a producer passes its first wait on an "empty" barrier nobody has arrived on yet.
///
/// **The async proxy.** TMA and wgmma read and write shared memory through the *async
/// proxy*, a different path from ordinary loads and stores (the *generic proxy*). A barrier
/// orders generic accesses only: data written by ordinary stores that TMA or wgmma reads
/// next needs `fence.proxy.async.shared::cta` in the writing threads first.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

namespace fa::hopper {

/// The 32-bit shared-memory address PTX instructions take.
__device__ inline uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier --------------------------------------------------------------------------

/// Initialises a barrier that completes a phase after `arrivals` arrive calls (plus any
/// transaction bytes announced with expect_tx). One thread calls it.
__device__ inline void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals));
}

/// Makes the initialised barriers visible to the async proxy (the copy engine) before
/// any TMA names them; followed by __syncthreads so that every thread sees them too.
__device__ inline void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

/// Arrives and announces that `bytes` more bytes will land in this phase (by TMA).
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

/// Arrives (counts one of the phase's arrivals).
__device__ inline void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

/// True when the phase of parity `parity` has completed (the instruction may also wait a
/// little in hardware before answering false).
//! [mbarrier wait]
__device__ inline bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

/// Waits until the phase of parity `parity` has completed.
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}
//! [mbarrier wait]

// ---- TMA (cp.async.bulk.tensor) --------------------------------------------------------

/// Copies the box at coordinates (c0, c1, c2) of the tensor `map` describes into shared
/// memory at `dst` (laid out and swizzled as the map says); the bytes are reported to
/// `bar`'s transaction count. Coordinates outside the tensor read as zeros. One thread
/// issues it; `map` must live in the kernel's parameter space (a __grid_constant__).
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar))
      : "memory");
}

/// Copies `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned) from
/// global memory to shared memory, reported to `bar` like a tensor copy. Stage 11 moves its
/// per-row statistics (L, D of a query tile) with it.
__device__ inline void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

/// Stores four 8×8 matrices of 16-bit values to shared memory with one instruction
/// (stmatrix.x4, sm_90): lane l gives the address of row l % 8 of matrix l / 8 (16 bytes in
/// a row), and register m holds this lane's two values of matrix m, at row lane / 4, columns
/// 2·(lane % 4) and 2·(lane % 4) + 1 — the layout of an accumulator fragment's 8×8 piece, so
/// a fragment rounded to 16 bits is stored without moving a value between lanes.
__device__ inline void stmatrix_x4(void* row, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_address(row)), "r"(m0),
               "r"(m1), "r"(m2), "r"(m3)
               : "memory");
}

/// Adds (x, y) to the two consecutive floats at `dst` in global memory, atomically per
/// element and without a return value (red: the thread does not wait for it). sm_90.
__device__ inline void red_add_f32x2(float* dst, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(x), "f"(y) : "memory");
}

/// Adds `bytes` contiguous fp32 values (a multiple of 16 bytes, both addresses 16-byte
/// aligned) from shared memory to global memory, element by element, atomically per element:
/// the reduction happens in L2, in whole lines, without a thread issuing an atomic per
/// value. Asynchronous: tracked by bulk groups (bulk_commit, bulk_wait_read, bulk_wait).
__device__ inline void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
               "r"(smem_address(src)), "r"(bytes)
               : "memory");
}
/// Closes the group of bulk operations this thread issued since the last commit.
__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/// Waits until at most kPending of this thread's bulk groups still *read* shared memory
/// (their source may then be overwritten; the writes to global memory may still be running).
template <int kPending>
__device__ inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
/// Waits until at most kPending of this thread's bulk groups are unfinished.
template <int kPending>
__device__ inline void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

/// Asks L2 to fetch the tensor map's 128 bytes early (one thread, at kernel start).
__device__ inline void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// ---- fences, barriers, registers -------------------------------------------------------

/// Orders this thread's earlier generic-proxy shared-memory writes before later
/// async-proxy accesses (a TMA store, a wgmma reading an operand written by ordinary
/// stores) that a barrier lets run. Stage 10 needs it once: in step 10e the producer's TMA
/// of the next Q_i overwrites the tile that the epilogue wrote and read with ordinary stores
/// and loads (hopper_fwd.cu, before q_empty). Stage 11 needs it before wgmma reads the dSᵀ
/// its threads stored, and before the bulk reduction reads the dQ staging.
__device__ inline void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/// Named barrier `id` (1..15; 0 is __syncthreads) for `threads` threads: sync waits until
/// `threads` threads have arrived or synced, arrive only counts this one.
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// Register reallocation between warpgroups (sm_90a): a warpgroup gives registers back to
/// the pool (dec) or takes them (inc) so that the block's total stays within the file.
/// All four warps of the warpgroup must execute it; the kernel needs a register cap at
/// entry (__launch_bounds__(threads, 1)).
template <int kRegisters>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// ---- Programmatic Dependent Launch (griddepcontrol, sm_90) -------------------------------
// Stage 13's backward: for kernels launched with StreamOrder::Programmatic (step_kernel.h)
// and the kernels they follow on the stream. Both do nothing where the launches were ordinary.

/// Lets the next kernel on the stream start its blocks once every block of this grid has
/// executed this (or exited). It says nothing about this grid's writes: the next kernel
/// still waits for all of them in griddepcontrol_wait.
__device__ inline void griddepcontrol_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/// Waits until the kernel this grid follows on the stream has finished and every write it
/// made is visible to this grid (the thread that executes it; the others do not wait).
__device__ inline void griddepcontrol_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace fa::hopper
