// Stage 09, step 09b — dQ by fp32 atomics from the dK/dV kernel.
//
// What changed from 09a, and why: 09a recomputes S, P, dP and dS in a second kernel only to
// form dQ_i = Σ_j dS_ij K_j: seven products where five would do, 1.4 times the arithmetic.
// The dK/dV kernel has every dS_ij already; what it lacks is a place to sum dQ_i, whose terms
// come from different blocks (one per key tile). Here each block adds its part straight into
// an fp32 copy of dQ in global memory, dQ_accum, with atomic additions that L2 resolves; a
// small kernel then scales and converts it. dQ_i's terms sum over the keys of the tile,
// which the warps hold in different registers, so the warps first hand dSᵀ over through a
// shared-memory tile and re-form as a grid over [B_r, d] for the product. The price: fp32
// addition is not associative and the blocks add in no fixed order, so the last bits of dQ
// may change from run to run (dK and dV do not: one block, fixed order).
//
//   dK/dV kernel, per step, after 09a's dK_j += dSᵀ Q_i:
//     dSᵀ → shared memory [B_c, B_r];  barrier
//     dQ_i (part) = dS K_j, warps as a grid over [B_r, d];  dQ_accum_i += it (atomicAdd)
//   convert (bwd_launch.cu):  dQ = scale·dQ_accum in the input type
//
// Run: ./build/stages/09_tensor_core_bwd/stage09 --step 09b --seq-q 4096 --seq-k 4096 --heads 16 --head-dim 128 --backward --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "bwd_kernels.cuh"
#include "bwd_steps.h"
#include "bwd_tile_index.h"
#include "warp_gemm.cuh"

namespace fa::stage09 {
namespace {

template <class Tr, class Elem>
__global__ void __launch_bounds__(Tr::kThreads, 1) dkdv_kernel_09b(const BwdParams p) {
  constexpr int d = Tr::kHeadDim, B_r = Tr::kBlockM, B_c = Tr::kBlockN;
  constexpr int kKT = Tr::kKeyTiles;        // m16 tiles of keys per warp
  constexpr int kQW = Tr::kQueriesPerWarp;  // queries of the warp's block of Sᵀ: all B_r here
  constexpr int kDW = Tr::kColsPerWarp;     // columns of the warp's block of dK_j, dV_j: all d here
  constexpr SmemLayout kLayout = Tr::kLayout;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // fragment coordinates (stage 08, mma.cuh)
  // The warp's place in the kWarpsKeys × kWarpsSplit grid (bwd_traits.cuh): its keys in
  // the tile, its query columns of Sᵀ, dPᵀ, dSᵀ, its columns of dK_j, dV_j. Here the grid
  // is 8 × 1: every warp has all B_r queries and all d columns (both 0).
  const int warp_key0 = Tr::warp_key0(warp);  // this warp's first key in the tile
  const int warp_q0 = Tr::warp_q0(warp);      // its first query column of Sᵀ
  const int warp_col0 = Tr::warp_col0(warp);  // its first column of dK_j, dV_j

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

  const uint32_t sK = smem_u32(smem + Tr::kOffK), sV = smem_u32(smem + Tr::kOffV);
  const uint32_t sQ = smem_u32(smem + Tr::kOffQ), sdO = smem_u32(smem + Tr::kOffdO);
  const uint32_t sdS = smem_u32(smem + Tr::kOffdS);
  const uint32_t sL2 = smem_u32(smem + Tr::kOffL2), sD = smem_u32(smem + Tr::kOffD);

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

  // This warp's rows of K_j and V_j: the A operands of Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ.
  const uint32_t sK_warp = sK + 2u * warp_key0 * smem_row_stride(d, kLayout);
  const uint32_t sV_warp = sV + 2u * warp_key0 * smem_row_stride(d, kLayout);

  float dK_acc[kKT][kDW / 8][4];  // [16·kKT keys, kDW] this warp's block of dK_j, fp32
  float dV_acc[kKT][kDW / 8][4];  // [16·kKT keys, kDW] this warp's block of dV_j, fp32
  zero(dK_acc);
  zero(dV_acc);

  StepPos pos = first;  // where step `step` is
  for (int step = 0; step < n_steps; ++step, pos = next(pos)) {
    const int buf = step % 2;  // the Q_i, dO_i, L2_i, D_i buffer of this step
    const int i = pos.tile;  // query tile
    const int64_t q0 = int64_t(i) * B_r;

    cp_async_wait<0>();  // this thread's copies of step `step` (and of K_j, V_j) landed
    __syncthreads();     // ... everyone's; and every warp is done with step − 1, so its
                         // buffer and the dSᵀ tile may be overwritten
    if (step + 1 < n_steps) load_step(next(pos), buf ^ 1);  // travels while we compute

    const uint32_t sQ_i = sQ + buf * Tr::kQTileBytes, sdO_i = sdO + buf * Tr::kQTileBytes;

    // dPᵀ = V_j dO_iᵀ: [16·kKT keys, kQW queries], the same shape of product as Sᵀ below
    // (B: the warp's kQW rows of dO_i), computed after dV_j (step 09c computes it first:
    // each order is the one the compiler spills fewer registers with in its layout).
    const uint32_t sdO_warp = sdO_i + 2u * warp_q0 * smem_row_stride(d, kLayout);
    float dPt[kKT][kQW / 8][4];
    const auto dp_product = [&] {
      zero(dPt);
      gemm_abt<Elem, kKT, kQW / 8, d / 16, d, d, kLayout>(dPt, sV_warp, sdO_warp, lane);
    };

    // Sᵀ = K_j Q_iᵀ: this warp's [16·kKT keys, kQW queries] block, C fragments; B is the
    // warp's kQW rows of Q_i. Keys are the rows here (the transpose of stage 08's S). In
    // this layout the block spans all B_r queries, so the warp's Pᵀ and dSᵀ are already
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

    // dV_j += Pᵀ dO_i: [16·kKT, d] += [16·kKT, B_r]·[B_r, d]. Pᵀ is rounded to Elem in
    // registers; dO_i is stored [query][d] = B stored [k][n]: ldmatrix.trans.
    gemm_acc_b<Elem, kKT, d / 8, B_r / 16, d, kLayout>(dV_acc, St, sdO_i, lane);
    dp_product();  // dPᵀ = V_j dO_iᵀ (see above)

    // dSᵀ = Pᵀ∘(dPᵀ − D_i), in dPᵀ's registers.
    const float* D_i = reinterpret_cast<const float*>(smem + Tr::kOffD) + buf * B_r;  // [B_r]
    ds_from_dp(dPt, St, D_i + warp_q0, lane);

    // dK_j += dSᵀ Q_i (the factor scale is applied once, when dK_j is written).
    gemm_acc_b<Elem, kKT, d / 8, B_r / 16, d, kLayout>(dK_acc, dPt, sQ_i, lane);

    {
      //! [dS hand-over]
      // dQ_i += dS K_j sums over the keys of the tile, which are spread over all warps:
      // the warps hand dSᵀ over through shared memory, as Elem (the value the MMA would
      // round it to anyway).
      store_c_fragments<Elem, B_r, kLayout>(reinterpret_cast<Elem*>(smem + Tr::kOffdS), dPt, warp_key0, 0, lane);
      __syncthreads();  // all of dSᵀ [B_c, B_r] is in shared memory
      //! [dS hand-over]

      // dQ_i (partial, this key tile) = dS K_j: [B_r, d] = [B_r, B_c]·[B_c, d], the warps
      // laid out as a kWarpsMdQ × kWarpsNdQ grid over [B_r, d]. dS is stored transposed
      // ([key][query] = A stored [k][m]) and K_j is [key][d] = B stored [k][n].
      constexpr int kMq = Tr::kRowsDq / 16, kNq = Tr::kColsDq / 8;
      const int wm = warp / Tr::kWarpsNdQ, wn = warp % Tr::kWarpsNdQ;
      float dQ_acc[kMq][kNq][4];
      zero(dQ_acc);
      gemm_atb<Elem, kMq, kNq, B_c / 16, B_r, d, kLayout>(dQ_acc, sdS, wm * Tr::kRowsDq,
                                                          sK, wn * Tr::kColsDq, lane);

      // (Step 09c reads threadIdx.x afresh here; with this layout that measured 3% slower.)
      add_dq_atomics<Tr>(p, dQ_acc, tid, batch, pos.head, q0);
    }

  }

  // dK_j = scale·Σ dSᵀ Q_i and dV_j, rounded to Elem, via shared memory (K_j's and V_j's
  // own buffers, free now) into 16-byte coalesced stores of the valid keys.
  cp_async_wait<0>();  // nothing may still be landing in shared memory
  __syncthreads();     // every warp is done reading K_j (the dQ product reads all of it)
  Elem* dK_smem = reinterpret_cast<Elem*>(smem + Tr::kOffK);
  Elem* dV_smem = reinterpret_cast<Elem*>(smem + Tr::kOffV);
  // Each warp writes its block: keys warp_key0.., all d columns (warp_col0 = 0). One loop
  // for both tiles: two store_c_fragments calls compile with a few more spills at d = 64.
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
}

}  // namespace

StepKernels step_09b(int d, Dtype dtype) {
  return make_step(d, dtype, [](auto elem, auto tiles) {
    using Elem = decltype(elem);
    using Tiles = typename decltype(tiles)::type;
    return step_kernels<typename Tiles::DkDv, typename Tiles::Dq>(dkdv_kernel_09b<typename Tiles::DkDv, Elem>, true);
  });
}

}  // namespace fa::stage09
