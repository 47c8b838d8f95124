// Stage 14, step 14d — a paged KV cache.
//
// What changed from 14c: where a key lives. A serving system does not give each sequence a
// contiguous cache of the longest length it might reach; it hands out fixed-size blocks of
// block_size tokens (16 … 256) from one pool as sequences grow, and records them in a block
// table: token j of sequence b is row j % block_size of pool block table[b][j / block_size]
// (the layout of vLLM's paged attention and of FlashAttention's kvcache path). Only the
// address of a key row changes — the PagedKeys functor (decode_tile.cuh) — and everything
// else is 14c:
//
//   grid (splits, kv_heads · row_tiles, batch); block (s, hk · row_tiles + t, b):
//     rows: 16 packed rows of hk's group (every head × every new token)       — 14c
//     keys: split s of sequence b's keys                                     — 14b
//     for each tile of 32 keys: 16-byte cp.async copies of each key's row, from its block
//         (a 32-key tile spans 2 blocks of 16, or lies inside one of 64 or 256)
//       scores, online softmax, O_acc                                        — decode_tile.cuh
//     write (O_s, L_s); the combine merges the splits                        — combine.cu
//
// The table is read per key row, once per tile (32 lookups, from L1/L2); a key of a block
// outside [0, num_blocks) loads as zeros, so a bad device table never sends a load outside
// the pool (decode_gpu refuses a bad host table before anything runs).
// The contiguous cache is the same kernel with ContiguousKeys.
#include "decode_tile.cuh"
#include "step_table.cuh"

namespace fa::stage14 {

namespace {

//! [decode kernel]
template <class T, int D, class Keys>
__global__ void __launch_bounds__(kThreads) decode_14d(const DecodeParams p) {
  __shared__ TileSmem<T, D> sm;
  const int split = blockIdx.x, hk = blockIdx.y / p.row_tiles, tile = blockIdx.y % p.row_tiles, b = blockIdx.z;
  const Keys key_row(p, b, hk);
  int64_t begin, end;
  split_range(sequence_length(p, b), p.splits, split, begin, end);
  const int packed = p.group * p.q_len;
  const int first = tile * kTileRows;
  attend_rows(sm, p, b, TileRows{hk * p.group, first, min(kTileRows, packed - first)}, begin, end, split, key_row);
}
//! [decode kernel]

}  // namespace

StepKernel step_14d(int d, Dtype dtype, bool paged) {
  return instantiate_step<64, 128>(kStageName, "14d", d, dtype, [paged](auto D, auto elem) {
    using T = decltype(elem);
    StepKernel k = paged ? make_step_kernel(decode_14d<T, D, PagedKeys<D>>, Threads{kThreads}, BlockRows{kTileRows},
                                            BlockCols{kTileKeys}, SmemBytes{0})
                         : make_step_kernel(decode_14d<T, D, ContiguousKeys<D>>, Threads{kThreads},
                                            BlockRows{kTileRows}, BlockCols{kTileKeys}, SmemBytes{0});
    k.stages = 2;
    k.barriers = 3;
    k.pipelined = true;
    k.description = paged ? "14c's grid over a paged cache (a block table lookup per key row)"
                          : "14c's grid over a contiguous cache";
    return k;
  });
}

}  // namespace fa::stage14
