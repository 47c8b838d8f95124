// The reference under masks and score modifiers, written as the textbook formulas, one
// (batch, head) at a time with the whole N_q × N_k score matrix (small problems only):
//   S = scale·Q Kᵀ;  S ← cap·tanh(S/cap);  S ← S + slope_h·(col − diag);  S = −inf where masked
//   m = max(rowmax S, σ_h),  l = rowsum e^{S − m} + e^{σ_h − m},  P = e^{S − m}/l,  L = m + log l
//   O = P V,  D = rowsum(dO∘O),  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P∘(dP − D)∘(1 − tanh²(S_raw/cap))
//   dQ = scale·dS K,  dK = scale·dSᵀ Q,  dσ_h = −Σ_i e^{σ_h − L_i}·D_i
#include "mask_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "eigen.h"
#include "in_order.h"

namespace fa {

namespace {

// The document of a packed row (or key) index: the d with cu[d] ≤ x < cu[d + 1], or −1 past
// the last one. Empty documents (cu[d] = cu[d + 1]) hold no index.
int64_t document_of(const std::vector<int64_t>& cu, int64_t x) {
  const auto it = std::upper_bound(cu.begin(), cu.end(), x);
  const int64_t d = int64_t(it - cu.begin()) - 1;
  return d < 0 || d + 1 >= int64_t(cu.size()) ? -1 : d;
}

template <typename Scalar>
using Mat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMapF = Eigen::Map<const Mat<float>>;

template <typename Scalar>
void store(std::vector<double>& dst, int64_t offset, const Mat<Scalar>& x) {
  Eigen::Map<Mat<double>>(dst.data() + offset, x.rows(), x.cols()) = x.template cast<double>();
}

template <typename Scalar>
MaskedReference run(const Problem& p, const Modifiers& mods, const float* Q, const float* K, const float* V,
                    const float* dO, bool in_order) {
  p.validate("reference");
  mods.validate(p, "reference");
  const bool backward = dO != nullptr;
  const int64_t d = p.head_dim, Nq = p.seq_q, Nk = p.seq_k;
  const Scalar scale = Scalar(p.softmax_scale());
  const Scalar inf = std::numeric_limits<Scalar>::infinity();
  const Scalar cap = Scalar(mods.softcap);
  const bool sinks = !mods.sinks.empty();
  // The products: Eigen's blocked ones, or (F32InOrder) every sum in index order.
  const auto times = [&](const Mat<Scalar>& A, const Mat<Scalar>& B) -> Mat<Scalar> {
    return in_order ? times_in_order(A, B, [&](int64_t) { return A.cols(); }) : Mat<Scalar>(A * B);
  };
  // acc += f·Aᵀ·B. In index order each element's sum runs on over every row of every query
  // head of the group, as a plain loop adds a kv head's dK and dV (in_order.h).
  const auto add_transpose_times = [&](Mat<Scalar>& acc, Scalar f, const Mat<Scalar>& A, const Mat<Scalar>& B) {
    if (in_order) return add_transpose_times_in_order(acc, Mat<Scalar>(f * A), B, [&](int64_t) { return A.cols(); });
    acc += f * Mat<Scalar>(A.transpose() * B);
  };

  MaskedReference r;
  r.O.assign(size_t(p.q_elems()), 0.0);
  r.L.assign(size_t(p.l_elems()), 0.0);
  if (backward) {
    r.D.assign(size_t(p.l_elems()), 0.0);
    r.dQ.assign(size_t(p.q_elems()), 0.0);
    r.dK.assign(size_t(p.kv_elems()), 0.0);
    r.dV.assign(size_t(p.kv_elems()), 0.0);
    if (sinks) r.dsinks.assign(size_t(p.heads), 0.0);
  }
  if (Nq == 0) return r;
  // dσ_h summed in Scalar, row after row: the F32 baseline adds as a plain fp32 loop does.
  std::vector<Scalar> dsink(static_cast<size_t>(p.heads), Scalar(0));

  // The mask and the diagonal do not depend on the head: decide them once per element.
  std::vector<char> keep(static_cast<size_t>(Nq * Nk));
  std::vector<int64_t> diag(static_cast<size_t>(Nq));
  for (int64_t i = 0; i < Nq; ++i) {
    diag[size_t(i)] = diagonal_key(p, mods, i);
    for (int64_t j = 0; j < Nk; ++j) keep[size_t(i * Nk + j)] = mask_keeps(p, mods, i, j);
  }

  for (int b = 0; b < p.batch; ++b) {
    for (int hk = 0; hk < p.kv_heads; ++hk) {
      const Mat<Scalar> Kh = ConstMapF(K + p.kv_offset(b, hk, 0), Nk, d).template cast<Scalar>();  // [N_k, d]
      const Mat<Scalar> Vh = ConstMapF(V + p.kv_offset(b, hk, 0), Nk, d).template cast<Scalar>();  // [N_k, d]
      const Mat<Scalar> KhT = Kh.transpose(), VhT = Vh.transpose();                              // [d, N_k]
      Mat<Scalar> dK_acc = Mat<Scalar>::Zero(Nk, d), dV_acc = Mat<Scalar>::Zero(Nk, d);

      for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        const Mat<Scalar> Qh = ConstMapF(Q + p.q_offset(b, h, 0), Nq, d).template cast<Scalar>();  // [N_q, d]
        Mat<Scalar> S = scale * times(Qh, KhT);  // [N_q, N_k]
        Mat<Scalar> capped_tanh;                        // tanh(S_raw/cap), for the derivative
        if (cap > 0) {
          capped_tanh = S.unaryExpr([cap](Scalar s) { return std::tanh(s / cap); });
          S = cap * capped_tanh;
        }
        const Scalar slope = mods.alibi_slopes.empty() ? Scalar(0) : Scalar(mods.alibi_slopes[size_t(h)]);
        const Scalar sigma = sinks ? Scalar(mods.sinks[size_t(h)]) : -inf;
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t j = 0; j < Nk; ++j) {
            if (!keep[size_t(i * Nk + j)])
              S(i, j) = -inf;
            else if (slope != 0)
              S(i, j) += slope * Scalar(j - diag[size_t(i)]);
          }

        Mat<Scalar> P = Mat<Scalar>::Zero(Nq, Nk);
        Eigen::Matrix<Scalar, Eigen::Dynamic, 1> L(Nq);
        for (int64_t i = 0; i < Nq; ++i) {
          Scalar m = sigma;
          bool nan = false;
          for (int64_t j = 0; j < Nk; ++j) {
            nan = nan || std::isnan(S(i, j));
            m = std::max(m, S(i, j));
          }
          if (nan) {
            P.row(i).setConstant(std::numeric_limits<Scalar>::quiet_NaN());
            L(i) = std::numeric_limits<Scalar>::quiet_NaN();
            continue;
          }
          if (m == -inf) {  // no key and no sink: O = 0, L = −inf
            L(i) = -inf;
            continue;
          }
          for (int64_t j = 0; j < Nk; ++j) P(i, j) = std::exp(S(i, j) - m);  // e^{−inf} = 0 where masked
          const Scalar l = P.row(i).sum() + std::exp(sigma - m);
          P.row(i) /= l;
          L(i) = m + std::log(l);
        }
        const Mat<Scalar> O = times(P, Vh);  // [N_q, d]
        store(r.O, p.q_offset(b, h, 0), O);
        for (int64_t i = 0; i < Nq; ++i) r.L[size_t(p.l_offset(b, h, i))] = double(L(i));
        if (!backward) continue;

        const Mat<Scalar> dOh = ConstMapF(dO + p.q_offset(b, h, 0), Nq, d).template cast<Scalar>();
        Eigen::Matrix<Scalar, Eigen::Dynamic, 1> D(Nq);  // [N_q] rowsum(dO∘O)
        for (int64_t i = 0; i < Nq; ++i) {
          if (!in_order) {
            D(i) = dOh.row(i).cwiseProduct(O.row(i)).sum();
            continue;
          }
          Scalar sum = 0;
          for (int64_t c = 0; c < d; ++c) sum += dOh(i, c) * O(i, c);
          D(i) = sum;
        }
        Mat<Scalar> dS = times(dOh, VhT);  // dP [N_q, N_k]
        dS = P.cwiseProduct(dS - D.replicate(1, Nk));
        if (cap > 0)  // ∂(cap·tanh(s/cap))/∂s = 1 − tanh²(s/cap)
          dS = dS.cwiseProduct(capped_tanh.unaryExpr([](Scalar t) { return Scalar(1) - t * t; }));
        const Mat<Scalar> dQh = scale * times(dS, Kh);
        store(r.dQ, p.q_offset(b, h, 0), dQh);
        add_transpose_times(dK_acc, scale, dS, Qh);  // dK += scale·dSᵀ Q
        add_transpose_times(dV_acc, 1, P, dOh);      // dV += Pᵀ dO
        for (int64_t i = 0; i < Nq; ++i) {
          r.D[size_t(p.l_offset(b, h, i))] = double(D(i));
          if (sinks && std::isfinite(L(i))) dsink[size_t(h)] -= std::exp(sigma - L(i)) * D(i);
        }
      }
      if (backward) {
        store(r.dK, p.kv_offset(b, hk, 0), dK_acc);
        store(r.dV, p.kv_offset(b, hk, 0), dV_acc);
      }
    }
  }
  for (size_t h = 0; h < r.dsinks.size(); ++h) r.dsinks[h] = double(dsink[h]);
  return r;
}

MaskedReference dispatch(const Problem& p, const Modifiers& m, const float* Q, const float* K, const float* V,
                         const float* dO, RefMode mode) {
  if (mode == RefMode::Exact) return run<double>(p, m, Q, K, V, dO, false);
  if (mode == RefMode::F32) return run<float>(p, m, Q, K, V, dO, false);
  if (mode == RefMode::F32InOrder) return run<float>(p, m, Q, K, V, dO, true);
  throw std::invalid_argument("reference: the masked reference computes in Exact, F32 or F32InOrder mode only");
}

}  // namespace

bool mask_keeps(const Problem& p, const Modifiers& m, int64_t row, int64_t col) {
  int64_t qs = 0, nq = p.seq_q, ks = 0, nk = p.seq_k;
  if (m.has_documents()) {
    const int64_t doc = document_of(m.cu_seqlens_q, row);
    if (doc < 0 || document_of(m.cu_seqlens_k, col) != doc) return false;
    qs = m.cu_seqlens_q[size_t(doc)];
    nq = m.cu_seqlens_q[size_t(doc) + 1] - qs;
    ks = m.cu_seqlens_k[size_t(doc)];
    nk = m.cu_seqlens_k[size_t(doc) + 1] - ks;
  }
  const int64_t i = row - qs, j = col - ks, diagonal = i + nk - nq;
  if (p.causal && j > diagonal) return false;
  // Differences of two indices, not diagonal ∓ window: a window may be as large as INT64_MAX.
  if (m.window_left && diagonal - j > *m.window_left) return false;
  if (m.window_right && j - diagonal > *m.window_right) return false;
  return true;
}

int64_t diagonal_key(const Problem& p, const Modifiers& m, int64_t row) {
  if (!m.has_documents()) return row + p.seq_k - p.seq_q;
  const int64_t doc = document_of(m.cu_seqlens_q, row);
  if (doc < 0) return 0;  // a row past the last document sees nothing
  const int64_t qs = m.cu_seqlens_q[size_t(doc)], ks = m.cu_seqlens_k[size_t(doc)];
  return ks + (row - qs) + (m.cu_seqlens_k[size_t(doc) + 1] - ks) - (m.cu_seqlens_q[size_t(doc) + 1] - qs);
}

MaskedReference reference_forward_masked(const Problem& p, const Modifiers& m, const float* Q, const float* K,
                                         const float* V, RefMode mode) {
  return dispatch(p, m, Q, K, V, nullptr, mode);
}

MaskedReference reference_backward_masked(const Problem& p, const Modifiers& m, const float* Q, const float* K,
                                          const float* V, const float* dO, RefMode mode) {
  return dispatch(p, m, Q, K, V, dO, mode);
}

CheckReport compare_masked(const Problem& p, const Modifiers& m, const Tensors& t, bool backward,
                           const float* dsinks) {
  const auto ref = [&](RefMode mode) {
    return backward ? reference_backward_masked(p, m, t.Q.data(), t.K.data(), t.V.data(), t.dO.data(), mode)
                    : reference_forward_masked(p, m, t.Q.data(), t.K.data(), t.V.data(), mode);
  };
  // The fp32 budget: the worse of the two summation orders a stage may use (compare.h).
  const MaskedReference exact = ref(RefMode::Exact), f32 = ref(RefMode::F32), f32_in_order = ref(RefMode::F32InOrder);
  const Shape4 q{p.batch, p.heads, p.seq_q, p.head_dim}, kv{p.batch, p.kv_heads, p.seq_k, p.head_dim};
  CheckReport r;
  const auto add = [&](const char* name, const float* got, std::vector<double> MaskedReference::*x, Shape4 shape) {
    const double err = std::max(baseline_error(exact.*x, f32.*x), baseline_error(exact.*x, f32_in_order.*x));
    r.items.push_back(compare(name, got, exact.*x, shape, tolerance(exact.*x, err, Dtype::F32)));
  };
  add("O", t.O.data(), &MaskedReference::O, q);
  add("L", t.L.data(), &MaskedReference::L, {p.batch, p.heads, p.seq_q, 1});
  if (backward) {
    add("dQ", t.dQ.data(), &MaskedReference::dQ, q);
    add("dK", t.dK.data(), &MaskedReference::dK, kv);
    add("dV", t.dV.data(), &MaskedReference::dV, kv);
    if (dsinks && !m.sinks.empty()) add("dsinks", dsinks, &MaskedReference::dsinks, {1, 1, 1, p.heads});
  }
  return r;
}

}  // namespace fa
