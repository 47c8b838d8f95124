// Stage 09: every compile-time choice of the two backward kernels, in one place each.
//
// As in stage 08 (traits.cuh), tile sizes and warp counts are template parameters, so each
// kernel is one template instantiated per head dim and dtype; the steps of the stage
// (09a, 09b, 09c) differ in code, not in these numbers, except 09c's warp grid.
#pragma once

#include "sm80/tile_index.h"

namespace fa::stage09 {

using stage08::SmemLayout;
using stage08::smem_tile_bytes;
using stage08::swizzle_supported;

/// The scratch arrays of one call (L·log2 e, D and the fp32 dQ accumulator) give every
/// (batch, head) a whole number of blocks of this many query rows, so that the kernels
/// read them in 16-byte copies without a bounds check. Every B_r divides it.
inline constexpr int kQueryPad = 128;

/// The dK/dV kernel: one thread block per key tile j of B_c keys (per batch and kv head).
///
///  kHeadDim   d (a multiple of 16)
///  kBlockM    B_r, query rows per step of the loop over query tiles i
///  kBlockN    B_c, keys per block
///  kWarps     warps per block
///  kWarpsMdQ  the dQ_i = dS K_j product is split over the warps differently: a grid of
///             kWarpsMdQ (along the B_r query rows) × kWarps/kWarpsMdQ (along d)
///  kWarpsKeys the warp layout of the four key-side products: the warps form a grid of kWarpsKeys (along the B_c keys) × kWarpsSplit =
///             kWarps/kWarpsKeys; warp w = (wk, ws), wk = w / kWarpsSplit, ws = w % kWarpsSplit,
///             owns keys [wk·kKeysPerWarp, (wk+1)·kKeysPerWarp) for the whole kernel, and
///               Sᵀ, dPᵀ, dSᵀ:  queries [ws·kQueriesPerWarp, (ws+1)·kQueriesPerWarp) of them
///               dK_j, dV_j:    columns [ws·kColsPerWarp, (ws+1)·kColsPerWarp) of them
///             = kWarps (steps 09a, 09b): kWarpsSplit = 1, a warp holds its keys'
///               rows of Sᵀ for ALL B_r queries, which is exactly the A operand of
///               dV_j += Pᵀ dO_i: Pᵀ and dSᵀ stay in its registers. But every warp then
///               reads all of Q_i and dO_i twice per step (B of Sᵀ, dPᵀ and of dK, dV).
///             < kWarps (step 09c, kPInSmem): each warp computes only a block of Sᵀ,
///               so Pᵀ and dSᵀ are written to shared memory ([B_c][B_r] tiles) and, after
///               a barrier, read back as the A operands of dV_j, dK_j; each warp reads
///               less of Q_i, dO_i (see the notes, "Step 09c").
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kWarpsMdQ_, int kWarpsKeys_ = kWarps_>
struct DkDvTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // B_r
  static constexpr int kBlockN = kBlockN_;  // B_c
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = 2;  // Q_i/dO_i buffers: step i+1 loads while step i computes
  static constexpr SmemLayout kLayout = SmemLayout::Swizzled;  // every tile (sm80/tile_index.h)

  // The warp grid of Sᵀ, dPᵀ, dSᵀ ([kKeysPerWarp, kQueriesPerWarp] per warp) and of
  // dK_j, dV_j ([kKeysPerWarp, kColsPerWarp] per warp).
  static constexpr int kWarpsKeys = kWarpsKeys_;
  static constexpr int kWarpsSplit = kWarps / kWarpsKeys;  // along the queries, then along d
  static constexpr bool kPInSmem = kWarpsSplit > 1;        // layout p_smem
  static constexpr int kKeysPerWarp = kBlockN / kWarpsKeys;
  static constexpr int kKeyTiles = kKeysPerWarp / 16;  // m16 tiles of keys per warp
  static constexpr int kQueriesPerWarp = kBlockM / kWarpsSplit;
  static constexpr int kColsPerWarp = kHeadDim / kWarpsSplit;
  // Where warp w sits in that grid: its first key of the tile, its first query column of
  // Sᵀ (B_r's), its first column of dK_j, dV_j (d's). In layout p_regs the last two are 0.
  FA_HOST_DEVICE static constexpr int warp_key0(int w) { return w / kWarpsSplit * kKeysPerWarp; }
  FA_HOST_DEVICE static constexpr int warp_q0(int w) { return w % kWarpsSplit * kQueriesPerWarp; }
  FA_HOST_DEVICE static constexpr int warp_col0(int w) { return w % kWarpsSplit * kColsPerWarp; }

  // dQ_i = dS K_j: [B_r, d], warp (wm, wn) computes rows wm·kRowsDq.., columns wn·kColsDq..
  static constexpr int kWarpsMdQ = kWarpsMdQ_;
  static constexpr int kWarpsNdQ = kWarps / kWarpsMdQ;
  static constexpr int kRowsDq = kBlockM / kWarpsMdQ;
  static constexpr int kColsDq = kHeadDim / kWarpsNdQ;

  // Shared memory, in bytes: K_j, V_j (resident); kStages × (Q_i, dO_i, L2_i, D_i); a dSᵀ
  // tile [B_c][B_r] that hands dS from the key-owning warps to the dQ product (and, in
  // step 09c, to the dK_j product); in step 09c a Pᵀ tile [B_c][B_r].
  static constexpr int kKVTileBytes = smem_tile_bytes(kBlockN, kHeadDim, kLayout);
  static constexpr int kQTileBytes = smem_tile_bytes(kBlockM, kHeadDim, kLayout);
  static constexpr int kDsTileBytes = smem_tile_bytes(kBlockN, kBlockM, kLayout);
  static constexpr int kRowStatBytes = kBlockM * 4;  // B_r fp32 values of L2 or D
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVTileBytes;
  static constexpr int kOffQ = kOffV + kKVTileBytes;
  static constexpr int kOffdO = kOffQ + kStages * kQTileBytes;
  static constexpr int kOffdS = kOffdO + kStages * kQTileBytes;
  static constexpr int kOffP = kOffdS + kDsTileBytes;  // Pᵀ, step 09c only
  static constexpr int kOffL2 = kOffP + (kPInSmem ? kDsTileBytes : 0);
  static constexpr int kOffD = kOffL2 + kStages * kRowStatBytes;
  static constexpr int kSmemBytes = kOffD + kStages * kRowStatBytes;

  static_assert(kHeadDim % 16 == 0, "d must be a multiple of the MMA k (16)");
  static_assert(kWarps % kWarpsKeys == 0 && kBlockN % (16 * kWarpsKeys) == 0,
                "the warps form a kWarpsKeys × kWarpsSplit grid; each owns whole m16 tiles of keys");
  static_assert(kBlockM % (16 * kWarpsSplit) == 0 && kHeadDim % (16 * kWarpsSplit) == 0,
                "the warps along the split own whole 16-wide blocks of queries (Sᵀ) and of d (dK, dV)");
  static_assert(kBlockM % 16 == 0 && kQueryPad % kBlockM == 0, "B_r: a multiple of 16 that divides kQueryPad");
  static_assert(kWarps % kWarpsMdQ == 0 && kRowsDq % 16 == 0 && kColsDq % 16 == 0,
                "the dQ warp grid cuts [B_r, d] into whole 16×16 blocks");
  static_assert(kLayout != SmemLayout::Swizzled || (swizzle_supported(kHeadDim) && swizzle_supported(kBlockM)),
                "the XOR swizzle needs 4 or a multiple of 8 chunks per row; use Padded");
  static_assert((kBlockN * kHeadDim / 8) % kThreads == 0 && (kBlockM * kHeadDim / 8) % kThreads == 0,
                "every thread copies the same number of 16-byte chunks");
  static_assert(2 * kBlockM / 4 <= kThreads, "L2_i and D_i are copied in one pass of 16-byte chunks");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one block may have");
};

/// The deterministic dQ kernel: one thread block per query tile i (per batch and head),
/// looping over the key tiles j it sees, as the forward does.
///
///  kBlockM  B_r query rows per block; warp w owns rows [w·B_r/kWarps, (w+1)·B_r/kWarps)
///  kBlockN  B_c keys per step; K_j, V_j are double-buffered
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct DqTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = 2;  // K_j, V_j buffers: tile j+1 loads while tile j computes
  static constexpr SmemLayout kLayout = SmemLayout::Swizzled;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;

  // Shared memory: Q_i, dO_i (loaded once), then kStages × (K_j, V_j).
  static constexpr int kQTileBytes = smem_tile_bytes(kBlockM, kHeadDim, kLayout);
  static constexpr int kKVTileBytes = smem_tile_bytes(kBlockN, kHeadDim, kLayout);
  static constexpr int kOffQ = 0;
  static constexpr int kOffdO = kQTileBytes;
  static constexpr int kOffK = 2 * kQTileBytes;
  static constexpr int kOffV = kOffK + kStages * kKVTileBytes;
  static constexpr int kSmemBytes = kOffV + kStages * kKVTileBytes;

  static_assert(kHeadDim % 16 == 0, "d must be a multiple of the MMA k (16)");
  static_assert(kBlockM % (16 * kWarps) == 0, "each warp owns whole m16 row tiles");
  static_assert(kQueryPad % kBlockM == 0, "B_r divides kQueryPad (L2 and D are read unchecked)");
  static_assert(kBlockN % 16 == 0, "B_c: whole k16 steps of dQ += dS K_j");
  static_assert(kLayout != SmemLayout::Swizzled || swizzle_supported(kHeadDim),
                "the XOR swizzle needs 4 or a multiple of 8 chunks per row; use Padded");
  static_assert((kBlockN * kHeadDim / 8) % kThreads == 0 && (kBlockM * kHeadDim / 8) % kThreads == 0,
                "every thread copies the same number of 16-byte chunks");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one block may have");
};

/// The shapes chosen per head dim (see the notes, "Choosing the tiles").
///  d = 64:  dK/dV: B_c = 128 keys over 8 warps (16 each), B_r = 128. Per thread:
///           dK_j, dV_j 2 × 32 + Sᵀ 64 + dPᵀ 64 fp32 registers.
///  d = 128: dK/dV: B_c = 128 over 8 warps, B_r = 64: dK_j, dV_j 2 × 64 + Sᵀ 32 + dPᵀ 32.
///           (FlashAttention-2's sm80 shape for d = 128 has the same B_r, B_c, warps.)
///  dQ (step 09a): B_r = 64 over 4 warps of 16 rows, B_c = 64.
///  Step 09c (DkDvPSmem) is the same tile with the warps as a 4 (keys) × 2 grid and a Pᵀ
///  tile in shared memory (+32 KB: 162 KB at d = 64; +16 KB: 161 KB at d = 128). Per warp,
///  the same registers as steps 09a, 09b:
///  d = 64:  Sᵀ, dPᵀ 32 keys × 64 queries (64 + 64); dK_j, dV_j 32 keys × 32 columns (32 + 32).
///  d = 128: Sᵀ, dPᵀ 32 keys × 32 queries (32 + 32); dK_j, dV_j 32 keys × 64 columns (64 + 64).
template <int kHeadDim>
struct DefaultTiles;
template <>
struct DefaultTiles<64> {
  using DkDv = DkDvTraits<64, 128, 128, 8, 4>;
  using DkDvPSmem = DkDvTraits<64, 128, 128, 8, 4, 4>;
  using Dq = DqTraits<64, 64, 64, 4>;
};
template <>
struct DefaultTiles<128> {
  using DkDv = DkDvTraits<128, 64, 128, 8, 2>;
  using DkDvPSmem = DkDvTraits<128, 64, 128, 8, 2, 4>;
  using Dq = DqTraits<128, 64, 64, 4>;
};

}  // namespace fa::stage09
