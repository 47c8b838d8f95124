// Stage 07: the pieces every step of the stage shares — the tile shapes and the thread
// layout, the shared-memory layouts, the tile copy through registers, the two products, the
// online softmax, the mask and the write of O and L. The step files (07a_sync_loads.cu,
// 07b_cp_async.cu) and the main file (smem_cuda.cu) each hold one complete kernel built from
// them; they differ only in when K_j and V_j are copied and where the block waits.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "sm80/cp_async.cuh"

namespace fa::stage07 {
namespace {

// ---------------------------------------------------------------------------------------
// Tile shapes and the thread layout
//
// 128 threads (4 warps) compute one B_r = 64-row query tile. Seen as a 16 × 8 grid:
//   g = tid / 8  (0..15)  row group    → rows g, g+16, g+32, g+48 of the tile
//   c = tid % 8  (0..7)   column group → columns c, c+8, c+16, ... of S_ij   (B_c/8 of them)
//                                      → columns 4c..4c+3, 32+4c..32+4c+3, ... of O_i (D/8)
// So each thread owns a 4 × (B_c/8) piece of S_ij and a 4 × (D/8) piece of O_i. The 8
// threads of one row group are 8 consecutive lanes of one warp: a row's max and sum are
// reduced among them with three __shfl_xor_sync steps (lane xor 1, 2, 4).
// ---------------------------------------------------------------------------------------
constexpr int kBlockQ = 64;                           // B_r
constexpr int kThreads = 128;                         // threads per block
constexpr int kRowGroups = 16;                        // row groups: rows g + 16t, t < 4
constexpr int kRowsPerThread = kBlockQ / kRowGroups;  // 4
// Every shared row that is read as float4 by threads on different rows is padded by 4
// floats: consecutive rows then start in different 16-byte bank groups, so the 4 (or 8)
// different rows one warp reads at the same column hit different banks (no conflicts).
// (The swizzled layout reaches the same without padding: smem_offset below.)
constexpr int kPad = 4;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.442695040888963407f;

// One compiled configuration, the same for every step: D = head dim padded to a multiple of
// 32, B_c = keys per tile (option `block_k`), and the layout of sQ, sK, sP (option
// `smem_layout`): padded by 4 floats per row, or without padding, chunks XOR-swizzled.
// These change only sizes and addresses, never the order of the arithmetic: every
// configuration with the same B_c gives bitwise the same O and L.
template <int D_, int B_c_, bool kSwizzled_>
struct Config {
  static constexpr int D = D_;
  static constexpr int B_c = B_c_;
  static constexpr bool kSwizzled = kSwizzled_;
  static constexpr int kColGroups = kThreads / kRowGroups;  // threads sharing one row: 8
  static constexpr int kSCols = B_c / kColGroups;           // columns of S_ij per thread
  static constexpr int kOCols = D / kColGroups;             // columns of O_i per thread
  // A thread's O_i columns are float4 chunks kChunkStride apart: 4c.. + kChunkStride·s (32 = the
  // 8 column groups' float4s side by side).
  static constexpr int kChunkStride = 4 * kColGroups;
  static constexpr int kRowPad = kSwizzled ? 0 : kPad;      // the swizzle replaces the padding
  static constexpr int kQStride = D + kRowPad;              // sQ: [B_r][D + 4]   (swizzled: [B_r][D])
  static constexpr int kKStride = D + kRowPad;              // sK: [B_c][D + 4]   (swizzled: [B_c][D])
  static constexpr int kVStride = D;                        // sV: [B_c][D]   (read along rows: no pad)
  static constexpr int kPStride = B_c + kRowPad;            // sP: [B_r][B_c + 4] (swizzled: [B_r][B_c])
  static constexpr int kQFloats = kBlockQ * kQStride;
  static constexpr int kKFloats = B_c * kKStride;
  static constexpr int kVFloats = B_c * kVStride;
  static constexpr int kPFloats = kBlockQ * kPStride;
  static constexpr size_t kSharedBytes =
      sizeof(float) * size_t(kQFloats + kKFloats + kVFloats + kPFloats);
  // Blocks that fit on one SM of an H100/H200 by shared memory (228 KiB, 1 KiB reserved per
  // block), capped where the register file runs out first: 3 blocks leave 168 registers a
  // thread, 4 leave 128, which spills once a thread holds 32 scores (B_c = 64). The
  // compiler is told this target (__launch_bounds__) and fits its register use to it.
  static constexpr int kSmemBlocks = int(233472 / (kSharedBytes + 1024));
  static constexpr int kRegisterBlocks = B_c == 64 ? 3 : 4;
  static constexpr int kMinBlocks = kSmemBlocks < kRegisterBlocks ? kSmemBlocks : kRegisterBlocks;
  static_assert(D % 32 == 0 && (B_c == 32 || B_c == 64), "unsupported tile configuration");
  static_assert(D % (4 * kColGroups) == 0 && B_c % kColGroups == 0,
                "each column group must own whole float4 columns of O and whole columns of S");
};

// Where element (row, col) of a shared tile with rows of STRIDE floats is stored.
// Padded tiles: at row·STRIDE + col, STRIDE = width + 4.
// Swizzled tiles: no padding, STRIDE = width, and the 16-byte chunk col/4 of
// a row is stored at chunk (col/4) XOR (row mod 8): bits 2–4 of the column are flipped by
// the row's last 3 bits. Rows r..r+7 read at one column then land in 8 different 16-byte
// bank groups, as the padding achieves, and a row's chunks stay in the row (STRIDE is a
// multiple of 8 chunks). Writers and readers call the same function, so the math never sees
// the layout.
template <bool kSwizzled, int STRIDE>
__device__ __forceinline__ int smem_offset(int row, int col) {
  static_assert(!kSwizzled || STRIDE % 32 == 0, "the swizzle permutes groups of 8 chunks");
  return row * STRIDE + (kSwizzled ? col ^ ((row & 7) << 2) : col);
}

// What a block needs to know about the problem. Sizes stay 32-bit; every offset into a
// tensor is computed in 64 bits (a tensor may hold more than 2³¹ elements).
struct Params {
  const float* Q;
  const float* K;
  const float* V;
  float* O;
  float* L;
  int heads, kv_heads, group;  // group = heads / kv_heads query heads per kv head
  int seq_q, seq_k, d;         // N_q, N_k, and the real head dim (d ≤ D)
  int T_r;                     // query tiles per head
  int causal;
  float scale_log2;            // softmax scale · log2(e): e^{scale·x} = 2^{scale_log2·x}
};

// 2^x as one MUFU.EX2 instruction. A result below 2^−126 is flushed to zero (".ftz"): such
// a probability is far below what the fp32 row sum can resolve. (exp2f() compiles to the
// same instruction plus three more that keep those tiny results.)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Copies rows [row0, row0 + ROWS) of a row-major [n_rows][d] matrix into a shared tile of
// ROWS × STRIDE floats (SWIZZLED: at smem_offset's places), 16 bytes (one float4 "chunk") per
// thread per row, with THREADS threads in the block. Rows at or past n_rows and columns at or past d (up to D) become zeros: a zero key row gives a score the
// mask removes, a zero value row adds nothing, so the products need no tail cases.
// Thread t copies chunk column t % kChunkCols of rows t / kChunkCols, + kRowStep, + 2·kRowStep,
// ...: consecutive threads read consecutive 16-byte chunks of a row, so every warp-wide load
// is contiguous (for D = 128, one 512-byte row per warp). kChunkCols is D/4
// rounded up to a power of two so that it divides the threads (for D = 96, 8 of every
// 32 lanes have no column and stay idle). `fetch` issues all global loads first, so their
// latencies overlap; `store` then writes shared memory.
template <int ROWS, int D, int STRIDE, int THREADS, bool SWIZZLED>
struct TileCopy {
  static constexpr int kRows = ROWS, kD = D, kStride = STRIDE;
  static constexpr int kThreads = THREADS;
  static constexpr bool kSwizzled = SWIZZLED;
  static constexpr int kChunkCols = D / 4 <= 8 ? 8 : D / 4 <= 16 ? 16 : 32;
  static constexpr int kRowStep = kThreads / kChunkCols;
  static constexpr int kPerThread = ROWS / kRowStep;
  static_assert(D / 4 <= 32 && ROWS % kRowStep == 0, "tile must split evenly over the block");
  float4 chunk[kPerThread];

  __device__ __forceinline__ void fetch(const float* src, int64_t row0, int64_t n_rows, int d) {
    const int col = 4 * (int(threadIdx.x) % kChunkCols), r = int(threadIdx.x) / kChunkCols;
    const int rows = n_rows - row0 < ROWS ? int(n_rows - row0) : ROWS;  // rows that exist
    const float* from = src + (row0 + r) * d + col;  // this thread's first chunk
#pragma unroll
    for (int n = 0; n < kPerThread; ++n)
      chunk[n] = (col < d && r + n * kRowStep < rows)
                     ? *reinterpret_cast<const float4*>(from + n * kRowStep * d)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __device__ __forceinline__ void store(float* dst) const {
    const int col = 4 * (int(threadIdx.x) % kChunkCols), r = int(threadIdx.x) / kChunkCols;
    if (col >= D) return;  // only for D = 96: lanes past the last column
#pragma unroll
    for (int n = 0; n < kPerThread; ++n)
      *reinterpret_cast<float4*>(dst + smem_offset<SWIZZLED, STRIDE>(r + n * kRowStep, col)) = chunk[n];
  }
};

// S_ij = Q_i K_jᵀ for this thread's 4 rows × B_c/8 columns, reading 4 consecutive k at a
// time as float4: per step 4 + B_c/8 float4 reads from shared memory feed 16·B_c/8 FMAs.

template <typename C>
__device__ __forceinline__ void scores_tile(const float* sQ, const float* sK, int g, int c,
                                            float (&S)[kRowsPerThread][C::kSCols]) {
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
    for (int u = 0; u < C::kSCols; ++u) S[t][u] = 0.f;
  //! [scores]
  // LAB BEGIN: scores — hint: S[t][u] = Σ_k Q_i[g + 16t][k] · K_j[c + 8u][k] (8 = C::kColGroups); read 4 k at a time as float4 at smem_offset(row, k)
#pragma unroll 4
  for (int k = 0; k < C::D; k += 4) {
    float4 q[kRowsPerThread], key[C::kSCols];
#pragma unroll
    for (int t = 0; t < kRowsPerThread; ++t)
      q[t] = *reinterpret_cast<const float4*>(
          sQ + smem_offset<C::kSwizzled, C::kQStride>(g + kRowGroups * t, k));  // Q_i[g + 16t][k..k+3]
#pragma unroll
    for (int u = 0; u < C::kSCols; ++u)
      key[u] = *reinterpret_cast<const float4*>(
          sK + smem_offset<C::kSwizzled, C::kKStride>(c + C::kColGroups * u, k));  // K_j[c + 8u][k..k+3]
#pragma unroll
    for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
      for (int u = 0; u < C::kSCols; ++u) {
        S[t][u] = fmaf(q[t].x, key[u].x, S[t][u]);
        S[t][u] = fmaf(q[t].y, key[u].y, S[t][u]);
        S[t][u] = fmaf(q[t].z, key[u].z, S[t][u]);
        S[t][u] = fmaf(q[t].w, key[u].w, S[t][u]);
      }
  }
  // LAB END
  //! [scores]
}

// The online-softmax step for this thread's 4 rows (FlashAttention-2, in base 2):
//   m_new = max(m, rowmax(S))              row_max holds m·scale·log2(e)
//   P = 2^{S·scale_log2 − m_new}           overwrites S
//   l = 2^{m − m_new}·l + rowsum(P)        this thread's columns only (summed at the end)
//   O = 2^{m − m_new}·O
// All 8 threads of a row find the same m_new, so each may keep a partial
// l over its own columns: the partials are added once, after the last tile.
template <typename C>
__device__ __forceinline__ void online_softmax(float (&S)[kRowsPerThread][C::kSCols],
                                               float (&row_max)[kRowsPerThread],
                                               float (&row_sum)[kRowsPerThread],
                                               float (&O_acc)[kRowsPerThread][C::kOCols],
                                               float scale_log2) {
  //! [online softmax]
  // LAB BEGIN: online softmax — hint: reduce the tile max over the row's 8 lanes (xor 1, 2, 4), then rescale l and O by 2^{m_old − m_new}
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t) {
    float tile_max = S[t][0];
#pragma unroll
    for (int u = 1; u < C::kSCols; ++u) tile_max = fmaxf(tile_max, S[t][u]);
    // The other 7 column groups of this row are lanes (lane xor 1, 2, 4) of this warp.
#pragma unroll
    for (int lane_mask = 1; lane_mask < C::kColGroups; lane_mask *= 2)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, lane_mask));
    const float m_new = fmaxf(row_max[t], tile_max * scale_log2);
    // A row that has seen only masked keys keeps m = −∞; subtracting 0 instead of −∞
    // keeps its P at 2^{−∞} = 0 rather than 2^{−∞+∞} = NaN.
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    // alpha = e^{scale·(m_old − m_new)}; 0 on the first tile a row sees a key
    const float alpha = fast_exp2(row_max[t] - m_use);
    float tile_sum = 0.f;
#pragma unroll
    for (int u = 0; u < C::kSCols; ++u) {
      S[t][u] = fast_exp2(fmaf(S[t][u], scale_log2, -m_use));  // P_ij = e^{scale·(S_ij − m_new)}
      tile_sum += S[t][u];
    }
    row_sum[t] = alpha * row_sum[t] + tile_sum;
    row_max[t] = m_new;
#pragma unroll
    for (int v = 0; v < C::kOCols; ++v) O_acc[t][v] *= alpha;
  }
  // LAB END
  //! [online softmax]
}

// O_i += P_ij V_j for this thread's 4 rows × D/8 columns, 4 keys per step: per step 4
// float4 reads of P and 4·D/32 float4 reads of V feed 16·D/8 FMAs.
template <typename C>
__device__ __forceinline__ void accumulate_pv(const float* sP, const float* sV, int g, int c,
                                              float (&O_acc)[kRowsPerThread][C::kOCols]) {
  //! [accumulate pv]
  // LAB BEGIN: accumulate pv — hint: O[t][4s+e'] += Σ_k P_ij[g + 16t][k] · V_j[k][32s + 4c + e'] (32 = C::kChunkStride)
#pragma unroll 2
  for (int k = 0; k < C::B_c; k += 4) {
    float p[kRowsPerThread][4];  // P_ij[row][k..k+3] for this thread's 4 rows
#pragma unroll
    for (int t = 0; t < kRowsPerThread; ++t) {
      const float4 p4 = *reinterpret_cast<const float4*>(
          sP + smem_offset<C::kSwizzled, C::kPStride>(g + kRowGroups * t, k));
      p[t][0] = p4.x, p[t][1] = p4.y, p[t][2] = p4.z, p[t][3] = p4.w;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int s = 0; s < C::D / C::kChunkStride; ++s) {
        const float* row = sV + (k + e) * C::kVStride;  // V_j[k + e][:]
        const float4 v = *reinterpret_cast<const float4*>(row + C::kChunkStride * s + 4 * c);
#pragma unroll
        for (int t = 0; t < kRowsPerThread; ++t) {
          O_acc[t][4 * s + 0] = fmaf(p[t][e], v.x, O_acc[t][4 * s + 0]);
          O_acc[t][4 * s + 1] = fmaf(p[t][e], v.y, O_acc[t][4 * s + 1]);
          O_acc[t][4 * s + 2] = fmaf(p[t][e], v.z, O_acc[t][4 * s + 2]);
          O_acc[t][4 * s + 3] = fmaf(p[t][e], v.w, O_acc[t][4 * s + 3]);
        }
      }
    }
  }
  // LAB END
  //! [accumulate pv]
}

// ---------------------------------------------------------------------------------------
// The block's work and the steps of a key tile around the two products
// ---------------------------------------------------------------------------------------

// m = −∞, l = 0, O_i = 0 for this thread's rows.
template <typename C>
__device__ __forceinline__ void init_rows(float (&row_max)[kRowsPerThread], float (&row_sum)[kRowsPerThread],
                                          float (&O_acc)[kRowsPerThread][C::kOCols]) {
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t) {
    row_max[t] = -INFINITY;
    row_sum[t] = 0.f;
#pragma unroll
    for (int v = 0; v < C::kOCols; ++v) O_acc[t][v] = 0.f;
  }
}

// P_ij to shared memory: the product with V_j needs, for each of this thread's rows,
// all B_c probabilities of that row, and 7/8 of them live in the other 7 lanes.
template <typename C>
__device__ __forceinline__ void store_p(float* sP, int g, int c, const float (&S)[kRowsPerThread][C::kSCols]) {
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
    for (int u = 0; u < C::kSCols; ++u)
      sP[smem_offset<C::kSwizzled, C::kPStride>(g + kRowGroups * t, c + C::kColGroups * u)] = S[t][u];
}

template <typename C>
__device__ __forceinline__ void write_output(const Params& p, int64_t bh, int64_t q0, int g, int c,
                                             const float (&row_max)[kRowsPerThread],
                                             const float (&row_sum)[kRowsPerThread],
                                             const float (&O_acc)[kRowsPerThread][C::kOCols]) {
  //! [epilogue]
  // O_i = O_acc / l and L_i = scale·m + ln l = ln2 · (m·scale·log2(e) + log2 l). The 8
  // partial sums of a row are added first. A row that saw no key has l = 0: O = 0, L = −∞.
  // (NaN inputs give l = NaN and so NaN in O and L, as the reference does.)
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t) {
    float l = row_sum[t];
#pragma unroll
    for (int lane_mask = 1; lane_mask < C::kColGroups; lane_mask *= 2)
      l += __shfl_xor_sync(0xffffffffu, l, lane_mask);  // lane xor 1, 2, 4
    const int64_t row = q0 + g + kRowGroups * t;
    if (row >= p.seq_q) continue;
    const float inv_l = l == 0.f ? 0.f : 1.f / l;
    float* O = p.O + (bh * p.seq_q + row) * p.d;
#pragma unroll
    for (int s = 0; s < C::D / C::kChunkStride; ++s) {
      const int col = C::kChunkStride * s + 4 * c;  // O columns 32s + 4c..32s + 4c + 3
      if (col < p.d)
        *reinterpret_cast<float4*>(O + col) =
            make_float4(O_acc[t][4 * s + 0] * inv_l, O_acc[t][4 * s + 1] * inv_l,
                        O_acc[t][4 * s + 2] * inv_l, O_acc[t][4 * s + 3] * inv_l);
    }
    if (c == 0) p.L[bh * p.seq_q + row] = l == 0.f ? -INFINITY : kLn2 * (row_max[t] + log2f(l));
  }
  //! [epilogue]
}

}  // namespace
}  // namespace fa::stage07
