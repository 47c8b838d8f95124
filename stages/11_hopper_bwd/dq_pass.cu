// Stage 11's deterministic mode: dQ by a second kernel that sums over the key tiles in a
// fixed order, instead of atomics from the main kernel (stage 09's second pass, on wgmma).
//
// The main kernel, built without its dQ product, writes dK and dV. This kernel turns the
// loop the other way, like the forward: a block keeps Q_i and dO_i (64 query rows, one
// warpgroup) and streams K_j, V_j past them through two buffers, so dQ_i adds up in its
// registers in the order j = 0, 1, … and is written once. Rows are queries again, so every
// operand sits where wgmma wants it, with no transpose and no shared-memory round trip:
//
//   S = Q_i·K_jᵀ, dP = dO_i·V_jᵀ   (both operands K-major in shared memory, as stage 10's S)
//   P = 2^{scale_log2·S − L2}, dS = P∘(dP − D)   (row values, from registers)
//   dQ_i += dS·K_j                 (dS from registers, K_j MN-major: stage 10's P·V)
//
// It computes three of the five products, two of them (S and dP, with their exponentials)
// a second time: 4 + 3 = 7 products against 5, so the mode costs time; what it buys is
// bitwise-reproducible dQ.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bwd_math.cuh"
#include "hopper/pipeline_state.cuh"
#include "hopper/tile_schedule.h"
#include "hopper/wgmma.cuh"
#include "hopper_bwd_steps.h"
#include "step_table.cuh"

namespace fa::stage11 {

namespace {

// B_c is the main kernel's, whose K and V tensor maps (boxes of B_c rows) this kernel shares:
// 128 keys at d = 64 and 128, 64 at d = 256 (there dQ_i alone takes 128 registers a thread).
constexpr int kBlockMDq = 64, kStagesDq = 2;
template <int d>
constexpr int kBlockNDq = BwdTile<d>::kBlockN;

/// Byte offsets in the block's dynamic shared memory (base 1024-aligned).
template <int d>
struct PlanDq {
  static constexpr int B_c = kBlockNDq<d>;
  static constexpr uint32_t q = 0;                                       // Q_i [d/64][64][64]
  static constexpr uint32_t dO = q + tile_bytes(kBlockMDq, d);            // dO_i, like Q
  static constexpr uint32_t k = dO + tile_bytes(kBlockMDq, d);            // K_j [2][d/64][B_c][64]
  static constexpr uint32_t v = k + kStagesDq * tile_bytes(B_c, d);  // V_j, like K
  static constexpr uint32_t barriers = v + kStagesDq * tile_bytes(B_c, d);  // q_full, kv_full[2]
  static constexpr uint32_t bytes_to_allocate = barriers + 8 * (1 + kStagesDq) + 1024;
  static_assert(bytes_to_allocate <= 227 * 1024, "more shared memory than a block may have");
};

}  // namespace

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(128, 1) dq_kernel(const __grid_constant__ BwdParams p) {
  constexpr int B_r = kBlockMDq, B_c = kBlockNDq<d>, kStages = kStagesDq;
  using Plan = PlanDq<d>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024);
  Elem* sQ = reinterpret_cast<Elem*>(smem + Plan::q);
  Elem* sdO = reinterpret_cast<Elem*>(smem + Plan::dO);
  Elem* sK = reinterpret_cast<Elem*>(smem + Plan::k);
  Elem* sV = reinterpret_cast<Elem*>(smem + Plan::v);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::barriers);
  uint64_t* kv_full = q_full + 1;

  // The last query tile first: under the causal mask it visits the most key tiles.
  const int m_block = kCausal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z, query0 = m_block * B_r;
  const int bh = batch * p.heads + head, bkv = batch * p.kv_heads + head / (p.heads / p.kv_heads);
  const stage10::KeyTiles tiles = stage10::key_tiles(query0, B_r, p.seq_q, p.seq_k, B_c, kCausal);

  auto load_kv = [&](int j) {  // key tile j into buffer j % 2
    const int s = j % kStages;
    mbarrier_arrive_expect_tx(&kv_full[s], 2 * tile_bytes(B_c, d));
    for (int c = 0; c < d / 64; ++c) {
      tma_load_3d(reinterpret_cast<unsigned char*>(sK + s * B_c * d) + c * column_block_bytes(B_c), &p.map_k,
                  &kv_full[s], 64 * c, j * B_c, bkv);
      tma_load_3d(reinterpret_cast<unsigned char*>(sV + s * B_c * d) + c * column_block_bytes(B_c), &p.map_v,
                  &kv_full[s], 64 * c, j * B_c, bkv);
    }
  };
  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) mbarrier_init(&kv_full[s], 1);
    fence_barrier_init();
    mbarrier_arrive_expect_tx(q_full, 2 * tile_bytes(B_r, d));
    for (int c = 0; c < d / 64; ++c) {
      tma_load_3d(reinterpret_cast<unsigned char*>(sQ) + c * column_block_bytes(B_r), &p.map_q, q_full, 64 * c,
                  query0, bh);
      tma_load_3d(reinterpret_cast<unsigned char*>(sdO) + c * column_block_bytes(B_r), &p.map_do, q_full, 64 * c,
                  query0, bh);
    }
    if (tiles.count > 0) load_kv(0);
  }
  __syncthreads();  // barriers initialised before anyone waits on them

  // This thread's two rows: their L2 and D (padding rows: +inf and 0).
  float l2[2], dd[2];
  for (int r = 0; r < 2; ++r) {
    const int64_t at = int64_t(bh) * p.n_q_pad + query0 + fragment_row(r);
    l2[r] = p.L2[at];
    dd[r] = p.D[at];
  }
  float dq[d / 2] = {};  // dQ_i: [64 queries, d]
  mbarrier_wait(q_full, 0);
  for (int j = 0; j < tiles.count; ++j) {
    const auto [s, parity] = PipelineState<kStages>::at(j);
    __syncthreads();  // every warp is done with tile j − 1, so its buffer may be refilled
    if (threadIdx.x == 0 && j + 1 < tiles.count) load_kv(j + 1);
    mbarrier_wait(&kv_full[s], parity);

    float sc[B_c / 2], dp[B_c / 2];  // S, dP: [64 queries, B_c keys]
    wgmma_fence();
    gemm_qk<d, B_c>(sc, sQ, B_r, sK + s * B_c * d);
    gemm_qk<d, B_c>(dp, sdO, B_r, sV + s * B_c * d);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(sc);
    fence_registers(dp);
    if (j >= tiles.first_masked) stage10::mask_tile<B_c, kCausal>(sc, query0, j * B_c, p.seq_q, p.seq_k);
#pragma unroll
    for (int x = 0; x < B_c / 2; ++x) {
      const int r = (x / 2) % 2;  // element 4j + 2r + e belongs to row r
      const float prob = fast_exp2(fmaf(sc[x], p.scale_log2, -l2[r]));
      dp[x] = prob * (dp[x] - dd[r]);
    }
    uint32_t ds_frag[B_c / 16][4];
    stage10::pack_p<B_c, Elem>(dp, ds_frag);
    wgmma_fence();
    gemm_pv<d, B_c>(dq, ds_frag, sK + s * B_c * d);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(dq);
    stage10::fence_fragments(ds_frag);
  }
  write_rows<d, Elem>(dq, p.scale, p.dQ, bh, query0, p.seq_q);
}

StepKernel dq_pass(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128, 256>("11_hopper_bwd", "dq_pass", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    return make_step_kernel(causal, dq_kernel<D, Elem, true>, dq_kernel<D, Elem, false>, Threads{128},
                            BlockRows{kBlockMDq}, BlockCols{kBlockNDq<D>}, SmemBytes{PlanDq<D>::bytes_to_allocate});
  });
}

}  // namespace fa::stage11
