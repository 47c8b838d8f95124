// Stage 13 on Hopper, the block's plumbing: its warpgroups, the shared-memory plan, the work
// list of (document, query tile) pairs, and the producer's loads. Stage 10's persistent
// design (stages/10_hopper_fwd/pipeline.cuh), written again for this stage's kernel: the
// same ring of K/V buffers with full/empty barriers and the same two Q buffers; what differs
// is the work tile (a document's query tile) and which key tiles the producer loads (the
// document mask's key_tile_range, the same call the consumers make).
#pragma once

#include <cstdint>

#include "document_mask.h"
#include "hopper/pipeline_state.cuh"
#include "hopper/ptx.cuh"
#include "hopper/traits.h"
#include "masked_params.h"

namespace fa::stage13 {

using namespace fa::hopper;
using stage10::kRowsPerWarpgroup;
using stage10::Tile;
using stage10::tile_bytes;

/// Warpgroup 0 is the producer (one thread issues every TMA); warpgroups 1 … kConsumers are
/// consumers, consumer c owning query rows [64c, 64c + 64) of the tile. Stage 10's split:
/// two consumers (B_r = 128), three at d = 64 (B_r = 192), and its register counts.
template <int d>
struct MaskedRoles {
  static constexpr int kConsumers = Tile<d>::kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlockM = kRowsPerWarpgroup * kConsumers;  // B_r
  static constexpr int kBlockN = Tile<d>::kBlockN;                // B_c
  static constexpr int kStages = Tile<d>::kStages;
  static constexpr int kQBuffers = 2;  // the next tile's Q loads while the consumers use the other
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static_assert(128 * kProducerRegisters + 128 * kConsumers * kConsumerRegisters <= stage10::launch_register_pool(kThreads));
  /// Named barriers (0 is __syncthreads): consumer c's ping-pong turn is 1 + c, its epilogue's
  /// barrier 1 + kConsumers + c.
  static constexpr int kPingPongBarrier = 1;
  static constexpr int kEpilogueBarrier = 1 + kConsumers;
};

/// One work tile: a query tile of one document and one (batch, head).
struct WorkTile {
  int q_start, n_q;  ///< the document's first query (packed) and its length
  int k_start, n_k;  ///< its first key and its length
  int row0;          ///< the tile's first row, in the document
  int bh;            ///< batch · heads + head; −1: no more work
  __device__ DocumentMask mask(const MaskedParams& p) const { return {n_q, n_k, p.window_left, p.window_right}; }
};

/// Work tile t of the list. Stage 10f's order (its HeadSections): the (batch, head) pairs in
/// sections of p.heads_per_section, whose K and V fit in the L2 together, a section at a
/// time; inside a section the heads of one position go together, and the positions run from
/// one head's last query tile to its first — the document last in the sequence first, and in
/// each document its last tile (under the causal mask, the heaviest) first. The document of
/// position u: the last with first_tile ≤ u (an empty document shares its first_tile with the
/// next, which is then the one chosen).
template <int d>
__device__ inline WorkTile work_of(const MaskedParams& p, int t) {
  const int heads_total = p.batch * p.heads, per_head = p.first_tile[p.documents];
  const int per_section = p.heads_per_section * per_head;
  const int first_head = t / per_section * p.heads_per_section, in_section = t % per_section;
  const int heads_here = min(p.heads_per_section, heads_total - first_head);  // the last section may be short
  const int u = per_head - 1 - in_section / heads_here;
  int lo = 0, hi = p.documents - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.first_tile[mid] <= u) lo = mid; else hi = mid - 1;
  }
  WorkTile w;
  w.q_start = p.cu_q[lo];
  w.n_q = p.cu_q[lo + 1] - w.q_start;
  w.k_start = p.cu_k[lo];
  w.n_k = p.cu_k[lo + 1] - w.k_start;
  w.row0 = (u - p.first_tile[lo]) * MaskedRoles<d>::kBlockM;
  w.bh = first_head + in_section % heads_here;
  return w;
}

/// Byte offsets in the block's dynamic shared memory (base 1024-aligned):
///   Q [kQBuffers][d/64][B_r][64] · K [kStages][d/64][B_c][64] · V, like K · barriers · work tiles
template <int d>
struct MaskedSharedPlan {
  using R = MaskedRoles<d>;
  static constexpr uint32_t q = 0;
  static constexpr uint32_t k = q + R::kQBuffers * tile_bytes(R::kBlockM, d);
  static constexpr uint32_t v = k + R::kStages * tile_bytes(R::kBlockN, d);
  static constexpr uint32_t barriers = v + R::kStages * tile_bytes(R::kBlockN, d);
  // q_full[kQBuffers], q_empty[kQBuffers], k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages]
  static constexpr uint32_t work = barriers + 8 * (2 * R::kQBuffers + 4 * R::kStages);
  static constexpr uint32_t bytes = work + sizeof(WorkTile) * R::kQBuffers;
  static_assert(bytes + 1024 <= 227 * 1024, "more shared memory than a block may have");
  static constexpr uint32_t bytes_to_allocate = bytes + 1024;  // room to align the base
};

template <int d, class Elem>
struct MaskedShared {
  using R = MaskedRoles<d>;
  Elem *q, *k, *v;
  uint64_t *q_full, *q_empty, *k_full, *v_full, *k_empty, *v_empty;
  WorkTile* work;  ///< [kQBuffers]: the work tile of each Q buffer, written by the producer before q_full

  __device__ explicit MaskedShared(unsigned char* raw) {
    using Plan = MaskedSharedPlan<d>;
    // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte-aligned tiles.
    unsigned char* base = raw + ((1024 - smem_address(raw) % 1024) % 1024);
    q = reinterpret_cast<Elem*>(base + Plan::q);
    k = reinterpret_cast<Elem*>(base + Plan::k);
    v = reinterpret_cast<Elem*>(base + Plan::v);
    q_full = reinterpret_cast<uint64_t*>(base + Plan::barriers);
    q_empty = q_full + R::kQBuffers;
    k_full = q_empty + R::kQBuffers;
    v_full = k_full + R::kStages;
    k_empty = v_full + R::kStages;
    v_empty = k_empty + R::kStages;
    work = reinterpret_cast<WorkTile*>(base + Plan::work);
  }
  __device__ Elem* q_buffer(int b) const { return q + b * R::kBlockM * d; }
  __device__ Elem* k_stage(int s) const { return k + s * R::kBlockN * d; }
  __device__ Elem* v_stage(int s) const { return v + s * R::kBlockN * d; }

  /// One thread: every barrier's arrival count, made visible to the copy engine.
  __device__ void init_barriers() const {
    for (int b = 0; b < R::kQBuffers; ++b) {
      mbarrier_init(&q_full[b], 1);
      mbarrier_init(&q_empty[b], 128 * R::kConsumers);  // one arrival per consumer thread
    }
    for (int s = 0; s < R::kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], 4 * R::kConsumers);  // one arrival per consumer warp
      mbarrier_init(&v_empty[s], 4 * R::kConsumers);
    }
    fence_barrier_init();
  }
};

/// One arrival per consumer warp on an "empty" barrier: this warp is done with the tile.
__device__ inline void release_tile(uint64_t* empty_barrier) {
  if (threadIdx.x % 32 == 0) mbarrier_arrive(empty_barrier);
}

/// A [rows, d] tile from packed row `row` of head `bh`: d/64 boxes of [rows, 64].
template <int d, class Elem>
__device__ inline void load_rows(Elem* dst, int rows, const CUtensorMap* map, uint64_t* bar, int row, int bh) {
#pragma unroll
  for (int c = 0; c < d / 64; ++c)
    tma_load_3d(reinterpret_cast<unsigned char*>(dst) + c * rows * 128, map, bar, 64 * c, row, bh);
}

/// The producer's Q tile into buffer b: one box of 64 rows per consumer and column block.
/// Rows past the document's end are loaded too (the next document's, or zeros past the
/// tensor); their results are never stored.
template <int d, class Elem>
__device__ inline void load_q(const MaskedShared<d, Elem>& sm, const MaskedParams& p, const WorkTile& w, int b) {
  using R = MaskedRoles<d>;
  mbarrier_arrive_expect_tx(&sm.q_full[b], tile_bytes(R::kBlockM, d));
  auto* dst = reinterpret_cast<unsigned char*>(sm.q_buffer(b));
#pragma unroll
  for (int c = 0; c < d / 64; ++c)
#pragma unroll
    for (int g = 0; g < R::kConsumers; ++g)
      tma_load_3d(dst + c * R::kBlockM * 128 + g * kRowsPerWarpgroup * 128, &p.map_q, &sm.q_full[b], 64 * c,
                  w.q_start + w.row0 + g * kRowsPerWarpgroup, w.bh);
}

//! [masked producer]
/// The producer's K/V tiles for one work tile: exactly the key tiles of `range` (the skipped
/// ones are never loaded), last to first, each as soon as its ring buffer is free. Tile j
/// holds the document's keys [j·B_c, (j + 1)·B_c); one that runs past the document's end
/// brings the next document's keys, which the consumers mask. `ring`: the tiles this block
/// put into the ring before (PipelineState gives buffer and phase of use ring + n).
template <int d, class Elem>
__device__ inline void load_kv(const MaskedShared<d, Elem>& sm, const MaskedParams& p, const WorkTile& w, int bkv,
                               KeyTileRange range, int ring) {
  using R = MaskedRoles<d>;
  for (int n = 0; n < range.count(); ++n) {
    const int j = range.end - 1 - n, key_row = w.k_start + j * R::kBlockN;
    const auto [s, parity] = PipelineState<R::kStages>::at(ring + n);
    mbarrier_wait(&sm.k_empty[s], parity ^ 1);  // the consumers released K of this buffer
    mbarrier_arrive_expect_tx(&sm.k_full[s], tile_bytes(R::kBlockN, d));
    load_rows<d>(sm.k_stage(s), R::kBlockN, &p.map_k, &sm.k_full[s], key_row, bkv);
    mbarrier_wait(&sm.v_empty[s], parity ^ 1);
    mbarrier_arrive_expect_tx(&sm.v_full[s], tile_bytes(R::kBlockN, d));
    load_rows<d>(sm.v_stage(s), R::kBlockN, &p.map_v, &sm.v_full[s], key_row, bkv);
  }
}
//! [masked producer]

}  // namespace fa::stage13
