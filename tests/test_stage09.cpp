// Stage 09 (tensor-core backward) against the shared matrix (DESIGN §6), in bf16 and fp16
// and in both dQ modes, plus its own checks: the deterministic mode is bitwise
// reproducible, stage 08's forward followed by stage 09's backward gives the reference's
// gradients, the device entry point refuses bad pointers without writing, the query-tile
// arithmetic is exact, the ablation variants are correct, and one problem of more than
// 2^31 elements runs (64-bit offsets). Needs a GPU (exits 77 without one).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bwd_tile_index.h"
#include "check.h"
#include "cuda_utils.h"
#include "reference.h"
#include "stage_checks.h"
#include "stage_list.h"
#include "tensor_core_bwd.h"

namespace {

using fa::test::bitwise_equal;

constexpr auto make = &fa::test::make_problem;

namespace s09 = fa::stage09;

const fa::StageInfo& stage() { return fa::find_stage("09"); }

/// Sets stage 09's options for one scope, restoring the previous ones afterwards.
struct OptionsScope {
  s09::Options saved;
  explicit OptionsScope(const s09::Options& o) : saved(s09::current_options()) { s09::set_options(o); }
  ~OptionsScope() { s09::set_options(saved); }
};

s09::Options deterministic() {
  s09::Options o;
  o.deterministic = true;
  return o;
}




}  // namespace

// ---------------------------------------------------------------------------------------
// The shared matrix, both dtypes, both dQ modes (check_backward runs the stage's forward,
// which is stage 08's, then this backward, and compares O, L, dQ, dK, dV).
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: shape matrix, bf16, dQ by atomics") { fa::test::check_matrix(stage(), fa::Dtype::BF16, true); }
TEST_CASE("stage 09: shape matrix, f16, dQ by atomics") { fa::test::check_matrix(stage(), fa::Dtype::F16, true); }
TEST_CASE("stage 09: shape matrix, bf16, deterministic dQ") {
  OptionsScope scope(deterministic());
  fa::test::check_matrix(stage(), fa::Dtype::BF16, true);
}
TEST_CASE("stage 09: shape matrix, f16, deterministic dQ") {
  OptionsScope scope(deterministic());
  fa::test::check_matrix(stage(), fa::Dtype::F16, true);
}

TEST_CASE("stage 09: adversarial inputs") {
  for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16}) {
    fa::test::check_adversarial(stage(), t, true);
    OptionsScope scope(deterministic());
    fa::test::check_adversarial(stage(), t, true);
  }
}

TEST_CASE("stage 09: properties (key permutation, determinism of dK and dV)") {
  for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16}) {
    fa::test::check_properties(stage(), t, true);
    OptionsScope scope(deterministic());
    fa::test::check_properties(stage(), t, true);
  }
}

TEST_CASE("stage 09: refusals") {
  fa::test::check_refusals(stage(), fa::Dtype::BF16);
  fa::test::check_refusals(stage(), fa::Dtype::F16);
}

TEST_CASE("stage 09: random shapes") {
  fa::test::check_random_shapes(stage(), fa::Dtype::BF16, true, 6);
  fa::test::check_random_shapes(stage(), fa::Dtype::F16, true, 6);
  OptionsScope scope(deterministic());
  fa::test::check_random_shapes(stage(), fa::Dtype::BF16, true, 4);
}

// ---------------------------------------------------------------------------------------
// Determinism: the deterministic mode gives bitwise the same dQ, dK, dV twice, on shapes
// where many key tiles (and, for dK/dV, many query heads) add into each result.
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: deterministic mode is bitwise reproducible") {
  OptionsScope scope(deterministic());
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      const fa::Problem p = make(2, 8, 2, 333, fa::test::small_mode() ? 300 : 1000, d, causal);
      for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16}) {
        INFO(fa::dtype_name(t) << " " << p.describe());
        fa::Tensors x = fa::Tensors::make(p, 42, fa::Dist::Normal, true);
        stage().forward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
        std::vector<float> dQ[2], dK[2], dV[2];
        for (int run = 0; run < 2; ++run) {
          dQ[run].assign(x.dQ.size(), std::nanf(""));
          dK[run].assign(x.dK.size(), std::nanf(""));
          dV[run].assign(x.dV.size(), std::nanf(""));
          stage().backward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(), x.dO.data(),
                           dQ[run].data(), dK[run].data(), dV[run].data());
        }
        CHECK_MESSAGE(bitwise_equal(dQ[0], dQ[1]), "dQ differs between two deterministic runs");
        CHECK_MESSAGE(bitwise_equal(dK[0], dK[1]), "dK differs between two deterministic runs");
        CHECK_MESSAGE(bitwise_equal(dV[0], dV[1]), "dV differs between two deterministic runs");
        // And the result is right, not merely repeatable.
        x.dQ = dQ[0];
        x.dK = dK[0];
        x.dV = dV[0];
        const fa::CheckReport r = fa::compare_backward(p, t, x);
        INFO(r.summary());
        CHECK(r.pass());
      }
    }
}

TEST_CASE("stage 09: both dQ modes agree within tolerance, and dK, dV are reproducible in atomic mode") {
  const fa::Problem p = make(1, 4, 1, 257, 700, 128, true);
  const fa::Dtype t = fa::Dtype::BF16;
  fa::Tensors x = fa::Tensors::make(p, 43, fa::Dist::Normal, true);
  stage().forward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
  fa::Tensors atomic = x, atomic2 = x, separate = x;
  {
    OptionsScope scope(s09::Options{});
    for (fa::Tensors* y : {&atomic, &atomic2})
      stage().backward(p, t, y->Q.data(), y->K.data(), y->V.data(), y->O.data(), y->L.data(), y->dO.data(),
                       y->dQ.data(), y->dK.data(), y->dV.data());
  }
  {
    OptionsScope scope(deterministic());
    stage().backward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(), x.dO.data(),
                     separate.dQ.data(), separate.dK.data(), separate.dV.data());
  }
  const fa::CheckReport ra = fa::compare_backward(p, t, atomic), rs = fa::compare_backward(p, t, separate);
  INFO("atomic:\n" << ra.summary() << "deterministic:\n" << rs.summary());
  CHECK(ra.pass());
  CHECK(rs.pass());
  CHECK_MESSAGE(bitwise_equal(atomic.dK, atomic2.dK), "dK differs between two runs in atomic mode");
  CHECK_MESSAGE(bitwise_equal(atomic.dV, atomic2.dV), "dV differs between two runs in atomic mode");
}

// ---------------------------------------------------------------------------------------
// Stage 08 + 09 together: forward with stage 08, backward with stage 09 on that forward's
// O and L, against the reference's gradients of the same loss (⟨dO, O⟩).
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: gradient check of stage 08's forward and stage 09's backward together") {
  const fa::StageInfo& s08 = fa::find_stage("08");
  for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16})
    for (const fa::Problem& p : {make(2, 4, 2, 200, 200, 64, true), make(1, 2, 1, 130, 300, 128, false),
                                 make(1, 8, 2, 300, 77, 128, true)}) {
      INFO(fa::dtype_name(t) << " " << p.describe());
      fa::Tensors x = fa::Tensors::make(p, 44, fa::Dist::Normal, true);
      s08.forward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
      stage().backward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(), x.dO.data(),
                       x.dQ.data(), x.dK.data(), x.dV.data());
      const fa::CheckReport fwd = fa::compare_forward(p, t, x), bwd = fa::compare_backward(p, t, x);
      INFO("forward (stage 08):\n" << fwd.summary() << "backward (stage 09):\n" << bwd.summary());
      CHECK(fwd.pass());
      CHECK(bwd.pass());

      // The shared check_backward runs "the stage's forward": for stage 09 that must be
      // stage 08's, bit for bit.
      fa::Tensors y = x;
      y.poison_outputs();
      stage().forward(p, t, y.Q.data(), y.K.data(), y.V.data(), y.O.data(), y.L.data());
      CHECK(bitwise_equal(x.O, y.O));
      CHECK(bitwise_equal(x.L, y.L));
    }
}

// ---------------------------------------------------------------------------------------
// The device entry point: refusals name the value and write nothing.
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: the device backward refuses bad pointers, dtypes and head dims before writing") {
  const fa::Problem p = make(1, 2, 1, 64, 64, 64, false);
  const size_t es = 2;
  fa::DeviceBuffer Q(p.q_elems() * es + 16, "Q"), K(p.kv_elems() * es, "K"), V(p.kv_elems() * es, "V"),
      O(p.q_elems() * es, "O"), L(p.l_elems() * 4, "L"), dO(p.q_elems() * es, "dO"), dQ(p.q_elems() * es, "dQ"),
      dK(p.kv_elems() * es, "dK"), dV(p.kv_elems() * es, "dV");
  // A recognisable pattern in the outputs: it must survive every refused call.
  FA_CUDA_CHECK(cudaMemset(dQ.get(), 0x5a, dQ.bytes()));
  FA_CUDA_CHECK(cudaMemset(dK.get(), 0x5a, dK.bytes()));
  FA_CUDA_CHECK(cudaMemset(dV.get(), 0x5a, dV.bytes()));
  const auto expect_refusal = [&](const fa::Problem& q, fa::Dtype t, const void* q_ptr, const std::string& names) {
    std::string msg;
    try {
      s09::backward(q, t, q_ptr, K.get(), V.get(), O.get(), L.as<float>(), dO.get(), dQ.get(), dK.get(), dV.get(),
                    nullptr);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    INFO("message: '" << msg << "'");
    CHECK(msg.find(names) != std::string::npos);
    CHECK(msg.find("09_tensor_core_bwd") != std::string::npos);
  };
  expect_refusal(p, fa::Dtype::BF16, static_cast<char*>(Q.get()) + 2, "pointer Q");
  expect_refusal(p, fa::Dtype::F32, Q.get(), "dtype f32");
  fa::Problem q = p;
  q.head_dim = 96;
  expect_refusal(q, fa::Dtype::BF16, Q.get(), "head_dim = 96");
  q = p;
  q.kv_heads = 3;
  expect_refusal(q, fa::Dtype::F16, Q.get(), "kv_heads = 3");
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  for (const fa::DeviceBuffer* b : {&dQ, &dK, &dV}) {
    std::vector<unsigned char> host(b->bytes());
    FA_CUDA_CHECK(cudaMemcpy(host.data(), b->get(), b->bytes(), cudaMemcpyDeviceToHost));
    CHECK(std::all_of(host.begin(), host.end(), [](unsigned char c) { return c == 0x5a; }));
  }
}

TEST_CASE("stage 09: options by name") {
  OptionsScope scope(s09::Options{});
  stage().set_option("deterministic", 1);
  CHECK(stage().get_counter("deterministic") == 1);
  CHECK(s09::current_options().deterministic);
  stage().set_option("deterministic", 0);
  CHECK_FALSE(s09::current_options().deterministic);
  CHECK_THROWS_AS(stage().set_option("deterministic", 2), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("ablation", 7), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("no_such_option", 0), std::invalid_argument);
  stage().set_option("tile", 1);
  CHECK(s09::current_options().tile == s09::Tile::Narrow);
  CHECK(stage().get_counter("tile") == 1);
  CHECK_THROWS_AS(stage().set_option("tile", 2), std::invalid_argument);
  stage().set_option("schedule", 1);
  CHECK(s09::current_options().schedule == s09::Schedule::OneBarrier);
  CHECK(stage().get_counter("schedule") == 1);
  CHECK_THROWS_AS(stage().set_option("schedule", 2), std::invalid_argument);
  CHECK(s09::parse_ablation("no_swizzle") == s09::Ablation::NoSwizzle);
  CHECK_THROWS_AS(s09::parse_ablation("fast"), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// Which query tiles a key tile visits (bwd_tile_index.h), exhaustively against
// Problem::visible_keys on small problems.
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: query_tile_range and visible_query_columns agree with Problem::visible_keys") {
  for (bool causal : {false, true})
    for (int block_m : {16, 64, 128})
      for (int block_n : {64, 128})
        for (int seq_q : {0, 1, 15, 64, 65, 130, 257})
          for (int seq_k : {1, 2, 63, 64, 100, 129, 300}) {
            fa::Problem p = make(1, 1, 1, seq_q, seq_k, 64, causal);
            for (int64_t key0 = 0; key0 < seq_k; key0 += block_n) {
              const s09::QueryTileRange r = s09::query_tile_range(key0, block_n, block_m, seq_q, seq_k, causal);
              INFO("causal=" << causal << " B_r=" << block_m << " B_c=" << block_n << " seq_q=" << seq_q
                             << " seq_k=" << seq_k << " key0=" << key0);
              REQUIRE(r.end == (seq_q + block_m - 1) / block_m);
              REQUIRE(r.begin >= 0);
              REQUIRE(r.begin <= r.end);
              for (int i = 0; i < r.end; ++i) {
                const int64_t q0 = int64_t(i) * block_m;
                bool any = false, all = true;
                for (int64_t q = q0; q < q0 + block_m; ++q)
                  for (int64_t k = key0; k < key0 + block_n; ++k) {
                    const bool seen = q < seq_q && k < seq_k && k < p.visible_keys(q);
                    any = any || seen;
                    all = all && seen;
                  }
                // Skipped tiles see nothing; visited tiles see something.
                CHECK((i >= r.begin) == any);
                // A tile computed without a mask must see every (query, key) pair.
                if (i >= r.begin && !r.masked(i)) CHECK(all);
                // Every masked tile has a reason to be masked (no tile masked needlessly
                // except by the diagonal band's tile granularity).
                if (all) CHECK_FALSE(r.masked(i));
                // The per-key columns are exactly the visible queries.
                int64_t wrong_columns = 0;
                for (int64_t k = key0; k < key0 + block_n; ++k) {
                  const s09::QueryColumns c = s09::visible_query_columns(k, q0, block_m, seq_q, seq_k, causal);
                  for (int col = 0; col < block_m; ++col) {
                    const int64_t q = q0 + col;
                    const bool seen = q < seq_q && k < seq_k && k < p.visible_keys(q);
                    wrong_columns += (col >= c.begin && col < c.end) != seen;
                  }
                }
                CHECK(wrong_columns == 0);
              }
            }
          }
}

// ---------------------------------------------------------------------------------------
// The ablation variants compute the same gradients (bf16, both head dims).
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: ablation variants are correct") {
  for (s09::Ablation a : {s09::Ablation::NoPipeline, s09::Ablation::NoSwizzle}) {
    s09::Options o;
    o.ablation = a;
    OptionsScope scope(o);
    INFO("ablation " << s09::ablation_names()[size_t(a)]);
    uint64_t seed = 500;
    for (int d : {64, 128})
      for (const fa::Problem& p : {make(1, 4, 2, 300, 77, d, true), make(2, 2, 2, 255, 255, d, false),
                                   make(1, 2, 1, 97, 513, d, true)})
        fa::test::expect_pass(stage(), p, fa::Dtype::BF16, seed++, fa::Dist::Normal, true);
    // Ablations are built for bf16 only; f16 is refused by name.
    std::string msg;
    try {
      fa::test::expect_pass(stage(), make(1, 1, 1, 16, 16, 64, false), fa::Dtype::F16, 1, fa::Dist::Normal, true);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    CHECK(msg.find("bf16 only") != std::string::npos);
  }
}

TEST_CASE("stage 09: the narrow tiles are correct (both dtypes, both dQ modes)") {
  uint64_t seed = 600;
  for (bool det : {false, true}) {
    s09::Options o;
    o.tile = s09::Tile::Narrow;
    o.deterministic = det;
    OptionsScope scope(o);
    INFO("narrow tile, deterministic = " << det);
    for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16})
      for (int d : {64, 128})
        for (const fa::Problem& p : {make(1, 4, 2, 300, 77, d, true), make(2, 2, 2, 255, 255, d, false),
                                     make(1, 2, 1, 97, 513, d, true), make(1, 8, 2, 128, 128, d, true)})
          fa::test::expect_pass(stage(), p, t, seed++, fa::Dist::Normal, true);
  }
}

// The one-barrier schedule (dSᵀ double-buffered): the same gradients, both dtypes, both
// modes; lengths that give 1, 2 and many steps per block, GQA (the steps cross heads).
TEST_CASE("stage 09: the one_barrier schedule is correct (both dtypes, both dQ modes)") {
  uint64_t seed = 700;
  for (bool det : {false, true}) {
    s09::Options o;
    o.schedule = s09::Schedule::OneBarrier;
    o.deterministic = det;
    OptionsScope scope(o);
    INFO("one_barrier, deterministic = " << det);
    for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16})
      for (int d : {64, 128})
        for (const fa::Problem& p : {make(1, 4, 2, 300, 77, d, true), make(2, 2, 2, 255, 255, d, false),
                                     make(1, 2, 1, 97, 513, d, true), make(1, 8, 2, 128, 128, d, true),
                                     make(1, 1, 1, 1, 1, d, false), make(1, 2, 2, 1000, 130, d, false)})
          fa::test::expect_pass(stage(), p, t, seed++, fa::Dist::Normal, true);
  }
  // Built on the wide tile without ablations only; other combinations are refused by name.
  for (const bool narrow : {true, false}) {
    s09::Options o;
    o.schedule = s09::Schedule::OneBarrier;
    if (narrow) o.tile = s09::Tile::Narrow;
    else o.ablation = s09::Ablation::NoPipeline;
    OptionsScope scope(o);
    std::string msg;
    try {
      fa::test::expect_pass(stage(), make(1, 1, 1, 16, 16, 64, false), fa::Dtype::BF16, 1, fa::Dist::Normal, true);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    INFO("message: '" << msg << "'");
    CHECK(msg.find("one_barrier") != std::string::npos);
    CHECK(msg.find(narrow ? "tile narrow" : "ablation no_pipeline") != std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------
// 64-bit offsets: Q, O, dO, dQ of more than 2^31 elements. Only the last batch (whose
// offsets are past 2^31) is checked against the reference, on its own inputs.
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: a problem of more than 2^31 elements (64-bit offsets)") {
  if (fa::test::small_mode()) {
    MESSAGE("skipped with FA_TEST_SMALL=1");
    return;
  }
  // 2049·64·256·64 > 2^31 elements per tensor; batch and heads stay within the grid limits.
  fa::Problem p = make(2049, 64, 64, 256, 256, 64, true);
  REQUIRE(p.q_elems() > (int64_t(1) << 31));
  const fa::Dtype t = fa::Dtype::BF16;
  const size_t es = 2;
  size_t free_b = 0, total_b = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = size_t(p.q_elems()) * es * 8 + size_t(p.q_elems()) * 4 + (size_t(1) << 30);
  if (free_b < need) {
    MESSAGE("skipped: needs about " << need / (1 << 30) << " GiB of GPU memory, " << free_b / (1 << 30) << " free");
    return;
  }
  const int64_t nq = p.q_elems(), nkv = p.kv_elems();
  fa::DeviceBuffer Q(nq * es, "Q"), K(nkv * es, "K"), V(nkv * es, "V"), O(nq * es, "O"), L(p.l_elems() * 4, "L"),
      dO(nq * es, "dO"), dQ(nq * es, "dQ"), dK(nkv * es, "dK"), dV(nkv * es, "dV");
  fa::fill_random(t, Q.get(), nq, 1, nullptr);
  fa::fill_random(t, K.get(), nkv, 2, nullptr);
  fa::fill_random(t, V.get(), nkv, 3, nullptr);
  fa::fill_random(t, dO.get(), nq, 4, nullptr);
  stage().forward_device(p, t, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), nullptr);
  stage().backward_device(p, t, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), dO.get(), dQ.get(), dK.get(),
                          dV.get(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());

  // The last batch as a problem of its own: its inputs and outputs, downloaded.
  fa::Problem last = p;
  last.batch = 1;
  const int64_t q_at = p.q_offset(p.batch - 1, 0, 0), kv_at = p.kv_offset(p.batch - 1, 0, 0);
  REQUIRE(q_at >= (int64_t(1) << 31));  // past the largest 32-bit signed offset
  fa::Tensors x = fa::Tensors::make(last, 1, fa::Dist::Normal, true);
  const auto slice = [&](const fa::DeviceBuffer& b, int64_t at, std::vector<float>& host) {
    fa::download(t, static_cast<const char*>(b.get()) + at * es, host.data(), int64_t(host.size()), nullptr);
  };
  slice(Q, q_at, x.Q);
  slice(K, kv_at, x.K);
  slice(V, kv_at, x.V);
  slice(dO, q_at, x.dO);
  slice(O, q_at, x.O);
  slice(dQ, q_at, x.dQ);
  slice(dK, kv_at, x.dK);
  slice(dV, kv_at, x.dV);
  fa::download(fa::Dtype::F32, L.as<float>() + p.l_offset(p.batch - 1, 0, 0), x.L.data(), last.l_elems(), nullptr);
  const fa::CheckReport fwd = fa::compare_forward(last, t, x), bwd = fa::compare_backward(last, t, x);
  INFO(fwd.summary() << bwd.summary());
  CHECK(fwd.pass());
  CHECK(bwd.pass());
}
