// Stage 14 — the combine of split-KV (steps 14b–14d): every row's partials merged into O, L.
//
// A split's block wrote, per query row, its output normalised over its own keys, O_s, and
// their log-sum-exp L_s (fp32, to scratch). Over all keys (common/merge.h):
//
//     L = log Σ_s e^{L_s},   O = Σ_s e^{L_s − L}·O_s
//
// taken one split after another with MergeMany, stage 05's online update with the partials
// as keys (score L_s, value O_s): a running max of the L_s, the sum of e^{L_s − max}, O_acc
// rescaled when the max moves; L rounded once at the end. Splits that saw no key
// (L_s = −inf, O_s = 0) have no weight.
//
//   grid (batch · heads · q_len rows); block: d threads, thread c owns column c
//   for s in 0 … splits−1:  (rescale, weight) = merged.add(L_s);  o = rescale·o + weight·O_s[c]
//   O[c] = o / sum;  L = L_max + log(sum)
//
// Traffic: splits · (d + 1) floats read and d elements written per row — small beside the
// row's share of the cache (len · d · 2 elements per KV head, read by up to group · q_len rows).
#include "decode.h"
#include "decode_params.h"
#include "merge.h"
#include "step_table.cuh"

namespace fa::stage14 {

namespace {

//! [combine]
template <class T, int D>
__global__ void __launch_bounds__(D) combine_splits(const DecodeParams p) {
  const int64_t row = blockIdx.x;  // (b, h, i) flattened: [batch][heads][q_len]
  const int64_t rows = int64_t(p.batch) * p.heads * p.q_len;
  const int c = threadIdx.x;
  fa::stage12::MergeMany merged;
  float o = 0.0f;  // Σ_s e^{L_s − L_max}·O_s[c]
  for (int s = 0; s < p.splits; ++s) {
    const int64_t at = s * rows + row;  // [split][b][h][i]
    const auto f = merged.add(p.L_split[at]);
    o = f.rescale * o + f.weight * p.O_split[at * D + c];
  }
  static_cast<T*>(p.O)[row * D + c] = T(o * merged.normaliser());
  if (c == 0) p.L[row] = merged.L();
}
//! [combine]

}  // namespace

StepKernel combine_kernel(int d, Dtype dtype) {
  return instantiate_step<64, 128>(kStageName, "combine", d, dtype, [](auto D, auto elem) {
    using T = decltype(elem);
    StepKernel k = make_step_kernel(combine_splits<T, D>, Threads{D}, BlockRows{1}, BlockCols{D}, SmemBytes{0});
    k.description = "one block per row, one thread per column; splits merged in order";
    return k;
  });
}

}  // namespace fa::stage14
