// Stage 02 — safe softmax: subtract the row max before exponentiating.
//
// What changed from stage 01: one line of math. softmax is unchanged by shifting every
// logit of a row by the same constant, e^{x_j − c} / Σ_k e^{x_k − c} = e^{x_j} / Σ_k e^{x_k},
// so we shift by c = m = max_k x_k. Then every exponent is ≤ 0, every e^{x−m} lies in
// (0, 1], and the sum lies in [1, N_k]: nothing overflows, whatever the logits.
//
// Algorithm, for each (batch, head):
//   S = scale · Q Kᵀ                          [N_q, N_k]
//   m_i = max_j S_ij                          (pass over the row)
//   l_i = Σ_j exp(S_ij − m_i)                  (pass over the row)
//   P_ij = exp(S_ij − m_i) / l_i               [N_q, N_k]
//   O = P V,   L_i = m_i + log l_i
//
// Memory: still S and P, 2·N_q·N_k floats (one head at a time): at N_q = N_k = 64k, 32 GiB.
//         Stage 03 removes them.
// Run:    ./build/stages/02_safe_softmax/stage02 --dist large     (passes where 01 fails)
#include "safe_softmax.h"

#include <cmath>
#include <vector>

#include "tensors.h"

namespace fa::stage02 {

void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L) {
  p.validate("02_safe_softmax");
  const int64_t Nq = p.seq_q, Nk = p.seq_k, d = p.head_dim;
  const float scale = p.softmax_scale();
  require_fits_in_memory(2.0 * double(Nq) * double(Nk) * sizeof(float), "02_safe_softmax: S plus P");  // together
  std::vector<float> S = allocate(Nq * Nk, "02_safe_softmax: S");  // [N_q, N_k] scores
  std::vector<float> P = allocate(Nq * Nk, "02_safe_softmax: P");  // [N_q, N_k] probabilities
  std::vector<int64_t> n_used(static_cast<size_t>(Nq));             // [N_q] keys each row sums over

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const float* q = Q + p.q_offset(b, h, 0);                // [N_q, d]
      const float* k = K + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      const float* v = V + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      float* o = O + p.q_offset(b, h, 0);                      // [N_q, d]

      // S_ij = scale · q_i · k_j (unchanged from stage 01)
      for (int64_t i = 0; i < Nq; ++i)
        for (int64_t j = 0; j < p.visible_keys(i); ++j) {
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
          S[i * Nk + j] = scale * dot;
        }

      //! [safe softmax]
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t n_vis = p.visible_keys(i);
        // m_i = max_j S_ij. A NaN logit must make the row NaN, so it is not skipped.
        float row_max = -INFINITY;
        for (int64_t j = 0; j < n_vis; ++j)
          row_max = (S[i * Nk + j] > row_max || std::isnan(S[i * Nk + j])) ? S[i * Nk + j] : row_max;
        // A row whose every logit is −inf (m_i = −inf) sees no key: O = 0, L = −inf.
        const int64_t n = row_max == -INFINITY ? 0 : n_vis;
        n_used[size_t(i)] = n;
        // l_i = Σ_j e^{S_ij − m_i}: every term is in (0, 1], so the sum is in [1, N_k].
        float row_sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          P[i * Nk + j] = std::exp(S[i * Nk + j] - row_max);
          row_sum += P[i * Nk + j];
        }
        for (int64_t j = 0; j < n; ++j) P[i * Nk + j] /= row_sum;
        // L_i = m_i + log l_i: the log-sum-exp of the row, without ever forming e^{m_i}.
        L[p.l_offset(b, h, i)] = n == 0 ? -INFINITY : row_max + std::log(row_sum);
      }
      //! [safe softmax]

      // O = P V over the keys each row sees (unchanged from stage 01)
      for (int64_t i = 0; i < Nq; ++i)
        for (int64_t c = 0; c < d; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j < n_used[size_t(i)]; ++j) acc += P[i * Nk + j] * v[j * d + c];
          o[i * d + c] = acc;
        }
    }
  }
}

}  // namespace fa::stage02
