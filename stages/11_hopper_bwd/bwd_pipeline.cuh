/// \file bwd_pipeline.cuh
/// \brief The block's shared-memory plan and the loads of the backward: K_j and V_j once,
/// then per step a query tile's Q_i, dO_i and statistics (L2_i, D_i) into a ring of
/// kStages buffers, each completing on its own mbarrier.
///
///   kv_full        K_j and V_j landed (TMA, once per block)
///   full[s]        buffer s holds step n's Q_i, dO_i, L2_i, D_i (TMA + two bulk copies)
///   empty[s]       every computing thread is done with buffer s (one arrival per thread: each
///                  thread's arrive follows its own reads of L2_i, D_i. One arrival per warp
///                  after __syncwarp orders them too, but compute-sanitizer's racecheck does
///                  not follow that chain and reports the refill as a race)
/// Step n uses buffer n % kStages and waits for the phase of parity (n / kStages) & 1, as
/// in stage 10's K/V ring (hopper/pipeline_state.cuh); here the stream is of query tiles,
/// not keys.
#pragma once

#include <cstdint>

#include "bwd_schedule.h"
#include "bwd_traits.h"
#include "hopper/pipeline_state.cuh"
#include "hopper/ptx.cuh"
#include "hopper/traits.h"

namespace fa::stage11 {

using namespace fa::hopper;
using stage10::tile_bytes;

/// The dQ staging of step 11d: dQ_i [B_r, d] in fp32 as [64, 64] blocks, each laid out as
/// dQ_accum holds a block in step 11d (dq_layout.h): 16 KB per block, one bulk copy each.
/// 32 KB at d = 64 and 128 (a block per consumer), 64 KB at d = 256 (two per consumer).
constexpr uint32_t staging_bytes(int B_r, int d) { return uint32_t(B_r) * uint32_t(d) * 4u; }

/// Byte offsets of everything in the block's dynamic shared memory (base 1024-aligned).
/// kStaging: room for step 11d's dQ staging and its three barriers.
template <int d, int B_c, int B_r, int kStages, int kDsBuffers, bool kStaging = false>
struct BwdPlan {
  static constexpr uint32_t k = 0;                                          // K_j [d/64][B_c][64]
  static constexpr uint32_t v = k + tile_bytes(B_c, d);                     // V_j, like K
  static constexpr uint32_t q = v + tile_bytes(B_c, d);                     // Q_i [kStages][d/64][B_r][64]
  static constexpr uint32_t dO = q + kStages * tile_bytes(B_r, d);          // dO_i, like Q
  static constexpr uint32_t ds = dO + kStages * tile_bytes(B_r, d);         // dSᵀ [kDsBuffers][B_r/64][B_c][64]
  static constexpr uint32_t l2 = ds + kDsBuffers * tile_bytes(B_c, B_r);    // L2_i [kStages][B_r] fp32
  static constexpr uint32_t dd = l2 + kStages * B_r * 4;                    // D_i, like L2
  static constexpr uint32_t staging = dd + kStages * B_r * 4;              // dQ blocks [B_r·d/4096][64][64] fp32
  static constexpr uint32_t barriers = staging + (kStaging ? staging_bytes(B_r, d) : 0);
  // kv_full, full[S], empty[S]; with kStaging also dq_full[2], dq_empty
  static constexpr uint32_t bytes = barriers + 8 * (1 + 2 * kStages + (kStaging ? 3 : 0));
  static_assert(bytes + 1024 <= 227 * 1024, "more shared memory than a block may have");
  static constexpr uint32_t bytes_to_allocate = bytes + 1024;  // room to align the base
  /// Bytes that land in full[s] per step: Q_i, dO_i, L2_i, D_i.
  static constexpr uint32_t step_bytes = 2 * tile_bytes(B_r, d) + 2 * B_r * 4;
};

/// Pointers into the plan for one block.
template <int d, int B_c, int B_r, int kStages, int kDsBuffers, class Elem, bool kStaging = false>
struct BwdShared {
  using Plan = BwdPlan<d, B_c, B_r, kStages, kDsBuffers, kStaging>;
  static constexpr int kRing = kStages;
  Elem *k, *v, *q, *dO, *ds;
  float *l2, *dd, *staging;
  uint64_t *kv_full, *full, *empty;
  uint64_t *dq_full, *dq_empty;  ///< kStaging: [2] (128 arrivals: a consumer's threads), and 1 (the writer)

  __device__ explicit BwdShared(unsigned char* raw) {
    // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte-aligned tiles.
    unsigned char* base = raw + ((1024 - smem_address(raw) % 1024) % 1024);
    k = reinterpret_cast<Elem*>(base + Plan::k);
    v = reinterpret_cast<Elem*>(base + Plan::v);
    q = reinterpret_cast<Elem*>(base + Plan::q);
    dO = reinterpret_cast<Elem*>(base + Plan::dO);
    ds = reinterpret_cast<Elem*>(base + Plan::ds);
    l2 = reinterpret_cast<float*>(base + Plan::l2);
    dd = reinterpret_cast<float*>(base + Plan::dd);
    staging = reinterpret_cast<float*>(base + Plan::staging);
    kv_full = reinterpret_cast<uint64_t*>(base + Plan::barriers);
    full = kv_full + 1;
    empty = full + kStages;
    dq_full = empty + kStages;
    dq_empty = dq_full + 2;
  }
  /// Block c of the staging area: consumer c's dQ block at d = 64 and 128.
  __device__ float* staging_block(int c) const { return staging + c * 64 * 64; }
  __device__ Elem* q_stage(int s) const { return q + s * B_r * d; }
  __device__ Elem* do_stage(int s) const { return dO + s * B_r * d; }
  __device__ Elem* ds_buffer(int b) const { return ds + b * B_c * B_r; }
  __device__ float* l2_stage(int s) const { return l2 + s * B_r; }
  __device__ float* dd_stage(int s) const { return dd + s * B_r; }

  /// One thread: every barrier's arrival count, made visible to the copy engine.
  /// `computing_threads` arrive on empty[s] once each per use.
  __device__ void init_barriers(int computing_threads) const {
    mbarrier_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], computing_threads);
    }
    if (kStaging) {
      mbarrier_init(&dq_full[0], 128);
      mbarrier_init(&dq_full[1], 128);
      mbarrier_init(dq_empty, 1);
    }
    fence_barrier_init();
  }

  /// One thread: K_j and V_j (keys key0 … key0 + B_c − 1 of kv head bkv) onto kv_full.
  __device__ void load_kv(const BwdParams& p, int key0, int bkv) const {
    mbarrier_arrive_expect_tx(kv_full, 2 * tile_bytes(B_c, d));
#pragma unroll
    for (int c = 0; c < d / 64; ++c) {
      tma_load_3d(reinterpret_cast<unsigned char*>(k) + c * column_block_bytes(B_c), &p.map_k, kv_full, 64 * c, key0,
                  bkv);
      tma_load_3d(reinterpret_cast<unsigned char*>(v) + c * column_block_bytes(B_c), &p.map_v, kv_full, 64 * c, key0,
                  bkv);
    }
  }

  /// One thread: query tile i of head bh (Q_i, dO_i in boxes of 64 rows, L2_i, D_i) into
  /// buffer s, completing on full[s]. Rows past seq_q read as zeros (Q, dO) or padding.
  __device__ void load_step(const BwdParams& p, int s, int bh, int i) const {
    mbarrier_arrive_expect_tx(&full[s], Plan::step_bytes);
#pragma unroll
    for (int c = 0; c < d / 64; ++c)
#pragma unroll
      for (int w = 0; w < B_r / 64; ++w) {
        const uint32_t at = c * column_block_bytes(B_r) + w * 64 * 128;
        tma_load_3d(reinterpret_cast<unsigned char*>(q_stage(s)) + at, &p.map_q, &full[s], 64 * c, i * B_r + 64 * w, bh);
        tma_load_3d(reinterpret_cast<unsigned char*>(do_stage(s)) + at, &p.map_do, &full[s], 64 * c, i * B_r + 64 * w,
                    bh);
      }
    const int64_t stats = int64_t(bh) * p.n_q_pad + int64_t(i) * B_r;
    bulk_load(l2_stage(s), p.L2 + stats, B_r * 4, &full[s]);
    bulk_load(dd_stage(s), p.D + stats, B_r * 4, &full[s]);
  }
};

/// The block's work: key tile blockIdx.x of kv head blockIdx.y in batch blockIdx.z, and
/// its steps: every query head of the kv head's group (grouped-query attention: dK_j and
/// dV_j sum them), and for each the query tiles that meet the key tile.
struct BlockWork {
  int key0, bkv;
  int first_bh;  ///< batch·heads + the group's first query head
  QueryTiles tiles;
  int steps;  ///< group size × tiles.count
  __device__ int bh(int n) const { return first_bh + n / tiles.count; }
  __device__ int tile(int n) const { return tiles.first + n % tiles.count; }
};

/// The grid is (key tiles, kv heads, batch), the key tile the fastest index: the blocks
/// running at one time are mostly of one head and share its Q_i, dO_i in L2. (Under the
/// causal mask, ordering the blocks by key tile across all heads, heaviest first, was
/// measured 35–45% slower: every running block then read a different head's queries.)
template <int B_c, int B_r, bool kCausal>
__device__ inline BlockWork block_work(const BwdParams& p) {
  const int group = p.heads / p.kv_heads;
  BlockWork w;
  w.key0 = int(blockIdx.x) * B_c;
  w.bkv = int(blockIdx.z) * p.kv_heads + int(blockIdx.y);
  w.first_bh = int(blockIdx.z) * p.heads + int(blockIdx.y) * group;
  w.tiles = query_tiles(w.key0, B_c, B_r, p.seq_q, p.seq_k, kCausal);
  w.steps = w.tiles.count > 0 ? group * w.tiles.count : 0;
  return w;
}

/// Warp specialization (steps 11b, 11c): warpgroup 0 is the producer (one of its threads
/// issues every copy), warpgroups 1 and 2 are consumers of 64 keys each. Registers: 65 536
/// / 384 threads = 170.7, so 168 at launch (a warp's registers come in units of 256, and
/// setmaxnreg takes multiples of 8); the producer drops to 24, the consumers rise to 240
/// (128·24 + 256·240 = 64 512, all the block holds: launch_register_pool).
struct Specialized {
  static constexpr int kThreads = 3 * 128;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= stage10::launch_register_pool(kThreads));
  static constexpr int kConsumersBarrier = 1;  ///< named barrier of the two consumer warpgroups
  /// kStaging: with step 11d's dQ staging.
  template <int d, class Elem, bool kStaging = false>
  using Shared = BwdShared<d, BwdTile<d>::kBlockN, BwdTile<d>::kBlockM, BwdTile<d>::kStages, 2, Elem, kStaging>;

  /// The producer's loop (one thread): K_j and V_j, then each step's query tile into the
  /// ring as soon as its buffer is released.
  template <class SharedTiles>
  __device__ static void produce(const SharedTiles& sm, const BwdParams& p, const BlockWork& work) {
    constexpr int kStages = SharedTiles::kRing;
    //! [producer loop]
    sm.load_kv(p, work.key0, work.bkv);
    for (int n = 0; n < work.steps; ++n) {
      const auto [s, parity] = PipelineState<kStages>::at(n);
      mbarrier_wait(&sm.empty[s], parity ^ 1);  // the consumers released buffer s
      sm.load_step(p, s, work.bh(n), work.tile(n));
    }
    //! [producer loop]
  }
};

}  // namespace fa::stage11
