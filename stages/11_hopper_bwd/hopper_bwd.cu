// Stage 11, step 11d (the final design) — dQ by a TMA reduction: the consumers hand their
// dQ blocks to a writer warp through shared memory, and the copy engine adds them to
// global memory in L2, one [64, 64] fp32 block (16 KB) per instruction.
//
// What changed from 11c, and why: Nsight Compute on 11c (H100, bf16, d = 128, N = 4096)
// shows L2 at 81% of its throughput and the tensor pipe at 50%: the dQ atomics, 16
// red.global.add.v2 per thread per step, each adding 8 bytes, keep L2 busier than the
// products keep the tensor cores. Here a consumer writes its [64, 64] fp32 block of dQ_i to
// a staging area in shared memory instead, and one thread of the producer warpgroup (warp
// 1, the *writer*; warp 0 issues the loads) adds the block to dQ_accum with one
// cp.reduce.async.bulk of 16 KB: the same additions, done by L2 on whole lines. For that
// the block must be contiguous in dQ_accum too, so this step keeps dQ_accum in [64, 64]
// blocks (dq_layout.h) and the conversion kernel reads it so. The consumers' only cost is
// 16 shared-memory stores per thread (columns swizzled inside a block: no bank conflict).
//
// The staging area has one buffer per consumer, filled and drained once per step:
//   dq_full[c]  consumer c's block is in shared memory (128 arrivals: its threads, each
//               after a fence.proxy.async, since the copy engine reads what they wrote)
//   dq_empty    the writer has read both blocks of the previous step (1 arrival)
// Shared memory: 160 KB (K_j, V_j, two Q_i/dO_i stages, two dSᵀ buffers) + 32 KB of staging.
//
//   producer warp 0 (1 thread): as 11b
//   writer warp 1 (1 thread), for each step n:
//     for c = 0, 1: wait dq_full[c];  one bulk reduce-add of block c into dQ_accum
//     commit;  wait until the copies have read shared memory;  arrive dq_empty
//   consumer c: as 11c, but after dQ is done (wait<1>):
//     wait dq_empty (the writer has read step n − 1's blocks);  dQ block → staging;
//     fence.proxy.async;  arrive dq_full[c]        ← dV, dK still running
//
// Run: ./build/stages/11_hopper_bwd/stage11 --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --backward --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bwd_math.cuh"
#include "bwd_pipeline.cuh"
#include "hopper/dq_staging.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_bwd_steps.h"
#include "step_table.cuh"

namespace fa::stage11 {

using S11d = Specialized;

/// kWithDq = false (the deterministic mode): dK_j and dV_j only; dQ comes from dq_pass.cu.
template <int d, class Elem, bool kCausal, bool kWithDq = true>
__global__ void __launch_bounds__(S11d::kThreads, 1) bwd_11d(const __grid_constant__ BwdParams p) {
  constexpr int B_c = BwdTile<d>::kBlockN, B_r = BwdTile<d>::kBlockM, kStages = BwdTile<d>::kStages;
  extern __shared__ unsigned char smem[];
  const S11d::Shared<d, Elem, true> sm(smem);
  const BlockWork work = block_work<B_c, B_r, kCausal>(p);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers(256);  // the 256 consumer threads release each buffer
  __syncthreads();  // barriers initialised before anyone waits on them

  if (warpgroup == 0) {  // ---- producer (warp 0) and dQ writer (warp 1) ----
    setmaxnreg_dec<S11d::kProducerRegisters>();
    if (threadIdx.x == 0) S11d::produce(sm, p, work);
    if (kWithDq && threadIdx.x == 32)  // step n's blocks: query tile work.tile(n) of head work.bh(n)
      write_dq<d>(sm, work.steps, [&](int n) {
        const int64_t row0 = int64_t(work.tile(n)) * B_r;
        return DqTile{p.dQ_accum + int64_t(work.bh(n)) * p.n_q_pad * d, row0};
      });
    return;
  }
  // ---- consumer c: keys [64c, 64c + 64) of the tile ----
  setmaxnreg_inc<S11d::kConsumerRegisters>();
  const int c = warpgroup - 1, key0 = work.key0 + 64 * c;
  const Elem* k_rows = sm.k + 64 * c * 64;  // this warpgroup's rows of column block 0 (for Sᵀ)
  const Elem* v_rows = sm.v + 64 * c * 64;
  // This warpgroup's [64, 64] block of dQ_i: column block c at d = 128, row block c at d = 64.
  const int dq_rows = d == 64 ? c : 0, dq_cols = d == 64 ? 0 : c;

  float dv[d / 2] = {}, dk[d / 2] = {};  // dV_c, dK_c: [64 keys, d]
  mbarrier_wait(sm.kv_full, 0);
  for (int n = 0; n < work.steps; ++n) {
    const int s = n % kStages, i = work.tile(n), query0 = i * B_r;
    Elem* ds = sm.ds_buffer(n % 2);
    mbarrier_wait(&sm.full[s], PipelineState<kStages>::at(n).phase);

    float st[B_r / 2], dpt[B_r / 2];  // Sᵀ, dPᵀ: [64 keys, B_r queries]
    wgmma_fence();
    gemm_qk<d, B_r>(st, k_rows, B_c, sm.q_stage(s));
    wgmma_commit();
    gemm_qk<d, B_r>(dpt, v_rows, B_c, sm.do_stage(s));
    wgmma_commit();
    wgmma_wait<1>();  // Sᵀ is done; dPᵀ may still run
    fence_registers(st);
    if (i < work.tiles.first_unmasked)
      probabilities<B_r, true, kCausal>(st, sm.l2_stage(s), key0, query0, p);
    else
      probabilities<B_r, false, kCausal>(st, sm.l2_stage(s), key0, query0, p);
    uint32_t p_frag[B_r / 16][4];  // Pᵀ as A fragments
    stage10::pack_p<B_r, Elem>(st, p_frag);
    wgmma_wait<0>();
    fence_registers(dpt);
    ds_from_dp<B_r>(st, dpt, sm.dd_stage(s));
    uint32_t ds_frag[B_r / 16][4];  // dSᵀ as A fragments
    stage10::pack_p<B_r, Elem>(dpt, ds_frag);

    float dq[32];  // this warpgroup's [64, 64] block of dQ_i from this key tile
    if constexpr (kWithDq) {
      store_ds<B_c, B_r>(dpt, ds, 64 * c);
      fence_proxy_async_smem();  // the generic stores of dSᵀ, before wgmma reads them
      named_barrier_sync(S11d::kConsumersBarrier, 256);  // both halves of dSᵀ are in shared memory
      wgmma_fence();
      gemm_dq<B_c, 64>(dq, ds, dq_rows, sm.k, dq_cols);
      wgmma_commit();
    }
    wgmma_fence();
    gemm_pv<d, B_r>(dv, p_frag, sm.do_stage(s));
    gemm_pv<d, B_r>(dk, ds_frag, sm.q_stage(s));
    wgmma_commit();
    if constexpr (kWithDq) {
      wgmma_wait<1>();  // dQ is done; dV and dK may still run
      fence_registers(dq);
      //! [dq handover]
      // LAB BEGIN: the dQ handover — hint: wait on dq_empty (one phase per step: parity (n & 1) ^ 1) until the writer has read the previous step's blocks; stage_dq into this consumer's buffer; fence_proxy_async_smem (the copy engine reads these generic stores); arrive on dq_full[c]
      mbarrier_wait(sm.dq_empty, (n & 1) ^ 1);  // the writer has read step n − 1's blocks
      stage_dq(dq, sm, c);
      fence_proxy_async_smem();  // the copy engine reads what these generic stores wrote
      mbarrier_arrive(&sm.dq_full[c]);
      // LAB END
      //! [dq handover]
    }
    wgmma_wait<0>();
    fence_registers(dv);
    fence_registers(dk);
    stage10::fence_fragments(p_frag);
    stage10::fence_fragments(ds_frag);
    // Every consumer thread releases the buffer itself: its arrive (a release) comes after its
    // own generic reads of L2_i, D_i, so the refill cannot overtake any of them.
    mbarrier_arrive(&sm.empty[s]);  // this thread is done with buffer s
  }
  write_rows<d, Elem>(dv, 1.f, p.dV, work.bkv, key0, p.seq_k);
  write_rows<d, Elem>(dk, p.scale, p.dK, work.bkv, key0, p.seq_k);
}

StepKernel step_11d(int d, Dtype dtype, bool causal, bool with_dq) {
  if (d == 256) return step_11d_256(dtype, causal, with_dq);
  return instantiate_step<64, 128>("11_hopper_bwd", "11d", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    const Threads threads{S11d::kThreads};
    const BlockRows rows{BwdTile<D>::kBlockM};
    const BlockCols cols{BwdTile<D>::kBlockN};
    const SmemBytes smem{S11d::Shared<D, Elem, true>::Plan::bytes_to_allocate};
    if (!with_dq)
      return make_step_kernel(causal, bwd_11d<D, Elem, true, false>, bwd_11d<D, Elem, false, false>, threads, rows,
                              cols, smem);
    return make_step_kernel(causal, bwd_11d<D, Elem, true>, bwd_11d<D, Elem, false>, threads, rows, cols, smem);
  });
}

}  // namespace fa::stage11
