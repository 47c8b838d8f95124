// Stage 08: every compile-time choice of the kernel in one struct.
//
// Tile sizes, warp count, pipeline depth, where Q lives, the shared-memory layout and the
// ablation switches are template parameters of `Traits`, so each step's kernel is one
// template and every variant the benchmark measures is an instantiation of it. Nothing else
// in the stage hard-codes a size.
#pragma once

#include "sm80/tile_index.h"

namespace fa::stage08 {

/// The compile-time description of one kernel variant.
///
///  kHeadDim   d, the head dimension (a multiple of 16)
///  kBlockM    B_r, query rows per thread block (the tile of Q, O kept on chip)
///  kBlockN    B_c, keys per K/V tile streamed through shared memory
///  kWarps     warps per block; warp w owns query rows [w·B_r/kWarps, (w+1)·B_r/kWarps)
///  kStages    K/V buffers: 2 = double buffering, load tile j+1 while computing tile j
///             (step 08b, the main kernel); 1 = one buffer, load a tile once every warp is
///             done with the last (step 08a)
///  kQInRegs   Q_i loaded once into registers as MMA A-fragments (true), or re-read from
///             shared memory for every K tile (false: frees 16·d/32·(rows/16) registers,
///             used where registers are short)
///  kLayout    shared-memory layout of the Q, K, V, O tiles (tile_index.h)
///  kCausalSplit  off-band tiles skip the mask (true) or every tile is masked (false)
///  kLazyRescale  O_i rescaled only on tiles where some row of the warp has a new maximum
///             (true), or on every tile (false); softmax.cuh, rescale()
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kStages_, bool kQInRegs_,
          SmemLayout kLayout_ = SmemLayout::Swizzled, bool kCausalSplit_ = true, bool kLazyRescale_ = false>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // B_r
  static constexpr int kBlockN = kBlockN_;  // B_c
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = kStages_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr SmemLayout kLayout = kLayout_;
  static constexpr bool kCausalSplit = kCausalSplit_;
  static constexpr bool kLazyRescale = kLazyRescale_;

  // Work of one warp, in units of the m16n8k16 instruction.
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 row tiles per warp
  static constexpr int kNTilesS = kBlockN / 8;       // n8 column tiles of S_ij [.., B_c]
  static constexpr int kNTilesO = kHeadDim / 8;      // n8 column tiles of O_i  [.., d]
  static constexpr int kKStepsQK = kHeadDim / 16;    // k16 steps of S = Q Kᵀ (over d)
  static constexpr int kKStepsPV = kBlockN / 16;     // k16 steps of O += P V (over B_c)

  // Shared memory: Q_i (reused to stage O_i on the way out), then kStages × (K_j, V_j).
  static constexpr int kQTileBytes = smem_tile_bytes(kBlockM, kHeadDim, kLayout);
  static constexpr int kKVTileBytes = smem_tile_bytes(kBlockN, kHeadDim, kLayout);
  static constexpr int kSmemBytes = kQTileBytes + 2 * kStages * kKVTileBytes;

  static_assert(kHeadDim % 16 == 0, "d must be a multiple of the MMA k (16)");
  static_assert(kBlockM % (16 * kWarps) == 0, "each warp owns whole m16 row tiles");
  static_assert(kBlockN % 16 == 0, "B_c must be a multiple of 16 (k16 steps of P V)");
  static_assert(kStages == 1 || kStages == 2, "one or two K/V buffers");
  static_assert(kLayout != SmemLayout::Swizzled || swizzle_supported(kHeadDim),
                "the XOR swizzle needs 4 or a multiple of 8 chunks per row; use Padded");
  static_assert((kBlockN * kHeadDim / 8) % kThreads == 0 && (kBlockM * kHeadDim / 8) % kThreads == 0,
                "every thread copies the same number of 16-byte chunks");
};

/// The tile shape chosen for each head dimension (see the notes, "Choosing the tiles").
/// Per thread, a warp of R rows holds O (R·d/32 fp32 registers), S (R·B_c/32) and, when
/// Q is kept, Q (R·d/64 registers of two 16-bit values); a thread may have 255.
///  d = 32, 64: B_r = 128, 4 warps of 32 rows, B_c = 64, Q in registers:
///           d = 64: O 64 + S 64 + Q 32 registers.
///  d = 96:  B_r = 64, 4 warps of 16 rows, B_c = 64, Q in registers, padded rows (the
///           3-bit swizzle needs a power-of-two number of 16-byte chunks per row).
///  d = 128: 32 rows per warp would need O 128 + Q 64 + S ≥ 32 registers, more than 255.
///           Two shapes fit, selected by the stage option --tile-d128 (auto: the wide tile
///           without a causal mask, q_regs with one):
///           q_regs: B_r = 64, 4 warps of 16 rows, B_c = 64, Q in registers (O 64 + Q 32 + S 32);
///           q_smem_wide: B_r = 128, 4 warps of 32 rows, B_c = 64, Q re-read from shared
///                   memory: FlashAttention-2's own d = 128 forward tile on sm90
///                   (O 128 + S 64; P reuses S's registers): WideTileD128 below.
///  d = 256: B_r = 64, B_c = 32, 16 rows per warp, Q re-read from shared memory.
template <int kHeadDim>
struct DefaultTile;
template <>
struct DefaultTile<32> {
  using type = Traits<32, 128, 64, 4, 2, true>;
};
template <>
struct DefaultTile<64> {
  using type = Traits<64, 128, 64, 4, 2, true>;
};
template <>
struct DefaultTile<96> {
  using type = Traits<96, 64, 64, 4, 2, true, SmemLayout::Padded>;
};
template <>
struct DefaultTile<128> {
  using type = Traits<128, 64, 64, 4, 2, true>;
};
template <>
struct DefaultTile<256> {
  using type = Traits<256, 64, 32, 4, 2, false>;
};

/// The second d = 128 shape (--tile-d128 q_smem_wide): 32 rows per warp with 64 keys per
/// tile. Against q_regs, each K or V fragment read by ldmatrix feeds two m16 row tiles
/// instead of one, and the per-tile work that does not grow with B_r (two barriers, the
/// row-max shuffles) is shared by twice the rows. It leaves the least room of all: O 128 +
/// S 64 registers per thread, before addresses and the Q fragments of the current k16 step;
/// so O is rescaled only on tiles where a maximum moved (kLazyRescale, softmax.cuh).
/// Shared memory: Q_i 32 KB + 2 × (K_j, V_j) 64 KB = 96 KB.
struct WideTileD128 {
  using type = Traits<128, 128, 64, 4, 2, false, SmemLayout::Swizzled, true, /*kLazyRescale=*/true>;
};

/// `Base` with one K/V buffer instead of two: step 08a's tiles.
template <class Base>
using OneBuffer = Traits<Base::kHeadDim, Base::kBlockM, Base::kBlockN, Base::kWarps, 1, Base::kQInRegs,
                         Base::kLayout, Base::kCausalSplit, Base::kLazyRescale>;

/// `Base` with exactly one optimisation turned off (the ablation table).
template <class Base>
struct Ablated {
  using NoSwizzle = Traits<Base::kHeadDim, Base::kBlockM, Base::kBlockN, Base::kWarps, Base::kStages,
                           Base::kQInRegs, SmemLayout::Plain, Base::kCausalSplit>;
  using Padded = Traits<Base::kHeadDim, Base::kBlockM, Base::kBlockN, Base::kWarps, Base::kStages,
                        Base::kQInRegs, SmemLayout::Padded, Base::kCausalSplit>;
  using NoCausalSplit = Traits<Base::kHeadDim, Base::kBlockM, Base::kBlockN, Base::kWarps,
                               Base::kStages, Base::kQInRegs, Base::kLayout, false>;
};

}  // namespace fa::stage08
