/// \file pipeline_state.cuh
/// \brief Where the n-th use of a ring of kStages buffers is: which buffer, and which
/// phase of that buffer's mbarrier to wait for.
///
/// Each buffer of the ring has its own mbarrier ("full": the data landed; "empty": the
/// consumers released it), and a barrier completes its phases in order. Use n of the ring
/// (counted from 0) takes buffer n % kStages and is that buffer's (n / kStages)-th use, so
/// it waits for the completion of phase n / kStages; mbarrier.try_wait.parity names a phase
/// by its parity, (n / kStages) & 1. A producer waiting for an "empty" barrier waits for
/// the phase before, parity ^ 1, which a fresh barrier counts as complete: the first pass
/// through the ring does not wait.
///
///   const auto [s, parity] = PipelineState<kStages>::at(n);   // buffer, parity of use n
///   mbarrier_wait(&full[s], parity);
#pragma once

#include <cstdint>

namespace fa::hopper {

template <int kStages>
struct PipelineState {
  int index;       ///< the buffer: n % kStages
  uint32_t phase;  ///< the parity of the phase to wait for, (n / kStages) & 1, not the phase itself

  /// The state of use n (n ≥ 0), computed directly: a loop that starts anywhere (a
  /// persistent block continuing the ring from its previous query tile) needs no history.
  __host__ __device__ __forceinline__ static constexpr PipelineState at(int n) {
    return {n % kStages, uint32_t((n / kStages) & 1)};
  }
  /// The next use: the next buffer, and the other parity after the last buffer.
  __host__ __device__ __forceinline__ constexpr void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace fa::hopper
