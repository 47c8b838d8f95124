// Stage 11 (Hopper backward: TMA, wgmma, warp specialization, bf16/f16): the shared matrix
// for every step and both dQ modes, plus what is particular to this stage.
//
// Test suite "cpu" — the query-tile schedule (bwd_schedule.h) against Problem::visible_keys,
// exhaustively over small shapes: every query tile that sees a key of the tile is visited,
// none before, and every tile from first_unmasked on sees the whole key tile in every row.
// GPU tests (compute capability 9.x): check_matrix with the backward (stage 10's forward,
// then this stage's backward, against the reference's O, L, dQ, dK, dV) for every step and
// the deterministic mode, in bf16 and f16, at d = 64 and 128, and at d = 256 for the final
// design (the only one with a kernel there; it has a test of its own too); adversarial
// inputs and properties; refusals and random shapes; the deterministic mode bitwise
// reproducible and equal in dK, dV to the atomic mode; every output element written
// (outputs poisoned first); refusals at the device entry (nothing written); empty
// sequences; a non-default stream.
//
// Environment: FA_TEST_SMALL=1 shrinks the cases (compute-sanitizer runs).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bwd_schedule.h"
#include "hopper/dq_layout.h"
#include "problem.h"
#include "stage_checks.h"
#include "stage_list.h"

namespace {

constexpr auto make = &fa::test::make_problem;

}  // namespace

TEST_SUITE("cpu") {
  TEST_CASE("11: query tiles: every tile that sees the key tile is visited, none before, unmasked tiles see it whole") {
    int checked = 0;
    for (int B_c : {64, 128})
      for (int B_r : {64, 128})
        for (int seq_q : {1, 63, 64, 65, 130, 300})
          for (int seq_k : {1, 63, 64, 129, 300, 513})
            for (bool causal : {false, true})
              for (int key0 = 0; key0 < seq_k; key0 += B_c) {
                const fa::Problem p = make(1, 1, 1, seq_q, seq_k, 64, causal);
                const auto t = fa::stage11::query_tiles(key0, B_c, B_r, seq_q, seq_k, causal);
                CAPTURE(B_c);
                CAPTURE(B_r);
                CAPTURE(seq_q);
                CAPTURE(seq_k);
                CAPTURE(causal);
                CAPTURE(key0);
                const int tiles = (seq_q + B_r - 1) / B_r;
                REQUIRE(t.first >= 0);
                REQUIRE(t.first + t.count == tiles);  // from `first` to the last tile
                REQUIRE(t.first_unmasked <= tiles);
                const int last_key = std::min(key0 + B_c, seq_k) - 1;
                for (int i = 0; i < tiles; ++i) {
                  bool sees_some = false, sees_all = key0 + B_c <= seq_k;  // a ragged key tile is never whole
                  for (int q = i * B_r; q < std::min((i + 1) * B_r, seq_q); ++q) {
                    sees_some = sees_some || p.visible_keys(q) > key0;
                    sees_all = sees_all && p.visible_keys(q) > last_key;
                  }
                  if (sees_some) CHECK(i >= t.first);           // no needed tile skipped
                  if (i == t.first) CHECK(sees_some);           // the first visited tile is needed
                  if (i >= t.first_unmasked) CHECK(sees_all);   // unmasked: whole for every row
                  if (i >= t.first && !sees_all) CHECK(i < t.first_unmasked);
                }
                ++checked;
              }
    CHECK(checked > 700);
  }
}

TEST_SUITE("cpu") {
  TEST_CASE("11: the blocked dQ layout of step 11d is a one-to-one map, each block contiguous") {
    for (int d : {64, 128}) {
      const int rows = 256;
      std::vector<int> hits(size_t(rows) * d, 0);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < d; ++c) {
          const int64_t at = fa::stage11::blocked_offset(r, c, d);
          REQUIRE(at >= 0);
          REQUIRE(at < int64_t(rows) * d);
          ++hits[size_t(at)];
          // The block of (r, c) is the 4096 floats that start at a multiple of 4096.
          CHECK(at / 4096 == (r / 64) * (d / 64) + c / 64);
          // A group of 8 columns stays together (the conversion reads it as two float4).
          if (c % 8 != 0) CHECK(at == fa::stage11::blocked_offset(r, c - 1, d) + 1);
        }
      CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    }
  }
}

// ======================================================================================
// On the GPU
// ======================================================================================

#ifdef FA_HAVE_CUDA
#include <cuda_runtime.h>

#include "check.h"
#include "cuda_utils.h"
#include "hopper_bwd.h"
#include "hopper_bwd_steps.h"
#include "tensors.h"

namespace {

namespace s11 = fa::stage11;
using fa::test::bitwise_equal;

const fa::StageInfo& stage() { return fa::find_stage("11"); }

// Stage 11 runs on compute capability 9.x only; elsewhere its GPU tests say so and pass.
bool on_hopper() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major != 9) MESSAGE("skipped: stage 11 needs compute capability 9.x");
  return major == 9;
}

// Sets stage 11's options for one scope through the C ABI's path, restoring them afterwards.
struct OptionsScope {
  s11::Options saved;
  explicit OptionsScope(const s11::Options& o) : saved(s11::current_options()) { s11::set_options(o); }
  ~OptionsScope() { s11::set_options(saved); }
};

s11::Options step(s11::Step s, bool deterministic = false) {
  s11::Options o;
  o.step = s;
  o.deterministic = deterministic;
  return o;
}

// The configurations every correctness test runs: every step, and the deterministic mode
// (built on 11d).
const std::vector<s11::Options> kConfigs = {step(s11::Step::A), step(s11::Step::B), step(s11::Step::C),
                                            step(s11::Step::D), step(s11::Step::D, true)};

/// The stage as a configuration sees it: steps 11a–11c are built for d = 64 and 128 only
/// (d = 256 runs the final design, 11d, with either dQ mode), so the shared checks, which
/// take their head dims from the stage, run them without d = 256.
const fa::StageInfo& stage_for(const s11::Options& o) {
  static const fa::StageInfo without_256 = [] {
    fa::StageInfo s = fa::find_stage("11");
    s.head_dims = {64, 128};
    return s;
  }();
  const bool final_design = o.step == s11::Step::D || o.step == s11::Step::Auto;
  return final_design ? stage() : without_256;
}

std::string describe(const s11::Options& o) {
  return s11::step_names()[size_t(o.step)] + (o.deterministic ? " deterministic" : " atomics");
}

/// Runs stage 10's forward and this stage's backward on host tensors with options `o`.
void forward_backward(const fa::Problem& p, fa::Dtype t, fa::Tensors& x, const s11::Options& o) {
  const OptionsScope scope(o);
  stage().forward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
  stage().backward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(), x.dO.data(), x.dQ.data(),
                   x.dK.data(), x.dV.data());
}

}  // namespace

// One test case per configuration, so that the sanitizer runs (one process per test case)
// share the work out.
void check_matrix_of(const s11::Options& o) {
  if (!on_hopper()) return;
  const OptionsScope scope(o);
  fa::test::check_matrix(stage_for(o), fa::Dtype::BF16, true);
  fa::test::check_matrix(stage_for(o), fa::Dtype::F16, true);
}

TEST_CASE("11: the shared shape matrix with gradients, step 11a, bf16 and f16") { check_matrix_of(kConfigs[0]); }
TEST_CASE("11: the shared shape matrix with gradients, step 11b, bf16 and f16") { check_matrix_of(kConfigs[1]); }
TEST_CASE("11: the shared shape matrix with gradients, step 11c, bf16 and f16") { check_matrix_of(kConfigs[2]); }
TEST_CASE("11: the shared shape matrix with gradients, step 11d (the default), bf16 and f16") {
  check_matrix_of(kConfigs[3]);
}
TEST_CASE("11: the shared shape matrix with gradients, deterministic mode, bf16 and f16") {
  check_matrix_of(kConfigs[4]);
}

TEST_CASE("11: adversarial inputs (large logits, empty rows, constant rows, NaN), every configuration") {
  if (!on_hopper()) return;
  for (const auto& o : kConfigs) {
    const OptionsScope scope(o);
    CAPTURE(describe(o));
    fa::test::check_adversarial(stage_for(o), fa::Dtype::BF16, true);
    fa::test::check_adversarial(stage_for(o), fa::Dtype::F16, true);
  }
}

TEST_CASE("11: properties (key permutation, determinism of dK and dV), every configuration") {
  if (!on_hopper()) return;
  for (const auto& o : kConfigs) {
    const OptionsScope scope(o);
    CAPTURE(describe(o));
    fa::test::check_properties(stage_for(o), fa::Dtype::BF16, true);
    fa::test::check_properties(stage_for(o), fa::Dtype::F16, true);
  }
}

TEST_CASE("11: refusals, bf16 and f16") {
  if (!on_hopper()) return;
  fa::test::check_refusals(stage(), fa::Dtype::BF16);
  fa::test::check_refusals(stage(), fa::Dtype::F16);
}

TEST_CASE("11: random shapes, bf16 and f16, every configuration") {
  if (!on_hopper()) return;
  for (const auto& o : kConfigs) {
    const OptionsScope scope(o);
    CAPTURE(describe(o));
    fa::test::check_random_shapes(stage_for(o), fa::Dtype::BF16, true, fa::test::small_mode() ? 2 : 8);
    fa::test::check_random_shapes(stage_for(o), fa::Dtype::F16, true, fa::test::small_mode() ? 2 : 8);
  }
}

TEST_CASE("11: the deterministic mode is bitwise reproducible, and its dK, dV are the atomic mode's bits") {
  // Many key tiles add into each dQ row and (GQA, group of 4) four query heads into each
  // dK, dV row. dK and dV add up in the same order in both modes (the same main kernel,
  // with and without its dQ product), so they must agree bit for bit.
  if (!on_hopper()) return;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      const fa::Problem p = make(2, 8, 2, 333, fa::test::small_mode() ? 300 : 1000, d, causal);
      for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16}) {
        INFO(std::string(fa::dtype_name(t)) << " " << p.describe());
        fa::Tensors x = fa::Tensors::make(p, 42, fa::Dist::Normal, true);
        fa::Tensors runs[2] = {x, x}, atomic = x;
        for (auto& y : runs) forward_backward(p, t, y, step(s11::Step::D, true));
        forward_backward(p, t, atomic, step(s11::Step::D));
        CHECK_MESSAGE(bitwise_equal(runs[0].dQ, runs[1].dQ), "dQ differs between two deterministic runs");
        CHECK_MESSAGE(bitwise_equal(runs[0].dK, runs[1].dK), "dK differs between two deterministic runs");
        CHECK_MESSAGE(bitwise_equal(runs[0].dV, runs[1].dV), "dV differs between two deterministic runs");
        CHECK_MESSAGE(bitwise_equal(runs[0].dK, atomic.dK), "dK differs between the two dQ modes");
        CHECK_MESSAGE(bitwise_equal(runs[0].dV, atomic.dV), "dV differs between the two dQ modes");
        const fa::CheckReport r = fa::compare_backward(p, t, runs[0]), ra = fa::compare_backward(p, t, atomic);
        INFO("deterministic:\n" << r.summary() << "atomics:\n" << ra.summary());
        CHECK(r.pass());  // right, not merely repeatable
        CHECK(ra.pass());
      }
    }
}

TEST_CASE("11: steps 11b, 11c and 11d give the same dK and dV bits (same products, same order of additions)") {
  // 11c only moves waits and 11d only how dQ leaves the block: a schedule bug that read a
  // buffer too early or released one too soon would change the bits. (dQ's additions land
  // in a varying order in all three.)
  if (!on_hopper()) return;
  for (const auto& p : {make(2, 4, 2, 300, 513, 128, true), make(1, 2, 1, 257, 1000, 64, false)}) {
    fa::Tensors x = fa::Tensors::make(p, 17, fa::Dist::Normal, true), y = x, z = x;
    forward_backward(p, fa::Dtype::BF16, x, step(s11::Step::B));
    forward_backward(p, fa::Dtype::BF16, y, step(s11::Step::C));
    forward_backward(p, fa::Dtype::BF16, z, step(s11::Step::D));
    INFO(p.describe());
    CHECK(bitwise_equal(x.dK, y.dK));
    CHECK(bitwise_equal(x.dV, y.dV));
    CHECK(bitwise_equal(x.dK, z.dK));
    CHECK(bitwise_equal(x.dV, z.dV));
  }
}

TEST_CASE("11: d = 256 (step 11d, columns split between the consumers): shapes, GQA, masks, both dtypes") {
  // Many key tiles (B_c = 64) and query tiles (B_r = 64), ragged ends, a causal mask with
  // seq_q ≠ seq_k (rows that see no key, tiles that cross the diagonal), GQA groups of 1, 2
  // and 4: a consumer that read the other's half of Pᵀ or dSᵀ too early, a column offset
  // off by one block, or a dQ block added at the wrong place fails the comparison.
  if (!on_hopper()) return;
  const bool small = fa::test::small_mode();
  const std::vector<fa::Problem> shapes = {
      make(1, 2, 2, 64, 64, 256, false),   make(2, 4, 2, 300, small ? 130 : 513, 256, true),
      make(1, 4, 1, 129, 70, 256, true),   make(1, 2, 1, small ? 100 : 1025, small ? 100 : 1025, 256, true),
      make(2, 2, 2, 77, 300, 256, false)};
  for (const auto& p : shapes)
    for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16}) {
      fa::Tensors x = fa::Tensors::make(p, 61, fa::Dist::Normal, true), y = x;
      forward_backward(p, t, x, step(s11::Step::Auto));
      forward_backward(p, t, y, step(s11::Step::Auto));
      const fa::CheckReport r = fa::compare_backward(p, t, x);
      INFO(std::string(fa::dtype_name(t)) << " " << p.describe() << "\n" << r.summary());
      CHECK(r.pass());
      CHECK_MESSAGE(bitwise_equal(x.dK, y.dK), "dK differs between two runs");  // no atomics in dK, dV
      CHECK_MESSAGE(bitwise_equal(x.dV, y.dV), "dV differs between two runs");
    }
}

TEST_CASE("11: d = 256 refuses the steps built for d = 64 and 128 only, naming them") {
  if (!on_hopper()) return;
  const fa::Problem p = make(1, 2, 1, 64, 64, 256, false);
  fa::Tensors x = fa::Tensors::make(p, 3, fa::Dist::Normal, true);
  for (const auto& [o, fragment] : {std::pair{step(s11::Step::A), std::string("step 11a has no kernel for head_dim = 256")},
                                    std::pair{step(s11::Step::C), std::string("step 11c has no kernel for head_dim = 256")}}) {
    std::string msg;
    try {
      forward_backward(p, fa::Dtype::BF16, x, o);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    INFO("message: '" << msg << "'");
    CHECK(msg.find(fragment) != std::string::npos);
  }
}

TEST_CASE("11: the step and deterministic options: names, bounds, refusal of 11a with deterministic") {
  // (11b and 11c are refused the same way; 11a stands for them.)
  CHECK(s11::step_names() == std::vector<std::string>{"auto", "11a", "11b", "11c", "11d"});
  CHECK_THROWS_AS(stage().set_option("step", 5), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("step", -1), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("tile", 1), std::invalid_argument);
  stage().set_option("deterministic", 1);
  CHECK(stage().get_counter("deterministic") == 1);
  stage().set_option("deterministic", 0);
  if (!on_hopper()) return;
  const fa::Problem p = make(1, 2, 1, 64, 64, 64, false);
  fa::Tensors x = fa::Tensors::make(p, 3, fa::Dist::Normal, true);
  const OptionsScope scope(step(s11::Step::A, true));
  stage().forward(p, fa::Dtype::BF16, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
  try {
    stage().backward(p, fa::Dtype::BF16, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(), x.dO.data(),
                     x.dQ.data(), x.dK.data(), x.dV.data());
    FAIL("step 11a with the deterministic mode was not refused");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("deterministic mode is built on step 11d") != std::string::npos);
  }
}

TEST_CASE("11: the device backward refuses bad pointers, dtypes and head dims before writing") {
  if (!on_hopper()) return;
  const fa::Problem p = make(1, 2, 1, 64, 64, 64, false);
  fa::DeviceBuffer Q(p.q_elems() * 2 + 16, "Q"), K(p.kv_elems() * 2, "K"), V(p.kv_elems() * 2, "V"),
      O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L"), dO(p.q_elems() * 2, "dO"), dQ(p.q_elems() * 2 + 16, "dQ"),
      dK(p.kv_elems() * 2, "dK"), dV(p.kv_elems() * 2, "dV");
  for (auto* b : {&dQ, &dK, &dV}) FA_CUDA_CHECK(cudaMemset(b->get(), 0x5a, b->bytes()));
  const auto refused = [&](const fa::Problem& q, fa::Dtype t, const void* q_ptr, void* dq_ptr, const float* l_ptr,
                           const std::string& fragment) {
    std::string msg;
    try {
      s11::backward(q, t, q_ptr, K.get(), V.get(), O.get(), l_ptr, dO.get(), dq_ptr, dK.get(), dV.get(), nullptr);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    INFO("message: '" << msg << "'");
    CHECK(msg.find(fragment) != std::string::npos);
    CHECK(msg.find("11_hopper_bwd") != std::string::npos);
  };
  const auto bf = fa::Dtype::BF16;
  const float* Lp = L.as<float>();
  refused(p, bf, Q.as<char>() + 2, dQ.get(), Lp, "pointer Q");
  refused(p, bf, Q.get(), dQ.as<char>() + 8, Lp, "pointer dQ");
  refused(p, bf, Q.get(), dQ.get(), reinterpret_cast<const float*>(L.as<char>() + 2), "pointer L");
  refused(p, bf, nullptr, dQ.get(), Lp, "NULL");
  refused(p, fa::Dtype::F32, Q.get(), dQ.get(), Lp, "dtype f32");
  for (int d : {32, 96, 512}) {
    fa::Problem bad = p;
    bad.head_dim = d;
    refused(bad, bf, Q.get(), dQ.get(), Lp, "head_dim = " + std::to_string(d));
  }
  fa::Problem bad = p;
  bad.kv_heads = 3;
  refused(bad, fa::Dtype::F16, Q.get(), dQ.get(), Lp, "kv_heads = 3");

  FA_CUDA_CHECK(cudaDeviceSynchronize());
  for (const fa::DeviceBuffer* b : {&dQ, &dK, &dV}) {
    std::vector<unsigned char> host(b->bytes());
    FA_CUDA_CHECK(cudaMemcpy(host.data(), b->get(), b->bytes(), cudaMemcpyDeviceToHost));
    CHECK(std::all_of(host.begin(), host.end(), [](unsigned char c) { return c == 0x5a; }));
  }
}

TEST_CASE("11: every element of dQ, dK, dV is written (outputs poisoned with NaN first), every configuration") {
  // seq_q > seq_k under the causal mask: the first 40 rows see no key (dQ = 0, and they add
  // nothing to dK, dV); ragged query and key tiles; GQA with a group of 2. A row or column
  // that a kernel forgot keeps its NaN.
  if (!on_hopper()) return;
  for (int d : {64, 128, 256})
    for (const auto& o : kConfigs) {
      if (!stage_for(o).supports_head_dim(d)) continue;
      const fa::Problem p = make(2, 4, 2, 300, 260, d, true);
      fa::Tensors x = fa::Tensors::make(p, 23, fa::Dist::Normal, true);
      x.poison_outputs();
      forward_backward(p, fa::Dtype::BF16, x, o);
      CAPTURE(d);
      CAPTURE(describe(o));
      for (const auto* g : {&x.dQ, &x.dK, &x.dV})
        CHECK(std::none_of(g->begin(), g->end(), [](float v) { return std::isnan(v); }));
      const fa::CheckReport r = fa::compare_backward(p, fa::Dtype::BF16, x);
      INFO(r.summary());
      CHECK(r.pass());
      for (int64_t bh = 0; bh < int64_t(p.batch) * p.heads; ++bh)
        for (int64_t i = 0; i < p.seq_q; ++i)
          if (p.visible_keys(i) == 0)
            for (int c = 0; c < d; ++c) CHECK(x.dQ[size_t((bh * p.seq_q + i) * d + c)] == 0.0f);
    }
}

TEST_CASE("11: empty sequences: seq_q = 0 gives dK = dV = 0, seq_k = 0 gives dQ = 0") {
  if (!on_hopper()) return;
  for (const auto& o : kConfigs) {
    const OptionsScope scope(o);
    CAPTURE(describe(o));
    for (const auto& p : {make(2, 2, 1, 0, 70, 64, false), make(1, 2, 2, 70, 0, 128, true)}) {
      fa::Tensors x = fa::Tensors::make(p, 5, fa::Dist::Normal, true);
      x.poison_outputs();
      stage().backward(p, fa::Dtype::BF16, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(),
                       x.dO.data(), x.dQ.data(), x.dK.data(), x.dV.data());
      for (const auto* g : {&x.dQ, &x.dK, &x.dV})
        CHECK(std::all_of(g->begin(), g->end(), [](float v) { return v == 0.0f; }));
    }
  }
}

TEST_CASE("11: device pointers on a non-default stream give the host path's result") {
  if (!on_hopper()) return;
  const fa::Problem p = make(1, 4, 2, 200, 333, 128, true);
  const fa::Dtype t = fa::Dtype::BF16;
  fa::Tensors x = fa::Tensors::make(p, 9, fa::Dist::Normal, true);
  forward_backward(p, t, x, step(s11::Step::D, true));  // deterministic: comparable bit for bit
  cudaStream_t stream;
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t q = p.q_elems(), kv = p.kv_elems();
  fa::DeviceBuffer Q(q * 2, "Q"), K(kv * 2, "K"), V(kv * 2, "V"), O(q * 2, "O"), L(p.l_elems() * 4, "L"),
      dO(q * 2, "dO"), dQ(q * 2, "dQ"), dK(kv * 2, "dK"), dV(kv * 2, "dV");
  fa::upload(t, x.Q.data(), Q.get(), q, stream);
  fa::upload(t, x.K.data(), K.get(), kv, stream);
  fa::upload(t, x.V.data(), V.get(), kv, stream);
  fa::upload(t, x.O.data(), O.get(), q, stream);
  fa::upload(fa::Dtype::F32, x.L.data(), L.get(), p.l_elems(), stream);
  fa::upload(t, x.dO.data(), dO.get(), q, stream);
  s11::backward(p, t, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), dO.get(), dQ.get(), dK.get(), dV.get(),
                stream, step(s11::Step::D, true));
  std::vector<float> dq(static_cast<size_t>(q)), dk(static_cast<size_t>(kv)), dv(static_cast<size_t>(kv));
  fa::download(t, dQ.get(), dq.data(), q, stream);
  fa::download(t, dK.get(), dk.data(), kv, stream);
  fa::download(t, dV.get(), dv.data(), kv, stream);
  FA_CUDA_CHECK(cudaStreamDestroy(stream));
  CHECK(bitwise_equal(dq, x.dQ));
  CHECK(bitwise_equal(dk, x.dK));
  CHECK(bitwise_equal(dv, x.dV));
}

TEST_CASE("11: launch report") {
  if (!on_hopper()) return;
  std::string all;
  for (const auto& [key, value] : stage().report(make(2, 3, 1, 130, 300, 128, true), fa::Dtype::BF16))
    all += key + ": " + value + "\n";
  INFO(all);
  CHECK(all.find("11d (auto)") != std::string::npos);
  CHECK(all.find("B_c = 128 keys per block, B_r = 64") != std::string::npos);
  CHECK(all.find("grid: 3 x 1 x 2") != std::string::npos);  // key tiles, kv heads, batch
  CHECK(all.find("registers") != std::string::npos);
}

// The step table in the common contract (step_kernel.h): a backward block owns B_c keys
// (block_cols) and walks B_r query rows a step (block_rows). Host code only: no GPU needed.
TEST_SUITE("cpu") {
  TEST_CASE("11: the step tables: B_c keys per block, B_r rows per step; the dQ pass shares B_c") {
    for (int d : {64, 128}) {
      CAPTURE(d);
      const fa::StepKernel a = s11::step_11a(d, fa::Dtype::F16, false);
      CHECK(a.block_cols == 64);
      CHECK(a.block_rows == 64);
      for (const fa::StepKernel& k : {s11::step_11b(d, fa::Dtype::F16, false), s11::step_11c(d, fa::Dtype::F16, false),
                                      s11::step_11d(d, fa::Dtype::F16, false)}) {
        CHECK(k.block_cols == 128);
        CHECK(k.block_rows == (d == 64 ? 128 : 64));
      }
      const fa::StepKernel dq = s11::dq_pass(d, fa::Dtype::BF16, true);
      CHECK(dq.block_rows == 64);
      CHECK(dq.block_cols == s11::step_11d(d, fa::Dtype::BF16, true, false).block_cols);  // the same tensor maps
    }
    CHECK_THROWS_WITH_AS(s11::step_11c(256, fa::Dtype::BF16, false),
                         "11_hopper_bwd: step 11c has no kernel for head_dim = 256 (built: 64, 128)",
                         std::invalid_argument);
  }
}

#endif  // FA_HAVE_CUDA
