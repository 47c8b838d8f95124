// Stage 07, step 07b — the next tile copied with cp.async during this tile's math.
//
// What changed from 07a, and why: 07a loads K_j, V_j into registers, stores them to shared
// memory, and only then computes: from the first load to the last store the block has
// nothing to do. At d = 128 that is a 32 KB tile per block and tile, behind a global-memory
// latency of hundreds of cycles, and with 3 blocks (12 warps) per SM the other two blocks
// are a thin cover. Here every tile, thread layout, shared buffer and arithmetic step stays;
// only *when* the tiles are copied changes: with cp.async (async_tile_copy.cuh), which
// bypasses the registers and does not stall the thread until it waits for the copy. Each
// buffer is refilled as soon as its last reader is done, so no extra shared memory is
// needed, and the three barriers keep their meaning (barriers 1 and 2 now also publish the
// copies, which cp.async.wait_group guarantees only for the thread's own):
//
//   prologue: copy Q_i and K_0 (group), copy V_0 (group)
//   for j:
//     wait until ≤ 1 group in flight (K_j landed);  barrier 1
//     S_ij = Q_i K_jᵀ, mask, online softmax, P_ij → sP
//     wait until 0 groups in flight (V_j landed);   barrier 2     ← sK is free from here
//     copy K_{j+1} into sK (group)                  travels during P_ij V_j
//     O_i += P_ij V_j;                              barrier 3     ← sV is free from here
//     copy V_{j+1} into sV (group)                  travels during S_{i,j+1} and the softmax
//
// Every sum runs in the same order as in 07a, so O and L are bitwise 07a's.
// Run: ./build/stages/07_smem_cuda/stage07 --step 07b --seq-q 4096 --seq-k 4096 --head-dim 128 --bench
#include "async_tile_copy.cuh"
#include "block_tile.cuh"
#include "smem_steps.cuh"

namespace fa::stage07 {
namespace {

template <typename C>
__global__ void __launch_bounds__(kThreads, C::kMinBlocks) fwd_07b(const Params p) {
  extern __shared__ float4 shared_mem[];
  float* sQ = reinterpret_cast<float*>(shared_mem);  // [B_r][D + 4]   Q_i, loaded once
  float* sK = sQ + C::kQFloats;                      // [B_c][D + 4]   K_j
  float* sV = sK + C::kKFloats;                      // [B_c][D]       V_j
  float* sP = sV + C::kVFloats;                      // [B_r][B_c + 4] P_ij
  using QTile = TileCopy<kBlockQ, C::D, C::kQStride, kThreads, C::kSwizzled>;
  using KTile = TileCopy<C::B_c, C::D, C::kKStride, kThreads, C::kSwizzled>;
  using VTile = TileCopy<C::B_c, C::D, C::kVStride, kThreads, false>;
  // Query tiles are handed out last-first: under a causal mask the last tile of a head
  // sees the most keys, and starting the longest blocks first keeps the GPU busy at the end.
  const int tile = p.T_r - 1 - int(blockIdx.x % unsigned(p.T_r));
  const int64_t bh = blockIdx.x / unsigned(p.T_r);  // batch · heads + head
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const int64_t kv_head = h / p.group;                                // grouped-query attention
  const float* Q = p.Q + bh * p.seq_q * p.d;                          // [N_q, d] this head
  const float* K = p.K + (b * p.kv_heads + kv_head) * p.seq_k * p.d;  // [N_k, d]
  const float* V = p.V + (b * p.kv_heads + kv_head) * p.seq_k * p.d;  // [N_k, d]
  const int64_t q0 = int64_t(tile) * kBlockQ;                         // first query row of Q_i

  const int g = int(threadIdx.x) / C::kColGroups;  // row group:    rows g + 16t
  const int c = int(threadIdx.x) % C::kColGroups;  // column group: S columns c + 8u

  // Bottom-right causal alignment: row r sees keys k ≤ r + (N_k − N_q). The last row of
  // this tile decides how many keys the tile needs; tiles after that are never loaded.
  const int64_t diag = int64_t(p.seq_k) - p.seq_q;
  const int64_t q_end = q0 + kBlockQ < p.seq_q ? q0 + kBlockQ : p.seq_q;  // one past the last row
  int64_t n_keys = p.seq_k;                                               // keys this tile needs
  if (p.causal) n_keys = q_end + diag < 0 ? 0 : (q_end + diag < p.seq_k ? q_end + diag : p.seq_k);
  const int T_c = int((n_keys + C::B_c - 1) / C::B_c);  // key tiles this block visits

  // Prologue: Q_i and K_0 as one group, V_0 as the next; both land during the loop's
  // first waits. (T_c = 0: nothing of K or V is read, and the loop does not run.)
  tile_copy_async<QTile>(sQ, Q, q0, p.seq_q, p.d);
  if (T_c > 0) tile_copy_async<KTile>(sK, K, 0, p.seq_k, p.d);
  cp_async_commit();
  if (T_c > 0) tile_copy_async<VTile>(sV, V, 0, p.seq_k, p.d);
  cp_async_commit();

  float row_max[kRowsPerThread];           // m · scale · log2(e) per row
  float row_sum[kRowsPerThread];           // l, over this thread's columns
  float O_acc[kRowsPerThread][C::kOCols];  // unnormalised O_i, this thread's piece
  init_rows<C>(row_max, row_sum, O_acc);

  for (int j = 0; j < T_c; ++j) {
    const int64_t k0 = int64_t(j) * C::B_c;  // first key of K_j
    // In flight: the group holding K_j (and on j = 0 also Q_i), then the one holding V_j.
    cp_async_wait<1>();  // this thread's copies of K_j (and Q_i) have landed; V_j may not
    __syncthreads();     // K_j and on j = 0 Q_i are complete for all warps

    float S[kRowsPerThread][C::kSCols];  // this thread's piece of S_ij, then of P_ij
    scores_tile<C>(sQ, sK, g, c, S);
    // Mask what the row may not see: keys past N_k (the tail tile) and, under the causal
    // mask, keys right of the diagonal. Only tiles that cross either edge pay for it.
    const bool masked = k0 + C::B_c > p.seq_k || (p.causal && k0 + C::B_c - 1 > q0 + diag);
    if (masked) {
#pragma unroll
      for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
        for (int u = 0; u < C::kSCols; ++u) {
          const int64_t row = q0 + g + kRowGroups * t, key = k0 + c + C::kColGroups * u;
          if (key >= p.seq_k || (p.causal && key > row + diag)) S[t][u] = -INFINITY;
        }
    }

    online_softmax<C>(S, row_max, row_sum, O_acc, p.scale_log2);
    store_p<C>(sP, g, c, S);
    cp_async_wait<0>();  // this thread's copies of V_j landed
    __syncthreads();     // all of P_ij and of V_j is written before any warp reads it

    // Every warp is past scores_tile, so sK is free: K_{j+1} travels during P·V.
    if (j + 1 < T_c) tile_copy_async<KTile>(sK, K, k0 + C::B_c, p.seq_k, p.d);
    cp_async_commit();
    accumulate_pv<C>(sP, sV, g, c, O_acc);
    __syncthreads();  // every warp is done with sV, sP before the next tile overwrites them

    // sV is free now; V_{j+1} travels during S_{i,j+1} and its softmax.
    if (j + 1 < T_c) tile_copy_async<VTile>(sV, V, k0 + C::B_c, p.seq_k, p.d);
    cp_async_commit();
  }
  // T_c = 0: Q_i was copied but never waited for; no copy may outlive the block.
  cp_async_wait<0>();
  write_output<C>(p, bh, q0, g, c, row_max, row_sum, O_acc);
}

}  // namespace

StepKernel step_07b(int D, int B_c, bool swizzled) {
  return instantiate_config(D, B_c, swizzled, [](auto cfg) {
    using C = decltype(cfg);
    return config_step_kernel<C>(fwd_07b<C>, 3, true);
  });
}

}  // namespace fa::stage07
