#include "decode_problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "tensors.h"

namespace fa {

int DecodeProblem::max_seqlen() const {
  int m = 0;
  for (int len : cache_seqlens) m = std::max(m, len);
  return m;
}

DecodeProblem DecodeProblem::sequences(std::vector<int> lens, int heads, int kv_heads, int q_len, int head_dim) {
  DecodeProblem p;
  p.batch = int(lens.size());
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.q_len = q_len;
  p.head_dim = head_dim;
  p.cache_seqlens = std::move(lens);
  p.size_cache();
  return p;
}

void DecodeProblem::size_cache(int spare_per_seq, int spare_blocks) {
  if (paged()) {
    blocks_per_seq = std::max(1, (max_seqlen() + block_size - 1) / block_size) + spare_per_seq;
    num_blocks = batch * blocks_per_seq + spare_blocks;
  } else if (capacity == 0) {
    capacity = std::max(1, max_seqlen());
  }
}

DecodeProblem DecodeProblem::in_blocks(int block_size_, int spare_per_seq, int spare_blocks) const {
  DecodeProblem p = *this;
  p.capacity = 0;
  p.block_size = block_size_;
  p.size_cache(spare_per_seq, spare_blocks);
  return p;
}

void DecodeProblem::validate_append(const std::string& who) const {
  for (int b = 0; b < batch; ++b)
    if (cache_seqlens[size_t(b)] < q_len)
      throw std::invalid_argument(who + ": cache_seqlens[" + std::to_string(b) + "] = " +
                                  std::to_string(cache_seqlens[size_t(b)]) + " is not allowed (allowed: q_len = " +
                                  std::to_string(q_len) + " or more: the lengths count the new tokens)");
}

float DecodeProblem::softmax_scale() const { return scale != 0.0f ? scale : 1.0f / std::sqrt(float(head_dim)); }

void DecodeProblem::validate(const std::string& who) const {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(who + ": " + what); };
  auto in_range = [&](const char* name, int64_t value, int64_t lo, int64_t hi, const char* why) {
    if (value < lo || value > hi)
      fail(std::string(name) + " = " + std::to_string(value) + " is not allowed (allowed: " + std::to_string(lo) +
           " to " + std::to_string(hi) + (why[0] ? std::string(", ") + why : "") + ")");
  };
  const int kInt = std::numeric_limits<int>::max();
  in_range("batch", batch, 1, kInt, "");
  in_range("heads", heads, 1, kInt, "");
  in_range("kv_heads", kv_heads, 1, kInt, "");
  in_range("head_dim", head_dim, 1, kInt, "");
  in_range("q_len", q_len, 1, kMaxDecodeQLen, "new tokens per sequence in one decode step");
  if (heads % kv_heads != 0)
    fail("heads = " + std::to_string(heads) + " is not a multiple of kv_heads = " + std::to_string(kv_heads) +
         " (grouped-query attention needs heads % kv_heads == 0)");
  if (cache_seqlens.size() != size_t(batch))
    fail("cache_seqlens holds " + std::to_string(cache_seqlens.size()) + " lengths for batch = " +
         std::to_string(batch) + " (one length per sequence is needed)");
  if (paged()) {
    if (block_size < 16 || block_size > 256 || (block_size & (block_size - 1)) != 0)
      fail("block_size = " + std::to_string(block_size) + " is not allowed (allowed: 16, 32, 64, 128, 256)");
    in_range("num_blocks", num_blocks, 1, kInt, "blocks in the paged cache's pool");
    in_range("blocks_per_seq", blocks_per_seq, 1, kInt, "width of the block table");
    if (capacity != 0)
      fail("capacity = " + std::to_string(capacity) +
           " is set with a paged cache (block_size > 0); a paged sequence holds blocks_per_seq x block_size tokens");
  } else {
    in_range("block_size", block_size, 0, 0, "0 is a contiguous cache; a paged one takes 16 to 256");
    in_range("capacity", capacity, 0, kInt, "tokens each sequence's contiguous cache has room for");
  }
  for (int b = 0; b < batch; ++b) {
    const int64_t len = cache_seqlens[size_t(b)];
    if (len < 0 || len > seq_capacity())
      fail("cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(len) + " is not allowed (allowed: 0 to " +
           std::to_string(seq_capacity()) + ", the cache's capacity per sequence" +
           (paged() ? " = blocks_per_seq x block_size" : "") + ")");
  }
  // Every tensor's fp32 size in bytes must fit in int64_t (offsets are 64-bit).
  const auto fits = [&](const char* tensor, std::initializer_list<int64_t> sizes) {
    double elems = 1;
    for (int64_t n : sizes) elems *= double(n);
    if (elems * 4 > double(kMaxTensorElems) * 4)
      fail(std::string(tensor) + " would hold " + std::to_string(elems) + " elements; at most " +
           std::to_string(kMaxTensorElems) + " are allowed");
  };
  fits("Q", {batch, heads, q_len, head_dim});
  fits("the K cache", paged() ? std::initializer_list<int64_t>{num_blocks, kv_heads, block_size, head_dim}
                             : std::initializer_list<int64_t>{batch, kv_heads, capacity, head_dim});
  fits("the block table", {batch, blocks_per_seq});
}

void DecodeProblem::validate_block_table(const int* table, const std::string& who) const {
  if (!paged()) return;
  if (table == nullptr) throw std::invalid_argument(who + ": a paged cache (block_size > 0) needs a block table");
  for (int b = 0; b < batch; ++b) {
    const int64_t used = (int64_t(cache_seqlens[size_t(b)]) + block_size - 1) / block_size;
    for (int64_t k = 0; k < used; ++k) {
      const int entry = table[int64_t(b) * blocks_per_seq + k];
      if (entry < 0 || entry >= num_blocks)
        throw std::invalid_argument(who + ": block_table[" + std::to_string(b) + "][" + std::to_string(k) +
                                    "] = " + std::to_string(entry) + " is not allowed (allowed: 0 to " +
                                    std::to_string(num_blocks - 1) + ", the blocks of the pool; sequence " +
                                    std::to_string(b) + " holds " + std::to_string(cache_seqlens[size_t(b)]) +
                                    " tokens in its first " + std::to_string(used) + " blocks)");
    }
  }
}

Problem DecodeProblem::as_problem(int b) const {
  Problem p;
  p.batch = 1;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.seq_q = q_len;
  p.seq_k = cache_seqlens[size_t(b)];
  p.head_dim = head_dim;
  p.causal = causal;
  p.scale = scale;
  return p;
}

double DecodeProblem::kv_bytes(int element_bytes) const {
  double tokens = 0;
  for (int len : cache_seqlens) tokens += len;
  return 2.0 * tokens * kv_heads * head_dim * element_bytes;
}

std::string DecodeProblem::describe() const {
  std::ostringstream s;
  s << "batch=" << batch << " heads=" << heads << " kv_heads=" << kv_heads << " d=" << head_dim
    << " q_len=" << q_len << (causal ? "" : " non-causal") << " lens=[";
  const size_t shown = std::min<size_t>(cache_seqlens.size(), 8);
  for (size_t b = 0; b < shown; ++b) s << (b ? "," : "") << cache_seqlens[b];
  if (shown < cache_seqlens.size()) s << ",… (" << cache_seqlens.size() << ")";
  s << "]";
  if (paged())
    s << " paged(block " << block_size << ", " << num_blocks << " blocks)";
  else
    s << " capacity=" << capacity;
  return s.str();
}

DecodeTensors DecodeTensors::make(const DecodeProblem& p, uint64_t seed) {
  p.validate("inputs");
  const double floats = 2.0 * double(p.q_elems()) + 2.0 * double(p.cache_elems()) + 2.0 * double(p.new_kv_elems()) +
                        double(p.l_elems());
  require_fits_in_memory(4.0 * floats, "the decode problem's host tensors (" + p.describe() + ")");
  DecodeTensors t;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto filled = [&](int64_t n, const char* what) {
    std::vector<float> x = allocate(n, what);
    for (float& v : x) v = normal(rng);
    return x;
  };
  t.Q = filled(p.q_elems(), "Q");
  t.K_cache = filled(p.cache_elems(), "K cache");
  t.V_cache = filled(p.cache_elems(), "V cache");
  t.K_new = filled(p.new_kv_elems(), "K new");
  t.V_new = filled(p.new_kv_elems(), "V new");
  if (p.paged()) {
    // Each sequence takes the blocks it needs from a shuffled pool, so that neighbouring
    // tokens of a sequence lie in scattered blocks, as they do after many sequences came and went.
    std::vector<int> pool(size_t(p.num_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    t.block_table.assign(size_t(p.table_elems()), -1);
    size_t next = 0;
    for (int b = 0; b < p.batch; ++b) {
      const int64_t used = (int64_t(p.cache_seqlens[size_t(b)]) + p.block_size - 1) / p.block_size;
      for (int64_t k = 0; k < used; ++k) {
        if (next == pool.size())
          throw std::invalid_argument("inputs: num_blocks = " + std::to_string(p.num_blocks) +
                                      " is too few for the sequences' lengths (" + p.describe() + ")");
        t.block_table[size_t(int64_t(b) * p.blocks_per_seq + k)] = pool[next++];
      }
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  t.O.assign(size_t(p.q_elems()), nan);
  t.L.assign(size_t(p.l_elems()), nan);
  return t;
}

void append_kv_host(const DecodeProblem& p, const float* K_new, const float* V_new, float* K_cache,
                    float* V_cache, const int* table) {
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int i = 0; i < p.q_len; ++i) {
        const int64_t j = int64_t(p.cache_seqlens[size_t(b)]) - p.q_len + i;  // position of new token i
        const int64_t to = p.cache_offset(table, b, hk, j), from = p.new_kv_offset(b, hk, i);
        std::copy(K_new + from, K_new + from + p.head_dim, K_cache + to);
        std::copy(V_new + from, V_new + from + p.head_dim, V_cache + to);
      }
}

}  // namespace fa
