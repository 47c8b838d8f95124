/// \file pipeline.cuh
/// \brief Warp specialization's shared parts (steps 10b–10f): the block's shared-memory
/// plan, the K/V ring with its full/empty barriers, the producer's loop (one thread of the
/// producer warpgroup), and the persistent kernels' pieces (two Q_i buffers with q_empty and
/// the tile index, load_q into buffer b, load_kv continuing the ring, the orders AllHeads and
/// HeadSections).
///
/// The ring: kStages buffers, each holding one K tile and one V tile. Per buffer s:
///   k_full[s], v_full[s]    complete when TMA has landed the tile (1 arrival: the
///                           producer's arrive.expect_tx, plus the tile's bytes)
///   k_empty[s], v_empty[s]  complete when all consumer warps are done with that tile
///                           (one arrival per warp after the wgmma that read it: 8 with two
///                           consumers, 12 with three at d = 64)
/// K and V are released separately: K_j is free as soon as S = Q·K_jᵀ has run, long
/// before P·V_j has, so the next K tile can be on its way during the softmax.
/// Iteration n uses buffer n % kStages and waits for the phase of parity (n / kStages) & 1
/// (hopper/pipeline_state.cuh):
///
///   producer:  wait k_empty[s] (parity ^ 1) → expect_tx + TMA K_j → k_full[s]; the same for V
///   consumer:  wait k_full[s] → S = Q·K_jᵀ → arrive k_empty[s] … wait v_full[s] →
///              O += P·V_j → arrive v_empty[s]
#pragma once

#include <cstdint>

#include "hopper/pipeline_state.cuh"
#include "hopper/ptx.cuh"
#include "hopper/tile_schedule.h"
#include "hopper/traits.h"

namespace fa::stage10 {

using namespace fa::hopper;

/// The block's warpgroups: warpgroup 0 is the producer (one thread of it issues every TMA),
/// warpgroups 1 … kConsumers are consumers, consumer c owning query rows [64c, 64c + 64).
template <int kConsumers_>
struct Roles {
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlockM = kRowsPerWarpgroup * kConsumers;  // B_r
  /// Register split (setmaxnreg, multiples of 8). Two consumers: 65 536 registers / 384
  /// threads = 170.7, so 168 at launch (a warp's registers come in units of 256); the
  /// producer needs few, so it drops to 24 and the consumers rise to 240 (128·24 + 256·240 =
  /// 64 512, all the block holds: launch_register_pool). Three consumers (512 threads, 128 at
  /// launch): 24 and 160.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static_assert(128 * kProducerRegisters + 128 * kConsumers * kConsumerRegisters <= launch_register_pool(kThreads));
  /// Named barriers (0 is __syncthreads): one per consumer for the ping-pong (consumer c
  /// waits on 1 + c) and one per consumer for its epilogue.
  static constexpr int kPingPongBarrier = 1;
  static constexpr int kEpilogueBarrier = 1 + kConsumers;
};
/// Steps 10b and 10c: two consumers, B_r = 128.
using TwoConsumers = Roles<2>;
/// Steps 10d, 10e and 10f at head dim d: two consumers, three at d = 64 (traits.h says why).
template <int d>
using RolesOf = Roles<Tile<d>::kConsumers>;
/// Q_i buffers of the persistent kernel: two where they fit in shared memory (not at d = 256).
template <int d>
constexpr int kQBuffersOf = d == 256 ? 1 : 2;

/// One arrival per consumer warp on an "empty" barrier: this warp is done with the tile.
__device__ inline void release(uint64_t* empty_barrier) {
  if (threadIdx.x % 32 == 0) mbarrier_arrive(empty_barrier);
}

/// Byte offsets of everything in the block's dynamic shared memory (base 1024-aligned).
/// kQBuffers: 1, or 2 for the persistent kernel where the shared memory allows (it loads the
/// next Q_i into one buffer while the consumers use the other).
template <int d, class R, int kQBuffers = 1>
struct SharedPlan {
  static constexpr int B_c = Tile<d>::kBlockN, kStages = Tile<d>::kStages;
  static constexpr uint32_t q = 0;                                    // Q_i [kQBuffers][d/64][B_r][64]
  static constexpr uint32_t k = q + kQBuffers * tile_bytes(R::kBlockM, d);  // K [kStages][d/64][B_c][64]
  static constexpr uint32_t v = k + kStages * tile_bytes(B_c, d);     // V, like K
  static constexpr uint32_t barriers = v + kStages * tile_bytes(B_c, d);
  // barriers: q_full[kQBuffers], q_empty[kQBuffers], k_full[kStages], v_full[kStages],
  //           k_empty[kStages], v_empty[kStages]
  static constexpr uint32_t tiles = barriers + 8 * (2 * kQBuffers + 4 * kStages);  // int [kQBuffers]
  static constexpr uint32_t bytes = tiles + 4 * kQBuffers;
  static_assert(bytes + 1024 <= 227 * 1024, "more shared memory than a block may have");
  static constexpr uint32_t bytes_to_allocate = bytes + 1024;  // room to align the base
};

/// Pointers into the plan for one block.
template <int d, class Elem, class R, int kQBuffers = 1>
struct SharedTiles {
  static constexpr int B_c = Tile<d>::kBlockN, kStages = Tile<d>::kStages;
  Elem* q;  ///< the first Q_i buffer
  Elem* k;
  Elem* v;
  uint64_t* q_full;   ///< [kQBuffers]
  uint64_t* q_empty;  ///< [kQBuffers]: the persistent kernels (10e, 10f) reload a Q_i buffer once every consumer thread is done with it
  uint64_t* k_full;
  uint64_t* v_full;
  uint64_t* k_empty;
  uint64_t* v_empty;
  int* tile;  ///< [kQBuffers]: the persistent kernels' work tile of each Q_i buffer (−1: no more work)

  __device__ explicit SharedTiles(unsigned char* raw) {
    using Plan = SharedPlan<d, R, kQBuffers>;
    // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte-aligned tiles.
    unsigned char* base = raw + ((1024 - smem_address(raw) % 1024) % 1024);
    q = reinterpret_cast<Elem*>(base + Plan::q);
    k = reinterpret_cast<Elem*>(base + Plan::k);
    v = reinterpret_cast<Elem*>(base + Plan::v);
    q_full = reinterpret_cast<uint64_t*>(base + Plan::barriers);
    q_empty = q_full + kQBuffers;
    k_full = q_empty + kQBuffers;
    v_full = k_full + kStages;
    k_empty = v_full + kStages;
    v_empty = k_empty + kStages;
    tile = reinterpret_cast<int*>(base + Plan::tiles);
  }
  __device__ Elem* q_buffer(int b) const { return q + b * R::kBlockM * d; }
  __device__ Elem* k_stage(int s) const { return k + s * B_c * d; }
  __device__ Elem* v_stage(int s) const { return v + s * B_c * d; }

  /// One thread: every barrier's arrival count, made visible to the copy engine.
  __device__ void init_barriers() const {
    for (int b = 0; b < kQBuffers; ++b) {
      mbarrier_init(&q_full[b], 1);
      mbarrier_init(&q_empty[b], 128 * R::kConsumers);  // one arrival per consumer thread
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], 4 * R::kConsumers);  // one arrival per consumer warp
      mbarrier_init(&v_empty[s], 4 * R::kConsumers);
    }
    fence_barrier_init();
  }
};

/// Issues `count` TMA boxes of [rows, 64] for a [rows, d] tile starting at `row`, one per
/// column block, completing on `bar`.
template <int d, class Elem>
__device__ inline void load_tile(Elem* dst, int rows, const CUtensorMap* map, uint64_t* bar, int row, int bh) {
#pragma unroll
  for (int c = 0; c < d / 64; ++c)
    tma_load_3d(reinterpret_cast<unsigned char*>(dst) + c * rows * 128, map, bar, 64 * c, row, bh);
}

/// The producer's Q_i into buffer `b`: one box of 64 rows per consumer and column block, on q_full[b].
template <int d, class Elem, class R, int kQ>
__device__ inline void load_q(const SharedTiles<d, Elem, R, kQ>& sm, const FwdParams& p, int row0, int bh, int b = 0) {
  mbarrier_arrive_expect_tx(&sm.q_full[b], tile_bytes(R::kBlockM, d));
  auto* dst = reinterpret_cast<unsigned char*>(sm.q_buffer(b));
#pragma unroll
  for (int c = 0; c < d / 64; ++c)
#pragma unroll
    for (int w = 0; w < R::kConsumers; ++w)
      tma_load_3d(dst + c * R::kBlockM * 128 + w * kRowsPerWarpgroup * 128, &p.map_q, &sm.q_full[b], 64 * c,
                  row0 + w * kRowsPerWarpgroup, bh);
}

/// The producer's K/V tiles: those the query tile visits, last to first, into the ring, each
/// as soon as its buffer is free. `ring` counts the tiles this block has put into the ring
/// before (0 for a block with one query tile), so the n-th use of the ring, over all of the
/// block's query tiles, takes buffer n % kStages and phase n / kStages (PipelineState).
template <int d, class Elem, class R, int kQ>
__device__ inline void load_kv(const SharedTiles<d, Elem, R, kQ>& sm, const FwdParams& p, int bkv, KeyTiles tiles,
                               int ring = 0) {
  constexpr int B_c = Tile<d>::kBlockN, kStages = Tile<d>::kStages;
  //! [producer loop]
  // LAB BEGIN: the producer's loop — hint: for the n-th tile j = count−1−n, use ring + n of the ring: [s, parity] = PipelineState<kStages>::at(ring + n); wait k_empty[s] for parity ^ 1, expect_tx the K tile's bytes on k_full[s], load it; the same for V
  for (int n = 0; n < tiles.count; ++n) {
    const int j = tiles.count - 1 - n;
    const auto [s, parity] = PipelineState<kStages>::at(ring + n);
    mbarrier_wait(&sm.k_empty[s], parity ^ 1);  // the consumers released K of this buffer
    mbarrier_arrive_expect_tx(&sm.k_full[s], tile_bytes(B_c, d));
    load_tile<d>(sm.k_stage(s), B_c, &p.map_k, &sm.k_full[s], j * B_c, bkv);
    mbarrier_wait(&sm.v_empty[s], parity ^ 1);
    mbarrier_arrive_expect_tx(&sm.v_full[s], tile_bytes(B_c, d));
    load_tile<d>(sm.v_stage(s), B_c, &p.map_v, &sm.v_full[s], j * B_c, bkv);
  }
  // LAB END
  //! [producer loop]
}

/// The producer of a block with one query tile (10b–10d): Q_i, then its K/V tiles.
template <int d, class Elem, class R>
__device__ inline void produce(const SharedTiles<d, Elem, R>& sm, const FwdParams& p, int row0, int bh, int bkv,
                               KeyTiles tiles) {
  load_q(sm, p, row0, bh);
  load_kv(sm, p, bkv, tiles);
}

/// Which query tile, head and batch this block computes, and the key tiles it visits.
struct BlockWork {
  int row0, bh, bkv;
  KeyTiles tiles;
};

template <int d, bool kCausal, class R>
__device__ inline BlockWork block_work(const FwdParams& p) {
  // Query tiles are counted from the end of the sequence, the last tile first: under a
  // causal mask the last tiles visit the most key tiles, so they start first; and when B_r
  // does not divide seq_q, the partial tile is the first one (its rows below 0 read zeros
  // and are never written), the tile that sees the fewest keys, not the most.
  const int from_end = int(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (p.heads / p.kv_heads);  // grouped-query attention
  BlockWork w;
  w.row0 = p.seq_q - (from_end + 1) * R::kBlockM;  // may be negative: see above
  w.bh = batch * p.heads + head;
  w.bkv = batch * p.kv_heads + kv_head;
  w.tiles = key_tiles(w.row0, R::kBlockM, p.seq_q, p.seq_k, Tile<d>::kBlockN, kCausal);
  return w;
}

/// Query tile `from_end` (counted from the end of the sequence, as in block_work) of the
/// (batch, head) pair bh.
template <int d, bool kCausal, class R>
__device__ inline BlockWork work_of(const FwdParams& p, int bh, int from_end) {
  const int head = bh % p.heads, batch = bh / p.heads;
  BlockWork w;
  w.row0 = p.seq_q - (from_end + 1) * R::kBlockM;
  w.bh = bh;
  w.bkv = batch * p.kv_heads + head / (p.heads / p.kv_heads);
  w.tiles = key_tiles(w.row0, R::kBlockM, p.seq_q, p.seq_k, Tile<d>::kBlockN, kCausal);
  return w;
}

/// The persistent kernels' work list: the t-th work tile (a query tile of one batch and
/// head), in one of two orders.
///
/// Step 10e, AllHeads. Without a mask every tile costs the same: the query tiles of one
/// (batch, head) are consecutive, so the blocks running at one time share a few heads' K and
/// V, which then stay in L2. Under the causal mask the last query tile of every head comes
/// first, then the one above it, and so on: the heaviest tiles start first and the lightest
/// fill the end. (Head-major order there would hand block b the same position in every head
/// whenever the SM count is a multiple of the tiles per head: one block all heavy tiles,
/// another all light ones.) But the blocks running at one time then read the K and V of
/// every head at once, more than the L2 holds, and each K/V tile comes from memory once per
/// query tile that visits it.
struct AllHeads {
  template <int d, bool kCausal, class R>
  __device__ static BlockWork work(const FwdParams& p, int t) {
    const int query_tiles = (p.seq_q + R::kBlockM - 1) / R::kBlockM, heads_total = p.batch * p.heads;
    const int from_end = kCausal ? t / heads_total : t % query_tiles;
    const int bh = kCausal ? t % heads_total : t / query_tiles;
    return work_of<d, kCausal, R>(p, bh, from_end);
  }
};

/// Step 10f, HeadSections. Under the causal mask: the heads in sections of
/// p.heads_per_section (the launcher's rule: a power of two, their K and V fitting in the L2
/// together), a section at a time, and inside a section the last query tile of every head
/// first, then the one above it, and so on. The heaviest tiles still come first within the
/// section (and the dynamic scheduler evens out the rest), while the blocks running at one
/// time read one section's K and V, which stays in L2. Without a mask, 10e's order: the
/// tiles of one head are consecutive already.
//! [head sections]
struct HeadSections {
  template <int d, bool kCausal, class R>
  __device__ static BlockWork work(const FwdParams& p, int t) {
    if constexpr (!kCausal) return AllHeads::work<d, kCausal, R>(p, t);
    const int query_tiles = (p.seq_q + R::kBlockM - 1) / R::kBlockM, heads_total = p.batch * p.heads;
    const int per_section = p.heads_per_section * query_tiles;
    const int first_head = t / per_section * p.heads_per_section, in_section = t % per_section;
    const int heads_here = min(p.heads_per_section, heads_total - first_head);  // the last section may be short
    return work_of<d, kCausal, R>(p, first_head + in_section % heads_here, in_section / heads_here);
  }
};
//! [head sections]

}  // namespace fa::stage10
