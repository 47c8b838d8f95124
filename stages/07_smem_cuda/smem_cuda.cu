// Stage 07 — the tiled forward as a CUDA kernel: fp32, tiles in shared memory, scores and
// output in registers.
//
// What changed from stage 06, and why: stage 06 blocked the computation into B_r × B_c
// tiles sized to a fast-memory budget, but one CPU core still did every multiply. Here the
// same loop nest runs on the GPU. Each query tile Q_i becomes one thread block, the fast
// memory becomes the block's shared memory, and the tile products are split among 128
// threads so that each thread keeps a small piece of S_ij and of O_i in its registers
// ("register tiling"): a value read once from shared memory feeds several multiply-adds.
// The arithmetic is the same as stage 06; only where the numbers live has changed.
//
// Algorithm (FlashAttention-2 forward, one thread block per (batch·head, query tile i)):
//   load Q_i                                   [B_r, d] into shared memory, once
//   m_i = −∞, l_i = 0, O_i = 0                 per row, in registers
//   for j = 0 … last key tile this tile can see (causal: tiles above the diagonal skipped):
//     load K_j, V_j                            [B_c, d] each, into shared memory
//     S_ij = Q_i K_jᵀ                          [B_r, B_c], in registers; mask tails/causal
//     m_new = max(m_i, rowmax(S_ij));  P_ij = exp(scale·(S_ij − m_new))
//     l_i = e^{scale·(m_i − m_new)}·l_i + rowsum(P_ij);  O_i = e^{scale·(m_i − m_new)}·O_i
//     O_i += P_ij V_j                          P_ij goes through shared memory
//   O_i /= l_i;  L_i = scale·m_i + log(l_i)    (a row that sees no key: O = 0, L = −∞)
//
// Layout: Q, O [batch][heads][N_q][d]; K, V [batch][kv_heads][N_k][d]; L [batch][heads][N_q];
// fp32, device pointers, 16-byte aligned. Grouped-query attention: head h reads kv head
// h / (heads / kv_heads). Any N_q, N_k ≥ 0 (tails are masked); causal mask bottom-right.
// Limits: d ∈ {16, 32, 40, 64, 80, 96, 128}; fp32 on CUDA cores (no tensor cores: stage 08).
// Run:   ./build/stages/07_smem_cuda/stage07 --seq-q 4096 --seq-k 4096 --head-dim 128 --bench
//        ./build/stages/07_smem_cuda/stage07 --causal --block-k 64      (a different B_c)
//        ./build/stages/07_smem_cuda/stage07 --head-dim 128 --bench --pipeline 2
//                                    (each tile loaded through registers, then computed)
//        ./build/stages/07_smem_cuda/stage07 --head-dim 128 --bench --variant 4
//                                    (one kernel variant forced: "Variants" below, README.md)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "async_tile_copy.cuh"  // the cp.async copy of the same tiles (option `pipeline`)
#include "cuda_utils.h"
#include "smem_cuda.h"

namespace fa::stage07 {
namespace {

const char* const kStage = "07_smem_cuda";

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
// (Variant 2 runs 256 threads as a 16 × 16 grid: 16 column groups, 4 shuffle steps; the
// names below are the same, with 16 in place of 8: Config::kColGroups.)
// ---------------------------------------------------------------------------------------
constexpr int kBlockQ = 64;                           // B_r
constexpr int kRowGroups = 16;                        // row groups: rows g + 16t, t < 4
constexpr int kRowsPerThread = kBlockQ / kRowGroups;  // 4
// Every shared row that is read as float4 by threads on different rows is padded by 4
// floats: consecutive rows then start in different 16-byte bank groups, so the 4 (or 8)
// different rows one warp reads at the same column hit different banks (no conflicts).
// (Variants 1 and 2 use an XOR swizzle instead: tile_at below.)
constexpr int kPad = 4;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.442695040888963407f;

// One compiled configuration: D = head dim padded to a multiple of 32, B_c = keys per tile,
// and whether K_j and V_j are loaded with cp.async while the previous tile is computed
// (option `pipeline`, async_tile_copy.cuh) instead of in a load phase of their own. The last
// three parameters are the experimental variants (option `variant`, "Variants" below);
// their defaults give the padded kernel (variant 4):
//   kThreads_      128, or 256 (variant 2: a 16 × 16 thread grid, half the piece per thread)
//   kSwizzled_     sQ, sK, sP without padding, chunks XOR-swizzled (variants 1, 2)
//   kTwoBarriers_  the cp.async schedule with two __syncthreads() per key tile, not three
//                  (variants 1, 2, 3; only with kPipelined)
template <int D_, int B_c_, bool kPipelined_ = false, int kThreads_ = 128, bool kSwizzled_ = false,
          bool kTwoBarriers_ = false>
struct Config {
  static constexpr int D = D_;
  static constexpr int B_c = B_c_;
  static constexpr bool kPipelined = kPipelined_;
  static constexpr int kThreads = kThreads_;
  static constexpr bool kSwizzled = kSwizzled_;
  static constexpr bool kTwoBarriers = kTwoBarriers_ && kPipelined_;
  static constexpr int kColGroups = kThreads / kRowGroups;  // threads sharing one row: 8 or 16
  static constexpr int kSCols = B_c / kColGroups;           // columns of S_ij per thread
  static constexpr int kOCols = D / kColGroups;             // columns of O_i per thread
  // A thread's O_i columns are float4 chunks kChunkStride apart: 4c.. + kChunkStride·s (32 = the
  // 8 column groups' float4s side by side; 64 in variant 2).
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
  // thread, 4 leave 128, which spills once a thread holds 32 scores (B_c = 64). With 256
  // threads (variant 2), 2 blocks leave 128 registers, enough for its smaller piece. The
  // compiler is told this target (__launch_bounds__) and fits its register use to it.
  static constexpr int kSmemBlocks = int(233472 / (kSharedBytes + 1024));
  static constexpr int kRegisterBlocks = kThreads == 256 ? 2 : B_c == 64 ? 3 : 4;
  static constexpr int kMinBlocks = kSmemBlocks < kRegisterBlocks ? kSmemBlocks : kRegisterBlocks;
  // Steps of the S_ij loop unrolled (scores_tile), so that the compiler can issue the next
  // steps' shared loads before this step's FMAs. Variant 2 at D = 128 has no registers to
  // spare for loads in flight (ptxas spills 12 bytes when it unrolls 2 or 4 steps within
  // its 128 registers); its 16 warps per SM cover the load latency instead.
  static constexpr int kScoresUnroll = kThreads == 256 && D == 128 ? 1 : 4;
  static_assert(D % 32 == 0 && (B_c == 32 || B_c == 64), "unsupported tile configuration");
  static_assert((kThreads == 128 || kThreads == 256) && D % (4 * kColGroups) == 0 &&
                    B_c % kColGroups == 0,
                "each column group must own whole float4 columns of O and whole columns of S");
};

// Where element (row, col) of a shared tile with rows of STRIDE floats is stored.
// Padded tiles (the default): at row·STRIDE + col, STRIDE = width + 4.
// Swizzled tiles (variants 1, 2): no padding, STRIDE = width, and the 16-byte chunk col/4 of
// a row is stored at chunk (col/4) XOR (row mod 8): bits 2–4 of the column are flipped by
// the row's last 3 bits. Rows r..r+7 read at one column then land in 8 different 16-byte
// bank groups, as the padding achieves, and a row's chunks stay in the row (STRIDE is a
// multiple of 8 chunks). Writers and readers call the same function, so the math never sees
// the layout.
template <bool kSwizzled, int STRIDE>
__device__ __forceinline__ int tile_at(int row, int col) {
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
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Copies rows [row0, row0 + ROWS) of a row-major [n_rows][d] matrix into a shared tile of
// ROWS × STRIDE floats (SWIZZLED: at tile_at's places), 16 bytes (one float4 "chunk") per
// thread per row, with THREADS threads in the block. Rows at or past
// n_rows and columns at or past d (up to D) become zeros: a zero key row gives a score the
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
      *reinterpret_cast<float4*>(dst + tile_at<SWIZZLED, STRIDE>(r + n * kRowStep, col)) = chunk[n];
  }
};

// S_ij = Q_i K_jᵀ for this thread's 4 rows × B_c/8 columns, reading 4 consecutive k at a
// time as float4: per step 4 + B_c/8 float4 reads from shared memory feed 16·B_c/8 FMAs.
// (With C::kColGroups = 16, variant 2: B_c/16 columns, keys c + 16u.)
template <typename C>
__device__ __forceinline__ void scores_tile(const float* sQ, const float* sK, int g, int c,
                                            float (&S)[kRowsPerThread][C::kSCols]) {
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
    for (int u = 0; u < C::kSCols; ++u) S[t][u] = 0.f;
  //! [scores]
  // LAB BEGIN: scores — hint: S[t][u] = Σ_k Q_i[g + 16t][k] · K_j[c + 8u][k] (8 = C::kColGroups); read 4 k at a time as float4 at tile_at(row, k)
#pragma unroll C::kScoresUnroll
  for (int k = 0; k < C::D; k += 4) {
    float4 q[kRowsPerThread], key[C::kSCols];
#pragma unroll
    for (int t = 0; t < kRowsPerThread; ++t)
      q[t] = *reinterpret_cast<const float4*>(
          sQ + tile_at<C::kSwizzled, C::kQStride>(g + kRowGroups * t, k));  // Q_i[g + 16t][k..k+3]
#pragma unroll
    for (int u = 0; u < C::kSCols; ++u)
      key[u] = *reinterpret_cast<const float4*>(
          sK + tile_at<C::kSwizzled, C::kKStride>(c + C::kColGroups * u, k));  // K_j[c + 8u][k..k+3]
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
// All 8 threads of a row (16 in variant 2) find the same m_new, so each may keep a partial
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
    // The other 7 column groups of this row are lanes (lane xor 1, 2, 4) of this warp
    // (variant 2: 15 others, xor 1, 2, 4, 8).
#pragma unroll
    for (int lane_mask = 1; lane_mask < C::kColGroups; lane_mask *= 2)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, lane_mask));
    const float m_new = fmaxf(row_max[t], tile_max * scale_log2);
    // A row that has seen only masked keys keeps m = −∞; subtracting 0 instead of −∞
    // keeps its P at 2^{−∞} = 0 rather than 2^{−∞+∞} = NaN.
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    // alpha = e^{scale·(m_old − m_new)}; 0 on the first tile a row sees a key
    const float alpha = exp2_ftz(row_max[t] - m_use);
    float tile_sum = 0.f;
#pragma unroll
    for (int u = 0; u < C::kSCols; ++u) {
      S[t][u] = exp2_ftz(fmaf(S[t][u], scale_log2, -m_use));  // P_ij = e^{scale·(S_ij − m_new)}
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
// float4 reads of P and 4·D/32 float4 reads of V feed 16·D/8 FMAs. (Variant 2: D/16
// columns 64s + 4c..64s + 4c + 3, read as 4·D/64 float4 of V per step.)
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
          sP + tile_at<C::kSwizzled, C::kPStride>(g + kRowGroups * t, k));
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
// The kernel: one thread block per (batch·head, query tile).
// ---------------------------------------------------------------------------------------
template <typename C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) flash_forward_kernel(const Params p) {
  //! [shared layout]
  // Shared memory, carved from one dynamic allocation (C::kSharedBytes):
  extern __shared__ float4 shared_mem[];
  float* sQ = reinterpret_cast<float*>(shared_mem);  // [B_r][D + 4]   Q_i, loaded once
  float* sK = sQ + C::kQFloats;                      // [B_c][D + 4]   K_j
  float* sV = sK + C::kKFloats;                      // [B_c][D]       V_j
  float* sP = sV + C::kVFloats;                      // [B_r][B_c + 4] P_ij
  //! [shared layout]
  // How each tile is copied (C::kThreads threads; sQ, sK, sP swizzled in variants 1 and 2;
  // sV never, since every warp reads it along one row).
  using QTile = TileCopy<kBlockQ, C::D, C::kQStride, C::kThreads, C::kSwizzled>;
  using KTile = TileCopy<C::B_c, C::D, C::kKStride, C::kThreads, C::kSwizzled>;
  using VTile = TileCopy<C::B_c, C::D, C::kVStride, C::kThreads, false>;

  //! [block and thread indices]
  // Query tiles are handed out last-first: under a causal mask the last tile of a head
  // sees the most keys, and starting the longest blocks first keeps the GPU busy at the end.
  const int tile = p.T_r - 1 - int(blockIdx.x % unsigned(p.T_r));
  const int64_t bh = blockIdx.x / unsigned(p.T_r);  // batch · heads + head
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const int64_t kv_head = h / p.group;              // grouped-query attention
  const float* Q = p.Q + bh * p.seq_q * p.d;                        // [N_q, d] this head
  const float* K = p.K + (b * p.kv_heads + kv_head) * p.seq_k * p.d;  // [N_k, d]
  const float* V = p.V + (b * p.kv_heads + kv_head) * p.seq_k * p.d;  // [N_k, d]
  const int64_t q0 = int64_t(tile) * kBlockQ;  // first query row of Q_i

  const int g = int(threadIdx.x) / C::kColGroups;  // row group:    rows g + 16t
  const int c = int(threadIdx.x) % C::kColGroups;  // column group: S columns c + 8u
  //! [block and thread indices]

  // Bottom-right causal alignment: row r sees keys k ≤ r + (N_k − N_q). The last row of
  // this tile decides how many keys the tile needs; tiles after that are never loaded.
  const int64_t diag = int64_t(p.seq_k) - p.seq_q;
  const int64_t q_end = q0 + kBlockQ < p.seq_q ? q0 + kBlockQ : p.seq_q;  // one past the last row
  int64_t n_keys = p.seq_k;                                               // keys this tile needs
  if (p.causal) n_keys = q_end + diag < 0 ? 0 : (q_end + diag < p.seq_k ? q_end + diag : p.seq_k);
  const int T_c = int((n_keys + C::B_c - 1) / C::B_c);  // key tiles this block visits

  if constexpr (C::kPipelined) {
    // Prologue: Q_i and K_0 as one group, V_0 as the next; both land during the loop's
    // first waits. (T_c = 0: nothing of K or V is read, and the loop does not run.)
    tile_copy_async<QTile>(sQ, Q, q0, p.seq_q, p.d);
    if (T_c > 0) tile_copy_async<KTile>(sK, K, 0, p.seq_k, p.d);
    cp_async_commit();
    if (T_c > 0) tile_copy_async<VTile>(sV, V, 0, p.seq_k, p.d);
    cp_async_commit();
    if constexpr (C::kTwoBarriers) {
      // Two barriers per tile: the loop starts with Q_i and K_0 in place, as every later
      // iteration starts with K_j in place (published by the previous iteration's barrier 3).
      cp_async_wait<1>();  // this thread's copies of Q_i and K_0 have landed; V_0 may not
      __syncthreads();     // ... and everyone's
    }
  } else {
    QTile q_tile;
    q_tile.fetch(Q, q0, p.seq_q, p.d);
    q_tile.store(sQ);  // read after the first __syncthreads() in the loop
  }

  float row_max[kRowsPerThread];                // m · scale · log2(e) per row
  float row_sum[kRowsPerThread];                // l, over this thread's columns
  float O_acc[kRowsPerThread][C::kOCols];       // unnormalised O_i, this thread's piece
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t) {
    row_max[t] = -INFINITY;
    row_sum[t] = 0.f;
#pragma unroll
    for (int v = 0; v < C::kOCols; ++v) O_acc[t][v] = 0.f;
  }

  for (int j = 0; j < T_c; ++j) {
    const int64_t k0 = int64_t(j) * C::B_c;  // first key of K_j
    if constexpr (!C::kTwoBarriers) {
      if constexpr (C::kPipelined) {
        // In flight: the group holding K_j (and on j = 0 also Q_i), then the one holding V_j.
        cp_async_wait<1>();  // this thread's copies of K_j (and Q_i) have landed; V_j may not
      } else {
        KTile k_tile;
        VTile v_tile;
        k_tile.fetch(K, k0, p.seq_k, p.d);
        v_tile.fetch(V, k0, p.seq_k, p.d);
        k_tile.store(sK);
        v_tile.store(sV);
      }
      __syncthreads();  // K_j, V_j (pipelined: K_j only) and on j = 0 Q_i are complete for all warps
    }

    float S[kRowsPerThread][C::kSCols];  // this thread's piece of S_ij, then of P_ij
    scores_tile<C>(sQ, sK, g, c, S);

    // Mask what the row may not see: keys past N_k (the tail tile) and, under the causal
    // mask, keys right of the diagonal. Only tiles that cross either edge pay for it.
    const bool crosses_edge =
        k0 + C::B_c > p.seq_k || (p.causal && k0 + C::B_c - 1 > q0 + diag);
    if (crosses_edge) {
#pragma unroll
      for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
        for (int u = 0; u < C::kSCols; ++u) {
          const int64_t row = q0 + g + kRowGroups * t, key = k0 + c + C::kColGroups * u;
          if (key >= p.seq_k || (p.causal && key > row + diag)) S[t][u] = -INFINITY;
        }
    }

    online_softmax<C>(S, row_max, row_sum, O_acc, p.scale_log2);

    // P_ij to shared memory: the product with V_j needs, for each of this thread's rows,
    // all B_c probabilities of that row, and 7/8 of them live in the other 7 lanes.
#pragma unroll
    for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
      for (int u = 0; u < C::kSCols; ++u)
        sP[tile_at<C::kSwizzled, C::kPStride>(g + kRowGroups * t, c + C::kColGroups * u)] = S[t][u];
    if constexpr (C::kPipelined) cp_async_wait<0>();  // this thread's copies of V_j landed
    __syncthreads();  // all of P_ij (pipelined: and of V_j) is written before any warp reads it

    // Pipelined: every warp is past scores_tile, so sK is free: K_{j+1} travels during P·V.
    if constexpr (C::kPipelined) {
      if (j + 1 < T_c) tile_copy_async<KTile>(sK, K, k0 + C::B_c, p.seq_k, p.d);
      cp_async_commit();
    }
    accumulate_pv<C>(sP, sV, g, c, O_acc);
    // Two barriers: barrier 3 also does barrier 1's job for the next tile. K_{j+1} has had
    // all of P·V to travel; once every thread's part has landed, the barrier publishes it.
    if constexpr (C::kTwoBarriers) cp_async_wait<0>();  // this thread's copies of K_{j+1} landed
    __syncthreads();  // every warp is done with sK, sV, sP before the next tile overwrites them

    // Pipelined: sV is free now; V_{j+1} travels during S_{i,j+1} and its softmax.
    if constexpr (C::kPipelined) {
      if (j + 1 < T_c) tile_copy_async<VTile>(sV, V, k0 + C::B_c, p.seq_k, p.d);
      cp_async_commit();
    }
  }
  // Pipelined, T_c = 0: Q_i was copied but never waited for; no copy may outlive the block.
  if constexpr (C::kPipelined) cp_async_wait<0>();

  //! [epilogue]
  // O_i = O_acc / l and L_i = scale·m + ln l = ln2 · (m·scale·log2(e) + log2 l). The 8
  // partial sums of a row are added first. A row that saw no key has l = 0: O = 0, L = −∞.
  // (NaN inputs give l = NaN and so NaN in O and L, as the reference does.)
#pragma unroll
  for (int t = 0; t < kRowsPerThread; ++t) {
    float l = row_sum[t];
#pragma unroll
    for (int lane_mask = 1; lane_mask < C::kColGroups; lane_mask *= 2)
      l += __shfl_xor_sync(0xffffffffu, l, lane_mask);  // lane xor 1, 2, 4 (variant 2: and 8)
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

// ---------------------------------------------------------------------------------------
// Host side: choose the configuration, validate, launch.
// ---------------------------------------------------------------------------------------
// The options (the calling thread's, declared in register.cpp's table and read here through
// block_k_option(), pipeline_option() and variant_option()):
// block_k 0: the default B_c for the head dim; pipeline 0 (default) and 1: K_j, V_j loaded
// with cp.async during the previous tile (measured faster on the H200: README.md); 2: each
// tile loaded, then computed (the simpler schedule).
// Variants (option `variant`; README.md, "Variants"). Each is one Config, correct for every
// problem, and changes one or two things of the padded kernel (4):
//   0  auto, the default: variant 1 at D = 128 (measured 5 % faster there on the H200)
//      unless block_k is set, variant 4 otherwise (variant_for)
//   1  B_c = 64 at every D, sQ/sK/sP swizzled instead of padded: at D = 128 the four tiles
//      shrink from 117,760 to 114,688 bytes and two blocks fit per SM instead of one;
//      two barriers per key tile (cp.async schedule)
//   2  as 1, with 256 threads as a 16 × 16 grid: half the piece per thread, 128 registers,
//      two blocks of 8 warps per SM; needs D = 64 or 128 (variant_for)
//   3  the padded tiles with two barriers per key tile: bitwise variant 4's output
//   4  the padded kernel: B_c = 64 for D ≤ 64, 32 above; three barriers per key tile

int padded_head_dim(int d) {
  for (int s : supported_head_dims())
    if (s == d) return (d + 31) / 32 * 32;
  std::ostringstream msg;
  msg << kStage << ": head_dim = " << d << " is not supported (supported: ";
  for (size_t n = 0; n < supported_head_dims().size(); ++n)
    msg << (n ? ", " : "") << supported_head_dims()[n];
  msg << ")";
  throw std::invalid_argument(msg.str());
}

// The variant that runs at padded head dim D (1 to 4). Auto (0) takes the swizzled B_c = 64
// tile (1) at D = 128, where two blocks per SM beat three of the padded B_c = 32 tile, and
// the padded kernel (4) elsewhere (at D = 64 the padded kernel was measured 4 % faster);
// a block_k set by hand asks for the padded kernel, so auto then gives variant 4. Variant 2
// gives each of its 16 column groups whole float4 columns of O, which needs D/4 to be a
// multiple of 16 (D = 64, 128); at D = 32 and 96 the padded kernel (4) runs instead.
int variant_for(int D) {
  const int variant = variant_option();
  if (variant == 0) return D == 128 && block_k_option() == 0 ? 1 : 4;
  return variant == 2 && D % 64 != 0 ? 4 : variant;
}

// Default B_c: 64 keys while the shared tiles stay small enough for three blocks per SM
// (D ≤ 64: 67 KiB); for D = 96 and 128 a 64-key tile would need 91 and 115 KiB, so B_c = 32
// (59 and 75 KiB) keeps three blocks per SM on an H100/H200 (228 KiB of shared memory).
// Variants 1 and 2 are built around B_c = 64 (their swizzled tiles fit two blocks per SM at
// D = 128) and always use it; option block_k applies to variants 3 and 4 (and turns auto
// into 4).
int block_k_for(int D, int variant) {
  if (variant == 1 || variant == 2) return 64;
  const int forced = block_k_option();
  return forced != 0 ? forced : (D <= 64 ? 64 : 32);
}

// The default tiles (padded, 128 threads) for every D and both B_c; kTwoBarriers: variant 3.
template <bool kPipelined, bool kTwoBarriers, typename Fn>
void with_default_tiles(int D, int B_c, Fn&& fn) {
  constexpr bool P = kPipelined, T = kTwoBarriers;
  const bool wide = B_c == 64;
  switch (D) {
    case 32: wide ? fn(Config<32, 64, P, 128, false, T>{}) : fn(Config<32, 32, P, 128, false, T>{}); break;
    case 64: wide ? fn(Config<64, 64, P, 128, false, T>{}) : fn(Config<64, 32, P, 128, false, T>{}); break;
    case 96: wide ? fn(Config<96, 64, P, 128, false, T>{}) : fn(Config<96, 32, P, 128, false, T>{}); break;
    case 128: wide ? fn(Config<128, 64, P, 128, false, T>{}) : fn(Config<128, 32, P, 128, false, T>{}); break;
    default:
      throw std::logic_error(std::string(kStage) + ": no kernel for D = " + std::to_string(D));
  }
}

// Calls fn(C{}) for the compiled configuration C that runs (D, B_c, pipelined, variant), as
// launch_shape chose them. The synchronous schedule (kPipelined = false) has three barriers
// in every variant, so variant 3 without the pipeline is the padded kernel (4) itself.
template <bool kPipelined, typename Fn>
void with_config(int D, int B_c, int variant, Fn&& fn) {
  constexpr bool P = kPipelined;
  if (variant == 4) return with_default_tiles<P, false>(D, B_c, fn);
  if (variant == 3) return with_default_tiles<P, P>(D, B_c, fn);
  if (variant == 1) {  // B_c = 64, swizzled, 128 threads
    switch (D) {
      case 32: return fn(Config<32, 64, P, 128, true, P>{});
      case 64: return fn(Config<64, 64, P, 128, true, P>{});
      case 96: return fn(Config<96, 64, P, 128, true, P>{});
      case 128: return fn(Config<128, 64, P, 128, true, P>{});
    }
  }
  if (variant == 2) {  // B_c = 64, swizzled, 256 threads
    switch (D) {
      case 64: return fn(Config<64, 64, P, 256, true, P>{});
      case 128: return fn(Config<128, 64, P, 256, true, P>{});
    }
  }
  throw std::logic_error(std::string(kStage) + ": no kernel for D = " + std::to_string(D) +
                         ", variant " + std::to_string(variant));
}
template <typename Fn>
void with_config(const LaunchShape& s, Fn&& fn) {
  s.pipelined ? with_config<true>(s.head_dim_padded, s.block_k, s.variant, fn)
              : with_config<false>(s.head_dim_padded, s.block_k, s.variant, fn);
}

// Kernel attributes a launch needs: more than 48 KiB of dynamic shared memory must be asked
// for explicitly, and the L1/shared split is set to the most shared memory (228 KiB on an
// H100/H200) so that kMinBlocks blocks fit side by side. Little is lost: a block reads each
// element of Q, K and V from global memory once, so L1 has nothing to reuse.
template <typename C>
void set_kernel_attributes() {
  FA_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<C>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(C::kSharedBytes)));
  FA_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<C>,
                                     cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
}

void require_aligned(const void* ptr, const char* name) {
  require_device_pointer(kStage, name, ptr, 16, "the kernel reads and writes rows as float4");
}

}  // namespace

LaunchShape launch_shape(const Problem& p) {
  p.validate(kStage);
  LaunchShape s;
  s.head_dim_padded = padded_head_dim(p.head_dim);
  s.block_q = kBlockQ;
  s.variant = variant_for(s.head_dim_padded);
  s.block_k = block_k_for(s.head_dim_padded, s.variant);
  s.pipelined = pipeline_option() != 2;
  const long long T_r = (int64_t(p.seq_q) + kBlockQ - 1) / kBlockQ;
  s.blocks = T_r * p.batch * p.heads;
  with_config(s, [&](auto cfg) {
    using C = decltype(cfg);
    s.threads = C::kThreads;
    s.swizzled = C::kSwizzled;
    s.barriers = C::kTwoBarriers ? 2 : 3;
    s.shared_bytes = C::kSharedBytes;
  });
  return s;
}

void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O,
             float* L, cudaStream_t stream) {
  const LaunchShape shape = launch_shape(p);  // validates the problem and the head dim
  if (shape.blocks == 0) return;              // N_q = 0: nothing to write
  if (shape.blocks > std::numeric_limits<int>::max())
    throw std::invalid_argument(std::string(kStage) + ": " + std::to_string(shape.blocks) +
                                " thread blocks (query tiles · batch · heads) exceed the grid "
                                "limit of 2^31 − 1");
  require_aligned(Q, "Q");
  require_aligned(O, "O");
  if (p.kv_elems() > 0) {
    require_aligned(K, "K");
    require_aligned(V, "V");
  }
  if (reinterpret_cast<uintptr_t>(L) % alignof(float) != 0)
    throw std::invalid_argument(std::string(kStage) + ": L is not 4-byte aligned");

  Params params{};
  params.Q = Q;
  params.K = K;
  params.V = V;
  params.O = O;
  params.L = L;
  params.heads = p.heads;
  params.kv_heads = p.kv_heads;
  params.group = p.group_size();
  params.seq_q = p.seq_q;
  params.seq_k = p.seq_k;
  params.d = p.head_dim;
  params.T_r = int((int64_t(p.seq_q) + kBlockQ - 1) / kBlockQ);
  params.causal = p.causal ? 1 : 0;
  params.scale_log2 = float(double(p.softmax_scale()) * double(kLog2e));

  with_config(shape, [&](auto cfg) {
    using C = decltype(cfg);
    set_kernel_attributes<C>();
    flash_forward_kernel<C><<<unsigned(shape.blocks), C::kThreads, C::kSharedBytes, stream>>>(params);
    FA_CHECK_LAUNCH("07_smem_cuda: flash_forward_kernel");
  });
}

std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p) {
  const LaunchShape s = launch_shape(p);
  std::vector<std::pair<std::string, std::string>> rows;
  std::ostringstream tile;
  const int col_groups = s.threads / kRowGroups;  // threads sharing a row: 8, or 16 (variant 2)
  tile << "B_r x B_c = " << s.block_q << " x " << s.block_k << ", d padded to "
       << s.head_dim_padded << "; per thread 4 rows: S 4 x " << s.block_k / col_groups
       << ", O 4 x " << s.head_dim_padded / col_groups << " in registers; sQ, sK, sP "
       << (s.swizzled ? "swizzled" : "padded");
  rows.emplace_back("tiles", tile.str());
  rows.emplace_back("loads", s.pipelined ? "cp.async: K_j+1 during P V_j, V_j+1 during S_i,j+1"
                                         : "K_j, V_j through registers, then the tile's math");
  rows.emplace_back("variant", std::to_string(s.variant) + " (option " +
                                   std::to_string(variant_option()) + "), " +
                                   std::to_string(s.barriers) + " barriers per key tile");
  if (!have_gpu()) {
    rows.emplace_back("launch", std::to_string(s.blocks) + " blocks x " +
                                    std::to_string(s.threads) +
                                    " threads, " + std::to_string(s.shared_bytes) +
                                    " B shared per block (registers, occupancy: no GPU here)");
    return rows;
  }
  with_config(s, [&](auto cfg) {
    using C = decltype(cfg);
    set_kernel_attributes<C>();
    for (auto& row : describe_launch(reinterpret_cast<const void*>(flash_forward_kernel<C>),
                                     dim3(unsigned(std::max<long long>(s.blocks, 0))),
                                     dim3(C::kThreads), C::kSharedBytes))
      rows.push_back(row);
  });
  return rows;
}

}  // namespace fa::stage07
