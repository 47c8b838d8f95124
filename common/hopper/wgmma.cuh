/// \file wgmma.cuh
/// \brief Warpgroup matrix multiply (sm_90a): shared-memory descriptors for the 128-byte
/// swizzle, the fence/commit/wait protocol, and the accumulator's register layout.
///
/// **The instruction.** `wgmma.mma_async.m64nNk16` multiplies A [64, 16] by B [16, N] into
/// D [64, N] (fp32) for one *warpgroup* (4 consecutive warps, the first warp index a
/// multiple of 4). B always comes from shared memory, A from shared memory or registers,
/// D lives in registers. It is asynchronous: it returns at once and the tensor cores read
/// the operands later, so
///
///     wgmma_fence();            // my registers (A, D) are ready to be read
///     wgmma_*(...); ...         // issue one or more products
///     wgmma_commit();           // close a group of them
///     wgmma_wait<n>();          // until at most n groups are still running
///
/// and the accumulators must not be touched between issue and wait.
///
/// **Shared-memory operands** are described, not addressed: a 64-bit descriptor gives the
/// start address, two strides and the swizzle mode (PTX ISA, "Matrix Descriptor Format"):
///
///     bits  0–13  start address >> 4
///     bits 16–29  leading-dimension byte offset >> 4 (LBO)
///     bits 32–45  stride-dimension byte offset >> 4 (SBO)
///     bits 62–63  swizzle: 1 = 128-byte
///
/// Stage 10 stores every tile as *column blocks* of 64 elements (128 bytes) per row, the
/// widest box the 128-byte swizzle allows, so a [rows, d] tile is d/64 blocks of [rows, 64].
/// Inside a block, 8 rows of 128 bytes form a 1024-byte swizzle atom in which the 16-byte
/// chunk c of row r sits at chunk c ^ (r % 8):
///
///     row 0:  0 1 2 3 4 5 6 7        the eight rows of a 16-byte column are in
///     row 1:  1 0 3 2 5 4 7 6        eight different chunks, so reading a column
///     row 2:  2 3 0 1 6 7 4 5        (ldmatrix, wgmma) or writing a row touches
///     ...                            every bank once
///     row 7:  7 6 5 4 3 2 1 0
///
/// TMA writes this layout (CU_TENSOR_MAP_SWIZZLE_128B) and wgmma reads it (swizzle = 1).
/// - K-major operand (the reduction dimension is contiguous: Q and K for S = Q·Kᵀ):
///   SBO = 1024 (from one 8-row group to the next), LBO unused; the k-th step of 16
///   elements starts 32·k bytes into the block's rows.
/// - MN-major operand (V for O += P·V: keys are the reduction, d is contiguous): SBO = 1024
///   (8 keys to the next 8), LBO = bytes from one column block to the next (64 more of N);
///   the k-th step of 16 keys starts 16·128·k bytes in. The instruction transposes (tnspB).
///
/// **The accumulator layout** (fp32 D of m64nN): warp w of the warpgroup owns rows
/// 16w … 16w + 15; with g = lane / 4 and t = lane % 4, register d[4j + e] holds
///     row 16w + g + 8·(e / 2),  column 8j + 2t + (e % 2)        (j < N/8, e < 4),
/// the m16n8 layout of mma.sync repeated along N. The A-from-registers layout is the
/// m16n8k16 A layout, so two neighbouring 8-column blocks of D, rounded to 16 bits, are
/// one k16 slice of A (pack_a_fragment in tile_math.cuh): P never leaves the registers.
#pragma once

#include <cstdint>

#include "hopper/ptx.cuh"
#include "hopper/wgmma_ops.cuh"

namespace fa::hopper {

/// Descriptor of a 128-byte-swizzled operand starting at `p` (an address inside a
/// 1024-byte-aligned column block); strides in bytes.
//! [descriptor]
__device__ inline uint64_t smem_descriptor(const void* p, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t desc = 0;
  // LAB BEGIN: wgmma descriptor — hint: bits 0–13 the shared address >> 4, 16–29 LBO >> 4, 32–45 SBO >> 4, bit 62 set for the 128-byte swizzle
  desc |= uint64_t((smem_address(p) & 0x3FFFF) >> 4);
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(1) << 62;  // 128-byte swizzle
  // LAB END
  return desc;
}
//! [descriptor]

/// Every earlier register write (A fragments, accumulators) is visible to the next wgmma.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
/// Closes the group of wgmma issued since the last commit.
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/// Waits until at most `kPending` committed groups are unfinished.
template <int kPending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

/// Tells the compiler that the accumulator registers may have changed under it (they are
/// written by the tensor cores between issue and wait), so it neither caches nor moves
/// reads of them across this point.
template <int kCount>
__device__ inline void fence_registers(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// Bytes of one column block of a [rows, 64] tile of 16-bit elements.
constexpr uint32_t column_block_bytes(int rows) { return uint32_t(rows) * 128u; }

/// S[64, N] = A[64, d] · B[N, d]ᵀ with both operands K-major in shared memory: `a` is the
/// first row of this warpgroup's 64 rows in a tile of `a_rows` rows, `b` the first of the
/// N rows of a tile of `b_rows` rows (N unless the product takes part of the tile). d/16
/// instructions in one group (not committed here).
//! [gemm qk]
template <int d, int N, class Elem>
__device__ inline void gemm_qk(float (&acc)[N / 2], const Elem* a, int a_rows, const Elem* b, int b_rows = N) {
  const auto* a_bytes = reinterpret_cast<const unsigned char*>(a);
  const auto* b_bytes = reinterpret_cast<const unsigned char*>(b);
#pragma unroll
  for (int k = 0; k < d / 16; ++k) {
    const int block = k / 4, step = k % 4;  // column block of 64, k16 step inside it
    const uint64_t da = smem_descriptor(a_bytes + block * column_block_bytes(a_rows) + 32 * step, 16, 1024);
    const uint64_t db = smem_descriptor(b_bytes + block * column_block_bytes(b_rows) + 32 * step, 16, 1024);
    wgmma_ss(WgmmaShape<N>{}, Elem{}, acc, da, db, k > 0);
  }
}
//! [gemm qk]

/// O[64, d] += P[64, B_c] · V[B_c, d], P as A fragments in registers (B_c/16 of them),
/// V MN-major in shared memory (a [B_c, d] tile as d/64 column blocks).
template <int d, int B_c, class Elem>
__device__ inline void gemm_pv(float (&acc)[d / 2], const uint32_t (&p)[B_c / 16][4], const Elem* v) {
  const auto* v_bytes = reinterpret_cast<const unsigned char*>(v);
#pragma unroll
  for (int k = 0; k < B_c / 16; ++k) {
    const uint64_t dv = smem_descriptor(v_bytes + k * 16 * 128, column_block_bytes(B_c), 1024);
    wgmma_rs(WgmmaShape<d>{}, Elem{}, acc, p[k], dv, true);
  }
}

}  // namespace fa::hopper
