// Stage 13 on Hopper: the block mask of one document, in the document's own indices — the
// one classification that the kernel's producer (which key tiles to load) and its consumers
// (which tiles to mask) both ask, and that the CPU tests check against the reference's mask.
//
// A query tile of the GPU forward lies inside one document (the tile scheduler enumerates
// (document, query tile) pairs), and its key tiles are counted from the document's first
// key, so the document mask needs no test of its own: a key tile that runs past the
// document's end is a partial tile, and keep() masks the keys past n_k. What is left is
// block_mask.h's interval per row, in local indices: row i of a document of n_q queries and
// n_k keys has its diagonal at key i + n_k − n_q and sees keys [lo(i), hi(i)):
//   lo(i) = clamp(diag − window_left, 0, n_k)       hi(i) = clamp(diag + right + 1, 0, n_k)
// (right = min(window_right, 0) under the causal mask; an absent side is kNoBound). Both
// ends never decrease from one row to the next, so for the rows [r0, r1] of a tile
//   the keys any row sees are [lo(r0), hi(r1)):  the key tiles outside are skipped — never
//                                                 loaded, never computed;
//   a key tile [c0, c1) is full when lo(r1) ≤ c0 and hi(r0) ≥ c1 (every row sees all of it);
//   any other tile is partial: computed, then masked element by element with keep().
// No tile between the first and the last visited one can be skipped: an interval that is
// not empty starts at most one key after the one of the row above, so the rows' intervals
// join into one (the CPU test checks it against the element-wise mask).
#pragma once

#if defined(__CUDACC__)
#define FA13_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA13_HOST_DEVICE inline
#endif

namespace fa::stage13 {

/// A window side that is left out: larger than any distance between a row's diagonal and a
/// key (the launcher refuses sequences of 2^29 tokens or more, so no sum below overflows).
inline constexpr int kNoBound = 1 << 29;

enum class GpuTileKind { Skip, Full, Partial };

/// Key tiles [first, end) of B_c keys, counted from the document's first key.
struct KeyTileRange {
  int first, end;
  FA13_HOST_DEVICE int count() const { return end - first; }
};

FA13_HOST_DEVICE int clamp_to(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

/// A thread's element test in the GPU backward's masked steps (DocumentMask::element_test):
/// column c = 8j + e of key row r is seen exactly when sees(r, c).
struct ElementTest {
  int hi[2];
  unsigned width[2];
  FA13_HOST_DEVICE bool sees(int r, int c) const { return unsigned(hi[r] - c) <= width[r]; }
};

struct DocumentMask {
  int n_q, n_k;                    ///< the document's queries and keys
  int window_left, window_right;   ///< keys before / after the diagonal (kNoBound: no limit; causal: right ≤ 0)

  FA13_HOST_DEVICE int diagonal(int i) const { return i + n_k - n_q; }
  FA13_HOST_DEVICE int lo(int i) const { return clamp_to(diagonal(i) - window_left, 0, n_k); }
  FA13_HOST_DEVICE int hi(int i) const {
    const int h = clamp_to(diagonal(i) + window_right + 1, 0, n_k);
    return h < lo(i) ? lo(i) : h;  // an empty interval: [lo, lo)
  }
  FA13_HOST_DEVICE bool keep(int i, int j) const { return lo(i) <= j && j < hi(i); }

  //! [document band]
  /// The same mask as a band of differences: for a row i < n_q and a key k < n_k,
  ///   keep(i, k)  ⟺  band_lo() ≤ k − i ≤ band_lo() + band_span()
  /// (the clamps of lo and hi only keep the interval inside [0, n_k]). Tested as one unsigned
  /// comparison, unsigned(k − i − band_lo()) ≤ band_span(): a difference below the band wraps
  /// to a large number. Both window sides are ≥ 0 (right = 0 under the causal mask), so the
  /// span is ≥ 0, and with kNoBound sides every value stays below 2^31.
  FA13_HOST_DEVICE int band_lo() const { return n_k - n_q - window_left; }
  FA13_HOST_DEVICE unsigned band_span() const { return unsigned(window_left + window_right); }
  FA13_HOST_DEVICE bool in_band(int i, int k) const { return unsigned(k - i - band_lo()) <= band_span(); }
  //! [document band]

  /// The band test as the GPU backward runs it on a thread's fragment of Sᵀ: two key rows
  /// k_0, k_1 and the query columns q_0 + c, c = 8j + e (ElementTest). For row r, k_r − q − band_lo
  /// is first_r − c, so the key is seen by the columns first_r − span ≤ c ≤ first_r; a column
  /// past the document's end (the next document's queries) has c ≥ cols = n_q − q_0. Both
  /// together are one interval lo_r ≤ c ≤ hi_r, hi_r = min(first_r, cols − 1), tested as
  /// unsigned(hi_r − c) ≤ hi_r − lo_r; a key past the document's end gets an empty interval.
  FA13_HOST_DEVICE ElementTest element_test(int k_0, int k_1, int q_0) const;

  //! [document mask]
  /// The key tiles the rows [row0, row0 + rows) of the document visit: every tile holding a
  /// key one of them sees (rows past the document's end do not count).
  FA13_HOST_DEVICE KeyTileRange key_tile_range(int row0, int rows, int B_c) const {
    const int r1 = (row0 + rows < n_q ? row0 + rows : n_q) - 1;
    if (r1 < row0) return {0, 0};
    const int k0 = lo(row0), k1 = hi(r1);  // the union of the rows' intervals
    if (k1 <= k0) return {0, 0};
    return {k0 / B_c, (k1 + B_c - 1) / B_c};
  }

  /// Key tile j (keys [j·B_c, (j + 1)·B_c)) for the rows [row0, row0 + rows).
  FA13_HOST_DEVICE GpuTileKind classify(int row0, int rows, int j, int B_c) const {
    const KeyTileRange range = key_tile_range(row0, rows, B_c);
    if (j < range.first || j >= range.end) return GpuTileKind::Skip;
    const int r1 = (row0 + rows < n_q ? row0 + rows : n_q) - 1, c0 = j * B_c, c1 = c0 + B_c;
    return lo(r1) <= c0 && hi(row0) >= c1 ? GpuTileKind::Full : GpuTileKind::Partial;
  }
  //! [document mask]

  //! [query tile range]
  /// The backward's question, the transpose of key_tile_range: the query tiles of B_r rows
  /// (tile i: rows [i·B_r, (i + 1)·B_r)) whose classify() of key tile j is not Skip. Both ends
  /// of key_tile_range never decrease from one query tile to the next (and the tiles whose
  /// rows see nothing come first), so the tiles that skip j because they end before it form
  /// a prefix, those that start after it a suffix, and the range is what lies between: two
  /// binary searches.
  FA13_HOST_DEVICE KeyTileRange query_tile_range(int j, int B_r, int B_c) const {
    const int tiles = (n_q + B_r - 1) / B_r;
    // The first tile for which `after(i)` holds, `after` false then true along the tiles.
    auto first_where = [&](auto after) {
      int lo_i = 0, hi_i = tiles;
      while (lo_i < hi_i) {
        const int mid = (lo_i + hi_i) / 2;
        if (after(mid)) hi_i = mid; else lo_i = mid + 1;
      }
      return lo_i;
    };
    const int first = first_where([&](int i) { return key_tile_range(i * B_r, B_r, B_c).end > j; });
    const int end = first_where([&](int i) {
      const KeyTileRange r = key_tile_range(i * B_r, B_r, B_c);
      return r.count() > 0 && r.first > j;
    });
    return end > first ? KeyTileRange{first, end} : KeyTileRange{0, 0};
  }
  //! [query tile range]
};

//! [backward element test]
FA13_HOST_DEVICE ElementTest DocumentMask::element_test(int k_0, int k_1, int q_0) const {
  ElementTest t;
  const int span = window_left + window_right, cols = n_q - q_0;
  const int keys[2] = {k_0, k_1};
  for (int r = 0; r < 2; ++r) {
    const int first = keys[r] - q_0 - band_lo(), lo = first - span;
    const int hi = first < cols - 1 ? first : cols - 1;
    const bool none = keys[r] >= n_k || hi < lo;
    t.hi[r] = none ? -(1 << 29) : hi;  // below 0 by more than any width: no column passes
    t.width[r] = none ? 0u : unsigned(hi - lo);
  }
  return t;
}
//! [backward element test]

//! [backward block order]
/// The backward's blocks, one per (key tile, kv-head row), in the order they start: the GPU
/// starts blocks roughly in index order, one block per SM at a time. Under the causal mask a
/// document's first key tiles are its longest (key tile 0 is seen by every query tile), and
/// the kernel ends when its last block does, so long blocks should start first. Two plain
/// orders each fail at one end:
///   row by row (all key tiles of row 0, then of row 1, …): the last rows' long tiles start
///     last and run alone at the end;
///   key tile by key tile across all rows: the long tiles start first, but every running
///     block reads another head's Q_i, dO_i (stage 11 measured this 35–45% slower).
/// The order here takes the rows in groups of `group`, and inside a group the key tiles in
/// turn (each document's in order, so its longest first under the causal mask) with the
/// group's rows innermost. With group = SMs / key tiles a group fills about
/// one wave: the running blocks share a few heads' queries in L2, and every group's long
/// tiles start before its short ones.
struct BwdBlockOrder {
  int key_tiles;  ///< key tiles per row (of all documents)
  int rows;       ///< batch · kv_heads
  int group;      ///< rows per group, 1 ≤ group ≤ rows

  /// Block `block` (0 ≤ block < key_tiles · rows): its key tile and its row.
  FA13_HOST_DEVICE void at(int block, int& tile, int& row) const {
    const int per_group = group * key_tiles, g = block / per_group, r = block % per_group;
    const int first = g * group, size = rows - first < group ? rows - first : group;  // the last group may be smaller
    tile = r / size;
    row = first + r % size;
  }
};

/// The rows per group for `sms` SMs: about one wave of blocks (at least one row, at most all).
inline int bwd_row_group(int sms, int key_tiles, int rows) {
  const int g = key_tiles > 0 ? sms / key_tiles : rows;
  return g < 1 ? 1 : (g > rows ? rows : g);
}
//! [backward block order]

}  // namespace fa::stage13
