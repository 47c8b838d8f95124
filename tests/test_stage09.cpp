// Stage 09 (tensor-core backward) against the shared matrix (docs/design.md §6), in bf16 and fp16
// and in every step (option `step`: 09a dQ by a second pass, 09b dQ by atomics, 09c the 4 × 2
// warp grid), plus its own checks: step 09a is bitwise reproducible, stage 08's forward
// followed by stage 09's backward gives the reference's gradients, the device entry point
// refuses bad pointers without writing, the query-tile arithmetic and the warp grids are
// exact, and one problem of more than 2^31 elements runs (64-bit offsets). Needs a GPU
// (exits 77 without one), except the suite "cpu".
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
#include "bwd_traits.cuh"
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

s09::Options step(s09::Step st) {
  s09::Options o;
  o.step = st;
  return o;
}
/// Step 09a: dQ by a second kernel, bitwise reproducible.
s09::Options deterministic() { return step(s09::Step::DqPass); }

}  // namespace

// ---------------------------------------------------------------------------------------
// The shared matrix, both dtypes, the default (auto: 09b at d = 64, 09c at d = 128) and
// step 09a (check_backward runs the stage's forward, which is stage 08's, then this
// backward, and compares O, L, dQ, dK, dV). Steps 09b and 09c at the head dim auto does
// not give them: "steps forced" below.
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: shape matrix, bf16, dQ by atomics") { fa::test::check_matrix(stage(), fa::Dtype::BF16, true); }
TEST_CASE("stage 09: shape matrix, f16, dQ by atomics") { fa::test::check_matrix(stage(), fa::Dtype::F16, true); }
TEST_CASE("stage 09: shape matrix, bf16, step 09a (deterministic dQ)") {
  OptionsScope scope(deterministic());
  fa::test::check_matrix(stage(), fa::Dtype::BF16, true);
}
TEST_CASE("stage 09: shape matrix, f16, step 09a (deterministic dQ)") {
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
// Determinism: step 09a gives bitwise the same dQ, dK, dV twice, on shapes
// where many key tiles (and, for dK/dV, many query heads) add into each result.
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: step 09a is bitwise reproducible") {
  OptionsScope scope(deterministic());
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      const fa::Problem p = make(2, 8, 2, 333, fa::test::small_mode() ? 300 : 1000, d, causal);
      for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16}) {
        INFO(std::string(fa::dtype_name(t)) << " " << p.describe());
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
        // Options::deterministic (for callers that need reproducible bits, not a step) runs
        // 09a whatever the step says: the same bits through the device entry point.
        {
          s09::Options any_step = step(s09::Step::WarpGrid);
          any_step.deterministic = true;
          const size_t es = 2;
          fa::DeviceBuffer Qd(p.q_elems() * es, "Q"), Kd(p.kv_elems() * es, "K"), Vd(p.kv_elems() * es, "V"),
              Od(p.q_elems() * es, "O"), Ld(p.l_elems() * 4, "L"), dOd(p.q_elems() * es, "dO"),
              dQd(p.q_elems() * es, "dQ"), dKd(p.kv_elems() * es, "dK"), dVd(p.kv_elems() * es, "dV");
          fa::upload(t, x.Q.data(), Qd.get(), p.q_elems(), nullptr);
          fa::upload(t, x.K.data(), Kd.get(), p.kv_elems(), nullptr);
          fa::upload(t, x.V.data(), Vd.get(), p.kv_elems(), nullptr);
          fa::upload(t, x.O.data(), Od.get(), p.q_elems(), nullptr);
          fa::upload(fa::Dtype::F32, x.L.data(), Ld.get(), p.l_elems(), nullptr);
          fa::upload(t, x.dO.data(), dOd.get(), p.q_elems(), nullptr);
          s09::backward(p, t, Qd.get(), Kd.get(), Vd.get(), Od.get(), Ld.as<float>(), dOd.get(), dQd.get(), dKd.get(),
                        dVd.get(), nullptr, any_step);
          std::vector<float> dQ2(x.dQ.size()), dK2(x.dK.size()), dV2(x.dV.size());
          fa::download(t, dQd.get(), dQ2.data(), p.q_elems(), nullptr);
          fa::download(t, dKd.get(), dK2.data(), p.kv_elems(), nullptr);
          fa::download(t, dVd.get(), dV2.data(), p.kv_elems(), nullptr);
          CHECK(bitwise_equal(dQ[0], dQ2));
          CHECK(bitwise_equal(dK[0], dK2));
          CHECK(bitwise_equal(dV[0], dV2));
        }
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

TEST_CASE("stage 09: atomic dQ (auto) and step 09a agree within tolerance; dK, dV reproducible with atomics") {
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
      INFO(std::string(fa::dtype_name(t)) << " " << p.describe());
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

TEST_CASE("stage 09: options by name" * doctest::test_suite("cpu")) {
  OptionsScope scope(s09::Options{});
  CHECK(s09::current_options().step == s09::Step::Auto);
  CHECK(s09::step_names() == std::vector<std::string>{"auto", "09a", "09b", "09c"});
  for (int k = 1; k <= 3; ++k) {
    stage().set_option("step", k);
    CHECK(stage().get_counter("step") == k);
    CHECK(s09::current_options().step == s09::Step(k));
  }
  stage().set_option("step", 0);
  CHECK(s09::current_options().step == s09::Step::Auto);
  CHECK_THROWS_AS(stage().set_option("step", 4), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("step", -1), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("no_such_option", 0), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// Which query tiles a key tile visits (bwd_tile_index.h), exhaustively against
// Problem::visible_keys on small problems.
// ---------------------------------------------------------------------------------------

TEST_CASE("stage 09: query_tile_range and visible_query_columns agree with Problem::visible_keys" *
          doctest::test_suite("cpu")) {
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
// The warp grids of the dK/dV kernel (bwd_traits.cuh), on the host. For the 8 × 1 grid of
// steps 09a, 09b and the 4 × 2 grid of step 09c at both head dims: the warps' Sᵀ fragments (C fragments: the
// thread (g, t) of warp w holds key warp_key0(w) + 16mi + g + 8h, query warp_q0(w) + 8nt +
// 2t + e) cover the [B_c, B_r] tile exactly once, and their Elem stores (smem_offset, as
// store_c_fragments writes them) hit every element of the Pᵀ / dSᵀ tile exactly once; the
// dK_j, dV_j fragments (columns warp_col0(w) + 8dt + 2t + e) cover [B_c, d] exactly once,
// and so do the epilogue's stores into the K_j, V_j buffers. 09c keeps 09b's registers per
// thread and its shared memory is what the notes say.
// ---------------------------------------------------------------------------------------

namespace {

template <class Tr>
void check_warp_grid() {
  constexpr int B_c = Tr::kBlockN, B_r = Tr::kBlockM, d = Tr::kHeadDim;
  INFO("d = " << d << ", B_r = " << B_r << ", B_c = " << B_c << ", warps " << Tr::kWarpsKeys << " x "
              << Tr::kWarpsSplit);
  std::vector<int> s_seen(B_c * B_r, 0), s_stored(B_c * B_r, 0), kv_seen(B_c * d, 0), kv_stored(B_c * d, 0);
  for (int w = 0; w < Tr::kWarps; ++w)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int mi = 0; mi < Tr::kKeyTiles; ++mi)
        for (int h = 0; h < 2; ++h)
          for (int e = 0; e < 2; ++e) {
            const int key = Tr::warp_key0(w) + 16 * mi + g + 8 * h;
            REQUIRE(key < B_c);
            for (int nt = 0; nt < Tr::kQueriesPerWarp / 8; ++nt) {
              const int q = Tr::warp_q0(w) + 8 * nt + 2 * t + e;
              REQUIRE(q < B_r);
              ++s_seen[key * B_r + q];
              const int at = fa::stage08::smem_offset(key, q / 8, B_r, Tr::kLayout) + q % 8;
              REQUIRE(at < B_c * B_r);
              ++s_stored[at];
            }
            for (int dt = 0; dt < Tr::kColsPerWarp / 8; ++dt) {
              const int c = Tr::warp_col0(w) + 8 * dt + 2 * t + e;
              REQUIRE(c < d);
              ++kv_seen[key * d + c];
              const int at = fa::stage08::smem_offset(key, c / 8, d, Tr::kLayout) + c % 8;
              REQUIRE(at < B_c * d);
              ++kv_stored[at];
            }
          }
    }
  const auto once = [](const std::vector<int>& v) {
    return std::all_of(v.begin(), v.end(), [](int n) { return n == 1; });
  };
  CHECK_MESSAGE(once(s_seen), "the warps' Sᵀ blocks do not tile [B_c, B_r] exactly once");
  CHECK_MESSAGE(once(s_stored), "the Pᵀ / dSᵀ stores do not hit every element of the tile exactly once");
  CHECK_MESSAGE(once(kv_seen), "the warps' dK_j, dV_j blocks do not tile [B_c, d] exactly once");
  CHECK_MESSAGE(once(kv_stored), "the epilogue's stores do not hit every element of [B_c, d] exactly once");
}

template <class Tr, class Base>
void check_same_registers() {
  // fp32 accumulators per thread: Sᵀ (and dPᵀ) of one step, dK_j (and dV_j) of the kernel.
  constexpr int st = Tr::kKeyTiles * Tr::kQueriesPerWarp / 8 * 4;
  constexpr int acc = Tr::kKeyTiles * Tr::kColsPerWarp / 8 * 4;
  constexpr int st0 = Base::kKeyTiles * Base::kQueriesPerWarp / 8 * 4;
  constexpr int acc0 = Base::kKeyTiles * Base::kColsPerWarp / 8 * 4;
  CHECK(st == st0);
  CHECK(acc == acc0);
}

}  // namespace

TEST_CASE("stage 09: the warp grids of every step cover their tiles exactly once" * doctest::test_suite("cpu")) {
  using T64 = s09::DefaultTiles<64>;
  using T128 = s09::DefaultTiles<128>;
  check_warp_grid<T64::DkDv>();
  check_warp_grid<T128::DkDv>();
  check_warp_grid<T64::DkDvPSmem>();
  check_warp_grid<T128::DkDvPSmem>();
  static_assert(!T64::DkDv::kPInSmem && !T128::DkDv::kPInSmem && T64::DkDvPSmem::kPInSmem &&
                T128::DkDvPSmem::kPInSmem);
  // The same B_r, B_c and warps as steps 09a and 09b, the same registers per thread.
  check_same_registers<T64::DkDvPSmem, T64::DkDv>();
  check_same_registers<T128::DkDvPSmem, T128::DkDv>();
  CHECK(T64::DkDvPSmem::kBlockM == T64::DkDv::kBlockM);
  CHECK(T128::DkDvPSmem::kBlockN == T128::DkDv::kBlockN);
  // Shared memory: 09b's plus one Pᵀ tile [B_c, B_r] of 16-bit elements.
  CHECK(T64::DkDv::kSmemBytes == 130 * 1024);
  CHECK(T64::DkDvPSmem::kSmemBytes == 162 * 1024);
  CHECK(T128::DkDv::kSmemBytes == 145 * 1024);
  CHECK(T128::DkDvPSmem::kSmemBytes == 161 * 1024);
}

// In step 09c a warp masks its block of Sᵀ as a query tile of its own: kQueriesPerWarp
// columns from q0 + warp_q0 (the kernel's mask call). That must keep exactly the columns
// the whole tile's mask keeps, on every key of every visited tile.
TEST_CASE("stage 09: a warp's block of queries is masked like its columns of the whole tile" *
          doctest::test_suite("cpu")) {
  for (int d : {64, 128}) {
    const int B_r = d == 64 ? s09::DefaultTiles<64>::DkDvPSmem::kBlockM : s09::DefaultTiles<128>::DkDvPSmem::kBlockM;
    const int B_c = d == 64 ? s09::DefaultTiles<64>::DkDvPSmem::kBlockN : s09::DefaultTiles<128>::DkDvPSmem::kBlockN;
    const int splits = d == 64 ? s09::DefaultTiles<64>::DkDvPSmem::kWarpsSplit
                               : s09::DefaultTiles<128>::DkDvPSmem::kWarpsSplit;
    const int qw = B_r / splits;
    for (bool causal : {false, true})
      for (int seq_q : {1, 20, 64, 84, 150, 200, 257, 333})
        for (int seq_k : {1, 77, 128, 150, 200, 333}) {
          INFO("d = " << d << " causal = " << causal << " seq_q = " << seq_q << " seq_k = " << seq_k);
          int64_t wrong = 0;
          for (int64_t key0 = 0; key0 < seq_k; key0 += B_c) {
            const s09::QueryTileRange r = s09::query_tile_range(key0, B_c, B_r, seq_q, seq_k, causal);
            for (int i = r.begin; i < r.end; ++i) {
              const int64_t q0 = int64_t(i) * B_r;
              for (int64_t key = key0; key < key0 + B_c; ++key) {
                const s09::QueryColumns tile = s09::visible_query_columns(key, q0, B_r, seq_q, seq_k, causal);
                for (int ws = 0; ws < splits; ++ws) {
                  const s09::QueryColumns c = s09::visible_query_columns(key, q0 + ws * qw, qw, seq_q, seq_k, causal);
                  for (int col = 0; col < qw; ++col) {
                    const int tile_col = ws * qw + col;
                    wrong += (col >= c.begin && col < c.end) != (tile_col >= tile.begin && tile_col < tile.end);
                  }
                }
              }
            }
          }
          CHECK(wrong == 0);
        }
  }
}

// ---------------------------------------------------------------------------------------
// Every step, forced at both head dims and in both dtypes.
// ---------------------------------------------------------------------------------------

// Every problem `shapes(d)` lists, in bf16 and fp16, at d = 64 and 128, under step `st`,
// against the reference backward; the input seeds count up from `seed`.
template <class Shapes>
void expect_step_pass(s09::Step st, uint64_t seed, Shapes shapes) {
  OptionsScope scope(step(st));
  INFO("step " << s09::step_names()[size_t(st)]);
  for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16})
    for (int d : {64, 128})
      for (const fa::Problem& p : shapes(d)) fa::test::expect_pass(stage(), p, t, seed++, fa::Dist::Normal, true);
}

// Lengths that give 1, 2 and many steps per block; GQA (the steps cross heads); ragged last
// query tiles or causal diagonals that end inside one warp's half of the queries in 09c
// (B_r = 64 at d = 128, 128 at d = 64: 20, 84, 150, 200 queries); rows that see no key
// (causal, N_q > N_k); several key tiles with a ragged last one (N_k = 333).
TEST_CASE("stage 09: every step is correct on tails, causal diagonals and GQA (both dtypes)") {
  uint64_t seed = 600;
  for (s09::Step st : {s09::Step::DqPass, s09::Step::DqAtomics, s09::Step::WarpGrid}) {
    expect_step_pass(st, seed, [](int d) {
      return std::vector<fa::Problem>{
          make(1, 4, 2, 300, 77, d, true),   make(2, 2, 2, 255, 255, d, false), make(1, 2, 1, 97, 513, d, true),
          make(1, 8, 2, 128, 128, d, true),  make(1, 1, 1, 1, 1, d, false),     make(1, 2, 2, 1000, 130, d, false),
          make(1, 2, 1, 20, 333, d, true),   make(1, 2, 1, 84, 84, d, true),    make(1, 2, 1, 150, 333, d, true),
          make(1, 4, 2, 200, 150, d, true),  make(1, 2, 2, 333, 200, d, false), make(1, 2, 1, 64, 64, d, true)};
    });
    seed += 100;
  }
}

// The atomic steps on the same inputs pass; their dK and dV are bitwise reproducible (only
// dQ's atomics depend on the order of blocks).
TEST_CASE("stage 09: steps 09b and 09c agree with the reference; their dK, dV are reproducible") {
  const fa::Problem p = make(1, 4, 2, 257, 300, 128, true);
  const fa::Dtype t = fa::Dtype::BF16;
  fa::Tensors x = fa::Tensors::make(p, 45, fa::Dist::Normal, true);
  stage().forward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
  for (s09::Step st : {s09::Step::DqAtomics, s09::Step::WarpGrid}) {
    INFO("step " << s09::step_names()[size_t(st)]);
    fa::Tensors y = x, y2 = x;
    OptionsScope scope(step(st));
    for (fa::Tensors* z : {&y, &y2})
      stage().backward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(), x.dO.data(),
                       z->dQ.data(), z->dK.data(), z->dV.data());
    const fa::CheckReport r = fa::compare_backward(p, t, y);
    INFO(r.summary());
    CHECK(r.pass());
    CHECK_MESSAGE(bitwise_equal(y.dK, y2.dK), "dK differs between two runs");
    CHECK_MESSAGE(bitwise_equal(y.dV, y2.dV), "dV differs between two runs");
  }
}

// Each atomic step forced at both head dims (auto, the default, runs 09c at d = 128 and 09b
// at d = 64, so each also gets the head dim auto never gives it) through the shared matrix
// and the adversarial inputs (every length from 1 to 1025, N_q ≠ N_k, GQA; large logits,
// empty sequences, constant and NaN rows): 09b in bf16, 09c in f16 and bf16.
TEST_CASE("stage 09: shape matrix and adversarial inputs, steps 09b and 09c forced") {
  const std::pair<s09::Step, fa::Dtype> runs[] = {{s09::Step::DqAtomics, fa::Dtype::BF16},
                                                  {s09::Step::WarpGrid, fa::Dtype::F16},
                                                  {s09::Step::WarpGrid, fa::Dtype::BF16}};
  for (const auto& [st, t] : runs) {
    OptionsScope scope(step(st));
    INFO("step " << s09::step_names()[size_t(st)] << ", " << fa::dtype_name(t));
    fa::test::check_matrix(stage(), t, true);
    fa::test::check_adversarial(stage(), t, true);
  }
}

// Step auto's choice, read back from the launch report (decided on the host, no GPU needed).
TEST_CASE("stage 09: step auto takes 09c at d = 128 and 09b at d = 64" * doctest::test_suite("cpu")) {
  auto rows = [](int d, const s09::Options& o) {
    OptionsScope scope(o);
    std::string all;
    for (const auto& [key, value] : s09::launch_report(make(1, 2, 2, 256, 256, d, false), fa::Dtype::BF16, false))
      all += key + ": " + value + "\n";
    return all;
  };
  const s09::Options automatic;
  CHECK(rows(128, automatic).find("step: 09c (auto)") != std::string::npos);
  CHECK(rows(128, automatic).find("warp grid 4 (keys) x 2") != std::string::npos);
  CHECK(rows(64, automatic).find("step: 09b (auto)") != std::string::npos);
  CHECK(rows(64, automatic).find("Pᵀ and dSᵀ in registers") != std::string::npos);
  CHECK(rows(64, automatic).find("fp32 atomicAdd") != std::string::npos);
  CHECK(rows(128, step(s09::Step::DqPass)).find("step: 09a\n") != std::string::npos);
  CHECK(rows(128, step(s09::Step::DqPass)).find("a second kernel") != std::string::npos);
  CHECK(rows(128, step(s09::Step::DqAtomics)).find("Pᵀ and dSᵀ in registers") != std::string::npos);
  CHECK(rows(64, step(s09::Step::WarpGrid)).find("warp grid 4 (keys) x 2") != std::string::npos);
  // Scratch: L2 and D per padded query row, plus dQ_accum with the atomics (256 rows here).
  CHECK(rows(64, step(s09::Step::DqPass)).find("scratch: " + std::to_string(2 * 2 * 256 * 4) + " B") !=
        std::string::npos);
  CHECK(rows(64, automatic).find("scratch: " + std::to_string(2 * 66 * 256 * 4) + " B") != std::string::npos);
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
