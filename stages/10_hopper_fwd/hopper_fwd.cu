// Stage 10 — FlashAttention's forward on Hopper's own units: TMA loads completing on
// mbarriers, asynchronous warpgroup MMA (wgmma), warp specialization with register
// reallocation, ping-pong between consumer warpgroups, the softmax of one tile overlapped
// with the P·V product of the tile before, and a persistent block per SM that takes its
// query tiles from a scheduler (steps 10e and 10f; 10f is the final design).
//
// What changed from stage 08, and why: stage 08 is FlashAttention-2 on mma.sync, and on an
// H200 it plateaus near a third of the tensor cores' peak (about 40% of cuBLAS's bf16
// matrix product; stage 08's notes have the table): each warp issues its own small
// MMAs, loads its operands into registers with ldmatrix, and its exponentials wait for its
// own MMAs. Hopper adds units that take that work off the warps: the copy engine (TMA)
// moves whole tiles into swizzled shared memory and reports on an mbarrier; wgmma lets a
// warpgroup of 128 threads issue a 64 × N × 16 product that reads B (and A) straight from
// shared memory and runs asynchronously. The algorithm is stage 08's (the same tiles, the
// same online softmax, the same L); the schedule is new. The steps 10a–10d (files beside
// this one) build it one idea at a time; this file is 10d made persistent.
//
// What changed from 10d, and why: in 10d a block computes one query tile and ends; the
// next block on the SM starts by loading Q and waiting for its first K tile, and nothing
// overlaps the epilogue. Here the grid has one block per SM, each looping over a list of
// query tiles (one head's together; under the causal mask the heaviest first); the
// producer loads the next tile's Q and K/V while the consumers are still finishing the
// current one, and the ring of K/V buffers and its phases simply continue from one query
// tile to the next.
//
// What changed from 10e, and why (10f): 10e's list is dealt out before the launch (block b
// takes tiles b, b + grid, …), so under the causal mask the block that drew the heavier tiles
// finishes last, and its order (every head's last tile first) makes the blocks running at one
// time read every head's K and V, more than the L2 holds. 10f's blocks take the next tile
// from a global counter (common/hopper/tile_scheduler.cuh), and under the causal mask the
// heads go in sections whose K and V fit in the L2 (pipeline.cuh, HeadSections). The kernel
// below is the same for both; only the Scheduler and the Order differ.
//
// Algorithm, one block per SM; a producer warpgroup and two consumer warpgroups of 64 rows
// (B_r = 128), three at d = 64 (B_r = 192):
//   producer (one thread): for each query tile (i, head, batch) its scheduler hands it:
//       wait q_empty; tile index and TMA Q_i → q_full;  for j = last … 0: wait k_empty[s]; TMA K_j → k_full[s];
//       wait v_empty[s]; TMA V_j → v_full[s]   (s and its phase count on across query tiles)
//   consumer c (64 rows), for each of the block's query tiles: O = 0, m = −inf, l = 0; wait q_full
//     for each key tile j ("prev" = the tile visited before it, j + 1: tiles run last to first):
//       wait for my turn (ping-pong barrier)                                   ┐ tensor cores:
//       issue S_j = Q_c·K_jᵀ;  issue O += P_prev·V_prev;  hand the turn over  ┘ mine
//       wait for S_j only;  release K_j;  mask on-band tiles
//       m' = max(m, rowmax S_j); P_j = e^{scale(S_j − m')}; α = e^{scale(m − m')};
//       l ← α·l + rowsum P_j                                                     ← under P·V
//       wait for P_prev·V_prev;  release V_prev;  O ← α·O
//     O += P_last·V_last;  O ← O / l;  L = scale·m + ln l;  O → shared → global;  release Q_i
//
// Layout: Q, O [batch][heads][N_q][d]; K, V [batch][kv_heads][N_k][d]; L [batch][heads][N_q]
// (docs/design.md §3); query head h reads kv head h / (heads / kv_heads). Limits: bf16 and f16;
// d ∈ {64, 128, 256}; pointers 16-byte aligned; compute capability 9.0 (built for sm_90a).
// The pieces: ptx.cuh (mbarrier, TMA, fences), wgmma.cuh (descriptors, the products),
// pipeline.cuh (shared memory, the producer), tile_math.cuh (softmax on fragments,
// epilogue), tile_schedule.h (which key tiles, which masked), launch.cpp (host side).
// Run:    ./build/stages/10_hopper_fwd/stage10 --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --heads 16 --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hopper/tile_math.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_fwd_steps.h"
#include "pipeline.cuh"
#include "step_table.cuh"

namespace fa::stage10 {

template <int d, class Elem, bool kCausal, class Scheduler, class Order>
__global__ void __launch_bounds__(RolesOf<d>::kThreads, 1) fwd_persistent(const __grid_constant__ FwdParams p) {
  using R = RolesOf<d>;
  constexpr int B_c = Tile<d>::kBlockN, kStages = Tile<d>::kStages, kQ = kQBuffersOf<d>;
  extern __shared__ unsigned char smem[];
  const SharedTiles<d, Elem, R, kQ> sm(smem);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // barriers initialised before anyone waits on them

  //! [persistent producer]
  if (warpgroup == 0) {  // ---- producer ----
    setmaxnreg_dec<R::kProducerRegisters>();
    if (threadIdx.x == 0) {
      const Scheduler tiles(p.tiles_total, p.tile_counter);
      int ring = 0;  // K/V tiles put into the ring so far, over all of this block's query tiles
      for (int t = tiles.first(), round = 0;; ++round) {
        const int b = round % kQ;  // Q_i buffer: the consumers may still be using the other one
        mbarrier_wait(&sm.q_empty[b], PipelineState<kQ>::at(round).phase ^ 1);  // they are done with this one
        if (!tiles.valid(t)) {  // no more work: tell the consumers through the Q_i barrier
          sm.tile[b] = -1;
          mbarrier_arrive(&sm.q_full[b]);
          break;
        }
        sm.tile[b] = t;  // published to the consumers by load_q's arrival on q_full[b]
        const BlockWork work = Order::template work<d, kCausal, R>(p, t);
        load_q(sm, p, work.row0, work.bh, b);
        const int t_next = tiles.next(t);  // asked now: 10f's answer comes back while K/V stream in
        load_kv(sm, p, work.bkv, work.tiles, ring);
        ring += work.tiles.count;
        t = t_next;
      }
    }
    return;
  }
  //! [persistent producer]
  // ---- consumer c: rows [64·c, 64·c + 64) of every query tile ----
  setmaxnreg_inc<R::kConsumerRegisters>();
  const int c = warpgroup - 1, wg_row0 = c * kRowsPerWarpgroup;
  // Turns go round the consumers: 0, 1, (2,) 0, 1, ...; consumer c hands over to c + 1.
  const int my_turn = R::kPingPongBarrier + c, next_turn = R::kPingPongBarrier + (c + 1) % R::kConsumers;
  const bool last_consumer = c == R::kConsumers - 1;

  int ring = 0;  // as the producer's
  for (int round = 0;; ++round) {
    const int b = round % kQ;
    mbarrier_wait(&sm.q_full[b], PipelineState<kQ>::at(round).phase);
    const int t = sm.tile[b];  // written before the producer's arrival on q_full[b], which we waited for
    if (t < 0) break;          // the producer found no more work
    const BlockWork work = Order::template work<d, kCausal, R>(p, t);
    const int count = work.tiles.count, query0 = work.row0 + wg_row0;
    Elem* q_tile = sm.q_buffer(b);
    const Elem* q_rows = q_tile + wg_row0 * 64;  // this warpgroup's rows of column block 0
    // A key tile is masked only where it crosses the diagonal (or the end of the keys) for
    // one of this warpgroup's rows.
    const int first_masked = key_tiles(query0, kRowsPerWarpgroup, p.seq_q, p.seq_k, B_c, kCausal).first_masked;

    float o[d / 2] = {};           // O_i, [64, d] over the warpgroup
    uint32_t p_frag[B_c / 16][4];  // P of the previous key tile, as wgmma A fragments
    RowState st;
    if (last_consumer && count > 0) named_barrier_arrive(R::kPingPongBarrier, 256);  // consumer 0 goes first

    if (count > 0) {  // the first key tile: S alone (there is no P·V before it)
      const int j = count - 1, s = ring % kStages;
      float s_acc[B_c / 2];
      mbarrier_wait(&sm.k_full[s], PipelineState<kStages>::at(ring).phase);
      named_barrier_sync(my_turn, 256);
      wgmma_fence();
      gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(s));
      wgmma_commit();
      named_barrier_arrive(next_turn, 256);
      wgmma_wait<0>();
      fence_registers(s_acc);
      release(&sm.k_empty[s]);
      if (j >= first_masked) mask_tile<B_c, kCausal>(s_acc, query0, j * B_c, p.seq_q, p.seq_k);
      softmax_tile<B_c>(s_acc, st, p.scale_log2);  // O is still 0: nothing to rescale
      pack_p<B_c, Elem>(s_acc, p_frag);
    }
    for (int n = 1; n < count; ++n) {  // every later key tile: S_j and P_prev·V_prev in flight
      // g: the ring's use count over all of this block's query tiles (not the lane group of the
      // fragment layout); prev: the buffer of the tile visited before, j + 1.
      const int j = count - 1 - n, g = ring + n, s = g % kStages, prev = (g - 1) % kStages;
      float s_acc[B_c / 2];  // S_j = Q_c·K_jᵀ, [64, B_c]
      mbarrier_wait(&sm.k_full[s], PipelineState<kStages>::at(g).phase);
      mbarrier_wait(&sm.v_full[prev], PipelineState<kStages>::at(g - 1).phase);
      // LAB BEGIN: the ping-pong turn — hint: wait for my turn (named_barrier_sync(my_turn, 256)); wgmma_fence; issue S_j = Q_c·K_jᵀ (gemm_qk into s_acc from sm.k_stage(s)) and commit; issue O += P_prev·V_prev (gemm_pv from sm.v_stage(prev)) and commit: two groups; then hand the turn on (named_barrier_arrive(next_turn, 256))
      named_barrier_sync(my_turn, 256);  // the consumer before me has issued its products
      wgmma_fence();
      gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(s));
      wgmma_commit();
      gemm_pv<d, B_c>(o, p_frag, sm.v_stage(prev));
      wgmma_commit();
      named_barrier_arrive(next_turn, 256);  // the next consumer's products may queue behind mine
      // LAB END

      // LAB BEGIN: wait for S only — hint: S_j is the older of the two groups: wait until at most one group (P_prev·V_prev) is still running, fence s_acc, release K_j (k_empty[s]); the softmax below then runs under P·V
      wgmma_wait<1>();  // S_j is done; P_prev·V_prev may still be running
      fence_registers(s_acc);
      release(&sm.k_empty[s]);
      // LAB END
      if (j >= first_masked) mask_tile<B_c, kCausal>(s_acc, query0, j * B_c, p.seq_q, p.seq_k);
      const float2 alpha = softmax_tile<B_c>(s_acc, st, p.scale_log2);  // the exponentials hide under P·V

      wgmma_wait<0>();  // P_prev·V_prev is done: O and p_frag are ours again
      fence_registers(o);
      fence_fragments(p_frag);
      release(&sm.v_empty[prev]);
      rescale_o<d>(o, alpha);
      pack_p<B_c, Elem>(s_acc, p_frag);
    }
    if (count > 0) {  // the last key tile's P·V
      const int g = ring + count - 1, s = g % kStages;
      mbarrier_wait(&sm.v_full[s], PipelineState<kStages>::at(g).phase);
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
    write_output<d>(o, st, q_tile, R::kBlockM, wg_row0, p, query0, work.bh, R::kEpilogueBarrier + c);
    //! [release q]
    // The next TMA into the Q tile (async proxy) must come after this thread's ordinary reads
    // and writes of it (generic proxy): fence, then release the tile. Every thread arrives (a
    // release of its own accesses: the epilogue's and its read of sm.tile[b], which the
    // producer overwrites next time round).
    // LAB BEGIN: release Q — hint: the producer's next TMA into this Q buffer (async proxy) must come after this thread's ordinary reads and writes of it (generic proxy): fence_proxy_async_smem, then this thread's own arrival on q_empty[b] (mbarrier_arrive), which counts every consumer thread
    fence_proxy_async_smem();
    mbarrier_arrive(&sm.q_empty[b]);
    // LAB END
    //! [release q]
    ring += count;
  }
}

/// Steps 10e and 10f: the persistent kernel with the scheduler of each.
template <class Scheduler, class Order>
StepKernel persistent_step(const char* step, int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128, 256>("10_hopper_fwd", step, d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    using R = RolesOf<D>;
    StepKernel k = make_step_kernel(causal, fwd_persistent<D, Elem, true, Scheduler, Order>,
                                    fwd_persistent<D, Elem, false, Scheduler, Order>, Threads{R::kThreads},
                                    BlockRows{R::kBlockM}, BlockCols{Tile<D>::kBlockN},
                                    SmemBytes{SharedPlan<D, R, kQBuffersOf<D>>::bytes_to_allocate});
    k.stages = Tile<D>::kStages;
    k.persistent = true;
    return k;
  });
}

StepKernel step_10e(int d, Dtype dtype, bool causal) {
  return persistent_step<StaticScheduler, AllHeads>("10e", d, dtype, causal);
}

StepKernel step_10f(int d, Dtype dtype, bool causal) {
  return persistent_step<DynamicScheduler, HeadSections>("10f", d, dtype, causal);
}

}  // namespace fa::stage10
