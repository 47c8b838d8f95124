// Stage 13 on Hopper: what the kernel receives — stage 10's tensor maps and sizes, the
// document table of the work list, and the modifiers' values.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fa::stage13 {

struct MaskedParams {
  CUtensorMap map_q;  ///< Q [batch·heads][seq_q][d], box [64 rows][64 cols]
  CUtensorMap map_k;  ///< K [batch·kv_heads][seq_k][d], box [B_c rows][64 cols]
  CUtensorMap map_v;  ///< V, like K
  void* O;            ///< [batch·heads][seq_q][d], the input dtype
  float* L;           ///< [batch][heads][seq_q], fp32
  int batch, heads, kv_heads, seq_q, seq_k;
  /// The work list's documents (one when there are none: the whole sequence; one more, with
  /// no keys, for the rows past the last document). Device arrays of documents + 1 entries:
  /// the documents' first query and first key (packed indices), and the first work tile of
  /// each document among one head's (query tiles of B_r rows, counted per document).
  int documents;
  const int* cu_q;
  const int* cu_k;
  const int* first_tile;
  int window_left, window_right;  ///< kNoBound where absent; window_right ≤ 0 under the causal mask
  const float* alibi_slopes;      ///< [heads], or null
  const float* sinks;             ///< [heads], or null
  float softcap;                  ///< cap (used by the soft-cap kernels only)
  int tiles_total;                ///< work tiles: first_tile[documents] · batch · heads
  int heads_per_section;          ///< the work list's order: heads whose K and V fit in the L2 together
  int* tile_counter;              ///< the dynamic scheduler's counter, 0 at launch
  float scale;                    ///< 1/√d (or the problem's)
  float scale_log2;               ///< scale · log2 e
};

}  // namespace fa::stage13
