/// \file ring_attention.h
/// \brief Stage 12: ring attention — a sequence split across P ranks; K/V shards travel
/// around a ring while each rank attends its queries to the shard in hand and merges the
/// partial results by their log-sum-exp. This header: the ring loop and its two seams (what a
/// rank computes, what carries the shards), and the CPU ring (P threads over stage 06, fp32).
#pragma once

#include <functional>

#include "ring_plan.h"
#include "stage.h"
#include "transport.h"

namespace fa::stage12 {

/// How a ring call is cut. Every field has a command-line flag and a C ABI option.
struct Config {
  int ranks = 0;               ///< P, 1 … kMaxRanks; 0: the default (ranks_for)
  Split split = Split::Zigzag;
};

/// One rank's memory and arithmetic, as the ring loop sees it. The CPU ring (ring_cpu.cpp:
/// host buffers, stage 06) and the GPU ring (ring_gpu.cu: device buffers, stages 08 and 09)
/// implement it; the loop itself (ring_forward, ring_backward) is written once. Chunks are
/// named by their place in a shard: `a` is the a-th query chunk of this rank, `c` the c-th
/// chunk of the K/V shard in buffer `kv`, which came from rank `owner` (Plan::chunks_of).
class Rank {
 public:
  virtual ~Rank() = default;
  /// A cudaStream_t on which this rank's work is queued; nullptr on the CPU.
  virtual void* stream() = 0;
  /// Bytes of one element of K and V (4, or 2 for fp16/bf16).
  virtual size_t kv_elem_bytes() const = 0;

  // ---- forward
  /// K/V buffer 0 or 1: one holds the shard in hand, the other receives the next.
  virtual void* kv(int buffer) = 0;
  /// (O_a, L_a) ← merge((O_a, L_a), attention of query chunk a to key chunk c of K/V buffer
  /// `kv`), where `pair` is the problem of that pair (pair_problem).
  virtual void attend(int a, int kv, int owner, int c, const Problem& pair) = 0;

  // ---- backward (dK, dV accumulate in fp32 and travel with the ring)
  /// dK/dV buffer 0 or 1 (this step's sums, or the last step's, being sent), or kIncoming.
  virtual void* dkv(int buffer) = 0;
  static constexpr int kIncoming = 2;
  virtual void zero_dkv(int buffer) = 0;
  /// dkv(into) += dkv(kIncoming), over the elements of `owner`'s shard.
  virtual void add_incoming_dkv(int into, int owner) = 0;
  /// dQ_a += the pair's dQ; dK_c, dV_c of dkv(`dkv`) += the pair's dK, dV; from the global
  /// O_a and L_a, so each pair's gradients are exact parts of the whole (D = rowsum(dO∘O)).
  virtual void backward_pair(int a, int kv, int owner, int c, int dkv, const Problem& pair) = 0;
};

/// Runs one rank's forward ring: P steps; at step s the rank holds the K/V shard of rank
/// r − s, starts passing it on, attends its queries to it, and waits for the next shard.
/// Adds each step's score entries to `work` (row `rank`; may be null).
void ring_forward(const Plan& plan, int rank, Rank& r, Transport& kv_ring, Work* work);

/// Runs one rank's backward ring. K/V travel as in the forward; this rank's dQ stays home,
/// and the dK, dV sums of each shard travel one step behind their K, V, gathering every
/// rank's part; after P steps they arrive home. Returns the dkv buffer that holds the sums of
/// this rank's own shard.
int ring_backward(const Plan& plan, int rank, Rank& r, Transport& kv_ring, Transport& dkv_ring, Work* work);

/// Runs body(rank) for rank = 0 … P−1 on P threads and waits for all. If one throws, `abort`
/// is called (so ranks waiting on it give up) and the first failure is rethrown here.
void run_on_ranks(int ranks, const std::function<void(int rank)>& body, const std::function<void()>& abort);

/// The CPU ring: P threads, each a rank running stage 06 (one thread each) on its chunks,
/// exchanging shards by memcpy. Host fp32 buffers in the layouts of docs/design.md §3.
/// Throws std::invalid_argument for a bad problem, config or buffer before anything is
/// written. `work` (may be null) receives the score entries each rank computed per step.
void forward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V, float* O, float* L,
             Work* work = nullptr);
/// The CPU ring's backward: O and L are the forward's outputs; dQ, dK, dV are overwritten.
void backward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V, const float* O,
              const float* L, const float* dO, float* dQ, float* dK, float* dV, Work* work = nullptr);

/// The CPU ring for the driver, the tour, the tests and the C ABI (kStageName).
/// Options --ranks, --split (set_option "ranks", "split"); counters of the calling thread's
/// last run: "work_total", "work_busiest", "work_idlest", "work_critical" (score entries per
/// head), "efficiency_permille" (1000·total / (P·critical)).
StageInfo info();

}  // namespace fa::stage12
