// Stage 12 — ring attention: a sequence longer than one GPU holds, split across P ranks.
// Each rank keeps a slice of the queries; the key/value slices travel around a ring of ranks,
// and each rank merges the partial results of its queries against every slice by their
// log-sum-exp (merge.h), which is stage 05's online-softmax update applied to whole chunks.
//
// What changed from the single-device stages: nothing in the attention arithmetic. Every
// (query chunk, key chunk) pair is an ordinary attention call of an earlier stage (06 on the
// CPU, 08 and 09 on GPUs), full, causal on the diagonal, or skipped (ring_plan.h). What is new
// is where the data is: no rank ever holds more than two K/V shards, and the shards move
// while the ranks compute, so the communication hides behind the arithmetic (README).
//
// Forward, on rank r of P (this file: ring_forward):
//   O_r = 0, L_r = −∞;  in_hand = K/V shard of rank r
//   for s = 0 … P−1:
//     start sending in_hand to rank r+1 and receiving the next shard from rank r−1
//     for each query chunk a of rank r, key chunk c of the shard in hand (owner r − s):
//       (O_ac, L_ac) = attention(Q_a, K_c, V_c)          full, causal on the diagonal, or skipped
//       L_a, O_a ← log(e^{L_a} + e^{L_ac}),  e^{L_a − L}·O_a + e^{L_ac − L}·O_ac
//     wait for the exchange; in_hand = the shard received
// Backward (ring_backward): the same walk; each pair adds its exact share of dQ_a (kept home)
// and of dK_c, dV_c, whose sums follow their K, V one step behind and arrive home after P steps.
//
// Layout: the shards of ring_plan.h; the whole tensors in the layouts of docs/design.md §3.
// Transports: transport.h (threads) and ring_gpu.h (virtual ranks on one GPU, NCCL).
// Run: ./build/stages/12_ring_attention/stage12 --ranks 4 --split zigzag --causal --backward
//      ./build/stages/12_ring_attention/stage12_gpu --ranks 8 --dtype bf16 --causal --backward
#include "ring_attention.h"

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace fa::stage12 {

//! [ring forward]
void ring_forward(const Plan& plan, int rank, Rank& r, Transport& kv_ring, Work* work) {
  const int P = plan.ranks;
  const size_t es = r.kv_elem_bytes();
  int in_hand = 0;  // which K/V buffer holds the shard this step attends to
  for (int step = 0; step < P; ++step) {
    const int owner = kv_owner(rank, step, P);  // whose K/V is in hand
    const bool more = step + 1 < P;
    if (more)  // pass the shard on while computing with it: its next owner needs it next step
      kv_ring.start(r.kv(in_hand), size_t(plan.kv_shard_elems(owner)) * es, r.kv(1 - in_hand),
                    size_t(plan.kv_shard_elems(kv_owner(rank, step + 1, P))) * es, r.stream());
    const auto& mine = plan.chunks_of[size_t(rank)];
    const auto& theirs = plan.chunks_of[size_t(owner)];
    for (size_t a = 0; a < mine.size(); ++a)
      for (size_t c = 0; c < theirs.size(); ++c) {
        const Range q = plan.q_chunks[size_t(mine[a])], k = plan.k_chunks[size_t(theirs[c])];
        const PairKind kind = pair_kind(plan.problem, q, k);
        if (kind == PairKind::Skipped) continue;  // above the causal diagonal: no row sees these keys
        const Problem pair = pair_problem(plan.problem, q, k, kind);
        r.attend(int(a), in_hand, owner, int(c), pair);
        if (work) work->at[size_t(step)][size_t(rank)] += visible_entries(pair);
      }
    if (more) kv_ring.finish();
    in_hand = 1 - in_hand;
  }
}
//! [ring forward]

//! [ring backward]
int ring_backward(const Plan& plan, int rank, Rank& r, Transport& kv_ring, Transport& dkv_ring, Work* work) {
  const int P = plan.ranks;
  const size_t es = r.kv_elem_bytes();
  const auto dkv_bytes = [&](int owner) { return size_t(plan.kv_shard_elems(owner)) * sizeof(float); };
  int in_hand = 0;
  for (int step = 0; step < P; ++step) {
    const int owner = kv_owner(rank, step, P), next_owner = kv_owner(rank, step + 1, P);
    const bool more = step + 1 < P;
    if (more)
      kv_ring.start(r.kv(in_hand), size_t(plan.kv_shard_elems(owner)) * es, r.kv(1 - in_hand),
                    size_t(plan.kv_shard_elems(next_owner)) * es, r.stream());
    // This step's part of dK, dV of the shard in hand goes into a buffer of its own: the other
    // one may still be on its way to the next rank (sent last step).
    const int sums = step % 2;
    r.zero_dkv(sums);
    const auto& mine = plan.chunks_of[size_t(rank)];
    const auto& theirs = plan.chunks_of[size_t(owner)];
    for (size_t a = 0; a < mine.size(); ++a)
      for (size_t c = 0; c < theirs.size(); ++c) {
        const Range q = plan.q_chunks[size_t(mine[a])], k = plan.k_chunks[size_t(theirs[c])];
        const PairKind kind = pair_kind(plan.problem, q, k);
        if (kind == PairKind::Skipped) continue;
        const Problem pair = pair_problem(plan.problem, q, k, kind);
        r.backward_pair(int(a), in_hand, owner, int(c), sums, pair);
        if (work) work->at[size_t(step)][size_t(rank)] += visible_entries(pair);
      }
    if (P > 1) {
      // The sums of this shard from the ranks that held it before (rank r − 1 sent them at
      // the end of its last step) join ours, and the total moves on: after the last step the
      // next rank is the shard's owner, and the sums arrive home complete.
      if (step > 0) {
        dkv_ring.finish();
        r.add_incoming_dkv(sums, owner);
      }
      dkv_ring.start(r.dkv(sums), dkv_bytes(owner), r.dkv(Rank::kIncoming), dkv_bytes(next_owner), r.stream());
    }
    if (more) kv_ring.finish();
    in_hand = 1 - in_hand;
  }
  if (P == 1) return 0;  // one rank: its sums never left
  dkv_ring.finish();
  return Rank::kIncoming;
}
//! [ring backward]

void run_on_ranks(int ranks, const std::function<void(int rank)>& body, const std::function<void()>& abort) {
  std::mutex mutex;
  std::exception_ptr failure;  // the first rank that failed by itself
  std::exception_ptr echo;     // a RingAborted: a rank that stopped because another failed
  const auto run = [&](int rank) {
    try {
      body(rank);
    } catch (const RingAborted&) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!echo) echo = std::current_exception();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
      }
      abort();  // the others must not wait for this rank at the next exchange
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(ranks));
  try {
    for (int rank = 1; rank < ranks; ++rank) threads.emplace_back(run, rank);
  } catch (...) {  // no thread for a rank: stop the ranks that started, then report it
    abort();
    for (auto& t : threads) t.join();
    throw;
  }
  run(0);  // rank 0 runs on the calling thread
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  if (echo) std::rethrow_exception(echo);
}

}  // namespace fa::stage12
