// Stage 13, the forward of the CPU step: stage 06's tile loop (tiled_cpu.cpp) with the causal
// skip replaced by a block mask and the logits passed through a score modifier.
//
// For each (batch, head, query tile i):
//   m_i = σ_h, l_i = 1 (sinks) or m_i = −∞, l_i = 0;  O_i = 0
//   for each key tile j in the range the mask allows:
//     kind = mask.classify(tile i, tile j);   skip → next j (K_j, V_j never read)
//     S = scale·Q_i K_jᵀ;  S ← f(S) on the keys each row sees (the score functor)
//     full:    stage 06's online-softmax update on the whole tile
//     partial: the same on the keys [lo, hi) ∩ tile of each row; P = 0 elsewhere
//   O_i = O_i / l_i,  L_i = m_i + log l_i   (a row with l_i = 0 saw nothing: O = 0, L = −∞)
// A template over the mask and the score: the loop a build runs has the modifier inlined and
// nothing to test for the ones it does not use. The tests instantiate it with a broken mask.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "block_mask.h"
#include "eigen.h"
#include "masks.h"

namespace fa::stage13 {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstTile = Eigen::Map<const Matrix>;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline void count(TileCounts* counts, TileKind kind) {
  if (!counts) return;
  (kind == TileKind::Skip ? counts->skip : kind == TileKind::Full ? counts->full : counts->partial) += 1;
}

// The keys [a, e) of a tile (local indices, cols wide from key c0) that row `row` sees.
template <typename Mask>
std::pair<int64_t, int64_t> seen_span(const Mask& mask, TileKind kind, int64_t row, int64_t c0, int64_t cols) {
  if (kind == TileKind::Full) return {0, cols};
  const KeyInterval k = mask.keys(row);
  const int64_t a = std::clamp<int64_t>(k.lo - c0, 0, cols);
  return {a, std::clamp<int64_t>(k.hi - c0, a, cols)};
}

template <typename Mask, typename ScoreFn>
void forward_tiles(const Problem& p, const Modifiers& m, const stage06::Tiles& t, const Mask& mask,
                   ScoreFn score, const float* Q, const float* K, const float* V, float* O, float* L,
                   TileCounts* counts) {
  const int64_t d = p.head_dim, N_q = p.seq_q, N_k = p.seq_k;
  const float scale = p.softmax_scale();
  const bool sinks = !m.sinks.empty();
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const int hk = p.kv_head_of(h);
      if constexpr (!ScoreFn::kIdentity)
        if (!m.alibi_slopes.empty()) score.slope = m.alibi_slopes[size_t(h)];
      for (int64_t i = 0; i < t.T_r; ++i) {
        const int64_t r0 = i * t.B_r, rows = std::min(t.B_r, N_q - r0);
        const ConstTile Q_i(Q + p.q_offset(b, h, r0), rows, d);  // [B_r, d]
        Matrix O_i = Matrix::Zero(rows, d);                      // [B_r, d] unnormalised output
        // A sink is a key with logit σ_h and value 0 that every row sees first: m = σ_h, l = e^0.
        Eigen::VectorXf m_i = Eigen::VectorXf::Constant(rows, sinks ? m.sinks[size_t(h)] : -kInf);
        Eigen::VectorXf l_i = Eigen::VectorXf::Constant(rows, sinks ? 1.0f : 0.0f);
        Matrix S(rows, t.B_c), P(rows, t.B_c);  // [B_r, B_c]

        //! [masked forward loop]
        // The key tiles that may hold a visible key: from the first row's first key to the
        // last row's last one. Tiles outside are skipped without being looked at.
        const int64_t j_begin = mask.keys(r0).lo / t.B_c;
        const int64_t j_end = ceil_div(mask.keys(r0 + rows - 1).hi, t.B_c);
        if (counts) counts->skip += t.T_c - std::max<int64_t>(0, j_end - j_begin);
        for (int64_t j = j_begin; j < j_end; ++j) {
          const int64_t c0 = j * t.B_c, cols = std::min(t.B_c, N_k - c0);
          const TileKind kind = mask.classify(r0, rows, c0, cols);
          count(counts, kind);
          if (kind == TileKind::Skip) continue;  // K_j, V_j are never read
          const ConstTile K_j(K + p.kv_offset(b, hk, c0), cols, d), V_j(V + p.kv_offset(b, hk, c0), cols, d);
          auto S_ij = S.leftCols(cols);
          auto P_ij = P.leftCols(cols);
          S_ij.noalias() = scale * (Q_i * K_j.transpose());  // S_ij = scale·Q_i K_jᵀ

          for (int64_t r = 0; r < rows; ++r) {
            const auto [a, e] = seen_span(mask, kind, r0 + r, c0, cols);  // row r sees keys [a, e)
            if constexpr (!ScoreFn::kIdentity) {
              const int64_t distance0 = c0 - mask.diagonal(r0 + r);
              for (int64_t c = a; c < e; ++c) S_ij(r, c) = score.value(S_ij(r, c), distance0 + c);
            }
            const float tile_max = e == a ? -kInf : S_ij.row(r).segment(a, e - a).template maxCoeff<Eigen::PropagateNaN>();
            const float m_new = std::isnan(tile_max) ? tile_max : std::max(m_i(r), tile_max);
            const float m_sub = m_new == -kInf ? 0.0f : m_new;  // stage 06: α = 0, not NaN
            P_ij.row(r).setZero();                               // P = 0 on the keys it does not see
            if (m_new != -kInf)
              P_ij.row(r).segment(a, e - a) = (S_ij.row(r).segment(a, e - a).array() - m_sub).exp().matrix();
            const float alpha = std::exp(m_i(r) - m_sub);  // e^{m_old − m_new}
            l_i(r) = alpha * l_i(r) + P_ij.row(r).sum();   // l_i = α·l_i + rowsum P_ij
            O_i.row(r) *= alpha;
            m_i(r) = m_new;
            if (kind == TileKind::Partial && e > a)  // only the seen keys' V (a NaN elsewhere stays out)
              O_i.row(r).noalias() += P_ij.row(r).segment(a, e - a) * V_j.middleRows(a, e - a);
          }
          if (kind == TileKind::Full) O_i.noalias() += P_ij * V_j;  // O_i += P_ij V_j
        }
        //! [masked forward loop]

        for (int64_t r = 0; r < rows; ++r) {
          float* L_r = L + p.l_offset(b, h, r0 + r);
          Eigen::Map<Eigen::RowVectorXf> O_r(O + p.q_offset(b, h, r0 + r), d);
          if (l_i(r) == 0.0f) {  // saw no key (and no sink)
            O_r.setZero();
            *L_r = -kInf;
          } else {
            O_r = O_i.row(r) / l_i(r);
            *L_r = m_i(r) + std::log(l_i(r));
          }
        }
      }
    }
}

}  // namespace fa::stage13
