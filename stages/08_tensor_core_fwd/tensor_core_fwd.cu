// Stage 08 — FlashAttention-2's forward on tensor cores (fp16/bf16 in, fp32 accumulation).
// This file holds the final design (step 08b) and the launch.
//
// What changed from stage 07, and why: stage 07 ran the tiled algorithm in fp32 on the
// CUDA cores, which top out near 50 TFLOP/s on an H200; the tensor cores do 16-bit
// matrix products more than ten times faster, but only in their own shapes and register
// layouts. So: inputs are bf16 or fp16; both products, S = Q Kᵀ and O += P V, are
// `mma.sync` m16n8k16 instructions with fp32 accumulators; each warp owns whole rows, so
// the softmax runs on the accumulator registers with no shared memory; and the tiles are
// fed by an asynchronous pipeline into a bank-conflict-free layout. The algorithm is
// unchanged: the same online softmax, the same tiles, the same L.
//
// What changed from step 08a (08a_one_buffer.cu), and why: with one K/V buffer a tile can
// be loaded only after every warp is done with the previous one, so each tile starts with
// the whole global-memory latency and the tensor cores wait. Here the K/V tiles are double
// buffered: the copies of tile j−1 are issued right after the barrier that opens tile j and
// land while tile j is computed.
//
// Algorithm (FlashAttention-2, Algorithm 1), one thread block per (batch, head, query
// tile i); warp w owns rows [w·B_r/warps, (w+1)·B_r/warps) of the tile:
//   load Q_i [B_r, d] → shared → registers (A fragments, kept for the whole loop)
//   m = −inf, l = 0, O_i = 0                               (registers, fp32)
//   for key tile j = last visited … 0 (on-band tiles first, then off-band):
//     wait for K_j, V_j (cp.async, issued one tile ahead); issue K_{j−1}, V_{j−1}
//     S = Q_i K_jᵀ                    [B_r, B_c]   tensor cores, K_j via ldmatrix
//     mask S on on-band tiles only (causal diagonal, ragged end of the keys)
//     m_new = max(m, rowmax S);  P = e^{scale·(S − m_new)};  α = e^{scale·(m − m_new)}
//     l = α·l + rowsum P;  O_i = α·O_i + P V_j   P stays in registers as A; V_j via ldmatrix.trans
//   O_i = O_i / l;  L_i = scale·m + ln l;  write O_i (input dtype) and L_i (fp32) once
//
// Layout: Q, O [batch][heads][N_q][d]; K, V [batch][kv_heads][N_k][d]; L [batch][heads][N_q]
// (docs/design.md §3); query head h reads kv head h / (heads / kv_heads). 64-bit offsets.
// Limits: bf16 and f16; d ∈ {32, 64, 96, 128, 256}; pointers 16-byte aligned; sm_80+.
// Any seq_q, seq_k ≥ 0 (tails are masked and zero-filled here, never padded by the caller).
// The pieces: traits.cuh (tile sizes), mma.cuh (fragments), smem_tiles.cuh (loads,
// layout), softmax.cuh (online softmax), masking.cuh (masks), tile_index.h (index math),
// fwd_steps.cuh (which compiled kernel runs), fwd_launch.cpp (names, checks).
// Run:    ./build/stages/08_tensor_core_fwd/stage08 --seq-q 4096 --seq-k 4096 --heads 16 --head-dim 128 --bench
//         ... --step 08a            (one K/V buffer: the step before this kernel)
//         ... --ablation no_swizzle (one optimisation off; see the notes' ablation table)
#include "tensor_core_fwd.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda_utils.h"
#include "fwd_steps.cuh"
#include "sm80/masking.cuh"
#include "sm80/mma.cuh"
#include "sm80/smem_tiles.cuh"
#include "sm80/softmax.cuh"
#include "traits.cuh"

namespace fa::stage08 {

namespace {

// ======================================================================================
// The kernel
// ======================================================================================

template <class Tr, class Elem, bool kCausal>
__global__ void __launch_bounds__(Tr::kThreads) flash_forward_kernel(const FwdParams p) {
  constexpr int d = Tr::kHeadDim, B_r = Tr::kBlockM, B_c = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kM = Tr::kMTiles;  // m16 row tiles per warp
  constexpr SmemLayout kLayout = Tr::kLayout;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;        // fragment coordinates (mma.cuh)
  const int warp_row0 = warp * Tr::kRowsPerWarp;  // first row of this warp in the tile

  //! [block to tile]
  // Which (query tile, head, batch) this block computes. Blocks are scheduled in the order
  // of blockIdx.x first, so the query tiles of one head run side by side and share its
  // K, V through the L2 cache. blockIdx.x runs backwards: under a causal mask the tiles
  // with the most keys start first and the cheap ones fill the gaps at the end.
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (p.heads / p.kv_heads);
  const int64_t row0 = int64_t(gridDim.x - 1 - blockIdx.x) * B_r;  // first query row
  const int rows = p.seq_q - row0 < B_r ? int(p.seq_q - row0) : B_r;  // valid rows (≥ 1)
  const int64_t q_head = int64_t(batch) * p.heads + head, kv_head_index = int64_t(batch) * p.kv_heads + kv_head;
  const Elem* Q = static_cast<const Elem*>(p.Q) + (q_head * p.seq_q + row0) * d;  // [rows, d]
  const Elem* K = static_cast<const Elem*>(p.K) + kv_head_index * p.seq_k * d;    // [N_k, d]
  const Elem* V = static_cast<const Elem*>(p.V) + kv_head_index * p.seq_k * d;    // [N_k, d]
  Elem* O = static_cast<Elem*>(p.O) + (q_head * p.seq_q + row0) * d;              // [rows, d]
  float* L = p.L + q_head * p.seq_q + row0;                                       // [rows]

  // Key tiles [0, n_tiles) are visited; [0, n_unmasked) need no mask (tile_index.h).
  const KvTileRange range = kv_tile_range(row0, rows, p.seq_q, p.seq_k, kCausal, B_c, Tr::kCausalSplit);
  //! [block to tile]

  if (range.n_tiles == 0) {
    // No row of this tile sees a key (causal with seq_q > seq_k, or seq_k = 0):
    // O = 0, L = −inf, and nothing is loaded.
    for (int c = tid; c < rows * (d / 8); c += Tr::kThreads)
      *reinterpret_cast<uint4*>(O + int64_t(c) * 8) = make_uint4(0, 0, 0, 0);
    for (int r = tid; r < rows; r += Tr::kThreads) L[r] = -INFINITY;
    return;
  }

  // Shared memory: Q_i, then kStages buffers of K_j, then kStages of V_j.
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + Tr::kQTileBytes;
  const uint32_t sV = sK + kStages * Tr::kKVTileBytes;

  //! [pipeline loads]
  // Issue the copies of K_j and V_j into buffer `stage`, as two cp.async groups (K first:
  // S = Q K_jᵀ can start while V_j is still travelling).
  const auto load_kv = [&](int j, int stage) {
    const int64_t key0 = int64_t(j) * B_c;
    const int keys = p.seq_k - key0 < B_c ? int(p.seq_k - key0) : B_c;  // valid keys (≥ 1)
    load_tile_async<B_c, d, kLayout, Tr::kThreads>(sK + stage * Tr::kKVTileBytes, K + key0 * d, keys, tid);
    cp_async_commit();
    load_tile_async<B_c, d, kLayout, Tr::kThreads>(sV + stage * Tr::kKVTileBytes, V + key0 * d, keys, tid);
    cp_async_commit();
  };

  // Key tiles are visited right to left, so the masked on-band tiles come first and the
  // off-band loop that follows has no mask at all. Iteration `it` handles tile n_tiles−1−it.
  const int n_tiles = range.n_tiles, n_masked = n_tiles - range.n_unmasked;
  load_tile_async<B_r, d, kLayout, Tr::kThreads>(sQ, Q, rows, tid);
  cp_async_commit();
  for (int s = 0; s < kStages - 1; ++s) {  // prologue: the first kStages−1 K/V tiles
    if (s < n_tiles) {
      load_kv(n_tiles - 1 - s, s);
    } else {
      cp_async_commit();
      cp_async_commit();
    }
  }
  cp_async_wait<2 * (kStages - 1)>();  // Q_i has landed (the K/V groups may still fly)
  __syncthreads();                     // ... for every thread's copies
  //! [pipeline loads]

  // Where this lane points ldmatrix: pattern X for Q_i (A, [m][k]) and V_j (B, [k][n],
  // transposed), pattern Y for K_j (B, [n][k]); see mma.cuh. The lane's part of the
  // address is computed here once; in the loops each access adds a constant.
  const LdsmLane<d, kLayout> lane_x(ldsm_row_x(lane), ldsm_chunk_x(lane));
  const LdsmLane<d, kLayout> lane_y(ldsm_row_y(lane), ldsm_chunk_y(lane));
  const uint32_t sQ_warp = sQ + 2u * warp_row0 * smem_row_stride(d, kLayout);  // this warp's rows of Q_i

  //! [q in registers]
  // Q_i → A fragments of this warp's rows, once: [kM m16 tiles][d/16 k16 steps][4 registers].
  uint32_t q_frag[Tr::kQInRegs ? kM : 1][Tr::kQInRegs ? d / 16 : 1][4];
  if constexpr (Tr::kQInRegs) {
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int kk = 0; kk < d / 16; ++kk) ldmatrix_x4(q_frag[mi][kk], lane_x(sQ_warp, mi, kk));
  }
  //! [q in registers]

  float O_acc[kM][d / 8][4];  // [16·kM rows, d] this warp's part of O_i, fp32 (C fragments)
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int dt = 0; dt < d / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) O_acc[mi][dt][e] = 0.0f;
  OnlineSoftmax<kM, Tr::kLazyRescale> softmax(p.scale);

  // One key tile. `masked` is std::true_type on on-band tiles, std::false_type off-band.
  const auto attend_to_tile = [&](auto masked, int it) {
    constexpr bool kMasked = decltype(masked)::value;
    const int j = n_tiles - 1 - it;  // key tile: keys [j·B_c, (j+1)·B_c)
    const int stage = it % kStages;

    //! [pipeline step]
    cp_async_wait<2 * kStages - 3>();  // this thread's part of K_j landed
    __syncthreads();  // everyone's part of K_j landed; every warp finished tile it−1, so
                      // its buffer (the one tile it+kStages−1 goes to) may be refilled
    {
      const int next = it + kStages - 1;
      if (next < n_tiles) {
        load_kv(n_tiles - 1 - next, next % kStages);
      } else {  // empty groups keep the wait counts above the same on the last tiles
        cp_async_commit();
        cp_async_commit();
      }
    }
    //! [pipeline step]

    //! [scores]
    // S = Q_i K_jᵀ: [16·kM, B_c] per warp, C fragments. For each k16 step over d and each
    // pair of n8 key tiles, one ldmatrix.x4 of K_j (stored [key][d] = B stored [n][k]:
    // pattern Y, no transpose) feeds 2·kM MMAs.
    float S[kM][B_c / 8][4];
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int nt = 0; nt < B_c / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[mi][nt][e] = 0.0f;
    const uint32_t sK_j = sK + stage * Tr::kKVTileBytes;
#pragma unroll
    for (int kk = 0; kk < d / 16; ++kk) {
      uint32_t a_frag[kM][4];  // Q_i, columns 16kk..16kk+15: from registers, or re-read from shared memory
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a_frag[mi][r] = q_frag[mi][kk][r];
        } else {
          ldmatrix_x4(a_frag[mi], lane_x(sQ_warp, mi, kk));
        }
      }
#pragma unroll
      for (int np = 0; np < B_c / 16; ++np) {
        uint32_t k_frag[4];  // {b0, b1} of keys 16np..16np+7, {b0, b1} of keys 16np+8..16np+15
        ldmatrix_x4(k_frag, lane_y(sK_j, np, kk));  // keys 16np.., d columns 16kk..
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          mma_m16n8k16<Elem>(S[mi][2 * np], a_frag[mi], k_frag[0], k_frag[1]);
          mma_m16n8k16<Elem>(S[mi][2 * np + 1], a_frag[mi], k_frag[2], k_frag[3]);
        }
      }
    }
    //! [scores]

    if constexpr (kMasked)
      mask_causal_and_tail(S, lane, row0 + warp_row0, j * B_c, p.seq_q, p.seq_k, kCausal);

    // P = e^{scale·(S − m_new)} in place; l, m updated; O_acc rescaled (softmax.cuh).
    softmax.update(S, O_acc);

    //! [p to a fragments]
    // P, rounded to Elem and packed two values per register, becomes the A fragments of
    // the k16 steps of P V: keys 16kk..16kk+15 of P are the C fragments S[mi][2kk] and
    // S[mi][2kk+1] (mma.cuh), already in the places the A fragment wants them. Done for the
    // whole tile at once, so the fp32 scores' registers are free before P V starts.
    uint32_t p_frag[kM][B_c / 16][4];
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int kk = 0; kk < B_c / 16; ++kk) {
        // LAB BEGIN: P as the A operand — hint: keys 16kk..16kk+15 of P are the C fragments S[mi][2kk] and S[mi][2kk+1]
        accumulators_to_a_fragment<Elem>(p_frag[mi][kk], S[mi][2 * kk], S[mi][2 * kk + 1]);
        // LAB END
      }
    //! [p to a fragments]

    cp_async_wait<2 * kStages - 2>();  // this thread's part of V_j landed
    __syncthreads();                                       // everyone's part of V_j landed

    //! [p times v]
    // O_acc += P V_j, P from registers (never stored). V_j is stored [key][d] = B stored
    // [k][n]: ldmatrix.trans, pattern X.
    const uint32_t sV_j = sV + stage * Tr::kKVTileBytes;
#pragma unroll
    for (int kk = 0; kk < B_c / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < d / 16; ++dp) {
        uint32_t v_frag[4];  // {b0, b1} of d columns 16dp..16dp+7, {b0, b1} of 16dp+8..16dp+15
        ldmatrix_x4_trans(v_frag, lane_x(sV_j, kk, dp));  // keys 16kk.., d columns 16dp..
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          mma_m16n8k16<Elem>(O_acc[mi][2 * dp], p_frag[mi][kk], v_frag[0], v_frag[1]);
          mma_m16n8k16<Elem>(O_acc[mi][2 * dp + 1], p_frag[mi][kk], v_frag[2], v_frag[3]);
        }
      }
    }
    //! [p times v]
  };

  //! [main loop]
  // LAB BEGIN: the split loop — hint: iterations 0..n_masked−1 take the masked path (std::true_type), the rest the mask-free one
  for (int it = 0; it < n_masked; ++it) attend_to_tile(std::true_type{}, it);         // on-band
  for (int it = n_masked; it < n_tiles; ++it) attend_to_tile(std::false_type{}, it);  // off-band
  // LAB END
  //! [main loop]

  //! [epilogue]
  cp_async_wait<0>();  // only empty groups can be left; leave none in flight
  float lse[kM][2];    // L of this thread's rows g, g+8 of each m16 tile
  softmax.finalize(O_acc, lse);

  // O_i: fragments → this warp's own rows of the Q_i buffer (no other warp reads them)
  // → 16-byte coalesced stores of the valid rows. The round trip through shared memory
  // turns 4-byte fragment pieces into whole 16-byte chunks per thread.
  Elem* sO = reinterpret_cast<Elem*>(smem);
  __syncwarp();
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int dt = 0; dt < d / 8; ++dt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + 16 * mi + g + 8 * h;  // column 8dt + 2t: chunk dt, element 2t
        *reinterpret_cast<uint32_t*>(sO + smem_offset(row, dt, d, kLayout) + 2 * t) =
            pack_pair<Elem>(O_acc[mi][dt][2 * h], O_acc[mi][dt][2 * h + 1]);
      }
  __syncwarp();
  store_tile<Tr::kRowsPerWarp, d, kLayout, 32>(O + int64_t(warp_row0) * d,
                                                sO + warp_row0 * smem_row_stride(d, kLayout), rows - warp_row0, lane);
  if (t == 0) {
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + 16 * mi + g + 8 * h;
        if (row < rows) L[row] = lse[mi][h];
      }
  }
  //! [epilogue]
}

}  // namespace

StepKernel step_08b(int d, Dtype dtype, bool causal, const Options& o) {
  return make_step<true>(d, dtype, causal, o, [&](auto elem, auto tiles) {
    using Elem = decltype(elem);
    using Tr = typename decltype(tiles)::type;
    return tile_step_kernel<Tr>(causal, flash_forward_kernel<Tr, Elem, true>, flash_forward_kernel<Tr, Elem, false>);
  });
}

// ======================================================================================
// The launch
// ======================================================================================

void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O, float* L,
             cudaStream_t stream) {
  forward(p, dtype, Q, K, V, O, L, stream, current_options());
}

void forward(const Problem& p, Dtype dtype, const void* Q, const void* K, const void* V, void* O, float* L,
             cudaStream_t stream, const Options& options) {
  check_request(p, dtype);
  if (p.q_elems() == 0) return;  // seq_q = 0: nothing to compute, nothing launched
  check_pointers(p, Q, K, V, O, L);
  const StepKernel k = kernel_for(p, dtype, options);
  FwdParams params{Q, K, V, O, L, p.heads, p.kv_heads, p.seq_q, p.seq_k, p.softmax_scale()};
  void* args[] = {&params};
  launch(k, grid_of(p, k.block_rows), args, stream);  // allows its shared memory once per device
  FA_CHECK_LAUNCH("08_tensor_core_fwd: forward kernel");
}

}  // namespace fa::stage08
