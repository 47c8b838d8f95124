// Stage 10, step 10b — warp specialization: a producer warpgroup (one thread of it issues the
// copies) feeds a ring of K/V buffers,
// two consumer warpgroups compute.
//
// What changed from 10a, and why: in 10a the same warps issued the TMA copies and did the
// math, so a load was issued only when the math reached that point, and one warpgroup of
// 64 rows gave the tensor cores little to overlap. Here the block has three warpgroups:
// warpgroup 0 is the *producer* (one of its threads issues every TMA, running up to
// kStages tiles ahead, waiting only for a buffer to be released); warpgroups 1 and 2 are
// *consumers*, 64 query rows each, so a block holds B_r = 128 rows and reads each K/V tile
// once for both. setmaxnreg moves registers from the producer (which needs few) to the
// consumers (which hold S, P and O in registers). The math per tile is 10a's.
//
//   producer (1 thread):  load Q_i; for j = last … 0: wait k_empty[s], v_empty[s]; TMA K_j, V_j
//   consumer w (64 rows): wait Q_i; O = 0, m = −inf, l = 0
//     for j = last … 0 (buffer s):
//       wait k_full[s];  S = Q_w·K_jᵀ (wgmma, wait);  release K_j
//       mask on-band tiles;  online softmax → P, α;  O ← α·O
//       wait v_full[s];  O += P·V_j (wgmma, wait);  release V_j
//     O ← O / l;  L = scale·m + ln l;  store O (through shared memory, 16-byte stores) and L
//
// Run: ./build/stages/10_hopper_fwd/stage10 --step 10b --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hopper/tile_math.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_fwd_steps.h"
#include "pipeline.cuh"
#include "step_table.cuh"

namespace fa::stage10 {

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(TwoConsumers::kThreads, 1) fwd_10b(const __grid_constant__ FwdParams p) {
  constexpr int B_c = Tile<d>::kBlockN, kStages = Tile<d>::kStages;
  using R = TwoConsumers;
  extern __shared__ unsigned char smem[];
  const SharedTiles<d, Elem, R> sm(smem);
  const BlockWork work = block_work<d, kCausal, R>(p);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // barriers initialised before anyone waits on them

//! [roles]
  if (warpgroup == 0) {  // ---- producer ----
    setmaxnreg_dec<R::kProducerRegisters>();
    if (threadIdx.x == 0) produce<d>(sm, p, work.row0, work.bh, work.bkv, work.tiles);
    return;
  }
  // ---- consumer: rows [64·c, 64·c + 64) of the query tile ----
  setmaxnreg_inc<R::kConsumerRegisters>();
//! [roles]
  const int c = warpgroup - 1, wg_row0 = c * kRowsPerWarpgroup, query0 = work.row0 + wg_row0;
  const Elem* q_rows = sm.q + wg_row0 * 64;  // this warpgroup's rows of column block 0
  // The block visits the tiles any of its rows needs; a tile is masked only where it
  // crosses the diagonal (or the end of the keys) for one of *this* warpgroup's rows.
  const int first_masked = key_tiles(query0, kRowsPerWarpgroup, p.seq_q, p.seq_k, B_c, kCausal).first_masked;

  float o[d / 2] = {};  // O_i, [64, d] over the warpgroup
  RowState st;
  mbarrier_wait(sm.q_full, 0);
  for (int n = 0; n < work.tiles.count; ++n) {
    const int j = work.tiles.count - 1 - n;
    const auto [s, parity] = PipelineState<kStages>::at(n);

    float s_acc[B_c / 2];  // S = Q_w·K_jᵀ, [64, B_c]
    mbarrier_wait(&sm.k_full[s], parity);
    wgmma_fence();
    gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(s));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s_acc);
    release(&sm.k_empty[s]);

    if (j >= first_masked) mask_tile<B_c, kCausal>(s_acc, query0, j * B_c, p.seq_q, p.seq_k);
    rescale_o<d>(o, softmax_tile<B_c>(s_acc, st, p.scale_log2));
    uint32_t p_frag[B_c / 16][4];  // P as wgmma A fragments
    pack_p<B_c, Elem>(s_acc, p_frag);

    mbarrier_wait(&sm.v_full[s], parity);
    wgmma_fence();
    gemm_pv<d, B_c>(o, p_frag, sm.v_stage(s));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    fence_fragments(p_frag);
    release(&sm.v_empty[s]);
  }
  write_output<d>(o, st, sm.q, R::kBlockM, wg_row0, p, query0, work.bh, R::kEpilogueBarrier + c);
}

StepKernel step_10b(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128, 256>("10_hopper_fwd", "10b", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    using R = TwoConsumers;
    StepKernel k = make_step_kernel(causal, fwd_10b<D, Elem, true>, fwd_10b<D, Elem, false>, Threads{R::kThreads},
                                    BlockRows{R::kBlockM}, BlockCols{Tile<D>::kBlockN},
                                    SmemBytes{SharedPlan<D, R>::bytes_to_allocate});
    k.stages = Tile<D>::kStages;
    return k;
  });
}

}  // namespace fa::stage10
