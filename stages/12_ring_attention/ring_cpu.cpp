// Stage 12, the CPU ring: P threads, each a rank with its own host buffers, each running
// stage 06 (one thread) on its chunk pairs, the shards passed by memcpy (transport.h). It runs
// the ring loop of ring_attention.cpp exactly as the GPUs do, in fp32, on any machine, so the
// split, the schedule, the merge and the travelling gradients are tested in CI.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "merge.h"
#include "ring_attention.h"
#include "tensors.h"
#include "tiled_cpu.h"

namespace fa::stage12 {

namespace {


// A whole tensor is `slices` slices (batch × heads) of `rows` rows of `width` floats; a chunk
// holds rows [row0, row0 + n) of every slice, densely. gather: whole → chunk; scatter: back.
void gather_rows(const float* whole, float* chunk, int64_t slices, int64_t rows, int64_t row0, int64_t n,
                 int64_t width) {
  for (int64_t s = 0; s < slices; ++s) std::copy_n(whole + (s * rows + row0) * width, n * width, chunk + s * n * width);
}
void scatter_rows(const float* chunk, float* whole, int64_t slices, int64_t rows, int64_t row0, int64_t n,
                  int64_t width) {
  for (int64_t s = 0; s < slices; ++s) std::copy_n(chunk + s * n * width, n * width, whole + (s * rows + row0) * width);
}

// One rank of the CPU ring: its shards (ring_plan.h) and stage 06 on its chunk pairs.
class CpuRank final : public Rank {
 public:
  CpuRank(const Plan& plan, int rank, bool backward) : plan_(plan), p_(plan.problem), rank_(rank) {
    const auto buffer = [&](int64_t elems, const char* what) {
      return allocate(elems, std::string(kStageName) + ": rank " + std::to_string(rank) + " " + what);
    };
    const int64_t q = plan.q_shard_elems(rank), l = q / p_.head_dim, kv = plan.max_kv_shard_elems();
    const int64_t q_chunk = int64_t(p_.batch) * p_.heads * plan.max_q_chunk_rows() * p_.head_dim;
    const int64_t k_chunk = int64_t(p_.batch) * p_.kv_heads * plan.max_k_chunk_rows() * p_.head_dim;
    Q_ = buffer(q, "Q shard");
    kv_[0] = buffer(kv, "K/V shard");
    kv_[1] = buffer(kv, "K/V shard");
    O_ = buffer(q, "O shard");  // forward: the running merge; backward: the forward's O
    L_ = buffer(l, "L shard");
    if (!backward) {
      O_part_ = buffer(q_chunk, "O of a pair");
      L_part_ = buffer(q_chunk / p_.head_dim, "L of a pair");
      std::fill(O_.begin(), O_.end(), 0.0f);  // the merge's identity: O = 0, L = −∞ (no key yet)
      std::fill(L_.begin(), L_.end(), -INFINITY);
      return;
    }
    dO_ = buffer(q, "dO shard");
    dQ_ = buffer(q, "dQ shard");
    std::fill(dQ_.begin(), dQ_.end(), 0.0f);
    for (auto& b : dkv_) b = buffer(kv, "dK/dV shard");
    dQ_part_ = buffer(q_chunk, "dQ of a pair");
    dK_part_ = buffer(k_chunk, "dK of a pair");
    dV_part_ = buffer(k_chunk, "dV of a pair");
  }

  void* stream() override { return nullptr; }
  size_t kv_elem_bytes() const override { return sizeof(float); }
  void* kv(int buffer) override { return kv_[buffer].data(); }
  void* dkv(int buffer) override { return dkv_[buffer].data(); }

  // ---- this rank's rows of the whole tensors (`width`: d for Q-shaped tensors, 1 for L)
  void load_queries(const float* whole, std::vector<float>& shard, int64_t width) const {
    for (size_t i = 0; i < plan_.chunks_of[size_t(rank_)].size(); ++i) {
      const Range q = query_chunk(i);
      gather_rows(whole, shard.data() + q_offset(int(i), width), slices(), p_.seq_q, q.begin, q.size(), width);
    }
  }
  void store_queries(const std::vector<float>& shard, float* whole, int64_t width) const {
    for (size_t i = 0; i < plan_.chunks_of[size_t(rank_)].size(); ++i) {
      const Range q = query_chunk(i);
      scatter_rows(shard.data() + q_offset(int(i), width), whole, slices(), p_.seq_q, q.begin, q.size(), width);
    }
  }
  void load_keys(const float* K, const float* V) {  // this rank's own K/V shard, into buffer 0
    const int64_t kv_slices = int64_t(p_.batch) * p_.kv_heads;
    for (size_t i = 0; i < plan_.chunks_of[size_t(rank_)].size(); ++i) {
      const Range k = plan_.k_chunks[size_t(plan_.chunks_of[size_t(rank_)][i])];
      gather_rows(K, kv_[0].data() + k_offset(rank_, int(i)), kv_slices, p_.seq_k, k.begin, k.size(), p_.head_dim);
      gather_rows(V, kv_[0].data() + v_offset(rank_, int(i)), kv_slices, p_.seq_k, k.begin, k.size(), p_.head_dim);
    }
  }
  void store_keys(int buffer, float* dK, float* dV) const {  // the complete dK, dV of its own shard
    const int64_t kv_slices = int64_t(p_.batch) * p_.kv_heads;
    for (size_t i = 0; i < plan_.chunks_of[size_t(rank_)].size(); ++i) {
      const Range k = plan_.k_chunks[size_t(plan_.chunks_of[size_t(rank_)][i])];
      const float* sums = dkv_[buffer].data();
      scatter_rows(sums + k_offset(rank_, int(i)), dK, kv_slices, p_.seq_k, k.begin, k.size(), p_.head_dim);
      scatter_rows(sums + v_offset(rank_, int(i)), dV, kv_slices, p_.seq_k, k.begin, k.size(), p_.head_dim);
    }
  }

  void attend(int a, int kv, int owner, int c, const Problem& pair) override {
    const int64_t rows = int64_t(pair.batch) * pair.heads * pair.seq_q, d = pair.head_dim;
    float* O_a = O_.data() + q_offset(a, d);
    float* L_a = L_.data() + q_offset(a, 1);
    stage06::forward(pair, stage06::Config{}, Q_.data() + q_offset(a, d), K_of(kv, owner, c),
                     V_of(kv, owner, c), O_part_.data(), L_part_.data());
    //! [cpu merge]
    // LAB BEGIN: merge a partial result — hint: per row i: w = merge_weights(L_a[i], L_part_[i]); O_a row ← w.w_acc·O_a row + w.w_part·O_part_ row; L_a[i] ← w.L
    for (int64_t i = 0; i < rows; ++i) {  // one (batch, head, row) at a time
      const MergeWeights w = merge_weights(L_a[i], L_part_[size_t(i)]);
      for (int64_t x = 0; x < d; ++x)  // O = e^{L_a − L}·O_a + e^{L_part − L}·O_part
        O_a[i * d + x] = w.w_acc * O_a[i * d + x] + w.w_part * O_part_[size_t(i * d + x)];
      L_a[i] = w.L;  // L = log(e^{L_a} + e^{L_part})
    }
    // LAB END
    //! [cpu merge]
  }

  void zero_dkv(int buffer) override { std::fill(dkv_[buffer].begin(), dkv_[buffer].end(), 0.0f); }

  void add_incoming_dkv(int into, int owner) override {
    const int64_t n = plan_.kv_shard_elems(owner);
    for (int64_t i = 0; i < n; ++i) dkv_[into][size_t(i)] += dkv_[kIncoming][size_t(i)];
  }

  void backward_pair(int a, int kv, int owner, int c, int dkv, const Problem& pair) override {
    const int64_t q_off = q_offset(a, pair.head_dim), l_off = q_offset(a, 1);
    // The whole problem's O and L for these rows: the pair's P = e^{S − L} and D = rowsum(dO∘O)
    // are then the whole problem's, and its gradients are exact parts of the whole.
    stage06::backward(pair, stage06::Config{}, Q_.data() + q_off, K_of(kv, owner, c), V_of(kv, owner, c),
                      O_.data() + q_off, L_.data() + l_off, dO_.data() + q_off, dQ_part_.data(), dK_part_.data(),
                      dV_part_.data());
    add(dQ_.data() + q_off, dQ_part_.data(), pair.q_elems());  // dQ_a += the pair's dQ
    add(dkv_[dkv].data() + k_offset(owner, c), dK_part_.data(), pair.kv_elems());  // dK_c += the pair's dK
    add(dkv_[dkv].data() + v_offset(owner, c), dV_part_.data(), pair.kv_elems());  // dV_c += the pair's dV
  }

  std::vector<float> Q_, O_, L_, dO_, dQ_;  // this rank's query shards

 private:
  int64_t slices() const { return int64_t(p_.batch) * p_.heads; }
  Range query_chunk(size_t i) const { return plan_.q_chunks[size_t(plan_.chunks_of[size_t(rank_)][i])]; }
  // Offset of this rank's i-th query chunk in a shard of rows `width` wide (d, or 1 for L).
  int64_t q_offset(int i, int64_t width) const { return plan_.q_chunk_offset(rank_, i) / p_.head_dim * width; }
  // Offsets of K and V of `owner`'s c-th chunk in a K/V (or dK/dV) shard.
  int64_t k_offset(int owner, int c) const { return plan_.kv_chunk_offset(owner, c); }
  int64_t v_offset(int owner, int c) const {
    return k_offset(owner, c) + plan_.kv_chunk_elems(plan_.chunks_of[size_t(owner)][size_t(c)]);
  }
  const float* K_of(int kv, int owner, int c) const { return kv_[kv].data() + k_offset(owner, c); }
  const float* V_of(int kv, int owner, int c) const { return kv_[kv].data() + v_offset(owner, c); }
  static void add(float* into, const float* part, int64_t n) {
    for (int64_t i = 0; i < n; ++i) into[i] += part[i];
  }

  const Plan& plan_;
  const Problem& p_;
  int rank_;
  std::vector<float> kv_[2], dkv_[3];
  std::vector<float> O_part_, L_part_, dQ_part_, dK_part_, dV_part_;  // one pair's result
};

// The plan of a call, after every refusal: nothing has been written when this throws.
Plan checked_plan(const Problem& p, const Config& c) {
  p.validate(kStageName);
  if (c.split != Split::Zigzag && c.split != Split::Plain)
    throw std::invalid_argument(std::string(kStageName) + ": split = " + std::to_string(int(c.split)) +
                                " is not zigzag (0) or plain (1)");
  return make_plan(p, ranks_for(p, c.ranks, c.split), c.split, kStageName);
}

// Every rank's buffers, allocated before any thread starts (a refusal for memory comes first).
std::vector<std::unique_ptr<CpuRank>> make_ranks(const Plan& plan, bool backward) {
  std::vector<std::unique_ptr<CpuRank>> ranks;
  for (int r = 0; r < plan.ranks; ++r) ranks.push_back(std::make_unique<CpuRank>(plan, r, backward));
  return ranks;
}

}  // namespace

void forward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V, float* O, float* L,
             Work* work) {
  const Plan plan = checked_plan(p, c);
  require_forward_buffers(kStageName, p, Q, K, V, O, L);
  auto ranks = make_ranks(plan, false);
  if (work) *work = Work(plan.ranks);
  ThreadRing kv_ring(plan.ranks);
  run_on_ranks(
      plan.ranks,
      [&](int rank) {
        CpuRank& r = *ranks[size_t(rank)];
        r.load_queries(Q, r.Q_, p.head_dim);
        r.load_keys(K, V);
        ring_forward(plan, rank, r, kv_ring.endpoint(rank), work);
        r.store_queries(r.O_, O, p.head_dim);
        r.store_queries(r.L_, L, 1);
      },
      [&] { kv_ring.abort(); });
}

void backward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V, const float* O,
              const float* L, const float* dO, float* dQ, float* dK, float* dV, Work* work) {
  const Plan plan = checked_plan(p, c);
  require_backward_buffers(kStageName, p, Q, K, V, O, L, dO, dQ, dK, dV);
  auto ranks = make_ranks(plan, true);
  if (work) *work = Work(plan.ranks);
  ThreadRing kv_ring(plan.ranks), dkv_ring(plan.ranks);
  run_on_ranks(
      plan.ranks,
      [&](int rank) {
        CpuRank& r = *ranks[size_t(rank)];
        r.load_queries(Q, r.Q_, p.head_dim);
        r.load_queries(O, r.O_, p.head_dim);
        r.load_queries(L, r.L_, 1);
        r.load_queries(dO, r.dO_, p.head_dim);
        r.load_keys(K, V);
        const int sums = ring_backward(plan, rank, r, kv_ring.endpoint(rank), dkv_ring.endpoint(rank), work);
        r.store_queries(r.dQ_, dQ, p.head_dim);
        r.store_keys(sums, dK, dV);
      },
      [&] {
        kv_ring.abort();
        dkv_ring.abort();
      });
}

}  // namespace fa::stage12
