// Stage 11, step 11a — the backward on TMA and wgmma, one warpgroup, no specialization.
//
// What changed from stage 09, and why: stage 09 computed the backward's five products with
// mma.sync from fragments its warps loaded themselves. Here, as in stage 10, one thread
// asks the copy engine (TMA) for whole tiles, which land swizzled in shared memory on an
// mbarrier, and one warpgroup issues wgmma products that read them through descriptors.
// The loop is stage 09's: a block keeps K_j and V_j (B_c = 64 keys) and streams the query
// tiles past them, B_r = 64 rows at a time, two buffers deep. What wgmma changes is where
// each operand may live (B always in shared memory, A in registers or shared memory):
//
//   Sᵀ  = K_j · Q_iᵀ      A = K_j (smem),  B = Q_i (smem, K-major)      [B_c, B_r]
//   dPᵀ = V_j · dO_iᵀ     A = V_j (smem),  B = dO_i (smem, K-major)     [B_c, B_r]
//   dV_j += Pᵀ · dO_i     A = Pᵀ (registers), B = dO_i (smem, MN-major) [B_c, d]
//   dK_j += dSᵀ · Q_i     A = dSᵀ (registers), B = Q_i (smem, MN-major) [B_c, d]
//   dQ_i += dS · K_j      A = dSᵀ (smem, read transposed), B = K_j (smem, MN-major) [B_r, d]
//
// Computing the transposes Sᵀ and dPᵀ (keys as rows) puts Pᵀ and dSᵀ in the accumulator
// layout that is also the A-fragment layout, so dV and dK take them from registers. dQ
// needs dS with queries as rows: dSᵀ goes to shared memory once, and the fifth product
// reads it transposed. dQ_i's partial sum is added to an fp32 buffer with atomics (other
// blocks add their key tiles' terms to the same rows); a last kernel scales and converts it.
//
//   thread 0: load K_j, V_j → kv_full;  load step 0 → full[0]
//   for step n (query tile i, buffer s = n % 2):
//     block barrier (step n − 1 done: its buffer and dSᵀ are free);  thread 0: load step n + 1
//     wait full[s];  Sᵀ, dPᵀ (wgmma, wait);  Pᵀ, dSᵀ (mask on-diagonal tiles)
//     dSᵀ → shared;  dV += Pᵀ·dO_i;  dK += dSᵀ·Q_i  (wgmma)
//     block barrier;  dQ_i = dS·K_j (wgmma, wait);  red.add into dQ_accum
//   write dV_j and scale·dK_j
//
// Run: ./build/stages/11_hopper_bwd/stage11 --step 11a --dtype bf16 --head-dim 128 --seq-q 4096 --seq-k 4096 --backward --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bwd_math.cuh"
#include "bwd_pipeline.cuh"
#include "hopper/wgmma.cuh"
#include "hopper_bwd_steps.h"
#include "step_table.cuh"

namespace fa::stage11 {

namespace {
constexpr int kBlockN11a = 64, kBlockM11a = 64, kStages11a = 2;
template <int d, class Elem>
using Shared11a = BwdShared<d, kBlockN11a, kBlockM11a, kStages11a, 1, Elem>;
}  // namespace

template <int d, class Elem, bool kCausal>
__global__ void __launch_bounds__(128, 1) bwd_11a(const __grid_constant__ BwdParams p) {
  constexpr int B_c = kBlockN11a, B_r = kBlockM11a, kStages = kStages11a;
  extern __shared__ unsigned char smem[];
  const Shared11a<d, Elem> sm(smem);
  const BlockWork work = block_work<B_c, B_r, kCausal>(p);

  if (threadIdx.x == 0) {
    sm.init_barriers(128);  // empty[s] is not used here: __syncthreads orders the refills
    sm.load_kv(p, work.key0, work.bkv);
    if (work.steps > 0) sm.load_step(p, 0, work.bh(0), work.tile(0));
  }
  __syncthreads();  // barriers initialised before anyone waits on them

  float dv[d / 2] = {}, dk[d / 2] = {};  // dV_j, dK_j: [64 keys, d] over the warpgroup
  mbarrier_wait(sm.kv_full, 0);
  for (int n = 0; n < work.steps; ++n) {
    const int s = n % kStages, bh = work.bh(n), i = work.tile(n), query0 = i * B_r;
    __syncthreads();  // step n − 1 is done: its buffer may be refilled, dSᵀ rewritten
    if (threadIdx.x == 0 && n + 1 < work.steps) sm.load_step(p, (n + 1) % kStages, work.bh(n + 1), work.tile(n + 1));
    mbarrier_wait(&sm.full[s], PipelineState<kStages>::at(n).phase);

    float st[B_r / 2], dpt[B_r / 2];  // Sᵀ, dPᵀ: [64 keys, B_r queries]
    wgmma_fence();
    gemm_qk<d, B_r>(st, sm.k, B_c, sm.q_stage(s));
    gemm_qk<d, B_r>(dpt, sm.v, B_c, sm.do_stage(s));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(st);
    fence_registers(dpt);

    if (i < work.tiles.first_unmasked)
      probabilities_and_ds<B_r, true, kCausal>(st, dpt, sm.l2_stage(s), sm.dd_stage(s), work.key0, query0, p);
    else
      probabilities_and_ds<B_r, false, kCausal>(st, dpt, sm.l2_stage(s), sm.dd_stage(s), work.key0, query0, p);
    uint32_t p_frag[B_r / 16][4], ds_frag[B_r / 16][4];  // Pᵀ, dSᵀ as A fragments
    stage10::pack_p<B_r, Elem>(st, p_frag);
    stage10::pack_p<B_r, Elem>(dpt, ds_frag);
    store_ds<B_c, B_r>(dpt, sm.ds, 0);
    fence_proxy_async_smem();  // the generic stores of dSᵀ, before wgmma reads them

    wgmma_fence();
    gemm_pv<d, B_r>(dv, p_frag, sm.do_stage(s));
    gemm_pv<d, B_r>(dk, ds_frag, sm.q_stage(s));
    wgmma_commit();
    __syncthreads();  // all of dSᵀ is in shared memory
    float dq[d / 2];  // dQ_i's share from this key tile: [64 queries, d]
    gemm_dq<B_c, d>(dq, sm.ds, 0, sm.k, 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(dv);
    fence_registers(dk);
    fence_registers(dq);
    stage10::fence_fragments(p_frag);
    stage10::fence_fragments(ds_frag);
    add_dq<d>(dq, p.dQ_accum + (int64_t(bh) * p.n_q_pad + query0) * d, d);
  }
  write_rows<d, Elem>(dv, 1.f, p.dV, work.bkv, work.key0, p.seq_k);
  write_rows<d, Elem>(dk, p.scale, p.dK, work.bkv, work.key0, p.seq_k);
}

StepKernel step_11a(int d, Dtype dtype, bool causal) {
  return instantiate_step<64, 128>("11_hopper_bwd", "11a", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    return make_step_kernel(causal, bwd_11a<D, Elem, true>, bwd_11a<D, Elem, false>, Threads{128},
                            BlockRows{kBlockM11a}, BlockCols{kBlockN11a},
                            SmemBytes{Shared11a<D, Elem>::Plan::bytes_to_allocate});
  });
}

}  // namespace fa::stage11
