// Stage 13's masks against the reference's mask (common/mask_reference.h), on every machine:
//  - the CPU step's block mask (block_mask.h): keep() element by element, and every tile's
//    classification against a count of its visible entries;
//  - the Hopper kernels' document mask (document_mask.h, host code): keep() element by element,
//    no visible key in a tile that is not loaded, every full tile seen whole by every row, and
//    the backward's query tiles of a key tile exactly those that see it.
// A file of its own (part of test_stage13_cpu): the mutation checks of the two masks build it
// again with the changed header, and nothing else.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "block_mask.h"
#include "document_mask.h"
#include "mask_reference.h"
#include "modifier_cases.h"
#include "stage13_mask_checks.h"
#include "stage_checks.h"

namespace {

using fa::Modifiers;
using fa::Problem;
using fa::test::documents;
using fa::test::misclassified;
namespace s13 = fa::stage13;

constexpr auto make = &fa::test::make_problem;

// The problems and masks the mask tests walk: causal, windows and documents with N_q ≠ N_k.
std::vector<std::pair<Problem, Modifiers>> mask_cases() {
  std::vector<std::pair<Problem, Modifiers>> cases;
  for (bool causal : {false, true})
    for (auto [nq, nk] : {std::pair{37, 37}, std::pair{50, 23}, std::pair{23, 50}}) {
      const Problem p = make(1, 1, 1, nq, nk, 16, causal);
      cases.push_back({p, Modifiers{}});
      for (auto [l, r] : {std::pair{0, 0}, std::pair{4, -1}, std::pair{-1, 3}, std::pair{7, 2}, std::pair{100, 100}}) {
        Modifiers m;
        if (l >= 0) m.window_left = l;
        if (r >= 0) m.window_right = r;
        cases.push_back({p, m});
      }
    }
  for (bool causal : {false, true}) {
    cases.push_back({make(1, 1, 1, 40, 40, 16, causal), documents({1, 1, 0, 13, 0, 20, 5}, {1, 1, 0, 13, 0, 20, 5})});
    cases.push_back({make(1, 1, 1, 30, 41, 16, causal), documents({3, 0, 10, 17}, {5, 2, 1, 33})});
    cases.push_back({make(1, 1, 1, 45, 45, 16, causal), documents({10, 30}, {10, 30})});  // rows 40.. see nothing
    Modifiers w = documents({9, 0, 24, 7}, {9, 0, 24, 7});
    w.window_left = 3;
    cases.push_back({make(1, 1, 1, 40, 40, 16, causal), w});
  }
  return cases;
}

}  // namespace

TEST_CASE("the block mask: keep() is the definition and every tile is classified right") {
  for (const auto& [p, m] : mask_cases()) {
    const s13::BlockMask mask(p, m);
    INFO(p.describe(), " | ", m.describe());
    int64_t differ = 0;
    for (int64_t r = 0; r < p.seq_q; ++r)
      for (int64_t c = 0; c < p.seq_k; ++c) differ += mask.keep(r, c) != fa::mask_keeps(p, m, r, c);
    CHECK(differ == 0);
    // Without documents the classification is exact; with them a tile whose rows from the first
    // that reaches it are a document's empty top rows may be called partial (a lost skip, never
    // a wrong one).
    for (auto [B_r, B_c] : {std::pair{1, 1}, std::pair{4, 8}, std::pair{8, 3}, std::pair{16, 16}, std::pair{64, 64}})
      CHECK(misclassified(p, m, mask, B_r, B_c, !m.has_documents()) == 0);
  }
}

TEST_CASE("13 hopper: the document mask against the reference's mask, tile by tile") {
  struct Case {
    Problem p;
    Modifiers m;
  };
  std::vector<Case> cases;
  for (bool causal : {false, true}) {
    const auto add = [&](int seq_q, int seq_k, Modifiers m) { cases.push_back({make(1, 1, 1, seq_q, seq_k, 64, causal), m}); };
    for (auto [wl, wr] : {std::pair{-1, -1}, {0, 0}, {5, 3}, {16, -1}, {-1, 2}, {130, 0}, {1000, 1000}}) {
      Modifiers m;
      if (wl >= 0) m.window_left = wl;
      if (wr >= 0) m.window_right = wr;
      add(1, 1, m), add(300, 300, m), add(130, 517, m), add(517, 130, m);
      Modifiers docs = documents({300, 0, 1, 129, 64, 200}, {300, 0, 1, 129, 64, 200});
      docs.window_left = m.window_left, docs.window_right = m.window_right;
      add(700, 700, docs);
      Modifiers uneven = documents({5, 200, 0, 33, 1}, {17, 150, 3, 0, 250});
      uneven.window_left = m.window_left, uneven.window_right = m.window_right;
      add(260, 430, uneven);
    }
  }
  int64_t tiles = 0;
  for (const Case& c : cases) {
    const std::vector<int64_t> cq = c.m.has_documents() ? c.m.cu_seqlens_q : std::vector<int64_t>{0, c.p.seq_q};
    const std::vector<int64_t> ck = c.m.has_documents() ? c.m.cu_seqlens_k : std::vector<int64_t>{0, c.p.seq_k};
    int right = c.m.window_right ? int(*c.m.window_right) : s13::kNoBound;
    if (c.p.causal) right = std::min(right, 0);
    const int left = c.m.window_left ? int(*c.m.window_left) : s13::kNoBound;
    for (size_t doc = 0; doc + 1 < cq.size(); ++doc) {
      const s13::DocumentMask mask{int(cq[doc + 1] - cq[doc]), int(ck[doc + 1] - ck[doc]), left, right};
      CAPTURE(c.p.describe());
      CAPTURE(c.m.describe());
      CAPTURE(doc);
      for (int i = 0; i < mask.n_q; ++i)  // keep() is the reference's mask, in document indices
        for (int j = 0; j < mask.n_k; ++j)
          REQUIRE(mask.keep(i, j) == fa::mask_keeps(c.p, c.m, cq[doc] + i, ck[doc] + j));
      for (int rows : {64, 128, 192})
        for (int row0 = 0; row0 < mask.n_q; row0 += rows) {
          const int r1 = std::min(row0 + rows, mask.n_q);
          for (int j = 0; j * 128 < mask.n_k; ++j) {
            int visible = 0, cells = 0;
            for (int i = row0; i < r1; ++i)
              for (int k = j * 128; k < std::min((j + 1) * 128, mask.n_k); ++k) visible += mask.keep(i, k), ++cells;
            const s13::GpuTileKind kind = mask.classify(row0, rows, j, 128);
            CAPTURE(rows);
            CAPTURE(row0);
            CAPTURE(j);
            if (kind == s13::GpuTileKind::Skip) CHECK(visible == 0);          // never loaded: sees nothing
            if (kind == s13::GpuTileKind::Full) CHECK(visible == cells);      // unmasked: seen whole
            if (kind == s13::GpuTileKind::Full) CHECK((j + 1) * 128 <= mask.n_k);
            ++tiles;
          }
        }
    }
  }
  CHECK(tiles > 1000);
}

TEST_CASE("13 hopper backward: the query tiles of a key tile are exactly those that see it") {
  // query_tile_range (two binary searches) against classify() over every query tile, and
  // against the reference's mask: a tile outside the range sees no key of the key tile. And
  // the band test of the backward's masked steps (in_band) against keep(), element by element.
  int64_t pairs = 0;
  for (bool causal : {false, true})
    for (auto [wl, wr] : {std::pair{-1, -1}, {0, 0}, {5, 3}, {16, -1}, {-1, 2}, {130, 0}, {1000, 1000}})
      for (auto [n_q, n_k] : {std::pair{1, 1}, {300, 300}, {130, 517}, {517, 130}, {64, 0}, {0, 64}, {700, 129}}) {
        int right = wr >= 0 ? wr : s13::kNoBound;
        if (causal) right = std::min(right, 0);
        const s13::DocumentMask mask{n_q, n_k, wl >= 0 ? wl : s13::kNoBound, right};
        for (int B_r : {64, 128})
          for (int j = 0; j * 128 < n_k; ++j) {
            const s13::KeyTileRange range = mask.query_tile_range(j, B_r, 128);
            CAPTURE(causal);
            CAPTURE(n_q);
            CAPTURE(n_k);
            CAPTURE(wl);
            CAPTURE(wr);
            CAPTURE(B_r);
            CAPTURE(j);
            if (B_r == 64) {  // the backward's element test: the band of differences is keep()
              int differ = 0;
              for (int row = 0; row < n_q; ++row)
                for (int k = j * 128; k < std::min((j + 1) * 128, n_k); ++k) differ += mask.in_band(row, k) != mask.keep(row, k);
              CHECK(differ == 0);
            }
            for (int i = 0; i * B_r < n_q; ++i) {
              const bool inside = range.first <= i && i < range.end;
              CHECK(inside == (mask.classify(i * B_r, B_r, j, 128) != s13::GpuTileKind::Skip));
              if (!inside)
                for (int row = i * B_r; row < std::min((i + 1) * B_r, n_q); ++row)
                  for (int k = j * 128; k < std::min((j + 1) * 128, n_k); ++k) REQUIRE(!mask.keep(row, k));
              ++pairs;
            }
          }
      }
  CHECK(pairs > 1000);
}


TEST_CASE("13 hopper backward: the block order runs every (key tile, row) once, longest first in each group") {
  // The order is a bijection from block indices onto (key tile, kv-head row); inside a group of
  // rows the key tiles come in order (a document's first key tiles are its longest under the
  // causal mask), and the group size gives about one wave of blocks.
  CHECK(s13::bwd_row_group(132, 32, 16) == 4);  // N = 4096, B_c = 128, 16 heads: 4 rows × 32 tiles
  CHECK(s13::bwd_row_group(132, 128, 16) == 1);
  CHECK(s13::bwd_row_group(132, 8, 4) == 4);    // never more rows than there are
  CHECK(s13::bwd_row_group(132, 0, 3) == 3);
  for (int key_tiles : {1, 5, 32, 33})
    for (int rows : {1, 3, 16, 17})
      for (int group : {1, 2, 4, 5, rows}) {
        if (group > rows) continue;
        const s13::BwdBlockOrder order{key_tiles, rows, group};
        CAPTURE(key_tiles);
        CAPTURE(rows);
        CAPTURE(group);
        std::vector<int> seen(size_t(key_tiles * rows), 0);
        int last_group = 0, last_tile = 0;
        for (int b = 0; b < key_tiles * rows; ++b) {
          int tile = -1, row = -1;
          order.at(b, tile, row);
          REQUIRE((0 <= tile && tile < key_tiles && 0 <= row && row < rows));
          ++seen[size_t(row * key_tiles + tile)];
          const int g = row / group;
          CHECK(g >= last_group);                                  // the groups in turn
          if (g == last_group) CHECK(tile >= last_tile);           // inside one, the key tiles in order
          if (g != last_group) CHECK(tile == 0);
          last_group = g;
          last_tile = tile;
        }
        for (int count : seen) CHECK(count == 1);
      }
}

TEST_CASE("13 hopper backward: a thread's element test is keep() inside the document, 0 past its ends") {
  // The GPU backward's masked steps test element (key k_r, query q_0 + 8j + e) of a thread's
  // fragment as one comparison (DocumentMask::element_test). Every thread position of every
  // (key tile, query tile) pair: seen exactly when k < n_k, q < n_q and keep(q, k).
  int64_t elements = 0;
  for (bool causal : {false, true})
    for (auto [wl, wr] : {std::pair{-1, -1}, {0, 0}, {5, 3}, {16, -1}, {-1, 2}, {130, 0}})
      for (auto [n_q, n_k] : {std::pair{1, 1}, {300, 300}, {130, 517}, {517, 130}, {200, 64}}) {
        int right = wr >= 0 ? wr : s13::kNoBound;
        if (causal) right = std::min(right, 0);
        const s13::DocumentMask mask{n_q, n_k, wl >= 0 ? wl : s13::kNoBound, right};
        CAPTURE(causal);
        CAPTURE(n_q);
        CAPTURE(n_k);
        CAPTURE(wl);
        CAPTURE(wr);
        int differ = 0;
        for (int B_r : {64, 128})
          for (int key0 = 0; key0 < n_k; key0 += 64)
            for (int query0 = 0; query0 < n_q; query0 += B_r)
              for (int row = 0; row < 64; row += 1) {
                if (row % 16 >= 8) continue;  // fragment_row(0): 16·warp + lane/4; row 1 is 8 below
                for (int col0 = 0; col0 < 8; col0 += 2) {  // fragment_col(0, 0) = 2·(lane % 4)
                  const int k[2] = {key0 + row, key0 + row + 8}, q0 = query0 + col0;
                  const s13::ElementTest t = mask.element_test(k[0], k[1], q0);
                  for (int r = 0; r < 2; ++r)
                    for (int j = 0; j < B_r / 8; ++j)
                      for (int e = 0; e < 2; ++e) {
                        const int q = q0 + 8 * j + e;
                        const bool want = k[r] < n_k && q < n_q && mask.keep(q, k[r]);
                        differ += t.sees(r, 8 * j + e) != want;
                        ++elements;
                      }
                }
              }
        CHECK(differ == 0);
      }
  CHECK(elements > 100000);
}
