// Stage 11's two small kernels around the main one, as in stage 09:
//   preprocess:  D = rowsum(dO∘O) and L2 = L·log2(e) per query row, into padded scratch
//   convert:     dQ = scale·dQ_accum, rounded to the input type
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bwd_traits.h"
#include "cuda_utils.h"
#include "dispatch.cuh"
#include "hopper/dq_layout.h"
#include "hopper/tile_math.cuh"
#include "prep.h"

namespace fa::stage11 {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

template <class Elem>
__device__ inline float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w));
  else return __half22float2(*reinterpret_cast<__half2*>(&w));
}

/// d/8 threads per row of batch·heads·n_q_pad, each with 8 elements (16 bytes) of O and of
/// dO: every lane of a warp loads, and a warp has 32·16 bytes of each in flight, where one
/// warp per row left half of the lanes idle at d = 128 (and measured 47% of the DRAM rate).
/// Rows past seq_q (the padding) get D = 0 and L2 = +inf, so a tile that reaches into them
/// computes P = 0 there. With a dQ_accum (the atomic mode), the same threads also zero the
/// row's d floats of it, padding included: the accumulator is written once, here, instead of
/// by a memset of its own before this kernel.
template <class Elem, int d, bool kBlocked>
__global__ void preprocess_kernel(const PrepParams p) {
  constexpr int kThreadsPerRow = d / 8;  // 8, 16 or 32: a row is a group of lanes of one warp
  const int lane = threadIdx.x % kThreadsPerRow;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kThreadsPerRow;
  // n_q_pad is a multiple of 128, so a warp's rows are all in range or all past the end: the
  // early return leaves no warp partly empty, and the shuffles below run on every lane.
  if (row >= int64_t(p.heads_total) * p.n_q_pad) return;
  const int64_t head = row / p.n_q_pad;
  const int i = int(row % p.n_q_pad);
  const bool in_sequence = i < p.seq_q;  // may differ between the rows of one warp
  float sum = 0.f;
  if (in_sequence) {
    const int64_t offset = (head * p.seq_q + i) * d;
    const uint4 o = reinterpret_cast<const uint4*>(static_cast<const Elem*>(p.O) + offset)[lane];
    const uint4 g = reinterpret_cast<const uint4*>(static_cast<const Elem*>(p.dO) + offset)[lane];
    const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = unpack2<Elem>(ow[k]), b = unpack2<Elem>(gw[k]);
      sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
    }
  }
  // The sum over the row's group of lanes (xor by less than the group size stays inside it).
#pragma unroll
  for (int step = kThreadsPerRow / 2; step >= 1; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
  float D = 0.f, L2 = INFINITY;
  if (in_sequence) {
    D = sum;
    // L = −inf marks a row that sees no key; +inf makes its P = 2^{s − inf} = 0, not NaN.
    const float L = p.L[head * p.seq_q + i];
    L2 = L == -INFINITY ? INFINITY : L * kLog2e;
  }
  if (p.dQ_accum != nullptr) {  // this thread's 8 columns of the row, zeroed
    const int col = 8 * lane;
    float* at = p.dQ_accum + head * p.n_q_pad * d + (kBlocked ? blocked_offset(i, col, d) : int64_t(i) * d + col);
    reinterpret_cast<float4*>(at)[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    reinterpret_cast<float4*>(at)[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (lane == 0) {
    p.D[row] = D;
    p.L2[row] = L2;
  }
}

/// dQ = scale·dQ_accum: 8 elements per thread (two float4 in, 16 bytes out). In the blocked
/// layout a group of 8 columns stays contiguous (the swizzle moves whole groups).
template <class Elem, int d, bool kBlocked>
__global__ void convert_dq_kernel(const PrepParams p) {
  const int64_t total = int64_t(p.heads_total) * p.seq_q * (d / 8);
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < total; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / (d / 8), head = row / p.seq_q, i = row % p.seq_q;
    const int col = 8 * int(c % (d / 8));
    const float* src = p.dQ_accum + head * p.n_q_pad * d + (kBlocked ? blocked_offset(i, col, d) : i * d + col);
    const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
    const float s = p.scale;
    const uint4 out = make_uint4(stage10::pack2<Elem>(s * a.x, s * a.y), stage10::pack2<Elem>(s * a.z, s * a.w),
                                 stage10::pack2<Elem>(s * b.x, s * b.y), stage10::pack2<Elem>(s * b.z, s * b.w));
    reinterpret_cast<uint4*>(static_cast<Elem*>(p.dQ) + row * d)[c % (d / 8)] = out;
  }
}

template <class Fn>
void with_head_dim(int d, Fn&& fn) {
  if (d == 64) fn(std::integral_constant<int, 64>{});
  else if (d == 128) fn(std::integral_constant<int, 128>{});
  else fn(std::integral_constant<int, 256>{});
}

}  // namespace

void launch_preprocess(const PrepParams& p, Dtype dtype, int d, cudaStream_t stream) {
  const int64_t rows = int64_t(p.heads_total) * p.n_q_pad, rows_per_block = 256 / (d / 8);
  const unsigned blocks = unsigned((rows + rows_per_block - 1) / rows_per_block);
  with_dtype(dtype, [&](auto elem) {
    with_head_dim(d, [&](auto dim) {
      if (p.blocked_dq)
        preprocess_kernel<decltype(elem), decltype(dim)::value, true><<<blocks, 256, 0, stream>>>(p);
      else
        preprocess_kernel<decltype(elem), decltype(dim)::value, false><<<blocks, 256, 0, stream>>>(p);
    });
  });
  FA_CHECK_LAUNCH("11_hopper_bwd: preprocess_kernel");
}

void launch_convert_dq(const PrepParams& p, Dtype dtype, int d, cudaStream_t stream) {
  const int64_t chunks = int64_t(p.heads_total) * p.seq_q * (d / 8);
  const unsigned blocks = unsigned(std::min<int64_t>((chunks + 255) / 256, 132 * 32));
  with_dtype(dtype, [&](auto elem) {
    with_head_dim(d, [&](auto dim) {
      if (p.blocked_dq)
        convert_dq_kernel<decltype(elem), decltype(dim)::value, true><<<blocks, 256, 0, stream>>>(p);
      else
        convert_dq_kernel<decltype(elem), decltype(dim)::value, false><<<blocks, 256, 0, stream>>>(p);
    });
  });
  FA_CHECK_LAUNCH("11_hopper_bwd: convert_dq_kernel");
}

}  // namespace fa::stage11
