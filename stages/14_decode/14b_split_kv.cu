// Stage 14, step 14b — split-KV (flash-decoding): the keys of a sequence split across blocks.
//
// What changed from 14a: the grid gains a dimension, the split. Block (s, hk, b) attends only
// to split s of sequence b's keys and writes a partial result (O_s, L_s) per row, normalised
// over its own keys, to scratch; the combine kernel (combine.cu) then merges the partials of
// each row by the log-sum-exp rule (common/merge.h):
//
//   grid (splits, kv_heads, batch); block (s, hk, b):
//     [begin, end) = split s of [0, len_b)           (equal splits, whole key tiles)
//     for each query head h of hk's group:
//       attend_rows(rows of h, keys [begin, end))
//       write (O_s, L_s) of those rows              (splits = 1: O and L themselves)
//   combine: O = Σ_s e^{L_s − L}·O_s,  L = log Σ_s e^{L_s}
//
// How many splits: the split rule (steps.cpp, split_rule) asks for enough blocks to give
// every SM several, but no split shorter than kMinKeysPerSplit keys. Batch 1 × 8 KV heads on
// 132 SMs at 32k keys: 66 splits, 528 blocks. A split past the end of a shorter sequence is
// empty and writes the merge's identity (O = 0, L = −inf).
#include "decode_tile.cuh"
#include "step_table.cuh"

namespace fa::stage14 {

namespace {

template <class T, int D>
__global__ void __launch_bounds__(kThreads) decode_14b(const DecodeParams p) {
  __shared__ TileSmem<T, D> sm;
  const int split = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const ContiguousKeys<D> key_row(p, b, hk);
  int64_t begin, end;
  split_range(sequence_length(p, b), p.splits, split, begin, end);
  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h)
    attend_rows(sm, p, b, TileRows{h, 0, p.q_len}, begin, end, split, key_row);
}

}  // namespace

StepKernel step_14b(int d, Dtype dtype) {
  return instantiate_step<64, 128>(kStageName, "14b", d, dtype, [](auto D, auto elem) {
    using T = decltype(elem);
    StepKernel k = make_step_kernel(decode_14b<T, D>, Threads{kThreads}, BlockRows{kTileRows},
                                    BlockCols{kTileKeys}, SmemBytes{0});
    k.stages = 2;
    k.barriers = 3;
    k.pipelined = true;
    k.description = "one block per (split, sequence, KV head); heads one after another; combine kernel";
    return k;
  });
}

}  // namespace fa::stage14
