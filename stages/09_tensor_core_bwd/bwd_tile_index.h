/// \file bwd_tile_index.h
/// \brief Stage 09: which query tiles a key tile visits, and which of them need a mask.
///
/// The backward's dK/dV kernel turns stage 08's loop around: a thread block holds one key
/// tile and walks the query tiles. So the question "which key tiles does this query tile
/// see?" (stage 08, kv_tile_range) becomes "which query tiles see this key tile?". It is
/// plain C++ with no CUDA syntax, so tests/test_stage09.cpp checks it exhaustively on a
/// machine without a GPU, against Problem::visible_keys.
#pragma once

#include <cstdint>

#include "sm80/tile_index.h"  // the sm80 layer: FA_HOST_DEVICE, visible_key_end

namespace fa::stage09 {

/// The first query row that sees key `key` under the bottom-right causal mask (docs/design.md §3):
/// row i sees keys [0, i + seq_k − seq_q + 1), so key k is seen by the rows
/// i ≥ k + seq_q − seq_k. Every row sees every key when there is no mask.
FA_HOST_DEVICE constexpr int64_t first_query_seeing(int64_t key, int seq_q, int seq_k, bool causal) {
  if (!causal) return 0;
  const int64_t first = key + int64_t(seq_q) - int64_t(seq_k);
  return first < 0 ? 0 : first;
}

/// The query tiles (of `block_m` rows) that one key tile [key0, key0 + block_n) meets.
///
///   tiles [begin, end)  hold at least one row that sees a key of the tile; the tiles
///                       before `begin` lie entirely above the causal band: skipped.
///   masked(i)           tile i needs the element-wise mask: it straddles the diagonal
///                       (some of its rows see only part of the keys), or it runs past
///                       seq_q (the ragged last query tile), or the key tile runs past
///                       seq_k. Every other visited tile is computed without a mask.
///
/// A key tile that no row sees (only when seq_q = 0) has begin = end: the kernel then
/// writes dK = dV = 0 for it.
struct QueryTileRange {
  int begin = 0, end = 0;
  int first_full = 0;       ///< from this tile on, every row sees every key of the tile
  bool key_tail = false;    ///< the key tile runs past seq_k
  bool query_tail = false;  ///< the last query tile runs past seq_q

  FA_HOST_DEVICE constexpr bool masked(int i) const {
    return key_tail || i < first_full || (query_tail && i == end - 1);
  }
};

/// The query tiles key tile [key0, key0 + block_n) meets; key0 < seq_k.
FA_HOST_DEVICE constexpr QueryTileRange query_tile_range(int64_t key0, int block_n, int block_m, int seq_q,
                                                         int seq_k, bool causal) {
  //! [query tile range]
  QueryTileRange r;
  r.end = int((int64_t(seq_q) + block_m - 1) / block_m);
  // The tile's first key is seen by the most rows, its last key by the fewest.
  const int64_t first_row = first_query_seeing(key0, seq_q, seq_k, causal);
  const int64_t last_key = key0 + block_n - 1;
  const int64_t full_row = first_query_seeing(last_key, seq_q, seq_k, causal);
  r.begin = seq_q == 0 ? 0 : int(first_row / block_m);
  r.first_full = int((full_row + block_m - 1) / block_m);
  r.key_tail = key0 + block_n > seq_k;
  r.query_tail = int64_t(r.end) * block_m > seq_q;
  if (r.begin > r.end) r.begin = r.end;
  //! [query tile range]
  return r;
}

/// The columns (query rows q0 + [begin, end) of a tile of `block_m` rows) that key `key`
/// is seen by: the row of the transposed score tile Sᵀ = K_j Q_iᵀ that survives the mask.
/// Empty (begin ≥ end) for a key past seq_k.
struct QueryColumns {
  int begin, end;
};

/// x clamped to [0, hi].
FA_HOST_DEVICE constexpr int clamp_to(int64_t x, int hi) { return int(x < 0 ? 0 : (x > hi ? hi : x)); }

FA_HOST_DEVICE constexpr QueryColumns visible_query_columns(int64_t key, int64_t q0, int block_m, int seq_q,
                                                            int seq_k, bool causal) {
  if (key >= seq_k) return QueryColumns{0, 0};
  const int64_t begin = first_query_seeing(key, seq_q, seq_k, causal) - q0;
  const int64_t end = int64_t(seq_q) - q0;
  return QueryColumns{clamp_to(begin, block_m), clamp_to(end, block_m)};
}

}  // namespace fa::stage09
