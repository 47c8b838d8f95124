/// \file masks.h
/// \brief Stage 13 (CPU step): stage 06's tiled loop under a block mask — every tile is
/// skipped, computed whole, or computed with an element mask — and score modifiers as
/// compile-time functors: sliding window, documents (cu_seqlens), ALiBi, soft-cap, sinks.
#pragma once

#include <cstdint>
#include <string>

#include "modifiers.h"
#include "problem.h"
#include "stage.h"
#include "tiled_cpu.h"

namespace fa::stage13 {

inline constexpr const char* kStageName = "13_masks";

/// The tile sizes are stage 06's (B_r, B_c from a fast-memory budget, or set by hand); the
/// CPU step runs on one thread.
using Config = stage06::Config;

/// How many (query tile, key tile) pairs a run skipped, computed whole, or computed with an
/// element mask. skip + full + partial = T_r·T_c per (batch, head) in the forward and the dQ
/// pass, per (batch, kv head, query head of its group) in the dK/dV pass.
struct TileCounts {
  int64_t skip = 0, full = 0, partial = 0;
  int64_t total() const { return skip + full + partial; }
  TileCounts& operator+=(const TileCounts& o);
  bool operator==(const TileCounts& o) const { return skip == o.skip && full == o.full && partial == o.partial; }
  /// "skip 10, full 4, partial 6 (of 20)".
  std::string describe() const;
};

/// Forward under the modifiers `m`: O and L (L = m + log l, with the sink's e^{σ_h} in l).
/// Checks p, m and the tile sizes first (std::invalid_argument naming the value) and writes
/// nothing on a refusal. Counts tiles into `counts` when it is not null.
void forward(const Problem& p, const Modifiers& m, const Config& c, const float* Q, const float* K,
             const float* V, float* O, float* L, TileCounts* counts = nullptr);

/// Backward: dQ, dK, dV from this stage's O and L, and dσ (one per head, summed over the
/// batch) into `dsinks` when m has sinks and `dsinks` is not null. `counts` gets the tiles
/// of the dK/dV pass and of the dQ pass.
void backward(const Problem& p, const Modifiers& m, const Config& c, const float* Q, const float* K,
              const float* V, const float* O, const float* L, const float* dO, float* dQ, float* dK,
              float* dV, float* dsinks = nullptr, TileCounts* counts = nullptr);

/// The classification alone: the counts a forward of `p` under `m` makes, without running it.
TileCounts count_tiles(const Problem& p, const Modifiers& m, const Config& c);

/// The calling thread's tile sizes, from the stage's options (block_q, block_k; register.cpp).
Config current_config();

/// The stage for the shared harness, with no modifiers: the causal mask as a block mask,
/// checked over the matrix of docs/design.md §6. Options: block_q, block_k (command line
/// and set_option); counters: tiles_skip, tiles_full, tiles_partial of the calling
/// thread's last run.
StageInfo info();

}  // namespace fa::stage13
