// Stage 13 on Hopper — masks and score modifiers in stage 10's final forward (10f: a
// persistent, warp-specialized block per SM with TMA, wgmma, ping-pong consumers and a
// dynamic tile scheduler).
//
// What changed from stage 10, and why: stage 10 knows one mask, the causal one, as two
// numbers per query tile (how many key tiles, from which one on they are masked). Here the
// mask is the document mask of document_mask.h — a window, causal or two-sided, inside one
// document of a packed sequence — and the same two questions become calls on it:
//   key_tile_range(query tile)   which key tiles the rows see: the producer loads exactly
//                                those, the consumers iterate over exactly those, so a
//                                skipped tile is never loaded nor computed;
//   classify(rows, key tile)     full (computed as in stage 10) or partial (then masked
//                                element by element with keep()), per consumer warpgroup.
// The work list is (document, query tile) pairs, so every tile lies in one document; empty
// documents have no tile. The score modifiers are compile-time functors (masked_fragments.cuh:
// NoScore, ModifiedScore<softcap, alibi>) applied to S before the online softmax, and the
// sinks enter the final normaliser in the epilogue.
//
// Algorithm, one block per SM, a producer warpgroup and two consumer warpgroups of 64 rows
// (three at d = 64):
//   producer: for each work tile t (document D, rows r0…, head h) the scheduler hands it:
//       publish the tile; TMA Q → q_full;  for j in key_tile_range(D, r0…) from the last:
//       TMA K_j, V_j of D into the ring
//   consumer c, for each work tile: O = 0, m = −inf, l = 0; wait q_full
//     for j in key_tile_range(D, r0…) from the last:
//       S_j = Q_c·K_jᵀ  (ping-pong turn; P_prev·V_prev issued behind it)
//       S_j ← score(S_j);  if classify(rows of c, j) = partial: S_j ← −inf where !keep
//       online softmax;  O ← α·O + P_prev·V_prev
//     epilogue: O and L with the sink σ_h in the normaliser, the document's rows only
//
// Layout: Q, O [batch][heads][seq_q][d]; K, V [batch][kv_heads][seq_k][d]; L
// [batch][heads][seq_q] (docs/design.md §3). Documents are packed along the sequence of a
// batch of one (cu_seqlens_q, cu_seqlens_k, as the CPU step). Limits: bf16 and f16;
// d ∈ {64, 128}; pointers 16-byte aligned; compute capability 9.0 (built for sm_90a).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hopper/tile_math.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/wgmma.cuh"
#include "masked_fragments.cuh"
#include "masked_hopper_kernels.h"
#include "masked_pipeline.cuh"
#include "step_table.cuh"

namespace fa::stage13 {

using stage10::pack_p;
using stage10::rescale_o;
using stage10::RowState;
using stage10::softmax_tile;

template <int d, class Elem, class Score>
__global__ void __launch_bounds__(MaskedRoles<d>::kThreads, 1) masked_fwd(const __grid_constant__ MaskedParams p) {
  using R = MaskedRoles<d>;
  constexpr int B_c = R::kBlockN, kStages = R::kStages, kQ = R::kQBuffers;
  extern __shared__ unsigned char smem[];
  const MaskedShared<d, Elem> sm(smem);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // barriers initialised before anyone waits on them

  if (warpgroup == 0) {  // ---- producer ----
    setmaxnreg_dec<R::kProducerRegisters>();
    if (threadIdx.x == 0) {
      const DynamicScheduler tiles(p.tiles_total, p.tile_counter);
      int ring = 0;  // K/V tiles put into the ring so far, over all of this block's work tiles
      for (int t = tiles.first(), round = 0;; ++round) {
        const int b = round % kQ;  // Q buffer: the consumers may still be using the other one
        mbarrier_wait(&sm.q_empty[b], PipelineState<kQ>::at(round).phase ^ 1);  // they are done with this one
        if (!tiles.valid(t)) {  // no more work: tell the consumers through the Q barrier
          sm.work[b].bh = -1;
          mbarrier_arrive(&sm.q_full[b]);
          break;
        }
        //! [producer asks the mask]
        const WorkTile w = work_of<d>(p, t);
        sm.work[b] = w;  // published to the consumers by load_q's arrival on q_full[b]
        load_q(sm, p, w, b);
        const int t_next = tiles.next(t);  // asked now: the answer comes back while K/V stream in
        const KeyTileRange range = w.mask(p).key_tile_range(w.row0, R::kBlockM, B_c);
        const int head = w.bh % p.heads, batch = w.bh / p.heads;
        const int bkv = batch * p.kv_heads + head / (p.heads / p.kv_heads);  // grouped-query attention
        load_kv(sm, p, w, bkv, range, ring);
        ring += range.count();
        //! [producer asks the mask]
        t = t_next;
      }
    }
    return;
  }
  // ---- consumer c: rows [64·c, 64·c + 64) of every work tile ----
  setmaxnreg_inc<R::kConsumerRegisters>();
  const int c = warpgroup - 1, wg_row0 = c * kRowsPerWarpgroup;
  const int my_turn = R::kPingPongBarrier + c, next_turn = R::kPingPongBarrier + (c + 1) % R::kConsumers;
  const bool last_consumer = c == R::kConsumers - 1;
  // The softmax's exponent scale and the factor that takes its running max to natural-log
  // units: S is the raw product under NoScore (scale folded in), the modified logit otherwise.
  const float exp_scale = Score::kIdentity ? p.scale_log2 : float(M_LOG2E);
  const float max_scale = Score::kIdentity ? p.scale : 1.f;

  int ring = 0;  // as the producer's
  for (int round = 0;; ++round) {
    const int b = round % kQ;
    mbarrier_wait(&sm.q_full[b], PipelineState<kQ>::at(round).phase);
    const WorkTile w = sm.work[b];  // written before the producer's arrival on q_full[b]
    if (w.bh < 0) break;            // the producer found no more work
    //! [consumer asks the mask]
    const DocumentMask doc = w.mask(p);
    const KeyTileRange range = doc.key_tile_range(w.row0, R::kBlockM, B_c);  // the producer's range
    const int count = range.count(), row0 = w.row0 + wg_row0;  // this warpgroup's first row in the document
    const int head = w.bh % p.heads;
    Score score{};
    if constexpr (!Score::kIdentity) {
      score.scale = p.scale;
      score.cap = p.softcap;
      score.inv_cap = p.softcap > 0 ? 1.f / p.softcap : 0.f;
      score.slope = p.alibi_slopes ? p.alibi_slopes[head] : 0.f;
    }
    // S_j of key tile j as the softmax takes it: modified, and masked where partial for my rows.
    auto prepare = [&](float (&s_acc)[B_c / 2], int j) {
      score.template apply<B_c>(s_acc, row0, j * B_c, doc);
      if (doc.classify(row0, kRowsPerWarpgroup, j, B_c) != GpuTileKind::Full)
        mask_partial_tile<B_c>(s_acc, row0, j * B_c, doc);
    };
    //! [consumer asks the mask]
    Elem* q_tile = sm.q_buffer(b);
    const Elem* q_rows = q_tile + wg_row0 * 64;  // this warpgroup's rows of column block 0

    float o[d / 2] = {};           // O_i, [64, d] over the warpgroup
    uint32_t p_frag[B_c / 16][4];  // P of the previous key tile, as wgmma A fragments
    RowState st;
    if (last_consumer && count > 0) named_barrier_arrive(R::kPingPongBarrier, 256);  // consumer 0 goes first

    if (count > 0) {  // the first key tile: S alone (there is no P·V before it)
      const int j = range.end - 1, s = ring % kStages;
      float s_acc[B_c / 2];
      mbarrier_wait(&sm.k_full[s], PipelineState<kStages>::at(ring).phase);
      named_barrier_sync(my_turn, 256);
      wgmma_fence();
      gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(s));
      wgmma_commit();
      named_barrier_arrive(next_turn, 256);
      wgmma_wait<0>();
      fence_registers(s_acc);
      release_tile(&sm.k_empty[s]);
      prepare(s_acc, j);
      softmax_tile<B_c>(s_acc, st, exp_scale);  // O is still 0: nothing to rescale
      pack_p<B_c, Elem>(s_acc, p_frag);
    }
    for (int n = 1; n < count; ++n) {  // every later key tile: S_j and P_prev·V_prev in flight
      const int j = range.end - 1 - n, g = ring + n, s = g % kStages, prev = (g - 1) % kStages;
      float s_acc[B_c / 2];  // S_j = Q_c·K_jᵀ, [64, B_c]
      mbarrier_wait(&sm.k_full[s], PipelineState<kStages>::at(g).phase);
      mbarrier_wait(&sm.v_full[prev], PipelineState<kStages>::at(g - 1).phase);
      named_barrier_sync(my_turn, 256);  // the consumer before me has issued its products
      wgmma_fence();
      gemm_qk<d, B_c>(s_acc, q_rows, R::kBlockM, sm.k_stage(s));
      wgmma_commit();
      gemm_pv<d, B_c>(o, p_frag, sm.v_stage(prev));
      wgmma_commit();
      named_barrier_arrive(next_turn, 256);  // the next consumer's products may queue behind mine
      wgmma_wait<1>();                       // S_j is done; P_prev·V_prev may still be running
      fence_registers(s_acc);
      release_tile(&sm.k_empty[s]);
      prepare(s_acc, j);
      const float2 alpha = softmax_tile<B_c>(s_acc, st, exp_scale);  // the exponentials hide under P·V

      wgmma_wait<0>();  // P_prev·V_prev is done: O and p_frag are ours again
      fence_registers(o);
      stage10::fence_fragments(p_frag);
      release_tile(&sm.v_empty[prev]);
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
      stage10::fence_fragments(p_frag);
      release_tile(&sm.v_empty[s]);
    }
    const float sink = p.sinks ? p.sinks[head] : -INFINITY;
    const OutputRows out{w.bh, w.q_start + row0, min(kRowsPerWarpgroup, w.n_q - row0)};
    write_output_with_sink<d>(o, st, max_scale, sink, q_tile, R::kBlockM, wg_row0, p, out, R::kEpilogueBarrier + c);
    // The producer's next TMA into this Q buffer (async proxy) must come after this thread's
    // ordinary reads and writes of it (generic proxy): fence, then release the buffer.
    fence_proxy_async_smem();
    mbarrier_arrive(&sm.q_empty[b]);
    ring += count;
  }
}

namespace {

template <class Score>
StepKernel masked_kernel(int d, Dtype dtype) {
  return instantiate_step<64, 128>("13_masks", "hopper", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    using R = MaskedRoles<D>;
    StepKernel k = make_step_kernel(masked_fwd<D, Elem, Score>, Threads{R::kThreads}, BlockRows{R::kBlockM},
                                    BlockCols{R::kBlockN}, SmemBytes{MaskedSharedPlan<D>::bytes_to_allocate});
    k.stages = R::kStages;
    k.persistent = true;
    return k;
  });
}

}  // namespace

StepKernel masked_hopper_kernel(int d, Dtype dtype, bool softcap, bool alibi) {
  if (softcap && alibi) return masked_kernel<ModifiedScore<true, true>>(d, dtype);
  if (softcap) return masked_kernel<ModifiedScore<true, false>>(d, dtype);
  if (alibi) return masked_kernel<ModifiedScore<false, true>>(d, dtype);
  return masked_kernel<NoScore>(d, dtype);
}

}  // namespace fa::stage13
