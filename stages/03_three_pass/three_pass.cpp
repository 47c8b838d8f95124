// Stage 03 — three passes per query row: no N_q × N_k buffer.
//
// What changed from stage 02: stage 02 kept all of S and P (N_q·N_k floats per head). But
// row i of the output needs only row i of P, and a score S_ij = scale·q_i·k_j costs d
// multiply-adds to recompute. So we stream: for each query row, walk the keys three
// times, recomputing S_ij each time, and keep only two numbers (m_i, l_i) for that row.
//
// Algorithm, for each (batch, head) and each query row i:
//   pass 1:  m_i = max_j S_ij
//   pass 2:  l_i = Σ_j exp(S_ij − m_i)
//   pass 3:  O_i = Σ_j (exp(S_ij − m_i) / l_i) · v_j
//   L_i = m_i + log l_i
//
// Cost: three passes over K (and one over V) per query row: 3·N_q·N_k·d multiply-adds
//       for the scores instead of one. Memory beyond Q, K, V, O: L (N_q floats per head)
//       and two floats for the row in progress; O_i accumulates in place in O.
// Next: stage 04 merges passes 1 and 2 into one with the online normaliser.
// Run:  ./build/stages/03_three_pass/stage03 --seq-q 1024 --seq-k 1024
#include "three_pass.h"

#include <cmath>

namespace fa::stage03 {

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
  p.validate("03_three_pass");
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

        //! [three passes]
        // pass 1: m_i = max_j S_ij  (a NaN score makes m_i NaN, and so the whole row)
        float m = -INFINITY;
        for (int64_t j = 0; j < n_vis; ++j) {
          const float s = score(q_i, k + j * d, d, scale);
          m = (s > m || std::isnan(s)) ? s : m;
        }
        // A row whose every logit is −inf (m_i = −inf) sees no key: O = 0, L = −inf.
        const int64_t n = m == -INFINITY ? 0 : n_vis;
        // pass 2: l_i = Σ_j e^{S_ij − m_i}
        float l = 0.0f;
        for (int64_t j = 0; j < n; ++j) l += std::exp(score(q_i, k + j * d, d, scale) - m);
        // pass 3: O_i = Σ_j (e^{S_ij − m_i} / l_i) · v_j
        for (int64_t c = 0; c < d; ++c) o_i[c] = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          const float p_ij = std::exp(score(q_i, k + j * d, d, scale) - m) / l;
          for (int64_t c = 0; c < d; ++c) o_i[c] += p_ij * v[j * d + c];
        }
        //! [three passes]

        const int64_t li = p.l_offset(b, h, i);
        L[li] = n == 0 ? -INFINITY : m + std::log(l);
        if (row_max) row_max[li] = m;
        if (row_sum) row_sum[li] = l;
      }
    }
  }
}

}  // namespace fa::stage03
