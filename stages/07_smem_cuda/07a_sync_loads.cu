// Stage 07, step 07a — the tiled forward as a CUDA kernel, tiles loaded synchronously.
//
// What changed from stage 06, and why: stage 06 blocked the computation into B_r × B_c
// tiles sized to a fast-memory budget, but one CPU core still did every multiply. Here the
// same loop nest runs on the GPU. Each query tile Q_i becomes one thread block, the fast
// memory becomes the block's shared memory, and the tile products are split among 128
// threads so that each thread keeps a small piece of S_ij and of O_i in its registers
// ("register tiling", block_tile.cuh): a value read once from shared memory feeds several
// multiply-adds. The arithmetic is the same as stage 06; only where the numbers live has
// changed. This first step loads each K_j, V_j tile through registers and then computes it:
// while the copy is in flight the block has nothing to do (step 07b removes that wait).
//
//   load Q_i                                       (registers → shared memory)
//   for j = 0 … last key tile this tile can see:
//     load K_j, V_j into shared memory;            barrier 1: every warp's part is there
//     S_ij = Q_i K_jᵀ; mask; online softmax; P_ij → sP;  barrier 2: all of P_ij is there
//     O_i += P_ij V_j;                             barrier 3: sK, sV, sP may be overwritten
//   O_i /= l_i;  L_i = scale·m_i + log(l_i)
//
// Run: ./build/stages/07_smem_cuda/stage07 --step 07a --seq-q 4096 --seq-k 4096 --head-dim 128 --bench
#include "block_tile.cuh"
#include "smem_steps.cuh"

namespace fa::stage07 {
namespace {

template <typename C>
__global__ void __launch_bounds__(kThreads, C::kMinBlocks) fwd_07a(const Params p) {
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

  {
    QTile q_tile;
    q_tile.fetch(Q, q0, p.seq_q, p.d);
    q_tile.store(sQ);  // read after the first __syncthreads() in the loop
  }

  float row_max[kRowsPerThread];           // m · scale · log2(e) per row
  float row_sum[kRowsPerThread];           // l, over this thread's columns
  float O_acc[kRowsPerThread][C::kOCols];  // unnormalised O_i, this thread's piece
  init_rows<C>(row_max, row_sum, O_acc);

  for (int j = 0; j < T_c; ++j) {
    const int64_t k0 = int64_t(j) * C::B_c;  // first key of K_j
    {  // through registers: every global load first, so that their latencies overlap
      KTile k_tile;
      VTile v_tile;
      k_tile.fetch(K, k0, p.seq_k, p.d);
      v_tile.fetch(V, k0, p.seq_k, p.d);
      k_tile.store(sK);
      v_tile.store(sV);
    }
    __syncthreads();  // K_j, V_j and on j = 0 Q_i are complete for all warps

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
    __syncthreads();  // all of P_ij is written before any warp reads it

    accumulate_pv<C>(sP, sV, g, c, O_acc);
    __syncthreads();  // every warp is done with sK, sV, sP before the next tile overwrites them
  }
  write_output<C>(p, bh, q0, g, c, row_max, row_sum, O_acc);
}

}  // namespace

StepKernel step_07a(int D, int B_c, bool swizzled) {
  return instantiate_config(D, B_c, swizzled, [](auto cfg) {
    using C = decltype(cfg);
    return config_step_kernel<C>(fwd_07a<C>, 3, false);
  });
}

}  // namespace fa::stage07
