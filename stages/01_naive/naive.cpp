// Stage 01 — naive attention: the formula as written.
//
// What it adds: nothing yet; this is the baseline every later stage is measured against.
//
// Algorithm, for each (batch, head):
//   S = scale · Q Kᵀ                        [N_q, N_k]  (masked entries excluded)
//   P_ij = exp(S_ij) / Σ_k exp(S_ik)        [N_q, N_k]
//   O = P V                                  [N_q, d]
//   L_i = log Σ_k exp(S_ik)                  (log-sum-exp, used by the backward later)
//
// Memory: S and P, 2·N_q·N_k floats (one head at a time) on top of Q, K, V, O: at
//         N_q = N_k = 64k that is 32 GiB.
// Limits: exp(x) overflows fp32 for x > 88.7, so logits in the hundreds give inf/inf = NaN.
//         Stage 02 fixes exactly that.
// Run:    ./build/stages/01_naive/stage01 --seq-q 256 --seq-k 256 --head-dim 64
//         ./build/stages/01_naive/stage01 --dist large      (watch it fail)
#include "naive.h"

#include <cmath>
#include <vector>

#include "tensors.h"

namespace fa::stage01 {

void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L) {
  p.validate("01_naive");
  const int64_t Nq = p.seq_q, Nk = p.seq_k, d = p.head_dim;
  const float scale = p.softmax_scale();
  require_fits_in_memory(2.0 * double(Nq) * double(Nk) * sizeof(float), "01_naive: S plus P");  // together
  std::vector<float> S = allocate(Nq * Nk, "01_naive: S");  // [N_q, N_k] scores
  std::vector<float> P = allocate(Nq * Nk, "01_naive: P");  // [N_q, N_k] probabilities
  std::vector<int64_t> n_used(static_cast<size_t>(Nq));      // [N_q] keys each row sums over

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const float* q = Q + p.q_offset(b, h, 0);                // [N_q, d]
      const float* k = K + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      const float* v = V + p.kv_offset(b, p.kv_head_of(h), 0);  // [N_k, d]
      float* o = O + p.q_offset(b, h, 0);                      // [N_q, d]

      //! [naive scores]
      // S_ij = scale · q_i · k_j for the keys row i may see (all of them unless causal)
      for (int64_t i = 0; i < Nq; ++i)
        for (int64_t j = 0; j < p.visible_keys(i); ++j) {
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
          S[i * Nk + j] = scale * dot;
        }
      //! [naive scores]

      //! [naive softmax]
      // P_ij = e^{S_ij} / Σ_k e^{S_ik}. No max is subtracted: e^{S_ij} overflows to inf
      // for S_ij > 88.7, and then P_ij = inf/inf = NaN.
      for (int64_t i = 0; i < Nq; ++i) {
        // A row whose every logit is −inf counts as a row that sees no key (O = 0, L = −inf).
        const int64_t n_vis = p.visible_keys(i);
        bool any = false;
        for (int64_t j = 0; j < n_vis; ++j) any = any || S[i * Nk + j] != -INFINITY;
        const int64_t n = any ? n_vis : 0;
        n_used[size_t(i)] = n;
        float row_sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          P[i * Nk + j] = std::exp(S[i * Nk + j]);
          row_sum += P[i * Nk + j];
        }
        for (int64_t j = 0; j < n; ++j) P[i * Nk + j] /= row_sum;
        // L_i = log Σ e^{S_ik}; a row that sees no key has L = −inf.
        L[p.l_offset(b, h, i)] = n == 0 ? -INFINITY : std::log(row_sum);
      }
      //! [naive softmax]

      //! [naive output]
      // O = P V over the keys each row sees (a row that sees no key stays 0)
      for (int64_t i = 0; i < Nq; ++i)
        for (int64_t c = 0; c < d; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j < n_used[size_t(i)]; ++j) acc += P[i * Nk + j] * v[j * d + c];
          o[i * d + c] = acc;
        }
      //! [naive output]
    }
  }
}

}  // namespace fa::stage01
