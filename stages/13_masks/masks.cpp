// Stage 13 (CPU step) — masks and score modifiers in stage 06's tiled loop. This file: the
// checks and the choice of the compiled loop; masked_forward.h and masked_backward.h: the
// loops; block_mask.h: the mask (classify, keep) and the score functors.
//
// What changed from stage 06: its loop knew one mask, the bottom-right causal one, as a count
// of key tiles per query tile (key_tiles_visited) and a diagonal test per tile. Here the loop
// asks a block mask what each tile is — skip, full or partial — and causal is one such mask
// beside the sliding window and documents packed with cu_seqlens. The logits pass through a
// score functor (soft-cap, ALiBi) chosen at compile time, and a sink joins the softmax's
// denominator as its first key. The backward applies the functor's derivative to dS.
//
// Run: ./build/stages/13_masks/stage13 --seqlens 100,0,1,300 --causal --window-left 64 --backward
//      ./build/stages/13_masks/stage13 --seq-q 512 --seq-k 512 --softcap 5 --alibi --sinks --backward
#include "masks.h"

#include <sstream>
#include <stdexcept>

#include "masked_backward.h"
#include "masked_forward.h"

namespace fa::stage13 {

TileCounts& TileCounts::operator+=(const TileCounts& o) {
  skip += o.skip;
  full += o.full;
  partial += o.partial;
  return *this;
}

std::string TileCounts::describe() const {
  std::ostringstream s;
  s << "skip " << skip << ", full " << full << ", partial " << partial << " (of " << total() << ")";
  return s.str();
}

namespace {

stage06::Tiles checked_tiles(const Problem& p, const Modifiers& m, const Config& c) {
  p.validate(kStageName);
  m.validate(p, kStageName);
  if (c.threads != 1)
    throw std::invalid_argument(std::string(kStageName) + ": threads = " + std::to_string(c.threads) +
                                " is not allowed (the CPU step runs on one thread)");
  return stage06::tiles_for(p, c);
}

//! [modifier table]
// The score functors a build instantiates, one per combination of soft-cap and ALiBi; the
// run-time modifiers pick one. Sinks and the mask are run-time values of every loop.
template <typename Run>
void with_score(const Modifiers& m, Run run) {
  const float cap = float(m.softcap);
  const bool softcap = m.softcap > 0, alibi = !m.alibi_slopes.empty();
  if (softcap && alibi) run(Score<true, true>{cap, 0});
  else if (softcap) run(Score<true, false>{cap, 0});
  else if (alibi) run(Score<false, true>{0, 0});
  else run(Score<false, false>{});
}
//! [modifier table]

}  // namespace

void forward(const Problem& p, const Modifiers& m, const Config& c, const float* Q, const float* K,
             const float* V, float* O, float* L, TileCounts* counts) {
  const stage06::Tiles t = checked_tiles(p, m, c);
  require_forward_buffers(kStageName, p, Q, K, V, O, L);
  if (counts) *counts = TileCounts{};
  const BlockMask mask(p, m);
  with_score(m, [&](auto score) { forward_tiles(p, m, t, mask, score, Q, K, V, O, L, counts); });
}

void backward(const Problem& p, const Modifiers& m, const Config& c, const float* Q, const float* K,
              const float* V, const float* O, const float* L, const float* dO, float* dQ, float* dK,
              float* dV, float* dsinks, TileCounts* counts) {
  const stage06::Tiles t = checked_tiles(p, m, c);
  require_backward_buffers(kStageName, p, Q, K, V, O, L, dO, dQ, dK, dV);
  if (counts) *counts = TileCounts{};
  const BlockMask mask(p, m);
  with_score(m, [&](auto score) {
    backward_tiles(p, m, t, mask, score, Q, K, V, O, L, dO, dQ, dK, dV, dsinks, counts);
  });
}

TileCounts count_tiles(const Problem& p, const Modifiers& m, const Config& c) {
  const stage06::Tiles t = checked_tiles(p, m, c);
  const BlockMask mask(p, m);
  TileCounts counts;
  for (int64_t i = 0; i < t.T_r; ++i)
    for (int64_t j = 0; j < t.T_c; ++j) {
      const int64_t r0 = i * t.B_r, c0 = j * t.B_c;
      count(&counts, mask.classify(r0, std::min(t.B_r, p.seq_q - r0), c0, std::min(t.B_c, p.seq_k - c0)));
    }
  const int64_t heads = int64_t(p.batch) * p.heads;
  return {counts.skip * heads, counts.full * heads, counts.partial * heads};
}

}  // namespace fa::stage13
