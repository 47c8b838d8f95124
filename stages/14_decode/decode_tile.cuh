/// \file decode_tile.cuh
/// \brief Stage 14: the work of one decode block, shared by every CUDA step — a tile of up to
/// kTileRows query rows attends to a range of keys, 32 keys at a time, with stage 05's
/// online softmax, and writes its output (final, or a split's partial).
///
/// What the steps change is only *which* rows a block takes (one head's q_len tokens, or all
/// the heads of a KV head packed), *which* keys (all, or one split), and *where* a key lives
/// (a contiguous cache, or a block of a paged one): the arguments of attend_rows.
///
/// The block: 128 threads (4 warps). Per key tile of kTileKeys = 32 keys:
///   load     K, V tile [32][d] with 16-byte cp.async copies, the next tile's during this one's math
///   scores   warp w owns rows w, w+4, w+8, w+12 (those that hold a query); lane = key:
///            s = q·k (fp32), masked to −inf
///   softmax  per row: m' = max(m, max_j s), α = 2^{m − m'}, p = 2^{s − m'}, l = α·l + Σ p
///   O        thread t owns row t/8 and d/8 columns: O_acc = α·O_acc + Σ_j p_j·v_j
/// Scores are kept in base 2 (q pre-scaled by scale·log2 e), so exp2 does the exponentials;
/// L is turned back to natural log at the end: L = (m + log2 l)·ln 2.
///
/// Memory traffic per block: every K and V byte of its keys once (16-byte loads, rows padded
/// by 16 bytes in shared memory so that 8 lanes reading 8 rows hit 8 different bank groups).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "decode.h"
#include "decode_params.h"
#include "sm80/cp_async.cuh"

namespace fa::stage14 {

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kRowsPerWarp = kTileRows / kWarps;     // 4: rows each warp scores
inline constexpr int kThreadsPerRow = kThreads / kTileRows;  // 8: threads sharing one row of O
static_assert(kTileKeys == 32, "lane = key in the score phase");

/// Eight fp16/bf16 values (16 bytes) to floats.
template <class T>
__device__ __forceinline__ void to_floats(const uint4& raw, float (&x)[8]) {
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if constexpr (std::is_same_v<T, __half>)
      x[e] = __half2float(v[e]);
    else
      x[e] = __bfloat162float(v[e]);
  }
}

template <class T, int D>
struct TileSmem {
  static constexpr int kPitch = D + 8;  // a K/V row padded by 16 bytes (see the file comment)
  float q[kTileRows][D];                // [rows, d] the tile's queries, times scale·log2 e
  T k[2][kTileKeys][kPitch];            // [buffer, keys, d] two K tiles: this one, the next
  T v[2][kTileKeys][kPitch];            // [buffer, keys, d]
  float p[kTileRows][kTileKeys];        // [rows, keys] this tile's probabilities
  float alpha[kTileRows];               // per row: the rescale of O_acc for this tile
  float row_max[kTileRows], row_sum[kTileRows];  // per row at the end: m and l
  int visible[kTileRows];               // per row: keys it sees (causal), 0 for a padding row
};

/// Which query rows a block's tile holds: row r is the flat row first_row + r of the
/// (head, token) rows that start at head first_head, q_len tokens per head.
struct TileRows {
  int first_head, first_row, count;
  __device__ int head(const DecodeParams& p, int r) const { return first_head + (first_row + r) / p.q_len; }
  __device__ int token(const DecodeParams& p, int r) const { return (first_row + r) % p.q_len; }
};

/// The length of sequence b, as the device holds it, kept within the cache's capacity (a
/// device length is not checked on the host; a wrong one must still not send a block outside
/// the cache).
__device__ __forceinline__ int64_t sequence_length(const DecodeParams& p, int b) {
  const int64_t capacity = p.block_size > 0 ? int64_t(p.blocks_per_seq) * p.block_size : p.capacity;
  const int64_t len = p.cache_seqlens[b];
  return len < 0 ? 0 : (len > capacity ? capacity : len);
}

/// Keys [begin, end) of split `split` of a sequence of `len` keys: splits of equal length,
/// rounded up to whole key tiles; a split past the end is empty.
__device__ __forceinline__ void split_range(int64_t len, int splits, int split, int64_t& begin, int64_t& end) {
  int64_t chunk = (len + splits - 1) / splits;
  chunk = (chunk + kTileKeys - 1) / kTileKeys * kTileKeys;
  begin = min(len, int64_t(split) * chunk);
  end = min(len, begin + chunk);
}

/// Copies keys [j0, j0 + 32) ∩ [j0, key_end) of K and V into buffer `buf`. `key_row(j)` is
/// the offset of key j's row in the cache, in elements, or −1 for a key whose block is not in
/// the pool (a bad device block table). Rows past key_end, and such keys, become zeros: a
/// 0-byte copy, which reads nothing (its source is the cache's first row, which exists).
template <class T, int D, class KeyRow>
__device__ void load_kv_tile(TileSmem<T, D>& sm, int buf, const DecodeParams& p, int64_t j0, int64_t key_end,
                             KeyRow key_row) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const T* K = static_cast<const T*>(p.K_cache);
  const T* V = static_cast<const T*>(p.V_cache);
  for (int c = threadIdx.x; c < kTileKeys * kChunks; c += kThreads) {
    const int key = c / kChunks, chunk = c % kChunks;
    const int64_t j = j0 + key;
    const int64_t row = j < key_end ? key_row(j) : -1;
    const int64_t at = row >= 0 ? row + chunk * 8 : 0;
    const int bytes = row >= 0 ? 16 : 0;
    cp_async_16(&sm.k[buf][key][chunk * 8], K + at, bytes);
    cp_async_16(&sm.v[buf][key][chunk * 8], V + at, bytes);
  }
  cp_async_commit();
}

/// Scores of this tile, the online-softmax update of each row's (m, l), and the
/// probabilities into sm.p (their rescale α into sm.alpha). Warp w, lane = key. Only the
/// tile's `count` rows that hold a query are computed: with one query row per head and four
/// heads to a KV head, 4 of the 16 (a branch the same in every lane of a warp).
template <class T, int D>
__device__ void scores_and_softmax(TileSmem<T, D>& sm, int buf, int64_t j0, int64_t key_end, int count,
                                   float (&m)[kRowsPerWarp], float (&l)[kRowsPerWarp]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float s[kRowsPerWarp] = {};  // s[i]: row warp + 4i against key j0 + lane, base 2
  for (int c = 0; c < D; c += 8) {
    float k8[8];
    to_floats<T>(*reinterpret_cast<const uint4*>(&sm.k[buf][lane][c]), k8);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (warp + kWarps * i >= count) continue;      // a padding row
      const float* q = &sm.q[warp + kWarps * i][c];  // the same address in every lane: a broadcast
#pragma unroll
      for (int e = 0; e < 8; ++e) s[i] += q[e] * k8[e];
    }
  }
  const int64_t j = j0 + lane;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    if (r >= count) continue;
    if (j >= key_end || j >= sm.visible[r]) s[i] = -INFINITY;  // a key this row does not see
    float tile_max = s[i];
    for (int off = 16; off > 0; off /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    const float m_new = fmaxf(m[i], tile_max);
    // While the row has seen only −inf, m' = −inf: subtract 0 instead (stage 05's guard).
    const float shift = m_new == -INFINITY ? 0.0f : m_new;
    const float p_ij = exp2f(s[i] - shift);
    float tile_sum = p_ij;
    for (int off = 16; off > 0; off /= 2) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, off);
    const float alpha = exp2f(m[i] - shift);  // α = 2^{m − m'}
    l[i] = alpha * l[i] + tile_sum;           // l' = α·l + Σ_j p_ij
    m[i] = m_new;
    sm.p[r][lane] = p_ij;
    if (lane == 0) sm.alpha[r] = alpha;
  }
}

/// O_acc ← α·O_acc + Σ_j p_j·v_j for this thread's row and columns: row threadIdx.x / 8;
/// 16-byte chunks g, g + 8, … of the row (g = threadIdx.x % 8), so that the 8 threads of a
/// row read 128 consecutive bytes of a V row. Threads of a padding row (r ≥ count) skip it.
template <class T, int D>
__device__ void accumulate_pv(const TileSmem<T, D>& sm, int buf, int count, float (&O_acc)[D / 8]) {
  const int r = threadIdx.x / kThreadsPerRow, g = threadIdx.x % kThreadsPerRow;
  if (r >= count) return;
  const float alpha = sm.alpha[r];
#pragma unroll
  for (int c = 0; c < D / 8; ++c) O_acc[c] *= alpha;
  for (int key = 0; key < kTileKeys; ++key) {
    const float p_ij = sm.p[r][key];
#pragma unroll
    for (int k = 0; k < D / 64; ++k) {
      float v8[8];
      to_floats<T>(*reinterpret_cast<const uint4*>(&sm.v[buf][key][(g + 8 * k) * 8]), v8);
#pragma unroll
      for (int e = 0; e < 8; ++e) O_acc[8 * k + e] += p_ij * v8[e];
    }
  }
}

/// The whole of a block's work for one tile of rows: load the rows' queries, attend to keys
/// [key_begin, key_end) of sequence b, write O and L (splits == 1) or the partial of split
/// `split`. `key_row(j)`: offset of key j's row in the cache.
template <class T, int D, class KeyRow>
__device__ void attend_rows(TileSmem<T, D>& sm, const DecodeParams& p, int b, TileRows rows, int64_t key_begin,
                            int64_t key_end, int split, KeyRow key_row) {
  const T* Q = static_cast<const T*>(p.Q);
  const int64_t len = sequence_length(p, b);
  // The tile's queries, scaled, as floats; padding rows are zeros and see no key.
  for (int x = threadIdx.x; x < kTileRows * D; x += kThreads) {
    const int r = x / D, c = x % D;
    float q = 0.0f;
    if (r < rows.count) {
      const int h = rows.head(p, r), i = rows.token(p, r);
      q = float(Q[((int64_t(b) * p.heads + h) * p.q_len + i) * D + c]) * p.scale_log2;
    }
    sm.q[r][c] = q;
  }
  for (int r = threadIdx.x; r < kTileRows; r += kThreads) {
    const int64_t end = p.causal ? len - p.q_len + rows.token(p, r) + 1 : len;  // keys j < end
    sm.visible[r] = r < rows.count ? int(end < 0 ? 0 : end) : 0;
  }

  float m[kRowsPerWarp], l[kRowsPerWarp];  // rows warp + 4i: running max (base 2) and sum
  for (int i = 0; i < kRowsPerWarp; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  float O_acc[D / 8] = {};  // [d/8] row threadIdx.x / 8, chunks g, g + 8, … of its columns

  const int tiles = key_end > key_begin ? int((key_end - key_begin + kTileKeys - 1) / kTileKeys) : 0;
  if (tiles > 0) load_kv_tile(sm, 0, p, key_begin, key_end, key_row);
  __syncthreads();  // sm.q and sm.visible written
  for (int t = 0; t < tiles; ++t) {
    const int buf = t % 2;
    const int64_t j0 = key_begin + int64_t(t) * kTileKeys;
    if (t + 1 < tiles) {
      load_kv_tile(sm, 1 - buf, p, j0 + kTileKeys, key_end, key_row);  // the next tile, during this one
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile's K and V are in shared memory, from every thread's copies
    scores_and_softmax(sm, buf, j0, key_end, rows.count, m, l);
    __syncthreads();  // sm.p and sm.alpha of every row written
    accumulate_pv(sm, buf, rows.count, O_acc);
    __syncthreads();  // every thread done with this buffer and sm.p before they are overwritten
  }

  // The end of the row: its (m, l) live in the scoring warp; O_acc in the row's 8 threads.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0)
    for (int i = 0; i < kRowsPerWarp; ++i) {
      sm.row_max[warp + kWarps * i] = m[i];
      sm.row_sum[warp + kWarps * i] = l[i];
    }
  __syncthreads();
  const int r = threadIdx.x / kThreadsPerRow, g = threadIdx.x % kThreadsPerRow;
  if (r < rows.count) {
    const int h = rows.head(p, r), i = rows.token(p, r);
    const float row_sum = sm.row_sum[r];
    // l = 0 only for a row that saw no key: O = 0, L = −inf (the merge's identity).
    const float inv = row_sum == 0.0f ? 0.0f : 1.0f / row_sum;
    const float L = row_sum == 0.0f ? -INFINITY : (sm.row_max[r] + log2f(row_sum)) * 0.69314718f;
    const int64_t row = (int64_t(b) * p.heads + h) * p.q_len + i;
    if (p.splits == 1) {
      T* O = static_cast<T*>(p.O) + row * D;
      for (int k = 0; k < D / 64; ++k)
        for (int e = 0; e < 8; ++e) O[(g + 8 * k) * 8 + e] = T(O_acc[8 * k + e] * inv);
      if (g == 0) p.L[row] = L;
    } else {
      const int64_t at = int64_t(split) * p.batch * p.heads * p.q_len + row;  // [split][b][h][i]
      float* O = p.O_split + at * D;
      for (int k = 0; k < D / 64; ++k)
        for (int e = 0; e < 8; ++e) O[(g + 8 * k) * 8 + e] = O_acc[8 * k + e] * inv;
      if (g == 0) p.L_split[at] = L;
    }
  }
  __syncthreads();  // sm.q, sm.row_* are free for the block's next tile of rows
}

/// A contiguous cache: key j of (sequence b, KV head hk) is row j of its [capacity][d] slab.
template <int D>
struct ContiguousKeys {
  int64_t base;  // offset of (b, hk)'s slab
  __device__ ContiguousKeys(const DecodeParams& p, int b, int hk)
      : base((int64_t(b) * p.kv_heads + hk) * p.capacity * D) {}
  __device__ int64_t operator()(int64_t j) const { return base + j * D; }
  // In two halves (14e): nothing to look up, then the row.
  __device__ int lookup(int64_t) const { return 0; }
  __device__ int64_t row(int64_t j, int) const { return base + j * D; }
};

/// A paged cache: key j of (sequence b, KV head hk) is row j % block_size of pool block
/// table[b][j / block_size], whose KV head hk is a [block_size][d] slab. block_size is a
/// power of two (DecodeProblem::validate), so / and % are a shift and a mask.
template <int D>
struct PagedKeys {
  const int* table_row;  // [blocks_per_seq] sequence b's row of the block table
  int hk, kv_heads, block_size, shift, num_blocks;
  __device__ PagedKeys(const DecodeParams& p, int b, int hk_)
      : table_row(p.block_table + int64_t(b) * p.blocks_per_seq), hk(hk_), kv_heads(p.kv_heads),
        block_size(p.block_size), shift(0), num_blocks(p.num_blocks) {
    while ((1 << shift) < block_size) ++shift;
  }
  __device__ int64_t operator()(int64_t j) const { return row(j, lookup(j)); }
  // In two halves (14e): the table read, whose latency the caller hides, then the row.
  __device__ int lookup(int64_t j) const { return table_row[j >> shift]; }
  __device__ int64_t row(int64_t j, int block) const {
    if (block < 0 || block >= num_blocks) return -1;  // not in the pool: loads as zeros
    return ((int64_t(block) * kv_heads + hk) * block_size + (j & (block_size - 1))) * D;
  }
};

}  // namespace fa::stage14
