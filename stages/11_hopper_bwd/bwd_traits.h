/// \file bwd_traits.h
/// \brief Stage 11's tile sizes per head dim and what every kernel receives (tensor maps,
/// scratch pointers, sizes). Plain C++: the host side and the kernels include it.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fa::stage11 {

/// Tiles of steps 11b–11d (11a: 64 × 64) at head dim d. A block owns B_c keys and streams
/// the query tiles past them B_r rows at a time.
/// - d = 64 and 128: B_c = 128 keys, 64 per consumer warpgroup. B_r is chosen so that each
///   warpgroup's dQ share is one [64, 64] block: at d = 128 the two warpgroups split dQ_i
///   [64, 128] by columns, at d = 64 they split dQ_i [128, 64] by rows. Shared memory: K_j,
///   V_j (2 × B_c·d·2 bytes), Q_i and dO_i in 2 stages, dSᵀ double-buffered: 160 KB at both
///   head dims, and 32 KB of dQ staging in step 11d (two [64, 64] fp32 blocks).
/// - d = 256 (step 11d only, hopper_bwd_256.cu): one warpgroup cannot hold dK and dV of 64
///   keys (2 × 128 fp32 registers per thread), so the two consumers split their *columns*:
///   B_c = 64 keys, each warpgroup owns dK_j, dV_j [64, 128]. B_r = 64, one Q_i/dO_i stage:
///   K_j, V_j, Q_i, dO_i 4 × 32 KB, Pᵀ and dSᵀ double-buffered 32 KB, dQ staging 64 KB
///   (four [64, 64] blocks, two per consumer): 224 KB of the 227.
template <int d>
struct BwdTile {
  static_assert(d == 64 || d == 128 || d == 256, "stage 11 is built for d = 64, 128 and 256");
  static constexpr int kHeadDim = d;
  static constexpr int kBlockN = d == 256 ? 64 : 128;  // B_c
  static constexpr int kBlockM = d == 64 ? 128 : 64;   // B_r
  static constexpr int kStages = d == 256 ? 1 : 2;     // Q_i/dO_i buffers
  static constexpr int kConsumers = 2;
  static constexpr int kDqBlocksPerConsumer = d == 256 ? 2 : 1;  // [64, 64] blocks of dQ_i
  static_assert((d / 64) * (kBlockM / 64) == kConsumers * kDqBlocksPerConsumer, "dQ_i's blocks shared out");
};

/// Query rows per (batch, head) in the scratch arrays: seq_q rounded up to a multiple of
/// every B_r, so a tile's statistics are one in-bounds bulk copy and its dQ rows exist.
constexpr int kQueryPad = 128;

/// What the kernels read. Tensor maps are 3-D (d, seq, batch·heads) as in stage 10
/// (tensor_map.h), boxes of [64 rows, 64 columns] for Q and dO, [B_c, 64] for K and V.
struct BwdParams {
  CUtensorMap map_q, map_k, map_v, map_do;
  const float* L2;  ///< [batch·heads][n_q_pad]: L·log2(e); +inf where a row sees no key, and in the padding
  const float* D;   ///< [batch·heads][n_q_pad]: rowsum(dO∘O); 0 in the padding
  float* dQ_accum;  ///< [batch·heads][n_q_pad][d], fp32, zeroed; dQ/scale is added into it
  void* dQ;         ///< [batch·heads][seq_q][d], the input dtype: written by the deterministic dQ pass
  void* dK;         ///< [batch·kv_heads][seq_k][d], the input dtype
  void* dV;
  int batch, heads, kv_heads, seq_q, seq_k, n_q_pad;
  float scale;       ///< the softmax scale
  float scale_log2;  ///< scale · log2(e)
};

}  // namespace fa::stage11
