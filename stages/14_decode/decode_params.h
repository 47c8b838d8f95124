/// \file decode_params.h
/// \brief Stage 14: what every decode kernel receives (one struct, passed by value), and the
/// table of each step's kernels.
#pragma once

#include <cstdint>

#include "decode_problem.h"
#include "problem.h"
#include "step_kernel.h"

namespace fa::stage14 {

struct DecodeParams {
  const void* Q;        ///< [batch][heads][q_len][d], T
  const void* K_cache;  ///< contiguous [batch][kv_heads][capacity][d] or paged [num_blocks][kv_heads][block_size][d], T
  const void* V_cache;  ///< same layout as K_cache
  void* O;              ///< [batch][heads][q_len][d], T: written when splits == 1
  float* L;             ///< [batch][heads][q_len]: written when splits == 1
  float* O_split;       ///< [splits][batch][heads][q_len][d] partial outputs, normalised (splits > 1)
  float* L_split;       ///< [splits][batch][heads][q_len] partial log-sum-exps (splits > 1)
  const int* cache_seqlens;  ///< [batch], device
  const int* block_table;    ///< [batch][blocks_per_seq], device (paged only)
  int batch, heads, kv_heads, group, q_len;
  int splits;      ///< key splits per sequence (gridDim.x of 14b–14d)
  int row_tiles;   ///< tiles of kTileRows packed rows per KV head (14c, 14d)
  int capacity;    ///< contiguous: tokens per sequence
  int block_size, num_blocks, blocks_per_seq;  ///< paged
  float scale;       ///< the softmax scale
  float scale_log2;  ///< softmax scale · log2(e): scores in base 2, so exp2 replaces exp
  bool causal;
};

/// What every decode kernel and the append take from the problem itself: the sizes, the
/// cache layout, the scale and the mask. The caller adds the pointers, splits and row tiles.
inline DecodeParams params_of(const DecodeProblem& p) {
  DecodeParams params{};
  params.batch = p.batch;
  params.heads = p.heads;
  params.kv_heads = p.kv_heads;
  params.group = p.group_size();
  params.q_len = p.q_len;
  params.capacity = p.capacity;
  params.block_size = p.block_size;
  params.num_blocks = p.num_blocks;
  params.blocks_per_seq = p.blocks_per_seq;
  params.scale = p.softmax_scale();
  params.scale_log2 = p.softmax_scale() * 1.4426950408889634f;  // log2(e)
  params.causal = p.causal;
  return params;
}

/// Each step's kernel for head dim d and dtype (bf16 or f16), refused by name otherwise.
StepKernel step_14a(int d, Dtype dtype);
StepKernel step_14b(int d, Dtype dtype);
StepKernel step_14c(int d, Dtype dtype);
StepKernel step_14d(int d, Dtype dtype, bool paged);  ///< 14d_paged.cu: either cache layout
StepKernel step_14e(int d, Dtype dtype, bool paged);  ///< decode.cu, the final design: either cache layout
StepKernel combine_kernel(int d, Dtype dtype);
StepKernel append_kernel(int d);

}  // namespace fa::stage14
