// Stage 14 — decoding at the memory roofline: the final design (step 14e), the packed rows on
// tensor cores and more keys in flight.
//
// What changed from 14d: the work of a block. The grid, the addressing of a contiguous or
// paged cache (decode_tile.cuh) and the combine are 14d's.
//
// 14d computes its scores and P·V with one fp32 multiply-add per element on the CUDA cores,
// 32 keys at a time, with three barriers a tile and one tile in flight while it computes
// the other. Measured, that reaches at most a quarter of the copy bandwidth: an SM spends longer on
// a tile's arithmetic, and waiting at its barriers, than the memory takes to deliver the
// next tile. Decoding is memory-bound only if the arithmetic of a byte costs less than the
// byte, and on the CUDA cores, with conversions and shared-memory loads around every
// multiply-add, it does not.
//
// 14e does the arithmetic with stage 08's tensor-core fragments: the 16 packed rows of a KV
// head are exactly the M = 16 of one m16n8k16 instruction.
//
//   grid (splits, kv_heads · row_tiles, batch), as 14c/14d; 4 warps
//   Q: the 16 packed rows [16, d] → shared memory → every warp's A fragments (registers)
//   keys of the split in tiles of 64, kStages = 3 tiles in shared memory (cp.async), one
//   barrier a tile; warp w takes keys 16w … 16w + 15 of every tile, as if it were a split:
//       S = Q K_wᵀ          [16, 16]   d/16 × 2 MMAs, K_w by ldmatrix (pattern Y)
//       online softmax on S's fragments (stage 08's OnlineSoftmax); P stays in registers
//       O_w = α·O_w + P V_w [16, d]    d/8 MMAs, V_w by ldmatrix.trans (pattern X)
//   the end: the four warps' (O_w, L_w) merged by the log-sum-exp rule (MergeMany) in
//   shared memory, written as O and L (one split) or as the split's partial (the combine)
//
// Rows past the packed count (q_len 1 × group 4 fills 4 of 16) are zeros: the tensor core
// does their arithmetic for nothing, which costs less than the bytes it would wait for.
// The split rule asks for one block per SM from a contiguous cache, two from a paged one
// (decode_launch.cpp); a paged cache's block table is read a tile ahead of the copies.
#include "decode_tile.cuh"
#include "merge.h"
#include "sm80/mma.cuh"
#include "sm80/smem_tiles.cuh"
#include "sm80/softmax.cuh"
#include "step_table.cuh"

namespace fa::stage14 {

namespace {

using stage08::LdsmLane;
using stage08::SmemLayout;

inline constexpr int kMmaWarps = 4;
inline constexpr int kMmaThreads = 32 * kMmaWarps;
inline constexpr int kWarpKeys = 16;                      // keys of a tile each warp takes
inline constexpr int kBlockKeys = kWarpKeys * kMmaWarps;  // 64 keys a tile
inline constexpr SmemLayout kLayout = SmemLayout::Swizzled;

/// Tiles in flight: (kStages − 1) travel while one is computed. Two tiles of 32 KB (d = 128)
/// in flight per SM already draw the SM's share of the bandwidth: 4 or 5 stages measured the
/// same on an H200 (docs/results/h200_stage14_steps.md).
template <int D>
constexpr int stages_for() {
  return D <= 64 ? 4 : 3;
}

template <class T, int D>
struct MmaSmem {
  static constexpr int kStages = stages_for<D>();
  static constexpr int kTileBytes = stage08::smem_tile_bytes(kBlockKeys, D, kLayout);
  static constexpr int kQBytes = stage08::smem_tile_bytes(kTileRows, D, kLayout);
  // K and V of every stage, then Q. At the end the K/V area holds the warps' partial outputs.
  static constexpr int kBytes = 2 * kStages * kTileBytes + kQBytes;
  static_assert(kMmaWarps * kTileRows * D * 4 <= 2 * kStages * kTileBytes, "the merge area fits in the K/V area");
  __device__ static uint32_t k(uint32_t base, int stage) { return base + uint32_t(2 * stage) * kTileBytes; }
  __device__ static uint32_t v(uint32_t base, int stage) { return base + uint32_t(2 * stage + 1) * kTileBytes; }
  __device__ static uint32_t q(uint32_t base) { return base + uint32_t(2 * kStages) * kTileBytes; }
};

/// A thread copies one 16-byte chunk column of a tile: chunk threadIdx.x % (d/8) of keys
/// threadIdx.x / (d/8) + i·kRowsPerPass, i < kKeysPerThread.
template <int D>
struct CopyShape {
  static constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  static_assert(kMmaThreads % kChunks == 0, "a thread copies one chunk column");
  static constexpr int kRowsPerPass = kMmaThreads / kChunks;
  static constexpr int kKeysPerThread = kBlockKeys / kRowsPerPass;
};

/// The block-table entries of this thread's keys of the tile starting at key j0 (nothing to
/// read for a contiguous cache). The kernel reads them one tile ahead of the copies and uses
/// them only then, so that the table's latency passes under a tile of arithmetic instead of
/// in front of the copies.
template <int D, class KeyRow>
__device__ __forceinline__ void look_up(int (&entry)[CopyShape<D>::kKeysPerThread], int64_t j0, int64_t key_end,
                                        const KeyRow& key_row) {
  using C = CopyShape<D>;
#pragma unroll
  for (int i = 0; i < C::kKeysPerThread; ++i) {
    const int64_t j = j0 + threadIdx.x / C::kChunks + i * C::kRowsPerPass;
    entry[i] = j < key_end ? key_row.lookup(j) : -1;
  }
}

/// cp.async copies of the K and V rows of the tile starting at key j0 (table entries from
/// look_up) into one stage; a key past key_end or whose block is not in the pool is
/// zero-filled (a 0-byte copy, from the cache's first row, which exists).
template <class T, int D, class KeyRow>
__device__ __forceinline__ void load_keys(uint32_t k_tile, uint32_t v_tile, const DecodeParams& p, int64_t j0,
                                          int64_t key_end, const KeyRow& key_row,
                                          const int (&entry)[CopyShape<D>::kKeysPerThread]) {
  using C = CopyShape<D>;
  const T* K = static_cast<const T*>(p.K_cache);
  const T* V = static_cast<const T*>(p.V_cache);
  const int chunk = threadIdx.x % C::kChunks;
#pragma unroll
  for (int i = 0; i < C::kKeysPerThread; ++i) {
    const int key = threadIdx.x / C::kChunks + i * C::kRowsPerPass;
    const int64_t j = j0 + key;
    const int64_t row = j < key_end ? key_row.row(j, entry[i]) : -1;
    const int64_t at = row >= 0 ? row + chunk * 8 : 0;
    const uint32_t offset = 2u * uint32_t(stage08::smem_offset(key, chunk, D, kLayout));
    cp_async_16(k_tile + offset, K + at, row >= 0 ? 16 : 0);
    cp_async_16(v_tile + offset, V + at, row >= 0 ? 16 : 0);
  }
}

template <class T, int D, class Keys>
__global__ void __launch_bounds__(kMmaThreads, 2) decode_14e(const DecodeParams p) {
  using Smem = MmaSmem<T, D>;
  constexpr int kStages = Smem::kStages;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = stage08::smem_u32(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma.cuh: this lane holds rows g, g + 8; columns 2t, 2t + 1

  const int split = blockIdx.x, hk = blockIdx.y / p.row_tiles, tile = blockIdx.y % p.row_tiles, b = blockIdx.z;
  const Keys key_row(p, b, hk);
  const int64_t len = sequence_length(p, b);
  int64_t begin, end;
  split_range(len, p.splits, split, begin, end);
  const int first = tile * kTileRows;
  const TileRows rows{hk * p.group, first, min(kTileRows, p.group * p.q_len - first)};

  // The packed queries, [16, d], with the first tile of keys (one cp.async group).
  {
    const T* Q = static_cast<const T*>(p.Q);
    for (int c = threadIdx.x; c < kTileRows * D / 8; c += kMmaThreads) {
      const int r = c / (D / 8), chunk = c % (D / 8);
      const bool real = r < rows.count;
      const int64_t at = real ? ((int64_t(b) * p.heads + rows.head(p, r)) * p.q_len + rows.token(p, r)) * D : 0;
      cp_async_16(Smem::q(base) + 2u * uint32_t(stage08::smem_offset(r, chunk, D, kLayout)), Q + at + chunk * 8,
                  real ? 16 : 0);
    }
  }
  const int tiles = end > begin ? int((end - begin + kBlockKeys - 1) / kBlockKeys) : 0;
  int ahead[CopyShape<D>::kKeysPerThread];  // block-table entries of the next tile to copy
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) {
      const int64_t j0 = begin + int64_t(s) * kBlockKeys;
      look_up<D>(ahead, j0, end, key_row);
      load_keys<T, D>(Smem::k(base, s), Smem::v(base, s), p, j0, end, key_row, ahead);
    }
    cp_async_commit();  // one group per stage, empty or not: wait<kStages − 2> counts them
  }
  if (kStages - 1 < tiles) look_up<D>(ahead, begin + int64_t(kStages - 1) * kBlockKeys, end, key_row);

  // Keys this lane's two rows see: [begin, visible) — causal among the new tokens. Padding
  // rows see everything (their zero queries give finite scores nobody reads).
  int64_t visible[2];
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    visible[h] = r < rows.count && p.causal ? len - p.q_len + rows.token(p, r) + 1 : end;
  }
  // Tiles below every row's limit need no mask.
  int64_t unmasked_end = end;
  for (int r = 0; r < rows.count; ++r)
    if (p.causal) unmasked_end = min(unmasked_end, len - p.q_len + rows.token(p, r) + 1);

  const LdsmLane<D, kLayout> lane_x(stage08::ldsm_row_x(lane), stage08::ldsm_chunk_x(lane));
  const LdsmLane<D, kLayout> lane_y(stage08::ldsm_row_y(lane), stage08::ldsm_chunk_y(lane));
  const uint32_t warp_rows = 2u * uint32_t(kWarpKeys * warp * D);  // this warp's 16 keys in a tile

  uint32_t q_frag[D / 16][4];
  float O[1][D / 8][4] = {};
  stage08::OnlineSoftmax<1> softmax(p.scale);

  //! [tile loop]
  for (int n = 0; n < tiles; ++n) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile n (and Q) landed for every thread; every warp is done with tile n − 1
    if (n + kStages - 1 < tiles) {
      const int s = (n + kStages - 1) % kStages;
      load_keys<T, D>(Smem::k(base, s), Smem::v(base, s), p, begin + int64_t(n + kStages - 1) * kBlockKeys, end,
                      key_row, ahead);
      if (n + kStages < tiles) look_up<D>(ahead, begin + int64_t(n + kStages) * kBlockKeys, end, key_row);
    }
    cp_async_commit();
    if (n == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) stage08::ldmatrix_x4(q_frag[kk], lane_x(Smem::q(base), 0, kk));
    }
    const int s = n % kStages;
    const int64_t j0 = begin + int64_t(n) * kBlockKeys + kWarpKeys * warp;  // this warp's first key

    // S = Q K_wᵀ: [16 rows, 16 keys] as two n8 tiles.
    float S[1][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t k_frag[4];
      stage08::ldmatrix_x4(k_frag, lane_y(Smem::k(base, s) + warp_rows, 0, kk));
      stage08::mma_m16n8k16<T>(S[0][0], q_frag[kk], k_frag[0], k_frag[1]);
      stage08::mma_m16n8k16<T>(S[0][1], q_frag[kk], k_frag[2], k_frag[3]);
    }
    if (j0 + kWarpKeys > unmasked_end) {  // a key past the split or not yet visible to a row
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t j = j0 + 8 * nt + 2 * t + (e & 1);
          if (j >= end || j >= visible[e / 2]) S[0][nt][e] = -INFINITY;
        }
    }
    softmax.update(S, O);

    // O_w += P V_w: P from S's accumulators (mma.cuh), V_w [16 keys, d] by ldmatrix.trans.
    uint32_t p_frag[4];
    stage08::accumulators_to_a_fragment<T>(p_frag, S[0][0], S[0][1]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t v_frag[4];
      stage08::ldmatrix_x4_trans(v_frag, lane_x(Smem::v(base, s) + warp_rows, 0, dp));
      stage08::mma_m16n8k16<T>(O[0][2 * dp], p_frag, v_frag[0], v_frag[1]);
      stage08::mma_m16n8k16<T>(O[0][2 * dp + 1], p_frag, v_frag[2], v_frag[3]);
    }
  }
  //! [tile loop]
  cp_async_wait<0>();

  // Each warp holds O_w normalised over its own keys and L_w; merge the four like splits.
  float L_w[1][2];
  softmax.finalize(O, L_w);
  __syncthreads();  // every warp done with the K/V area: it becomes the merge area
  float* part = reinterpret_cast<float*>(smem);                                  // [warp][16][d]
  float* L_part = reinterpret_cast<float*>(smem + Smem::kBytes - Smem::kQBytes);  // [warp][16], over Q
  if (t == 0) {
    L_part[warp * kTileRows + g] = L_w[0][0];
    L_part[warp * kTileRows + g + 8] = L_w[0][1];
  }
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      part[(warp * kTileRows + g + 8 * (e / 2)) * D + 8 * nt + 2 * t + (e & 1)] = O[0][nt][e];
  __syncthreads();

  //! [warp merge]
  // Thread i: row i / 8, columns (i % 8)·(d/8) …: the row's L by MergeMany, then its columns.
  const int r = threadIdx.x / 8, c0 = (threadIdx.x % 8) * (D / 8);
  if (r < rows.count) {
    fa::stage12::MergeMany merged;
    float w[kMmaWarps];
#pragma unroll
    for (int u = 0; u < kMmaWarps; ++u) {
      const auto f = merged.add(L_part[u * kTileRows + r]);
#pragma unroll
      for (int v = 0; v < u; ++v) w[v] *= f.rescale;
      w[u] = f.weight;
    }
    const float norm = merged.normaliser();
    const int64_t row = (int64_t(b) * p.heads + rows.head(p, r)) * p.q_len + rows.token(p, r);
    const int64_t at = int64_t(split) * p.batch * p.heads * p.q_len + row;  // [split][b][h][i]
#pragma unroll
    for (int c = c0; c < c0 + D / 8; ++c) {
      float o = 0.0f;
#pragma unroll
      for (int u = 0; u < kMmaWarps; ++u) o += w[u] * part[(u * kTileRows + r) * D + c];
      o *= norm;
      if (p.splits == 1)
        static_cast<T*>(p.O)[row * D + c] = T(o);
      else
        p.O_split[at * D + c] = o;
    }
    if (c0 == 0) {
      if (p.splits == 1)
        p.L[row] = merged.L();
      else
        p.L_split[at] = merged.L();
    }
  }
  //! [warp merge]
}

}  // namespace

StepKernel step_14e(int d, Dtype dtype, bool paged) {
  return instantiate_step<64, 128>(kStageName, "14e", d, dtype, [paged](auto D, auto elem) {
    using T = decltype(elem);
    constexpr int kBytes = MmaSmem<T, D>::kBytes;
    StepKernel k = paged ? make_step_kernel(decode_14e<T, D, PagedKeys<D>>, Threads{kMmaThreads},
                                            BlockRows{kTileRows}, BlockCols{kBlockKeys}, SmemBytes{kBytes})
                         : make_step_kernel(decode_14e<T, D, ContiguousKeys<D>>, Threads{kMmaThreads},
                                            BlockRows{kTileRows}, BlockCols{kBlockKeys}, SmemBytes{kBytes});
    k.stages = MmaSmem<T, D>::kStages;
    k.barriers = 1;
    k.pipelined = true;
    k.description = "14d on tensor cores: 16 packed rows as one m16n8k16 row block, 64-key tiles, "
                    "a split per warp merged in the block";
    return k;
  });
}

}  // namespace fa::stage14
