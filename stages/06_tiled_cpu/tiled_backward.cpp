// Stage 06, the backward (the second sitting, 06b, in the notes) — FlashAttention-2's
// Algorithm 2 on the CPU, with the forward's tiles, traffic count and threads (tiled_cpu.cpp,
// fast_memory.h). It recomputes P from the forward's L = m + log l instead of storing it.
//
// Backward (Algorithm 2, with dQ in its own pass so that every output element has exactly
// one writer; results are then bitwise the same for any number of threads):
//   D = rowsum(dO∘O)                                      in parallel over query tiles
//   dK, dV: in parallel over (batch, kv head, key tile j): load K_j, V_j; for every query
//           head of the group and query tile i that sees tile j: load Q_i, dO_i, L_i, D_i,
//           P_ij = exp(S_ij − L_i), dV_j += P_ijᵀ dO_i, dP_ij = dO_i V_jᵀ,
//           dS_ij = P_ij∘(dP_ij − D_i), dK_j += scale·dS_ijᵀ Q_i
//   dQ:     in parallel over (batch, head, query tile i): for every key tile j it sees,
//           recompute dS_ij as above, dQ_i += scale·dS_ij K_j
#include <algorithm>
#include <string>
#include <vector>

#include "fast_memory.h"
#include "tensors.h"
#include "tiled_cpu.h"

namespace fa::stage06 {

namespace {

// The backward's recomputation for one tile, shared by the dK/dV pass and the dQ pass:
//   P_ij = exp(S_ij − L_i)   (L_i = m_i + log l_i, so P comes out already normalised)
//   dS_ij = P_ij∘(dP_ij − D_i),  dP_ij = dO_i V_jᵀ
// S_ij is built in P's storage and dP_ij in dS's: each is dead once the next one exists.
void recompute_P_dS(const Problem& p, float scale, int64_t r0, int64_t c0, const Tile& Q_i,
                    const Tile& dO_i, const Column& L_i, const Column& D_i, const Tile& K_j,
                    const Tile& V_j, Tile P, Tile dS) {
  //! [recompute dS]
  P.noalias() = scale * (Q_i * K_j.transpose());  // S_ij = scale·Q_i K_jᵀ  [B_r, B_c]
  // LAB BEGIN: recompute P and dS — hint: P = exp(S − L_i) on the keys each row uses (keys_used), 0 on the others; dP = dO_i V_jᵀ; dS = P∘(dP − D_i) on those keys, 0 on the others
  const int64_t cols = P.cols();
  const bool diagonal = crosses_diagonal(p, r0, c0, cols);  // only then do rows see fewer keys
  for (int64_t r = 0; r < P.rows(); ++r) {
    const int64_t n = keys_used(p, r0 + r, c0, cols, diagonal, L_i(r));
    P.row(r).head(n) = (P.row(r).head(n).array() - L_i(r)).exp().matrix();  // P_ij = exp(S_ij − L_i)
    P.row(r).tail(cols - n).setZero();                                        // masked: P_ij = 0
  }
  dS.noalias() = dO_i * V_j.transpose();  // dP_ij = dO_i V_jᵀ  [B_r, B_c]
  for (int64_t r = 0; r < dS.rows(); ++r) {  // dS_ij = P_ij∘(dP_ij − D_i), 0 where P_ij is
    const int64_t n = keys_used(p, r0 + r, c0, cols, diagonal, L_i(r));
    dS.row(r).head(n) = (P.row(r).head(n).array() * (dS.row(r).head(n).array() - D_i(r))).matrix();
    dS.row(r).tail(cols - n).setZero();
  }
  // LAB END
  //! [recompute dS]
}

}  // namespace

// ---- Backward ----

void backward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V,
              const float* O, const float* L, const float* dO, float* dQ, float* dK, float* dV,
              Traffic* traffic) {
  p.validate(kStageName);
  const Tiles t = tiles_for(p, c);
  require_backward_buffers(kStageName, p, Q, K, V, O, L, dO, dQ, dK, dV);
  const int64_t d = p.head_dim, N_q = p.seq_q, N_k = p.seq_k;
  const float scale = p.softmax_scale();
  if (traffic) *traffic = Traffic{};

  // D = rowsum(dO∘O) lives in slow memory like L: [batch][heads][N_q].
  std::vector<float> D = allocate(p.l_elems(), std::string(kStageName) + ": D");

  // Pass 1 of 3: D, one task per (batch, head, query tile i).
  {
    const int64_t n_tasks = int64_t(p.batch) * p.heads * t.T_r;
    Workers workers(p, t, c.threads, n_tasks);
    parallel_for(n_tasks, workers.count, [&](int64_t task, int w) {
      const int64_t i = task % t.T_r;
      const int h = int(task / t.T_r % p.heads), b = int(task / t.T_r / p.heads);
      FastMemory& f = workers.fast[size_t(w)];
      Traffic* counted = workers.counter(w, traffic);
      const int64_t r0 = i * t.B_r, rows = std::min(t.B_r, N_q - r0);
      Tile O_i(f.O.data(), rows, d), dO_i(f.dO.data(), rows, d);  // [B_r, d] each
      load(O_i.data(), O + p.q_offset(b, h, r0), rows * d, kO, counted);
      load(dO_i.data(), dO + p.q_offset(b, h, r0), rows * d, kdO, counted);
      Column D_i(f.D.data(), rows);
      D_i = dO_i.cwiseProduct(O_i).rowwise().sum();  // D_i = rowsum(dO_i∘O_i)
      store(D.data() + p.l_offset(b, h, r0), D_i.data(), rows, kD, counted);
    });
    if (traffic) *traffic += workers.total();
  }

  // Loads the query-side tiles of tile i of head h: Q_i, dO_i, L_i, D_i.
  const auto load_query_tile = [&](FastMemory& f, Traffic* counted, int b, int h, int64_t r0,
                                   int64_t rows) {
    load(f.Q.data(), Q + p.q_offset(b, h, r0), rows * d, kQ, counted);
    load(f.dO.data(), dO + p.q_offset(b, h, r0), rows * d, kdO, counted);
    load(f.L.data(), L + p.l_offset(b, h, r0), rows, kL, counted);
    load(f.D.data(), D.data() + p.l_offset(b, h, r0), rows, kD, counted);
  };

  // Pass 2 of 3: dK and dV, one task per (batch, kv head, key tile j). K_j and V_j stay in
  // fast memory while every query tile of every query head of the group streams past.
  {
    const int64_t n_tasks = int64_t(p.batch) * p.kv_heads * t.T_c;
    Workers workers(p, t, c.threads, n_tasks);
    parallel_for(n_tasks, workers.count, [&](int64_t task, int w) {
      const int64_t j = task % t.T_c;
      const int hk = int(task / t.T_c % p.kv_heads), b = int(task / t.T_c / p.kv_heads);
      FastMemory& f = workers.fast[size_t(w)];
      Traffic* counted = workers.counter(w, traffic);
      const int64_t c0 = j * t.B_c, cols = std::min(t.B_c, N_k - c0);

      Tile K_j(f.K.data(), cols, d), V_j(f.V.data(), cols, d);  // [B_c, d] each, resident
      load(K_j.data(), K + p.kv_offset(b, hk, c0), cols * d, kK, counted);
      load(V_j.data(), V + p.kv_offset(b, hk, c0), cols * d, kV, counted);
      Tile dK_j(f.dK.data(), cols, d), dV_j(f.dV.data(), cols, d);  // [B_c, d] accumulators
      dK_j.setZero();
      dV_j.setZero();

      //! [backward dK dV]
      for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        for (int64_t i = first_query_tile(p, t, j); i < t.T_r; ++i) {
          const int64_t r0 = i * t.B_r, rows = std::min(t.B_r, N_q - r0);
          load_query_tile(f, counted, b, h, r0, rows);
          const Tile Q_i(f.Q.data(), rows, d), dO_i(f.dO.data(), rows, d);  // [B_r, d]
          const Column L_i(f.L.data(), rows), D_i(f.D.data(), rows);       // [B_r]
          Tile P(f.P.data(), rows, cols), dS(f.S.data(), rows, cols);      // [B_r, B_c]
          recompute_P_dS(p, scale, r0, c0, Q_i, dO_i, L_i, D_i, K_j, V_j, P, dS);
          // LAB BEGIN: accumulate dV_j and dK_j — hint: dV_j += P_ijᵀ dO_i; dK_j += dS_ijᵀ Q_i, with add_transpose_product_seen in a partial_tile (the factor scale is applied once, at the store)
          if (partial_tile(p, r0, c0, cols, L_i)) {  // a key's gradient comes only from the rows that see it
            const bool diagonal = crosses_diagonal(p, r0, c0, cols);
            const auto n = [&](int64_t r) { return keys_used(p, r0 + r, c0, cols, diagonal, L_i(r)); };
            add_transpose_product_seen(dV_j, P, dO_i, n);
            add_transpose_product_seen(dK_j, dS, Q_i, n);
          } else {
            dV_j.noalias() += P.transpose() * dO_i;  // dV_j += P_ijᵀ dO_i
            dK_j.noalias() += dS.transpose() * Q_i;  // dK_j += dS_ijᵀ Q_i
          }
          // LAB END
        }
      }
      dK_j *= scale;  // dK_j = scale·Σ dS_ijᵀ Q_i
      //! [backward dK dV]
      store(dK + p.kv_offset(b, hk, c0), dK_j.data(), cols * d, kdK, counted);
      store(dV + p.kv_offset(b, hk, c0), dV_j.data(), cols * d, kdV, counted);
    });
    if (traffic) *traffic += workers.total();
  }

  // Pass 3 of 3: dQ, one task per (batch, head, query tile i). Q_i, dO_i, L_i, D_i stay
  // in fast memory while the key tiles it sees stream past; dS_ij is recomputed.
  {
    const int64_t n_tasks = int64_t(p.batch) * p.heads * t.T_r;
    Workers workers(p, t, c.threads, n_tasks);
    parallel_for(n_tasks, workers.count, [&](int64_t task, int w) {
      const int64_t i = task % t.T_r;
      const int h = int(task / t.T_r % p.heads), b = int(task / t.T_r / p.heads);
      const int hk = p.kv_head_of(h);
      FastMemory& f = workers.fast[size_t(w)];
      Traffic* counted = workers.counter(w, traffic);
      const int64_t r0 = i * t.B_r, rows = std::min(t.B_r, N_q - r0);

      load_query_tile(f, counted, b, h, r0, rows);
      const Tile Q_i(f.Q.data(), rows, d), dO_i(f.dO.data(), rows, d);  // [B_r, d], resident
      const Column L_i(f.L.data(), rows), D_i(f.D.data(), rows);       // [B_r]
      Tile dQ_i(f.dQ.data(), rows, d);                                  // [B_r, d] accumulator
      dQ_i.setZero();

      //! [backward dQ]
      for (int64_t j = 0; j < key_tiles_visited(p, t, i); ++j) {
        const int64_t c0 = j * t.B_c, cols = std::min(t.B_c, N_k - c0);
        Tile K_j(f.K.data(), cols, d), V_j(f.V.data(), cols, d);  // [B_c, d] each
        load(K_j.data(), K + p.kv_offset(b, hk, c0), cols * d, kK, counted);
        load(V_j.data(), V + p.kv_offset(b, hk, c0), cols * d, kV, counted);
        Tile P(f.P.data(), rows, cols), dS(f.S.data(), rows, cols);  // [B_r, B_c]
        recompute_P_dS(p, scale, r0, c0, Q_i, dO_i, L_i, D_i, K_j, V_j, P, dS);
        if (partial_tile(p, r0, c0, cols, L_i)) {
          const bool diagonal = crosses_diagonal(p, r0, c0, cols);
          add_product_seen(dQ_i, dS, K_j, [&](int64_t r) { return keys_used(p, r0 + r, c0, cols, diagonal, L_i(r)); });
        } else {
          dQ_i.noalias() += dS * K_j;  // dQ_i += dS_ij K_j
        }
      }
      dQ_i *= scale;  // dQ_i = scale·Σ dS_ij K_j
      //! [backward dQ]
      store(dQ + p.q_offset(b, h, r0), dQ_i.data(), rows * d, kdQ, counted);
    });
    if (traffic) *traffic += workers.total();
  }
}

}  // namespace fa::stage06
