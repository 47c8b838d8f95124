// Stage 05 — one fused pass: online softmax with output rescaling.
//
// What changed from stage 04: the output pass disappears. Stage 04's pass 2 needed the
// final (m, l). But the output is a weighted sum, and we can keep it, like l, relative to
// the current max: keep the unnormalised accumulator  O_acc = Σ_j e^{S_ij − m} v_j.
// When the max rises from m to m', every term so far must be multiplied by e^{m − m'},
// and so must their sum:
//
//     m' = max(m, s),  α = e^{m − m'},  l' = α·l + e^{s − m'},  O_acc' = α·O_acc + e^{s − m'}·v_j
//
// Only at the end do we divide by l: O_i = O_acc / l. Each key and value is read once per
// query row: this is the loop that FlashAttention tiles (stage 06).
//
// Algorithm, for each (batch, head) and each query row i:
//   m = −inf, l = 0, O_acc = 0
//   for each key j:  s = S_ij; m' = max(m, s); α = e^{m − m'}; p = e^{s − m'}
//                    l = α·l + p;  O_acc = α·O_acc + p·v_j;  m = m'
//   O_i = O_acc / l,   L_i = m + log l      (L is what the backward recomputes P from)
//
// Cost: one pass over K and V per row, N_q·N_k·d multiply-adds for S and as many for O,
//       plus d multiplies per key for the rescale. Memory: O(d) per row.
// Run:  ./build/stages/05_one_pass_fused/stage05 --seq-q 1024 --seq-k 1024 --causal
#include "one_pass_fused.h"

#include <cmath>
#include <vector>

namespace fa::stage05 {

namespace {
// s = scale · q · k over d elements.
float score(const float* q, const float* k, int64_t d, float scale) {
  float dot = 0.0f;
  for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
  return scale * dot;
}
}  // namespace

void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L,
             float* row_max, float* row_sum) {
  p.validate("05_one_pass_fused");
  const int64_t d = p.head_dim;
  const float scale = p.softmax_scale();
  std::vector<float> O_acc(static_cast<size_t>(d));  // [d] unnormalised output of the current row

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const float* k = K + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      const float* v = V + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const float* q_i = Q + p.q_offset(b, h, i);  // [d]
        float* o_i = O + p.q_offset(b, h, i);        // [d]
        const int64_t n_vis = p.visible_keys(i);

        //! [fused pass]
        float m = -INFINITY, l = 0.0f;
        std::fill(O_acc.begin(), O_acc.end(), 0.0f);
        for (int64_t j = 0; j < n_vis; ++j) {
          const float s = score(q_i, k + j * d, d, scale);
          // LAB BEGIN: online update — hint: m' = max(m, s); α = e^{m − m'}; p = e^{s − m'} (subtract 0 instead of m' while m' = −inf); rescale l and O_acc by α, then add p and p·v_j
          const float m_new = (s > m || std::isnan(s)) ? s : m;
          // While every logit so far is −inf, m' = −inf: subtract 0 instead (e^{−inf} = 0,
          // where e^{−inf + inf} would be NaN).
          const float shift = m_new == -INFINITY ? 0.0f : m_new;
          const float alpha = std::exp(m - shift);  // rescales everything summed so far
          const float p_ij = std::exp(s - shift);   // this key's weight, relative to m'
          l = alpha * l + p_ij;                     // l' = α·l + p
          for (int64_t c = 0; c < d; ++c)           // O_acc' = α·O_acc + p·v_j
            O_acc[size_t(c)] = alpha * O_acc[size_t(c)] + p_ij * v[j * d + c];
          m = m_new;
          // LAB END
        }
        //! [fused pass]

        //! [normalise]
        // O_i = O_acc / l, once, at the end. l = 0 only for a row that sees no key, or
        // whose every logit is −inf (otherwise its largest logit adds e^0 = 1): O = 0.
        for (int64_t c = 0; c < d; ++c) o_i[c] = l == 0.0f ? 0.0f : O_acc[size_t(c)] / l;
        const int64_t li = p.l_offset(b, h, i);
        L[li] = l == 0.0f ? -INFINITY : m + std::log(l);  // L_i = m_i + log l_i
        //! [normalise]
        if (row_max) row_max[li] = m;
        if (row_sum) row_sum[li] = l;
      }
    }
  }
}

}  // namespace fa::stage05
