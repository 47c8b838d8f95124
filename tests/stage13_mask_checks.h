/// \file stage13_mask_checks.h
/// \brief Stage 13's tile classification against the reference's mask, shared by its CPU
/// test (test_stage13_cpu.cpp) and its mask test (test_stage13_mask.cpp, which the mutation
/// checks of the masks build again alone).
#pragma once

#include <algorithm>
#include <cstdint>

#include "block_mask.h"
#include "mask_reference.h"

namespace fa::test {

/// Visible entries of one tile, by the reference's definition.
inline int64_t visible_in_tile(const Problem& p, const Modifiers& m, int64_t r0, int64_t rows, int64_t c0,
                               int64_t cols) {
  int64_t n = 0;
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t c = c0; c < c0 + cols; ++c) n += fa::mask_keeps(p, m, r, c);
  return n;
}

/// Every tile's class against its count of visible entries: skip holds none, full holds all,
/// partial holds fewer than all. With `exact`, partial also holds at least one. Returns the
/// number of tiles that break the rule.
template <typename Mask>
int64_t misclassified(const Problem& p, const Modifiers& m, const Mask& mask, int64_t B_r, int64_t B_c, bool exact) {
  int64_t wrong = 0;
  for (int64_t r0 = 0; r0 < p.seq_q; r0 += B_r)
    for (int64_t c0 = 0; c0 < p.seq_k; c0 += B_c) {
      const int64_t rows = std::min(B_r, p.seq_q - r0), cols = std::min(B_c, p.seq_k - c0);
      const int64_t n = visible_in_tile(p, m, r0, rows, c0, cols);
      switch (mask.classify(r0, rows, c0, cols)) {
        case stage13::TileKind::Skip: wrong += n != 0; break;
        case stage13::TileKind::Full: wrong += n != rows * cols; break;
        case stage13::TileKind::Partial: wrong += n == rows * cols || (exact && n == 0); break;
      }
    }
  return wrong;
}

}  // namespace fa::test
