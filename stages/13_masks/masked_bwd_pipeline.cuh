// Stage 13 on Hopper, the backward's block: its work (a key tile of one document, the query
// tiles that see it), its shared-memory plan and the producer's loads. Stage 11's design
// (bwd_pipeline.cuh there), with the document table in place of the plain sequence:
//
//   kv_full        K_j and V_j landed (TMA, once per block)
//   full[s]        buffer s holds step n's Q_i, dO_i, L2_i, D_i (TMA + two bulk copies)
//   empty[s]       every consumer thread is done with buffer s (one arrival per thread)
//   dq_full[c]     consumer c's dQ block is staged (128 arrivals; hopper/dq_staging.cuh)
//   dq_empty       the writer has read the step's two staged blocks (1 arrival)
// Step n uses buffer n % kStages with the phase of PipelineState<kStages>::at(n).
#pragma once

#include <cstdint>

#include "document_mask.h"
#include "hopper/pipeline_state.cuh"
#include "hopper/ptx.cuh"
#include "hopper/traits.h"
#include "hopper/wgmma.cuh"
#include "masked_params.h"

namespace fa::stage13 {

using namespace fa::hopper;
using stage10::tile_bytes;

/// Stage 11's tiles: a block owns B_c = 128 keys, 64 per consumer warpgroup, and streams the
/// query tiles past them B_r rows at a time, B_r chosen so that each consumer's share of dQ_i
/// is one [64, 64] block (at d = 128 the two split dQ_i [64, 128] by columns, at d = 64 they
/// split dQ_i [128, 64] by rows). Warpgroup 0 is the producer: one thread of its warp 0
/// issues every load, one of its warp 1 (the writer) adds the staged dQ blocks to dQ_accum.
/// Registers: the producer warpgroup drops to 24, the consumers rise to 240.
template <int d>
struct BwdRoles {
  static_assert(d == 64 || d == 128, "the backward is built for d = 64 and 128");
  static constexpr int kBlockN = 128;                 // B_c
  static constexpr int kBlockM = d == 64 ? 128 : 64;  // B_r
  static constexpr int kStages = 2;                   // Q_i/dO_i buffers
  static constexpr int kThreads = 3 * 128;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= stage10::launch_register_pool(kThreads));
  static_assert(kDocumentPad % kBlockM == 0, "a query tile is one aligned run of the padded scratch");
  static constexpr int kConsumersBarrier = 1;  ///< named barrier of the two consumer warpgroups
  static constexpr int kEpilogueBarrier = 2;   ///< 2 + c: consumer c's own (the epilogue)
};

/// The block's work: key tile j of document `doc` (keys [j·B_c, (j + 1)·B_c) of the document)
/// of kv head bkv, and its steps: every query head of the kv head's group (grouped-query
/// attention: dK_j and dV_j sum them), for each the query tiles of the document that see the
/// key tile (DocumentMask::query_tile_range — the transpose of the forward's question).
struct BwdWork {
  int doc;          ///< the document
  int q_start, k_start;
  DocumentMask mask;
  int j;            ///< the key tile, counted from the document's first key
  int bkv;          ///< batch · kv_heads + kv head
  int first_bh;     ///< batch · heads + the group's first query head
  KeyTileRange tiles;  ///< query tiles [first, end) of the document
  int steps;        ///< group size × tiles.count()
  __device__ int bh(int n) const { return first_bh + n / tiles.count(); }
  __device__ int tile(int n) const { return tiles.first + n % tiles.count(); }
};

/// Block b: key tile x and kv-head row (batch · kv_heads + kv head) of p.order.at(b). x counts
/// the key tiles of all documents in turn; the document is the last whose first key tile is
/// ≤ x (an empty one shares its first key tile with the next, which is then chosen).
template <int d>
__device__ inline BwdWork bwd_work(const MaskedBwdParams& p) {
  using R = BwdRoles<d>;
  int x = 0, row = 0;
  p.order.at(int(blockIdx.x), x, row);
  int lo = 0, hi = p.documents - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.first_key_tile[mid] <= x) lo = mid; else hi = mid - 1;
  }
  BwdWork w;
  w.doc = lo;
  w.q_start = p.cu_q[lo];
  w.k_start = p.cu_k[lo];
  w.mask = {p.cu_q[lo + 1] - w.q_start, p.cu_k[lo + 1] - w.k_start, p.window_left, p.window_right};
  w.j = x - p.first_key_tile[lo];
  const int group = p.heads / p.kv_heads, batch = row / p.kv_heads, kv_head = row % p.kv_heads;
  w.bkv = row;
  w.first_bh = batch * p.heads + kv_head * group;
  w.tiles = w.mask.query_tile_range(w.j, R::kBlockM, R::kBlockN);
  w.steps = group * w.tiles.count();
  return w;
}

/// Byte offsets in the block's dynamic shared memory (base 1024-aligned): stage 11d's plan
/// (160 KB of tiles at d = 128, and 32 KB of dQ staging, a [64, 64] fp32 block per consumer).
template <int d>
struct BwdPlan {
  using R = BwdRoles<d>;
  static constexpr int B_c = R::kBlockN, B_r = R::kBlockM, kStages = R::kStages;
  static constexpr uint32_t k = 0;                                        // K_j [d/64][B_c][64]
  static constexpr uint32_t v = k + tile_bytes(B_c, d);                   // V_j, like K
  static constexpr uint32_t q = v + tile_bytes(B_c, d);                   // Q_i [kStages][d/64][B_r][64]
  static constexpr uint32_t dO = q + kStages * tile_bytes(B_r, d);        // dO_i, like Q
  static constexpr uint32_t ds = dO + kStages * tile_bytes(B_r, d);       // dSᵀ [2][B_r/64][B_c][64]
  static constexpr uint32_t l2 = ds + 2 * tile_bytes(B_c, B_r);           // L2_i [kStages][B_r] fp32
  static constexpr uint32_t dd = l2 + kStages * B_r * 4;                  // D_i, like L2
  static constexpr uint32_t staging = dd + kStages * B_r * 4;             // dQ blocks [2][64][64] fp32
  // kv_full, full[S], empty[S], dq_full[2], dq_empty
  static constexpr uint32_t barriers = staging + 2 * 64 * 64 * 4;
  static constexpr uint32_t bytes = barriers + 8 * (1 + 2 * kStages + 3);
  static_assert(bytes + 1024 <= 227 * 1024, "more shared memory than a block may have");
  static_assert(2 * (2 * 64 * d * 2) <= ds - q, "the epilogue stages both consumers' dV, dK (2 bytes an "
                                                "element) in the Q_i and dO_i buffers");
  static constexpr uint32_t bytes_to_allocate = bytes + 1024;  // room to align the base
  /// Bytes that land in full[s] per step: Q_i, dO_i, L2_i, D_i.
  static constexpr uint32_t step_bytes = 2 * tile_bytes(B_r, d) + 2 * B_r * 4;
};

template <int d, class Elem>
struct BwdShared {
  using R = BwdRoles<d>;
  using Plan = BwdPlan<d>;
  static constexpr int B_c = R::kBlockN, B_r = R::kBlockM, kStages = R::kStages;
  Elem *k, *v, *q, *dO, *ds;
  float *l2, *dd, *staging;
  uint64_t *kv_full, *full, *empty, *dq_full, *dq_empty;

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
  /// Consumer c's dQ block [64, 64] in the staging area (the layout of hopper/dq_layout.h).
  __device__ float* staging_block(int c) const { return staging + c * 64 * 64; }
  __device__ Elem* q_stage(int s) const { return q + s * B_r * d; }
  __device__ Elem* do_stage(int s) const { return dO + s * B_r * d; }
  __device__ Elem* ds_buffer(int b) const { return ds + b * B_c * B_r; }
  __device__ float* l2_stage(int s) const { return l2 + s * B_r; }
  __device__ float* dd_stage(int s) const { return dd + s * B_r; }

  /// One thread: every barrier's arrival count, made visible to the copy engine.
  __device__ void init_barriers() const {
    mbarrier_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 256);  // the consumers' threads
    }
    mbarrier_init(&dq_full[0], 128);  // a consumer's threads
    mbarrier_init(&dq_full[1], 128);
    mbarrier_init(dq_empty, 1);       // the writer
    fence_barrier_init();
  }

  //! [backward producer]
  /// The producer (one thread): K_j and V_j of the block's document once, then, after the
  /// prep kernel has finished (this kernel may start before: StreamOrder::Programmatic in
  /// step_kernel.h), each step's query tile into the ring as soon as its buffer is released.
  /// Tiles that run past the document's end bring the next document's keys or queries (or
  /// zeros past the tensor): the consumers mask them.
  __device__ void produce(const MaskedBwdParams& p, const BwdWork& w) const {
    const int key_row = w.k_start + w.j * B_c;
    mbarrier_arrive_expect_tx(kv_full, 2 * tile_bytes(B_c, d));
#pragma unroll
    for (int c = 0; c < d / 64; ++c) {
      tma_load_3d(reinterpret_cast<unsigned char*>(k) + c * column_block_bytes(B_c), &p.map_k, kv_full, 64 * c, key_row,
                  w.bkv);
      tma_load_3d(reinterpret_cast<unsigned char*>(v) + c * column_block_bytes(B_c), &p.map_v, kv_full, 64 * c, key_row,
                  w.bkv);
    }
    griddepcontrol_wait();  // K and V are inputs, loaded already; L2 and D are the prep kernel's output
    for (int n = 0; n < w.steps; ++n) {
      const auto [s, parity] = PipelineState<kStages>::at(n);
      mbarrier_wait(&empty[s], parity ^ 1);  // the consumers released buffer s
      const int bh = w.bh(n), row0 = w.tile(n) * B_r;  // the tile's first row, in the document
      mbarrier_arrive_expect_tx(&full[s], Plan::step_bytes);
#pragma unroll
      for (int c = 0; c < d / 64; ++c)
#pragma unroll
        for (int h = 0; h < B_r / 64; ++h) {
          const uint32_t at = c * column_block_bytes(B_r) + h * 64 * 128;
          const int row = w.q_start + row0 + 64 * h;
          tma_load_3d(reinterpret_cast<unsigned char*>(q_stage(s)) + at, &p.map_q, &full[s], 64 * c, row, bh);
          tma_load_3d(reinterpret_cast<unsigned char*>(do_stage(s)) + at, &p.map_do, &full[s], 64 * c, row, bh);
        }
      // The statistics from the padded scratch: the tile's B_r rows are one aligned run.
      const int64_t stats = int64_t(bh) * p.n_pad + p.pad_first[w.doc] + row0;
      bulk_load(l2_stage(s), p.L2 + stats, B_r * 4, &full[s]);
      bulk_load(dd_stage(s), p.D + stats, B_r * 4, &full[s]);
    }
  }
  //! [backward producer]
};

}  // namespace fa::stage13
