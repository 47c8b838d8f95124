// Stage 12, the plan of the ring: the split, the kind of each chunk pair, and the work.
// See ring_plan.h for the contracts and ring_attention.cpp for the ring that follows it.
#include "ring_plan.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace fa::stage12 {

namespace {

// Chunks a split makes for P ranks: one per rank, two with zigzag (one with P = 1).
int chunk_count(int ranks, Split split) { return split == Split::Zigzag && ranks > 1 ? 2 * ranks : ranks; }

// Boundary c of n rows cut into `chunks` near-equal pieces: sizes differ by at most one.
int64_t even_boundary(int64_t n, int chunks, int c) { return n * c / chunks; }

// The most ranks that give every chunk at least one row of a sequence of n rows.
int64_t most_ranks(int64_t n, Split split) { return split == Split::Zigzag ? std::max<int64_t>(1, n / 2) : n; }

}  // namespace

const char* split_name(Split s) { return s == Split::Zigzag ? "zigzag" : "plain"; }

int ranks_for(const Problem& p, int requested, Split split) {
  if (requested != 0) return requested;
  int64_t P = 4;  // the default ring: four ranks, fewer for a short sequence
  if (p.seq_q > 0) P = std::min(P, most_ranks(p.seq_q, split));
  if (!p.causal && p.seq_k > 0) P = std::min(P, most_ranks(p.seq_k, split));
  return int(std::max<int64_t>(1, P));
}

//! [split]
Plan make_plan(const Problem& p, int ranks, Split split, const std::string& who) {
  const auto refuse = [&](const std::string& what) { throw std::invalid_argument(who + ": " + what); };
  if (ranks < 1 || ranks > kMaxRanks)
    refuse("ranks = " + std::to_string(ranks) + " is not allowed (P must be 1 to " + std::to_string(kMaxRanks) + ")");
  const int chunks = chunk_count(ranks, split);
  const auto too_short = [&](const char* seq, int64_t n) {
    refuse("ranks = " + std::to_string(ranks) + " with the " + split_name(split) + " split cuts " + seq + " = " +
           std::to_string(n) + " into " + std::to_string(chunks) + " chunks, but each chunk needs at least one row " +
           "(at most " + std::to_string(most_ranks(n, split)) + " ranks here)");
  };
  if (p.seq_q > 0 && chunks > p.seq_q) too_short("seq_q", p.seq_q);
  if (!p.causal && p.seq_k > 0 && chunks > p.seq_k) too_short("seq_k", p.seq_k);

  Plan plan;
  plan.problem = p;
  plan.ranks = ranks;
  plan.split = split;
  const int64_t shift = int64_t(p.seq_k) - p.seq_q;  // bottom-right: row i sees keys j ≤ i + shift
  for (int c = 0; c < chunks; ++c) {
    const Range q{even_boundary(p.seq_q, chunks, c), even_boundary(p.seq_q, chunks, c + 1)};
    Range k{even_boundary(p.seq_k, chunks, c), even_boundary(p.seq_k, chunks, c + 1)};
    if (p.causal) {  // a key chunk ends where its query chunk ends, moved by the shift
      const auto follow = [&](int64_t row) { return std::clamp<int64_t>(row + shift, 0, p.seq_k); };
      k = {c == 0 ? 0 : follow(q.begin), c == chunks - 1 ? p.seq_k : follow(q.end)};
    }
    plan.q_chunks.push_back(q);
    plan.k_chunks.push_back(k);
  }
  for (int r = 0; r < ranks; ++r)  // zigzag: one chunk from the front, its mirror from the back
    plan.chunks_of.push_back(chunks == ranks ? std::vector<int>{r} : std::vector<int>{r, chunks - 1 - r});
  return plan;
}
//! [split]

//! [pair kind]
PairKind pair_kind(const Problem& p, Range q, Range k) {
  if (q.empty() || k.empty()) return PairKind::Skipped;
  if (!p.causal) return PairKind::Full;
  // Rows see more keys as they go down: the last row sees the most, the first the fewest.
  if (p.visible_keys(q.end - 1) <= k.begin) return PairKind::Skipped;  // the last row sees none
  if (p.visible_keys(q.begin) >= k.end) return PairKind::Full;         // the first row sees all
  return PairKind::Diagonal;
}

Problem pair_problem(const Problem& p, Range q, Range k, PairKind kind) {
  Problem pair = p;
  pair.seq_q = int(q.size());
  pair.seq_k = int(k.size());
  pair.scale = p.softmax_scale();
  pair.causal = kind == PairKind::Diagonal;
  // The pair's bottom-right mask (local key j ≤ local row i + n_k − n_q) is the problem's
  // (global k.begin + j ≤ q.begin + i + N_k − N_q) exactly when both end on the same diagonal.
  if (pair.causal && k.end - q.end != int64_t(p.seq_k) - p.seq_q)
    throw std::logic_error(std::string(kStageName) + ": a diagonal pair whose mask is not the problem's (rows [" +
                           std::to_string(q.begin) + ", " + std::to_string(q.end) + "), keys [" +
                           std::to_string(k.begin) + ", " + std::to_string(k.end) + "))");
  return pair;
}
//! [pair kind]

int64_t visible_entries(const Problem& p) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.seq_q; ++i) n += p.visible_keys(i);
  return n;
}

// ---- Shard layout ----

int64_t Plan::q_shard_elems(int rank) const { return q_chunk_offset(rank, int(chunks_of[size_t(rank)].size())); }

int64_t Plan::q_chunk_offset(int rank, int i) const {
  int64_t rows = 0;
  for (int j = 0; j < i; ++j) rows += q_chunks[size_t(chunks_of[size_t(rank)][size_t(j)])].size();
  return int64_t(problem.batch) * problem.heads * rows * problem.head_dim;
}

int64_t Plan::kv_chunk_elems(int chunk) const {
  return int64_t(problem.batch) * problem.kv_heads * k_chunks[size_t(chunk)].size() * problem.head_dim;
}

int64_t Plan::kv_shard_elems(int owner) const { return kv_chunk_offset(owner, int(chunks_of[size_t(owner)].size())); }

int64_t Plan::kv_chunk_offset(int owner, int i) const {
  int64_t elems = 0;
  for (int j = 0; j < i; ++j) elems += 2 * kv_chunk_elems(chunks_of[size_t(owner)][size_t(j)]);
  return elems;
}

int64_t Plan::max_q_shard_elems() const {
  int64_t m = 0;
  for (int r = 0; r < ranks; ++r) m = std::max(m, q_shard_elems(r));
  return m;
}

int64_t Plan::max_kv_shard_elems() const {
  int64_t m = 0;
  for (int r = 0; r < ranks; ++r) m = std::max(m, kv_shard_elems(r));
  return m;
}

int64_t Plan::max_q_chunk_rows() const {
  int64_t m = 0;
  for (const Range& q : q_chunks) m = std::max(m, q.size());
  return m;
}

int64_t Plan::max_k_chunk_rows() const {
  int64_t m = 0;
  for (const Range& k : k_chunks) m = std::max(m, k.size());
  return m;
}

// ---- Work ----

int64_t Work::of_rank(int r) const {
  int64_t n = 0;
  for (const auto& step : at) n += step[size_t(r)];
  return n;
}

int64_t Work::total() const {
  int64_t n = 0;
  for (int r = 0; r < ranks(); ++r) n += of_rank(r);
  return n;
}

int64_t Work::busiest() const {
  int64_t m = 0;
  for (int r = 0; r < ranks(); ++r) m = std::max(m, of_rank(r));
  return m;
}

int64_t Work::idlest() const {
  if (ranks() == 0) return 0;
  int64_t m = of_rank(0);
  for (int r = 1; r < ranks(); ++r) m = std::min(m, of_rank(r));
  return m;
}

int64_t Work::critical() const {
  int64_t n = 0;
  for (const auto& step : at) n += *std::max_element(step.begin(), step.end());
  return n;
}

double Work::efficiency() const {
  const int64_t c = critical();
  return c == 0 ? 1.0 : double(total()) / (double(ranks()) * double(c));
}

Work predicted_work(const Plan& plan) {
  Work w(plan.ranks);
  for (int s = 0; s < plan.ranks; ++s)
    for (int r = 0; r < plan.ranks; ++r)
      for (int a : plan.chunks_of[size_t(r)])
        for (int c : plan.chunks_of[size_t(kv_owner(r, s, plan.ranks))]) {
          const PairKind kind = pair_kind(plan.problem, plan.q_chunks[size_t(a)], plan.k_chunks[size_t(c)]);
          if (kind != PairKind::Skipped)
            w.at[size_t(s)][size_t(r)] +=
                visible_entries(pair_problem(plan.problem, plan.q_chunks[size_t(a)], plan.k_chunks[size_t(c)], kind));
        }
  return w;
}

}  // namespace fa::stage12
