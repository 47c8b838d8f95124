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

}  // namespace fa::stage13
