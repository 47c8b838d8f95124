// Stage 14, step 14a — one block per (sequence, KV head), no split: the baseline.
//
// FlashAttention-2's grid gives a block a tile of query rows. In decoding a sequence has
// only q_len (1 … 16) new rows per head, so the natural grid is one block per (sequence, KV
// head), which walks all of that head's keys:
//
//   grid (kv_heads, batch); block (hk, b):
//     for each query head h of hk's group:            (rows: h's q_len new tokens)
//       attend_rows(rows of h, keys [0, len_b))       (decode_tile.cuh: 32 keys per tile)
//       write O and L of those rows
//
// What it shows: batch 1 × 8 KV heads is 8 blocks. An H100 has 132 SMs, and one SM alone
// cannot draw more than a small share of the card's memory bandwidth: 124 SMs idle, the
// bandwidth they could pull unused. And the group's heads each read the whole K/V again (one
// after the other: the second read mostly hits L2, but it is still traffic and time).
// Step 14b splits the keys to fill the SMs; 14c reads each K/V byte once for all the heads.
#include "decode_tile.cuh"
#include "step_table.cuh"

namespace fa::stage14 {

namespace {

//! [one block]
template <class T, int D>
__global__ void __launch_bounds__(kThreads) decode_14a(const DecodeParams p) {
  __shared__ TileSmem<T, D> sm;
  const int hk = blockIdx.x, b = blockIdx.y;
  const ContiguousKeys<D> key_row(p, b, hk);
  const int64_t len = sequence_length(p, b);
  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h)  // one head at a time: K/V read group times
    attend_rows(sm, p, b, TileRows{h, 0, p.q_len}, 0, len, 0, key_row);
}
//! [one block]

}  // namespace

StepKernel step_14a(int d, Dtype dtype) {
  return instantiate_step<64, 128>(kStageName, "14a", d, dtype, [](auto D, auto elem) {
    using T = decltype(elem);
    StepKernel k = make_step_kernel(decode_14a<T, D>, Threads{kThreads}, BlockRows{kTileRows},
                                    BlockCols{kTileKeys}, SmemBytes{0});
    k.stages = 2;
    k.barriers = 3;
    k.pipelined = true;
    k.description = "one block per (sequence, KV head); heads one after another; no split";
    return k;
  });
}

}  // namespace fa::stage14
