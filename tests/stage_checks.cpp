#include "stage_checks.h"
#include "reference.h"
#ifdef FA_HAVE_CUDA
#include "cuda_utils.h"
#endif

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

namespace fa::test {

namespace {


}  // namespace

bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && std::string(e) != "" && std::string(e) != "0";
}

bool small_mode() { return env_flag("FA_TEST_SMALL"); }

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

#ifdef FA_HAVE_CUDA
void check_row_window(const Problem& p, Dtype dtype, int64_t r0, int n, const std::vector<float>& K,
                      const std::vector<float>& V, const void* Q_dev, const void* O_dev,
                      const float* L_dev) {
  Problem sub = p;
  sub.seq_q = n;
  if (p.causal) {
    const int64_t keys = n + r0 + int64_t(p.seq_k) - p.seq_q;
    sub.seq_k = int(keys < 0 ? 0 : (keys > p.seq_k ? p.seq_k : keys));
  }
  Tensors t = Tensors::make(sub, 1, Dist::Normal, false);
  const int64_t d = p.head_dim, row_bytes = d * int64_t(dtype_size(dtype));
  download(dtype, static_cast<const char*>(Q_dev) + r0 * row_bytes, t.Q.data(), n * d, nullptr);
  download(dtype, static_cast<const char*>(O_dev) + r0 * row_bytes, t.O.data(), n * d, nullptr);
  download(Dtype::F32, L_dev + r0, t.L.data(), n, nullptr);
  std::copy(K.begin(), K.begin() + int64_t(sub.seq_k) * d, t.K.begin());
  std::copy(V.begin(), V.begin() + int64_t(sub.seq_k) * d, t.V.begin());
  const CheckReport r = compare_forward(sub, dtype, t);
  INFO("rows " << r0 << " .. " << r0 + n << " of " << p.describe() << "\n" << r.summary());
  CHECK(r.pass());
}
#endif

Problem make_problem(int batch, int heads, int kv_heads, int seq_q, int seq_k, int d, bool causal) {
  Problem p;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.head_dim = d;
  p.causal = causal;
  return p;
}

namespace {

Problem make(int batch, int heads, int kv_heads, int seq_q, int seq_k, int d, bool causal) {
  return make_problem(batch, heads, kv_heads, seq_q, seq_k, d, causal);
}

std::string context(const StageInfo& s, const Problem& p, Dtype t, uint64_t seed, Dist dist) {
  std::ostringstream o;
  o << s.name << " " << dtype_name(t) << " " << p.describe() << " seed=" << seed
    << " dist=" << dist_name(dist);
  return o.str();
}

CheckReport run_check(const StageInfo& s, const Problem& p, Dtype t, Tensors& x, bool with_backward) {
  return with_backward ? check_backward(s, p, t, x) : check_forward(s, p, t, x);
}

}  // namespace

std::vector<int> tested_head_dims(const StageInfo& s) {
  if (!s.head_dims.empty()) return s.head_dims;
  return {16, 32, 40, 64, 80, 96, 128};
}

std::vector<Problem> shape_matrix(const std::vector<int>& head_dims) {
  const bool small = small_mode();
  const int d0 = std::find(head_dims.begin(), head_dims.end(), 64) != head_dims.end() ? 64 : head_dims.front();
  std::vector<Problem> m;
  for (bool causal : {false, true}) {
    // Sequence lengths, seq_q == seq_k; alternate plain heads and GQA (8 over 2).
    for (int n : {1, 2, 17, 64, 97, 128, 255, 1025}) {
      if (small && n > 128) continue;
      if (n == 1025) m.push_back(make(1, 1, 1, n, n, d0, causal));
      else if (n == 17 || n == 128) m.push_back(make(1, 8, 2, n, n, d0, causal));
      else m.push_back(make(2, 2, 2, n, n, d0, causal));
    }
    // seq_q ≠ seq_k (with causal, 300×77 has rows that see no key at all).
    m.push_back(make(1, 2, 1, 1, small ? 128 : 512, d0, causal));
    m.push_back(make(1, 8, 2, small ? 100 : 300, 77, d0, causal));
    m.push_back(make(1, 2, 2, 77, small ? 100 : 300, d0, causal));
    // Every head dim, on an odd length.
    for (int d : head_dims) m.push_back(make(1, 2, 1, 97, small ? 65 : 129, d, causal));
  }
  return m;
}

CheckReport expect_pass(const StageInfo& s, const Problem& p, Dtype t, uint64_t seed, Dist dist,
                        bool with_backward) {
  Tensors x = Tensors::make(p, seed, dist, with_backward);
  CheckReport r = run_check(s, p, t, x, with_backward);
  INFO(context(s, p, t, seed, dist));
  INFO(r.summary());
  CHECK(r.pass());
  return r;
}

void check_matrix(const StageInfo& s, Dtype t, bool with_backward) {
  uint64_t seed = 100;
  for (const Problem& p : shape_matrix(tested_head_dims(s)))
    expect_pass(s, p, t, seed++, Dist::Normal, with_backward);
  // The other input distribution on a few shapes.
  const int d = tested_head_dims(s).front();
  expect_pass(s, make(1, 2, 2, 97, 64, d, false), t, seed++, Dist::Uniform, with_backward);
  expect_pass(s, make(1, 2, 2, 64, 97, d, true), t, seed++, Dist::Uniform, with_backward);
}

void check_adversarial(const StageInfo& s, Dtype t, bool with_backward) {
  const int d = tested_head_dims(s).front();
  // 1. Logits in the hundreds: exp() overflows fp32 beyond 88.7.
  for (bool causal : {false, true}) {
    const Problem p = make(1, 2, 1, 97, 77, d, causal);
    Tensors x = Tensors::make(p, 7, Dist::LargeLogits, false);
    const CheckReport r = check_forward(s, p, t, x);
    INFO(context(s, p, t, 7, Dist::LargeLogits));
    INFO(r.summary());
    if (s.overflows_on_large_logits) {
      CHECK_FALSE(r.pass());  // stage 01 must overflow here: that is its lesson
      CHECK(r.at("O").nonfinite_mismatch > 0);
    } else {
      CHECK(r.pass());
    }
  }
  if (!s.overflows_on_large_logits && with_backward)
    expect_pass(s, make(1, 2, 1, 64, 64, d, true), t, 8, Dist::LargeLogits, true);

  // 2. Rows that see no key: causal with seq_q > seq_k (bottom-right), and seq_k = 0.
  for (const Problem& p : {make(1, 2, 2, 40, 9, d, true), make(1, 1, 1, 5, 0, d, false),
                           make(1, 1, 1, 0, 5, d, false)}) {
    Tensors x = Tensors::make(p, 9, Dist::Normal, with_backward);
    const CheckReport r = run_check(s, p, t, x, with_backward);
    INFO(context(s, p, t, 9, Dist::Normal));
    INFO(r.summary());
    CHECK(r.pass());
    for (int h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        if (p.visible_keys(i) != 0) continue;
        INFO("row " << i << " of head " << h << " sees no key");
        CHECK(x.L[size_t(p.l_offset(0, h, i))] == -std::numeric_limits<float>::infinity());
        for (int c = 0; c < p.head_dim; ++c) CHECK(x.O[size_t(p.q_offset(0, h, i) + c)] == 0.0f);
      }
  }

  // 3. Constant rows: every logit of a row equal (Q = 0), so P is uniform.
  {
    const Problem p = make(1, 2, 1, 33, 50, d, false);
    Tensors x = Tensors::make(p, 10, Dist::Normal, with_backward);
    std::fill(x.Q.begin(), x.Q.end(), 0.0f);
    const CheckReport r = run_check(s, p, t, x, with_backward);
    INFO("constant rows: " << context(s, p, t, 10, Dist::Normal));
    INFO(r.summary());
    CHECK(r.pass());
  }

  // 4. NaN in one query row reaches that row only; NaN in one key row reaches every row
  //    (non-causal). The comparison requires NaN exactly where the reference has it.
  for (int which = 0; which < 2; ++which) {
    const Problem p = make(1, 2, 1, 37, 45, d, false);
    Tensors x = Tensors::make(p, 11, Dist::Normal, with_backward);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (which == 0) x.Q[size_t(p.q_offset(0, 1, 5) + 3)] = nan;
    else x.K[size_t(p.kv_offset(0, 0, 20) + 1)] = nan;
    const CheckReport r = run_check(s, p, t, x, with_backward);
    INFO(std::string(which == 0 ? "NaN in Q row 5 of head 1: " : "NaN in K row 20: ") << context(s, p, t, 11, Dist::Normal));
    INFO(r.summary());
    CHECK(r.pass());
    if (which == 0) {
      CHECK(std::isnan(x.O[size_t(p.q_offset(0, 1, 5))]));
      CHECK(std::isfinite(x.O[size_t(p.q_offset(0, 1, 4))]));
      CHECK(std::isfinite(x.O[size_t(p.q_offset(0, 0, 5))]));
    }
  }
}

void check_nonfinite_semantics(const StageInfo& s, Dtype t, bool with_backward) {
  const int d = tested_head_dims(s).front();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // 1. Causal, 40 × 40: NaN in V of key 20, +inf in V of key 21, NaN in K of key 30. Rows
  //    0–19 see none of them: their O, L and dQ are finite; rows 20.. are not.
  {
    const Problem p = make(1, 2, 1, 40, 40, d, true);
    Tensors x = Tensors::make(p, 12, Dist::Normal, with_backward);
    x.V[size_t(p.kv_offset(0, 0, 20) + 1)] = nan;
    x.V[size_t(p.kv_offset(0, 0, 21) + 2)] = inf;
    x.K[size_t(p.kv_offset(0, 0, 30) + 0)] = nan;
    const CheckReport r = run_check(s, p, t, x, with_backward);
    INFO("NaN/inf in K, V of keys 20, 21, 30 under the causal mask: " << context(s, p, t, 12, Dist::Normal));
    INFO(r.summary());
    CHECK(r.pass());
    const auto row_finite = [&](const std::vector<float>& a, int h, int64_t i) {
      const auto first = a.begin() + p.q_offset(0, h, i);
      return std::all_of(first, first + d, [](float v) { return std::isfinite(v); });
    };
    for (int h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        INFO("head " << h << " row " << i);
        CHECK(row_finite(x.O, h, i) == (i < 20));                          // V reaches O only
        CHECK(std::isfinite(x.L[size_t(p.l_offset(0, h, i))]) == (i < 30));  // K reaches L too
        if (with_backward && i < 20) CHECK(row_finite(x.dQ, h, i));
      }
  }
  // 2. NaN in Q of row 5: with the causal mask key 5 is seen by rows 5.. only, so dK, dV
  //    of keys 6.. get nothing from row 5 and stay finite.
  if (with_backward) {
    const Problem p = make(1, 1, 1, 24, 24, d, true);
    Tensors x = Tensors::make(p, 13, Dist::Normal, true);
    x.Q[size_t(p.q_offset(0, 0, 5) + 2)] = nan;
    const CheckReport r = run_check(s, p, t, x, true);
    INFO("NaN in Q row 5 under the causal mask: " << context(s, p, t, 13, Dist::Normal));
    INFO(r.summary());
    CHECK(r.pass());
    for (int64_t j = 0; j < p.seq_k; ++j) {
      INFO("key " << j);
      CHECK(std::isfinite(x.dK[size_t(p.kv_offset(0, 0, j))]) == (j > 5));
      CHECK(std::isfinite(x.dV[size_t(p.kv_offset(0, 0, j))]) == (j > 5));
    }
  }
  // 3. Logits of −inf (forward): Q[:, 0] < 0 and K row 0 = +inf in column 0 gives every row
  //    the logit −inf for key 0 (the first key: an online softmax starts at m = −inf);
  //    rows 3 and 7 get Q = (−inf, 0, …) and K[:, 0] > 0, so every logit of theirs is −inf.
  {
    const Problem p = make(1, 1, 1, 12, 17, d, false);
    Tensors x = Tensors::make(p, 14, Dist::Normal, false);
    for (int64_t i = 0; i < p.seq_q; ++i) x.Q[size_t(p.q_offset(0, 0, i))] = -std::abs(x.Q[size_t(p.q_offset(0, 0, i))]) - 0.5f;
    for (int64_t j = 0; j < p.seq_k; ++j) x.K[size_t(p.kv_offset(0, 0, j))] = std::abs(x.K[size_t(p.kv_offset(0, 0, j))]) + 0.5f;
    x.K[size_t(p.kv_offset(0, 0, 0))] = inf;
    for (int64_t i : {3, 7}) {
      std::fill_n(x.Q.begin() + p.q_offset(0, 0, i), d, 0.0f);
      x.Q[size_t(p.q_offset(0, 0, i))] = -inf;
    }
    x.V[size_t(p.kv_offset(0, 0, 0) + 1)] = nan;  // weight 0, but it takes part: rows are NaN…
    const CheckReport r0 = check_forward(s, p, t, x);
    INFO("−inf logits: " << context(s, p, t, 14, Dist::Normal));
    INFO(r0.summary());
    CHECK(r0.pass());
    for (int64_t i : {3, 7}) {  // …except the rows whose every logit is −inf: O = 0, L = −inf
      INFO("row " << i << " has only −inf logits");
      CHECK(x.L[size_t(p.l_offset(0, 0, i))] == -inf);
      for (int c = 0; c < d; ++c) CHECK(x.O[size_t(p.q_offset(0, 0, i) + c)] == 0.0f);
    }
    x.V[size_t(p.kv_offset(0, 0, 0) + 1)] = 0.5f;  // finite V: every other row is finite
    const CheckReport r1 = check_forward(s, p, t, x);
    INFO(r1.summary());
    CHECK(r1.pass());
    for (int64_t i = 0; i < p.seq_q; ++i) CHECK(std::isfinite(x.O[size_t(p.q_offset(0, 0, i))]));
  }
}

void check_properties(const StageInfo& s, Dtype t, bool with_backward) {
  const int d = tested_head_dims(s).front();
  // Key permutation invariance: permuting the rows of K and V together (non-causal)
  // permutes the terms of every softmax sum, so O, L and dQ must not change beyond rounding.
  {
    const Problem p = make(1, 4, 2, 45, 70, d, false);
    Tensors x = Tensors::make(p, 21, Dist::Normal, with_backward);
    const CheckReport r0 = run_check(s, p, t, x, with_backward);
    REQUIRE(r0.pass());
    Tensors y = x;
    std::vector<int> perm(size_t(p.seq_k));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int j = 0; j < p.seq_k; ++j)
        for (int c = 0; c < d; ++c) {
          y.K[size_t(p.kv_offset(0, hk, j) + c)] = x.K[size_t(p.kv_offset(0, hk, perm[size_t(j)]) + c)];
          y.V[size_t(p.kv_offset(0, hk, j) + c)] = x.V[size_t(p.kv_offset(0, hk, perm[size_t(j)]) + c)];
        }
    run_check(s, p, t, y, with_backward);
    auto same = [&](const char* name, const std::vector<float>& a, const std::vector<float>& b, double tol) {
      const std::vector<double> ref(a.begin(), a.end());
      const Comparison c = compare(name, b.data(), ref, {p.batch, p.heads, p.seq_q, int64_t(a.size() / std::max<size_t>(1, size_t(p.batch * p.heads * p.seq_q)))}, tol);
      INFO("key permutation: " << c.summary());
      CHECK(c.pass);
    };
    // Both runs are within tol of the reference, so they are within 2·tol of each other.
    same("O", x.O, y.O, 2 * r0.at("O").tol);
    same("L", x.L, y.L, 2 * r0.at("L").tol);
    if (with_backward) same("dQ", x.dQ, y.dQ, 2 * r0.at("dQ").tol);
  }
  // Determinism: the same inputs twice give bitwise the same outputs.
  {
    const Problem p = make(2, 4, 2, 70, 130, d, true);
    Tensors x = Tensors::make(p, 22, Dist::Normal, with_backward);
    run_check(s, p, t, x, with_backward);
    Tensors y = x;
    run_check(s, p, t, y, with_backward);
    CHECK_MESSAGE(bitwise_equal(x.O, y.O), s.name << ": O differs between two identical runs");
    CHECK_MESSAGE(bitwise_equal(x.L, y.L), s.name << ": L differs between two identical runs");
    if (with_backward) {
      CHECK_MESSAGE(bitwise_equal(x.dK, y.dK), s.name << ": dK differs between two identical runs");
      CHECK_MESSAGE(bitwise_equal(x.dV, y.dV), s.name << ": dV differs between two identical runs");
    }
  }
}

void check_refusals(const StageInfo& s, Dtype t) {
  const int d = tested_head_dims(s).front();
  struct Bad {
    Problem p;
    const char* names;  // the message must contain this
  };
  std::vector<Bad> bad;
  Problem p = make(1, 4, 2, 16, 16, d, false);
  Problem q = p; q.heads = 0;        bad.push_back({q, "heads = 0"});
  q = p; q.kv_heads = 3;             bad.push_back({q, "kv_heads = 3"});
  q = p; q.seq_q = -1;               bad.push_back({q, "seq_q = -1"});
  q = p; q.seq_k = -5;               bad.push_back({q, "seq_k = -5"});
  q = p; q.batch = 0;                bad.push_back({q, "batch = 0"});
  q = p; q.scale = -1.0f;            bad.push_back({q, "scale = -1"});
  q = p; q.scale = std::numeric_limits<float>::quiet_NaN(); bad.push_back({q, "scale = nan"});
  if (!s.head_dims.empty()) {
    q = p; q.head_dim = 7;           bad.push_back({q, "head_dim = 7"});
  } else {
    q = p; q.head_dim = 0;           bad.push_back({q, "head_dim = 0"});
  }
  Tensors x = Tensors::make(p, 1, Dist::Normal, false);
  for (const Bad& b : bad) {
    x.poison_outputs();
    std::string msg;
    try {
      s.forward(b.p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    INFO(s.name << " with " << b.names << ": message '" << msg << "'");
    CHECK(msg.find(b.names) != std::string::npos);
    CHECK(std::all_of(x.O.begin(), x.O.end(), [](float v) { return std::isnan(v); }));
  }
  // A dtype the stage does not compute in is refused by the C ABI and the driver; here
  // we only check that the StageInfo says so consistently.
  CHECK(s.supports(t));
}

void check_random_shapes(const StageInfo& s, Dtype t, bool with_backward, int count) {
  uint64_t seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  if (const char* e = std::getenv("FA_TEST_SEED")) seed = std::strtoull(e, nullptr, 10);
  MESSAGE("random shapes for " << s.name << ": seed " << seed << " (replay with FA_TEST_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  const std::vector<int> dims = tested_head_dims(s);
  for (int k = 0; k < count; ++k) {
    const int kv = 1 + int(rng() % 2), group = 1 + int(rng() % 3);
    Problem p = make(1 + int(rng() % 2), kv * group, kv, int(rng() % 150), int(rng() % 150),
                     dims[rng() % dims.size()], rng() % 2 == 0);
    INFO("random case " << k << " of seed " << seed);
    expect_pass(s, p, t, rng(), Dist::Normal, with_backward);
  }
}

void check_row_stats(RowStatsForward forward) {
  for (bool causal : {false, true}) {
    const Problem p = make(2, 4, 2, 97, 80, 40, causal);
    for (Dist dist : {Dist::Normal, Dist::LargeLogits}) {
      Tensors t = Tensors::make(p, 31, dist, false);
      // A NaN in query row 50 (it sees keys under the mask too) must make its m NaN, not be skipped.
      if (dist == Dist::Normal) t.Q[size_t(p.q_offset(1, 2, 50) + 3)] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> m(size_t(p.l_elems())), l(size_t(p.l_elems()));
      forward(p, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), m.data(), l.data());
      const Reference ex = reference_forward(p, t.Q.data(), t.K.data(), t.V.data());
      const Reference base = reference_forward(p, t.Q.data(), t.K.data(), t.V.data(), RefMode::F32);
      const Shape4 shape{p.batch, p.heads, p.seq_q, 1};
      const Comparison cm = compare("m", m.data(), ex.m, shape, tolerance(ex.m, base.m, Dtype::F32));
      const Comparison cl = compare("l", l.data(), ex.l, shape, tolerance(ex.l, base.l, Dtype::F32));
      INFO(p.describe() << " dist=" << dist_name(dist));
      INFO(cm.summary());
      INFO(cl.summary());
      CHECK(cm.pass);
      CHECK(cl.pass);
      if (dist == Dist::Normal) CHECK(std::isnan(m[size_t(p.l_offset(1, 2, 50))]));
    }
  }
}

}  // namespace fa::test
