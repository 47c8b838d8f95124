// Stage 09, step 09a — the backward with dQ in a pass of its own: bitwise reproducible.
//
// What changed from stage 08, and why: stage 08 made the forward fast on tensor cores. The
// backward (stage 06's Algorithm 2, on the CPU) does 2.5× the forward's work, so it has to
// move onto the same hardware; it reuses stage 08's fragments, loads, swizzled layout and
// masks unchanged. What is new is the shape of the loop. dK_j and dV_j are sums over all
// query tiles i, dQ_i a sum over all key tiles j: one of the two has to be summed across
// thread blocks. FlashAttention-2 turns the loop around: one block per key tile j holds K_j
// and V_j for its whole life and streams the query tiles past them, so dK_j and dV_j add up
// in registers and are written once. This first step leaves dQ to a second kernel that
// loops the other way, like stage 06's separate dQ pass: it repeats three of the five
// products, but every sum runs in a fixed order, so dQ, dK, dV are bitwise reproducible.
// P is recomputed from L, never stored.
//
//   preprocess (bwd_launch.cu):  D = rowsum(dO∘O), L2 = L·log2(e) per query row
//   dK/dV, one block per (batch, kv head, key tile j); warp w owns 16 keys of the tile:
//     K_j, V_j → shared memory, once;  dK_j = dV_j = 0 (registers, fp32)
//     for each query head of the group, for each query tile i that sees a key of j:
//       Q_i, dO_i, L2_i, D_i → shared memory (cp.async, one step ahead)
//       Sᵀ = K_j Q_iᵀ;  mask (diagonal, tails);  Pᵀ = 2^{Sᵀ·scale·log2(e) − L2_i}
//       dV_j += Pᵀ dO_i;   dPᵀ = V_j dO_iᵀ;   dSᵀ = Pᵀ∘(dPᵀ − D_i);   dK_j += dSᵀ Q_i
//     write dK_j·scale and dV_j in the input type
//   dQ, one block per (batch, head, query tile i), looping over the key tiles j it sees:
//     S = Q_i K_jᵀ, P, dP = dO_i V_jᵀ, dS = P∘(dP − D);  dQ_i += dS K_j in registers
//     write dQ_i·scale
//
// Run: ./build/stages/09_tensor_core_bwd/stage09 --step 09a --seq-q 4096 --seq-k 4096 --heads 16 --head-dim 128 --backward --bench
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
__global__ void __launch_bounds__(Tr::kThreads, 1) dkdv_kernel_09a(const BwdParams p) {
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
  //! [load a step]

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

    //! [pipeline step]
    cp_async_wait<0>();  // this thread's copies of step `step` (and of K_j, V_j) landed
    __syncthreads();     // ... everyone's; and every warp is done with step − 1, so its
                         // buffer and the dSᵀ tile may be overwritten
    if (step + 1 < n_steps) load_step(next(pos), buf ^ 1);  // travels while we compute
    //! [pipeline step]

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

    //! [recompute P]
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
    //! [recompute P]

    //! [dV dP dS dK]
    // dV_j += Pᵀ dO_i: [16·kKT, d] += [16·kKT, B_r]·[B_r, d]. Pᵀ is rounded to Elem in
    // registers; dO_i is stored [query][d] = B stored [k][n]: ldmatrix.trans.
    gemm_acc_b<Elem, kKT, d / 8, B_r / 16, d, kLayout>(dV_acc, St, sdO_i, lane);
    dp_product();  // dPᵀ = V_j dO_iᵀ (see above)

    // dSᵀ = Pᵀ∘(dPᵀ − D_i), in dPᵀ's registers.
    const float* D_i = reinterpret_cast<const float*>(smem + Tr::kOffD) + buf * B_r;  // [B_r]
    ds_from_dp(dPt, St, D_i + warp_q0, lane);

    // dK_j += dSᵀ Q_i (the factor scale is applied once, when dK_j is written).
    gemm_acc_b<Elem, kKT, d / 8, B_r / 16, d, kLayout>(dK_acc, dPt, sQ_i, lane);
    //! [dV dP dS dK]


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
  constexpr int d = Tr::kHeadDim, B_r = Tr::kBlockM, B_c = Tr::kBlockN;
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
    const int buf = jj % 2;
    cp_async_wait<0>();  // this thread's part of K_jj, V_jj (and at first Q_i, dO_i) landed
    __syncthreads();     // everyone's; every warp is done with tile jj − 1's buffer
    if (jj + 1 < range.n_tiles) load_kv(jj + 1, buf ^ 1);  // travels while we compute
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

}  // namespace

StepKernels step_09a(int d, Dtype dtype) {
  return make_step(d, dtype, [](auto elem, auto tiles) {
    using Elem = decltype(elem);
    using Tiles = typename decltype(tiles)::type;
    return step_kernels<typename Tiles::DkDv, typename Tiles::Dq>(dkdv_kernel_09a<typename Tiles::DkDv, Elem>, false,
                                                                  dq_kernel<typename Tiles::Dq, Elem>);
  });
}

}  // namespace fa::stage09
