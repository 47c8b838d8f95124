/// \file traits.h
/// \brief Stage 10's tile sizes and shared-memory plan per head dim, and what every kernel
/// receives (the tensor maps and sizes).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fa::stage10 {

/// The registers a block of `threads` threads (384 or 512) holds from its launch under
/// __launch_bounds__(threads, 1): each thread gets its share of the 65 536, rounded down to a
/// multiple of 8 — 168 for 384 threads (64 512 in all), 128 for 512. setmaxnreg moves
/// registers only inside this pool of the block's (an increase waits until the pool has
/// them), so the warpgroups' counts after it must fit here, not in 65 536: 128·32 + 256·240
/// would pass the larger bound and leave the consumers waiting forever.
constexpr int launch_register_pool(int threads) { return threads * (65536 / threads / 8 * 8); }
static_assert(launch_register_pool(384) == 64512 && launch_register_pool(512) == 65536);

/// Tile sizes at head dim d. B_r = 128 query rows per block (two consumer warpgroups of
/// 64 rows; step 10a uses 64 rows and one warpgroup; from step 10d, three warpgroups and
/// 192 rows at d = 64: kConsumers), B_c keys per K/V tile, kStages K/V
/// buffers in the ring. Shared memory at d = 128: Q 32 KB + 2 × (K 32 KB + V 32 KB) = 160 KB
/// of the 227 KB a block may have. At d = 256, B_c = 80: Q 64 KB + 2 × (K 40 KB + V 40 KB) =
/// 224 KB, the most that fits (B_c = 64 left 32 KB unused and measured 4–11% slower:
/// docs/results/h200_stage10_d256_tile.md and the notes, "The tile at d = 256").
template <int d>
struct Tile {
  static_assert(d == 64 || d == 128 || d == 256, "stage 10 is built for d = 64, 128, 256");
  static constexpr int kHeadDim = d;
  static constexpr int kBlockN = d == 256 ? 80 : 128;  // B_c
  static constexpr int kStages = d == 64 ? 4 : 2;
  /// Consumer warpgroups of the final design: at d = 64 a tile's exponentials cost as much
  /// as its two products, so a third consumer (B_r = 192) keeps the tensor cores fed while
  /// two of them are in their softmax.
  static constexpr int kConsumers = d == 64 ? 3 : 2;
  static constexpr int kColumnBlocks = d / 64;  // 128-byte-wide blocks per row
};

/// What the kernels read: tensor maps for TMA (3-D: d, seq, batch·heads), the L pointer,
/// and the sizes the masks and the schedule need.
struct FwdParams {
  CUtensorMap map_q;  ///< Q [batch·heads][seq_q][d], box [64 rows][64 cols]
  CUtensorMap map_k;  ///< K [batch·kv_heads][seq_k][d], box [B_c rows][64 cols]
  CUtensorMap map_v;  ///< V, like K
  void* O;            ///< [batch·heads][seq_q][d], the input dtype (16-byte stores)
  float* L;           ///< [batch][heads][seq_q], fp32
  int batch, heads, kv_heads, seq_q, seq_k;
  int tiles_total;  ///< query tiles × heads × batch (the persistent kernel's work list)
  int* tile_counter;      ///< the dynamic scheduler's counter (step 10f), 0 at launch; unused by 10e
  int heads_per_section;  ///< step 10f's order: heads whose K and V fit in the L2 together
  float scale_log2;  ///< scale · log2(e): e^{scale·x} = 2^{scale_log2·x}
  float scale;
};

/// Rows per TMA box of Q and O (one warpgroup's rows).
constexpr int kRowsPerWarpgroup = 64;

/// Bytes of a [rows, d] tile of 16-bit elements.
constexpr uint32_t tile_bytes(int rows, int d) { return uint32_t(rows) * uint32_t(d) * 2u; }

}  // namespace fa::stage10
