// Stage 13 on Hopper — the backward under masks and score modifiers, on stage 11's final
// design (step 11d): one block per (key tile of B_c = 128 keys, kv head, batch), a producer
// warp streaming the query tiles Q_i, dO_i (TMA) and their statistics L2_i, D_i (bulk copies)
// past the block's K_j, V_j, a writer warp adding dQ, and two consumer warpgroups of 64 keys
// each computing Sᵀ and dPᵀ by wgmma, Pᵀ and dSᵀ on register fragments for dV and dK, and
// dQ_i = dS·K_j from dSᵀ in shared memory.
//
// What changed from stage 11, and why:
//  - the mask. Key tiles are counted per document, blocks start in BwdBlockOrder, and a block
//    visits DocumentMask::query_tile_range: the query tiles whose classify() of its key tile
//    (the forward's own question) is not Skip. A step is unmasked when classify says Full
//    and the query tile ends inside the document; else P = 0 where the element test
//    (DocumentMask::element_test, one comparison per element) says no.
//  - the score. With s the raw product and x = scale·s, the forward's logit is
//      x' = cap·tanh(x/cap) (soft-cap),   x' += slope·(key − diag(row)) (ALiBi)
//    so P = e^{x' − L} and dx = dx'·f'(x), f' = 1 − tanh²(x/cap) under soft-cap, 1 else:
//      dS = P∘(dP − D)∘f'     (the gradient with respect to x; dK, dQ take the scale as in stage 11)
//    The score is a template argument (BwdScore). Plain: P is stage 11's, its exponentials
//    computed while dPᵀ is still in the tensor cores. ALiBi alone: f' = 1, so dS is the
//    plain one and only P changes; the bias slope·(key − diag) joins the exponent, and P is
//    made under dPᵀ as in the plain kernel. Capped (soft-cap, with or without ALiBi): cap
//    and slope are run-time values (a slope of 0 without ALiBi), and P and dS are made
//    together after both products, f'(x) being known only while P is. Three kernels per head
//    dim and dtype.
//  - sinks. L already holds the sink (the forward's epilogue), so P is right as it stands;
//    dσ_h = −Σ_rows e^{σ_h − L_i}·D_i is summed by the preprocess kernel, which has D_i.
//  - the scratch (L2, D, dQ_accum) is padded per document (kDocumentPad rows), so a query
//    tile of a document is one aligned run: the statistics arrive by bulk copies, and a
//    consumer's [64, 64] block of dQ_i is one 16 KB run of dQ_accum in 11d's blocked layout
//    (hopper/dq_layout.h), which the writer adds with one bulk reduction as in 11d
//    (hopper/dq_staging.cuh, shared with stage 11).
//
//   (launched programmatically after the prep kernel: "wait for prep" is griddepcontrol.wait)
//   producer warp 0 (1 thread): K_j, V_j;  wait for prep;  for n in steps: wait empty;  Q_i, dO_i, L2_i, D_i → full
//   writer warp 1 (1 thread): wait for prep;  for n in steps: for c = 0, 1: wait dq_full[c];  bulk reduce-add of
//     block c into the document's rows of dQ_accum;  wait until read;  arrive dq_empty
//   consumer c (keys [64c, 64c + 64) of the tile), for n in steps:
//     wait full;  Sᵀ = K_c·Q_iᵀ, dPᵀ = V_c·dO_iᵀ (wgmma, both in flight)
//     Pᵀ, dSᵀ on fragments (score, mask, derivative);  dSᵀ → shared memory;  both consumers sync
//     dQ block = dS·K_j (wgmma);  dV += Pᵀ·dO_i, dK += dSᵀ·Q_i (wgmma, register A)
//     wait dq_empty;  dQ block → staging;  arrive dq_full[c]   ← dV, dK still running
//     release the buffer
//   epilogue: dV, scale·dK, the rows of the document only
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda_utils.h"
#include "dispatch.cuh"
#include "hopper/dq_staging.cuh"
#include "hopper/ds_tile.cuh"
#include "hopper/key_rows.cuh"
#include "hopper/tile_math.cuh"
#include "hopper/wgmma.cuh"
#include "masked_bwd_pipeline.cuh"
#include "masked_hopper_kernels.h"
#include "step_table.cuh"

namespace fa::stage13 {


using stage10::fast_exp2;
using stage10::fragment_col;
using stage10::fragment_row;
using stage10::pack2;

namespace {

constexpr float kLog2e = 1.4426950408889634f;

/// The document of packed query row `row`: the last whose first query is ≤ row (an empty
/// document shares its first query with the next, which is then chosen).
__device__ inline int document_of_row(const MaskedBwdParams& p, int row) {
  int lo = 0, hi = p.documents - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.cu_q[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/// The document whose padded rows hold padded row `row`.
__device__ inline int document_of_padded_row(const MaskedBwdParams& p, int row) {
  int lo = 0, hi = p.documents - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.pad_first[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <class Elem>
__device__ inline float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w));
  else return __half22float2(*reinterpret_cast<__half2*>(&w));
}

}  // namespace

//! [backward prep]
/// One warp per padded row of batch·heads·n_pad: D = rowsum(dO∘O) and L2 = L·log2 e of the
/// packed row it stands for (padding: D = 0, L2 = +inf, so P = 2^{x − inf} = 0 there), with
/// sinks the row's share of dσ_h = −Σ e^{σ_h − L}·D, and the row's d zeros of dQ_accum. The
/// warps cover every padded row, padding included, so all of dQ_accum starts at 0 (the main
/// kernel's [64, 64] additions reach the padding rows too, where a tile runs past its
/// document's end).
template <class Elem, int d>
__global__ void masked_prep_kernel(const MaskedBwdParams p) {
  griddepcontrol_launch_dependents();  // the main kernel's blocks may start: they wait for this grid's writes
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= int64_t(p.batch) * p.heads * p.n_pad) return;
  const int64_t bh = row / p.n_pad;
  const int padded = int(row % p.n_pad), doc = document_of_padded_row(p, padded);
  const int local = padded - p.pad_first[doc];
  // In the blocked layout (hopper/dq_layout.h) the row's d floats are d/64 runs of 64, one per
  // column block; 4 columns (16 bytes) per lane, so 16 lanes store one 256-byte run.
  float* dq_head = p.dQ_accum + bh * p.n_pad * d;  // [n_pad, d] of this (batch, head), blocked
  for (int col = 4 * lane; col < d; col += 4 * 32)
    *reinterpret_cast<float4*>(dq_head + stage11::blocked_offset(padded, col, d)) = make_float4(0.f, 0.f, 0.f, 0.f);
  float D = 0.f, L2 = INFINITY;
  if (local < p.cu_q[doc + 1] - p.cu_q[doc]) {
    const int64_t packed = bh * p.seq_q + p.cu_q[doc] + local;
    const auto* O = static_cast<const Elem*>(p.O) + packed * d;
    const auto* dO = static_cast<const Elem*>(p.dO) + packed * d;
    float sum = 0.f;
    for (int chunk = lane; chunk < d / 8; chunk += 32) {  // 8 elements (16 bytes) per lane
      const uint4 o = reinterpret_cast<const uint4*>(O)[chunk], g = reinterpret_cast<const uint4*>(dO)[chunk];
      const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 a = unpack2<Elem>(ow[k]), b = unpack2<Elem>(gw[k]);
        sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
      }
    }
#pragma unroll
    for (int step = 16; step >= 1; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
    D = sum;
    const float L = p.L[packed];
    L2 = L == -INFINITY ? INFINITY : L * kLog2e;
    if (p.sinks && lane == 0 && D != 0.f) {
      const int h = int(bh % p.heads);
      atomicAdd(&p.dsinks[h], -expf(p.sinks[h] - L) * D);
    }
  }
  if (lane == 0) {
    p.D[row] = D;
    p.L2[row] = L2;
  }
}
//! [backward prep]

/// dQ = scale·dQ_accum for every packed row (rows no block reached have 0 there): 8
/// elements per thread. dQ_accum is in [64, 64] blocks (hopper/dq_layout.h), the rows
/// counted in the padded scratch; a group of 8 columns stays contiguous there.
template <class Elem, int d>
__global__ void masked_convert_dq_kernel(const MaskedBwdParams p) {
  griddepcontrol_wait();  // dQ_accum is final: the main kernel has finished
  const int64_t total = int64_t(p.batch) * p.heads * p.seq_q * (d / 8);
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < total; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / (d / 8), bh = row / p.seq_q;
    const int i = int(row % p.seq_q), doc = document_of_row(p, i), col = 8 * int(c % (d / 8));
    const int64_t padded = p.pad_first[doc] + (i - p.cu_q[doc]);
    const float* src = p.dQ_accum + bh * p.n_pad * d + stage11::blocked_offset(padded, col, d);
    const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
    const float s = p.scale;
    const uint4 out = make_uint4(pack2<Elem>(s * a.x, s * a.y), pack2<Elem>(s * a.z, s * a.w),
                                 pack2<Elem>(s * b.x, s * b.y), pack2<Elem>(s * b.z, s * b.w));
    reinterpret_cast<uint4*>(static_cast<Elem*>(p.dQ) + row * d)[c % (d / 8)] = out;
  }
}

/// What a step's elementwise math needs besides the fragments.
struct StepScore {
  float cap, inv_cap, slope;  ///< soft-cap (> 0) and 1/cap, the head's ALiBi slope (0: off); Capped only
  float slope_log2;           ///< the head's ALiBi slope times log2 e; Alibi only
  int key0, query0;           ///< this warpgroup's first key and the tile's first query, in the document
};

/// The masked step's element test for this thread (DocumentMask::element_test): its key rows
/// key0 + fragment_row(r) against the query columns query0 + fragment_col(j, e).
__device__ inline ElementTest band_test(const DocumentMask& doc, int key0, int query0) {
  return doc.element_test(key0 + fragment_row(0), key0 + fragment_row(1), query0 + fragment_col(0, 0));
}

/// The plain score, in place, on one warpgroup's fragment of Sᵀ ([64 keys, B_r queries]:
/// element 4j + 2r + e is key fragment_row(r), query fragment_col(j, e)): Sᵀ becomes
/// Pᵀ = 2^{s·scale_log2 − L2}, and with kMasked 0 where the row does not see the key. L2 is
/// a column value here, read from the step's statistics in shared memory.
/// With kAlibi the exponent gains the bias the forward added to the logit, in log2 units
/// b·(key − diag(query)), b = slope·log2 e. Split at the warpgroup's first key key0 into a
/// row part, b·(key − key0), and a column part, b·(diag(query) − key0), the column part
/// joins L2 and the elementwise cost is one add.
template <int B_r, bool kMasked, bool kAlibi>
__device__ inline void probabilities(float (&s)[B_r / 2], const float* l2, const StepScore& sc,
                                     const DocumentMask& doc, float scale_log2) {
  float row_bias[2] = {};  // b·(key − key0) of the thread's two key rows
  ElementTest band{};
  if constexpr (kMasked) band = band_test(doc, sc.key0, sc.query0);
  if constexpr (kAlibi)
    for (int r = 0; r < 2; ++r) row_bias[r] = sc.slope_log2 * float(fragment_row(r));
#pragma unroll
  for (int j = 0; j < B_r / 8; ++j) {
    float2 l = *reinterpret_cast<const float2*>(l2 + fragment_col(j, 0));
    if constexpr (kAlibi) {
      const int first = doc.diagonal(sc.query0 + fragment_col(j, 0)) - sc.key0;  // diag(query) − key0, e = 0
      l.x = fmaf(sc.slope_log2, float(first), l.x);
      l.y = fmaf(sc.slope_log2, float(first + 1), l.y);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x_at = 4 * j + 2 * r + e;
        const float l_col = e == 0 ? l.x : l.y;
        const float prob = fast_exp2(fmaf(s[x_at], scale_log2, kAlibi ? row_bias[r] - l_col : -l_col));
        s[x_at] = kMasked && !band.sees(r, 8 * j + e) ? 0.f : prob;
      }
  }
}

/// dPᵀ becomes dSᵀ = Pᵀ∘(dPᵀ − D), D a column value (the plain score: f' = 1).
template <int B_r>
__device__ inline void ds_from_dp(const float (&p)[B_r / 2], float (&dp)[B_r / 2], const float* dd) {
#pragma unroll
  for (int j = 0; j < B_r / 8; ++j) {
    const float2 dv = *reinterpret_cast<const float2*>(dd + fragment_col(j, 0));
#pragma unroll
    for (int k = 0; k < 4; ++k) dp[4 * j + k] = p[4 * j + k] * (dp[4 * j + k] - (k % 2 == 0 ? dv.x : dv.y));
  }
}

//! [backward elementwise]
/// The capped score, in place on the fragments of Sᵀ and dPᵀ (laid out as in
/// probabilities): Sᵀ becomes Pᵀ and dPᵀ becomes dSᵀ, the gradient with respect to x = scale·s:
///   x' = f(x) = cap·tanh(x/cap) + slope·(key − diag) (slope 0: no ALiBi),
///   P = 2^{x'·log2 e − L2}, P = 0 where the row does not see the key (a masked step),
///   dS = P·(dP − D)·f'(x), f'(x) = 1 − tanh²(x/cap).
/// f'(x) is known only here, so P and dS are made together, after both products. (`masked`
/// as a template argument, as in probabilities, made two copies of this loop, and the kernel
/// spilled: 48 bytes per thread at d = 128, 152 at d = 64.)
template <int B_r>
__device__ inline void capped_probabilities_and_ds(float (&s)[B_r / 2], float (&dp)[B_r / 2], const float* l2,
                                                     const float* dd, const StepScore& sc, const DocumentMask& doc,
                                                     float scale, bool masked) {
  const ElementTest band = band_test(doc, sc.key0, sc.query0);
#pragma unroll
  for (int j = 0; j < B_r / 8; ++j) {
    const float2 l = *reinterpret_cast<const float2*>(l2 + fragment_col(j, 0));
    const float2 dv = *reinterpret_cast<const float2*>(dd + fragment_col(j, 0));
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x_at = 4 * j + 2 * r + e;
        const int key = sc.key0 + fragment_row(r), query = sc.query0 + fragment_col(j, e);
        const float t = tanhf(s[x_at] * scale * sc.inv_cap);
        const float slope_of_f = 1.f - t * t;  // f'(x)
        const float x = fmaf(sc.slope, float(key - doc.diagonal(query)), sc.cap * t);
        float prob = fast_exp2(fmaf(x, kLog2e, -(e == 0 ? l.x : l.y)));
        if (masked && !band.sees(r, 8 * j + e)) prob = 0.f;
        s[x_at] = prob;
        dp[x_at] = prob * (dp[x_at] - (e == 0 ? dv.x : dv.y)) * slope_of_f;
      }
  }
}
//! [backward elementwise]


/// The score a backward kernel is built for (the launcher picks by the modifiers).
enum class BwdScore { Plain, Alibi, Capped };

/// kScore: Plain, Alibi (P under the dPᵀ product as in the plain kernel, the bias in its
/// exponent) or Capped (soft-cap, with or without ALiBi: cap and slope run-time values,
/// uniform over the grid; P and dS after both products).
template <int d, class Elem, BwdScore kScore>
__global__ void __launch_bounds__(BwdRoles<d>::kThreads, 1) masked_bwd(const __grid_constant__ MaskedBwdParams p) {
  using R = BwdRoles<d>;
  constexpr int B_c = R::kBlockN, B_r = R::kBlockM, kStages = R::kStages;
  extern __shared__ unsigned char smem[];
  const BwdShared<d, Elem> sm(smem);
  const BwdWork work = bwd_work<d>(p);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // barriers initialised before anyone waits on them
  griddepcontrol_launch_dependents();  // the convert kernel's blocks may start: they wait for this grid

  if (warpgroup == 0) {  // ---- producer (warp 0) and dQ writer (warp 1) ----
    setmaxnreg_dec<R::kProducerRegisters>();
    if (threadIdx.x == 0) sm.produce(p, work);
    if (threadIdx.x == 32) {  // step n's blocks: query tile work.tile(n) of head work.bh(n), in the document's rows
      griddepcontrol_wait();  // the prep kernel has zeroed dQ_accum
      const int64_t doc_row0 = p.pad_first[work.doc];
      stage11::write_dq<d>(sm, work.steps, [&](int n) {
        return stage11::DqTile{p.dQ_accum + int64_t(work.bh(n)) * p.n_pad * d, doc_row0 + work.tile(n) * B_r};
      });
    }
    return;
  }
  // ---- consumer c: keys [64c, 64c + 64) of the tile ----
  setmaxnreg_inc<R::kConsumerRegisters>();
  const int c = warpgroup - 1;
  const DocumentMask& doc = work.mask;
  const int key0 = work.j * B_c + 64 * c;   // this warpgroup's first key, in the document
  const Elem* k_rows = sm.k + 64 * c * 64;  // its rows of column block 0 (for Sᵀ)
  const Elem* v_rows = sm.v + 64 * c * 64;
  // This warpgroup's [64, 64] block of dQ_i: column block c at d = 128, row block c at d = 64.
  const int dq_rows = d == 64 ? c : 0, dq_cols = d == 64 ? 0 : c;
  StepScore sc{};
  sc.key0 = key0;
  if constexpr (kScore == BwdScore::Capped) {
    sc.cap = p.softcap;
    sc.inv_cap = 1.f / p.softcap;
  }

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
    //! [backward asks the mask]
    // Masked: a partial pair, or a query tile that runs past the document's end (its last rows
    // are the next document's queries).
    const bool masked = doc.classify(query0, B_r, work.j, B_c) != GpuTileKind::Full || query0 + B_r > doc.n_q;
    //! [backward asks the mask]
    sc.query0 = query0;
    uint32_t p_frag[B_r / 16][4], ds_frag[B_r / 16][4];  // Pᵀ and dSᵀ as A fragments
    if constexpr (kScore == BwdScore::Capped) {
      sc.slope = p.alibi_slopes ? p.alibi_slopes[work.bh(n) % p.heads] : 0.f;
      wgmma_wait<0>();
      fence_registers(st);
      fence_registers(dpt);
      capped_probabilities_and_ds<B_r>(st, dpt, sm.l2_stage(s), sm.dd_stage(s), sc, doc, p.scale, masked);
      stage10::pack_p<B_r, Elem>(st, p_frag);
    } else {
      constexpr bool kAlibi = kScore == BwdScore::Alibi;
      if constexpr (kAlibi) sc.slope_log2 = p.alibi_slopes[work.bh(n) % p.heads] * kLog2e;
      wgmma_wait<1>();  // Sᵀ is done; dPᵀ may still run
      fence_registers(st);
      if (masked)
        probabilities<B_r, true, kAlibi>(st, sm.l2_stage(s), sc, doc, p.scale_log2);
      else
        probabilities<B_r, false, kAlibi>(st, sm.l2_stage(s), sc, doc, p.scale_log2);
      stage10::pack_p<B_r, Elem>(st, p_frag);
      wgmma_wait<0>();
      fence_registers(dpt);
      ds_from_dp<B_r>(st, dpt, sm.dd_stage(s));
    }
    stage10::pack_p<B_r, Elem>(dpt, ds_frag);

    stage11::store_ds<B_c, B_r>(dpt, ds, 64 * c);
    fence_proxy_async_smem();  // the generic stores of dSᵀ, before wgmma reads them
    named_barrier_sync(R::kConsumersBarrier, 256);  // both halves of dSᵀ are in shared memory
    float dq[32];  // this warpgroup's [64, 64] block of dQ_i from this key tile
    wgmma_fence();
    stage11::gemm_dq<B_c, 64>(dq, ds, dq_rows, sm.k, dq_cols);
    wgmma_commit();
    gemm_pv<d, B_r>(dv, p_frag, sm.do_stage(s));
    gemm_pv<d, B_r>(dk, ds_frag, sm.q_stage(s));
    wgmma_commit();
    wgmma_wait<1>();  // dQ is done; dV and dK may still run
    fence_registers(dq);
    // The handover to the writer (rows past the document's end add exactly 0: their P is 0).
    mbarrier_wait(sm.dq_empty, (n & 1) ^ 1);  // the writer has read step n − 1's blocks
    stage11::stage_dq(dq, sm, c);
    fence_proxy_async_smem();  // the copy engine reads what these generic stores wrote
    mbarrier_arrive(&sm.dq_full[c]);
    wgmma_wait<0>();
    fence_registers(dv);
    fence_registers(dk);
    stage10::fence_fragments(p_frag);
    stage10::fence_fragments(ds_frag);
    mbarrier_arrive(&sm.empty[s]);  // this thread is done with buffer s
  }
  // The epilogue, staged through the Q and dO buffers: free once both consumers have finished
  // their last step (the producer has no load left to issue). Each consumer takes 2·64·d
  // elements of them, dV's rows then dK's.
  named_barrier_sync(R::kConsumersBarrier, 256);
  unsigned char* tile_v = reinterpret_cast<unsigned char*>(sm.q) + c * (2 * 64 * d * sizeof(Elem));
  unsigned char* tile_k = tile_v + 64 * d * sizeof(Elem);
  hopper::stage_key_rows<d, Elem>(dv, 1.f, tile_v);
  hopper::stage_key_rows<d, Elem>(dk, p.scale, tile_k);
  named_barrier_sync(R::kEpilogueBarrier + c, 128);  // the warpgroup's rows are in shared memory
  const int64_t first_row = int64_t(work.bkv) * p.seq_k + work.k_start + key0;
  const int valid = min(64, doc.n_k - key0);  // the next document's keys: its own block writes them
  hopper::copy_key_rows<d>(tile_v, p.dV, first_row, valid);
  hopper::copy_key_rows<d>(tile_k, p.dK, first_row, valid);
}


StepKernel masked_hopper_bwd_kernel(int d, Dtype dtype, bool softcap, bool alibi) {
  return instantiate_step<64, 128>("13_masks", "hopper backward", d, dtype, [&](auto dim, auto elem) {
    constexpr int D = decltype(dim)::value;
    using Elem = decltype(elem);
    auto* fn = softcap ? masked_bwd<D, Elem, BwdScore::Capped>
               : alibi ? masked_bwd<D, Elem, BwdScore::Alibi>
                       : masked_bwd<D, Elem, BwdScore::Plain>;
    return make_step_kernel(fn, Threads{BwdRoles<D>::kThreads}, BlockRows{BwdRoles<D>::kBlockM},
                            BlockCols{BwdRoles<D>::kBlockN}, SmemBytes{BwdPlan<D>::bytes_to_allocate});
  });
}

namespace {
template <class Fn>
void with_head_dim(int d, Fn&& fn) {
  if (d == 64) fn(std::integral_constant<int, 64>{});
  else fn(std::integral_constant<int, 128>{});
}
}  // namespace

void launch_masked_prep(const MaskedBwdParams& p, Dtype dtype, int d, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.heads * p.n_pad, rows_per_block = 8;
  with_dtype(dtype, [&](auto elem) {
    with_head_dim(d, [&](auto dim) {
      masked_prep_kernel<decltype(elem), decltype(dim)::value>
          <<<unsigned((rows + rows_per_block - 1) / rows_per_block), 256, 0, stream>>>(p);
    });
  });
  FA_CHECK_LAUNCH("13_masks: masked_prep_kernel");
}

void launch_masked_convert_dq(const MaskedBwdParams& p, Dtype dtype, int d, cudaStream_t stream) {
  const int64_t chunks = int64_t(p.batch) * p.heads * p.seq_q * (d / 8);
  const unsigned blocks = unsigned(std::min<int64_t>((chunks + 255) / 256, 132 * 32));
  MaskedBwdParams params = p;
  void* args[] = {&params};
  with_dtype(dtype, [&](auto elem) {
    with_head_dim(d, [&](auto dim) {
      const void* fn = reinterpret_cast<const void*>(masked_convert_dq_kernel<decltype(elem), decltype(dim)::value>);
      launch_kernel(fn, dim3(blocks), dim3(256), 0, args, stream, StreamOrder::Programmatic);
    });
  });
  FA_CHECK_LAUNCH("13_masks: masked_convert_dq_kernel");
}

}  // namespace fa::stage13
