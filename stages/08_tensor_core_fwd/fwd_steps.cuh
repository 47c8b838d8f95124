// Stage 08: which compiled kernel a step runs for a problem, written once for both steps
// (08a_one_buffer.cu, tensor_core_fwd.cu). Host code over the kernels' templates.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dispatch.cuh"
#include "fwd_steps.h"
#include "traits.cuh"

namespace fa::stage08 {

/// Everything a block needs to find its tensors.
struct FwdParams {
  const void* Q;
  const void* K;
  const void* V;
  void* O;
  float* L;
  int heads, kv_heads, seq_q, seq_k;
  float scale;
};

namespace {

/// The tile of a kernel, as the report prints it.
template <class Tr>
std::string describe_tile() {
  std::ostringstream tile;
  tile << "B_r=" << Tr::kBlockM << " B_c=" << Tr::kBlockN << ", " << Tr::kWarps << " warps of "
       << Tr::kRowsPerWarp << " rows, " << Tr::kStages << " K/V buffer(s), Q in "
       << (Tr::kQInRegs ? "registers" : "shared memory") << ", "
       << (Tr::kLayout == SmemLayout::Swizzled ? "swizzled" : Tr::kLayout == SmemLayout::Padded ? "padded" : "plain")
       << " smem" << (Tr::kCausalSplit ? "" : ", every tile masked") << (Tr::kLazyRescale ? ", lazy rescale" : "");
  return tile.str();
}

/// A step's table row for tiles Tr: the causal or the plain instance of its kernel, with
/// the launch shape its traits give.
template <class Tr, class F>
StepKernel tile_step_kernel(bool causal, F* causal_fn, F* plain_fn) {
  StepKernel k = make_step_kernel(causal, causal_fn, plain_fn, Threads{Tr::kThreads}, BlockRows{Tr::kBlockM},
                                  BlockCols{Tr::kBlockN}, SmemBytes{size_t(Tr::kSmemBytes)});
  k.stages = Tr::kStages;
  k.description = describe_tile<Tr>();
  return k;
}

// Ablation variants exist for bf16 at d = 64 and d = 128 (the benchmark's ablation table);
// instantiating them for every dtype and head dim would triple the build time.
template <class Elem, int kHeadDim>
constexpr bool kHasAblations = std::is_same_v<Elem, __nv_bfloat16> && (kHeadDim == 64 || kHeadDim == 128);

/// make(Elem{}, TypeTag<Traits>{}) for the tiles `o` selects at head dim kHeadDim: at
/// d = 128 tile_d128 auto takes the wide tile without a causal mask and q_regs with one
/// (measured fastest), and q_regs with an ablation (the tile the ablations are built on).
template <bool kWithAblations, class Elem, int kHeadDim, class Make>
StepKernel with_tiles(const Options& o, bool causal, Make&& make) {
  using Base = typename DefaultTile<kHeadDim>::type;
  if constexpr (kHeadDim == 128) {
    TileD128 tile = o.tile_d128;
    if (tile == TileD128::Auto)
      tile = o.ablation != Ablation::None || causal ? TileD128::QInRegisters : TileD128::QInSharedWide;
    if (tile == TileD128::QInSharedWide) {
      if (o.ablation != Ablation::None)
        throw std::invalid_argument(std::string("08_tensor_core_fwd: ablations are built on the q_regs d = 128 tile "
                                                "only; use tile_d128 = auto or q_regs with an ablation"));
      return make(Elem{}, TypeTag<typename WideTileD128::type>{});
    }
  }
  if (o.ablation == Ablation::None) return make(Elem{}, TypeTag<Base>{});
  if (!kWithAblations)
    throw std::invalid_argument("08_tensor_core_fwd: ablation '" + ablation_name(o.ablation) +
                                "' is built on step 08b only (asked: step 08a)");
  if constexpr (kWithAblations && kHasAblations<Elem, kHeadDim>) {
    using A = Ablated<Base>;
    switch (o.ablation) {
      case Ablation::NoSwizzle: return make(Elem{}, TypeTag<typename A::NoSwizzle>{});
      case Ablation::Padded: return make(Elem{}, TypeTag<typename A::Padded>{});
      case Ablation::NoCausalSplit: return make(Elem{}, TypeTag<typename A::NoCausalSplit>{});
      case Ablation::None: break;
    }
  }
  throw std::invalid_argument("08_tensor_core_fwd: ablation '" + ablation_name(o.ablation) +
                              "' is built for bf16 at head_dim 64 and 128 only (asked: " +
                              (std::is_same_v<Elem, __nv_bfloat16> ? "bf16" : "f16") +
                              ", head_dim = " + std::to_string(kHeadDim) + ")");
}

/// The dispatch on dtype and head dim: calls with_tiles for the head dims with kernels.
/// kWithAblations: the step has the ablation variants (08b) or refuses an ablation (08a).
template <bool kWithAblations, class Make>
StepKernel make_step(int d, Dtype dtype, bool causal, const Options& o, Make&& make) {
  StepKernel k;
  with_dtype(dtype, [&](auto tag) {
    using Elem = decltype(tag);
    switch (d) {
      case 32: k = with_tiles<kWithAblations, Elem, 32>(o, causal, make); return;
      case 64: k = with_tiles<kWithAblations, Elem, 64>(o, causal, make); return;
      case 96: k = with_tiles<kWithAblations, Elem, 96>(o, causal, make); return;
      case 128: k = with_tiles<kWithAblations, Elem, 128>(o, causal, make); return;
      case 256: k = with_tiles<kWithAblations, Elem, 256>(o, causal, make); return;
      default: break;
    }
    throw std::logic_error("unreachable: head_dim checked before dispatch");
  });
  return k;
}

}  // namespace
}  // namespace fa::stage08
