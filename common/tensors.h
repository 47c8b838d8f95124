/// \file tensors.h
/// \brief Host tensors and seeded inputs for one attention problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

namespace fa {

/// How inputs are drawn.
///  - Normal: every element N(0, 1).
///  - Uniform: every element U(-1, 1).
///  - LargeLogits: Q and K drawn N(0, 15²), so scale·q·k has a standard deviation of
///    225: logits in the hundreds, where exp() overflows fp32 (> 88.7). V, dO are N(0, 1).
enum class Dist { Normal, Uniform, LargeLogits };
const char* dist_name(Dist d);
/// Parses "normal", "uniform", "large"; throws std::invalid_argument otherwise.
Dist parse_dist(const std::string& s);

/// This machine's physical memory in bytes (INT64_MAX when it cannot be read). The
/// environment variable FA_HOST_MEMORY_BYTES, when set, replaces it: a test poses as a
/// machine of that size (and so reaches a refusal without the memory it would take).
int64_t physical_memory_bytes();

/// Refuses (OutOfMemory, naming `what` and the sizes) `bytes` more that do not fit in this
/// machine's memory beside what the process already holds. Buffers allocated one after
/// another are checked here as their sum, before the first is allocated: a buffer that fits
/// alone may still be granted (overcommit), and its zeros then take memory the next one needs.
void require_fits_in_memory(double bytes, const std::string& what);

/// A dense fp32 host buffer, checked with require_fits_in_memory() before it is allocated.
/// Allocation failure throws OutOfMemory (errors.h) with the size it needed.
std::vector<float> allocate(int64_t elems, const std::string& what);

/// Everything one forward + backward run reads and writes, on the host, in fp32.
struct Tensors {
  std::vector<float> Q, K, V;  ///< inputs        [b][h][N_q][d], [b][h_kv][N_k][d] ×2
  std::vector<float> dO;       ///< backward input [b][h][N_q][d]
  std::vector<float> O, L;     ///< forward outputs [b][h][N_q][d], [b][h][N_q]
  std::vector<float> dQ, dK, dV;  ///< backward outputs, shaped like Q, K, V

  /// Allocates every buffer for `p` and fills Q, K, V, dO from `seed` and `dist`.
  /// Outputs are filled with NaN ("poisoned") so an element a stage forgets to write
  /// shows up as non-finite in the comparison.
  static Tensors make(const Problem& p, uint64_t seed, Dist dist, bool with_backward);

  /// Fills O, L, dQ, dK, dV with NaN again.
  void poison_outputs();
};

}  // namespace fa
