// Stage 06 — FlashAttention-2 on the CPU: tiles sized to a fast-memory budget, forward and
// backward, with counted slow-memory traffic. This file: the tile sizes, the causal skip and
// the forward (the first sitting, 06a, in the notes); tiled_backward.cpp: the backward (the
// second, 06b); fast_memory.h: the plumbing both share (fast-memory tiles, counted loads and
// stores, worker threads).
//
// What changed from stage 05: stage 05 streamed all of K and V once per query *row*, so
// slow memory delivered every key N_q times. Here a tile of B_r query rows shares each
// K_j, V_j tile while it sits in fast memory, so K and V are read T_r = ⌈N_q/B_r⌉ times, and
// the row-at-a-time dot products become B_r × B_c × d matrix products (Eigen, vectorised).
// The online-softmax update is stage 05's, applied to B_c keys at once. New as well: the
// backward pass, which recomputes P from L = m + log l instead of storing it.
//
// Forward (FlashAttention-2, Algorithm 1), in parallel over (batch, head, query tile i):
//   load Q_i                                                          [B_r, d]
//   m_i = −∞, l_i = 0, O_i = 0
//   for each key tile j that a row of tile i sees (causal: later tiles are skipped):
//     load K_j, V_j                                                   [B_c, d] each
//     S_ij = scale·Q_i K_jᵀ, set to −∞ above the diagonal              [B_r, B_c]
//     m_new = max(m_i, rowmax S_ij);   P_ij = exp(S_ij − m_new)
//     l_i = e^{m_i − m_new}·l_i + rowsum P_ij;   O_i = e^{m_i − m_new}·O_i + P_ij V_j
//   store O_i / l_i and L_i = m_i + log l_i
//
// Layout and limits: docs/design.md §3, fp32; any N_q, N_k ≥ 0 (tail tiles), any d, GQA,
// bottom-right causal mask. Extra memory: per thread a few [B, d] and [B_r, B_c] tiles, and
// in the backward D (N_q floats per head); nothing of size N_q·N_k.
// Run: ./build/stages/06_tiled_cpu/stage06 --seq-q 4096 --seq-k 4096 --backward --bench --count-traffic
//      ./build/stages/06_tiled_cpu/stage06 --causal --block-q 32 --block-k 48 --threads 2
#include "tiled_cpu.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "fast_memory.h"

namespace fa::stage06 {

// ---- Tile sizes and the causal skip ----

Tiles tiles_for(const Problem& p, const Config& c) {
  const auto refuse = [](const std::string& what) {
    throw std::invalid_argument(std::string(kStageName) + ": " + what);
  };
  if (c.block_q < 0)
    refuse("block_q = " + std::to_string(c.block_q) + " is not allowed (B_r must be >= 1, or 0 to derive it from sram_bytes)");
  if (c.block_k < 0)
    refuse("block_k = " + std::to_string(c.block_k) + " is not allowed (B_c must be >= 1, or 0 to derive it from sram_bytes)");
  if (c.sram_bytes <= 0)
    refuse("sram_bytes = " + std::to_string(c.sram_bytes) + " is not allowed (the fast-memory budget must be > 0 bytes)");
  if (c.threads < 1 || c.threads > kMaxThreads)
    refuse("threads = " + std::to_string(c.threads) + " is not allowed (must be 1 to " +
           std::to_string(kMaxThreads) + ")");

  //! [tile sizes]
  const int64_t d = p.head_dim;
  const int64_t M = c.sram_bytes / int64_t(sizeof(float));  // the budget in elements, as in the papers
  // Q_i, K_j, V_j and O_i (B × d each) share M, hence B_c = ⌈M/4d⌉; B_r ≤ d also keeps the
  // B_r × B_c tile of S within M/4.
  const int64_t from_budget = std::max<int64_t>(1, ceil_div(M, 4 * d));
  Tiles t;
  t.B_c = c.block_k > 0 ? c.block_k : from_budget;
  t.B_r = c.block_q > 0 ? c.block_q : std::min(from_budget, d);
  t.T_r = ceil_div(p.seq_q, t.B_r);
  t.T_c = ceil_div(p.seq_k, t.B_c);
  //! [tile sizes]
  return t;
}

//! [causal skip]
int64_t key_tiles_visited(const Problem& p, const Tiles& t, int64_t i) {
  // The last row of query tile i sees the most keys: keys [0, n). Key tiles from ⌈n/B_c⌉
  // on lie entirely above the diagonal for every row of the tile.
  const int64_t last_row = std::min<int64_t>(p.seq_q, (i + 1) * t.B_r) - 1;
  return ceil_div(p.visible_keys(last_row), t.B_c);
}

int64_t first_query_tile(const Problem& p, const Tiles& t, int64_t j) {
  // Row r sees key c0 = j·B_c iff c0 < r + N_k − N_q + 1 (bottom-right alignment), i.e.
  // from row c0 + N_q − N_k on. Without a mask every row sees it.
  if (!p.causal) return 0;
  const int64_t first_row = std::max<int64_t>(0, j * t.B_c + p.seq_q - p.seq_k);
  return first_row >= p.seq_q ? t.T_r : first_row / t.B_r;
}
//! [causal skip]

// ---- Forward ----

void forward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V,
             float* O, float* L, Traffic* traffic) {
  p.validate(kStageName);
  const Tiles t = tiles_for(p, c);
  require_forward_buffers(kStageName, p, Q, K, V, O, L);
  const int64_t d = p.head_dim, N_q = p.seq_q, N_k = p.seq_k;
  const float scale = p.softmax_scale();

  // One task per (batch, head, query tile i): it owns O_i and L_i.
  const int64_t n_tasks = int64_t(p.batch) * p.heads * t.T_r;
  Workers workers(p, t, c.threads, n_tasks);
  parallel_for(n_tasks, workers.count, [&](int64_t task, int w) {
    const int64_t i = task % t.T_r;
    const int h = int(task / t.T_r % p.heads), b = int(task / t.T_r / p.heads);
    const int hk = p.kv_head_of(h);
    FastMemory& f = workers.fast[size_t(w)];
    Traffic* counted = workers.counter(w, traffic);
    const int64_t r0 = i * t.B_r, rows = std::min(t.B_r, N_q - r0);

    Tile Q_i(f.Q.data(), rows, d);  // [B_r, d] this tile's queries
    load(Q_i.data(), Q + p.q_offset(b, h, r0), rows * d, kQ, counted);
    Tile O_i(f.O.data(), rows, d);  // [B_r, d] output, unnormalised until the end
    Column m_i(f.m.data(), rows);   // [B_r] running row max
    Column l_i(f.l.data(), rows);   // [B_r] running row sum of e^{S − m_i}
    O_i.setZero();
    m_i.setConstant(-kInf);
    l_i.setZero();

    //! [forward tile loop]
    for (int64_t j = 0; j < key_tiles_visited(p, t, i); ++j) {
      const int64_t c0 = j * t.B_c, cols = std::min(t.B_c, N_k - c0);
      Tile K_j(f.K.data(), cols, d), V_j(f.V.data(), cols, d);  // [B_c, d] each
      load(K_j.data(), K + p.kv_offset(b, hk, c0), cols * d, kK, counted);
      load(V_j.data(), V + p.kv_offset(b, hk, c0), cols * d, kV, counted);

      Tile S(f.S.data(), rows, cols), P(f.P.data(), rows, cols);  // [B_r, B_c]
      S.noalias() = scale * (Q_i * K_j.transpose());  // S_ij = scale·Q_i K_jᵀ

      // LAB BEGIN: online softmax update of one tile — hint: per row m_new = max(m, rowmax S over the keys it sees); P = exp(S − m_new), 0 on masked keys and 0 while m_new = −inf (subtract 0 then); α = e^{m − m_new}; l = α·l + rowsum P; O_i row *= α; after the rows, O_i += P V_j (add_product_seen in a diagonal tile)
      // Only tiles that cross the diagonal are masked; those above it were never visited.
      const bool diagonal = crosses_diagonal(p, r0, c0, cols);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = diagonal ? keys_seen(p, r0 + r, c0, cols) : cols;  // row r sees keys [0, n)
        // m_new = max(m_i, rowmax S); a NaN logit makes it NaN, and so the whole row.
        const float tile_max = n == 0 ? -kInf : S.row(r).head(n).maxCoeff<Eigen::PropagateNaN>();
        const float m_new = std::isnan(tile_max) ? tile_max : std::max(m_i(r), tile_max);
        // A row that has seen no key yet, or only −∞ logits, still has m = −∞: subtract 0
        // instead, so that α = e^{−∞} = 0 rather than e^{−∞ + ∞} = NaN; its P is 0 (written
        // here: Eigen's exp gives about 3e−39 for −∞), so l stays 0 and the row ends O = 0.
        const float m_sub = m_new == -kInf ? 0.0f : m_new;
        if (m_new == -kInf)
          P.row(r).head(n).setZero();
        else
          P.row(r).head(n) = (S.row(r).head(n).array() - m_sub).exp().matrix();  // P_ij = exp(S_ij − m_new)
        P.row(r).tail(cols - n).setZero();                                        // masked: P_ij = 0
        const float alpha = std::exp(m_i(r) - m_sub);  // e^{m_old − m_new}
        l_i(r) = alpha * l_i(r) + P.row(r).sum();      // l_i = α·l_i + rowsum P_ij
        O_i.row(r) *= alpha;                           // rescale what was summed so far
        m_i(r) = m_new;
      }
      if (diagonal)  // O_i = α·O_i + P_ij V_j, over the keys each row sees
        add_product_seen(O_i, P, V_j, [&](int64_t r) { return keys_seen(p, r0 + r, c0, cols); });
      else
        O_i.noalias() += P * V_j;
      // LAB END
    }
    //! [forward tile loop]

    //! [forward epilogue]
    // O_i = O_i / l_i and L_i = m_i + log l_i. l_i = 0 only for a row that saw no key
    // (otherwise its largest logit contributes e^0 = 1): that row gets O = 0, L = −∞.
    Column L_i(f.L.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      if (l_i(r) == 0.0f) {
        O_i.row(r).setZero();
        L_i(r) = -kInf;
      } else {
        O_i.row(r) /= l_i(r);
        L_i(r) = m_i(r) + std::log(l_i(r));
      }
    }
    store(O + p.q_offset(b, h, r0), O_i.data(), rows * d, kO, counted);
    store(L + p.l_offset(b, h, r0), L_i.data(), rows, kL, counted);
    //! [forward epilogue]
  });
  if (traffic) *traffic = workers.total();
}

}  // namespace fa::stage06
