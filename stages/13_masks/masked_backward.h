// Stage 13, the backward of the CPU step: stage 06's two passes (tiled_backward.cpp) under the
// block mask, with the score modifier's derivative.
//
//   dK, dV: for each (batch, kv head, key tile j): the query tiles of the rows that may see
//           tile j (BlockMask::rows_touching), each classified as in the forward (skip → next)
//   dQ:     for each (batch, head, query tile i): the key tiles of the forward's range
//   per tile: S = scale·Q_i K_jᵀ,  P = e^{f(S) − L_i},  dP = dO_i V_jᵀ,
//             dS = P∘(dP − D_i)∘f'(S)     (f'(S) = 1 − tanh²(S/cap) under soft-cap)
//             dV_j += Pᵀ dO_i,  dK_j += scale·dSᵀ Q_i,  dQ_i += scale·dS K_j
//   sinks:  dσ_h = −Σ_i e^{σ_h − L_i}·D_i    (the sink's P times its dS with dP = 0)
#pragma once

#include <algorithm>
#include <vector>

#include "masked_forward.h"

namespace fa::stage13 {

// P and dS of one tile (P, dS: [rows, cols]) on the keys each row sees; 0 elsewhere, and 0 on
// a row with L = −∞ (it saw nothing).
template <typename Mask, typename ScoreFn>
void recompute_P_dS(const Mask& mask, const ScoreFn& score, float scale, TileKind kind, int64_t r0, int64_t c0,
                    const ConstTile& Q_i, const ConstTile& dO_i, const float* L_i, const float* D_i,
                    const ConstTile& K_j, const ConstTile& V_j, Matrix& P, Matrix& dS) {
  const int64_t cols = K_j.rows();
  //! [masked recompute dS]
  Matrix S = scale * (Q_i * K_j.transpose());  // S_ij = scale·Q_i K_jᵀ   [B_r, B_c]
  dS.noalias() = dO_i * V_j.transpose();       // dP_ij = dO_i V_jᵀ
  P.setZero(S.rows(), cols);
  for (int64_t r = 0; r < S.rows(); ++r) {
    auto [a, e] = seen_span(mask, kind, r0 + r, c0, cols);
    if (L_i[r] == -kInf) e = a;  // a row that saw nothing takes no part
    const int64_t distance0 = c0 - mask.diagonal(r0 + r);
    for (int64_t c = a; c < e; ++c) {
      const float s = S(r, c);
      P(r, c) = std::exp(score.value(s, distance0 + c) - L_i[r]);          // P = e^{f(S) − L}
      dS(r, c) = P(r, c) * (dS(r, c) - D_i[r]) * score.derivative(s);      // dS = P∘(dP − D)∘f'(S)
    }
    dS.row(r).head(a).setZero();
    dS.row(r).tail(cols - e).setZero();
  }
  //! [masked recompute dS]
}

// C += A·B over each row's seen keys (A: [rows, cols] tile, B: [cols, d]); the whole product
// in a full tile. A key a row does not see never reaches it, even with NaN in its K or V.
// A row with L = −∞ (it saw nothing) takes part with no key.
template <typename Mask>
void add_product_seen(Matrix& C, const Matrix& A, const ConstTile& B, const Mask& mask, TileKind kind, int64_t r0,
                      int64_t c0, const float* L_i) {
  const int64_t rows = A.rows();
  if (kind == TileKind::Full && std::find(L_i, L_i + rows, -kInf) == L_i + rows) {
    C.noalias() += A * B;
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const auto [a, e] = seen_span(mask, kind, r0 + r, c0, B.rows());
    if (e > a && L_i[r] != -kInf) C.row(r).noalias() += A.row(r).segment(a, e - a) * B.middleRows(a, e - a);
  }
}
// C += Aᵀ·B over each row's seen keys (A: [rows, cols], B: [rows, d], C: [cols, d]).
template <typename Mask>
void add_transpose_product_seen(Matrix& C, const Matrix& A, const ConstTile& B, const Mask& mask, TileKind kind,
                                int64_t r0, int64_t c0, const float* L_i) {
  const int64_t rows = A.rows();
  if (kind == TileKind::Full && std::find(L_i, L_i + rows, -kInf) == L_i + rows) {
    C.noalias() += A.transpose() * B;
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const auto [a, e] = seen_span(mask, kind, r0 + r, c0, C.rows());
    if (e > a && L_i[r] != -kInf)
      C.middleRows(a, e - a).noalias() += A.row(r).segment(a, e - a).transpose() * B.row(r);
  }
}

template <typename Mask, typename ScoreFn>
void backward_tiles(const Problem& p, const Modifiers& m, const stage06::Tiles& t, const Mask& mask,
                    ScoreFn score, const float* Q, const float* K, const float* V, const float* O,
                    const float* L, const float* dO, float* dQ, float* dK, float* dV, float* dsinks,
                    TileCounts* counts) {
  const int64_t d = p.head_dim, N_q = p.seq_q, N_k = p.seq_k;
  const float scale = p.softmax_scale();
  const auto set_head = [&](int h) {
    if constexpr (!ScoreFn::kIdentity)
      if (!m.alibi_slopes.empty()) score.slope = m.alibi_slopes[size_t(h)];
  };

  // D = rowsum(dO∘O), [batch][heads][N_q]
  std::vector<float> D(static_cast<size_t>(p.l_elems()));
  // Summed as stage 06 sums it (and as the products sum dP = dO_i V_jᵀ): dS = P∘(dP − D)
  // cancels where a row's probability sits on one key, and two different summation orders
  // for dP and D would leave their rounding difference there.
  for (int64_t x = 0; x < p.l_elems(); ++x)
    D[size_t(x)] = ConstTile(dO + x * d, 1, d).cwiseProduct(ConstTile(O + x * d, 1, d)).sum();
  Matrix P, dS;

  // dK, dV: one key tile at a time, the query tiles that may see it streaming past.
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int64_t j = 0; j < t.T_c; ++j) {
        const int64_t c0 = j * t.B_c, cols = std::min(t.B_c, N_k - c0);
        const ConstTile K_j(K + p.kv_offset(b, hk, c0), cols, d), V_j(V + p.kv_offset(b, hk, c0), cols, d);
        Matrix dK_j = Matrix::Zero(cols, d), dV_j = Matrix::Zero(cols, d);  // [B_c, d]
        //! [masked backward dK dV]
        const auto [row_begin, row_end] = mask.rows_touching(c0, c0 + cols);
        const int64_t i_begin = row_begin / t.B_r, i_end = ceil_div(row_end, t.B_r);
        for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
          set_head(h);
          if (counts) counts->skip += t.T_r - std::max<int64_t>(0, i_end - i_begin);
          for (int64_t i = i_begin; i < i_end; ++i) {
            const int64_t r0 = i * t.B_r, rows = std::min(t.B_r, N_q - r0);
            const TileKind kind = mask.classify(r0, rows, c0, cols);  // the forward's decision
            count(counts, kind);
            if (kind == TileKind::Skip) continue;
            const ConstTile Q_i(Q + p.q_offset(b, h, r0), rows, d), dO_i(dO + p.q_offset(b, h, r0), rows, d);
            const float* L_i = L + p.l_offset(b, h, r0);
            const float* D_i = D.data() + p.l_offset(b, h, r0);
            recompute_P_dS(mask, score, scale, kind, r0, c0, Q_i, dO_i, L_i, D_i, K_j, V_j, P, dS);
            add_transpose_product_seen(dV_j, P, dO_i, mask, kind, r0, c0, L_i);  // dV_j += Pᵀ dO_i
            add_transpose_product_seen(dK_j, dS, Q_i, mask, kind, r0, c0, L_i);  // dK_j += dSᵀ Q_i
          }
        }
        //! [masked backward dK dV]
        Eigen::Map<Matrix>(dK + p.kv_offset(b, hk, c0), cols, d) = scale * dK_j;
        Eigen::Map<Matrix>(dV + p.kv_offset(b, hk, c0), cols, d) = dV_j;
      }

  // dQ (and dσ): one query tile at a time, the forward's key tiles streaming past.
  std::vector<double> dsink(static_cast<size_t>(p.heads), 0.0);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const int hk = p.kv_head_of(h);
      set_head(h);
      for (int64_t i = 0; i < t.T_r; ++i) {
        const int64_t r0 = i * t.B_r, rows = std::min(t.B_r, N_q - r0);
        const ConstTile Q_i(Q + p.q_offset(b, h, r0), rows, d), dO_i(dO + p.q_offset(b, h, r0), rows, d);
        const float* L_i = L + p.l_offset(b, h, r0);
        const float* D_i = D.data() + p.l_offset(b, h, r0);
        Matrix dQ_i = Matrix::Zero(rows, d);
        const int64_t j_begin = mask.keys(r0).lo / t.B_c;
        const int64_t j_end = ceil_div(mask.keys(r0 + rows - 1).hi, t.B_c);
        if (counts) counts->skip += t.T_c - std::max<int64_t>(0, j_end - j_begin);
        for (int64_t j = j_begin; j < j_end; ++j) {
          const int64_t c0 = j * t.B_c, cols = std::min(t.B_c, N_k - c0);
          const TileKind kind = mask.classify(r0, rows, c0, cols);
          count(counts, kind);
          if (kind == TileKind::Skip) continue;
          const ConstTile K_j(K + p.kv_offset(b, hk, c0), cols, d), V_j(V + p.kv_offset(b, hk, c0), cols, d);
          recompute_P_dS(mask, score, scale, kind, r0, c0, Q_i, dO_i, L_i, D_i, K_j, V_j, P, dS);
          add_product_seen(dQ_i, dS, K_j, mask, kind, r0, c0, L_i);  // dQ_i += dS_ij K_j
        }
        Eigen::Map<Matrix>(dQ + p.q_offset(b, h, r0), rows, d) = scale * dQ_i;
        if (!m.sinks.empty())  // dσ_h −= e^{σ_h − L_i}·D_i over the rows
          for (int64_t r = 0; r < rows; ++r)
            if (std::isfinite(L_i[r])) dsink[size_t(h)] -= std::exp(double(m.sinks[size_t(h)]) - L_i[r]) * D_i[r];
      }
    }
  if (dsinks && !m.sinks.empty())
    for (int h = 0; h < p.heads; ++h) dsinks[h] = float(dsink[size_t(h)]);
}

}  // namespace fa::stage13
