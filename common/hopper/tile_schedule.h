/// \file tile_schedule.h
/// \brief Which key tiles a query tile visits, and which of them need a mask: plain
/// integer math shared by the kernels and the CPU tests.
#pragma once

#if defined(__CUDACC__)
#define FA10_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA10_HOST_DEVICE inline
#endif

namespace fa::stage10 {

/// Key tiles of B_c keys that rows [row0, row0 + rows) visit, and where masking starts.
/// Under the bottom-right causal mask row i sees keys j ≤ i + seq_k − seq_q, so the last
/// row sees keys up to row0 + rows − 1 + seq_k − seq_q and the tiles past it are never
/// loaded. Tiles [0, first_masked) are seen whole by every row (no mask needed); tiles
/// [first_masked, count) cross the causal diagonal or the end of the keys.
struct KeyTiles {
  int count;         ///< tiles 0 … count − 1 are visited (0: the rows see no key)
  int first_masked;  ///< first tile that needs a mask (≤ count)
};

FA10_HOST_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }

FA10_HOST_DEVICE KeyTiles key_tiles(int row0, int rows, int seq_q, int seq_k, int B_c, bool causal) {
  int count = ceil_div(seq_k, B_c);
  int first_masked = seq_k / B_c;  // the ragged last tile, if any, needs a mask
  if (causal) {
    const int shift = seq_k - seq_q;            // row i sees keys ≤ i + shift
    const int last_key = row0 + rows - 1 + shift;  // the last row's last key
    const int band = last_key < 0 ? 0 : ceil_div(last_key + 1, B_c);
    if (band < count) count = band;
    // The first row sees keys ≤ row0 + shift: a tile wholly below that is unmasked.
    const int first_row_keys = row0 + shift + 1;
    const int unmasked = first_row_keys <= 0 ? 0 : first_row_keys / B_c;
    if (unmasked < first_masked) first_masked = unmasked;
  }
  if (first_masked > count) first_masked = count;
  if (count < 0) count = 0;
  return {count, first_masked};
}

}  // namespace fa::stage10
