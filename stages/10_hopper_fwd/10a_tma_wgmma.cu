// Stage 10, step 10a — TMA and wgmma: stage 08's loop on Hopper's copy engine and
// warpgroup MMA, with no specialization yet.
//
// What changed from stage 08, and why: stage 08's warps copied every tile themselves
// (cp.async, 16 bytes per thread per instruction) and fed the tensor cores 16 × 8 × 16
// products from registers they had loaded with ldmatrix. Here one thread asks the copy
// engine (TMA) for a whole tile with one instruction per 64 columns; the tile lands in
// shared memory already swizzled, and an mbarrier counts its bytes in. The products are
// wgmma: one warpgroup (4 warps, 128 threads) issues 64 × N × 16 products that read K and
// V (and Q) from shared memory through descriptors, with no ldmatrix; S stays in registers
// as fp32 and becomes P, the A operand of P·V, without leaving them. One warpgroup owns the
// block's B_r = 64 rows; K/V tiles go into two buffers so the next tile, j − 1 (tiles run
// last to first), is in flight while tile j is computed.
//
//   thread 0: load Q_i → q_full;  load K, V of the first tile → kv_full[0]
//   for the n-th tile j (buffer s = n % 2):
//     block barrier (every warp is done with the other buffer);  thread 0: TMA of the next tile into it
//     wait kv_full[s] (parity (n / 2) & 1)
//     S = Q_i·K_jᵀ (wgmma from shared memory, wait);  mask on-band tiles (those that cross
//     the causal diagonal or the end of the keys for some row of the block)
//     online softmax → P, α;  O ← α·O;  O += P·V_j (wgmma, P from registers, wait)
//   O ← O / l;  L = scale·m + ln l;  O → shared → global;  L → global
//
// Run: ./build/stages/10_hopper_fwd/stage10 --step 10a --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hopper/pipeline_state.cuh"
#include "hopper/ptx.cuh"
#include "hopper/tile_math.cuh"
#include "hopper/tile_schedule.h"
#include "hopper/wgmma.cuh"
#include "hopper_fwd_steps.h"
#include "step_table.cuh"

namespace fa::stage10 {

namespace {

constexpr int kBlockM10a = kRowsPerWarpgroup;  // B_r = 64: one warpgroup
constexpr int kStages10a = 2;

/// Byte offsets in the block's dynamic shared memory (base 1024-aligned).
template <int d>
struct Plan10a {
  static constexpr int B_c = Tile<d>::kBlockN;
  static constexpr uint32_t q = 0;                                        // [d/64][64][64]
  static constexpr uint32_t k = q + tile_bytes(kBlockM10a, d);            // [2][d/64][B_c][64]
  static constexpr uint32_t v = k + kStages10a * tile_bytes(B_c, d);      // like K
  static constexpr uint32_t barriers = v + kStages10a * tile_bytes(B_c, d);  // q_full, kv_full[2]
  static constexpr uint32_t bytes_to_allocate = barriers + 8 * (1 + kStages10a) + 1024;
};

}  // namespace

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(128, 1) fwd_10a(const __grid_constant__ FwdParams p) {
  constexpr int B_c = Tile<d>::kBlockN;
  using Plan = Plan10a<d>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024);
  Elem* sQ = reinterpret_cast<Elem*>(smem + Plan::q);
  Elem* sK = reinterpret_cast<Elem*>(smem + Plan::k);
  Elem* sV = reinterpret_cast<Elem*>(smem + Plan::v);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::barriers);
  uint64_t* kv_full = q_full + 1;

  const int m_block = kCausal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int bh = batch * p.heads + head, bkv = batch * p.kv_heads + head / (p.heads / p.kv_heads);
  const int row0 = m_block * kBlockM10a;
  const KeyTiles tiles = key_tiles(row0, kBlockM10a, p.seq_q, p.seq_k, B_c, kCausal);

  // One thread issues a tile's copies: K_j and V_j complete on the same barrier, which
  // expects both tiles' bytes.
  auto load_kv = [&](int n) {
    const int j = tiles.count - 1 - n, s = n % kStages10a;
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
    for (int s = 0; s < kStages10a; ++s) mbarrier_init(&kv_full[s], 1);
    fence_barrier_init();
    mbarrier_arrive_expect_tx(q_full, tile_bytes(kBlockM10a, d));
    for (int c = 0; c < d / 64; ++c)
      tma_load_3d(reinterpret_cast<unsigned char*>(sQ) + c * column_block_bytes(kBlockM10a), &p.map_q, q_full,
                  64 * c, row0, bh);
    if (tiles.count > 0) load_kv(0);
  }
  __syncthreads();  // barriers initialised before anyone waits on them

  float o[d / 2] = {};  // O_i, [64, d] over the warpgroup
  RowState st;
  mbarrier_wait(q_full, 0);
  for (int n = 0; n < tiles.count; ++n) {
    const int j = tiles.count - 1 - n, s = n % kStages10a;
    __syncthreads();  // every warp finished tile n − 1, so its buffer may be refilled
    if (threadIdx.x == 0 && n + 1 < tiles.count) load_kv(n + 1);
    mbarrier_wait(&kv_full[s], PipelineState<kStages10a>::at(n).phase);

    float s_acc[B_c / 2];  // S = Q_i·K_jᵀ, [64, B_c]
    wgmma_fence();
    gemm_qk<d, B_c>(s_acc, sQ, kBlockM10a, sK + s * B_c * d);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s_acc);

    if (j >= tiles.first_masked) mask_tile<B_c, kCausal>(s_acc, row0, j * B_c, p.seq_q, p.seq_k);
    rescale_o<d>(o, softmax_tile<B_c>(s_acc, st, p.scale_log2));
    uint32_t p_frag[B_c / 16][4];  // P as wgmma A fragments
    pack_p<B_c, Elem>(s_acc, p_frag);

    wgmma_fence();
    gemm_pv<d, B_c>(o, p_frag, sV + s * B_c * d);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    fence_fragments(p_frag);
  }
  write_output<d>(o, st, sQ, kBlockM10a, 0, p, row0, bh, 1);
}

StepKernel step_10a(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128, 256>("10_hopper_fwd", "10a", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    StepKernel k = make_step_kernel(causal, fwd_10a<D, Elem, true>, fwd_10a<D, Elem, false>, Threads{128},
                                    BlockRows{kBlockM10a}, BlockCols{Tile<D>::kBlockN},
                                    SmemBytes{Plan10a<D>::bytes_to_allocate});
    k.stages = kStages10a;
    return k;
  });
}

}  // namespace fa::stage10
