// Stage 09: what the backward's kernels share — the parameters, the preprocess (D and L2),
// the two element-wise steps of a dK/dV step (P from the scores, dS from dP) and the
// conversion of the fp32 dQ sums. The dK/dV kernels of the steps (09a_dq_pass.cu,
// 09b_dq_atomics.cu, tensor_core_bwd.cu) and the launcher (bwd_launch.cu) include it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "bwd_steps.h"
#include "dispatch.cuh"

#include "bwd_traits.cuh"
#include "sm80/cp_async.cuh"
#include "sm80/masking.cuh"
#include "sm80/mma.cuh"
#include "sm80/smem_tiles.cuh"
#include "sm80/softmax.cuh"

namespace fa::stage09 {

namespace {

using stage08::fast_exp2;
using stage08::load_tile_async;
using stage08::pack_pair;
using stage08::smem_offset;
using stage08::smem_row_stride;
using stage08::smem_u32;
using stage08::store_tile;

constexpr float kLog2e = 1.4426950408889634f;

/// Everything the kernels need to find their tensors.
struct BwdParams {
  const void* Q;
  const void* K;
  const void* V;
  const void* O;
  const void* dO;
  const float* L;
  void* dQ;
  void* dK;
  void* dV;
  float* L2;        // [batch][heads][n_q_pad]     L·log2(e); +inf on rows that see no key and on padding
  float* D;         // [batch][heads][n_q_pad]     rowsum(dO∘O); 0 on padding
  float* dQ_accum;  // [batch][heads][n_q_pad][d]  fp32 sums of dS K_j (steps 09b, 09c only)
  int batch, heads, kv_heads, seq_q, seq_k, n_q_pad;
  bool causal;
  float scale;       // softmax scale
  float scale_log2;  // scale·log2(e)
};

// ======================================================================================
// 1. Preprocess: D = rowsum(dO∘O) and L2 = L·log2(e)
// ======================================================================================
//
// D_i = Σ_c dO_ic·O_ic is the one number per row that dS = P∘(dP − D) needs (see the
// notes for why it equals rowsum(P∘dP)). It costs one read of O and dO, so it is done
// once here instead of once per key tile. One warp per row; the rows past seq_q (the
// padding up to n_q_pad) get D = 0 and L2 = +inf, so that the main kernels read whole
// 16-byte chunks without bounds checks and a padded row has P = 2^{−inf} = 0.

/// threadIdx.x, read anew where it is called: `asm volatile` may be neither moved out of a
/// loop nor merged with another read. Values derived from it inside the loop body are then
/// recomputed each iteration (a few integer instructions) instead of being computed once
/// before the loop and kept, which at 255 registers means spilled to local memory and
/// loaded back, with a few hundred cycles of latency, every iteration (step 09c's atomics).
__device__ __forceinline__ int fresh_thread_index() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

/// Two packed 16-bit values as floats.
template <class Elem>
__device__ __forceinline__ float2 unpack_pair(uint32_t v) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    __nv_bfloat162 h;
    std::memcpy(&h, &v, 4);
    return __bfloat1622float2(h);
  } else {
    __half2 h;
    std::memcpy(&h, &v, 4);
    return __half22float2(h);
  }
}

template <class Elem, int kHeadDim>
__global__ void preprocess_kernel(const BwdParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;  // over batch·heads·n_q_pad
  if (row >= int64_t(p.batch) * p.heads * p.n_q_pad) return;
  const int64_t head = row / p.n_q_pad;  // b·heads + h
  const int i = int(row % p.n_q_pad);    // query row
  float D = 0.0f, L2 = INFINITY;
  if (i < p.seq_q) {
    //! [preprocess D]
    const int64_t offset = (head * p.seq_q + i) * kHeadDim;
    const Elem* O = static_cast<const Elem*>(p.O) + offset;
    const Elem* dO = static_cast<const Elem*>(p.dO) + offset;
    float sum = 0.0f;
    for (int c = lane; c < kHeadDim / 8; c += 32) {  // one 16-byte chunk (8 elements) per lane
      const uint4 o = *reinterpret_cast<const uint4*>(O + 8 * c);
      const uint4 g = *reinterpret_cast<const uint4*>(dO + 8 * c);
      const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 of = unpack_pair<Elem>(ow[k]), gf = unpack_pair<Elem>(gw[k]);
        sum = fmaf(of.x, gf.x, fmaf(of.y, gf.y, sum));
      }
    }
#pragma unroll
    for (int step = 16; step >= 1; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
    D = sum;  // D_i = Σ_c dO_ic·O_ic
    //! [preprocess D]
    // L = −inf marks a row that sees no key; +inf makes its P = 2^{s − inf} = 0, not NaN.
    const float L = p.L[head * p.seq_q + i];
    L2 = L == -INFINITY ? INFINITY : L * kLog2e;
  }
  if (lane == 0) {
    p.D[row] = D;
    p.L2[row] = L2;
  }
}

// ======================================================================================
// 2. The element-wise steps of a dK/dV step, and the dQ atomics
// ======================================================================================
//
// Two element-wise steps first, on a warp's block of Sᵀ (or dPᵀ): [16·kM keys, 8·kN
// queries] in C fragments, whose first query column is `L2[0]`, `D[0]` of the step's
// row statistics. Every step's kernel calls them: in 09a and 09b the block spans all B_r
// queries of the step, in 09c the warp's kQueriesPerWarp of them.

//! [p from scores]
/// Pᵀ = 2^{Sᵀ·scale·log2(e) − L2}, in Sᵀ's registers.
template <int kM, int kN>
__device__ __forceinline__ void recompute_p(float (&St)[kM][kN][4], const float* L2, float scale_log2, int lane) {
  // LAB BEGIN: recompute P — hint: Pᵀ[key][q] = 2^{Sᵀ[key][q]·scale·log2(e) − L2[q]}, where this thread's column of register r of n8 tile nt is q = 8nt + 2t + r % 2 (t = lane % 4)
  // P_ij = e^{scale·S_ij − L_i} = 2^{S_ij·scale·log2(e) − L2_i}: normalised already,
  // because L_i is the log of row i's softmax denominator. One FFMA and one ex2 per
  // score. A masked score (−inf) gives 0; L2 is never −inf (preprocess), so never NaN.
  const int t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
    const float2 l2 = *reinterpret_cast<const float2*>(L2 + 8 * nt + 2 * t);  // columns 2t, 2t+1
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int r = 0; r < 4; ++r) St[mi][nt][r] = fast_exp2(fmaf(St[mi][nt][r], scale_log2, -(r % 2 ? l2.y : l2.x)));
  }
  // LAB END
}

/// dSᵀ = Pᵀ∘(dPᵀ − D), in dPᵀ's registers (dPᵀ is dead once dS exists).
template <int kM, int kN>
__device__ __forceinline__ void ds_from_dp(float (&dPt)[kM][kN][4], const float (&Pt)[kM][kN][4], const float* D,
                                           int lane) {
  // LAB BEGIN: dS — hint: dSᵀ[key][q] = Pᵀ[key][q]·(dPᵀ[key][q] − D[q]), in place of dPᵀ; columns as in "recompute P"
  // dS_ij = P_ij·(dP_ij − D_i), D_i = rowsum(dO∘O)_i (the preprocess).
  const int t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
    const float2 Dq = *reinterpret_cast<const float2*>(D + 8 * nt + 2 * t);  // columns 2t, 2t+1
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int r = 0; r < 4; ++r) dPt[mi][nt][r] = Pt[mi][nt][r] * (dPt[mi][nt][r] - (r % 2 ? Dq.y : Dq.x));
  }
  // LAB END
}
//! [p from scores]

//! [dQ atomics]
/// dQ_accum += this block's part of dQ_i, the C fragments dQ_acc of the warp grid
/// Tr::kWarpsMdQ × Tr::kWarpsNdQ over [B_r, d]; `tid_a` is the thread's index (see the
/// kernels for where it is read).
template <class Tr, int kMq, int kNq>
__device__ __forceinline__ void add_dq_atomics(const BwdParams& p, const float (&dQ_acc)[kMq][kNq][4], int tid_a,
                                               int batch, int head, int64_t q0) {
  constexpr int d = Tr::kHeadDim;
  // LAB BEGIN: dQ atomics — hint: thread (g, t) adds its pairs (row g or 8+g, columns 2t, 2t+1) of each m16n8 piece to dQ_accum with atomicAdd, rows < seq_q only
  // Add this block's part to dQ_accum (fp32, zeroed before the kernel). Many blocks
  // (every key tile j of the kv head) add to the same rows, in no fixed order.
  // The thread's first element (row wm·kRowsDq + g, column wn·kColsDq + 2t) of this
  // step's dQ_accum tile; every other element it adds to is a compile-time offset from
  // it, (16·mi + 8·h)·d + 8·nt, which the atomics take as an immediate.
  const int warp_a = tid_a / 32;
  const int row0 = warp_a / Tr::kWarpsNdQ * Tr::kRowsDq + (tid_a % 32) / 4;
  const int col0 = warp_a % Tr::kWarpsNdQ * Tr::kColsDq + 2 * (tid_a % 4);
  float* dQ_thread = p.dQ_accum + ((int64_t(batch) * p.heads + head) * p.n_q_pad + q0 + row0) * d + col0;
  const int64_t rows_left = p.seq_q - (q0 + row0);  // rows row0 + r with r < rows_left exist
#pragma unroll
  for (int mi = 0; mi < kMq; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * mi + 8 * h;  // the row, counted from row0
      if (r >= rows_left) continue;   // padding rows: their dS is 0; skip the traffic
#pragma unroll
      for (int nt = 0; nt < kNq; ++nt) {
        float* dst = dQ_thread + r * d + 8 * nt;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(dst), make_float2(dQ_acc[mi][nt][2 * h], dQ_acc[mi][nt][2 * h + 1]));
#else
        atomicAdd(dst, dQ_acc[mi][nt][2 * h]);
        atomicAdd(dst + 1, dQ_acc[mi][nt][2 * h + 1]);
#endif
      }
    }
  // LAB END
}
//! [dQ atomics]

// ======================================================================================
// 3. The atomics' last step (09b, 09c): dQ = scale·dQ_accum in the input type
// ======================================================================================

template <class Elem, int kHeadDim>
__global__ void convert_dq_kernel(const BwdParams p) {
  constexpr int kChunks = kHeadDim / 8;  // 8 elements per thread: two float4 in, 16 bytes out
  const int64_t total = int64_t(p.batch) * p.heads * p.seq_q * kChunks;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < total; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / kChunks;  // (b·heads + h)·seq_q + i
    const int64_t head = row / p.seq_q, i = row % p.seq_q;
    const float* src = p.dQ_accum + (head * p.n_q_pad + i) * kHeadDim + 8 * (c % kChunks);
    const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
    const uint4 out = make_uint4(pack_pair<Elem>(p.scale * a.x, p.scale * a.y), pack_pair<Elem>(p.scale * a.z, p.scale * a.w),
                                 pack_pair<Elem>(p.scale * b.x, p.scale * b.y), pack_pair<Elem>(p.scale * b.z, p.scale * b.w));
    *reinterpret_cast<uint4*>(static_cast<Elem*>(p.dQ) + row * kHeadDim + 8 * (c % kChunks)) = out;
  }
}

// ======================================================================================
// The table a step file fills: its kernels for the head dim and dtype asked for
// ======================================================================================

/// Calls make(Elem{}, TypeTag<DefaultTiles<d>>{}) for d ∈ {64, 128} and Elem ∈ {bf16, f16}.
template <class Make>
StepKernels make_step(int d, Dtype dtype, Make&& make) {
  const auto by_head_dim = [&](auto elem) -> StepKernels {
    if (d == 64) return make(elem, TypeTag<DefaultTiles<64>>{});
    if (d == 128) return make(elem, TypeTag<DefaultTiles<128>>{});
    throw std::invalid_argument("09_tensor_core_bwd: no kernel for head_dim = " + std::to_string(d));
  };
  if (dtype == Dtype::BF16) return by_head_dim(__nv_bfloat16{});
  if (dtype == Dtype::F16) return by_head_dim(__half{});
  throw std::invalid_argument("09_tensor_core_bwd: no kernel for dtype " + std::string(dtype_name(dtype)));
}

/// A step's table row: its dK/dV kernel (tiles DkDv), whether it adds dQ by atomics, and
/// its dQ kernel (tiles Dq) where it has one.
template <class DkDv, class Dq, class F, class G = void(const BwdParams)>
StepKernels step_kernels(F* dkdv, bool atomic_dq, G* dq = nullptr) {
  StepKernels k;
  k.dkdv = make_step_kernel(dkdv, Threads{DkDv::kThreads}, BlockRows{DkDv::kBlockM}, BlockCols{DkDv::kBlockN},
                            SmemBytes{size_t(DkDv::kSmemBytes)});
  k.warps_keys = DkDv::kWarpsKeys;
  k.warps_split = DkDv::kWarpsSplit;
  k.warps_mdq = DkDv::kWarpsMdQ;
  k.warps_ndq = DkDv::kWarpsNdQ;
  k.atomic_dq = atomic_dq;
  if (dq != nullptr)
    k.dq = make_step_kernel(dq, Threads{Dq::kThreads}, BlockRows{Dq::kBlockM}, BlockCols{Dq::kBlockN},
                            SmemBytes{size_t(Dq::kSmemBytes)});
  return k;
}

}  // namespace
}  // namespace fa::stage09
