// Stage 14, step 14c — GQA packing: the query heads that share a KV head form one tile.
//
// What changed from 14b: the rows of a block. With grouped-query attention, `group` query
// heads read the same K and V. 14b ran them one after another, each reading the split's keys
// again. Here the group's heads and their q_len tokens are one tile of rows — row r of KV
// head hk is head hk·group + r / q_len, token r % q_len — so each K/V tile, once in shared
// memory, serves every row that needs it: each K/V byte is read once.
//
//   grid (splits, kv_heads · row_tiles, batch); row_tiles = ceil(group · q_len / 16)
//   block (s, hk · row_tiles + t, b):
//     rows: flat rows [16t, 16t + 16) of hk's group   (32 heads over 8 KV heads, q_len 4: 16 rows, one tile)
//     attend_rows(those rows, keys of split s); write (O_s, L_s)
//
// The score phase now does group times more math per byte loaded (q_len · group rows against
// each key): decoding's arithmetic intensity rises from about 1 FLOP per byte towards the
// tensor cores' ridge, and is still far below it at 16 rows.
// Past 16 rows (group 8 × q_len 4 = 32) a KV head takes two row tiles, which read the
// same keys at the same time (the second read mostly from L2).
#include "decode_tile.cuh"
#include "step_table.cuh"

namespace fa::stage14 {

namespace {

template <class T, int D>
__global__ void __launch_bounds__(kThreads) decode_14c(const DecodeParams p) {
  __shared__ TileSmem<T, D> sm;
  const int split = blockIdx.x, hk = blockIdx.y / p.row_tiles, tile = blockIdx.y % p.row_tiles, b = blockIdx.z;
  const ContiguousKeys<D> key_row(p, b, hk);
  int64_t begin, end;
  split_range(sequence_length(p, b), p.splits, split, begin, end);
  const int packed = p.group * p.q_len;  // rows of the KV head: every head of its group, every new token
  const int first = tile * kTileRows;
  attend_rows(sm, p, b, TileRows{hk * p.group, first, min(kTileRows, packed - first)}, begin, end, split, key_row);
}

}  // namespace

StepKernel step_14c(int d, Dtype dtype) {
  return instantiate_step<64, 128>(kStageName, "14c", d, dtype, [](auto D, auto elem) {
    using T = decltype(elem);
    StepKernel k = make_step_kernel(decode_14c<T, D>, Threads{kThreads}, BlockRows{kTileRows},
                                    BlockCols{kTileKeys}, SmemBytes{0});
    k.stages = 2;
    k.barriers = 3;
    k.pipelined = true;
    k.description = "one block per (split, sequence, KV head, 16 packed rows of its group); combine kernel";
    return k;
  });
}

}  // namespace fa::stage14
