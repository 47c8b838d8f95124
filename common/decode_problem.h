/// \file decode_problem.h
/// \brief The decoding problem (stage 14): a few new query tokens per sequence against each
/// sequence's KV cache, with per-sequence cache lengths and an optional paged cache.
///
/// Why not `Problem`: decoding has one length per sequence (`cache_seqlens`), a cache whose
/// capacity is larger than what it holds, and possibly a paged layout with a block table.
/// With one sequence it *is* a `Problem` (seq_q = q_len, seq_k = cache length, bottom-right
/// causal), which is how the reference is computed (`as_problem`).
///
/// Layouts (docs/design.md §12):
///   Q, O        [batch][heads][q_len][d]        the new tokens' queries and outputs
///   L           [batch][heads][q_len]           log-sum-exp of each output row (fp32)
///   K/V new     [batch][kv_heads][q_len][d]     the new tokens' keys and values (append)
///   contiguous  K/V cache [batch][kv_heads][capacity][d]
///   paged       K/V cache [num_blocks][kv_heads][block_size][d] and a block table
///               [batch][blocks_per_seq] (int32): token j of sequence b lies in pool block
///               table[b][j / block_size], at row j % block_size.
/// The new tokens are the last q_len positions of each sequence: query i of sequence b sees
/// keys j <= cache_seqlens[b] − q_len + i (causal) or every key j < cache_seqlens[b].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

namespace fa {

/// The most new tokens per sequence a decode step takes (speculative decoding's drafts).
inline constexpr int kMaxDecodeQLen = 16;

struct DecodeProblem {
  int batch = 1;
  int heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int q_len = 1;        ///< new tokens per sequence, 1 … kMaxDecodeQLen
  bool causal = true;   ///< causal among the new tokens (they all see the older cache)
  float scale = 0.0f;   ///< 0 means 1/sqrt(head_dim)
  std::vector<int> cache_seqlens;  ///< [batch] tokens in each sequence's cache, the new ones included

  int capacity = 0;        ///< contiguous cache: tokens each sequence has room for
  int block_size = 0;      ///< paged cache: tokens per block (16 … 256, a power of two); 0 = contiguous
  int num_blocks = 0;      ///< paged cache: blocks in the pool
  int blocks_per_seq = 0;  ///< paged cache: width of the block table

  bool paged() const { return block_size > 0; }
  /// The most tokens one sequence can hold: capacity, or blocks_per_seq · block_size.
  int64_t seq_capacity() const { return paged() ? int64_t(blocks_per_seq) * block_size : capacity; }
  int max_seqlen() const;

  /// Sequences of lengths `lens` (batch = lens.size()) in a contiguous cache sized to the
  /// longest (size_cache), causal among the new tokens.
  static DecodeProblem sequences(std::vector<int> lens, int heads, int kv_heads, int q_len, int head_dim);
  /// Sizes the cache for the lengths. Paged: blocks_per_seq blocks for the longest sequence (at
  /// least 1) plus `spare_per_seq`, and a pool of batch × blocks_per_seq plus `spare_blocks`.
  /// Contiguous, where capacity is 0: the longest length (at least 1).
  void size_cache(int spare_per_seq = 0, int spare_blocks = 0);
  /// The same sequences in a paged cache of `block_size`, sized by size_cache.
  DecodeProblem in_blocks(int block_size, int spare_per_seq = 0, int spare_blocks = 0) const;
  int group_size() const { return heads / kv_heads; }
  int kv_head_of(int h) const { return h / group_size(); }

  /// Keys query token i (0 … q_len−1) of sequence b sees: the first visible_keys(b, i).
  int64_t visible_keys(int b, int i) const {
    const int64_t len = cache_seqlens[size_t(b)];
    if (!causal) return len;
    const int64_t end = len - q_len + i + 1;
    return end < 0 ? 0 : end;
  }

  int64_t q_elems() const { return int64_t(batch) * heads * q_len * head_dim; }
  int64_t l_elems() const { return int64_t(batch) * heads * q_len; }
  int64_t new_kv_elems() const { return int64_t(batch) * kv_heads * q_len * head_dim; }
  /// Elements of one cache tensor (K or V).
  int64_t cache_elems() const {
    return paged() ? int64_t(num_blocks) * kv_heads * block_size * head_dim
                   : int64_t(batch) * kv_heads * capacity * head_dim;
  }
  int64_t table_elems() const { return paged() ? int64_t(batch) * blocks_per_seq : 0; }

  int64_t q_offset(int b, int h, int i) const { return ((int64_t(b) * heads + h) * q_len + i) * head_dim; }
  int64_t l_offset(int b, int h, int i) const { return (int64_t(b) * heads + h) * q_len + i; }
  int64_t new_kv_offset(int b, int hk, int i) const {
    return ((int64_t(b) * kv_heads + hk) * q_len + i) * head_dim;
  }
  /// Offset of token j of KV head hk of sequence b in a cache tensor (`table`: the host
  /// block table, paged only).
  int64_t cache_offset(const int* table, int b, int hk, int64_t j) const {
    if (!paged()) return ((int64_t(b) * kv_heads + hk) * capacity + j) * head_dim;
    const int64_t block = table[int64_t(b) * blocks_per_seq + j / block_size];
    return ((block * kv_heads + hk) * block_size + j % block_size) * head_dim;
  }

  /// Throws std::invalid_argument, "<who>: <value> is not allowed (<what is>)": sizes,
  /// q_len, heads % kv_heads, one length per sequence, every length within the capacity,
  /// the paged layout's sizes, tensors whose sizes would overflow.
  void validate(const std::string& who = "decode") const;
  /// Refuses a host block table with an entry out of [0, num_blocks) among the blocks a
  /// sequence uses (ceil(cache_seqlens[b] / block_size) of its row), naming the entry.
  void validate_block_table(const int* table, const std::string& who = "decode") const;
  /// The append's own refusal: every cache_seqlens[b] counts the q_len new tokens, so none is
  /// below q_len.
  void validate_append(const std::string& who) const;

  /// The softmax scale: `scale`, or 1/sqrt(head_dim) when it is 0.
  float softmax_scale() const;

  /// Sequence b as the common Problem: batch 1, seq_q = q_len, seq_k = cache_seqlens[b].
  Problem as_problem(int b) const;
  /// Bytes of K and V a decode step must read: Σ_b cache_seqlens[b] · kv_heads · d · 2 tensors.
  double kv_bytes(int element_bytes) const;
  /// One line: "batch=2 heads=32 kv_heads=8 d=128 q_len=1 lens=[100,7] paged(16)".
  std::string describe() const;
};

/// Host tensors of one decode problem in fp32, seeded: Q, the two caches (filled everywhere,
/// past each length too, so a kernel that reads past a length gets wrong values, not zeros),
/// the new tokens' K/V, and a block table whose blocks are shuffled over the pool.
struct DecodeTensors {
  std::vector<float> Q, K_cache, V_cache, K_new, V_new;
  std::vector<int> block_table;  ///< [batch][blocks_per_seq]; −1 where a row holds no block
  std::vector<float> O, L;       ///< outputs, poisoned with NaN

  static DecodeTensors make(const DecodeProblem& p, uint64_t seed);
};

/// Writes the new tokens' K/V into a host cache at positions cache_seqlens[b] − q_len + i
/// (the reference of the append kernels; every length must be ≥ q_len).
void append_kv_host(const DecodeProblem& p, const float* K_new, const float* V_new, float* K_cache,
                    float* V_cache, const int* table);

}  // namespace fa
