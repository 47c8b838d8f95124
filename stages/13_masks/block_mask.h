// Stage 13's block mask and score modifiers: what the tiled loops (masked_forward.h,
// masked_backward.h) ask before and inside each tile.
//
// A mask is two functions:
//   classify(tile) → skip | full | partial   the tile is never read | computed as in stage 06
//                                            without a mask | computed with keep()
//   keep(row, col)                           the element test, asked only inside partial tiles
// Every mask of this stage — causal, sliding window, documents, and their combinations — lets
// each row see one interval of keys [lo, hi), and both ends never decrease from one row to
// the next (within a document the diagonal moves right with the row; a later document's
// keys lie after an earlier one's). That makes classify two or three interval tests instead
// of B_r·B_c element tests, and gives each key tile the contiguous range of query tiles that
// touch it (the backward's dK/dV pass).
//
// A score modifier s' = f(s) is a functor with value() and derivative(); the loops are
// templates over it, so the unmodified loop carries no test and no call (kIdentity).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "modifiers.h"
#include "problem.h"

namespace fa::stage13 {

enum class TileKind { Skip, Full, Partial };

// The keys a row sees: [lo, hi), with lo ≤ hi (lo = hi: none).
struct KeyInterval {
  int64_t lo, hi;
};

//! [block mask]
class BlockMask {
 public:
  BlockMask(const Problem& p, const Modifiers& m) : p_(p), m_(m) {}

  // Row `row`'s visible keys. Per document (all rows and keys, without documents) with
  // diag = i + n_k − n_q for its i-th row:
  //   lo = start + clamp(diag − window_left, 0, n_k)          (0 without a left window)
  //   hi = start + clamp(diag + right + 1, 0, n_k)            right = 0 when causal
  KeyInterval keys(int64_t row) const {
    const Document doc = document_of(row);
    if (doc.index < 0) return {doc.k_start, doc.k_start};  // past the last document
    const int64_t diag = row - doc.q_start + doc.n_k - doc.n_q;
    // A window side may be any size up to INT64_MAX; one wider than the document reaches
    // past its keys whatever the row, so it is capped there (diag ∓ window cannot overflow).
    const int64_t wide = doc.n_q + doc.n_k + 1;
    int64_t lo = 0, hi = doc.n_k;
    if (m_.window_left) lo = std::clamp<int64_t>(diag - std::min(*m_.window_left, wide), 0, doc.n_k);
    std::optional<int64_t> right = m_.window_right;
    if (p_.causal) right = std::min<int64_t>(right.value_or(0), 0);
    if (right) hi = std::clamp<int64_t>(diag + std::min(*right, wide) + 1, 0, doc.n_k);
    return {doc.k_start + lo, doc.k_start + std::max(lo, hi)};
  }

  bool keep(int64_t row, int64_t col) const {
    const KeyInterval k = keys(row);
    return k.lo <= col && col < k.hi;
  }

  // The tile of rows [r0, r0 + rows) and keys [c0, c0 + cols).
  TileKind classify(int64_t r0, int64_t rows, int64_t c0, int64_t cols) const {
    const int64_t c1 = c0 + cols, r_last = r0 + rows - 1;
    // Full: the last row starts seeing at or before c0, the first row sees up to c1 or later
    // (lo and hi grow with the row, so every row in between sees the whole tile).
    if (keys(r_last).lo <= c0 && keys(r0).hi >= c1) return TileKind::Full;
    // LAB BEGIN: the skip test of a tile — hint: the rows whose keys end after c0 start at r_a = first_row_ending_after(r0, r_last + 1, c0); skip when r_a is past r_last or keys(r_a).lo >= c1 (lo grows with the row)
    // Skip: no row sees a key in [c0, c1). The rows whose interval ends after c0 are those
    // from the first with hi > c0; of them the first starts seeing earliest.
    const int64_t r_a = first_row_ending_after(r0, r_last + 1, c0);
    if (r_a > r_last || keys(r_a).lo >= c1) return TileKind::Skip;
    // LAB END
    return TileKind::Partial;
  }
  //! [block mask]

  // The rows [begin, end) of the whole sequence that may see a key in [c0, c1): the range of
  // query tiles the backward's dK/dV pass visits for one key tile.
  std::pair<int64_t, int64_t> rows_touching(int64_t c0, int64_t c1) const {
    const int64_t begin = first_row_ending_after(0, p_.seq_q, c0);
    int64_t lo = begin, hi = p_.seq_q;  // first row with lo ≥ c1 (lo grows with the row)
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys(mid).lo < c1) lo = mid + 1; else hi = mid;
    }
    return {begin, lo};
  }

  // The key on the row's diagonal (packed index): ALiBi's origin.
  int64_t diagonal(int64_t row) const {
    const Document doc = document_of(row);
    return doc.index < 0 ? 0 : doc.k_start + row - doc.q_start + doc.n_k - doc.n_q;
  }

 private:
  struct Document {
    int64_t index, q_start, n_q, k_start, n_k;
  };
  Document document_of(int64_t row) const {
    if (!m_.has_documents()) return {0, 0, p_.seq_q, 0, p_.seq_k};
    const auto& cq = m_.cu_seqlens_q;
    const int64_t d = int64_t(std::upper_bound(cq.begin(), cq.end(), row) - cq.begin()) - 1;
    const auto& ck = m_.cu_seqlens_k;
    if (d + 1 >= int64_t(cq.size())) return {-1, cq.back(), 0, ck.back(), 0};
    return {d, cq[size_t(d)], cq[size_t(d) + 1] - cq[size_t(d)], ck[size_t(d)], ck[size_t(d) + 1] - ck[size_t(d)]};
  }
  // The first row in [begin, end) whose interval ends after key c0 (hi grows with the row).
  int64_t first_row_ending_after(int64_t begin, int64_t end, int64_t c0) const {
    while (begin < end) {
      const int64_t mid = begin + (end - begin) / 2;
      if (keys(mid).hi <= c0) begin = mid + 1; else end = mid;
    }
    return begin;
  }

  const Problem& p_;
  const Modifiers& m_;
};

//! [score modifiers]
// s' = f(s) for a key `distance` = col − diagonal(row) places right of the row's diagonal:
//   soft-cap  s ← cap·tanh(s/cap)       ∂s'/∂s = 1 − tanh²(s/cap)
//   ALiBi     s ← s + slope_h·distance  ∂s'/∂s = 1
template <bool kSoftcap, bool kAlibi>
struct Score {
  static constexpr bool kIdentity = !kSoftcap && !kAlibi;
  float cap = 0;    // soft-cap's cap (kSoftcap)
  float slope = 0;  // this head's ALiBi slope (kAlibi)

  float value(float s, int64_t distance) const {
    if constexpr (kSoftcap) {
      // LAB BEGIN: soft-cap forward — hint: s = cap·tanh(s/cap)
      s = cap * std::tanh(s / cap);
      // LAB END
    }
    if constexpr (kAlibi) s += slope * float(distance);
    return s;
  }
  float derivative([[maybe_unused]] float s) const {
    if constexpr (kSoftcap) {
      // LAB BEGIN: soft-cap backward — hint: ∂s'/∂s = 1 − tanh²(s/cap)
      const float t = std::tanh(s / cap);
      return 1.0f - t * t;
      // LAB END
    } else {
      return 1.0f;
    }
  }
};
//! [score modifiers]

}  // namespace fa::stage13
