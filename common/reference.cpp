// The Eigen reference. Written as the textbook formulas, one (batch, head) and one block of
// query rows at a time:
//   S = scale·Q Kᵀ (masked entries −inf),  m = rowmax S,  l = rowsum exp(S − m),
//   P = exp(S − m) / l,  O = P V,  L = m + log l,
//   D = rowsum(dO∘O),  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P∘(dP − D),
//   dQ = scale·dS K,  dK = scale·dSᵀ Q.
#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "eigen.h"
#include "in_order.h"

namespace fa {

namespace {

template <typename Scalar>
using Mat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMapF = Eigen::Map<const Mat<float>>;

// Query rows processed together: bounds the S/P block to kRowBlock × N_k.
constexpr int64_t kRowBlock = 256;

// Rounds every element to the storage type of `mode` (a no-op for Exact and F32).
template <typename Scalar>
void round_to(RefMode mode, Mat<Scalar>& x) {
  if (mode == RefMode::F16)
    x = x.unaryExpr([](Scalar v) { return Scalar(float(Eigen::half(float(v)))); });
  else if (mode == RefMode::BF16)
    x = x.unaryExpr([](Scalar v) { return Scalar(float(Eigen::bfloat16(float(v)))); });
}

template <typename Scalar>
Mat<Scalar> load(RefMode mode, const float* base, int64_t rows, int64_t cols) {
  Mat<Scalar> x = ConstMapF(base, rows, cols).template cast<Scalar>();
  round_to(mode, x);
  return x;
}

template <typename Scalar>
void store(std::vector<double>& dst, int64_t offset, const Mat<Scalar>& x) {
  Eigen::Map<Mat<double>>(dst.data() + offset, x.rows(), x.cols()) = x.template cast<double>();
}

template <typename Scalar>
Reference run(const Problem& p, const float* Q, const float* K, const float* V, const float* dO,
              RefMode mode, bool want_P, int merged_parts, const float* L_given = nullptr) {
  p.validate("reference");
  const bool backward = dO != nullptr;
  const bool in_order = mode == RefMode::F32InOrder, merged = mode == RefMode::F32Merged;
  const int64_t d = p.head_dim, Nq = p.seq_q, Nk = p.seq_k;
  const Scalar scale = Scalar(p.softmax_scale());
  const Scalar inf = std::numeric_limits<Scalar>::infinity();

  Reference r;
  r.O.assign(size_t(p.q_elems()), 0.0);
  r.L.assign(size_t(p.l_elems()), 0.0);
  r.m.assign(size_t(p.l_elems()), 0.0);
  r.l.assign(size_t(p.l_elems()), 0.0);
  if (want_P) r.P.assign(size_t(p.batch) * p.heads * Nq * Nk, 0.0);
  if (backward) {
    r.D.assign(size_t(p.l_elems()), 0.0);
    r.dQ.assign(size_t(p.q_elems()), 0.0);
    r.dK.assign(size_t(p.kv_elems()), 0.0);
    r.dV.assign(size_t(p.kv_elems()), 0.0);
  }
  // Nothing to compute (and no loop over every head, of which there may be 2^30): no query
  // row means no output and zero gradients; no key means every row sees none (O = 0,
  // L = m = −inf, l = 0, D = 0, dQ = 0).
  if (Nq == 0) return r;
  if (Nk == 0) {
    std::fill(r.L.begin(), r.L.end(), -INFINITY);
    std::fill(r.m.begin(), r.m.end(), -INFINITY);
    return r;
  }

  for (int b = 0; b < p.batch; ++b) {
    for (int hk = 0; hk < p.kv_heads; ++hk) {
      const Mat<Scalar> Kh = load<Scalar>(mode, K + p.kv_offset(b, hk, 0), Nk, d);  // [N_k, d]
      const Mat<Scalar> Vh = load<Scalar>(mode, V + p.kv_offset(b, hk, 0), Nk, d);  // [N_k, d]
      Mat<Scalar> KhT, VhT;  // [d, N_k], for the products in index order
      if (in_order) {
        KhT = Kh.transpose();
        VhT = Vh.transpose();
      }
      Mat<Scalar> dK_acc = Mat<Scalar>::Zero(Nk, d), dV_acc = Mat<Scalar>::Zero(Nk, d);

      for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        for (int64_t r0 = 0; r0 < Nq; r0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, Nq - r0);
          const Mat<Scalar> Qr = load<Scalar>(mode, Q + p.q_offset(b, h, r0), rows, d);
          const auto all_d = [&](int64_t) { return d; };
          Mat<Scalar> S =  // [rows, N_k]
              scale * (in_order ? times_in_order(Qr, KhT, all_d) : Mat<Scalar>(Qr * Kh.transpose()));
          Mat<Scalar> Pm(rows, Nk);                       // P of this row block
          Eigen::Matrix<Scalar, Eigen::Dynamic, 1> row_max(rows), row_sum(rows);
          std::vector<Scalar> merged_L(static_cast<size_t>(rows), Scalar(0));  // F32Merged: L as merged
          std::vector<bool> was_merged(static_cast<size_t>(rows), false);
          // Keys each row takes part with: the keys it sees, or none when every logit it
          // sees is −inf (such a row is a row that sees no key: O = 0, L = −inf).
          std::vector<int64_t> n_used(static_cast<size_t>(rows));

          for (int64_t i = 0; i < rows; ++i) {
            const int64_t n_vis = p.visible_keys(r0 + i);
            for (int64_t j = n_vis; j < Nk; ++j) S(i, j) = -inf;  // causal mask
            // Row max, written out so that a NaN logit makes the max NaN (and so the row).
            Scalar mx = -inf;
            for (int64_t j = 0; j < n_vis; ++j)
              mx = (std::isnan(S(i, j)) || S(i, j) > mx) ? S(i, j) : mx;
            const int64_t n = mx == -inf ? 0 : n_vis;
            n_used[size_t(i)] = n;
            Scalar sum = 0;
            for (int64_t j = 0; j < Nk; ++j) {
              Pm(i, j) = j < n ? std::exp(S(i, j) - mx) : Scalar(0);
              sum += Pm(i, j);
            }
            row_max(i) = mx;
            row_sum(i) = sum;
            if (n == 0) continue;  // empty row: P = 0, O = 0, L = −inf
            Pm.row(i).head(n) /= sum;  // (a NaN sum must not reach the masked zeros)
            if (merged && n >= 2 && std::isfinite(mx)) {
              // The keys in k = min(merged_parts, n) runs [j_t, j_{t+1}), j_t = t·n/k, each a
              // partial result (m_t, l_t, L_t = m_t + log l_t), merged one after another in fp32
              // as a ring folds its pairs' results into a row's (L rounded at every merge):
              //   L ← top + log(e^{L − top} + e^{L_t − top}),  top = max(L, L_t);
              // then P_j = e^{L_t − L} · e^{S_j − m_t} / l_t on the keys of run t.
              const int64_t k = std::min<int64_t>(merged_parts, n);
              std::vector<Scalar> m_run(static_cast<size_t>(k), -inf), l_run(static_cast<size_t>(k), 0);
              Scalar L = -inf;
              for (int64_t t = 0; t < k; ++t) {
                const int64_t j0 = t * n / k, j1 = (t + 1) * n / k;
                Scalar& m_t = m_run[size_t(t)];
                for (int64_t j = j0; j < j1; ++j) m_t = std::max(m_t, S(i, j));
                if (m_t == -inf) continue;  // a run of −inf logits: P = 0 there, nothing to merge
                for (int64_t j = j0; j < j1; ++j) l_run[size_t(t)] += std::exp(S(i, j) - m_t);
                const Scalar L_t = m_t + std::log(l_run[size_t(t)]), top = std::max(L, L_t);
                L = L == -inf ? L_t : top + std::log(std::exp(L - top) + std::exp(L_t - top));
              }
              // The stage's own L instead, where the caller hands it (compare_backward): its
              // rounding is the stage's, not this sequence's (see reference_backward).
              if (L_given) {
                const Scalar Lg = Scalar(L_given[p.l_offset(b, h, r0) + i]);
                if (std::isfinite(Lg)) L = Lg;
              }
              for (int64_t t = 0; t < k; ++t) {
                const Scalar m_t = m_run[size_t(t)], w = std::exp(m_t + std::log(l_run[size_t(t)]) - L) / l_run[size_t(t)];
                for (int64_t j = t * n / k; j < (t + 1) * n / k; ++j)
                  Pm(i, j) = m_t == -inf ? Scalar(0) : w * std::exp(S(i, j) - m_t);
              }
              merged_L[size_t(i)] = L;
              was_merged[size_t(i)] = true;
            }
          }
          const int64_t lo = p.l_offset(b, h, r0);
          for (int64_t i = 0; i < rows; ++i) {
            const bool empty = n_used[size_t(i)] == 0;
            r.m[size_t(lo + i)] = empty ? -INFINITY : double(row_max(i));
            r.l[size_t(lo + i)] = empty ? 0.0 : double(row_sum(i));
            r.L[size_t(lo + i)] = empty                     ? -INFINITY
                                  : was_merged[size_t(i)] ? double(merged_L[size_t(i)])
                                                          : double(row_max(i)) + std::log(double(row_sum(i)));
          }
          if (want_P) store(r.P, ((int64_t(b) * p.heads + h) * Nq + r0) * Nk, Pm);

          // Products over the keys each row takes part with. A key a row does not see must
          // not reach it: the full product would add 0·NaN = NaN for a masked key whose K or
          // V holds a NaN or an inf. With finite operands the full product is the same.
          // A·B over those keys ([rows, N_k]·[N_k, d]):
          const auto used = [&](int64_t i) { return n_used[size_t(i)]; };
          const auto seen_times = [&](const Mat<Scalar>& A, const Mat<Scalar>& B) {
            if (in_order) return times_in_order(A, B, used);
            if (B.allFinite()) return Mat<Scalar>(A * B);
            Mat<Scalar> C = Mat<Scalar>::Zero(rows, B.cols());
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t n = n_used[size_t(i)];
              if (n > 0) C.row(i).noalias() = A.row(i).head(n) * B.topRows(n);
            }
            return C;
          };
          // acc += f·Aᵀ·B over those keys ([rows, N_k]ᵀ·[rows, d]), for dK and dV: a key's
          // gradient comes only from the rows that see it. In index order, each element's sum
          // runs on over every row of every query head of the group (in_order.h), as a plain
          // loop adds a kv head's dK and dV: a sum group_size times longer than one head's.
          const auto add_seen_transpose_times = [&](Mat<Scalar>& acc, Scalar f, const Mat<Scalar>& A,
                                                    const Mat<Scalar>& B) {
            if (in_order) return add_transpose_times_in_order(acc, Mat<Scalar>(f * A), B, used);
            if (B.allFinite()) return void(acc += f * Mat<Scalar>(A.transpose() * B));
            Mat<Scalar> C = Mat<Scalar>::Zero(Nk, B.cols());
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t n = n_used[size_t(i)];
              if (n > 0) C.topRows(n).noalias() += A.row(i).head(n).transpose() * B.row(i);
            }
            acc += f * C;
          };

          Mat<Scalar> P_in = Pm;  // P as it enters the P·V product
          round_to(mode, P_in);
          Mat<Scalar> Or = seen_times(P_in, Vh);  // [rows, d]
          store(r.O, p.q_offset(b, h, r0), Or);
          if (!backward) continue;

          // ---- backward for this row block ----
          // A backward pass is handed L in fp32 (the contract of docs/design.md §3) and recomputes
          // P = exp(S − L) from it. The same-precision baselines do the same, so that the
          // rounding of L (about u·|L|, i.e. a relative error of u·|L| in every P when the
          // logits are in the hundreds) is part of the budget; the exact mode uses P itself.
          Mat<Scalar> P_bwd = Pm;
          if (mode != RefMode::Exact)
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t n = n_used[size_t(i)];
              if (n == 0) continue;
              const Scalar L_f32 = Scalar(float(r.L[size_t(lo + i)]));
              for (int64_t j = 0; j < n; ++j) P_bwd(i, j) = std::exp(S(i, j) - L_f32);
            }
          P_in = P_bwd;
          round_to(mode, P_in);
          const Mat<Scalar> dOr = load<Scalar>(mode, dO + p.q_offset(b, h, r0), rows, d);
          round_to(mode, Or);  // a kernel computes D from the O it stored
          Eigen::Matrix<Scalar, Eigen::Dynamic, 1> Dr = dOr.cwiseProduct(Or).rowwise().sum();  // D = rowsum(dO∘O)
          // In index order too, but from the last column to the first: dP = dO Vᵀ runs from the
          // first. Where one key takes a row's whole weight, O = V_j and dP_ij − D_i cancels to
          // the difference of the two sums' roundings, which a stage computing them in two
          // orders (a product and a row sum) leaves in dS; one order for both would leave 0.
          if (in_order)
            for (int64_t i = 0; i < rows; ++i) {
              Dr(i) = 0;
              for (int64_t c = d - 1; c >= 0; --c) Dr(i) += dOr(i, c) * Or(i, c);
            }
          add_seen_transpose_times(dV_acc, 1, P_in, dOr);              // dV += Pᵀ dO
          const Mat<Scalar> dP =                                       // dP = dO Vᵀ
              in_order ? times_in_order(dOr, VhT, all_d) : Mat<Scalar>(dOr * Vh.transpose());
          Mat<Scalar> dS = P_bwd.cwiseProduct(dP.colwise() - Dr);      // dS = P∘(dP − D)
          for (int64_t i = 0; i < rows; ++i)  // 0 on keys the row does not take part with
            dS.row(i).tail(Nk - n_used[size_t(i)]).setZero();
          round_to(mode, dS);
          add_seen_transpose_times(dK_acc, scale, dS, Qr);             // dK += scale·dSᵀ Q
          const Mat<Scalar> dQr = scale * seen_times(dS, Kh);          // dQ = scale·dS K
          store(r.dQ, p.q_offset(b, h, r0), dQr);
          for (int64_t i = 0; i < rows; ++i) r.D[size_t(lo + i)] = double(Dr(i));
        }
      }
      if (backward) {
        store(r.dK, p.kv_offset(b, hk, 0), dK_acc);
        store(r.dV, p.kv_offset(b, hk, 0), dV_acc);
      }
    }
  }
  return r;
}

}  // namespace

Reference reference_forward(const Problem& p, const float* Q, const float* K, const float* V,
                            RefMode mode, bool want_P, int merged_parts) {
  if (mode == RefMode::F32 || mode == RefMode::F32InOrder || mode == RefMode::F32Merged)
    return run<float>(p, Q, K, V, nullptr, mode, want_P, merged_parts);
  return run<double>(p, Q, K, V, nullptr, mode, want_P, merged_parts);
}

Reference reference_backward(const Problem& p, const float* Q, const float* K, const float* V,
                             const float* dO, RefMode mode, int merged_parts, const float* L_given) {
  if (mode == RefMode::F32Merged) return run<float>(p, Q, K, V, dO, mode, false, merged_parts, L_given);
  if (mode == RefMode::F32 || mode == RefMode::F32InOrder)
    return run<float>(p, Q, K, V, dO, mode, false, merged_parts);
  return run<double>(p, Q, K, V, dO, mode, false, merged_parts);
}

}  // namespace fa
