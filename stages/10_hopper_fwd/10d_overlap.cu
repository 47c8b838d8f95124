// Stage 10, step 10d — overlap inside a warpgroup: the softmax of tile j runs while the
// tensor cores still compute P_{j+1}·V_{j+1} (the tile before j: tiles run last to first).
//
// What changed from 10c, and why: in 10c a consumer waited for both of its products before
// its softmax, so its own exponentials never overlapped its own products; only the other
// consumer's did. Here it waits for S_j alone (the older of its two wgmma groups,
// wgmma_wait<1>), computes the row maxima and exponentials, and only then waits for
// P_{j+1}·V_{j+1} and rescales O. At d = 64 a tile's exponentials cost as much as its two
// products, so a third consumer (B_r = 192) joins the ping-pong there.
//
//   consumer c, first tile:  my turn; issue S_0; hand over; wait; softmax → P_0
//   every later tile j:      my turn; issue S_j, P_prev·V_prev; hand over
//                            wait<1> (S_j);  release K_j;  mask;  softmax_j   ← under P·V
//                            wait<0>;  release V_prev;  O ← α·O;  P_prev ← P_j
//   after the loop: O += P_last·V_last;  epilogue
//
// Run: ./build/stages/10_hopper_fwd/stage10 --step 10d --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hopper/tile_math.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_fwd_steps.h"
#include "pipeline.cuh"
#include "step_table.cuh"

namespace fa::stage10 {

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(RolesOf<d>::kThreads, 1) fwd_10d(const __grid_constant__ FwdParams p) {
  using R = RolesOf<d>;
  constexpr int B_c = Tile<d>::kBlockN, kStages = Tile<d>::kStages;
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
  // Turns go round the consumers: 0, 1, (2,) 0, 1, ...; consumer c hands over to c + 1.
  const int my_turn = R::kPingPongBarrier + c, next_turn = R::kPingPongBarrier + (c + 1) % R::kConsumers;
  const bool last_consumer = c == R::kConsumers - 1;

  float o[d / 2] = {};           // O_i, [64, d] over the warpgroup
  uint32_t p_frag[B_c / 16][4];  // P of the previous tile, as wgmma A fragments
  RowState st;
  mbarrier_wait(sm.q_full, 0);
  if (last_consumer && count > 0) named_barrier_arrive(R::kPingPongBarrier, 256);  // consumer 0 goes first

  if (count > 0) {  // the first tile: S_0 alone (there is no P·V before it)
    const int j = count - 1;
    float s_acc[B_c / 2];
    mbarrier_wait(&sm.k_full[0], 0);
    named_barrier_sync(my_turn, 256);
    wgmma_fence();
    gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(0));
    wgmma_commit();
    named_barrier_arrive(next_turn, 256);
    wgmma_wait<0>();
    fence_registers(s_acc);
    release(&sm.k_empty[0]);
    if (j >= first_masked) mask_tile<B_c, kCausal>(s_acc, query0, j * B_c, p.seq_q, p.seq_k);
    softmax_tile<B_c>(s_acc, st, p.scale_log2);  // O is still 0: nothing to rescale
    pack_p<B_c, Elem>(s_acc, p_frag);
  }
  // Every later tile: two groups in flight, S_j then P_prev·V_prev. The loop body is the
  // same on every pass, so the compiler sees which group each wait completes (a first pass
  // with one group would make it serialize every wgmma).
//! [overlapped loop]
  for (int n = 1; n < count; ++n) {
    const int j = count - 1 - n;
    const auto [s, parity] = PipelineState<kStages>::at(n);            // K_j
    const auto [prev, prev_parity] = PipelineState<kStages>::at(n - 1);  // V of the tile before

    float s_acc[B_c / 2];  // S_j = Q_c·K_jᵀ, [64, B_c]
    mbarrier_wait(&sm.k_full[s], parity);
    mbarrier_wait(&sm.v_full[prev], prev_parity);
    named_barrier_sync(my_turn, 256);  // the other consumer has issued its products
    wgmma_fence();
    gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(s));
    wgmma_commit();
    gemm_pv<d, B_c>(o, p_frag, sm.v_stage(prev));
    wgmma_commit();
    named_barrier_arrive(next_turn, 256);  // the next consumer's products may queue behind mine now

    wgmma_wait<1>();  // S_j is done; P_prev·V_prev may still be running
    fence_registers(s_acc);
    release(&sm.k_empty[s]);
    if (j >= first_masked) mask_tile<B_c, kCausal>(s_acc, query0, j * B_c, p.seq_q, p.seq_k);
    const float2 alpha = softmax_tile<B_c>(s_acc, st, p.scale_log2);  // the exponentials hide under P·V

    wgmma_wait<0>();  // P_prev·V_prev is done: O and p_frag are ours again
    fence_registers(o);
    fence_fragments(p_frag);
    release(&sm.v_empty[prev]);
    rescale_o<d>(o, alpha);
    pack_p<B_c, Elem>(s_acc, p_frag);
  }
//! [overlapped loop]
  if (count > 0) {  // the last tile's P·V
    const auto [s, parity] = PipelineState<kStages>::at(count - 1);
    mbarrier_wait(&sm.v_full[s], parity);
    named_barrier_sync(my_turn, 256);
    wgmma_fence();
    gemm_pv<d, B_c>(o, p_frag, sm.v_stage(s));
    wgmma_commit();
    if (!last_consumer) named_barrier_arrive(next_turn, 256);  // the last consumer's last turn hands none on
    wgmma_wait<0>();
    fence_registers(o);
    fence_fragments(p_frag);
    release(&sm.v_empty[s]);
  }
  write_output<d>(o, st, sm.q, R::kBlockM, wg_row0, p, query0, work.bh, R::kEpilogueBarrier + c);
}

StepKernel step_10d(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128, 256>("10_hopper_fwd", "10d", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    using R = RolesOf<D>;
    StepKernel k = make_step_kernel(causal, fwd_10d<D, Elem, true>, fwd_10d<D, Elem, false>, Threads{R::kThreads},
                                    BlockRows{R::kBlockM}, BlockCols{Tile<D>::kBlockN},
                                    SmemBytes{SharedPlan<D, R>::bytes_to_allocate});
    k.stages = Tile<D>::kStages;
    return k;
  });
}

}  // namespace fa::stage10
