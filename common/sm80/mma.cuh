// Stage 08: tensor-core fragments — the m16n8k16 MMA, ldmatrix, and who holds what.
//
// One warp-wide instruction, `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`, computes
//     D[16×8] = A[16×16] · B[16×8] + C[16×8]      (A, B 16-bit; C, D fp32)
// with every operand spread over the 32 threads' registers in a fixed pattern, the
// "fragment". Everything in this file is about those patterns. Reusable as is: stage 09
// (the backward) includes it.
//
// Notation: lane = thread index in the warp (0..31), g = lane / 4 ("group", 0..7),
// t = lane % 4 ("thread in group", 0..3). A register of a 16-bit operand holds two
// elements, the lower-indexed one in the low half.
//
// A (16×16, row-major, 4 registers a[0..3] per thread):
//
//            k: 0 ......... 7   8 ......... 15
//   rows 0-7    a[0]: (g, 2t..2t+1)   a[2]: (g, 8+2t..8+2t+1)
//   rows 8-15   a[1]: (8+g, 2t..2t+1) a[3]: (8+g, 8+2t..8+2t+1)
//
//   e.g. lane 5 (g = 1, t = 1) holds A[1][2..3], A[9][2..3], A[1][10..11], A[9][10..11].
//
// B (16×8, "col": element (k, n), 2 registers b[0..1] per thread):
//
//   b[0]: B[2t..2t+1][g]      (k rows 0-7)
//   b[1]: B[8+2t..8+2t+1][g]  (k rows 8-15)
//
//   Column n = g of B is held by the four threads of group g, each two consecutive k.
//   Read as Bᵀ (n rows, k columns) this is the same pattern as the left half of A: so a
//   matrix stored [n][k] row-major (K_j for S = Q K_jᵀ) loads as B without transposing.
//
// C and D (16×8, fp32, 4 registers c[0..3] per thread):
//
//            n: 0 ........ 7
//   rows 0-7    c[0], c[1]: (g, 2t), (g, 2t+1)
//   rows 8-15   c[2], c[3]: (8+g, 2t), (8+g, 2t+1)
//
//   A thread holds two rows (g and 8+g), two adjacent columns of each. One row is spread
//   over the 4 threads of a group (lanes 4g..4g+3): a row reduction (max, sum) is a
//   reduction over those 4 lanes, two __shfl_xor_sync steps (xor 1, xor 2).
//
// Why P can stay in registers (the FlashAttention-2 trick): take two C fragments side by
// side, columns 0-7 (c) and 8-15 (c'), i.e. a 16×16 block of S. Thread (g, t) holds
//     rows g, 8+g × columns 2t..2t+1        (c[0..1], c[2..3])
//     rows g, 8+g × columns 8+2t..8+2t+1    (c'[0..1], c'[2..3])
// which is, element for element, what the A fragment asks that thread for:
//     a[0] = (g, 2t..)  a[1] = (8+g, 2t..)  a[2] = (g, 8+2t..)  a[3] = (8+g, 8+2t..).
// So P = exp(S − m) computed in S's accumulators is converted to 16-bit pairs in place
// and fed to the next MMA (O += P V) as its A operand: no shared memory, no shuffle.
//
// ldmatrix.x4 loads four 8×8 16-bit matrices from shared memory. Threads 8q..8q+7 each
// give the address of one 16-byte row of matrix q; afterwards every thread holds, in
// register q, the elements (row g, columns 2t..2t+1) of matrix q: exactly the fragment
// pattern above. With .trans it holds (rows 2t..2t+1, column g) instead, i.e. the
// fragment of the transposed matrix: how V_j, stored [key][d], becomes the B operand
// (k = key, n = d) of O += P V.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "sm80/tile_index.h"

namespace fa::stage08 {

/// D = A·B + D for one m16n8k16 tile, fp32 accumulation. `Elem` is __nv_bfloat16 or __half.
//! [mma]
template <class Elem>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  static_assert(std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, __half>,
                "tensor-core operands are bf16 or f16");
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
//! [mma]

/// The 32-bit shared-memory address ldmatrix and cp.async take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Four 8×8 matrices; thread 8q+r gives the address of row r of matrix q.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// Same, each matrix transposed on the way into registers.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// Two 8×8 matrices (threads 0..15 give addresses; the others' are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

/// Two 8×8 matrices, transposed.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// ------------------------------------------------------------------------------------
// Which row and 16-byte chunk of a 16×16 block each lane points ldmatrix.x4 at.
//
// A 16×16 block is four 8×8 matrices; the fragment wants them in a fixed order, so the
// lanes' addresses must follow that order. Two patterns cover all four uses:
//
//   pattern X: row = lane % 16, chunk = lane / 16
//     matrices (rows 0-7, chunk 0), (rows 8-15, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 1)
//   pattern Y: row = lane % 8 + 8·(lane / 16), chunk = (lane / 8) % 2
//     matrices (rows 0-7, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 0), (rows 8-15, chunk 1)
//
//   A stored [m][k]  (Q_i, dS ...)   ldmatrix        pattern X → a[0..3]
//   B stored [n][k]  (K_j for Q Kᵀ)  ldmatrix        pattern Y → {b0,b1} of n 0-7, {b0,b1} of n 8-15
//   B stored [k][n]  (V_j for P V)   ldmatrix.trans  pattern X → {b0,b1} of n 0-7, {b0,b1} of n 8-15
//   A stored [k][m]  (for Aᵀ uses)   ldmatrix.trans  pattern Y → a[0..3]
// ------------------------------------------------------------------------------------

// The four functions ldsm_row_x, ldsm_chunk_x, ldsm_row_y, ldsm_chunk_y live in
// tile_index.h (plain C++), so that tests/test_stage08.cpp can check them against the
// PTX rules above on a machine without a GPU.

/// Two fp32 values rounded to one register of two 16-bit values; `lo` goes to the low
/// half (the lower column index), as every fragment expects.
template <class Elem>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    std::memcpy(&r, &v, 4);
  }
  return r;
}

/// The A fragment of a 16×16 block from the C fragments of its two 8-column halves
/// (`left` = columns 0-7, `right` = columns 8-15), rounded to `Elem`. See "Why P can
/// stay in registers" above: the element positions already match.
//! [p from accumulators]
template <class Elem>
__device__ __forceinline__ void accumulators_to_a_fragment(uint32_t (&a)[4], const float (&left)[4],
                                                           const float (&right)[4]) {
  a[0] = pack_pair<Elem>(left[0], left[1]);    // row g,   columns 2t, 2t+1
  a[1] = pack_pair<Elem>(left[2], left[3]);    // row 8+g, columns 2t, 2t+1
  a[2] = pack_pair<Elem>(right[0], right[1]);  // row g,   columns 8+2t, 8+2t+1
  a[3] = pack_pair<Elem>(right[2], right[3]);  // row 8+g, columns 8+2t, 8+2t+1
}
//! [p from accumulators]

}  // namespace fa::stage08
