// Stage 08: masks applied to score fragments in registers.
//
// A masked score is set to −inf, so that e^{s − m} = 0 and it adds nothing to l or O.
// Which tiles need a mask at all is decided per tile (kv_tile_range in tile_index.h):
// off-band tiles skip this code entirely; only on-band tiles (the diagonal of the causal
// band) and the ragged last tile of the keys pay for the comparisons here.
//
// A thread's scores in a warp's [16·kMTiles, 8·kNTiles] block S (C-fragment layout,
// mma.cuh) sit at
//     row = 16·mi + g + 8·h,  column = 8·nt + 2t + e      (h, e ∈ {0, 1})
// in register S[mi][nt][2h + e], with g = lane / 4 and t = lane % 4.
// Reusable as is: stage 09 masks its transposed score tiles with mask_fragments.
#pragma once

#include <cstdint>

#include "sm80/tile_index.h"

namespace fa::stage08 {

/// Columns [begin, end) of one row that stay visible; everything else is masked.
struct ColumnRange {
  int begin, end;
};

/// Sets S to −inf outside the visible columns of each row. `visible(r)` gives the
/// ColumnRange of warp-local row r ∈ [0, 16·kMTiles), in warp-local columns.
template <int kMTiles, int kNTiles, class Visible>
__device__ __forceinline__ void mask_fragments(float (&S)[kMTiles][kNTiles][4], int lane, Visible visible) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const ColumnRange range = visible(16 * mi + g + 8 * h);
      // Column 8·nt + 2t + e is visible iff begin ≤ it < end; subtracting this lane's 2t
      // once leaves a comparison of a register with a constant per score.
      const int begin = range.begin - 2 * t, end = range.end - 2 * t;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * nt + e;  // minus 2t
          if (col < begin || col >= end) S[mi][nt][2 * h + e] = -INFINITY;
        }
      }
    }
  }
}

/// The forward's mask for one on-band tile: query row q_row0 + r sees keys
/// [0, visible_key_end(q_row0 + r)) (bottom-right causal, or all seq_k keys), and the
/// tile holds keys [key0, key0 + 8·kNTiles). Covers the causal diagonal and the ragged
/// end of the keys at once.
//! [mask]
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_causal_and_tail(float (&S)[kMTiles][kNTiles][4], int lane, int64_t q_row0,
                                                     int key0, int seq_q, int seq_k, bool causal) {
  mask_fragments(S, lane, [&](int r) {
    // Keys this row sees (≤ seq_k, so an int), relative to the tile's first key. Values
    // outside [0, 8·kNTiles] mask everything or nothing, as they should.
    return ColumnRange{0, int(visible_key_end(q_row0 + r, seq_q, seq_k, causal)) - key0};
  });
}
//! [mask]

}  // namespace fa::stage08
