// Stage 11, step 11c — overlap: the exponentials run under the dPᵀ
// product, and the dQ atomics under the dV and dK products.
//
// What changed from 11b, and why: 11b's consumers issued Sᵀ and dPᵀ together and waited
// for both before the first exponential, and waited for all of dV, dK and dQ before the
// first atomic: the tensor cores and the special-function and memory units took turns
// inside each warpgroup, and with both warpgroups meeting at the dSᵀ barrier every step
// they mostly took the same turns at the same time. Here every wait is for exactly the
// product whose result comes next, so the work that does not need the tensor cores runs
// while they do:
//   - Sᵀ and dPᵀ are committed as two groups: Pᵀ = 2^{…} needs only Sᵀ (wait<1>), and its
//     exponentials run while dPᵀ is still being computed;
//   - after the dSᵀ barrier, dQ is issued first and dV, dK after it, again as two groups:
//     the red.add of the dQ block (wait<1>) goes out while dV and dK are computed.
// The products, tiles and their order of additions are 11b's: dK and dV are the same bits.
//
//   producer (1 thread): as 11b
//   consumer c (keys 64c … 64c + 63 of the tile), for each step n (query tile i, buffer s):
//     wait full[s];  issue Sᵀ = K_c·Q_iᵀ; commit;  issue dPᵀ = V_c·dO_iᵀ; commit
//     wait<1> (Sᵀ);  Pᵀ (mask on-diagonal tiles)          ← dPᵀ still running
//     wait<0> (dPᵀ); dSᵀ;  dSᵀ → shared buffer n % 2;  named barrier (both consumers)
//     issue dQ block c = dS·K_j; commit;  issue dV_c += Pᵀ·dO_i, dK_c += dSᵀ·Q_i; commit
//     wait<1> (dQ);  red.add the dQ block into dQ_accum     ← dV, dK still running
//     wait<0>;  release buffer s
//   write dV_c and scale·dK_c
//
// Run: ./build/stages/11_hopper_bwd/stage11 --step 11c --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --backward --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bwd_math.cuh"
#include "bwd_pipeline.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_bwd_steps.h"
#include "step_table.cuh"

namespace fa::stage11 {

using S11c = Specialized;

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(S11c::kThreads, 1) bwd_11c(const __grid_constant__ BwdParams p) {
  constexpr int B_c = BwdTile<d>::kBlockN, B_r = BwdTile<d>::kBlockM, kStages = BwdTile<d>::kStages;
  extern __shared__ unsigned char smem[];
  const S11c::Shared<d, Elem> sm(smem);
  const BlockWork work = block_work<B_c, B_r, kCausal>(p);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers(256);  // the 256 consumer threads release each buffer
  __syncthreads();  // barriers initialised before anyone waits on them

  if (warpgroup == 0) {  // ---- producer ----
    setmaxnreg_dec<S11c::kProducerRegisters>();
    if (threadIdx.x == 0) S11c::produce(sm, p, work);
    return;
  }
  // ---- consumer c: keys [64c, 64c + 64) of the tile ----
  setmaxnreg_inc<S11c::kConsumerRegisters>();
  const int c = warpgroup - 1, key0 = work.key0 + 64 * c;
  const Elem* k_rows = sm.k + 64 * c * 64;  // this warpgroup's rows of column block 0 (for Sᵀ)
  const Elem* v_rows = sm.v + 64 * c * 64;
  // This warpgroup's [64, 64] block of dQ_i: column block c at d = 128, row block c at d = 64.
  const int dq_rows = d == 64 ? c : 0, dq_cols = d == 64 ? 0 : c;

  float dv[d / 2] = {}, dk[d / 2] = {};  // dV_c, dK_c: [64 keys, d]
  mbarrier_wait(sm.kv_full, 0);
  for (int n = 0; n < work.steps; ++n) {
    const int s = n % kStages, bh = work.bh(n), i = work.tile(n), query0 = i * B_r;
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

    store_ds<B_c, B_r>(dpt, ds, 64 * c);
    fence_proxy_async_smem();  // the generic stores of dSᵀ, before wgmma reads them
    named_barrier_sync(S11c::kConsumersBarrier, 256);  // both halves of dSᵀ are in shared memory
    float dq[32];  // this warpgroup's [64, 64] block of dQ_i from this key tile
    wgmma_fence();
    gemm_dq<B_c, 64>(dq, ds, dq_rows, sm.k, dq_cols);
    wgmma_commit();
    wgmma_fence();
    gemm_pv<d, B_r>(dv, p_frag, sm.do_stage(s));
    gemm_pv<d, B_r>(dk, ds_frag, sm.q_stage(s));
    wgmma_commit();
    wgmma_wait<1>();  // dQ is done; dV and dK may still run
    fence_registers(dq);
    add_dq<64>(dq, p.dQ_accum + (int64_t(bh) * p.n_q_pad + query0 + 64 * dq_rows) * d + 64 * dq_cols, d);
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

StepKernel step_11c(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128>("11_hopper_bwd", "11c", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    return make_step_kernel(causal, bwd_11c<D, Elem, true>, bwd_11c<D, Elem, false>, Threads{S11c::kThreads},
                            BlockRows{BwdTile<D>::kBlockM}, BlockCols{BwdTile<D>::kBlockN},
                            SmemBytes{S11c::Shared<D, Elem>::Plan::bytes_to_allocate});
  });
}

}  // namespace fa::stage11
