// Stage 04 — two passes: the online normaliser.
//
// What changed from stage 03: passes 1 and 2 become one. Stage 03 needed the final max
// m_i before it could start summing e^{S_ij − m_i}. The online normaliser keeps a running
// max m and a running sum l that is always relative to the current m; when a new score
// raises the max from m to m', the sum so far is rescaled by e^{m − m'}:
//
//     m' = max(m, s),   l' = l · e^{m − m'} + e^{s − m'}
//
// After the last key, (m, l) equal stage 03's (m_i, l_i) exactly in exact arithmetic.
//
// Algorithm, for each (batch, head) and each query row i:
//   pass 1:  m = −inf, l = 0;  for each key j: s = S_ij; m' = max(m, s);
//            l = l·e^{m − m'} + e^{s − m'}; m = m'
//   pass 2:  O_i = Σ_j (e^{S_ij − m} / l) · v_j
//   L_i = m + log l
//
// Cost: two passes over K per row instead of three. Memory beyond Q, K, V, O: L and two
//       floats (m_i, l_i) for the row in progress, as in stage 03.
// Next: stage 05 folds pass 2 into pass 1 by rescaling the output the same way.
// Run:  ./build/stages/04_two_pass_online/stage04 --seq-q 1024 --seq-k 1024
#include "two_pass_online.h"

#include <cmath>

namespace fa::stage04 {

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
  p.validate("04_two_pass_online");
  const int64_t d = p.head_dim;
  const float scale = p.softmax_scale();

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const float* k = K + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      const float* v = V + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const float* q_i = Q + p.q_offset(b, h, i);  // [d]
        float* o_i = O + p.q_offset(b, h, i);        // [d]
        const int64_t n_vis = p.visible_keys(i);

        //! [online normaliser]
        // pass 1: running max m and running sum l (relative to the current m)
        float m = -INFINITY, l = 0.0f;
        for (int64_t j = 0; j < n_vis; ++j) {
          const float s = score(q_i, k + j * d, d, scale);
          // LAB BEGIN: online normaliser — hint: m_new = max(m, s); l = l·e^{m − m_new} + e^{s − m_new}, subtracting 0 instead of m_new while m_new = −inf
          const float m_new = (s > m || std::isnan(s)) ? s : m;
          // l' = l·e^{m − m'} + e^{s − m'}. On the first key m = −inf and l = 0: the
          // rescale factor e^{−inf} = 0 multiplies an empty sum. While every logit so far
          // is −inf, m' = −inf too: subtract 0 instead, so that e^{−inf − 0} = 0 rather
          // than e^{−inf + inf} = NaN.
          const float shift = m_new == -INFINITY ? 0.0f : m_new;
          l = l * std::exp(m - shift) + std::exp(s - shift);
          m = m_new;
          // LAB END
        }
        //! [online normaliser]

        //! [output pass]
        // pass 2: O_i = Σ_j (e^{S_ij − m} / l) · v_j, with the final m and l. A row whose
        // every logit is −inf (l = 0) sees no key: O = 0, L = −inf.
        const int64_t n = l == 0.0f ? 0 : n_vis;
        for (int64_t c = 0; c < d; ++c) o_i[c] = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          const float p_ij = std::exp(score(q_i, k + j * d, d, scale) - m) / l;
          for (int64_t c = 0; c < d; ++c) o_i[c] += p_ij * v[j * d + c];
        }
        //! [output pass]

        const int64_t li = p.l_offset(b, h, i);
        L[li] = n == 0 ? -INFINITY : m + std::log(l);
        if (row_max) row_max[li] = m;
        if (row_sum) row_sum[li] = l;
      }
    }
  }
}

}  // namespace fa::stage04
