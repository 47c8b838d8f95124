// Stage 13 on Hopper: what the kernel receives — stage 10's tensor maps and sizes, the
// document table of the work list, and the modifiers' values.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "document_mask.h"

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

/// Rows per document in the backward's scratch (L2, D, dQ_accum): each document's queries
/// start at a multiple of kDocumentPad, so a query tile of the backward (64 or 128 rows,
/// counted from the document's first query) is one aligned run of the scratch.
inline constexpr int kDocumentPad = 128;

/// What the backward kernels receive. The document table now has four columns: the
/// documents' first query and first key (packed), their first row in the padded scratch
/// (pad_first, multiples of kDocumentPad), and the first key tile of each among one kv
/// head's (B_c keys, counted per document). Documents + 1 entries each.
struct MaskedBwdParams {
  CUtensorMap map_q, map_k, map_v, map_do;  ///< boxes: [64 rows][64 cols] for Q, dO; [B_c][64] for K, V
  const void* O;      ///< [batch·heads][seq_q][d], the input dtype (prep)
  const void* dO;     ///< like O (prep)
  const float* L;     ///< [batch·heads][seq_q], natural log, the forward's (sink included)
  float* L2;          ///< [batch·heads][n_pad]: L·log2 e; +inf where a row sees nothing, and in the padding
  float* D;           ///< [batch·heads][n_pad]: rowsum(dO∘O); 0 in the padding
  float* dQ_accum;    ///< [batch·heads][n_pad][d], fp32, zeroed by the prep kernel; dQ/scale is added into it
  void* dQ;           ///< [batch·heads][seq_q][d]
  void* dK;           ///< [batch·kv_heads][seq_k][d]
  void* dV;
  float* dsinks;      ///< [heads], zeroed: −Σ e^{σ−L}·D is added into it; null without sinks
  int batch, heads, kv_heads, seq_q, seq_k, n_pad;
  int documents;
  const int* cu_q;
  const int* cu_k;
  const int* pad_first;
  const int* first_key_tile;
  BwdBlockOrder order;            ///< which (key tile, kv-head row) block x computes
  int window_left, window_right;  ///< kNoBound where absent; window_right ≤ 0 under the causal mask
  const float* alibi_slopes;      ///< [heads], or null
  const float* sinks;             ///< [heads], or null
  float softcap;                  ///< cap; 0: off
  float scale;                    ///< the softmax scale
  float scale_log2;               ///< scale · log2 e
};

}  // namespace fa::stage13
