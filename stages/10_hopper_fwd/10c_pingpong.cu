// Stage 10, step 10c — ping-pong: the two consumer warpgroups take turns on the tensor
// cores, so one's softmax runs while the other's products do.
//
// What changed from 10b, and why: in 10b each consumer issued S_j, waited, did its softmax,
// issued P·V_j and waited again; both consumers did so independently, and their GEMMs and
// softmaxes collided at random. The exponentials run on the special-function unit (16 per
// SM per clock against 2048 bf16 multiply-adds per clock for an H100's tensor cores: at
// d = 128 a tile's exps cost half its matmul time; docs/hardware.csv), so the tensor cores
// idle whenever both consumers are in their softmax. Here a consumer issues all of its
// tensor-core work for a step at once, S_j = Q·K_jᵀ together with P_{j+1}·V_{j+1} (the P·V
// of the tile before in visiting order: tiles run last to first, j = count − 1 − n; moving
// P·V one step later is what lets the two products be issued together), and two named
// barriers hand the turn from one consumer to the other:
//
//   consumer 0:  [S_j, PV_{j+1}]  softmax_j ............  [S_{j−1}, PV_j]  softmax_{j−1} ...
//   consumer 1:  ....  [S_j, PV_{j+1}]  softmax_j ......  [S_{j−1}, PV_j] ...
//   tensor cores: c0 c0 c1 c1 c0 c0 c1 c1 …   (one consumer's GEMMs under the other's exps)
//
//   consumer c, per tile j:  wait my turn;  issue S_j, P_prev·V_prev;  hand the turn over
//                            wait for both;  release K_j, V_prev;  mask;  softmax_j;  O ← α·O
//   after the loop: O += P_last·V_last;  epilogue as in 10b
//
// Run: ./build/stages/10_hopper_fwd/stage10 --step 10c --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hopper/tile_math.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_fwd_steps.h"
#include "pipeline.cuh"
#include "step_table.cuh"

namespace fa::stage10 {

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(TwoConsumers::kThreads, 1) fwd_10c(const __grid_constant__ FwdParams p) {
  constexpr int B_c = Tile<d>::kBlockN, kStages = Tile<d>::kStages;
  using R = TwoConsumers;
  extern __shared__ unsigned char smem[];
  const SharedTiles<d, Elem, R> sm(smem);
  const BlockWork work = block_work<d, kCausal, R>(p);
  const int warpgroup = threadIdx.x / 128, count = work.tiles.count;

  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // barriers initialised before anyone waits on them

  if (warpgroup == 0) {  // ---- producer ----
    setmaxnreg_dec<R::kProducerRegisters>();
    if (threadIdx.x == 0) produce<d>(sm, p, work.row0, work.bh, work.bkv, work.tiles);
    return;
  }
  // ---- consumer c: rows [64·c, 64·c + 64) of the query tile ----
  setmaxnreg_inc<R::kConsumerRegisters>();
  const int c = warpgroup - 1, wg_row0 = c * kRowsPerWarpgroup, query0 = work.row0 + wg_row0;
  const Elem* q_rows = sm.q + wg_row0 * 64;  // this warpgroup's rows of column block 0
  // The block visits the tiles any of its rows needs; a tile is masked only where it
  // crosses the diagonal (or the end of the keys) for one of *this* warpgroup's rows.
  const int first_masked = key_tiles(query0, kRowsPerWarpgroup, p.seq_q, p.seq_k, B_c, kCausal).first_masked;
  const int my_turn = R::kPingPongBarrier + c, other_turn = R::kPingPongBarrier + 1 - c;

  float o[d / 2] = {};           // O_i, [64, d] over the warpgroup
  uint32_t p_frag[B_c / 16][4];  // P of the previous tile, as wgmma A fragments
  RowState st;
  mbarrier_wait(sm.q_full, 0);
  if (c == 1 && count > 0) named_barrier_arrive(R::kPingPongBarrier, 256);  // consumer 0 goes first

  for (int n = 0; n < count; ++n) {
    const int j = count - 1 - n, prev = (n + kStages - 1) % kStages;
    const auto [s, parity] = PipelineState<kStages>::at(n);
    const uint32_t prev_parity = n > 0 ? PipelineState<kStages>::at(n - 1).phase : 0;

    float s_acc[B_c / 2];  // S_j = Q_c·K_jᵀ, [64, B_c]
    mbarrier_wait(&sm.k_full[s], parity);
    if (n > 0) mbarrier_wait(&sm.v_full[prev], prev_parity);
//! [ping-pong turn]
    named_barrier_sync(my_turn, 256);  // the other consumer has issued its products
    wgmma_fence();
    gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(s));
    wgmma_commit();
    if (n > 0) {
      gemm_pv<d, B_c>(o, p_frag, sm.v_stage(prev));
      wgmma_commit();
    }
    named_barrier_arrive(other_turn, 256);  // its products may queue behind mine now
//! [ping-pong turn]

    wgmma_wait<0>();  // S_j and P_prev·V_prev are done
    fence_registers(s_acc);
    fence_registers(o);
    fence_fragments(p_frag);
    release(&sm.k_empty[s]);
    if (n > 0) release(&sm.v_empty[prev]);
    if (j >= first_masked) mask_tile<B_c, kCausal>(s_acc, query0, j * B_c, p.seq_q, p.seq_k);
    const float2 alpha = softmax_tile<B_c>(s_acc, st, p.scale_log2);
    rescale_o<d>(o, alpha);
    pack_p<B_c, Elem>(s_acc, p_frag);
  }
  if (count > 0) {  // the last tile's P·V
    const auto [s, parity] = PipelineState<kStages>::at(count - 1);
    mbarrier_wait(&sm.v_full[s], parity);
    named_barrier_sync(my_turn, 256);
    wgmma_fence();
    gemm_pv<d, B_c>(o, p_frag, sm.v_stage(s));
    wgmma_commit();
    if (c == 0) named_barrier_arrive(other_turn, 256);  // consumer 1's last turn; it hands none back
    wgmma_wait<0>();
    fence_registers(o);
    fence_fragments(p_frag);
    release(&sm.v_empty[s]);
  }
  write_output<d>(o, st, sm.q, R::kBlockM, wg_row0, p, query0, work.bh, R::kEpilogueBarrier + c);
}

StepKernel step_10c(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128, 256>("10_hopper_fwd", "10c", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    using R = TwoConsumers;
    StepKernel k = make_step_kernel(causal, fwd_10c<D, Elem, true>, fwd_10c<D, Elem, false>, Threads{R::kThreads},
                                    BlockRows{R::kBlockM}, BlockCols{Tile<D>::kBlockN},
                                    SmemBytes{SharedPlan<D, R>::bytes_to_allocate});
    k.stages = Tile<D>::kStages;
    return k;
  });
}

}  // namespace fa::stage10
