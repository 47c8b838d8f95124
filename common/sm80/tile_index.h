/// \file tile_index.h
/// \brief Stage 08: the pure index math of the kernel, usable from host and device code.
///
/// Two small pieces of arithmetic decide whether the kernel is fast and correct, and both
/// are easy to get wrong without noticing: where element (row, column) of a tile lives in
/// shared memory (the swizzle), and which key tiles a query tile must visit (the causal
/// band). They live here, in plain C++ with no CUDA syntax, so that
/// tests/test_stage08.cpp can check them exhaustively on a machine without a GPU
/// (bijectivity, bank-conflict freedom, agreement with Problem::visible_keys). Stage 09
/// includes this header too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif

namespace fa::stage08 {

// ------------------------------------------------------------------------------------
// Shared-memory layout of one tile: `rows` rows of `head_dim` 16-bit elements.
//
// A tile row is cut into 16-byte chunks (8 elements): the unit both cp.async (one copy
// per chunk) and ldmatrix (one row address per thread, 8 elements read) work in.
// Shared memory has 32 banks of 4 bytes, i.e. 8 chunk slots per 128-byte line. ldmatrix
// reads an 8×8 matrix as 8 chunk-sized rows in one go; it is conflict-free exactly when
// those 8 chunks occupy the 8 different slots of a line.
//
// With plain row-major storage and 128-byte rows (d = 64) chunk c of rows r..r+7 is in
// slot c for every row: all 8 reads hit the same 4 banks, an 8-way conflict. Two cures:
//   - Swizzled: store logical chunk c of row r at physical chunk c XOR f(r), which
//     permutes the chunks within each 8-chunk group differently for 8 consecutive rows.
//     No memory is wasted and the same function serves the writer (cp.async) and the
//     readers (ldmatrix, ldmatrix.trans), so they always agree.
//   - Padded: add 16 bytes to every row, so consecutive rows start one slot apart.
//     Simpler, but costs d+8 instead of d elements per row.
// ------------------------------------------------------------------------------------

/// How a tile is laid out in shared memory.
enum class SmemLayout {
  Swizzled,  ///< row-major, chunk c of row r stored at chunk c ^ f(r): conflict-free, no padding
  Padded,    ///< row-major with 8 extra elements per row: conflict-free, 16 B per row wasted
  Plain,     ///< row-major: ldmatrix has 8-way bank conflicts (the no_swizzle ablation)
};

/// Elements between the starts of consecutive rows.
FA_HOST_DEVICE constexpr int smem_row_stride(int head_dim, SmemLayout layout) {
  return layout == SmemLayout::Padded ? head_dim + 8 : head_dim;
}

/// True when the XOR swizzle is defined for rows of `head_dim` elements: 4 chunks per
/// row (d = 32) or a multiple of 8 (d = 64, 128, 256). For d = 96 (12 chunks) an XOR of
/// three bits would send chunks 8–11 past the end of the row; use the padded layout.
FA_HOST_DEVICE constexpr bool swizzle_supported(int head_dim) {
  return head_dim / 8 == 4 || (head_dim % 64 == 0 && head_dim > 0);
}

/// The physical chunk that logical chunk `chunk` of row `row` is stored in (swizzled).
///  - 8 or more chunks per row: chunk ^ (row mod 8). Rows r..r+7 see 8 different XOR
///    masks, so one logical chunk lands in 8 different slots.
///  - 4 chunks per row (64-byte rows, two rows per 128-byte line): chunk ^ ((row/2) mod 4).
///    The two rows sharing a line differ in which half they use; the next three pairs
///    are permuted, giving 8 distinct slots over 8 rows again.
//! [swizzle]
FA_HOST_DEVICE constexpr int swizzle_chunk(int row, int chunk, int chunks_per_row) {
  return chunks_per_row == 4 ? (chunk ^ ((row >> 1) & 3)) : (chunk ^ (row & 7));
}

/// Element offset of (row, first element of chunk `chunk`) in a tile stored with `layout`.
/// This one function is used by every writer and reader of a tile.
FA_HOST_DEVICE constexpr int smem_offset(int row, int chunk, int head_dim, SmemLayout layout) {
  return layout == SmemLayout::Swizzled
             ? row * head_dim + swizzle_chunk(row, chunk, head_dim / 8) * 8
             : row * smem_row_stride(head_dim, layout) + chunk * 8;
}
//! [swizzle]

// ldmatrix walks a tile in 16×16 blocks: block (br, bc) is rows 16·br..16·br+15, chunks
// 2·bc and 2·bc+1, and the lane points at row 16·br + lr, chunk 2·bc + lc (lr < 16,
// lc < 2: mma.cuh's patterns X and Y). The kernel's loops run over br and bc at compile
// time, so the address is best split into a part computed once per lane and a
// compile-time constant:
//     smem_offset(16·br + lr, 2·bc + lc) = ldsm_lane_offset(lr, lc, bc mod V) + ldsm_block_offset(br, bc)
// The swizzle only mixes the low 3 bits of the chunk with the low bits of the row, and
// 16·br leaves those row bits alone; so only bc mod V matters to the lane part, with
// V = 4 (a 3-bit XOR on chunk pairs), 2 (d = 32) or 1 (padded, plain). A lane keeps V
// registers instead of one address per block. tests/test_stage08.cpp checks the identity.

/// V above: how many lane offsets a 16×16-block walk needs.
FA_HOST_DEVICE constexpr int ldsm_variants(int head_dim, SmemLayout layout) {
  return layout != SmemLayout::Swizzled ? 1 : (head_dim / 8 == 4 ? 2 : 4);
}

/// The lane's part: the offset of (lr, 2·v + lc), i.e. within block (0, v).
FA_HOST_DEVICE constexpr int ldsm_lane_offset(int lr, int lc, int v, int head_dim, SmemLayout layout) {
  return smem_offset(lr, 2 * v + lc, head_dim, layout);
}

/// The compile-time part: 16·br rows down, and whole groups of V block columns across.
FA_HOST_DEVICE constexpr int ldsm_block_offset(int br, int bc, int head_dim, SmemLayout layout) {
  const int v = ldsm_variants(head_dim, layout);
  return 16 * br * smem_row_stride(head_dim, layout) + (bc / v) * v * 16;
}

/// Bytes of one tile of `rows` rows.
FA_HOST_DEVICE constexpr int smem_tile_bytes(int rows, int head_dim, SmemLayout layout) {
  return rows * smem_row_stride(head_dim, layout) * 2;
}

// ------------------------------------------------------------------------------------
// Which row and 16-byte chunk of a 16×16 block each lane gives ldmatrix.x4 (mma.cuh
// explains the fragments these produce).
//   pattern X: row = lane % 16, chunk = lane / 16
//     A stored [m][k] (ldmatrix), B stored [k][n] (ldmatrix.trans)
//   pattern Y: row = lane % 8 + 8·(lane / 16), chunk = (lane / 8) % 2
//     B stored [n][k] (ldmatrix), A stored [k][m] (ldmatrix.trans)
// ------------------------------------------------------------------------------------

/// Pattern X, row in the 16×16 block.
FA_HOST_DEVICE constexpr int ldsm_row_x(int lane) { return lane % 16; }
/// Pattern X, chunk (0: columns 0-7, 1: columns 8-15 of the block).
FA_HOST_DEVICE constexpr int ldsm_chunk_x(int lane) { return lane / 16; }
/// Pattern Y, row in the 16×16 block.
FA_HOST_DEVICE constexpr int ldsm_row_y(int lane) { return lane % 8 + 8 * (lane / 16); }
/// Pattern Y, chunk.
FA_HOST_DEVICE constexpr int ldsm_chunk_y(int lane) { return (lane / 8) % 2; }

// ------------------------------------------------------------------------------------
// Which key tiles a query tile visits (bottom-right causal, docs/design.md §3).
//
// Query row i sees keys j < i + seq_k − seq_q + 1 (clamped to [0, seq_k]). For the query
// tile of rows [row0, row0 + rows) and key tiles of B_c keys:
//   - n_tiles:    key tiles [0, n_tiles) hold at least one key some row of the tile sees.
//                 Tiles from n_tiles on lie entirely above the band: never loaded.
//   - n_unmasked: key tiles [0, n_unmasked) are seen in full by every row of the tile
//                 and lie entirely inside [0, seq_k): off-band tiles, computed without
//                 any mask. Tiles [n_unmasked, n_tiles) straddle the diagonal or the end
//                 of the keys: on-band tiles, masked element by element.
// Without causality every row sees all seq_k keys; only a ragged last tile is masked.
// ------------------------------------------------------------------------------------

/// The key tiles one query tile visits; see above.
struct KvTileRange {
  int n_tiles = 0;     ///< key tiles [0, n_tiles) are visited
  int n_unmasked = 0;  ///< key tiles [0, n_unmasked) need no mask (n_unmasked ≤ n_tiles)
};

/// Keys that query row `row` sees: [0, visible_key_end(row)). Same as Problem::visible_keys.
FA_HOST_DEVICE constexpr int64_t visible_key_end(int64_t row, int seq_q, int seq_k, bool causal) {
  if (!causal) return seq_k;
  const int64_t end = row + int64_t(seq_k) - int64_t(seq_q) + 1;
  return end < 0 ? 0 : (end > seq_k ? int64_t(seq_k) : end);
}

/// Key tiles of `block_n` keys visited by query rows [row0, row0 + rows), rows ≥ 1.
/// `split` = false (the no_causal_split ablation) marks every visited tile as masked.
//! [tile range]
FA_HOST_DEVICE constexpr KvTileRange kv_tile_range(int64_t row0, int rows, int seq_q, int seq_k,
                                                   bool causal, int block_n, bool split) {
  // The last row of the tile sees the most keys, the first row the fewest.
  const int64_t end_last = visible_key_end(row0 + rows - 1, seq_q, seq_k, causal);
  const int64_t end_first = visible_key_end(row0, seq_q, seq_k, causal);
  KvTileRange r;
  r.n_tiles = int((end_last + block_n - 1) / block_n);
  r.n_unmasked = split ? int(end_first / block_n) : 0;
  return r;
}
//! [tile range]

}  // namespace fa::stage08
