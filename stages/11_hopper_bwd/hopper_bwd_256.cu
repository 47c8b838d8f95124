// Stage 11, step 11d at d = 256 — the final design with the columns shared out.
//
// Why d = 256 needs its own kernel: at d = 64 and 128 each consumer warpgroup owns 64 keys
// and keeps their dK_j and dV_j, [64, d] each, in registers: d/2 + d/2 fp32 registers per
// thread, 128 at d = 128. At d = 256 that is 256 registers, more than a thread may have
// (255, and 240 after setmaxnreg leaves the producer its 24). So here the block owns
// B_c = 64 keys and the two consumers split the *columns* of dK_j and dV_j instead: consumer
// c keeps columns [128c, 128c + 128) of both, 64 + 64 registers.
//
// The price is that both consumers need all of Pᵀ and dSᵀ [64 keys, 64 queries] as the A
// operand of dV += Pᵀ·dO and dK += dSᵀ·Q. Each computes half of them — Sᵀ and dPᵀ for
// queries [32c, 32c + 32) (m64n32 products over the full d) — writes its half of Pᵀ and dSᵀ
// to shared memory, and after a barrier of the two reads both halves from there: all three
// later products take A from shared memory (wgmma_ss_nt: A K-major, B = dO or Q MN-major),
// not from registers as at d ≤ 128. dQ_i [64, 256] = dS·K_j is split by columns as well:
// consumer c computes [64, 128] and hands it to the writer warp as two [64, 64] blocks, which
// the copy engine adds to dQ_accum as in hopper_bwd.cu.
//
// Shared memory (224 KB of 227): K_j, V_j, Q_i, dO_i 32 KB each — one stage of Q_i/dO_i, so
// the producer loads the next query tile while the consumers run the dQ product (they release
// the buffer as soon as dV and dK, its last readers, are done); Pᵀ and dSᵀ double-buffered
// (4 × 8 KB), so a consumer may write step n's halves while the other still reads step
// n − 1's; dQ staging 64 KB.
//
//   producer warp 0 (1 thread), writer warp 1 (1 thread): as 11d
//   consumer c, for each query tile i (step n):
//     wait full;  Sᵀ, dPᵀ [64 keys, queries 32c … 32c + 31] = K_j·Q_iᵀ, V_j·dO_iᵀ
//     Pᵀ, dSᵀ of those queries → shared memory (buffer n % 2);  barrier of both consumers
//     dV[:, c] += Pᵀ·dO_i[:, c];  dK[:, c] += dSᵀ·Q_i[:, c]   ─┐ one group
//     dQ_i[:, c] = dS·K_j[:, c]                                ─┘ the next group
//     wait for dV, dK:  release the Q_i/dO_i buffer
//     wait for dQ:  wait dq_empty;  dQ → staging;  arrive dq_full[c]
//
// Run: ./build/stages/11_hopper_bwd/stage11 --dtype bf16 --head-dim 256 --seq-q 4096 --seq-k 4096 --backward --bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bwd_math.cuh"
#include "bwd_pipeline.cuh"
#include "hopper/dq_layout.h"
#include "hopper/wgmma.cuh"
#include "hopper_bwd_steps.h"
#include "step_table.cuh"

namespace fa::stage11 {

namespace {

using Tile256 = BwdTile<256>;
constexpr int kD = 256, kBc = Tile256::kBlockN, kBr = Tile256::kBlockM;
constexpr int kHalf = kBr / 2;       // queries of Sᵀ, dPᵀ per consumer
constexpr int kCols = kD / 2;        // columns of dK, dV, dQ per consumer
constexpr int kBlock = 64 * 64;      // floats in a [64, 64] dQ block

/// Pᵀ and dSᵀ of step n in buffers 2·(n % 2) and 2·(n % 2) + 1.
template <class Elem>
using Shared256 = BwdShared<kD, kBc, kBr, Tile256::kStages, 4, Elem, true>;

/// acc [64, N] += A · B: A [64, 64] K-major in shared memory (Pᵀ or dSᵀ: keys × queries, the
/// queries contiguous), B the [64 query rows, N] columns of a Q_i or dO_i tile starting at
/// column block `b_block`, MN-major (the columns contiguous): the instruction transposes B.
template <int N, class Elem>
__device__ inline void gemm_nt(float (&acc)[N / 2], const Elem* a, const Elem* b, int b_block) {
  const auto* a_bytes = reinterpret_cast<const unsigned char*>(a);
  const auto* b_bytes = reinterpret_cast<const unsigned char*>(b) + b_block * column_block_bytes(kBr);
#pragma unroll
  for (int k = 0; k < kBr / 16; ++k) {  // 16 queries per instruction
    const uint64_t da = smem_descriptor(a_bytes + 32 * k, 16, 1024);
    const uint64_t db = smem_descriptor(b_bytes + k * 16 * 128, column_block_bytes(kBr), 1024);
    wgmma_ss_nt(WgmmaShape<N>{}, Elem{}, acc, da, db, true);
  }
}

/// A consumer's dQ share [64, 128] (fp32 fragments) → its two [64, 64] staging blocks, each
/// in the block layout of dq_layout.h: fragment column 8j + 2t of half h is column
/// 8(j − 8h) + 2t of block h.
__device__ inline void stage_dq_256(const float (&dq)[kCols / 2], float* blocks) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int e = 4 * (8 * h + j) + 2 * r;
        *reinterpret_cast<float2*>(blocks + h * kBlock + offset_in_block(fragment_row(r), fragment_col(j, 0))) =
            make_float2(dq[e], dq[e + 1]);
      }
}

/// The writer (one thread): each step's four dQ blocks (two per consumer) into dQ_accum.
template <class Shared>
__device__ inline void write_dq_256(const Shared& sm, const BwdParams& p, const BlockWork& work) {
  for (int n = 0; n < work.steps; ++n) {
    const int64_t row0 = int64_t(work.tile(n)) * kBr;
    float* head = p.dQ_accum + int64_t(work.bh(n)) * p.n_q_pad * kD;
    for (int c = 0; c < 2; ++c) {
      mbarrier_wait(&sm.dq_full[c], n & 1);
      for (int h = 0; h < 2; ++h)
        bulk_reduce_add_f32(head + blocked_offset(row0, kCols * c + 64 * h, kD), sm.staging + (2 * c + h) * kBlock,
                            kBlock * 4);
    }
    bulk_commit();
    bulk_wait_read<0>();  // all four blocks read: the consumers may refill the staging area
    mbarrier_arrive(sm.dq_empty);
  }
  bulk_wait<0>();  // every addition has reached global memory
}

/// kWithDq = false (the deterministic mode): dK_j and dV_j only; dQ comes from dq_pass.cu.
template <class Elem, bool kCausal, bool kWithDq>
__global__ void __launch_bounds__(Specialized::kThreads, 1) bwd_11d_256(const __grid_constant__ BwdParams p) {
  extern __shared__ unsigned char smem[];
  const Shared256<Elem> sm(smem);
  const BlockWork work = block_work<kBc, kBr, kCausal>(p);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers(256);  // the 256 consumer threads release the buffer
  __syncthreads();  // barriers initialised before anyone waits on them

  if (warpgroup == 0) {  // ---- producer (warp 0) and dQ writer (warp 1) ----
    setmaxnreg_dec<Specialized::kProducerRegisters>();
    if (threadIdx.x == 0) Specialized::produce(sm, p, work);
    if (kWithDq && threadIdx.x == 32) write_dq_256(sm, p, work);
    return;
  }
  // ---- consumer c: queries [32c, 32c + 32) of Sᵀ and dPᵀ; columns [128c, 128c + 128) ----
  setmaxnreg_inc<Specialized::kConsumerRegisters>();
  const int c = warpgroup - 1;

  float dv[kCols / 2] = {}, dk[kCols / 2] = {};  // dV_j, dK_j [64 keys, 128 columns]
  mbarrier_wait(sm.kv_full, 0);
  for (int n = 0; n < work.steps; ++n) {
    const int i = work.tile(n), query0 = i * kBr;
    Elem* pt = sm.ds_buffer(2 * (n % 2));
    Elem* dst = sm.ds_buffer(2 * (n % 2) + 1);
    mbarrier_wait(&sm.full[0], n & 1);

    float st[kHalf / 2], dpt[kHalf / 2];  // Sᵀ, dPᵀ: [64 keys, 32 queries]
    wgmma_fence();
    gemm_qk<kD, kHalf>(st, sm.k, kBc, sm.q_stage(0) + kHalf * c * 64, kBr);
    wgmma_commit();
    gemm_qk<kD, kHalf>(dpt, sm.v, kBc, sm.do_stage(0) + kHalf * c * 64, kBr);
    wgmma_commit();
    wgmma_wait<1>();  // Sᵀ is done; dPᵀ may still run
    fence_registers(st);
    const float* l2 = sm.l2_stage(0) + kHalf * c;
    if (i < work.tiles.first_unmasked)
      probabilities<kHalf, true, kCausal>(st, l2, work.key0, query0 + kHalf * c, p);
    else
      probabilities<kHalf, false, kCausal>(st, l2, work.key0, query0 + kHalf * c, p);
    wgmma_wait<0>();
    fence_registers(dpt);
    ds_from_dp<kHalf>(st, dpt, sm.dd_stage(0) + kHalf * c);
    store_ds<kBc, kHalf>(st, pt, 0, kHalf * c);    // this consumer's half of Pᵀ
    store_ds<kBc, kHalf>(dpt, dst, 0, kHalf * c);  // and of dSᵀ
    fence_proxy_async_smem();  // the generic stores, before wgmma reads them
    named_barrier_sync(Specialized::kConsumersBarrier, 256);  // both halves are in shared memory

    wgmma_fence();
    gemm_nt<kCols>(dv, pt, sm.do_stage(0), 2 * c);
    gemm_nt<kCols>(dk, dst, sm.q_stage(0), 2 * c);
    wgmma_commit();
    if constexpr (!kWithDq) {
      wgmma_wait<0>();
      fence_registers(dv);
      fence_registers(dk);
      mbarrier_arrive(&sm.empty[0]);
    } else {
      float dq[kCols / 2];  // dQ_i [64 queries, this consumer's 128 columns] from this key tile
      gemm_dq<kBc, kCols>(dq, dst, 0, sm.k, 2 * c);
      wgmma_commit();
      wgmma_wait<1>();  // dV and dK are done: Q_i and dO_i are no longer read
      fence_registers(dv);
      fence_registers(dk);
      mbarrier_arrive(&sm.empty[0]);  // the producer may load the next tile under the dQ product
      wgmma_wait<0>();
      fence_registers(dq);
      mbarrier_wait(sm.dq_empty, (n & 1) ^ 1);  // the writer has read step n − 1's blocks
      stage_dq_256(dq, sm.staging + 2 * c * kBlock);
      fence_proxy_async_smem();  // the copy engine reads what these generic stores wrote
      mbarrier_arrive(&sm.dq_full[c]);
    }
  }
  write_rows<kD, Elem, kCols>(dv, 1.f, p.dV, work.bkv, work.key0, p.seq_k, kCols * c);
  write_rows<kD, Elem, kCols>(dk, p.scale, p.dK, work.bkv, work.key0, p.seq_k, kCols * c);
}

}  // namespace

StepKernel step_11d_256(Dtype dtype, bool causal, bool with_dq) {
  return instantiate_step<256>("11_hopper_bwd", "11d", 256, dtype, [&](auto, auto elem) {
    using Elem = decltype(elem);
    const Threads threads{Specialized::kThreads};
    const SmemBytes smem{Shared256<Elem>::Plan::bytes_to_allocate};
    if (!with_dq)
      return make_step_kernel(causal, bwd_11d_256<Elem, true, false>, bwd_11d_256<Elem, false, false>, threads,
                              BlockRows{kBr}, BlockCols{kBc}, smem);
    return make_step_kernel(causal, bwd_11d_256<Elem, true, true>, bwd_11d_256<Elem, false, true>, threads,
                            BlockRows{kBr}, BlockCols{kBc}, smem);
  });
}

}  // namespace fa::stage11
