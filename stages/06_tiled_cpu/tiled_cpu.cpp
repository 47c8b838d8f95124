// Stage 06 — FlashAttention-2 on the CPU: tiles sized to a fast-memory budget, forward and
// backward, with counted slow-memory traffic.
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
// Backward (Algorithm 2, with dQ in its own pass so that every output element has exactly
// one writer; results are then bitwise the same for any number of threads):
//   D = rowsum(dO∘O)                                      in parallel over query tiles
//   dK, dV: in parallel over (batch, kv head, key tile j): load K_j, V_j; for every query
//           head of the group and query tile i that sees tile j: load Q_i, dO_i, L_i, D_i,
//           P_ij = exp(S_ij − L_i), dV_j += P_ijᵀ dO_i, dP_ij = dO_i V_jᵀ,
//           dS_ij = P_ij∘(dP_ij − D_i), dK_j += scale·dS_ijᵀ Q_i
//   dQ:     in parallel over (batch, head, query tile i): for every key tile j it sees,
//           recompute dS_ij as above, dQ_i += scale·dS_ij K_j
//
// Layout and limits: DESIGN §3, fp32; any N_q, N_k ≥ 0 (tail tiles), any d, GQA,
// bottom-right causal mask. Extra memory: per thread a few [B, d] and [B_r, B_c] tiles, and
// in the backward D (N_q floats per head); nothing of size N_q·N_k.
// Run: ./build/stages/06_tiled_cpu/stage06 --seq-q 4096 --seq-k 4096 --backward --bench --count-traffic
//      ./build/stages/06_tiled_cpu/stage06 --causal --block-q 32 --block-k 48 --threads 2
#include "tiled_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "eigen.h"
#include "tensors.h"

namespace fa::stage06 {

namespace {

const char* const kStage = "06_tiled_cpu";
constexpr float kInf = std::numeric_limits<float>::infinity();

// A tile in fast memory, seen by Eigen as a row-major matrix (a view: no copy).
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Tile = Eigen::Map<Matrix>;
using Column = Eigen::Map<Eigen::VectorXf>;  // one number per row of a tile: m, l, L or D

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Slow memory. These two are the only functions that touch the large arrays, so they
// are the only places that count traffic (one test of a pointer per tile: free when off). ----

// Copies `count` elements of array `a` from slow memory into a fast-memory tile.
void load(float* tile, const float* src, int64_t count, Array a, Traffic* traffic) {
  std::copy(src, src + count, tile);
  if (traffic) traffic->read[a] += count;
}

// Copies `count` elements of a finished tile out to array `a` in slow memory.
void store(float* dst, const float* tile, int64_t count, Array a, Traffic* traffic) {
  std::copy(tile, tile + count, dst);
  if (traffic) traffic->written[a] += count;
}

// ---- Fast memory: one thread's tiles, allocated once at the largest tile size. ----
// Every buffer starts at Eigen's widest alignment (64 bytes with AVX-512). Eigen runs a
// vectorised sum from the first aligned element, so where a tile starts decides the order
// of its additions: tiles that all start aligned add in the same order in every run and on
// every worker, and the results stay bitwise the same for any thread count.
using FastBuffer = std::vector<float, Eigen::aligned_allocator<float>>;

FastBuffer fast_buffer(int64_t elems, const char* what) {
  try {
    return FastBuffer(size_t(elems));
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error past max_size()
    throw std::runtime_error(std::string(kStage) + ": " + what + ": cannot allocate " + std::to_string(elems) +
                             " floats of fast memory");
  }
}

struct FastMemory {
  FastBuffer Q, O, dO, dQ;  // [B_r, d]
  FastBuffer K, V, dK, dV;  // [B_c, d]
  FastBuffer S, P;          // [B_r, B_c] (the backward keeps dP, then dS, in S)
  FastBuffer m, l, L, D;    // [B_r]

  FastMemory(const Problem& p, const Tiles& t) {
    // A tile never has more rows than its sequence (at least 1, so that nothing is empty).
    const int64_t d = p.head_dim;
    const int64_t rows = std::clamp<int64_t>(p.seq_q, 1, t.B_r);
    const int64_t cols = std::clamp<int64_t>(p.seq_k, 1, t.B_c);
    for (auto* x : {&Q, &O, &dO, &dQ}) *x = fast_buffer(rows * d, "tile [B_r, d]");
    for (auto* x : {&K, &V, &dK, &dV}) *x = fast_buffer(cols * d, "tile [B_c, d]");
    for (auto* x : {&S, &P}) *x = fast_buffer(rows * cols, "tile [B_r, B_c]");
    for (auto* x : {&m, &l, &L, &D}) *x = fast_buffer(rows, "row statistics");
  }
};

// Runs task(t, worker) for t = 0 … n_tasks−1 on `workers` threads that take the next task
// from a shared counter. Each task writes its own outputs only, in an order that does not
// depend on which thread runs it, so the thread count cannot change a single bit.
template <typename Task>
void parallel_for(int64_t n_tasks, int workers, const Task& task) {
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&](int worker) {
    try {
      for (int64_t t = next++; t < n_tasks; t = next++) task(t, worker);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = n_tasks;  // the others stop after their current task
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  } catch (const std::system_error&) {
    // The system would not start another thread: the ones running (at least this one) do
    // all the tasks, with the same results.
  }
  work(0);
  for (auto& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

// Workers for `n_tasks` tasks, with per-worker fast memory and traffic counters.
struct Workers {
  int count;
  std::vector<FastMemory> fast;
  std::vector<Traffic> traffic;
  Workers(const Problem& p, const Tiles& t, int threads, int64_t n_tasks)
      : count(int(std::clamp<int64_t>(n_tasks, 1, threads))),
        fast(size_t(count), FastMemory(p, t)),
        traffic(size_t(count)) {}
  Traffic* counter(int worker, const Traffic* wanted) {
    return wanted ? &traffic[size_t(worker)] : nullptr;
  }
  Traffic total() const {
    Traffic sum;
    for (const auto& t : traffic) sum += t;
    return sum;
  }
};

void require_buffer(const void* ptr, int64_t elems, const char* name) {
  if (ptr == nullptr && elems > 0)
    throw std::invalid_argument(std::string(kStage) + ": " + name + " is a null pointer (" +
                                std::to_string(elems) + " elements expected)");
}

// ---- The diagonal. The first row of a tile sees the fewest keys (visible_keys grows with
// the row), so a tile needs a mask exactly when its first row misses one of its keys. ----

bool crosses_diagonal(const Problem& p, int64_t r0, int64_t c0, int64_t cols) {
  return p.visible_keys(r0) < c0 + cols;
}

// How many keys of the tile starting at key c0 (cols wide) row `row` sees: the first n of
// them. For the others S_ij = −∞, so P_ij = e^{−∞} = 0. We write those zeros ourselves:
// Eigen's fast exp clamps its argument at −88.7 and returns about 3e−39, never 0, and a
// row that sees no key must end with l = 0 exactly.
int64_t keys_seen(const Problem& p, int64_t row, int64_t c0, int64_t cols) {
  return std::clamp<int64_t>(p.visible_keys(row) - c0, 0, cols);
}

// The backward's recomputation for one tile, shared by the dK/dV pass and the dQ pass:
//   P_ij = exp(S_ij − L_i)   (L_i = m_i + log l_i, so P comes out already normalised)
//   dS_ij = P_ij∘(dP_ij − D_i),  dP_ij = dO_i V_jᵀ
// S_ij is built in P's storage and dP_ij in dS's: each is dead once the next one exists.
void recompute_P_dS(const Problem& p, float scale, int64_t r0, int64_t c0, const Tile& Q_i,
                    const Tile& dO_i, const Column& L_i, const Column& D_i, const Tile& K_j,
                    const Tile& V_j, Tile P, Tile dS) {
  //! [recompute dS]
  P.noalias() = scale * (Q_i * K_j.transpose());  // S_ij = scale·Q_i K_jᵀ  [B_r, B_c]
  // LAB BEGIN: recompute P and dS — hint: P = exp(S − L_i) on the keys each row sees, 0 on the others; dP = dO_i V_jᵀ; dS = P∘(dP − D_i)
  const int64_t cols = P.cols();
  const bool diagonal = crosses_diagonal(p, r0, c0, cols);  // only then do rows see fewer keys
  for (int64_t r = 0; r < P.rows(); ++r) {
    const int64_t n = diagonal ? keys_seen(p, r0 + r, c0, cols) : cols;
    P.row(r).head(n) = (P.row(r).head(n).array() - L_i(r)).exp().matrix();  // P_ij = exp(S_ij − L_i)
    P.row(r).tail(cols - n).setZero();                                        // masked: P_ij = 0
  }
  dS.noalias() = dO_i * V_j.transpose();  // dP_ij = dO_i V_jᵀ  [B_r, B_c]
  for (int64_t r = 0; r < dS.rows(); ++r)  // dS_ij = P_ij∘(dP_ij − D_i)
    dS.row(r) = (P.row(r).array() * (dS.row(r).array() - D_i(r))).matrix();
  // LAB END
  //! [recompute dS]
}

}  // namespace

// ---- Tile sizes and the causal skip ----

Tiles tiles_for(const Problem& p, const Config& c) {
  const auto refuse = [](const std::string& what) {
    throw std::invalid_argument(std::string(kStage) + ": " + what);
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
  p.validate(kStage);
  const Tiles t = tiles_for(p, c);
  require_buffer(Q, p.q_elems(), "Q");
  require_buffer(K, p.kv_elems(), "K");
  require_buffer(V, p.kv_elems(), "V");
  require_buffer(O, p.q_elems(), "O");
  require_buffer(L, p.l_elems(), "L");
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

      // LAB BEGIN: online softmax update of one tile — hint: per row m_new = max(m, rowmax S over the keys it sees); P = exp(S − m_new), 0 on masked keys; α = e^{m − m_new}; l = α·l + rowsum P; O_i row *= α; after the rows, O_i += P V_j
      // Only tiles that cross the diagonal are masked; those above it were never visited.
      const bool diagonal = crosses_diagonal(p, r0, c0, cols);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = diagonal ? keys_seen(p, r0 + r, c0, cols) : cols;  // row r sees keys [0, n)
        const float m_new = n == 0 ? m_i(r) : std::max(m_i(r), S.row(r).head(n).maxCoeff());
        // A row that has seen no key yet still has m = −∞: subtract 0 instead, so that
        // α = e^{−∞} = 0 rather than e^{−∞ + ∞} = NaN.
        const float m_sub = m_new == -kInf ? 0.0f : m_new;
        P.row(r).head(n) = (S.row(r).head(n).array() - m_sub).exp().matrix();  // P_ij = exp(S_ij − m_new)
        P.row(r).tail(cols - n).setZero();                                        // masked: P_ij = 0
        const float alpha = std::exp(m_i(r) - m_sub);  // e^{m_old − m_new}
        l_i(r) = alpha * l_i(r) + P.row(r).sum();      // l_i = α·l_i + rowsum P_ij
        O_i.row(r) *= alpha;                           // rescale what was summed so far
        m_i(r) = m_new;
      }
      O_i.noalias() += P * V_j;  // O_i = α·O_i + P_ij V_j
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

// ---- Backward ----

void backward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V,
              const float* O, const float* L, const float* dO, float* dQ, float* dK, float* dV,
              Traffic* traffic) {
  p.validate(kStage);
  const Tiles t = tiles_for(p, c);
  require_buffer(Q, p.q_elems(), "Q");
  require_buffer(K, p.kv_elems(), "K");
  require_buffer(V, p.kv_elems(), "V");
  require_buffer(O, p.q_elems(), "O");
  require_buffer(L, p.l_elems(), "L");
  require_buffer(dO, p.q_elems(), "dO");
  require_buffer(dQ, p.q_elems(), "dQ");
  require_buffer(dK, p.kv_elems(), "dK");
  require_buffer(dV, p.kv_elems(), "dV");
  const int64_t d = p.head_dim, N_q = p.seq_q, N_k = p.seq_k;
  const float scale = p.softmax_scale();
  if (traffic) *traffic = Traffic{};

  // D = rowsum(dO∘O) lives in slow memory like L: [batch][heads][N_q].
  std::vector<float> D = allocate(p.l_elems(), std::string(kStage) + ": D");

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
          // LAB BEGIN: accumulate dV_j and dK_j — hint: dV_j += P_ijᵀ dO_i; dK_j += dS_ijᵀ Q_i (the factor scale is applied once, at the store)
          dV_j.noalias() += P.transpose() * dO_i;  // dV_j += P_ijᵀ dO_i
          dK_j.noalias() += dS.transpose() * Q_i;  // dK_j += dS_ijᵀ Q_i
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
        dQ_i.noalias() += dS * K_j;  // dQ_i += dS_ij K_j
      }
      dQ_i *= scale;  // dQ_i = scale·Σ dS_ij K_j
      //! [backward dQ]
      store(dQ + p.q_offset(b, h, r0), dQ_i.data(), rows * d, kdQ, counted);
    });
    if (traffic) *traffic += workers.total();
  }
}

}  // namespace fa::stage06
