// Stage 06's plumbing, shared by the forward (tiled_cpu.cpp) and the backward
// (tiled_backward.cpp): the tiles in fast memory (Eigen views of per-thread buffers), the
// only two functions that touch slow memory (and count its traffic), the worker threads, and
// the diagonal tests of the causal mask. Nothing here is part of the stage's interface
// (tiled_cpu.h); the algorithm is in the two .cpp files.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "eigen.h"
#include "errors.h"
#include "tensors.h"
#include "tiled_cpu.h"

namespace fa::stage06 {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// A tile in fast memory, seen by Eigen as a row-major matrix (a view: no copy).
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Tile = Eigen::Map<Matrix>;
using Column = Eigen::Map<Eigen::VectorXf>;  // one number per row of a tile: m, l, L or D

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Slow memory. These two are the only functions that touch the large arrays, so they
// are the only places that count traffic (one test of a pointer per tile: free when off). ----

// Copies `count` elements of array `a` from slow memory into a fast-memory tile.
inline void load(float* tile, const float* src, int64_t count, Array a, Traffic* traffic) {
  std::copy(src, src + count, tile);
  if (traffic) traffic->read[a] += count;
}

// Copies `count` elements of a finished tile out to array `a` in slow memory.
inline void store(float* dst, const float* tile, int64_t count, Array a, Traffic* traffic) {
  std::copy(tile, tile + count, dst);
  if (traffic) traffic->written[a] += count;
}

// ---- Fast memory: one thread's tiles, allocated once at the largest tile size. ----
// Every buffer starts at Eigen's widest alignment (64 bytes with AVX-512). Eigen runs a
// vectorised sum from the first aligned element, so where a tile starts decides the order
// of its additions: tiles that all start aligned add in the same order in every run and on
// every worker, and the results stay bitwise the same for any thread count.
using FastBuffer = std::vector<float, Eigen::aligned_allocator<float>>;

// An allocation failure is a problem too large for this machine (exit code 2, errors.h).
inline FastBuffer fast_buffer(int64_t elems, const char* what) {
  try {
    return FastBuffer(size_t(elems));
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error past max_size()
    throw OutOfMemory(std::string(kStageName) + ": " + what + ": cannot allocate " + std::to_string(elems) +
                      " floats of fast memory");
  }
}

struct FastMemory {
  FastBuffer Q, O, dO, dQ;  // [B_r, d]
  FastBuffer K, V, dK, dV;  // [B_c, d]
  FastBuffer S, P;          // [B_r, B_c] (the backward keeps dP, then dS, in S)
  FastBuffer m, l, L, D;    // [B_r]

  // A tile never has more rows than its sequence (at least 1, so that nothing is empty).
  static int64_t rows(const Problem& p, const Tiles& t) { return std::clamp<int64_t>(p.seq_q, 1, t.B_r); }
  static int64_t cols(const Problem& p, const Tiles& t) { return std::clamp<int64_t>(p.seq_k, 1, t.B_c); }
  // Floats of one worker's fast memory (in double: B_r·B_c may pass int64 before it is refused).
  static double floats(const Problem& p, const Tiles& t) {
    const double r = double(rows(p, t)), c = double(cols(p, t)), d = double(p.head_dim);
    return 4 * r * d + 4 * c * d + 2 * r * c + 4 * r;
  }

  FastMemory(const Problem& p, const Tiles& t) {
    const int64_t d = p.head_dim, r = rows(p, t), c = cols(p, t);
    for (auto* x : {&Q, &O, &dO, &dQ}) *x = fast_buffer(r * d, "tile [B_r, d]");
    for (auto* x : {&K, &V, &dK, &dV}) *x = fast_buffer(c * d, "tile [B_c, d]");
    for (auto* x : {&S, &P}) *x = fast_buffer(r * c, "tile [B_r, B_c]");
    for (auto* x : {&m, &l, &L, &D}) *x = fast_buffer(r, "row statistics");
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
      : count(int(std::clamp<int64_t>(n_tasks, 1, threads))), traffic(size_t(count)) {
    // Every worker's tiles together, before the first is allocated.
    require_fits_in_memory(count * FastMemory::floats(p, t) * sizeof(float),
                           std::string(kStageName) + ": the fast memory of " + std::to_string(count) + " worker(s) (B_r = " +
                               std::to_string(t.B_r) + ", B_c = " + std::to_string(t.B_c) + ")");
    fast.assign(size_t(count), FastMemory(p, t));
  }
  Traffic* counter(int worker, const Traffic* wanted) {
    return wanted ? &traffic[size_t(worker)] : nullptr;
  }
  Traffic total() const {
    Traffic sum;
    for (const auto& t : traffic) sum += t;
    return sum;
  }
};

// ---- The diagonal. The first row of a tile sees the fewest keys (visible_keys grows with
// the row), so a tile needs a mask exactly when its first row misses one of its keys. ----

inline bool crosses_diagonal(const Problem& p, int64_t r0, int64_t c0, int64_t cols) {
  return p.visible_keys(r0) < c0 + cols;
}

// How many keys of the tile starting at key c0 (cols wide) row `row` sees: the first n of
// them. For the others S_ij = −∞, so P_ij = e^{−∞} = 0. We write those zeros ourselves:
// Eigen's fast exp clamps its argument at −88.7 and returns about 3e−39, never 0, and a
// row that sees no key must end with l = 0 exactly.
inline int64_t keys_seen(const Problem& p, int64_t row, int64_t c0, int64_t cols) {
  return std::clamp<int64_t>(p.visible_keys(row) - c0, 0, cols);
}

// The keys of a tile that row `row` takes part with in the backward: the ones it sees, or
// none when L = −inf (a row that sees no key, or whose every logit is −inf).
inline int64_t keys_used(const Problem& p, int64_t row, int64_t c0, int64_t cols, bool diagonal, float L) {
  return L == -kInf ? 0 : (diagonal ? keys_seen(p, row, c0, cols) : cols);
}

// True when some row of the tile takes part with fewer than all of its keys: the tile
// crosses the diagonal, or a row has L = −∞. Its products then run over the seen keys.
inline bool partial_tile(const Problem& p, int64_t r0, int64_t c0, int64_t cols, const Column& L_i) {
  return crosses_diagonal(p, r0, c0, cols) || (L_i.array() == -kInf).any();
}

// Products over the keys each row of a tile takes part with, the first n(r) of the tile's
// keys. A key a row does not see must not reach it, even when its K or V holds a NaN or an
// inf: the full product would add 0·NaN = NaN. Used only where some row has n(r) < B_c.
// C += A·B:   [rows, B_c]·[B_c, d] → [rows, d]   (O_i += P V_j,  dQ_i += dS K_j)
template <typename KeysOfRow>
void add_product_seen(Tile C, const Tile& A, const Tile& B, KeysOfRow n) {
  for (int64_t r = 0; r < A.rows(); ++r)
    if (n(r) > 0) C.row(r).noalias() += A.row(r).head(n(r)) * B.topRows(n(r));
}
// C += Aᵀ·B:  [rows, B_c]ᵀ·[rows, d] → [B_c, d]   (dV_j += Pᵀ dO_i,  dK_j += dSᵀ Q_i)
template <typename KeysOfRow>
void add_transpose_product_seen(Tile C, const Tile& A, const Tile& B, KeysOfRow n) {
  for (int64_t r = 0; r < A.rows(); ++r)
    if (n(r) > 0) C.topRows(n(r)).noalias() += A.row(r).head(n(r)).transpose() * B.row(r);
}

}  // namespace fa::stage06
