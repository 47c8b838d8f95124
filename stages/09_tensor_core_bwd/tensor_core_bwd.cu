// Stage 09 — FlashAttention-2's backward on tensor cores (fp16/bf16 in, fp32 accumulation).
//
// What changed from stage 08, and why: stage 08 made the forward fast on tensor cores. The
// backward (stage 06's Algorithm 2, on the CPU) does 2.5× the forward's work, so it has to
// move onto the same hardware; it reuses stage 08's fragments, loads, swizzled layout and
// masks unchanged. What is new is the shape of the loop: one block per key tile j holds K_j
// and V_j and streams the query tiles past them, so dK_j and dV_j add up in registers; dQ_i,
// whose terms come from different blocks, is summed by fp32 atomics. The steps 09a (dQ by a
// second pass) and 09b (dQ by atomics) build it; this file is 09b with another warp layout.
//
// What changed from 09b, and why: in 09b a warp owns 16 keys and ALL B_r queries, so Pᵀ and
// dSᵀ stay in its registers as the A operands of dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i — but
// every one of the 8 warps reads the whole Q_i and dO_i tiles twice per step. Here the warps
// form a 4 (keys) × 2 grid: a step computes Sᵀ, dPᵀ in 32-key × B_r/2-query blocks, writes
// Pᵀ and dSᵀ to shared memory, and after a barrier computes dV_j, dK_j in 32-key × d/2
// blocks from those tiles (FlashAttention-2's arrangement). 18 % fewer shared-memory bytes
// are read per step at d = 128 (576 KB against 704 KB), for two 16-bit tile stores and a
// barrier; at d = 64 it saves nothing (B_r = 128 queries make the Pᵀ rows as large as the
// dO_i columns they replace), so `auto` runs 09b there and this kernel at d = 128.
//
// Algorithm (FlashAttention-2, Algorithm 2), three kernels:
//   preprocess:  D = rowsum(dO∘O), L2 = L·log2(e) per query row (fp32)      [N_q] each
//   dK/dV, one block per (batch, kv head, key tile j); warp (wk, ws), wk < 4, ws < 2:
//     K_j, V_j → shared memory, once;  dK_j = dV_j = 0 (registers, fp32)
//     for each query head of the group, for each query tile i that sees a key of j:
//       Q_i, dO_i, L2_i, D_i → shared memory (cp.async, one step ahead); barrier
//       keys 32wk.., queries ws·B_r/2..:  dPᵀ = V_j dO_iᵀ;  Sᵀ = K_j Q_iᵀ;  mask;
//         Pᵀ = 2^{Sᵀ·scale·log2(e) − L2_i} → sP;  dSᵀ = Pᵀ∘(dPᵀ − D_i) → sdS;  barrier
//       keys 32wk.., columns ws·d/2..:  dV_j += Pᵀ dO_i;  dK_j += dSᵀ Q_i   (A from sP, sdS)
//       dQ_accum_i += dS K_j  (from sdS; fp32 atomicAdd)
//     write dK_j·scale and dV_j in the input type
//   convert:  dQ = scale·dQ_accum in the input type
//
// Layout: Q, O, dO, dQ [batch][heads][N_q][d]; K, V, dK, dV [batch][kv_heads][N_k][d];
// L [batch][heads][N_q] (docs/design.md §3). Query head h reads kv head h / (heads / kv_heads);
// dK, dV of a kv head sum its query heads. 64-bit offsets.
// Limits: bf16 and f16; d ∈ {64, 128}; pointers 16-byte aligned (L: 4); sm_80+; any
// seq_q, seq_k ≥ 0. Scratch: (2 + d)·N_q fp32 per (batch, head), d·N_q of it only with
// atomics, from a stream-ordered memory pool (bwd_launch.cu).
// The pieces: bwd_kernels.cuh (what the kernels share), bwd_traits.cuh (tile sizes),
// warp_gemm.cuh (the four product shapes), bwd_tile_index.h (which query tiles a key tile
// meets), bwd_launch.cu (host side), and the sm80 layer (common/sm80): mma.cuh,
// smem_tiles.cuh, masking.cuh, softmax.cuh (fast_exp2), tile_index.h.
// Run:    ./build/stages/09_tensor_core_bwd/stage09 --seq-q 4096 --seq-k 4096 --heads 16 --head-dim 128 --backward --bench
//         ... --step 09a     (dQ by a second pass: bitwise reproducible; --step 09b, 09c: the others)
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
__global__ void __launch_bounds__(Tr::kThreads, 1) dkdv_kernel(const BwdParams p) {
  constexpr int d = Tr::kHeadDim, B_r = Tr::kBlockM, B_c = Tr::kBlockN;
  constexpr int kKT = Tr::kKeyTiles;        // m16 tiles of keys per warp
  constexpr int kQW = Tr::kQueriesPerWarp;  // queries of the warp's block of Sᵀ: B_r / 2
  constexpr int kDW = Tr::kColsPerWarp;     // columns of the warp's block of dK_j, dV_j: d / 2
  constexpr SmemLayout kLayout = Tr::kLayout;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // fragment coordinates (stage 08, mma.cuh)
  // The warp's place in the kWarpsKeys × kWarpsSplit = 4 × 2 grid (bwd_traits.cuh): its
  // keys in the tile, its query columns of Sᵀ, dPᵀ, dSᵀ, its columns of dK_j, dV_j.
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
  const uint32_t sdS = smem_u32(smem + Tr::kOffdS), sP = smem_u32(smem + Tr::kOffP);
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

  // This warp's rows of K_j and V_j: the A operands of Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ;
  // and its rows of the Pᵀ and dSᵀ tiles: the A operands of dV_j and dK_j.
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
    const int buf = step % 2;  // the Q_i, dO_i, L2_i, D_i buffer of this step
    const int i = pos.tile;  // query tile
    const int64_t q0 = int64_t(i) * B_r;

    cp_async_wait<0>();  // this thread's copies of step `step` (and of K_j, V_j) landed
    __syncthreads();     // ... everyone's; and every warp is done with step − 1, so its
                         // buffer and the dSᵀ and Pᵀ tile may be overwritten
    if (step + 1 < n_steps) load_step(next(pos), buf ^ 1);  // travels while we compute

    const uint32_t sQ_i = sQ + buf * Tr::kQTileBytes, sdO_i = sdO + buf * Tr::kQTileBytes;

    // dPᵀ = V_j dO_iᵀ: [16·kKT keys, kQW queries], the same shape of product as Sᵀ below
    // (B: the warp's kQW rows of dO_i), computed first (step 09b computes it after dV_j:
    // each order is the one the compiler spills fewer registers with in its layout).
    const uint32_t sdO_warp = sdO_i + 2u * warp_q0 * smem_row_stride(d, kLayout);
    float dPt[kKT][kQW / 8][4];
    const auto dp_product = [&] {
      zero(dPt);
      gemm_abt<Elem, kKT, kQW / 8, d / 16, d, d, kLayout>(dPt, sV_warp, sdO_warp, lane);
    };
    dp_product();

    // Sᵀ = K_j Q_iᵀ: this warp's [16·kKT keys, kQW queries] block, C fragments; B is the
    // warp's kQW rows of Q_i. Keys are the rows here (the transpose of stage 08's S).
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

    //! [dV dP dS dK]
    // The warp holds only kQW of the B_r queries that dV_j's rows sum over, so
    // Pᵀ goes to its tile [B_c, B_r] as Elem (the value the MMA would round it to).
    store_c_fragments<Elem, B_r, kLayout>(reinterpret_cast<Elem*>(smem + Tr::kOffP), St, warp_key0, warp_q0, lane);

    // dSᵀ = Pᵀ∘(dPᵀ − D_i), in dPᵀ's registers.
    const float* D_i = reinterpret_cast<const float*>(smem + Tr::kOffD) + buf * B_r;  // [B_r]
    ds_from_dp(dPt, St, D_i + warp_q0, lane);

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
    //! [dV dP dS dK]

    {
      // dQ_i (partial, this key tile) = dS K_j: [B_r, d] = [B_r, B_c]·[B_c, d], the warps
      // laid out as a kWarpsMdQ × kWarpsNdQ grid over [B_r, d]. dS is stored transposed
      // ([key][query] = A stored [k][m]) and K_j is [key][d] = B stored [k][n].
      constexpr int kMq = Tr::kRowsDq / 16, kNq = Tr::kColsDq / 8;
      const int wm = warp / Tr::kWarpsNdQ, wn = warp % Tr::kWarpsNdQ;
      float dQ_acc[kMq][kNq][4];
      zero(dQ_acc);
      gemm_atb<Elem, kMq, kNq, B_c / 16, B_r, d, kLayout>(dQ_acc, sdS, wm * Tr::kRowsDq,
                                                          sK, wn * Tr::kColsDq, lane);

      // The thread's coordinates are derived afresh from threadIdx.x: derived from `tid`, the
      // compiler computed the per-thread offsets once before the loop, could not keep them in
      // registers, and reloaded them from local memory before the atomics of every step
      // (Nsight Compute: 14% of the warps' stall samples waited on those loads).
      add_dq_atomics<Tr>(p, dQ_acc, fresh_thread_index(), batch, pos.head, q0);
    }

  }

  // dK_j = scale·Σ dSᵀ Q_i and dV_j, rounded to Elem, via shared memory (K_j's and V_j's
  // own buffers, free now) into 16-byte coalesced stores of the valid keys.
  cp_async_wait<0>();  // nothing may still be landing in shared memory
  __syncthreads();     // every warp is done reading K_j (the dQ product reads all of it)
  Elem* dK_smem = reinterpret_cast<Elem*>(smem + Tr::kOffK);
  Elem* dV_smem = reinterpret_cast<Elem*>(smem + Tr::kOffV);
  // Each warp writes its block: keys warp_key0.., columns warp_col0.. of both tiles.
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

StepKernels step_09c(int d, Dtype dtype) {
  return make_step(d, dtype, [](auto elem, auto tiles) {
    using Elem = decltype(elem);
    using Tiles = typename decltype(tiles)::type;
    return step_kernels<typename Tiles::DkDvPSmem, typename Tiles::Dq>(dkdv_kernel<typename Tiles::DkDvPSmem, Elem>, true);
  });
}

}  // namespace fa::stage09
