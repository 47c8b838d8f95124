/// \file ring_plan.h
/// \brief Stage 12: how a sequence is cut across P ranks (plain and zigzag splits), which
/// chunk pairs a rank computes at each step of the ring (full, diagonal or skipped), and
/// how much work that is per rank and per step.
///
/// Plain C++ with no device code: the CPU ring, the GPU ring and the tests share it, so the
/// split, the schedule and the load balance are tested on every machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

namespace fa::stage12 {

/// The stage's two names (StageInfo::name): the CPU ring's, which is the folder's, and the
/// GPU ring's. Each is its option table's name and the first word of its refusals.
inline constexpr const char* kStageName = "12_ring_attention";
inline constexpr const char* kGpuStageName = "12_ring_attention_gpu";

/// How the rows are dealt to the ranks.
///  - Zigzag: 2P chunks; rank r holds chunks r and 2P−1−r (one early, one late: under a
///    causal mask every rank then does the same work at every step).
///  - Plain: P chunks; rank r holds chunk r (the last rank does most of the causal work).
/// With P = 1 both are one chunk.
enum class Split { Zigzag = 0, Plain = 1 };
/// "zigzag", "plain".
const char* split_name(Split s);

/// The most ranks a ring may have (GPUs of a node, or virtual ranks; each rank is a thread).
inline constexpr int kMaxRanks = 64;

/// A half-open range of rows [begin, end) of the whole sequence.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

/// What one pair (query chunk, key chunk) needs under the mask.
///  - Skipped: no row of the query chunk sees a key of the key chunk (or one is empty).
///  - Full: every row sees every key: attention without a mask.
///  - Diagonal: the mask's diagonal crosses the pair; the pair's own bottom-right causal mask
///    is exactly the problem's mask there (the split makes sure of it, ring_plan.cpp).
enum class PairKind { Skipped, Full, Diagonal };

/// The cut of one problem across the ranks.
///
/// Layout of a rank's shards (what its memory holds and what travels): its chunks one after
/// the other, each chunk a dense tensor in the layouts of docs/design.md §3 with the chunk's
/// rows as its sequence: Q, O, dO, dQ shards are [chunk][batch][heads][n_chunk][d], L shards
/// [chunk][batch][heads][n_chunk], and a K/V shard (the message of the ring) is
/// [chunk][K then V][batch][kv_heads][n_chunk][d]; the dK/dV shard has the K/V shard's layout.
struct Plan {
  Problem problem;  ///< the whole problem
  int ranks = 1;    ///< P
  Split split = Split::Zigzag;
  std::vector<Range> q_chunks;  ///< rows of Q (and O, L, dO, dQ) of each chunk, in sequence order
  std::vector<Range> k_chunks;  ///< rows of K (and V, dK, dV) of each chunk, in sequence order
  std::vector<std::vector<int>> chunks_of;  ///< [rank] the chunks it holds, in shard order

  /// Elements of one Q-shaped tensor of `rank`'s shard (Q, O, dO, dQ); L shards have q_shard_elems / d.
  int64_t q_shard_elems(int rank) const;
  /// Offset (elements) of the i-th chunk of `rank` in a Q-shaped shard.
  int64_t q_chunk_offset(int rank, int i) const;
  /// Elements of `owner`'s K/V shard (K and V of every chunk: the ring's message).
  int64_t kv_shard_elems(int owner) const;
  /// Offset (elements) of K of the i-th chunk of `owner` in its K/V shard; V follows K.
  int64_t kv_chunk_offset(int owner, int i) const;
  /// Elements of K (= of V) of one key chunk.
  int64_t kv_chunk_elems(int chunk) const;
  /// The largest shards and chunks over all ranks (buffer sizes).
  int64_t max_q_shard_elems() const;
  int64_t max_kv_shard_elems() const;
  int64_t max_q_chunk_rows() const;
  int64_t max_k_chunk_rows() const;
};

/// The ranks a call runs with: `requested`, or for 0 the default: 4, or as many as the
/// sequence allows (at least 1).
int ranks_for(const Problem& p, int requested, Split split);

/// Cuts `p` across `ranks` ranks. Query rows are split as evenly as possible into P chunks
/// (plain) or 2P chunks (zigzag). Keys: without a mask the same way; with the causal mask a
/// key chunk ends where its query chunk ends, moved by N_k − N_q (so the mask's diagonal runs
/// through the corners of the pairs (c, c), and every pair is full, diagonal or skipped).
/// Throws std::invalid_argument naming `who` for ranks outside 1 … kMaxRanks, or more chunks
/// than query rows (or, without a mask, keys): each rank must hold at least one row of each.
/// Empty sequences are the exception: there is nothing to cut, and every chunk is empty.
Plan make_plan(const Problem& p, int ranks, Split split, const std::string& who);

/// At step s of the ring, rank r holds the K/V shard of rank (r − s) mod P.
inline int kv_owner(int rank, int step, int ranks) { return ((rank - step) % ranks + ranks) % ranks; }

/// Full, diagonal or skipped, for query rows `q` against keys `k` of `p`.
PairKind pair_kind(const Problem& p, Range q, Range k);

/// The problem a kernel solves for one pair: the chunks' lengths, the causal mask only on a
/// diagonal pair, the whole problem's scale. Throws std::logic_error for a diagonal pair whose
/// own mask would differ from the problem's (a split that breaks the rule above).
Problem pair_problem(const Problem& p, Range q, Range k, PairKind kind);

/// Score entries (query row, key) a problem's mask lets through, per batch and head:
/// Σ_i visible_keys(i). This is the work of one attention call, in units of QKᵀ entries.
int64_t visible_entries(const Problem& p);

/// Work per step and rank: at[s][r] = score entries rank r computes at step s (one head).
struct Work {
  std::vector<std::vector<int64_t>> at;

  explicit Work(int ranks = 0) : at(size_t(ranks), std::vector<int64_t>(size_t(ranks), 0)) {}
  int ranks() const { return int(at.size()); }
  int64_t of_rank(int r) const;  ///< Σ over steps
  int64_t total() const;         ///< Σ over ranks and steps
  int64_t busiest() const;       ///< max over ranks of of_rank
  int64_t idlest() const;        ///< min over ranks of of_rank
  /// Σ over steps of the busiest rank's work at that step: the ring waits for the slowest
  /// rank at every step, so this is its time in units of score entries.
  int64_t critical() const;
  /// total / (P · critical): 1 when every rank does the same work at every step.
  double efficiency() const;
  /// efficiency() in thousandths, rounded (a counter of the stage).
  int64_t efficiency_permille() const { return int64_t(1000.0 * efficiency() + 0.5); }
};

/// The work the ring does for `plan`, from the plan's pairs (what ring_forward counts).
Work predicted_work(const Plan& plan);

}  // namespace fa::stage12
