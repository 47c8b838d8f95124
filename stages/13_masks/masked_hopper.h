/// \file masked_hopper.h
/// \brief Stage 13 on Hopper: the forward under a block mask and score modifiers (sliding
/// window, documents, ALiBi, soft-cap, sinks) on stage 10's warp-specialized persistent
/// kernel, and its backward on stage 11's design. Plain C++: the tests and the benchmark
/// include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "modifiers.h"
#include "problem.h"

namespace fa::stage13 {

/// Head dims with kernels.
inline const std::vector<int> kHopperHeadDims{64, 128};

/// O and L under the modifiers `m` on device buffers in `dtype` (BF16 or F16; L fp32), with
/// the definitions of modifiers.h. Layouts of docs/design.md §3; documents are packed along
/// the sequence (batch 1, m.cu_seqlens_q / m.cu_seqlens_k). Pointers 16-byte aligned.
/// Asynchronous on `stream`. Every row of O and L is written, rows past the last document
/// too (O = 0, L = σ_h or −inf). Throws std::invalid_argument for a problem, modifier,
/// dtype, head dim or pointer it refuses — naming the value, before anything is launched or
/// written — and std::runtime_error on a GPU that is not compute capability 9.x.
void forward_hopper(const Problem& p, const Modifiers& m, Dtype dtype, const void* Q, const void* K, const void* V,
                    void* O, float* L, cudaStream_t stream);

/// dQ, dK, dV (in `dtype`) and, with sinks, dsinks ([heads] fp32) of the forward_hopper
/// attention under `m`, for the loss whose gradient with respect to O is dO; O and L are the
/// forward's. Same layouts, limits and documents as forward_hopper; for GQA dK and dV of a kv
/// head sum its query heads, and dsinks sums the batch. Every element of dQ, dK, dV is
/// written (0 where nothing is seen). dsinks is required with sinks and ignored without.
/// Asynchronous on `stream`. Throws std::invalid_argument for what it refuses (before
/// anything is launched or written), std::runtime_error on a GPU that is not 9.x.
void backward_hopper(const Problem& p, const Modifiers& m, Dtype dtype, const void* Q, const void* K, const void* V,
                     const void* O, const float* L, const void* dO, void* dQ, void* dK, void* dV, float* dsinks,
                     cudaStream_t stream);

/// The key tiles the kernel visits for `p` under `m` (all heads), computed on the host with
/// the kernel's own document mask: per work tile (B_r query rows of one document) and key tile
/// of that document, `skip` counts those never loaded, `full` and `partial` those the block's
/// rows see whole or in part (a consumer warpgroup masks a tile that is partial for its own 64
/// rows). No GPU needed.
struct HopperTileCounts {
  int64_t skip = 0, full = 0, partial = 0;
};
HopperTileCounts count_hopper_tiles(const Problem& p, const Modifiers& m);

}  // namespace fa::stage13
