// Stage 13 on Hopper (masked_hopper.h): the GPU forward and backward under the modifiers
// against the float64 mask reference (common/mask_reference.h).
//
// Test suite "cpu" (every machine): the tile counts of a window and the refusals of bad input,
// which come before the device is touched. The kernel's document mask (document_mask.h) is
// checked against the reference's mask in test_stage13_mask.cpp (part of stage13_cpu).
// GPU tests (compute capability 9.x): every modifier alone and in combinations, causal and
// not, over head dims 64 and 128, bf16 and f16: windows 0, small and ≥ N; documents with
// empty and one-token ones, unequal query and key lengths, rows past the last document;
// soft-cap small enough that tanh saturates; ALiBi with the usual geometric slopes; sinks;
// GQA; a batch of two; a backward of more blocks than SMs; backward calls queued back to
// back. Outputs are poisoned first, so a row not written fails. Each output
// is allowed twice the error of a same-precision baseline (the formulas with the inputs and
// P rounded to the dtype) plus the floor, compare.h's policy. A refusal writes nothing.
// The backward runs on the GPU forward's O and L: dQ, dK, dV and dsinks against the reference's
// backward, over the same kinds of cases, with a 16-bit baseline of its own (P, O, dS rounded
// where a tensor-core kernel rounds them); its query-tile range is checked on the CPU against
// classify() and keep() (test_stage13_mask.cpp).
//
// Without a GPU only the "cpu" suite runs, then the program exits 77 (skipped).
// FA_TEST_SMALL=1 shrinks the cases (compute-sanitizer runs).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "compare.h"
#include "cuda_utils.h"
#include "eigen.h"
#include "mask_reference.h"
#include "masked_hopper.h"
#include "modifier_cases.h"
#include "tensors.h"

namespace {

using fa::Modifiers;
using fa::Problem;
using fa::test::documents;
using fa::test::sink_logits;
namespace s13 = fa::stage13;

bool small() { return std::getenv("FA_TEST_SMALL") != nullptr; }

Problem make(int batch, int heads, int kv_heads, int seq_q, int seq_k, int d, bool causal) {
  Problem p;
  p.batch = batch, p.heads = heads, p.kv_heads = kv_heads, p.seq_q = seq_q, p.seq_k = seq_k, p.head_dim = d;
  p.causal = causal;
  return p;
}

template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(not refused)";
}

// ---- the same-precision baseline ----------------------------------------------------------

float round_to(fa::Dtype t, float x) {
  return t == fa::Dtype::BF16 ? float(Eigen::bfloat16(x)) : float(Eigen::half(x));
}

// The definitions of modifiers.h in float, with the inputs rounded to `dtype` (what the GPU
// reads), P rounded before P·V and O rounded when stored: the error a plain implementation in
// this precision makes, which sets the budget.
fa::MaskedReference baseline_16bit(const Problem& p, const Modifiers& m, const fa::Tensors& t, fa::Dtype dtype) {
  fa::MaskedReference r;
  r.O.assign(size_t(p.q_elems()), 0.0);
  r.L.assign(size_t(p.l_elems()), 0.0);
  const int d = p.head_dim;
  const float scale = p.softmax_scale();
  const auto rounded = [&](const std::vector<float>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = round_to(dtype, x[i]);
    return y;
  };
  const std::vector<float> Q = rounded(t.Q), K = rounded(t.K), V = rounded(t.V);
  std::vector<float> s(static_cast<size_t>(p.seq_k)), o(static_cast<size_t>(d));
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const int kvh = h / p.group_size();
      const float sink = m.sinks.empty() ? -INFINITY : m.sinks[size_t(h)];
      for (int i = 0; i < p.seq_q; ++i) {
        const float* q = &Q[size_t(p.q_offset(b, h, i))];
        float row_max = sink;
        for (int j = 0; j < p.seq_k; ++j) {
          s[size_t(j)] = -INFINITY;
          if (!fa::mask_keeps(p, m, i, j)) continue;
          const float* k = &K[size_t((int64_t(b) * p.kv_heads + kvh) * p.seq_k + j) * size_t(d)];
          float x = 0;
          for (int c = 0; c < d; ++c) x += q[c] * k[c];
          x *= scale;
          if (m.softcap > 0) x = float(m.softcap) * std::tanh(x / float(m.softcap));
          if (!m.alibi_slopes.empty()) x += m.alibi_slopes[size_t(h)] * float(j - fa::diagonal_key(p, m, i));
          s[size_t(j)] = x;
          row_max = std::max(row_max, x);
        }
        const size_t row = size_t(p.q_offset(b, h, i) / d);
        if (row_max == -INFINITY) {  // no key, no sink
          r.L[row] = -INFINITY;
          continue;
        }
        float l = m.sinks.empty() ? 0.f : std::exp(sink - row_max);
        for (int j = 0; j < p.seq_k; ++j) l += std::exp(s[size_t(j)] - row_max);
        std::fill(o.begin(), o.end(), 0.f);
        for (int j = 0; j < p.seq_k; ++j) {
          if (s[size_t(j)] == -INFINITY) continue;
          const float P = round_to(dtype, std::exp(s[size_t(j)] - row_max) / l);
          const float* v = &V[size_t((int64_t(b) * p.kv_heads + kvh) * p.seq_k + j) * size_t(d)];
          for (int c = 0; c < d; ++c) o[size_t(c)] += P * v[c];
        }
        for (int c = 0; c < d; ++c) r.O[row * size_t(d) + size_t(c)] = round_to(dtype, o[size_t(c)]);
        r.L[row] = row_max + std::log(l);
      }
    }
  return r;
}

// The backward's same-precision baseline: the definitions in float on the inputs (and dO)
// rounded to `dtype`, with what a tensor-core kernel rounds rounded too — P before P·V and
// dV, O before D, dS before dQ and dK. Its distance from the exact reference is the budget.
fa::MaskedReference baseline_backward_16bit(const Problem& p, const Modifiers& m, const fa::Tensors& t,
                                            fa::Dtype dtype) {
  fa::MaskedReference r;
  r.dQ.assign(size_t(p.q_elems()), 0.0);
  r.dK.assign(size_t(p.kv_elems()), 0.0);
  r.dV.assign(size_t(p.kv_elems()), 0.0);
  r.dsinks.assign(m.sinks.size(), 0.0);
  const int d = p.head_dim;
  const float scale = p.softmax_scale();
  const auto rounded = [&](const std::vector<float>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = round_to(dtype, x[i]);
    return y;
  };
  const std::vector<float> Q = rounded(t.Q), K = rounded(t.K), V = rounded(t.V), dO = rounded(t.dO);
  std::vector<float> s(static_cast<size_t>(p.seq_k)), g(static_cast<size_t>(p.seq_k)), o(static_cast<size_t>(d));
  std::vector<float> dQ(size_t(p.q_elems()), 0.f), dK(size_t(p.kv_elems()), 0.f), dV(size_t(p.kv_elems()), 0.f);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const int kvh = h / p.group_size();
      const float sink = m.sinks.empty() ? -INFINITY : m.sinks[size_t(h)];
      const auto key_at = [&](const std::vector<float>& x, int j) {
        return &x[size_t((int64_t(b) * p.kv_heads + kvh) * p.seq_k + j) * size_t(d)];
      };
      for (int i = 0; i < p.seq_q; ++i) {
        const size_t q_at = size_t(p.q_offset(b, h, i));
        float row_max = sink;
        for (int j = 0; j < p.seq_k; ++j) {
          s[size_t(j)] = -INFINITY;
          g[size_t(j)] = 1.f;
          if (!fa::mask_keeps(p, m, i, j)) continue;
          const float* k = key_at(K, j);
          float x = 0;
          for (int c = 0; c < d; ++c) x += Q[q_at + size_t(c)] * k[c];
          x *= scale;
          if (m.softcap > 0) {
            const float th = std::tanh(x / float(m.softcap));
            x = float(m.softcap) * th;
            g[size_t(j)] = 1.f - th * th;
          }
          if (!m.alibi_slopes.empty()) x += m.alibi_slopes[size_t(h)] * float(j - fa::diagonal_key(p, m, i));
          s[size_t(j)] = x;
          row_max = std::max(row_max, x);
        }
        if (row_max == -INFINITY) continue;  // no key, no sink: every gradient of the row is 0
        float l = m.sinks.empty() ? 0.f : std::exp(sink - row_max);
        for (int j = 0; j < p.seq_k; ++j) l += std::exp(s[size_t(j)] - row_max);
        const float L = row_max + std::log(l);
        std::fill(o.begin(), o.end(), 0.f);
        for (int j = 0; j < p.seq_k; ++j) {
          if (s[size_t(j)] == -INFINITY) continue;
          const float P = round_to(dtype, std::exp(s[size_t(j)] - L));
          for (int c = 0; c < d; ++c) o[size_t(c)] += P * key_at(V, j)[c];
        }
        float D = 0;
        for (int c = 0; c < d; ++c) D += dO[q_at + size_t(c)] * round_to(dtype, o[size_t(c)]);
        if (!m.sinks.empty()) r.dsinks[size_t(h)] -= double(std::exp(sink - L) * D);
        for (int j = 0; j < p.seq_k; ++j) {
          if (s[size_t(j)] == -INFINITY) continue;
          const float P = std::exp(s[size_t(j)] - L);
          const float* v = key_at(V, j);
          float dP = 0;
          for (int c = 0; c < d; ++c) dP += dO[q_at + size_t(c)] * v[c];
          const float dS = round_to(dtype, P * (dP - D) * g[size_t(j)]), P16 = round_to(dtype, P);
          const size_t kv_at = size_t(key_at(K, j) - K.data());
          for (int c = 0; c < d; ++c) {
            dV[kv_at + size_t(c)] += P16 * dO[q_at + size_t(c)];
            dK[kv_at + size_t(c)] += scale * dS * Q[q_at + size_t(c)];
            dQ[q_at + size_t(c)] += scale * dS * K[kv_at + size_t(c)];
          }
        }
      }
    }
  std::copy(dQ.begin(), dQ.end(), r.dQ.begin());
  std::copy(dK.begin(), dK.end(), r.dK.begin());
  std::copy(dV.begin(), dV.end(), r.dV.begin());
  return r;
}

// ---- running the GPU forward ------------------------------------------------------------

struct DeviceTensors {
  fa::DeviceBuffer Q, K, V, O, L;
  explicit DeviceTensors(const Problem& p)
      : Q(std::max<size_t>(16, size_t(p.q_elems()) * 2), "Q"),
        K(std::max<size_t>(16, size_t(p.kv_elems()) * 2), "K"),
        V(std::max<size_t>(16, size_t(p.kv_elems()) * 2), "V"),
        O(std::max<size_t>(16, size_t(p.q_elems()) * 2), "O"),
        L(std::max<size_t>(16, size_t(p.l_elems()) * 4), "L") {}
  void poison() const {  // all ones: NaN in bf16, f16 and fp32
    FA_CUDA_CHECK(cudaMemset(O.get(), 0xff, O.bytes()));
    FA_CUDA_CHECK(cudaMemset(L.get(), 0xff, L.bytes()));
  }
};

// One problem's inputs on the host and the device, and its outputs once downloaded.
struct Run {
  Problem p;
  Modifiers m;
  fa::Dtype dtype;
  fa::Tensors t;
  DeviceTensors dev;
  Run(const Problem& p_, const Modifiers& m_, fa::Dtype dtype_, uint64_t seed)
      : p(p_), m(m_), dtype(dtype_), t(fa::Tensors::make(p_, seed, fa::Dist::Normal, false)), dev(p_) {
    fa::upload(dtype, t.Q.data(), dev.Q.get(), p.q_elems(), nullptr);
    fa::upload(dtype, t.K.data(), dev.K.get(), p.kv_elems(), nullptr);
    fa::upload(dtype, t.V.data(), dev.V.get(), p.kv_elems(), nullptr);
    dev.poison();
  }
  void launch() {
    s13::forward_hopper(p, m, dtype, dev.Q.get(), dev.K.get(), dev.V.get(), dev.O.get(), dev.L.as<float>(), nullptr);
  }
  fa::CheckReport check() {
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    fa::download(dtype, dev.O.get(), t.O.data(), p.q_elems(), nullptr);
    FA_CUDA_CHECK(cudaMemcpy(t.L.data(), dev.L.get(), size_t(p.l_elems()) * 4, cudaMemcpyDeviceToHost));
    const fa::MaskedReference exact = fa::reference_forward_masked(p, m, t.Q.data(), t.K.data(), t.V.data());
    const fa::MaskedReference base = baseline_16bit(p, m, t, dtype);
    fa::CheckReport r;
    const fa::Shape4 q{p.batch, p.heads, p.seq_q, p.head_dim}, l{p.batch, p.heads, p.seq_q, 1};
    r.items.push_back(fa::compare("O", t.O.data(), exact.O, q, fa::tolerance(exact.O, base.O, dtype)));
    r.items.push_back(fa::compare("L", t.L.data(), exact.L, l, fa::tolerance(exact.L, base.L, dtype)));
    return r;
  }
};

fa::CheckReport run_and_check(const Problem& p, const Modifiers& m, fa::Dtype dtype, uint64_t seed = 7) {
  Run run(p, m, dtype, seed);
  run.launch();
  return run.check();
}

void expect_pass(const std::string& name, Problem p, const Modifiers& m) {
  for (int d : s13::kHopperHeadDims)
    for (fa::Dtype dtype : {fa::Dtype::BF16, fa::Dtype::F16}) {
      p.head_dim = d;
      const fa::CheckReport r = run_and_check(p, m, dtype);
      INFO(name, " | ", p.describe(), " | ", m.describe(), " | ", fa::dtype_name(dtype), "\n", r.summary());
      CHECK(r.pass());
    }
}

// ---- running the GPU backward -----------------------------------------------------------

// The forward on the GPU, then the backward on its O and L; dQ, dK, dV (and dsinks) against
// the exact masked reference, each allowed twice the error of baseline_backward_16bit plus
// the floor. Gradients are poisoned first, so an element not written fails.
struct BackwardRun {
  Problem p;
  Modifiers m;
  fa::Dtype dtype;
  fa::Tensors t;
  DeviceTensors dev;
  fa::DeviceBuffer dO, dQ, dK, dV, dsinks;
  BackwardRun(const Problem& p_, const Modifiers& m_, fa::Dtype dtype_, uint64_t seed)
      : p(p_), m(m_), dtype(dtype_), t(fa::Tensors::make(p_, seed, fa::Dist::Normal, true)), dev(p_),
        dO(q_bytes(p_), "dO"), dQ(q_bytes(p_), "dQ"), dK(kv_bytes(p_), "dK"), dV(kv_bytes(p_), "dV"),
        dsinks(std::max<size_t>(16, size_t(p_.heads) * 4), "dsinks") {
    fa::upload(dtype, t.Q.data(), dev.Q.get(), p.q_elems(), nullptr);
    fa::upload(dtype, t.K.data(), dev.K.get(), p.kv_elems(), nullptr);
    fa::upload(dtype, t.V.data(), dev.V.get(), p.kv_elems(), nullptr);
    fa::upload(dtype, t.dO.data(), dO.get(), p.q_elems(), nullptr);
    dev.poison();
    for (const fa::DeviceBuffer* b : {&dQ, &dK, &dV, &dsinks}) FA_CUDA_CHECK(cudaMemset(b->get(), 0xff, b->bytes()));
  }
  static size_t q_bytes(const Problem& p) { return std::max<size_t>(16, size_t(p.q_elems()) * 2); }
  static size_t kv_bytes(const Problem& p) { return std::max<size_t>(16, size_t(p.kv_elems()) * 2); }
  void launch() {  // queued on the default stream, no synchronisation
    s13::forward_hopper(p, m, dtype, dev.Q.get(), dev.K.get(), dev.V.get(), dev.O.get(), dev.L.as<float>(), nullptr);
    s13::backward_hopper(p, m, dtype, dev.Q.get(), dev.K.get(), dev.V.get(), dev.O.get(), dev.L.as<float>(), dO.get(),
                         dQ.get(), dK.get(), dV.get(), m.sinks.empty() ? nullptr : dsinks.as<float>(), nullptr);
  }
  fa::CheckReport check() {
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    fa::download(dtype, dQ.get(), t.dQ.data(), p.q_elems(), nullptr);
    fa::download(dtype, dK.get(), t.dK.data(), p.kv_elems(), nullptr);
    fa::download(dtype, dV.get(), t.dV.data(), p.kv_elems(), nullptr);
    std::vector<float> got_dsinks(size_t(p.heads));
    FA_CUDA_CHECK(cudaMemcpy(got_dsinks.data(), dsinks.get(), got_dsinks.size() * 4, cudaMemcpyDeviceToHost));
    const fa::MaskedReference exact =
        fa::reference_backward_masked(p, m, t.Q.data(), t.K.data(), t.V.data(), t.dO.data());
    const fa::MaskedReference base = baseline_backward_16bit(p, m, t, dtype);
    fa::CheckReport r;
    const fa::Shape4 q{p.batch, p.heads, p.seq_q, p.head_dim}, kv{p.batch, p.kv_heads, p.seq_k, p.head_dim};
    r.items.push_back(fa::compare("dQ", t.dQ.data(), exact.dQ, q, fa::tolerance(exact.dQ, base.dQ, dtype)));
    r.items.push_back(fa::compare("dK", t.dK.data(), exact.dK, kv, fa::tolerance(exact.dK, base.dK, dtype)));
    r.items.push_back(fa::compare("dV", t.dV.data(), exact.dV, kv, fa::tolerance(exact.dV, base.dV, dtype)));
    if (!m.sinks.empty())
      r.items.push_back(fa::compare("dsinks", got_dsinks.data(), exact.dsinks, {1, 1, 1, p.heads},
                                    fa::tolerance(exact.dsinks, base.dsinks, dtype)));
    return r;
  }
};

fa::CheckReport run_and_check_backward(const Problem& p, const Modifiers& m, fa::Dtype dtype, uint64_t seed = 7) {
  BackwardRun run(p, m, dtype, seed);
  run.launch();
  return run.check();
}

// Every head dim and dtype; in FA_TEST_SMALL mode (compute-sanitizer) bf16 only.
void expect_backward_pass(const std::string& name, Problem p, const Modifiers& m) {
  for (int d : s13::kHopperHeadDims)
    for (fa::Dtype dtype : {fa::Dtype::BF16, fa::Dtype::F16}) {
      if (small() && dtype == fa::Dtype::F16) continue;
      p.head_dim = d;
      const fa::CheckReport r = run_and_check_backward(p, m, dtype);
      INFO("backward ", name, " | ", p.describe(), " | ", m.describe(), " | ", fa::dtype_name(dtype), "\n", r.summary());
      CHECK(r.pass());
    }
}

// Calls queued on one stream without a synchronisation, each with a document table of its own
// (they go up through two pinned buffers used in turn), then each checked: Run (the forward)
// or BackwardRun (forward and backward).
template <class R>
void expect_back_to_back(const std::string& what, int calls, uint64_t first_seed) {
  std::vector<R> runs;
  runs.reserve(size_t(calls));
  for (int i = 0; i < calls; ++i) {
    Modifiers m = documents({int64_t(50 + 40 * i), 0, int64_t(200 - 30 * i)}, {int64_t(60 + 10 * i), 5, 100});
    m.window_left = 30 + 20 * i;
    if (i % 2) m.sinks = sink_logits(2);
    runs.emplace_back(make(1, 2, 2, 300, 300, 128, true), m, fa::Dtype::BF16, first_seed + uint64_t(i));
  }
  for (R& r : runs) r.launch();
  for (R& r : runs) {
    const fa::CheckReport report = r.check();
    INFO(what, r.m.describe(), "\n", report.summary());
    CHECK(report.pass());
  }
}

}  // namespace

// ======================================================================================
// Without a GPU
// ======================================================================================

TEST_SUITE("cpu") {
  TEST_CASE("13 hopper: a window skips the key tiles outside the band") {
    Problem p = make(1, 2, 2, 4096, 4096, 128, true);
    Modifiers m;
    m.window_left = 256;
    const s13::HopperTileCounts c = s13::count_hopper_tiles(p, m);
    // Query tile i (128 rows) sees keys [128i − 256, 128i + 128): tiles i − 2 … i.
    CHECK(c.full + c.partial == 2 * (32 * 3 - 3));
    CHECK(c.skip == 2 * 32 * 32 - (c.full + c.partial));
  }

  TEST_CASE("13 hopper: bad input is refused by name before the device is touched") {
    const Problem p = make(1, 4, 2, 100, 100, 128, true);
    const auto refuse_in = [](const Problem& q, const Modifiers& m, fa::Dtype dtype) {
      return refusal([&] { s13::forward_hopper(q, m, dtype, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); });
    };
    const auto refuse = [&](const Modifiers& m, fa::Dtype dtype = fa::Dtype::BF16) { return refuse_in(p, m, dtype); };
    Modifiers m = documents({40, 60}, {40, 60});
    m.cu_seqlens_q[0] = 1;
    CHECK(refuse(m).find("13_masks: cu_seqlens_q starts at 1 (it must start at 0)") != std::string::npos);
    m = documents({40, 60}, {40, 60});
    m.cu_seqlens_k = {0, 50, 30};
    CHECK(refuse(m).find("13_masks: cu_seqlens_k decreases at entry 2 (50 then 30") != std::string::npos);
    m = documents({40, 61}, {40, 60});
    CHECK(refuse(m).find("13_masks: cu_seqlens_q ends at 101, past the tensor (seq_q = 100)") != std::string::npos);
    m = Modifiers{};
    m.window_left = -3;
    CHECK(refuse(m).find("13_masks: window_left = -3 is not allowed") != std::string::npos);
    m = Modifiers{};
    m.window_right = -1;
    CHECK(refuse(m).find("13_masks: window_right = -1 is not allowed") != std::string::npos);
    m = Modifiers{};
    m.softcap = -2;
    CHECK(refuse(m).find("13_masks: softcap = -2 is not allowed") != std::string::npos);
    m.softcap = std::numeric_limits<double>::quiet_NaN();
    CHECK(refuse(m).find("13_masks: softcap = nan is not allowed") != std::string::npos);
    m = Modifiers{};
    m.alibi_slopes = fa::alibi_slopes(3);
    CHECK(refuse(m).find("13_masks: alibi_slopes has 3 entries (one per query head: heads = 4)") != std::string::npos);
    m = Modifiers{};
    m.sinks = {1.f};
    CHECK(refuse(m).find("13_masks: sinks has 1 entries") != std::string::npos);
    CHECK(refuse(Modifiers{}, fa::Dtype::F32).find("13_masks: dtype f32") != std::string::npos);
    CHECK(refuse_in(make(1, 4, 2, 100, 100, 256, true), Modifiers{}, fa::Dtype::BF16)
              .find("13_masks: head_dim = 256 is not supported (supported: 64, 128)") != std::string::npos);
    m = documents({40, 60}, {40, 60});
    CHECK(refuse_in(make(2, 4, 2, 100, 100, 128, true), m, fa::Dtype::BF16).find("13_masks: batch = 2 with cu_seqlens") !=
          std::string::npos);
  }

  TEST_CASE("13 hopper backward: bad input is refused by name before the device is touched") {
    const Problem p = make(1, 4, 2, 100, 100, 128, true);
    const auto refuse_in = [](const Problem& q, const Modifiers& m, fa::Dtype dtype) {
      return refusal([&] {
        s13::backward_hopper(q, m, dtype, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                             nullptr, nullptr);
      });
    };
    Modifiers m = documents({40, 60}, {40, 60});
    m.cu_seqlens_k = {0, 50, 30};
    CHECK(refuse_in(p, m, fa::Dtype::BF16).find("13_masks: cu_seqlens_k decreases at entry 2") != std::string::npos);
    m = Modifiers{};
    m.alibi_slopes = fa::alibi_slopes(3);
    CHECK(refuse_in(p, m, fa::Dtype::BF16).find("13_masks: alibi_slopes has 3 entries") != std::string::npos);
    m = Modifiers{};
    m.sinks = sink_logits(4);
    CHECK(refuse_in(p, m, fa::Dtype::BF16).find("13_masks: dsinks is null") != std::string::npos);
    CHECK(refuse_in(p, Modifiers{}, fa::Dtype::F32).find("13_masks: dtype f32") != std::string::npos);
    CHECK(refuse_in(make(1, 4, 2, 100, 100, 256, true), Modifiers{}, fa::Dtype::BF16)
              .find("13_masks: head_dim = 256 is not supported (supported: 64, 128)") != std::string::npos);
  }
}

// ======================================================================================
// On the GPU
// ======================================================================================

TEST_CASE("13 hopper: no modifier, causal and not, with tails and N_q != N_k") {
  expect_pass("plain", make(1, 2, 2, 333, 517, 128, false), Modifiers{});
  expect_pass("causal", make(1, 2, 1, 300, 700, 128, true), Modifiers{});
  expect_pass("causal, N_q > N_k", make(1, 2, 2, 520, 250, 128, true), Modifiers{});
  if (!small()) expect_pass("batch 2, GQA", make(2, 4, 2, 400, 400, 128, true), Modifiers{});
}

TEST_CASE("13 hopper: sliding windows") {
  const auto window = [](std::optional<int64_t> left, std::optional<int64_t> right) {
    Modifiers m;
    m.window_left = left, m.window_right = right;
    return m;
  };
  expect_pass("window 0 (the diagonal alone)", make(1, 2, 2, 300, 300, 128, true), window(0, 0));
  expect_pass("causal window 64", make(1, 2, 1, 600, 600, 128, true), window(64, std::nullopt));
  expect_pass("two-sided window (100, 37)", make(1, 2, 2, 500, 450, 128, false), window(100, 37));
  expect_pass("window >= N", make(1, 2, 2, 300, 300, 128, true), window(5000, 5000));
  if (!small()) expect_pass("batch 2 window 130", make(2, 2, 2, 700, 700, 128, true), window(130, std::nullopt));
}

TEST_CASE("13 hopper: documents (variable length)") {
  expect_pass("documents, causal, empty and one-token ones", make(1, 2, 2, 694, 694, 128, true),
              documents({300, 0, 1, 129, 64, 200}, {300, 0, 1, 129, 64, 200}));
  expect_pass("documents, not causal", make(1, 2, 1, 694, 694, 128, false),
              documents({300, 0, 1, 129, 64, 200}, {300, 0, 1, 129, 64, 200}));
  // Unequal query and key lengths, a document with no keys, rows and keys past the last one.
  expect_pass("uneven documents, rows past the end", make(1, 2, 2, 280, 450, 128, true),
              documents({5, 200, 0, 33, 1}, {17, 150, 3, 0, 250}));
  Modifiers m = documents({256, 1, 511, 0}, {256, 1, 511, 0});
  m.window_left = 100;
  expect_pass("documents + causal window", make(1, 2, 2, 768, 768, 128, true), m);
}

TEST_CASE("13 hopper: soft-capping, ALiBi, sinks") {
  Modifiers cap;
  cap.softcap = 30;
  expect_pass("softcap 30", make(1, 2, 2, 300, 400, 128, true), cap);
  cap.softcap = 0.05;  // |s| ≫ cap: tanh saturates
  expect_pass("softcap 0.05", make(1, 2, 2, 300, 400, 128, false), cap);
  Modifiers alibi;
  alibi.alibi_slopes = fa::alibi_slopes(4);
  expect_pass("alibi causal", make(1, 4, 2, 400, 400, 128, true), alibi);
  expect_pass("alibi not causal", make(1, 4, 4, 300, 500, 128, false), alibi);
  Modifiers sinks;
  sinks.sinks = sink_logits(4);
  expect_pass("sinks", make(1, 4, 2, 300, 300, 128, true), sinks);
  Modifiers both;
  both.softcap = 2, both.alibi_slopes = fa::alibi_slopes(4);
  expect_pass("softcap + alibi", make(1, 4, 2, 300, 300, 128, true), both);
}

TEST_CASE("13 hopper: combinations") {
  Modifiers m = documents({300, 0, 1, 129, 64, 200}, {300, 0, 1, 129, 64, 200});
  m.window_left = 40, m.softcap = 5, m.alibi_slopes = fa::alibi_slopes(4), m.sinks = sink_logits(4);
  expect_pass("documents + window + softcap + alibi + sinks", make(1, 4, 2, 700, 700, 128, true), m);
  Modifiers two_sided;
  two_sided.window_left = 70, two_sided.window_right = 20, two_sided.sinks = sink_logits(2);
  two_sided.alibi_slopes = fa::alibi_slopes(2);
  expect_pass("two-sided window + alibi + sinks", make(1, 2, 2, 500, 500, 128, false), two_sided);
  Modifiers tail = documents({100, 0, 50}, {120, 7, 50});  // rows past the last document: O = 0, L = σ
  tail.sinks = sink_logits(2);
  expect_pass("documents + sinks, rows past the end", make(1, 2, 2, 200, 200, 128, true), tail);
}

TEST_CASE("13 hopper backward: no modifier, windows, GQA, batch 2") {
  expect_backward_pass("plain", make(1, 2, 2, 333, 517, 128, false), Modifiers{});
  expect_backward_pass("causal, N_q > N_k", make(1, 2, 1, 520, 250, 128, true), Modifiers{});
  Modifiers w;
  w.window_left = 0, w.window_right = 0;
  expect_backward_pass("window 0 (the diagonal alone)", make(1, 2, 2, 300, 300, 128, true), w);
  w.window_left = 100, w.window_right = 37;
  expect_backward_pass("two-sided window (100, 37)", make(1, 2, 2, 500, 450, 128, false), w);
  w.window_left = 5000, w.window_right = 5000;
  expect_backward_pass("window >= N", make(1, 2, 2, 300, 300, 128, true), w);
  if (!small()) {
    Modifiers c64;
    c64.window_left = 64;
    expect_backward_pass("causal window 64, GQA", make(1, 4, 2, 600, 600, 128, true), c64);
    expect_backward_pass("batch 2, GQA", make(2, 4, 2, 400, 400, 128, true), Modifiers{});
  }
}

TEST_CASE("13 hopper backward: documents (variable length)") {
  expect_backward_pass("documents, causal, empty and one-token ones", make(1, 2, 2, 694, 694, 128, true),
                       documents({300, 0, 1, 129, 64, 200}, {300, 0, 1, 129, 64, 200}));
  // Unequal query and key lengths, a document with no keys, rows and keys past the last one.
  expect_backward_pass("uneven documents, rows and keys past the end", make(1, 2, 2, 280, 450, 128, true),
                       documents({5, 200, 0, 33, 1}, {17, 150, 3, 0, 250}));
  if (!small()) {
    Modifiers m = documents({256, 1, 511, 0}, {256, 1, 511, 0});
    m.window_left = 100;
    expect_backward_pass("documents + causal window", make(1, 2, 2, 768, 768, 128, true), m);
  }
}

TEST_CASE("13 hopper backward: soft-capping, ALiBi, sinks, combinations") {
  Modifiers cap;
  cap.softcap = 30;
  expect_backward_pass("softcap 30", make(1, 2, 2, 300, 400, 128, true), cap);
  cap.softcap = 0.05;  // |s| ≫ cap: tanh saturates, its derivative near 0
  expect_backward_pass("softcap 0.05", make(1, 2, 2, 300, 400, 128, false), cap);
  Modifiers alibi;
  alibi.alibi_slopes = fa::alibi_slopes(4);
  expect_backward_pass("alibi causal", make(1, 4, 2, 400, 400, 128, true), alibi);
  // ALiBi alone has a kernel of its own (the bias in P's exponent): off the square diagonal,
  // at d = 64, and with documents, a window and sinks, every step kind of that kernel.
  expect_backward_pass("alibi not causal, N_q != N_k, d = 64", make(1, 4, 4, 300, 500, 64, false), alibi);
  Modifiers alibi_docs = documents({300, 0, 1, 129, 64, 200}, {300, 0, 1, 129, 64, 200});
  alibi_docs.window_left = 40, alibi_docs.alibi_slopes = fa::alibi_slopes(4), alibi_docs.sinks = sink_logits(4);
  expect_backward_pass("documents + window + alibi + sinks", make(1, 4, 2, 700, 700, 128, true), alibi_docs);
  Modifiers sinks;
  sinks.sinks = sink_logits(4);
  expect_backward_pass("sinks", make(1, 4, 2, 300, 300, 128, true), sinks);
  Modifiers m = documents({300, 0, 1, 129, 64, 200}, {300, 0, 1, 129, 64, 200});
  m.window_left = 40, m.softcap = 5, m.alibi_slopes = fa::alibi_slopes(4), m.sinks = sink_logits(4);
  expect_backward_pass("documents + window + softcap + alibi + sinks", make(1, 4, 2, 700, 700, 128, true), m);
  if (!small()) {
    Modifiers two_sided;
    two_sided.window_left = 70, two_sided.window_right = 20, two_sided.sinks = sink_logits(2);
    two_sided.alibi_slopes = fa::alibi_slopes(2), two_sided.softcap = 2;
    expect_backward_pass("two-sided window + softcap + alibi + sinks", make(1, 2, 2, 500, 500, 128, false), two_sided);
    Modifiers tail = documents({100, 0, 50}, {120, 7, 50});  // rows past the last document
    tail.sinks = sink_logits(2);
    expect_backward_pass("documents + sinks, rows past the end", make(1, 2, 2, 200, 200, 128, true), tail);
  }
}

TEST_CASE("13 hopper backward: more blocks than SMs, in several waves") {
  // Every case above fits one wave of blocks. Here the blocks (key tiles x batch x kv heads)
  // are at least twice the SMs, so BwdBlockOrder maps block indices past its first group of
  // rows (a group is about one wave) and blocks start as others finish.
  int sms = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles = 3, heads = 4, batch = 2 * sms / (tiles * heads) + 1;
  REQUIRE(int64_t(tiles) * batch * heads > 2 * int64_t(sms));
  expect_backward_pass("causal, batch " + std::to_string(batch), make(batch, heads, heads, 3 * 128, 3 * 128, 128, true),
                       Modifiers{});
  // A window of 64 over 128 queries and 1024 keys: most key tiles of each head see no query
  // (a block of no steps, which writes dK = dV = 0), among blocks of some.
  Modifiers w;
  w.window_left = 64;
  w.sinks = sink_logits(heads);
  const int batch_w = 2 * sms / (8 * heads) + 1;
  expect_backward_pass("window 64, N_q = 128, N_k = 1024, batch " + std::to_string(batch_w),
                       make(batch_w, heads, heads, 128, 1024, 128, true), w);
}

TEST_CASE("13 hopper backward: a first document of keys only, and one at the end") {
  expect_backward_pass("documents: keys only first and last", make(1, 2, 2, 429, 693, 128, true),
                       documents({0, 300, 129, 0}, {64, 300, 129, 200}));
}

TEST_CASE("13 hopper backward: calls queued back to back, each with its own table") {
  expect_back_to_back<BackwardRun>("backward ", 3, 21);
}

TEST_CASE("13 hopper backward: a refusal writes nothing") {
  const Problem p = make(1, 2, 2, 128, 128, 128, true);
  DeviceTensors dev(p);
  dev.poison();  // O is the stand-in for dQ here: all ones
  Modifiers m;
  m.sinks = sink_logits(2);
  CHECK(refusal([&] {
          s13::backward_hopper(p, m, fa::Dtype::BF16, dev.Q.get(), dev.K.get(), dev.V.get(), dev.O.get(),
                               dev.L.as<float>(), dev.Q.get(), dev.O.get(), dev.K.get(), dev.V.get(), nullptr, nullptr);
        }).find("dsinks is null") != std::string::npos);
  std::vector<unsigned char> o(dev.O.bytes());
  FA_CUDA_CHECK(cudaMemcpy(o.data(), dev.O.get(), o.size(), cudaMemcpyDeviceToHost));
  CHECK(std::all_of(o.begin(), o.end(), [](unsigned char b) { return b == 0xff; }));
}

TEST_CASE("13 hopper: calls queued back to back, each with its own table") {
  expect_back_to_back<Run>("", 5, 11);
}

TEST_CASE("13 hopper: a refusal writes nothing") {
  const Problem p = make(1, 2, 2, 128, 128, 128, true);
  DeviceTensors dev(p);
  dev.poison();
  Modifiers m;
  m.alibi_slopes = {0.5f};
  CHECK(refusal([&] {
          s13::forward_hopper(p, m, fa::Dtype::BF16, dev.Q.get(), dev.K.get(), dev.V.get(), dev.O.get(),
                              dev.L.as<float>(), nullptr);
        }).find("alibi_slopes has 1 entries") != std::string::npos);
  std::vector<unsigned char> o(dev.O.bytes());
  FA_CUDA_CHECK(cudaMemcpy(o.data(), dev.O.get(), o.size(), cudaMemcpyDeviceToHost));
  CHECK(std::all_of(o.begin(), o.end(), [](unsigned char b) { return b == 0xff; }));
}

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  if (!fa::have_gpu()) {
    ctx.addFilter("test-suite", "cpu");
    const int rc = ctx.run();
    std::printf("GPU tests skipped: no GPU on this machine\n");
    return rc != 0 ? rc : 77;
  }
  return ctx.run();
}
