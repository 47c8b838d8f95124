// Stage 10 (Hopper forward: TMA, wgmma, warp specialization, bf16/f16): the shared matrix
// for every step and both dtypes, plus what is particular to this stage.
//
// Test suite "cpu" — the key-tile schedule (tile_schedule.h) against Problem::visible_keys,
// exhaustively over small shapes: no visible key is skipped, no tile past the band is
// visited, and every tile before first_masked is visible whole to every row.
// GPU tests (compute capability 9.x): check_matrix for steps 10a–10f in bf16 and f16;
// adversarial inputs and properties (bitwise determinism, key permutation) for every step;
// refusals and random shapes for the default step (10f); the steps agree with each other
// bitwise where they should; every output element written (device outputs poisoned first);
// refusals at the device entry (nothing written); empty sequences; a non-default stream;
// the launch report; > 2³¹ elements (FA_TEST_LARGE=1).
//
// Environment: FA_TEST_SMALL=1 shrinks the cases (compute-sanitizer runs); FA_TEST_LARGE=1
// adds the > 2³¹-element case.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "hopper/tile_schedule.h"
#include "problem.h"
#include "stage_checks.h"
#include "stage_list.h"

namespace {

constexpr auto make = &fa::test::make_problem;

}  // namespace

// First rows of the query tiles: from the start (step 10a) and from the end (10b–10d,
// whose first tile may begin below row 0).
std::vector<int> tile_starts(int seq_q, int rows) {
  std::vector<int> starts;
  for (int row0 = 0; row0 < seq_q; row0 += rows) starts.push_back(row0);
  for (int row0 = seq_q - rows; row0 > -rows; row0 -= rows) starts.push_back(row0);
  return starts;
}

TEST_SUITE("cpu") {
  TEST_CASE("10: key tiles: every visible key is visited, nothing past the band, unmasked tiles are whole") {
    int checked = 0;
    for (int B_c : {64, 128})
      for (int rows : {64, 128})
        for (int seq_q : {1, 63, 64, 65, 130, 300})
          for (int seq_k : {0, 1, 63, 64, 129, 300, 513})
            for (bool causal : {false, true})
              for (int row0 : tile_starts(seq_q, rows)) {
                const fa::Problem p = make(1, 1, 1, seq_q, seq_k, 64, causal);
                const auto t = fa::stage10::key_tiles(row0, rows, seq_q, seq_k, B_c, causal);
                CAPTURE(B_c);
                CAPTURE(rows);
                CAPTURE(seq_q);
                CAPTURE(seq_k);
                CAPTURE(causal);
                CAPTURE(row0);
                REQUIRE(t.count >= 0);
                REQUIRE(t.first_masked <= t.count);
                int64_t last_needed = 0;  // keys visible to any row of the tile
                for (int i = std::max(row0, 0); i < std::min(row0 + rows, seq_q); ++i)
                  last_needed = std::max(last_needed, p.visible_keys(i));
                CHECK(t.count == (last_needed + B_c - 1) / B_c);  // every needed tile, no more
                for (int j = 0; j < t.first_masked; ++j)          // unmasked tiles: whole for every row
                  for (int i = std::max(row0, 0); i < std::min(row0 + rows, seq_q); ++i)
                    CHECK(p.visible_keys(i) >= int64_t(j + 1) * B_c);
                ++checked;
              }
    CHECK(checked > 500);
  }
}

// ======================================================================================
// On the GPU
// ======================================================================================

#ifdef FA_HAVE_CUDA
#include <cuda_runtime.h>

#include "check.h"
#include "cuda_utils.h"
#include "hopper_fwd.h"
#include "hopper_fwd_steps.h"
#include "tensors.h"

namespace {

namespace s10 = fa::stage10;

const fa::StageInfo& stage() { return fa::find_stage("10"); }

// Stage 10 runs on compute capability 9.x only; elsewhere its GPU tests say so and pass.
bool on_hopper() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major != 9) MESSAGE("skipped: stage 10 needs compute capability 9.x");
  return major == 9;
}

// Selects a step for the scope of one test through the C ABI's path, then puts auto back.
struct StepScope {
  explicit StepScope(s10::Step s) { stage().set_option("step", int64_t(s)); }
  ~StepScope() { stage().set_option("step", 0); }
};

const std::vector<s10::Step> kSteps = {s10::Step::A, s10::Step::B, s10::Step::C,
                                       s10::Step::D, s10::Step::E, s10::Step::F};

}  // namespace

// One test case per step, so that the sanitizer runs (one process per test case) share
// the work out.
void check_matrix_of(s10::Step s) {
  if (!on_hopper()) return;
  const StepScope scope(s);
  fa::test::check_matrix(stage(), fa::Dtype::BF16, false);
  fa::test::check_matrix(stage(), fa::Dtype::F16, false);
}

TEST_CASE("10: the shared shape matrix, step 10a, bf16 and f16") { check_matrix_of(s10::Step::A); }
TEST_CASE("10: the shared shape matrix, step 10b, bf16 and f16") { check_matrix_of(s10::Step::B); }
TEST_CASE("10: the shared shape matrix, step 10c, bf16 and f16") { check_matrix_of(s10::Step::C); }
TEST_CASE("10: the shared shape matrix, step 10d, bf16 and f16") { check_matrix_of(s10::Step::D); }
TEST_CASE("10: the shared shape matrix, step 10e, bf16 and f16") { check_matrix_of(s10::Step::E); }
TEST_CASE("10: the shared shape matrix, step 10f (the default), bf16 and f16") { check_matrix_of(s10::Step::F); }

TEST_CASE("10: adversarial inputs (large logits, empty rows, constant rows, NaN), every step") {
  if (!on_hopper()) return;
  for (s10::Step s : kSteps) {
    const StepScope scope(s);
    CAPTURE(s10::step_names()[size_t(s)]);
    fa::test::check_adversarial(stage(), fa::Dtype::BF16, false);
    fa::test::check_adversarial(stage(), fa::Dtype::F16, false);
  }
}

TEST_CASE("10: properties (key permutation, bitwise determinism), every step") {
  if (!on_hopper()) return;
  for (s10::Step s : kSteps) {
    const StepScope scope(s);
    CAPTURE(s10::step_names()[size_t(s)]);
    fa::test::check_properties(stage(), fa::Dtype::BF16, false);
    fa::test::check_properties(stage(), fa::Dtype::F16, false);
  }
}

TEST_CASE("10: refusals, bf16 and f16") {
  if (!on_hopper()) return;
  fa::test::check_refusals(stage(), fa::Dtype::BF16);
  fa::test::check_refusals(stage(), fa::Dtype::F16);
}

TEST_CASE("10: random shapes, bf16 and f16") {
  if (!on_hopper()) return;
  fa::test::check_random_shapes(stage(), fa::Dtype::BF16, false, fa::test::small_mode() ? 4 : 24);
  fa::test::check_random_shapes(stage(), fa::Dtype::F16, false, fa::test::small_mode() ? 4 : 24);
}

TEST_CASE("10: steps 10d, 10e and 10f give the same bits, and so do 10b and 10c (same tiles, same order of operations)") {
  // Within each group the steps differ only in when the products are issued and waited for,
  // or in which block computes a query tile, never in what is added to what: a schedule bug
  // that reads a buffer too early, or a scheduler that skips a tile (the outputs start as
  // NaN), would break the equality. (10b/10c and 10d–10f differ at d = 64, where 10d–10f
  // have three consumers and B_r = 192.) The last shape has 256 query tiles, more than an
  // H100's 132 SMs, so the persistent blocks take tiles from their schedulers.
  if (!on_hopper()) return;
  for (const auto& p : {make(2, 4, 2, 300, 513, 128, true), make(1, 2, 1, 257, 1000, 64, false),
                        make(1, 2, 2, 190, 190, 256, true), make(4, 8, 2, 1000, 1000, 128, true)}) {
    std::vector<std::vector<float>> outs;
    for (s10::Step s : {s10::Step::B, s10::Step::C, s10::Step::D, s10::Step::E, s10::Step::F}) {
      const StepScope scope(s);
      fa::Tensors t = fa::Tensors::make(p, 17, fa::Dist::Normal, false);
      stage().forward(p, fa::Dtype::BF16, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
      t.O.insert(t.O.end(), t.L.begin(), t.L.end());
      outs.push_back(t.O);
    }
    CHECK(fa::test::bitwise_equal(outs[0], outs[1]));
    CHECK(fa::test::bitwise_equal(outs[2], outs[3]));
    CHECK(fa::test::bitwise_equal(outs[2], outs[4]));
    if (p.head_dim != 64) CHECK(fa::test::bitwise_equal(outs[0], outs[2]));
  }
}

TEST_CASE("10: the step option: names, bounds, per thread") {
  CHECK(s10::step_names() == std::vector<std::string>{"auto", "10a", "10b", "10c", "10d", "10e", "10f"});
  CHECK_THROWS_AS(stage().set_option("step", 7), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("step", -1), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("tile", 1), std::invalid_argument);
  stage().set_option("step", 2);
  CHECK(stage().get_counter("step") == 2);
  stage().set_option("step", 0);
}

TEST_CASE("10: the device entry point refuses bad input and writes nothing") {
  if (!on_hopper()) return;
  const fa::Problem p = make(1, 2, 1, 70, 50, 64, false);
  fa::DeviceBuffer Q(p.q_elems() * 2 + 16, "Q"), K(p.kv_elems() * 2 + 16, "K"), V(p.kv_elems() * 2 + 16, "V"),
      O(p.q_elems() * 2 + 16, "O"), L(p.l_elems() * 4 + 16, "L");
  for (auto* b : {&Q, &K, &V, &O, &L}) FA_CUDA_CHECK(cudaMemset(b->get(), 0x7f, b->bytes()));
  const auto refused = [&](const fa::Problem& q, fa::Dtype t, const void* q_ptr, const void* k_ptr, void* o_ptr,
                           float* l_ptr, const std::string& fragment) {
    bool thrown = false;
    try {
      s10::forward(q, t, q_ptr, k_ptr, V.get(), o_ptr, l_ptr, nullptr);
    } catch (const std::invalid_argument& e) {
      thrown = true;
      INFO(e.what());
      CHECK(std::string(e.what()).find(fragment) != std::string::npos);
      CHECK(std::string(e.what()).find("10_hopper_fwd") != std::string::npos);
    }
    CHECK_MESSAGE(thrown, "expected a refusal naming '" << fragment << "'");
  };
  const auto bf = fa::Dtype::BF16;
  float* Lp = L.as<float>();
  refused(p, bf, Q.as<char>() + 8, K.get(), O.get(), Lp, "pointer Q");
  refused(p, bf, Q.get(), K.as<char>() + 2, O.get(), Lp, "pointer K");
  refused(p, bf, Q.get(), K.get(), O.as<char>() + 4, Lp, "16-byte aligned");
  refused(p, bf, Q.get(), K.get(), O.get(), reinterpret_cast<float*>(L.as<char>() + 2), "pointer L");
  refused(p, bf, nullptr, K.get(), O.get(), Lp, "NULL");
  refused(p, fa::Dtype::F32, Q.get(), K.get(), O.get(), Lp, "dtype f32");
  for (int d : {16, 32, 96, 128 + 64, 512}) {
    fa::Problem bad = p;
    bad.head_dim = d;
    refused(bad, bf, Q.get(), K.get(), O.get(), Lp, "head_dim = " + std::to_string(d));
    refused(bad, bf, Q.get(), K.get(), O.get(), Lp, "supported: 64, 128, 256");
  }
  fa::Problem bad = p;
  bad.kv_heads = 3;
  refused(bad, bf, Q.get(), K.get(), O.get(), Lp, "kv_heads = 3");
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto* b : {&O, &L}) {
    std::vector<unsigned char> bytes(b->bytes());
    FA_CUDA_CHECK(cudaMemcpy(bytes.data(), b->get(), bytes.size(), cudaMemcpyDeviceToHost));
    CHECK(std::all_of(bytes.begin(), bytes.end(), [](unsigned char x) { return x == 0x7f; }));
  }
}

TEST_CASE("10: empty sequences: seq_q = 0 launches nothing, seq_k = 0 gives O = 0 and L = -inf") {
  if (!on_hopper()) return;
  CHECK_NOTHROW(s10::forward(make(1, 2, 1, 0, 64, 64, false), fa::Dtype::BF16, nullptr, nullptr, nullptr, nullptr,
                             nullptr, nullptr));
  for (s10::Step s : kSteps) {
    const StepScope scope(s);
    const fa::Problem p = make(2, 2, 1, 70, 0, 128, true);
    fa::DeviceBuffer Q(p.q_elems() * 2, "Q"), O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L");
    FA_CUDA_CHECK(cudaMemset(O.get(), 0x7f, O.bytes()));
    fa::fill_random(fa::Dtype::BF16, Q.get(), p.q_elems(), 3, nullptr);
    s10::forward(p, fa::Dtype::BF16, Q.get(), nullptr, nullptr, O.get(), L.as<float>(), nullptr);
    std::vector<float> o(size_t(p.q_elems())), l(size_t(p.l_elems()));
    fa::download(fa::Dtype::BF16, O.get(), o.data(), p.q_elems(), nullptr);
    fa::download(fa::Dtype::F32, L.get(), l.data(), p.l_elems(), nullptr);
    CAPTURE(s10::step_names()[size_t(s)]);
    CHECK(std::all_of(o.begin(), o.end(), [](float x) { return x == 0.0f; }));
    CHECK(std::all_of(l.begin(), l.end(), [](float x) { return x == -std::numeric_limits<float>::infinity(); }));
  }
}

TEST_CASE("10: every element of O and L is written (device outputs poisoned with NaN first), every step") {
  // seq_q > seq_k under the causal mask: the first 40 rows see no key (O = 0, L = −inf), the
  // rest see a ragged number; 3 query tiles of 128 (2 of 192) with a partial one. A row or
  // column the kernel forgot would keep its NaN, or its O = 0 would be read from memory that
  // was never written.
  if (!on_hopper()) return;
  for (int d : {64, 128, 256})
    for (s10::Step s : kSteps) {
      const StepScope scope(s);
      const fa::Problem p = make(2, 4, 2, 300, 260, d, true);
      fa::Tensors t = fa::Tensors::make(p, 23, fa::Dist::Normal, false);
      fa::DeviceBuffer Q(p.q_elems() * 2, "Q"), K(p.kv_elems() * 2, "K"), V(p.kv_elems() * 2, "V"),
          O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L");
      fa::upload(fa::Dtype::BF16, t.Q.data(), Q.get(), p.q_elems(), nullptr);
      fa::upload(fa::Dtype::BF16, t.K.data(), K.get(), p.kv_elems(), nullptr);
      fa::upload(fa::Dtype::BF16, t.V.data(), V.get(), p.kv_elems(), nullptr);
      FA_CUDA_CHECK(cudaMemset(O.get(), 0xff, O.bytes()));  // 0xffff is a bf16 NaN, 0xffffffff an fp32 NaN
      FA_CUDA_CHECK(cudaMemset(L.get(), 0xff, L.bytes()));
      s10::forward(p, fa::Dtype::BF16, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), nullptr);
      std::vector<float> o(size_t(p.q_elems())), l(size_t(p.l_elems()));
      fa::download(fa::Dtype::BF16, O.get(), o.data(), p.q_elems(), nullptr);
      fa::download(fa::Dtype::F32, L.get(), l.data(), p.l_elems(), nullptr);
      CAPTURE(d);
      CAPTURE(s10::step_names()[size_t(s)]);
      CHECK(std::none_of(o.begin(), o.end(), [](float x) { return std::isnan(x); }));
      CHECK(std::none_of(l.begin(), l.end(), [](float x) { return std::isnan(x); }));
      for (int64_t bh = 0; bh < int64_t(p.batch) * p.heads; ++bh)
        for (int64_t i = 0; i < p.seq_q; ++i) {
          const bool sees_none = p.visible_keys(i) == 0;
          if (sees_none) CHECK(l[size_t(bh * p.seq_q + i)] == -std::numeric_limits<float>::infinity());
          if (!sees_none) CHECK(std::isfinite(l[size_t(bh * p.seq_q + i)]));
        }
    }
}

TEST_CASE("10: device pointers on a non-default stream give the host path's result") {
  if (!on_hopper()) return;
  const fa::Problem p = make(1, 4, 2, 200, 333, 128, true);
  fa::Tensors t = fa::Tensors::make(p, 9, fa::Dist::Normal, false);
  stage().forward(p, fa::Dtype::BF16, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
  cudaStream_t stream;
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fa::DeviceBuffer Q(p.q_elems() * 2, "Q"), K(p.kv_elems() * 2, "K"), V(p.kv_elems() * 2, "V"),
      O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L");
  fa::upload(fa::Dtype::BF16, t.Q.data(), Q.get(), p.q_elems(), stream);
  fa::upload(fa::Dtype::BF16, t.K.data(), K.get(), p.kv_elems(), stream);
  fa::upload(fa::Dtype::BF16, t.V.data(), V.get(), p.kv_elems(), stream);
  s10::forward(p, fa::Dtype::BF16, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), stream);
  std::vector<float> o(size_t(p.q_elems())), l(size_t(p.l_elems()));
  fa::download(fa::Dtype::BF16, O.get(), o.data(), p.q_elems(), stream);
  fa::download(fa::Dtype::F32, L.get(), l.data(), p.l_elems(), stream);
  FA_CUDA_CHECK(cudaStreamDestroy(stream));
  CHECK(std::memcmp(o.data(), t.O.data(), o.size() * 4) == 0);
  CHECK(std::memcmp(l.data(), t.L.data(), l.size() * 4) == 0);
}

TEST_CASE("10: launch report") {
  if (!on_hopper()) return;
  std::string all;
  for (const auto& [key, value] : stage().report(make(2, 3, 1, 130, 64, 128, true), fa::Dtype::BF16))
    all += key + ": " + value + "\n";
  INFO(all);
  CHECK(all.find("10f (auto)") != std::string::npos);
  // auto's rule (launch.cpp, resolve): 10a at d = 64 with at most 1024 keys, else 10f.
  for (const auto& [p, step] : {std::pair{make(1, 2, 2, 2048, 1024, 64, true), "10a (auto)"},
                                std::pair{make(1, 2, 2, 300, 1025, 64, false), "10f (auto)"},
                                std::pair{make(1, 2, 2, 1024, 1024, 128, false), "10f (auto)"}}) {
    std::string rows;
    for (const auto& [key, value] : stage().report(p, fa::Dtype::BF16)) rows += key + ": " + value + "\n";
    CAPTURE(rows);
    CHECK(rows.find(std::string("step: ") + step) != std::string::npos);
  }
  CHECK(all.find("B_r = 128, B_c = 128, 2 K/V stages") != std::string::npos);
  CHECK(all.find("grid: 12 x 1 x 1") != std::string::npos);  // persistent: ceil(130 / 128)·3 heads·2 batch tiles < SMs
  {
    const StepScope scope(s10::Step::D);  // one block per query tile
    std::string d_rows;
    for (const auto& [key, value] : stage().report(make(2, 3, 1, 130, 64, 128, true), fa::Dtype::BF16))
      d_rows += key + ": " + value + "\n";
    INFO(d_rows);
    CHECK(d_rows.find("grid: 2 x 3 x 2") != std::string::npos);  // query tiles, heads, batch
  }
  CHECK(all.find("registers") != std::string::npos);
}

TEST_CASE("10: a tensor of more than 2^31 elements (FA_TEST_LARGE=1)") {
  if (!fa::test::env_flag("FA_TEST_LARGE")) {
    MESSAGE("skipped: set FA_TEST_LARGE=1 to run (needs about 9 GB of GPU memory)");
    return;
  }
  if (!on_hopper()) return;
  for (bool causal : {false, true}) {
    const fa::Problem p = make(1, 1, 1, (1 << 24) + 77, 300, 128, causal);  // run by the default step, 10f
    REQUIRE(p.q_elems() > (int64_t(1) << 31));
    fa::DeviceBuffer Q(p.q_elems() * 2, "Q"), K(p.kv_elems() * 2, "K"), V(p.kv_elems() * 2, "V"),
        O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L");
    fa::Tensors kv = fa::Tensors::make(make(1, 1, 1, 1, 300, 128, false), 5, fa::Dist::Normal, false);
    fa::upload(fa::Dtype::BF16, kv.K.data(), K.get(), p.kv_elems(), nullptr);
    fa::upload(fa::Dtype::BF16, kv.V.data(), V.get(), p.kv_elems(), nullptr);
    fa::download(fa::Dtype::BF16, K.get(), kv.K.data(), p.kv_elems(), nullptr);
    fa::download(fa::Dtype::BF16, V.get(), kv.V.data(), p.kv_elems(), nullptr);
    fa::fill_random(fa::Dtype::BF16, Q.get(), p.q_elems(), 77, nullptr);
    s10::forward(p, fa::Dtype::BF16, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    CAPTURE(causal);
    fa::test::check_row_window(p, fa::Dtype::BF16, 0, 64, kv.K, kv.V, Q.get(), O.get(), L.as<float>());
    fa::test::check_row_window(p, fa::Dtype::BF16, p.seq_q - 64, 64, kv.K, kv.V, Q.get(), O.get(), L.as<float>());
  }
}

// The step table in the common contract (step_kernel.h): every step names B_r, B_c and its
// buffers per head dim, and refuses what it is not built for. Host code only: no GPU needed.
TEST_SUITE("cpu") {
  TEST_CASE("10: the step tables: B_r, B_c, buffers and threads per head dim; refusals name the step") {
    using StepFn = fa::StepKernel (*)(int, fa::Dtype, bool);
    const StepFn steps[] = {s10::step_10a, s10::step_10b, s10::step_10c,
                            s10::step_10d, s10::step_10e, s10::step_10f};
    for (int d : {64, 128, 256})
      for (int i = 0; i < 6; ++i) {
        CAPTURE(d);
        CAPTURE(i);
        const fa::StepKernel k = steps[i](d, fa::Dtype::BF16, true);
        const int consumers = i >= 3 && d == 64 ? 3 : 2;  // 10d–10f: a third consumer at d = 64
        CHECK(k.fn != nullptr);
        CHECK(k.fn != steps[i](d, fa::Dtype::BF16, false).fn);  // causal and plain instances
        CHECK(k.block_rows == (i == 0 ? 64 : 64 * consumers));
        CHECK(k.block_cols == (d == 256 ? 80 : 128));
        CHECK(k.stages == (i == 0 || d != 64 ? 2 : 4));
        CHECK(k.threads == (i == 0 ? 128 : 128 * (1 + consumers)));
        CHECK(k.persistent == (i >= 4));
        CHECK(k.smem_bytes > 0);
      }
    CHECK_THROWS_WITH_AS(s10::step_10b(96, fa::Dtype::BF16, false),
                         "10_hopper_fwd: step 10b has no kernel for head_dim = 96 (built: 64, 128, 256)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(s10::step_10e(64, fa::Dtype::F32, false), "10_hopper_fwd: step 10e takes bf16 or f16",
                         std::invalid_argument);
  }
}

#endif  // FA_HAVE_CUDA
