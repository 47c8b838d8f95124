// Stage 11, step 11b — warp specialization: a producer warpgroup (one thread of it issues
// the copies) streams the query tiles, two consumer warpgroups share a key tile of B_c = 128.
//
// What changed from 11a, and why: in 11a the warpgroup that computed also issued the
// copies, one step ahead, and 64 keys gave each Q_i/dO_i tile little reuse: every query
// tile was read once per 64 keys. Here the block has three warpgroups. Warpgroup 0 is the
// producer: one of its threads loads K_j, V_j once and then runs up to kStages query tiles
// ahead, waiting only for a buffer to be released. Warpgroups 1 and 2 are consumers, 64
// keys each, so each Q_i/dO_i tile now serves 128 keys. setmaxnreg moves registers from the
// producer to the consumers, which hold dK_j and dV_j (2 × 64 × d fp32 between them) for
// the block's whole life. The consumers meet once per step: dQ_i = dS·K_j needs the dSᵀ
// rows of both, so each writes its half to shared memory and a named barrier joins them;
// then each computes one [64, 64] block of dQ_i (at d = 128 the two column halves, at
// d = 64 with B_r = 128 the two row halves) and adds it to dQ_accum. dSᵀ has two buffers:
// a consumer reaches the barrier of step n only after its step n − 1 waited for its dQ
// product, so that barrier proves both warpgroups are done reading step n − 1's buffer, and
// step n + 1 may overwrite it with no barrier of its own: one barrier per step.
//
//   producer (1 thread):  load K_j, V_j; for each step n: wait empty[s]; load Q_i, dO_i, L2_i, D_i
//   consumer c (keys 64c … 64c + 63 of the tile):  wait K_j, V_j
//     for each step n (query tile i, buffer s):
//       wait full[s];  Sᵀ = K_c·Q_iᵀ, dPᵀ = V_c·dO_iᵀ (wgmma, wait);  Pᵀ, dSᵀ (mask on-diagonal tiles)
//       dSᵀ → shared buffer n % 2;  dV_c += Pᵀ·dO_i;  dK_c += dSᵀ·Q_i  (wgmma)
//       named barrier (both consumers);  dQ block c = dS·K_j (wgmma, wait);  release buffer s
//       red.add the dQ block into dQ_accum
//     write dV_c and scale·dK_c
//
// Run: ./build/stages/11_hopper_bwd/stage11 --step 11b --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --backward --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bwd_math.cuh"
#include "bwd_pipeline.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_bwd_steps.h"
#include "step_table.cuh"

namespace fa::stage11 {

using S11b = Specialized;

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(S11b::kThreads, 1) bwd_11b(const __grid_constant__ BwdParams p) {
  constexpr int B_c = BwdTile<d>::kBlockN, B_r = BwdTile<d>::kBlockM, kStages = BwdTile<d>::kStages;
  extern __shared__ unsigned char smem[];
  const S11b::Shared<d, Elem> sm(smem);
  const BlockWork work = block_work<B_c, B_r, kCausal>(p);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers(256);  // the 256 consumer threads release each buffer
  __syncthreads();  // barriers initialised before anyone waits on them

  if (warpgroup == 0) {  // ---- producer ----
    setmaxnreg_dec<S11b::kProducerRegisters>();
    if (threadIdx.x == 0) S11b::produce(sm, p, work);
    return;
  }
  // ---- consumer c: keys [64c, 64c + 64) of the tile ----
  setmaxnreg_inc<S11b::kConsumerRegisters>();
  const int c = warpgroup - 1, key0 = work.key0 + 64 * c;
  const Elem* k_rows = sm.k + 64 * c * 64;  // this warpgroup's rows of column block 0 (for Sᵀ)
  const Elem* v_rows = sm.v + 64 * c * 64;
  // This warpgroup's [64, 64] block of dQ_i: column block c at d = 128, row block c at d = 64.
  const int dq_rows = d == 64 ? c : 0, dq_cols = d == 64 ? 0 : c;

  float dv[d / 2] = {}, dk[d / 2] = {};  // dV_c, dK_c: [64 keys, d]
  mbarrier_wait(sm.kv_full, 0);
  for (int n = 0; n < work.steps; ++n) {
    const int bh = work.bh(n), i = work.tile(n), query0 = i * B_r;
    const auto [s, parity] = PipelineState<kStages>::at(n);
    Elem* ds = sm.ds_buffer(n % 2);
    mbarrier_wait(&sm.full[s], parity);

    float st[B_r / 2], dpt[B_r / 2];  // Sᵀ, dPᵀ: [64 keys, B_r queries]
    wgmma_fence();
    gemm_qk<d, B_r>(st, k_rows, B_c, sm.q_stage(s));
    gemm_qk<d, B_r>(dpt, v_rows, B_c, sm.do_stage(s));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(st);
    fence_registers(dpt);

    if (i < work.tiles.first_unmasked)
      probabilities_and_ds<B_r, true, kCausal>(st, dpt, sm.l2_stage(s), sm.dd_stage(s), key0, query0, p);
    else
      probabilities_and_ds<B_r, false, kCausal>(st, dpt, sm.l2_stage(s), sm.dd_stage(s), key0, query0, p);
    uint32_t p_frag[B_r / 16][4], ds_frag[B_r / 16][4];  // Pᵀ, dSᵀ as A fragments
    stage10::pack_p<B_r, Elem>(st, p_frag);
    stage10::pack_p<B_r, Elem>(dpt, ds_frag);
    store_ds<B_c, B_r>(dpt, ds, 64 * c);
    fence_proxy_async_smem();  // the generic stores of dSᵀ, before wgmma reads them

    wgmma_fence();
    gemm_pv<d, B_r>(dv, p_frag, sm.do_stage(s));
    gemm_pv<d, B_r>(dk, ds_frag, sm.q_stage(s));
    wgmma_commit();
    named_barrier_sync(S11b::kConsumersBarrier, 256);  // both halves of dSᵀ are in shared memory
    float dq[32];  // this warpgroup's [64, 64] block of dQ_i from this key tile
    gemm_dq<B_c, 64>(dq, ds, dq_rows, sm.k, dq_cols);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(dv);
    fence_registers(dk);
    stage10::fence_fragments(p_frag);
    stage10::fence_fragments(ds_frag);
    // Every consumer thread releases the buffer itself: its arrive (a release) comes after its
    // own generic reads of L2_i, D_i, so the refill cannot overtake any of them.
    mbarrier_arrive(&sm.empty[s]);  // this thread is done with buffer s
    fence_registers(dq);
    add_dq<64>(dq, p.dQ_accum + (int64_t(bh) * p.n_q_pad + query0 + 64 * dq_rows) * d + 64 * dq_cols, d);
  }
  write_rows<d, Elem>(dv, 1.f, p.dV, work.bkv, key0, p.seq_k);
  write_rows<d, Elem>(dk, p.scale, p.dK, work.bkv, key0, p.seq_k);
}

StepKernel step_11b(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128>("11_hopper_bwd", "11b", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    return make_step_kernel(causal, bwd_11b<D, Elem, true>, bwd_11b<D, Elem, false>, Threads{S11b::kThreads},
                            BlockRows{BwdTile<D>::kBlockM}, BlockCols{BwdTile<D>::kBlockN},
                            SmemBytes{S11b::Shared<D, Elem>::Plan::bytes_to_allocate});
  });
}

}  // namespace fa::stage11
