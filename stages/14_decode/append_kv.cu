// Stage 14 — the KV append: the new tokens' keys and values written into the cache.
//
// Before a decode step attends, the step's q_len new tokens must be in the cache: token i of
// sequence b goes to position j = cache_seqlens[b] − q_len + i (the lengths count the new
// tokens), in a contiguous cache at row j of (b, hk)'s slab, in a paged one at row
// j % block_size of block table[b][j / block_size].
//
//   grid (q_len, kv_heads, batch); block: d/8 threads, each one 16-byte chunk of K and of V
//
// The copy moves bytes and does not look at them, so one kernel serves f16 and bf16. A
// position outside the cache (a device length that the host did not check) or a block
// outside the pool is skipped: nothing is written outside the cache.
#include <cstdint>

#include "decode.h"
#include "decode_params.h"
#include "step_table.cuh"

namespace fa::stage14 {

namespace {

//! [append]
template <int D>
__global__ void append_kv(const DecodeParams p, const uint4* K_new, const uint4* V_new, uint4* K_cache,
                          uint4* V_cache) {
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row of 2-byte elements
  const int i = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, chunk = threadIdx.x;
  const int64_t j = int64_t(p.cache_seqlens[b]) - p.q_len + i;  // this token's position
  int64_t row;  // the row of position j in the cache, in 16-byte chunks
  if (p.block_size > 0) {
    if (j < 0 || j >= int64_t(p.blocks_per_seq) * p.block_size) return;
    const int block = p.block_table[int64_t(b) * p.blocks_per_seq + j / p.block_size];
    if (block < 0 || block >= p.num_blocks) return;
    row = ((int64_t(block) * p.kv_heads + hk) * p.block_size + j % p.block_size) * kChunks;
  } else {
    if (j < 0 || j >= p.capacity) return;
    row = ((int64_t(b) * p.kv_heads + hk) * p.capacity + j) * kChunks;
  }
  const int64_t from = ((int64_t(b) * p.kv_heads + hk) * p.q_len + i) * kChunks;
  K_cache[row + chunk] = K_new[from + chunk];
  V_cache[row + chunk] = V_new[from + chunk];
}
//! [append]

}  // namespace

StepKernel append_kernel(int d) {
  // The element type does not matter to a copy: instantiate as bf16 only to pick the head dim.
  return instantiate_step<64, 128>(kStageName, "append", d, Dtype::BF16, [](auto D, auto) {
    StepKernel k = make_step_kernel(append_kv<D>, Threads{D / 8}, BlockRows{1}, BlockCols{D}, SmemBytes{0});
    k.description = "one block per (new token, KV head, sequence); 16-byte copies";
    return k;
  });
}

}  // namespace fa::stage14
