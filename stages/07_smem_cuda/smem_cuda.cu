// Stage 07 — the tiled forward as a CUDA kernel: fp32, tiles in shared memory, scores and
// output in registers. This file holds the final design (step 07c) and the launcher.
//
// What changed from stage 06, and why: stage 06 blocked the computation into B_r × B_c
// tiles sized to a fast-memory budget, but one CPU core still did every multiply. Here the
// same loop nest runs on the GPU. Each query tile Q_i becomes one thread block, the fast
// memory becomes the block's shared memory, and the tile products are split among 128
// threads so that each thread keeps a small piece of S_ij and of O_i in its registers
// ("register tiling", block_tile.cuh): a value read once from shared memory feeds several
// multiply-adds. The arithmetic is the same as stage 06; only where the numbers live has
// changed. The steps 07a (tiles loaded, then computed) and 07b (the next tile copied with
// cp.async during this one's math) build the kernel below one idea at a time.
//
// What changed from 07b, and why: barrier 1 of 07b (K_j has landed) comes right after
// barrier 3 of the tile before. If every thread waits for its copies of K_{j+1} *before*
// barrier 3, that barrier publishes them too, and barrier 1 goes: two barriers per key
// tile, each a point fewer where the 4 warps wait for the slowest. K_{j+1} still has all of
// P_ij V_j to travel. The products run in the same order, so O and L are bitwise 07b's.
//
// Algorithm (FlashAttention-2 forward, one thread block per (batch·head, query tile i)):
//   copy Q_i and K_0 (cp.async group), copy V_0 (group); wait for Q_i, K_0; barrier
//   m_i = −∞, l_i = 0, O_i = 0                  per row, in registers
//   for j = 0 … last key tile this tile can see (causal: tiles above the diagonal skipped):
//     S_ij = Q_i K_jᵀ                           [B_r, B_c], in registers; mask tails/causal
//     m_new = max(m_i, rowmax(S_ij));  P_ij = exp(scale·(S_ij − m_new))
//     l_i = e^{scale·(m_i − m_new)}·l_i + rowsum(P_ij);  O_i = e^{scale·(m_i − m_new)}·O_i
//     P_ij → sP;  wait for V_j;  barrier 2       ← sK is free: copy K_{j+1}
//     O_i += P_ij V_j;  wait for K_{j+1};  barrier 3   ← sV, sP free: copy V_{j+1}
//   O_i /= l_i;  L_i = scale·m_i + log(l_i)     (a row that sees no key: O = 0, L = −∞)
//
// Layout: Q, O [batch][heads][N_q][d]; K, V [batch][kv_heads][N_k][d]; L [batch][heads][N_q];
// fp32, device pointers, 16-byte aligned. Grouped-query attention: head h reads kv head
// h / (heads / kv_heads). Any N_q, N_k ≥ 0 (tails are masked); causal mask bottom-right.
// Limits: d ∈ {16, 32, 40, 64, 80, 96, 128}; fp32 on CUDA cores (no tensor cores: stage 08).
// Data options (the same kernel, other sizes and addresses): --block-k (B_c) and
// --smem-layout (sQ, sK, sP padded or swizzled); the default is the swizzled B_c = 64 tile
// at d = 128 and the padded tile elsewhere.
// Run:   ./build/stages/07_smem_cuda/stage07 --seq-q 4096 --seq-k 4096 --head-dim 128 --bench
//        ./build/stages/07_smem_cuda/stage07 --step 07a --head-dim 128 --bench   (a step)
//        ./build/stages/07_smem_cuda/stage07 --head-dim 128 --smem-layout padded --bench
#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "async_tile_copy.cuh"
#include "block_tile.cuh"
#include "cuda_utils.h"
#include "smem_cuda.h"
#include "smem_steps.cuh"

namespace fa::stage07 {
namespace {

// ---------------------------------------------------------------------------------------
// The kernel: one thread block per (batch·head, query tile).
// ---------------------------------------------------------------------------------------
template <typename C>
__global__ void __launch_bounds__(kThreads, C::kMinBlocks) flash_forward_kernel(const Params p) {
  //! [shared layout]
  // Shared memory, carved from one dynamic allocation (C::kSharedBytes):
  extern __shared__ float4 shared_mem[];
  float* sQ = reinterpret_cast<float*>(shared_mem);  // [B_r][D + 4]   Q_i, loaded once
  float* sK = sQ + C::kQFloats;                      // [B_c][D + 4]   K_j
  float* sV = sK + C::kKFloats;                      // [B_c][D]       V_j
  float* sP = sV + C::kVFloats;                      // [B_r][B_c + 4] P_ij
  //! [shared layout]
  // How each tile is copied (sQ, sK, sP swizzled or padded; sV never, since every warp
  // reads it along one row).
  using QTile = TileCopy<kBlockQ, C::D, C::kQStride, kThreads, C::kSwizzled>;
  using KTile = TileCopy<C::B_c, C::D, C::kKStride, kThreads, C::kSwizzled>;
  using VTile = TileCopy<C::B_c, C::D, C::kVStride, kThreads, false>;
  //! [block and thread indices]
  // Query tiles are handed out last-first: under a causal mask the last tile of a head
  // sees the most keys, and starting the longest blocks first keeps the GPU busy at the end.
  const int tile = p.T_r - 1 - int(blockIdx.x % unsigned(p.T_r));
  const int64_t bh = blockIdx.x / unsigned(p.T_r);  // batch · heads + head
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const int64_t kv_head = h / p.group;                                // grouped-query attention
  const float* Q = p.Q + bh * p.seq_q * p.d;                          // [N_q, d] this head
  const float* K = p.K + (b * p.kv_heads + kv_head) * p.seq_k * p.d;  // [N_k, d]
  const float* V = p.V + (b * p.kv_heads + kv_head) * p.seq_k * p.d;  // [N_k, d]
  const int64_t q0 = int64_t(tile) * kBlockQ;                         // first query row of Q_i

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

  //! [prologue]
  // Q_i and K_0 as one group, V_0 as the next. The loop starts with Q_i and K_0 in place,
  // as every later iteration starts with K_j in place (published by the previous
  // iteration's barrier 3). (T_c = 0: nothing of K or V is read, and the loop does not run.)
  tile_copy_async<QTile>(sQ, Q, q0, p.seq_q, p.d);
  if (T_c > 0) tile_copy_async<KTile>(sK, K, 0, p.seq_k, p.d);
  cp_async_commit();
  if (T_c > 0) tile_copy_async<VTile>(sV, V, 0, p.seq_k, p.d);
  cp_async_commit();
  cp_async_wait<1>();  // this thread's copies of Q_i and K_0 have landed; V_0 may not
  __syncthreads();     // ... and everyone's
  //! [prologue]

  float row_max[kRowsPerThread];           // m · scale · log2(e) per row
  float row_sum[kRowsPerThread];           // l, over this thread's columns
  float O_acc[kRowsPerThread][C::kOCols];  // unnormalised O_i, this thread's piece
  init_rows<C>(row_max, row_sum, O_acc);

  //! [key loop]
  for (int j = 0; j < T_c; ++j) {
    const int64_t k0 = int64_t(j) * C::B_c;  // first key of K_j

    float S[kRowsPerThread][C::kSCols];  // this thread's piece of S_ij, then of P_ij
    scores_tile<C>(sQ, sK, g, c, S);
    // Mask what the row may not see: keys past N_k (the tail tile) and, under the causal
    // mask, keys right of the diagonal. Only tiles that cross either edge pay for it.
    const bool masked = k0 + C::B_c > p.seq_k || (p.causal && k0 + C::B_c - 1 > q0 + diag);
    if (masked) {
#pragma unroll
      for (int t = 0; t < kRowsPerThread; ++t)
#pragma unroll
        for (int u = 0; u < C::kSCols; ++u) {
          const int64_t row = q0 + g + kRowGroups * t, key = k0 + c + C::kColGroups * u;
          if (key >= p.seq_k || (p.causal && key > row + diag)) S[t][u] = -INFINITY;
        }
    }

    online_softmax<C>(S, row_max, row_sum, O_acc, p.scale_log2);
    store_p<C>(sP, g, c, S);
    cp_async_wait<0>();  // this thread's copies of V_j landed
    __syncthreads();     // all of P_ij and of V_j is written before any warp reads it

    // Every warp is past scores_tile, so sK is free: K_{j+1} travels during P·V.
    if (j + 1 < T_c) tile_copy_async<KTile>(sK, K, k0 + C::B_c, p.seq_k, p.d);
    cp_async_commit();
    accumulate_pv<C>(sP, sV, g, c, O_acc);
    // Barrier 3 also does barrier 1's job for the next tile: K_{j+1} has had all of P·V to
    // travel; once every thread's part has landed, the barrier publishes it.
    cp_async_wait<0>();  // this thread's copies of K_{j+1} landed
    __syncthreads();     // every warp is done with sK, sV, sP before the next tile overwrites them

    // sV is free now; V_{j+1} travels during S_{i,j+1} and its softmax.
    if (j + 1 < T_c) tile_copy_async<VTile>(sV, V, k0 + C::B_c, p.seq_k, p.d);
    cp_async_commit();
  }
  //! [key loop]
  // No copy may outlive the block (the groups still open here are empty: this costs nothing).
  cp_async_wait<0>();
  write_output<C>(p, bh, q0, g, c, row_max, row_sum, O_acc);
}

// ---------------------------------------------------------------------------------------
// Host side: choose the configuration and the step, validate, launch.
// ---------------------------------------------------------------------------------------

int padded_head_dim(int d) {
  require_head_dim(kStageName, d, kHeadDims);
  return (d + 31) / 32 * 32;
}

// The layout of sQ, sK, sP at padded head dim D. Auto: swizzled at D = 128 (the 64-key tile
// then fits two blocks per SM, measured 5 % faster than the padded 32-key tile), padded
// elsewhere (at D = 64 the padded tile was measured 4 % faster); with block_k = 32 set by
// hand, padded (the swizzled tiles are built for B_c = 64 only).
bool swizzled_for(int D, const Options& o) {
  if (o.smem_layout == SmemLayout::Auto) return D == 128 && o.block_k != 32;
  if (o.smem_layout == SmemLayout::Swizzled && o.block_k == 32)
    throw std::invalid_argument(std::string(kStageName) +
                                ": smem_layout swizzled is built for block_k = 64 only (asked: block_k = 32)");
  return o.smem_layout == SmemLayout::Swizzled;
}

// B_c: block_k when set; else 64 keys while the padded tiles stay small enough for three
// blocks per SM (D ≤ 64: 67 KiB) and for the swizzled tiles (two blocks at D = 128), 32 for
// the padded tiles at D = 96 and 128 (a 64-key tile would need 91 and 115 KiB: one or two
// blocks per SM; 32 keys keep three).
int block_k_for(int D, bool swizzled, const Options& o) {
  if (o.block_k != 0) return o.block_k;
  return D <= 64 || swizzled ? 64 : 32;
}

StepKernel kernel_for(const LaunchShape& s) {
  const bool sw = s.swizzled;
  switch (Step(s.step)) {
    case Step::SyncLoads: return step_07a(s.head_dim_padded, s.block_k, sw);
    case Step::CpAsync: return step_07b(s.head_dim_padded, s.block_k, sw);
    case Step::TwoBarriers:
    case Step::Auto: break;
  }
  return step_07c(s.head_dim_padded, s.block_k, sw);
}

void require_aligned(const void* ptr, const char* name) {
  require_device_pointer(kStageName, name, ptr, 16, "the kernel reads and writes rows as float4");
}

}  // namespace

StepKernel step_07c(int D, int B_c, bool swizzled) {
  return instantiate_config(D, B_c, swizzled, [](auto cfg) {
    using C = decltype(cfg);
    return config_step_kernel<C>(flash_forward_kernel<C>, 2, true);
  });
}

const std::vector<std::string>& smem_layout_names() {
  static const std::vector<std::string> names{"auto", "padded", "swizzled"};
  return names;
}

LaunchShape launch_shape(const Problem& p) { return launch_shape(p, current_options()); }

LaunchShape launch_shape(const Problem& p, const Options& o) {
  p.validate(kStageName);
  LaunchShape s;
  s.head_dim_padded = padded_head_dim(p.head_dim);
  s.block_q = kBlockQ;
  s.step = o.step == Step::Auto ? int(Step::TwoBarriers) : int(o.step);
  s.swizzled = swizzled_for(s.head_dim_padded, o);
  s.block_k = block_k_for(s.head_dim_padded, s.swizzled, o);
  const long long T_r = (int64_t(p.seq_q) + kBlockQ - 1) / kBlockQ;
  s.blocks = T_r * p.batch * p.heads;
  const StepKernel k = kernel_for(s);
  s.threads = k.threads;
  s.pipelined = k.pipelined;
  s.barriers = k.barriers;
  s.shared_bytes = k.smem_bytes;
  return s;
}

void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O,
             float* L, cudaStream_t stream) {
  const LaunchShape shape = launch_shape(p);  // validates the problem, the head dim, the options
  if (shape.blocks == 0) return;              // N_q = 0: nothing to write
  if (shape.blocks > std::numeric_limits<int>::max())
    throw std::invalid_argument(std::string(kStageName) + ": " + std::to_string(shape.blocks) +
                                " thread blocks (query tiles · batch · heads) exceed the grid "
                                "limit of 2^31 − 1");
  require_aligned(Q, "Q");
  require_aligned(O, "O");
  if (p.kv_elems() > 0) {
    require_aligned(K, "K");
    require_aligned(V, "V");
  }
  if (reinterpret_cast<uintptr_t>(L) % alignof(float) != 0)
    throw std::invalid_argument(std::string(kStageName) + ": L is not 4-byte aligned");

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

  const StepKernel k = kernel_for(shape);
  void* args[] = {&params};
  launch(k, dim3(unsigned(shape.blocks)), args, stream);  // sets its attributes once per device
}

std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p) {
  const LaunchShape s = launch_shape(p);
  std::vector<std::pair<std::string, std::string>> rows;
  std::ostringstream tile;
  tile << "B_r x B_c = " << s.block_q << " x " << s.block_k << ", d padded to " << s.head_dim_padded
       << "; per thread 4 rows: S 4 x " << s.block_k / 8 << ", O 4 x " << s.head_dim_padded / 8
       << " in registers; sQ, sK, sP " << (s.swizzled ? "swizzled" : "padded");
  rows.emplace_back("tiles", tile.str());
  rows.emplace_back("step", step_names()[size_t(s.step)] + (current_options().step == Step::Auto ? " (auto)" : "") +
                                ", " + std::to_string(s.barriers) + " barriers per key tile");
  rows.emplace_back("loads", s.pipelined ? "cp.async: K_j+1 during P V_j, V_j+1 during S_i,j+1"
                                         : "K_j, V_j through registers, then the tile's math");
  if (!have_gpu()) {
    rows.emplace_back("launch", std::to_string(s.blocks) + " blocks x " + std::to_string(s.threads) +
                                    " threads, " + std::to_string(s.shared_bytes) +
                                    " B shared per block (registers, occupancy: no GPU here)");
    return rows;
  }
  const StepKernel k = kernel_for(s);
  prepare_kernel(k);
  for (auto& row : describe_launch(k.fn, dim3(unsigned(std::max<long long>(s.blocks, 0))), dim3(unsigned(k.threads)),
                                   k.smem_bytes))
    rows.push_back(row);
  return rows;
}

}  // namespace fa::stage07
