// Stage 09 — FlashAttention-2's backward on tensor cores (fp16/bf16 in, fp32 accumulation).
//
// What changed from stage 08, and why: stage 08 made the forward fast on tensor cores.
// The backward (stage 06's Algorithm 2, on the CPU) does 2.5× the forward's work, so it
// has to move onto the same hardware; it reuses stage 08's fragments, loads, swizzled
// layout and masks unchanged. What is new is the shape of the loop. dK_j and dV_j are
// sums over all query tiles i, dQ_i a sum over all key tiles j: one of the two has to be
// summed across thread blocks. FlashAttention-2 turns the loop around: one block per key
// tile j holds K_j and V_j for its whole life and streams the query tiles past them, so
// dK_j and dV_j add up in registers and are written once; dQ_i, whose terms now come from
// different blocks, is added up with fp32 atomics in a scratch buffer. A second mode
// (deterministic) replaces the atomics by a second kernel looping the other way, like
// stage 06's separate dQ pass. P is recomputed from L, never stored.
//
// Algorithm (FlashAttention-2, Algorithm 2), three kernels:
//   preprocess:  D = rowsum(dO∘O), L2 = L·log2(e) per query row (fp32)      [N_q] each
//   dK/dV, one block per (batch, kv head, key tile j); warp w owns 16 keys of the tile
//   (layout p_regs; layout p_smem, the default at d = 128: 32 keys, see below):
//     K_j, V_j → shared memory, once;  dK_j = dV_j = 0 (registers, fp32)
//     for each query head of the group, for each query tile i that sees a key of j:
//       Q_i, dO_i, L2_i, D_i → shared memory (cp.async, one step ahead)
//       Sᵀ = K_j Q_iᵀ;  mask (diagonal, tails);  Pᵀ = 2^{Sᵀ·scale·log2(e) − L2_i}
//       dV_j += Pᵀ dO_i;   dPᵀ = V_j dO_iᵀ;   dSᵀ = Pᵀ∘(dPᵀ − D_i);   dK_j += dSᵀ Q_i
//       dSᵀ → shared memory;  dQ_accum_i += dS K_j  (fp32 atomicAdd)
//     write dK_j·scale and dV_j in the input type
//   convert:  dQ = scale·dQ_accum in the input type
//   (deterministic: the dK/dV kernel skips dQ; a dQ kernel per query tile i loops over
//    key tiles j: S = Q_i K_jᵀ, P, dP = dO_i V_jᵀ, dS, dQ_i += dS K_j in registers)
//
// Warp layouts (option --layout, bwd_traits.cuh): p_regs, as above, keeps Pᵀ and dSᵀ in
// the registers of the warp that owns their keys, but every warp reads all of Q_i and dO_i
// twice per step. p_smem (FlashAttention-2's own) splits the warps 4 (keys) × 2: Sᵀ, dPᵀ
// in 32-key × B_r/2-query blocks; Pᵀ, dSᵀ → shared memory; one barrier; dV_j, dK_j in
// 32-key × d/2 blocks from those tiles. Less shared memory is read per step. Layout auto
// (the default) runs p_smem at d = 128 and p_regs at d = 64, the faster of the two at each
// on the H200 (README.md, "Two warp layouts").
//
// Layout: Q, O, dO, dQ [batch][heads][N_q][d]; K, V, dK, dV [batch][kv_heads][N_k][d];
// L [batch][heads][N_q] (docs/design.md §3). Query head h reads kv head h / (heads / kv_heads);
// dK, dV of a kv head sum its query heads. 64-bit offsets.
// Limits: bf16 and f16; d ∈ {64, 128}; pointers 16-byte aligned (L: 4); sm_80+; any
// seq_q, seq_k ≥ 0. Scratch: (2 + d)·N_q fp32 per (batch, head), d·N_q of it only with
// atomics, from a stream-ordered memory pool (see "Scratch memory" below).
// The pieces: bwd_traits.cuh (tile sizes), warp_gemm.cuh (the four product shapes),
// bwd_tile_index.h (which query tiles a key tile meets), and stage 08's mma.cuh,
// smem_tiles.cuh, masking.cuh, softmax.cuh (fast_exp2), tile_index.h.
// Run:    ./build/stages/09_tensor_core_bwd/stage09 --seq-q 4096 --seq-k 4096 --heads 16 --head-dim 128 --backward --bench
//         ... --deterministic     (dQ by a second pass: bitwise reproducible)
//         ... --layout p_regs     (force one warp layout of the dK/dV kernel: p_regs or p_smem)
#include "tensor_core_bwd.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "bwd_tile_index.h"
#include "bwd_traits.cuh"
#include "cuda_utils.h"
#include "dispatch.cuh"
#include "masking.cuh"
#include "mma.cuh"
#include "smem_tiles.cuh"
#include "softmax.cuh"
#include "warp_gemm.cuh"

namespace fa::stage09 {

namespace {

using stage08::fast_exp2;
using stage08::load_tile_async;
using stage08::pack_pair;
using stage08::smem_offset;
using stage08::smem_row_stride;
using stage08::smem_u32;
using stage08::store_tile;

constexpr const char* kStageName = "09_tensor_core_bwd";
constexpr float kLog2e = 1.4426950408889634f;

/// Everything the kernels need to find their tensors.
struct BwdParams {
  const void* Q;
  const void* K;
  const void* V;
  const void* O;
  const void* dO;
  const float* L;
  void* dQ;
  void* dK;
  void* dV;
  float* L2;        // [batch][heads][n_q_pad]     L·log2(e); +inf on rows that see no key and on padding
  float* D;         // [batch][heads][n_q_pad]     rowsum(dO∘O); 0 on padding
  float* dQ_accum;  // [batch][heads][n_q_pad][d]  fp32 sums of dS K_j (atomic mode only)
  int batch, heads, kv_heads, seq_q, seq_k, n_q_pad;
  bool causal;
  float scale;       // softmax scale
  float scale_log2;  // scale·log2(e)
};

// ======================================================================================
// 1. Preprocess: D = rowsum(dO∘O) and L2 = L·log2(e)
// ======================================================================================
//
// D_i = Σ_c dO_ic·O_ic is the one number per row that dS = P∘(dP − D) needs (see the
// notes for why it equals rowsum(P∘dP)). It costs one read of O and dO, so it is done
// once here instead of once per key tile. One warp per row; the rows past seq_q (the
// padding up to n_q_pad) get D = 0 and L2 = +inf, so that the main kernels read whole
// 16-byte chunks without bounds checks and a padded row has P = 2^{−inf} = 0.

/// threadIdx.x, read anew where it is called: `asm volatile` may be neither moved out of a
/// loop nor merged with another read. Values derived from it inside the loop body are then
/// recomputed each iteration (a few integer instructions) instead of being computed once
/// before the loop and kept, which at 255 registers means spilled to local memory and
/// loaded back, with a few hundred cycles of latency, every iteration (see "dQ atomics").
__device__ __forceinline__ int fresh_thread_index() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

/// Two packed 16-bit values as floats.
template <class Elem>
__device__ __forceinline__ float2 unpack_pair(uint32_t v) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    __nv_bfloat162 h;
    std::memcpy(&h, &v, 4);
    return __bfloat1622float2(h);
  } else {
    __half2 h;
    std::memcpy(&h, &v, 4);
    return __half22float2(h);
  }
}

template <class Elem, int kHeadDim>
__global__ void preprocess_kernel(const BwdParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;  // over batch·heads·n_q_pad
  if (row >= int64_t(p.batch) * p.heads * p.n_q_pad) return;
  const int64_t head = row / p.n_q_pad;  // b·heads + h
  const int i = int(row % p.n_q_pad);    // query row
  float D = 0.0f, L2 = INFINITY;
  if (i < p.seq_q) {
    //! [preprocess D]
    const int64_t offset = (head * p.seq_q + i) * kHeadDim;
    const Elem* O = static_cast<const Elem*>(p.O) + offset;
    const Elem* dO = static_cast<const Elem*>(p.dO) + offset;
    float sum = 0.0f;
    for (int c = lane; c < kHeadDim / 8; c += 32) {  // one 16-byte chunk (8 elements) per lane
      const uint4 o = *reinterpret_cast<const uint4*>(O + 8 * c);
      const uint4 g = *reinterpret_cast<const uint4*>(dO + 8 * c);
      const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 of = unpack_pair<Elem>(ow[k]), gf = unpack_pair<Elem>(gw[k]);
        sum = fmaf(of.x, gf.x, fmaf(of.y, gf.y, sum));
      }
    }
#pragma unroll
    for (int step = 16; step >= 1; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
    D = sum;  // D_i = Σ_c dO_ic·O_ic
    //! [preprocess D]
    // L = −inf marks a row that sees no key; +inf makes its P = 2^{s − inf} = 0, not NaN.
    const float L = p.L[head * p.seq_q + i];
    L2 = L == -INFINITY ? INFINITY : L * kLog2e;
  }
  if (lane == 0) {
    p.D[row] = D;
    p.L2[row] = L2;
  }
}

// ======================================================================================
// 2. The dK/dV kernel (and, in atomic mode, the dQ contributions)
// ======================================================================================
//
// Two element-wise steps first, on a warp's block of Sᵀ (or dPᵀ): [16·kM keys, 8·kN
// queries] in C fragments, whose first query column is `L2[0]`, `D[0]` of the step's
// row statistics. Both warp layouts call them: in layout p_regs the block spans all B_r
// queries of the step, in layout p_smem the warp's kQueriesPerWarp of them.

//! [p from scores]
/// Pᵀ = 2^{Sᵀ·scale·log2(e) − L2}, in Sᵀ's registers.
template <int kM, int kN>
__device__ __forceinline__ void recompute_p(float (&St)[kM][kN][4], const float* L2, float scale_log2, int lane) {
  // LAB BEGIN: recompute P — hint: Pᵀ[key][q] = 2^{Sᵀ[key][q]·scale·log2(e) − L2[q]}, where this thread's column of register r of n8 tile nt is q = 8nt + 2t + r % 2 (t = lane % 4)
  // P_ij = e^{scale·S_ij − L_i} = 2^{S_ij·scale·log2(e) − L2_i}: normalised already,
  // because L_i is the log of row i's softmax denominator. One FFMA and one ex2 per
  // score. A masked score (−inf) gives 0; L2 is never −inf (preprocess), so never NaN.
  const int t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
    const float2 l2 = *reinterpret_cast<const float2*>(L2 + 8 * nt + 2 * t);  // columns 2t, 2t+1
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int r = 0; r < 4; ++r) St[mi][nt][r] = fast_exp2(fmaf(St[mi][nt][r], scale_log2, -(r % 2 ? l2.y : l2.x)));
  }
  // LAB END
}

/// dSᵀ = Pᵀ∘(dPᵀ − D), in dPᵀ's registers (dPᵀ is dead once dS exists).
template <int kM, int kN>
__device__ __forceinline__ void ds_from_dp(float (&dPt)[kM][kN][4], const float (&Pt)[kM][kN][4], const float* D,
                                           int lane) {
  // LAB BEGIN: dS — hint: dSᵀ[key][q] = Pᵀ[key][q]·(dPᵀ[key][q] − D[q]), in place of dPᵀ; columns as in "recompute P"
  // dS_ij = P_ij·(dP_ij − D_i), D_i = rowsum(dO∘O)_i (the preprocess).
  const int t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
    const float2 Dq = *reinterpret_cast<const float2*>(D + 8 * nt + 2 * t);  // columns 2t, 2t+1
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int r = 0; r < 4; ++r) dPt[mi][nt][r] = Pt[mi][nt][r] * (dPt[mi][nt][r] - (r % 2 ? Dq.y : Dq.x));
  }
  // LAB END
}
//! [p from scores]

template <class Tr, class Elem, bool kAtomicDq>
__global__ void __launch_bounds__(Tr::kThreads, 1) dkdv_kernel(const BwdParams p) {
  constexpr int d = Tr::kHeadDim, B_r = Tr::kBlockM, B_c = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kKT = Tr::kKeyTiles;        // m16 tiles of keys per warp
  constexpr int kQW = Tr::kQueriesPerWarp;  // queries of the warp's block of Sᵀ (B_r in p_regs)
  constexpr int kDW = Tr::kColsPerWarp;     // columns of the warp's block of dK_j, dV_j (d in p_regs)
  constexpr SmemLayout kLayout = Tr::kLayout;
  // The schedule of "pipeline step". Without the atomics there is no dSᵀ hand-over, so
  // the default schedule has one barrier per step already and is kept.
  constexpr bool kOneBarrier = Tr::kDsBuffers == 2 && kAtomicDq;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // fragment coordinates (stage 08, mma.cuh)
  // The warp's place in the kWarpsKeys × kWarpsSplit grid (bwd_traits.cuh): its keys in
  // the tile, its query columns of Sᵀ, dPᵀ, dSᵀ, its columns of dK_j, dV_j. In layout
  // p_regs (kWarpsSplit = 1) every warp has all B_r queries and all d columns (both 0).
  const int warp_key0 = Tr::warp_key0(warp);  // this warp's first key in the tile
  const int warp_q0 = Tr::warp_q0(warp);      // its first query column of Sᵀ
  const int warp_col0 = Tr::warp_col0(warp);  // its first column of dK_j, dV_j

  //! [block to key tile]
  // Which (batch, kv head, key tile j) this block owns. j varies fastest, so the blocks
  // running at the same time work on few heads: those heads' Q, dO and dQ_accum stay in
  // L2 while every key tile of the head reads and adds to them.
  const int n_key_tiles = (p.seq_k + B_c - 1) / B_c;
  const int j = int(blockIdx.x % n_key_tiles);
  const int64_t kv_head_index = blockIdx.x / n_key_tiles;  // b·kv_heads + kv head
  const int batch = int(kv_head_index / p.kv_heads), kv_head = int(kv_head_index % p.kv_heads);
  const int64_t key0 = int64_t(j) * B_c;
  const int keys = p.seq_k - key0 < B_c ? int(p.seq_k - key0) : B_c;  // valid keys (≥ 1)
  const Elem* K = static_cast<const Elem*>(p.K) + (kv_head_index * p.seq_k + key0) * d;  // [keys, d]
  const Elem* V = static_cast<const Elem*>(p.V) + (kv_head_index * p.seq_k + key0) * d;  // [keys, d]

  // The query tiles this key tile meets, for each of the group's query heads; the loop
  // below walks (head, tile) pairs as one sequence of steps.
  const int group = p.heads / p.kv_heads;
  const QueryTileRange range = query_tile_range(key0, B_c, B_r, p.seq_q, p.seq_k, p.causal);
  const int tiles_per_head = range.end - range.begin;
  const int n_steps = group * tiles_per_head;
  // A step's place: its query head and query tile i. Step 0 is the group's first head at
  // tile range.begin; next() moves one step on. (Counting instead of dividing the step
  // number by tiles_per_head: an integer division costs a few dozen instructions.)
  struct StepPos {
    int head, tile;
  };
  const auto next = [&](StepPos s) {
    return s.tile + 1 == range.end ? StepPos{s.head + 1, range.begin} : StepPos{s.head, s.tile + 1};
  };
  const StepPos first{kv_head * group, range.begin};
  //! [block to key tile]

  const uint32_t sK = smem_u32(smem + Tr::kOffK), sV = smem_u32(smem + Tr::kOffV);
  const uint32_t sQ = smem_u32(smem + Tr::kOffQ), sdO = smem_u32(smem + Tr::kOffdO);
  const uint32_t sdS = smem_u32(smem + Tr::kOffdS), sP = smem_u32(smem + Tr::kOffP);
  const uint32_t sL2 = smem_u32(smem + Tr::kOffL2), sD = smem_u32(smem + Tr::kOffD);

  //! [load a step]
  // Issue the copies of the step at `s` (query head, query tile i) into buffer `buf`, as one
  // cp.async group: Q_i, dO_i (rows past seq_q zero-filled), L2_i and D_i (padded arrays).
  const auto load_step = [&](StepPos s, int buf) {
    const int64_t q0 = int64_t(s.tile) * B_r;
    const int rows = p.seq_q - q0 < B_r ? int(p.seq_q - q0) : B_r;  // valid rows (≥ 1)
    const int64_t q_head = int64_t(batch) * p.heads + s.head;
    const int64_t q_offset = (q_head * p.seq_q + q0) * d;
    load_tile_async<B_r, d, kLayout, Tr::kThreads>(sQ + buf * Tr::kQTileBytes,
                                                    static_cast<const Elem*>(p.Q) + q_offset, rows, tid);
    load_tile_async<B_r, d, kLayout, Tr::kThreads>(sdO + buf * Tr::kQTileBytes,
                                                    static_cast<const Elem*>(p.dO) + q_offset, rows, tid);
    const int64_t stat_offset = q_head * p.n_q_pad + q0;
    if (tid < B_r / 4)  // B_r/4 chunks of 4 floats each
      cp_async_16(sL2 + buf * Tr::kRowStatBytes + 16 * tid, p.L2 + stat_offset + 4 * tid, 16);
    else if (tid < B_r / 2)
      cp_async_16(sD + buf * Tr::kRowStatBytes + 16 * (tid - B_r / 4), p.D + stat_offset + 4 * (tid - B_r / 4), 16);
    cp_async_commit();
  };

  // K_j and V_j once, then the first step; both groups are waited for at the first step.
  load_tile_async<B_c, d, kLayout, Tr::kThreads>(sK, K, keys, tid);
  load_tile_async<B_c, d, kLayout, Tr::kThreads>(sV, V, keys, tid);
  cp_async_commit();
  if (n_steps > 0) load_step(first, 0);
  if constexpr (kOneBarrier) {
    // The one-barrier schedule waits for step s + 1 at the end of step s; step 0 is
    // waited for here, and step 1 starts travelling at once.
    cp_async_wait<0>();
    __syncthreads();
    if (n_steps > 1) load_step(next(first), 1);
  }
  //! [load a step]

  // This warp's rows of K_j and V_j: the A operands of Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ;
  // and (p_smem) its rows of the Pᵀ and dSᵀ tiles: the A operands of dV_j and dK_j.
  const uint32_t sK_warp = sK + 2u * warp_key0 * smem_row_stride(d, kLayout);
  const uint32_t sV_warp = sV + 2u * warp_key0 * smem_row_stride(d, kLayout);
  const uint32_t sP_warp = sP + 2u * warp_key0 * smem_row_stride(B_r, kLayout);
  const uint32_t sdS_warp = sdS + 2u * warp_key0 * smem_row_stride(B_r, kLayout);

  float dK_acc[kKT][kDW / 8][4];  // [16·kKT keys, kDW] this warp's block of dK_j, fp32
  float dV_acc[kKT][kDW / 8][4];  // [16·kKT keys, kDW] this warp's block of dV_j, fp32
  zero(dK_acc);
  zero(dV_acc);

  StepPos pos = first;  // where step `step` is
  for (int step = 0; step < n_steps; ++step, pos = next(pos)) {
    const int buf = kStages == 2 ? step % 2 : 0;
    const int i = pos.tile;  // query tile
    const int64_t q0 = int64_t(i) * B_r;

    //! [pipeline step]
    if constexpr (!kOneBarrier) {
      cp_async_wait<0>();  // this thread's copies of step `step` (and of K_j, V_j) landed
      __syncthreads();     // ... everyone's; and every warp is done with step − 1, so its
                           // buffer and the dSᵀ (p_smem: and Pᵀ) tile may be overwritten
      if constexpr (kStages == 2)
        if (step + 1 < n_steps) load_step(next(pos), buf ^ 1);  // travels while we compute
    }
    //! [pipeline step]

    const uint32_t sQ_i = sQ + buf * Tr::kQTileBytes, sdO_i = sdO + buf * Tr::kQTileBytes;

    // dPᵀ = V_j dO_iᵀ: [16·kKT keys, kQW queries], the same shape of product as Sᵀ below
    // (B: the warp's kQW rows of dO_i). Layout p_smem computes it first, p_regs after
    // dV_j: each order is the one the compiler spills fewer registers with in its layout.
    const uint32_t sdO_warp = sdO_i + 2u * warp_q0 * smem_row_stride(d, kLayout);
    float dPt[kKT][kQW / 8][4];
    const auto dp_product = [&] {
      zero(dPt);
      gemm_abt<Elem, kKT, kQW / 8, d / 16, d, d, kLayout>(dPt, sV_warp, sdO_warp, lane);
    };
    if constexpr (Tr::kPInSmem) dp_product();

    //! [recompute P]
    // Sᵀ = K_j Q_iᵀ: this warp's [16·kKT keys, kQW queries] block, C fragments; B is the
    // warp's kQW rows of Q_i. Keys are the rows here (the transpose of stage 08's S). In
    // layout p_regs the block spans all B_r queries, so the warp's Pᵀ and dSᵀ are already
    // the A operands of dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i, in its own registers.
    const uint32_t sQ_warp = sQ_i + 2u * warp_q0 * smem_row_stride(d, kLayout);
    float St[kKT][kQW / 8][4];
    zero(St);
    gemm_abt<Elem, kKT, kQW / 8, d / 16, d, d, kLayout>(St, sK_warp, sQ_warp, lane);

    // Diagonal and ragged tiles only: a score the mask removes becomes −inf. The warp's
    // block is masked as a query tile of its own: kQW queries from q0 + warp_q0.
    if (range.masked(i)) {
      stage08::mask_fragments(St, lane, [&](int r) {
        const QueryColumns c =
            visible_query_columns(key0 + warp_key0 + r, q0 + warp_q0, kQW, p.seq_q, p.seq_k, p.causal);
        return stage08::ColumnRange{c.begin, c.end};
      });
    }

    // Pᵀ = 2^{Sᵀ·scale·log2(e) − L2_i}, with L2_i of the warp's query columns.
    const float* L2_i = reinterpret_cast<const float*>(smem + Tr::kOffL2) + buf * B_r;  // [B_r]
    recompute_p(St, L2_i + warp_q0, p.scale_log2, lane);
    //! [recompute P]

    //! [dV dP dS dK]
    if constexpr (!Tr::kPInSmem) {
      // dV_j += Pᵀ dO_i: [16·kKT, d] += [16·kKT, B_r]·[B_r, d]. Pᵀ is rounded to Elem in
      // registers; dO_i is stored [query][d] = B stored [k][n]: ldmatrix.trans.
      gemm_acc_b<Elem, kKT, d / 8, B_r / 16, d, kLayout>(dV_acc, St, sdO_i, lane);
      dp_product();  // dPᵀ = V_j dO_iᵀ (see above)
    } else {
      // p_smem: the warp holds only kQW of the B_r queries that dV_j's rows sum over, so
      // Pᵀ goes to its tile [B_c, B_r] as Elem (the value the MMA would round it to).
      store_c_fragments<Elem, B_r, kLayout>(reinterpret_cast<Elem*>(smem + Tr::kOffP), St, warp_key0, warp_q0, lane);
    }

    // dSᵀ = Pᵀ∘(dPᵀ − D_i), in dPᵀ's registers.
    const float* D_i = reinterpret_cast<const float*>(smem + Tr::kOffD) + buf * B_r;  // [B_r]
    ds_from_dp(dPt, St, D_i + warp_q0, lane);

    if constexpr (!Tr::kPInSmem) {
      // dK_j += dSᵀ Q_i (the factor scale is applied once, when dK_j is written).
      gemm_acc_b<Elem, kKT, d / 8, B_r / 16, d, kLayout>(dK_acc, dPt, sQ_i, lane);
    } else {
      // dSᵀ → its tile, as Pᵀ above; it serves dK_j here and the dQ product below.
      store_c_fragments<Elem, B_r, kLayout>(reinterpret_cast<Elem*>(smem + Tr::kOffdS), dPt, warp_key0, warp_q0,
                                            lane);
      __syncthreads();  // the Pᵀ and dSᵀ tiles are complete: a warp's rows of them were
                        // written by the kWarpsSplit warps that share its keys. The next
                        // step's first barrier keeps them until every warp is done.
      // The warps re-form over [B_c, d]: the same keys, and columns warp_col0.. of dK_j,
      // dV_j, summed over all B_r queries. A = the warp's rows of the Pᵀ (dSᵀ) tile,
      // [key][query] = A stored [m][k]; B = dO_i (Q_i), [query][d] = B stored [k][n].
      // dV_j += Pᵀ dO_i, then dK_j += dSᵀ Q_i.
      gemm_ab<Elem, kKT, kDW / 8, B_r / 16, B_r, d, kLayout>(dV_acc, sP_warp, sdO_i, warp_col0, lane);
      gemm_ab<Elem, kKT, kDW / 8, B_r / 16, B_r, d, kLayout>(dK_acc, sdS_warp, sQ_i, warp_col0, lane);
    }
    //! [dV dP dS dK]

    if constexpr (kAtomicDq) {
      //! [dQ atomics]
      const int ds_buf = kOneBarrier ? buf : 0;
      if constexpr (!Tr::kPInSmem) {
        // dQ_i += dS K_j sums over the keys of the tile, which are spread over all warps:
        // the warps hand dSᵀ over through shared memory, as Elem (the value the MMA would
        // round it to anyway). (Layout p_smem wrote and published the tile above.)
        store_c_fragments<Elem, B_r, kLayout>(reinterpret_cast<Elem*>(smem + Tr::kOffdS + ds_buf * Tr::kDsTileBytes),
                                              dPt, warp_key0, 0, lane);
        if constexpr (kOneBarrier) {
          //! [one barrier]
          // The step's only barrier. Before it: this step's dSᵀ stores and the copies of
          // step + 1 (issued one step ago) by every thread. After it: every warp is done
          // with Q_i, dO_i, L2_i, D_i (the dQ product below reads only dSᵀ and K_j), so
          // step + 2 may be loaded into their buffer; and step + 1 writes the other dSᵀ
          // tile, whose readers (the dQ product of step − 1) all passed this barrier.
          cp_async_wait<0>();
          __syncthreads();
          if (step + 2 < n_steps) load_step(next(next(pos)), buf);
          //! [one barrier]
        } else {
          __syncthreads();  // all of dSᵀ [B_c, B_r] is in shared memory
        }
      }

      // dQ_i (partial, this key tile) = dS K_j: [B_r, d] = [B_r, B_c]·[B_c, d], the warps
      // laid out as a kWarpsMdQ × kWarpsNdQ grid over [B_r, d]. dS is stored transposed
      // ([key][query] = A stored [k][m]) and K_j is [key][d] = B stored [k][n].
      constexpr int kMq = Tr::kRowsDq / 16, kNq = Tr::kColsDq / 8;
      const int wm = warp / Tr::kWarpsNdQ, wn = warp % Tr::kWarpsNdQ;
      float dQ_acc[kMq][kNq][4];
      zero(dQ_acc);
      gemm_atb<Elem, kMq, kNq, B_c / 16, B_r, d, kLayout>(dQ_acc, sdS + ds_buf * Tr::kDsTileBytes, wm * Tr::kRowsDq,
                                                          sK, wn * Tr::kColsDq, lane);

      // LAB BEGIN: dQ atomics — hint: thread (g, t) adds its pairs (row g or 8+g, columns 2t, 2t+1) of each m16n8 piece to dQ_accum with atomicAdd, rows < seq_q only
      // Add this block's part to dQ_accum (fp32, zeroed before the kernel). Many blocks
      // (every key tile j of the kv head) add to the same rows, in no fixed order.
      // The thread's first element (row wm·kRowsDq + g, column wn·kColsDq + 2t) of this
      // step's dQ_accum tile; every other element it adds to is a compile-time offset from
      // it, (16·mi + 8·h)·d + 8·nt, which the atomics take as an immediate. In layout p_smem
      // the thread's coordinates are derived afresh from threadIdx.x: derived from `tid`,
      // the compiler computed the per-thread offsets once before the loop, could not keep
      // them in registers, and reloaded them from local memory before the atomics of every
      // step (Nsight Compute: 14% of the warps' stall samples waited on those loads). In
      // layout p_regs the fresh read measured 3% slower, so it keeps `tid`.
      const int tid_a = Tr::kPInSmem ? fresh_thread_index() : tid, warp_a = tid_a / 32;
      const int row0 = warp_a / Tr::kWarpsNdQ * Tr::kRowsDq + (tid_a % 32) / 4;
      const int col0 = warp_a % Tr::kWarpsNdQ * Tr::kColsDq + 2 * (tid_a % 4);
      float* dQ_thread = p.dQ_accum + ((int64_t(batch) * p.heads + pos.head) * p.n_q_pad + q0 + row0) * d + col0;
      const int64_t rows_left = p.seq_q - (q0 + row0);  // rows row0 + r with r < rows_left exist
#pragma unroll
      for (int mi = 0; mi < kMq; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = 16 * mi + 8 * h;  // the row, counted from row0
          if (r >= rows_left) continue;   // padding rows: their dS is 0; skip the traffic
#pragma unroll
          for (int nt = 0; nt < kNq; ++nt) {
            float* dst = dQ_thread + r * d + 8 * nt;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst), make_float2(dQ_acc[mi][nt][2 * h], dQ_acc[mi][nt][2 * h + 1]));
#else
            atomicAdd(dst, dQ_acc[mi][nt][2 * h]);
            atomicAdd(dst + 1, dQ_acc[mi][nt][2 * h + 1]);
#endif
          }
        }
      // LAB END
      //! [dQ atomics]
    }

    if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with the only buffer
      if (step + 1 < n_steps) load_step(next(pos), 0);
    }
  }

  //! [write dK dV]
  // dK_j = scale·Σ dSᵀ Q_i and dV_j, rounded to Elem, via shared memory (K_j's and V_j's
  // own buffers, free now) into 16-byte coalesced stores of the valid keys.
  cp_async_wait<0>();  // nothing may still be landing in shared memory
  __syncthreads();     // every warp is done reading K_j (the dQ product reads all of it)
  Elem* dK_smem = reinterpret_cast<Elem*>(smem + Tr::kOffK);
  Elem* dV_smem = reinterpret_cast<Elem*>(smem + Tr::kOffV);
  // Each warp writes its block: keys warp_key0.., columns warp_col0.. (all d in p_regs).
  // (One loop for both tiles, as before layout p_smem existed: two store_c_fragments calls
  // compile p_regs differently, with a few more spills at d = 64.)
#pragma unroll
  for (int mi = 0; mi < kKT; ++mi)
#pragma unroll
    for (int dt = 0; dt < kDW / 8; ++dt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Column warp_col0 + 8dt + 2t: chunk warp_col0/8 + dt, element 2t.
        const int key = warp_key0 + 16 * mi + g + 8 * h;
        const int at = smem_offset(key, warp_col0 / 8 + dt, d, kLayout) + 2 * t;
        *reinterpret_cast<uint32_t*>(dK_smem + at) =
            pack_pair<Elem>(p.scale * dK_acc[mi][dt][2 * h], p.scale * dK_acc[mi][dt][2 * h + 1]);
        *reinterpret_cast<uint32_t*>(dV_smem + at) = pack_pair<Elem>(dV_acc[mi][dt][2 * h], dV_acc[mi][dt][2 * h + 1]);
      }
  __syncthreads();  // the whole tiles are in shared memory
  store_tile<B_c, d, kLayout, Tr::kThreads>(static_cast<Elem*>(p.dK) + (kv_head_index * p.seq_k + key0) * d, dK_smem,
                                            keys, tid);
  store_tile<B_c, d, kLayout, Tr::kThreads>(static_cast<Elem*>(p.dV) + (kv_head_index * p.seq_k + key0) * d, dV_smem,
                                            keys, tid);
  //! [write dK dV]
}

// ======================================================================================
// 3. The deterministic dQ kernel: one block per query tile, a loop over key tiles
// ======================================================================================
//
// The forward's loop (stage 08) with the backward's recomputation: warp w owns 16 rows
// of Q_i and dO_i; for each key tile j the block sees, S, P, dP and dS are recomputed
// (they were computed by the dK/dV kernel too: this mode pays 3 of the 5 products again)
// and dQ_i += dS K_j accumulates in registers, in a fixed order: bitwise reproducible.

template <class Tr, class Elem>
__global__ void __launch_bounds__(Tr::kThreads) dq_kernel(const BwdParams p) {
  constexpr int d = Tr::kHeadDim, B_r = Tr::kBlockM, B_c = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kM = Tr::kMTiles;
  constexpr SmemLayout kLayout = Tr::kLayout;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = warp * Tr::kRowsPerWarp;

  // (batch, head, query tile i); the tiles with the most keys (the last ones, under a
  // causal mask) are scheduled first.
  const int n_query_tiles = (p.seq_q + B_r - 1) / B_r;
  const int i = n_query_tiles - 1 - int(blockIdx.x % n_query_tiles);
  const int64_t q_head = blockIdx.x / n_query_tiles;  // b·heads + h
  const int batch = int(q_head / p.heads), head = int(q_head % p.heads);
  const int64_t kv_head_index = int64_t(batch) * p.kv_heads + head / (p.heads / p.kv_heads);
  const int64_t q0 = int64_t(i) * B_r;
  const int rows = p.seq_q - q0 < B_r ? int(p.seq_q - q0) : B_r;  // valid rows (≥ 1)
  const Elem* K = static_cast<const Elem*>(p.K) + kv_head_index * p.seq_k * d;  // [N_k, d]
  const Elem* V = static_cast<const Elem*>(p.V) + kv_head_index * p.seq_k * d;  // [N_k, d]
  Elem* dQ = static_cast<Elem*>(p.dQ) + (q_head * p.seq_q + q0) * d;            // [rows, d]
  const stage08::KvTileRange range = stage08::kv_tile_range(q0, rows, p.seq_q, p.seq_k, p.causal, B_c, true);

  if (range.n_tiles == 0) {  // no row of the tile sees a key: dQ_i = 0
    for (int c = tid; c < rows * (d / 8); c += Tr::kThreads)
      *reinterpret_cast<uint4*>(dQ + int64_t(c) * 8) = make_uint4(0, 0, 0, 0);
    return;
  }

  const uint32_t sQ = smem_u32(smem + Tr::kOffQ), sdO = smem_u32(smem + Tr::kOffdO);
  const uint32_t sK = smem_u32(smem + Tr::kOffK), sV = smem_u32(smem + Tr::kOffV);
  const auto load_kv = [&](int jj, int buf) {
    const int64_t k0 = int64_t(jj) * B_c;
    const int keys = p.seq_k - k0 < B_c ? int(p.seq_k - k0) : B_c;
    load_tile_async<B_c, d, kLayout, Tr::kThreads>(sK + buf * Tr::kKVTileBytes, K + k0 * d, keys, tid);
    load_tile_async<B_c, d, kLayout, Tr::kThreads>(sV + buf * Tr::kKVTileBytes, V + k0 * d, keys, tid);
    cp_async_commit();
  };
  const int64_t q_offset = (q_head * p.seq_q + q0) * d;
  load_tile_async<B_r, d, kLayout, Tr::kThreads>(sQ, static_cast<const Elem*>(p.Q) + q_offset, rows, tid);
  load_tile_async<B_r, d, kLayout, Tr::kThreads>(sdO, static_cast<const Elem*>(p.dO) + q_offset, rows, tid);
  load_kv(0, 0);  // one group: Q_i, dO_i, K_0, V_0

  // L2 and D of this thread's rows (g and 8+g of each m16 tile), from the padded arrays.
  float L2_row[kM][2], D_row[kM][2];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t at = q_head * p.n_q_pad + q0 + warp_row0 + 16 * mi + g + 8 * h;
      L2_row[mi][h] = p.L2[at];
      D_row[mi][h] = p.D[at];
    }

  const uint32_t sQ_warp = sQ + 2u * warp_row0 * smem_row_stride(d, kLayout);
  const uint32_t sdO_warp = sdO + 2u * warp_row0 * smem_row_stride(d, kLayout);
  float dQ_acc[kM][d / 8][4];  // [16·kM rows, d] this warp's rows of dQ_i, fp32
  zero(dQ_acc);

  for (int jj = 0; jj < range.n_tiles; ++jj) {
    const int buf = kStages == 2 ? jj % 2 : 0;
    cp_async_wait<0>();  // this thread's part of K_jj, V_jj (and at first Q_i, dO_i) landed
    __syncthreads();     // everyone's; every warp is done with tile jj − 1's buffer
    if constexpr (kStages == 2)
      if (jj + 1 < range.n_tiles) load_kv(jj + 1, buf ^ 1);
    const uint32_t sK_j = sK + buf * Tr::kKVTileBytes, sV_j = sV + buf * Tr::kKVTileBytes;

    //! [dq pass]
    // S = Q_i K_jᵀ [16·kM, B_c]; mask on-band tiles (stage 08's mask); P = 2^{S·c − L2}.
    float S[kM][B_c / 8][4];
    zero(S);
    gemm_abt<Elem, kM, B_c / 8, d / 16, d, d, kLayout>(S, sQ_warp, sK_j, lane);
    if (jj >= range.n_unmasked)
      stage08::mask_causal_and_tail(S, lane, q0 + warp_row0, int64_t(jj) * B_c, p.seq_q, p.seq_k, p.causal);
    // dP = dO_i V_jᵀ [16·kM, B_c]
    float dP[kM][B_c / 8][4];
    zero(dP);
    gemm_abt<Elem, kM, B_c / 8, d / 16, d, d, kLayout>(dP, sdO_warp, sV_j, lane);
    // P = 2^{S·scale·log2(e) − L2} (0 where masked), dS = P∘(dP − D), kept in dP's registers
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int nt = 0; nt < B_c / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float P = fast_exp2(fmaf(S[mi][nt][r], p.scale_log2, -L2_row[mi][r / 2]));
          dP[mi][nt][r] = P * (dP[mi][nt][r] - D_row[mi][r / 2]);
        }
    // dQ_i += dS K_j: dS's accumulators are the A operand; K_j [key][d] = B stored [k][n].
    gemm_acc_b<Elem, kM, d / 8, B_c / 16, d, kLayout>(dQ_acc, dP, sK_j, lane);
    //! [dq pass]

    if constexpr (kStages == 1) {
      __syncthreads();
      if (jj + 1 < range.n_tiles) load_kv(jj + 1, 0);
    }
  }

  // dQ_i = scale·dQ_acc: fragments → this warp's own rows of the Q_i buffer → 16-byte
  // stores of the valid rows (as stage 08 writes O_i).
  cp_async_wait<0>();
  Elem* dQ_smem = reinterpret_cast<Elem*>(smem + Tr::kOffQ);
  __syncwarp();
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int dt = 0; dt < d / 8; ++dt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + 16 * mi + g + 8 * h;
        *reinterpret_cast<uint32_t*>(dQ_smem + smem_offset(row, dt, d, kLayout) + 2 * t) =
            pack_pair<Elem>(p.scale * dQ_acc[mi][dt][2 * h], p.scale * dQ_acc[mi][dt][2 * h + 1]);
      }
  __syncwarp();
  store_tile<Tr::kRowsPerWarp, d, kLayout, 32>(dQ + int64_t(warp_row0) * d,
                                                dQ_smem + warp_row0 * smem_row_stride(d, kLayout), rows - warp_row0,
                                                lane);
}

// ======================================================================================
// 4. Atomic mode's last step: dQ = scale·dQ_accum in the input type
// ======================================================================================

template <class Elem, int kHeadDim>
__global__ void convert_dq_kernel(const BwdParams p) {
  constexpr int kChunks = kHeadDim / 8;  // 8 elements per thread: two float4 in, 16 bytes out
  const int64_t total = int64_t(p.batch) * p.heads * p.seq_q * kChunks;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < total; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / kChunks;  // (b·heads + h)·seq_q + i
    const int64_t head = row / p.seq_q, i = row % p.seq_q;
    const float* src = p.dQ_accum + (head * p.n_q_pad + i) * kHeadDim + 8 * (c % kChunks);
    const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
    const uint4 out = make_uint4(pack_pair<Elem>(p.scale * a.x, p.scale * a.y), pack_pair<Elem>(p.scale * a.z, p.scale * a.w),
                                 pack_pair<Elem>(p.scale * b.x, p.scale * b.y), pack_pair<Elem>(p.scale * b.z, p.scale * b.w));
    *reinterpret_cast<uint4*>(static_cast<Elem*>(p.dQ) + row * kHeadDim + 8 * (c % kChunks)) = out;
  }
}

// ======================================================================================
// 5. Host side: scratch memory, checks, variant selection, launches
// ======================================================================================

//! [scratch memory]
// Scratch memory (L2, D, dQ_accum) comes from a memory pool of this stage, allocated and
// freed in stream order (cudaMallocFromPoolAsync / cudaFreeAsync). The pool keeps its
// memory between calls (release threshold: unlimited), so after the first call a
// backward neither calls cudaMalloc nor synchronises the device, and the benchmark times
// kernels, not allocations. Stream ordering also makes concurrent calls on different
// streams safe, which a single cached buffer would not be.
cudaMemPool_t scratch_pool() {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;  // one per device
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool;
  FA_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep_all = UINT64_MAX;
  FA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  pools[device] = pool;
  return pool;
}

/// One call's scratch, freed (in stream order) when it goes out of scope.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    const cudaError_t err = cudaMallocFromPoolAsync(&ptr_, bytes, scratch_pool(), stream);
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      std::ostringstream s;
      s << kStageName << ": cannot allocate " << bytes / (1 << 20) << " MiB of scratch (L2, D, dQ_accum) on the GPU ("
        << free_b / (1 << 20) << " MiB free): " << cudaGetErrorString(err);
      throw std::runtime_error(s.str());
    }
  }
  ~Scratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};
//! [scratch memory]

/// Rows per (batch, head) in the scratch arrays: seq_q rounded up to kQueryPad.
int64_t padded_rows(const Problem& p) { return (int64_t(p.seq_q) + kQueryPad - 1) / kQueryPad * kQueryPad; }

/// Bytes of scratch one call takes.
size_t scratch_bytes(const Problem& p, bool deterministic) {
  const int64_t rows = int64_t(p.batch) * p.heads * padded_rows(p);
  return size_t(rows) * sizeof(float) * (2 + (deterministic ? 0 : p.head_dim));
}

/// Calls fn(TypeTag<DkDv traits>{}, TypeTag<Dq traits>{}) for the variant `o` selects.
template <class Elem, int kHeadDim, class Fn>
void with_variant(const Options& o, Fn&& fn) {
  using Tiles = DefaultTiles<kHeadDim>;
  using Dq = TypeTag<typename Tiles::Dq>;
  // Layout auto takes p_smem where the tuning sweep measured it faster (d = 128: +3–5 %;
  // at d = 64 it was 5 % slower) and where it is built (the wide tile, schedule
  // two_barriers, no ablation); p_regs everywhere else.
  const bool p_smem_fits = o.schedule == Schedule::TwoBarriers && o.tile == Tile::Wide && o.ablation == Ablation::None;
  if (o.layout == WarpLayout::Auto && kHeadDim == 128 && p_smem_fits) {
    fn(TypeTag<typename Tiles::DkDvPSmem>{}, Dq{});
    return;
  }
  if (o.layout == WarpLayout::PSmem) {
    if (!p_smem_fits)
      throw std::invalid_argument(
          std::string(kStageName) +
          ": layout p_smem is built on the wide tile with schedule two_barriers and no ablation only (asked: " +
          "tile " + tile_names()[size_t(o.tile)] + ", schedule " + schedule_names()[size_t(o.schedule)] +
          ", ablation " + ablation_names()[size_t(o.ablation)] + "); use layout p_regs for those");
    fn(TypeTag<typename Tiles::DkDvPSmem>{}, Dq{});
    return;
  }
  if (o.schedule == Schedule::OneBarrier) {
    if (o.tile != Tile::Wide || o.ablation != Ablation::None)
      throw std::invalid_argument(std::string(kStageName) +
                                  ": schedule one_barrier is built on the wide tile without ablation only (asked: " +
                                  "tile " + tile_names()[size_t(o.tile)] + ", ablation " +
                                  ablation_names()[size_t(o.ablation)] + ")");
    fn(TypeTag<typename Tiles::DkDvOneBarrier>{}, Dq{});
    return;
  }
  if (o.tile == Tile::Narrow) {
    if (o.ablation != Ablation::None)
      throw std::invalid_argument(std::string(kStageName) +
                                  ": ablations are built on the wide (default) tile only; use tile = wide with an ablation");
    fn(TypeTag<typename Tiles::DkDvNarrow>{}, Dq{});
    return;
  }
  if (o.ablation == Ablation::None) {
    fn(TypeTag<typename Tiles::DkDv>{}, Dq{});
    return;
  }
  // Ablation variants: bf16 only (the benchmark's ablation table), to keep the build short.
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    using A = Ablated<typename Tiles::DkDv>;
    switch (o.ablation) {
      case Ablation::NoPipeline: fn(TypeTag<typename A::NoPipeline>{}, Dq{}); return;
      case Ablation::NoSwizzle: fn(TypeTag<typename A::NoSwizzle>{}, Dq{}); return;
      case Ablation::None: break;
    }
  }
  throw std::invalid_argument(std::string(kStageName) + ": ablation '" + ablation_names()[size_t(o.ablation)] +
                              "' is built for bf16 only (asked: f16)");
}

template <class Fn>
void with_kernels(Dtype dtype, int head_dim, const Options& o, Fn&& fn) {
  const auto for_elem = [&](auto elem_tag) {
    using Elem = decltype(elem_tag);
    const auto call = [&](auto dkdv_tag, auto dq_tag) { fn(elem_tag, dkdv_tag, dq_tag); };
    if (head_dim == 64) with_variant<Elem, 64>(o, call);
    else with_variant<Elem, 128>(o, call);
  };
  with_dtype(dtype, for_elem);
}

/// Grid of the dK/dV kernel: one block per (batch, kv head, key tile).
int64_t dkdv_blocks(const Problem& p, int block_n) {
  return int64_t(p.batch) * p.kv_heads * ((int64_t(p.seq_k) + block_n - 1) / block_n);
}
/// Grid of the dQ kernel: one block per (batch, head, query tile).
int64_t dq_blocks(const Problem& p, int block_m) {
  return int64_t(p.batch) * p.heads * ((int64_t(p.seq_q) + block_m - 1) / block_m);
}

/// Every refusal of a problem happens here, before anything is launched or written.
void check_request(const Problem& p, Dtype dtype) {
  require_tensor_core_request(kStageName, p, dtype, supported_head_dims());
  const int64_t blocks = std::max(dkdv_blocks(p, 64), dq_blocks(p, 64));  // the smallest tiles give the most blocks
  if (blocks > INT_MAX)
    throw std::invalid_argument(std::string(kStageName) + ": the problem needs " + std::to_string(blocks) +
                                " thread blocks, more than the grid's " + std::to_string(INT_MAX) +
                                " (batch·heads·ceil(seq/64))");
}

void check_pointer(const char* name, const void* ptr, size_t alignment) {
  require_device_pointer(kStageName, name, ptr, alignment,
                         alignment == 16 ? "tiles move in 16-byte copies" : "L is fp32");
}

/// Raises a kernel's dynamic shared-memory limit (needed above 48 KB); cheap, so it is
/// done before every launch and holds on whichever device is current.
void allow_smem(const void* kernel, int bytes) {
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class Elem, class DkDv, class Dq>
void launch_all(const Problem& p, BwdParams& params, bool deterministic, cudaStream_t stream) {
  constexpr int d = DkDv::kHeadDim;
  const int64_t n_q_pad = padded_rows(p);
  params.n_q_pad = int(n_q_pad);
  Scratch scratch(scratch_bytes(p, deterministic), stream);
  const int64_t stat_elems = int64_t(p.batch) * p.heads * n_q_pad;
  if (scratch.floats() != nullptr) {
    params.L2 = scratch.floats();
    params.D = params.L2 + stat_elems;
    params.dQ_accum = deterministic ? nullptr : params.D + stat_elems;
  }

  if (p.seq_q > 0) {
    if (!deterministic)  // the atomics add to it
      FA_CUDA_CHECK(cudaMemsetAsync(params.dQ_accum, 0, size_t(stat_elems) * d * sizeof(float), stream));
    const int64_t rows = stat_elems, rows_per_block = 256 / 32;
    preprocess_kernel<Elem, d><<<unsigned((rows + rows_per_block - 1) / rows_per_block), 256, 0, stream>>>(params);
    FA_CHECK_LAUNCH("09_tensor_core_bwd: preprocess_kernel");
  }
  if (p.seq_k > 0) {  // with seq_q = 0 it still runs: it writes dK = dV = 0
    const auto launch_dkdv = [&](auto kernel) {
      allow_smem(reinterpret_cast<const void*>(kernel), DkDv::kSmemBytes);
      kernel<<<unsigned(dkdv_blocks(p, DkDv::kBlockN)), DkDv::kThreads, DkDv::kSmemBytes, stream>>>(params);
      FA_CHECK_LAUNCH("09_tensor_core_bwd: dkdv_kernel");
    };
    if (deterministic) launch_dkdv(dkdv_kernel<DkDv, Elem, false>);
    else launch_dkdv(dkdv_kernel<DkDv, Elem, true>);
  }
  if (p.seq_q > 0) {
    if (deterministic) {
      allow_smem(reinterpret_cast<const void*>(dq_kernel<Dq, Elem>), Dq::kSmemBytes);
      dq_kernel<Dq, Elem><<<unsigned(dq_blocks(p, Dq::kBlockM)), Dq::kThreads, Dq::kSmemBytes, stream>>>(params);
      FA_CHECK_LAUNCH("09_tensor_core_bwd: dq_kernel");
    } else {
      const int64_t chunks = int64_t(p.batch) * p.heads * p.seq_q * (d / 8);
      const unsigned blocks = unsigned(std::min<int64_t>((chunks + 255) / 256, 132 * 32));
      convert_dq_kernel<Elem, d><<<blocks, 256, 0, stream>>>(params);
      FA_CHECK_LAUNCH("09_tensor_core_bwd: convert_dq_kernel");
    }
  }
}


}  // namespace

// ======================================================================================
// Public entry points
// ======================================================================================

const std::vector<int>& supported_head_dims() {
  static const std::vector<int> dims{64, 128};
  return dims;
}

const std::vector<std::string>& ablation_names() {
  static const std::vector<std::string> names{"none", "no_pipeline", "no_swizzle"};
  return names;
}

Ablation parse_ablation(const std::string& name) {
  const auto& names = ablation_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return Ablation(i);
  throw std::invalid_argument(std::string(kStageName) + ": ablation '" + name +
                              "' is not one of none, no_pipeline, no_swizzle");
}

const std::vector<std::string>& tile_names() {
  static const std::vector<std::string> names{"wide", "narrow"};
  return names;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"two_barriers", "one_barrier"};
  return names;
}

const std::vector<std::string>& layout_names() {
  static const std::vector<std::string> names{"auto", "p_regs", "p_smem"};
  return names;
}

void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream) {
  backward(p, dtype, Q, K, V, O, L, dO, dQ, dK, dV, stream, current_options());
}

void backward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, const void* O,
              const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
              const Options& options) {
  check_request(p, dtype);
  if (p.q_elems() > 0) {
    check_pointer("Q", Q, 16);
    check_pointer("O", O, 16);
    check_pointer("dO", dO, 16);
    check_pointer("dQ", dQ, 16);
    check_pointer("L", L, alignof(float));
  }
  if (p.kv_elems() > 0) {
    check_pointer("K", K, 16);
    check_pointer("V", V, 16);
    check_pointer("dK", dK, 16);
    check_pointer("dV", dV, 16);
  }
  if (p.q_elems() == 0 && p.kv_elems() == 0) return;
  BwdParams params{};
  params.Q = Q;
  params.K = K;
  params.V = V;
  params.O = O;
  params.dO = dO;
  params.L = L;
  params.dQ = dQ;
  params.dK = dK;
  params.dV = dV;
  params.batch = p.batch;
  params.heads = p.heads;
  params.kv_heads = p.kv_heads;
  params.seq_q = p.seq_q;
  params.seq_k = p.seq_k;
  params.causal = p.causal;
  params.scale = p.softmax_scale();
  params.scale_log2 = params.scale * kLog2e;
  with_kernels(dtype, p.head_dim, options, [&](auto elem_tag, auto dkdv_tag, auto dq_tag) {
    using Elem = decltype(elem_tag);
    launch_all<Elem, typename decltype(dkdv_tag)::type, typename decltype(dq_tag)::type>(p, params,
                                                                                         options.deterministic, stream);
  });
}

std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype, bool with_gpu) {
  check_request(p, dtype);
  const Options o = current_options();
  std::vector<std::pair<std::string, std::string>> rows;
  with_kernels(dtype, p.head_dim, o, [&](auto elem_tag, auto dkdv_tag, auto dq_tag) {
    using Elem = decltype(elem_tag);
    using DkDv = typename decltype(dkdv_tag)::type;
    using Dq = typename decltype(dq_tag)::type;
    std::ostringstream tile, dq, scratch;
    tile << "dK/dV: B_c=" << DkDv::kBlockN << " keys per block (" << DkDv::kWarps << " warps of "
         << DkDv::kKeysPerWarp << "), B_r=" << DkDv::kBlockM << " query rows per step, " << DkDv::kStages
         << " Q/dO stage(s), "
         << (DkDv::kLayout == SmemLayout::Swizzled ? "swizzled" : DkDv::kLayout == SmemLayout::Padded ? "padded" : "plain")
         << " smem, "
         << ((o.deterministic || DkDv::kDsBuffers == 2) && !DkDv::kPInSmem ? "one barrier" : "two barriers")
         << " per step";
    if (DkDv::kPInSmem)
      tile << "; layout p_smem: warp grid " << DkDv::kWarpsKeys << " (keys) x " << DkDv::kWarpsSplit
           << " (queries of Sᵀ, dPᵀ; columns of dK, dV), Pᵀ and dSᵀ through shared memory";
    else
      tile << "; layout p_regs: Pᵀ and dSᵀ in registers";
    if (o.deterministic)
      dq << "deterministic: a second kernel, B_r=" << Dq::kBlockM << " rows per block (" << Dq::kWarps
         << " warps), B_c=" << Dq::kBlockN << " keys per step";
    else
      dq << "fp32 atomicAdd into dQ_accum (warp grid " << DkDv::kWarpsMdQ << " x " << DkDv::kWarpsNdQ
         << " over [B_r, d]), then a conversion kernel";
    scratch << scratch_bytes(p, o.deterministic) << " B (L2, D" << (o.deterministic ? "" : ", dQ_accum") << ")";
    rows.push_back({"tile", tile.str()});
    rows.push_back({"dQ", dq.str()});
    rows.push_back({"scratch", scratch.str()});
    if (!with_gpu) return;
    const void* k = o.deterministic ? reinterpret_cast<const void*>(dkdv_kernel<DkDv, Elem, false>)
                                    : reinterpret_cast<const void*>(dkdv_kernel<DkDv, Elem, true>);
    allow_smem(k, DkDv::kSmemBytes);
    for (auto& [key, value] :
         describe_launch(k, dim3(unsigned(std::max<int64_t>(1, dkdv_blocks(p, DkDv::kBlockN)))), dim3(DkDv::kThreads),
                         DkDv::kSmemBytes))
      rows.push_back({"dK/dV " + key, value});
    if (o.deterministic) {
      const void* kq = reinterpret_cast<const void*>(dq_kernel<Dq, Elem>);
      allow_smem(kq, Dq::kSmemBytes);
      for (auto& [key, value] : describe_launch(kq, dim3(unsigned(std::max<int64_t>(1, dq_blocks(p, Dq::kBlockM)))),
                                                dim3(Dq::kThreads), Dq::kSmemBytes))
        if (key != "device") rows.push_back({"dQ " + key, value});
    }
  });
  return rows;
}

}  // namespace fa::stage09
