// Stage 07 (shared-memory fp32 CUDA kernel): the shared matrix, plus what is particular to
// a GPU kernel: every step (option `step`), both key-tile widths and both shared-memory
// layouts (options `block_k`, `smem_layout`), bitwise determinism, the device entry point's
// refusals, a non-default stream, the launch report, and a tensor of more than 2³¹ elements
// (FA_TEST_LARGE=1; about 17 GB of GPU memory).
//
// Without a GPU only the test suite "cpu" runs (refusals and launch shapes, which are decided
// before the device is touched). Environment: FA_TEST_SMALL=1 shrinks every case (for
// compute-sanitizer runs); FA_TEST_LARGE=1 adds the > 2³¹-element case.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "stage_checks.h"
#include "stage_list.h"

#ifdef FA_HAVE_CUDA
#include "check.h"
#include "cuda_utils.h"
#include "smem_cuda.h"
#include "tensors.h"

namespace {

constexpr auto make = &fa::test::make_problem;

const fa::StageInfo& stage() { return fa::find_stage("07"); }



namespace s07 = fa::stage07;

// Sets the stage's options for the scope of one test, then restores the defaults.
struct OptionsScope {
  explicit OptionsScope(const s07::Options& o) { s07::set_options(o); }
  ~OptionsScope() { s07::set_options(s07::Options{}); }
};
s07::Options with(s07::Step step, int block_k = 0, s07::SmemLayout layout = s07::SmemLayout::Auto) {
  s07::Options o;
  o.step = step;
  o.block_k = block_k;
  o.smem_layout = layout;
  return o;
}
constexpr s07::Step kSteps[] = {s07::Step::SyncLoads, s07::Step::CpAsync, s07::Step::TwoBarriers};

// O and L of one forward (host path) under the options in force, inputs from `seed`.
fa::Tensors run_forward(const fa::Problem& p, uint64_t seed) {
  fa::Tensors t = fa::Tensors::make(p, seed, fa::Dist::Normal, false);
  stage().forward(p, fa::Dtype::F32, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
  return t;
}
bool same_output(const fa::Tensors& a, const fa::Tensors& b) {
  return fa::test::bitwise_equal(a.O, b.O) && fa::test::bitwise_equal(a.L, b.L);
}

}  // namespace

TEST_CASE("07: the shared shape matrix in fp32") {
  fa::test::check_matrix(stage(), fa::Dtype::F32, false);
}

TEST_CASE("07: adversarial inputs (large logits, empty rows, constant rows, NaN)") {
  fa::test::check_adversarial(stage(), fa::Dtype::F32, false);
}

TEST_CASE("07: properties (key permutation, bitwise determinism)") {
  fa::test::check_properties(stage(), fa::Dtype::F32, false);
}

TEST_CASE("07: random shapes") {
  fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, fa::test::small_mode() ? 4 : 24);
}

TEST_CASE("07: every step passes the shared checks") {
  // The steps change when tiles are copied and where the block waits; the layouts change
  // every shared address. Each must be correct on every shape the stage handles, so each
  // gets the full shared suite: steps 07a and 07b with the default data options, the final
  // kernel (07c, the default above) with each layout forced (auto runs the swizzled tile at
  // d = 128 only, the padded one elsewhere).
  const s07::Options runs[] = {with(s07::Step::SyncLoads), with(s07::Step::CpAsync),
                               with(s07::Step::TwoBarriers, 0, s07::SmemLayout::Padded),
                               with(s07::Step::TwoBarriers, 0, s07::SmemLayout::Swizzled)};
  for (const s07::Options& o : runs) {
    CAPTURE(s07::step_names()[size_t(o.step)]);
    CAPTURE(s07::smem_layout_names()[size_t(o.smem_layout)]);
    OptionsScope scope(o);
    fa::test::check_matrix(stage(), fa::Dtype::F32, false);
    fa::test::check_adversarial(stage(), fa::Dtype::F32, false);
    fa::test::check_properties(stage(), fa::Dtype::F32, false);
    fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, fa::test::small_mode() ? 4 : 12);
  }
}

TEST_CASE("07: steps, tile widths and layouts on tails, causal, GQA and N_k = 0; bitwise equal per B_c") {
  // Tile-size invariance: B_c changes which keys share a tile, and so where the online
  // softmax rescales; every (step, B_c, layout) must agree with the reference on tails
  // (zero-filled copies), causal tiles, GQA and N_k = 0 (no tile, Q copied but unused). The
  // steps change only when tiles are copied and where the block waits, the layout only where
  // a value sits in shared memory: for one B_c every product and sum runs in the same order,
  // so all of them must give bitwise the same O and L.
  std::vector<fa::Problem> problems = {
      make(1, 2, 1, 97, 130, 40, true),   make(1, 8, 2, 300, 77, 64, false),
      make(1, 2, 2, 77, 300, 128, true),  make(2, 4, 4, 65, 64, 96, false),
      make(1, 2, 1, 70, 0, 128, false),   make(1, 1, 1, 1, 1, 16, true),
      make(1, 2, 2, 200, 33, 128, false), make(1, 1, 1, 64, 1, 128, true),
      make(1, 4, 2, 129, 200, 64, true)};
  if (!fa::test::small_mode()) {
    problems.push_back(make(1, 4, 2, 1025, 1025, 128, true));
    problems.push_back(make(1, 2, 1, 255, 1024, 80, false));
    problems.push_back(make(2, 4, 2, 513, 700, 128, false));
    problems.push_back(make(1, 2, 1, 513, 513, 16, true));
  }
  for (const auto& p : problems) {
    for (int block_k : {32, 64}) {
      std::vector<s07::SmemLayout> layouts{s07::SmemLayout::Padded};
      if (block_k == 64) layouts.push_back(s07::SmemLayout::Swizzled);
      bool have_first = false;
      fa::Tensors first;
      for (s07::Step step : kSteps) {
        for (s07::SmemLayout layout : layouts) {
          CAPTURE(p.describe());
          CAPTURE(block_k);
          CAPTURE(s07::step_names()[size_t(step)]);
          CAPTURE(s07::smem_layout_names()[size_t(layout)]);
          OptionsScope scope(with(step, block_k, layout));
          const s07::LaunchShape shape = s07::launch_shape(p);
          CHECK(shape.block_k == block_k);
          CHECK(shape.swizzled == (layout == s07::SmemLayout::Swizzled));
          fa::test::expect_pass(stage(), p, fa::Dtype::F32, 7, fa::Dist::Normal, false);
          fa::test::expect_pass(stage(), p, fa::Dtype::F32, 8, fa::Dist::LargeLogits, false);
          fa::Tensors out = run_forward(p, 11);
          if (!have_first) {
            first = std::move(out);
            have_first = true;
          } else {
            CHECK(same_output(first, out));
          }
        }
      }
    }
  }
}

TEST_CASE("07: steps and layouts compile without spills and reach their blocks per SM") {
  // What the notes' occupancy tables promise, read back from the driver: no local memory
  // (spills) for any step and layout at d = 64 and 128, and on an H100/H200 (228 KiB of
  // shared memory per SM) the blocks per SM each tile was sized for.
  int device = 0;
  cudaDeviceProp prop{};
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const bool hopper_smem = prop.major == 9 && prop.sharedMemPerMultiprocessor >= 233472;
  struct Expect {
    s07::SmemLayout layout;
    int d, blocks_per_sm;
  };
  for (const Expect e : {Expect{s07::SmemLayout::Auto, 128, 2}, Expect{s07::SmemLayout::Padded, 128, 3},
                         Expect{s07::SmemLayout::Auto, 64, 3}, Expect{s07::SmemLayout::Swizzled, 64, 3}}) {
    for (s07::Step step : kSteps) {
      CAPTURE(s07::smem_layout_names()[size_t(e.layout)]);
      CAPTURE(e.d);
      CAPTURE(s07::step_names()[size_t(step)]);
      OptionsScope scope(with(step, 0, e.layout));
      std::string all;
      for (const auto& [key, value] : stage().report(make(4, 16, 16, 4096, 4096, e.d, false), fa::Dtype::F32))
        all += key + ": " + value + "\n";
      INFO(all);
      CHECK(all.find("0 B per thread (spills)") != std::string::npos);
      if (hopper_smem)
        CHECK(all.find("occupancy: " + std::to_string(e.blocks_per_sm) + " blocks/SM") != std::string::npos);
    }
  }
}

TEST_CASE("07: two runs are bitwise identical") {
  const fa::Problem p =
      fa::test::small_mode() ? make(1, 2, 1, 130, 200, 64, true) : make(2, 4, 2, 513, 700, 128, true);
  fa::Tensors a = fa::Tensors::make(p, 3, fa::Dist::Normal, false);
  fa::Tensors b = fa::Tensors::make(p, 3, fa::Dist::Normal, false);
  stage().forward(p, fa::Dtype::F32, a.Q.data(), a.K.data(), a.V.data(), a.O.data(), a.L.data());
  stage().forward(p, fa::Dtype::F32, b.Q.data(), b.K.data(), b.V.data(), b.O.data(), b.L.data());
  CHECK(std::memcmp(a.O.data(), b.O.data(), a.O.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.L.data(), b.L.data(), a.L.size() * sizeof(float)) == 0);
}

TEST_SUITE("cpu") {
  TEST_CASE("07: refusals") { fa::test::check_refusals(stage(), fa::Dtype::F32); }

  TEST_CASE("07: launch shape") {
    // The padded B_c = 32 tile at d = 128, the one the notes' occupancy section works through.
    const fa::Problem p = make(2, 3, 1, 130, 64, 128, false);
    const auto s = s07::launch_shape(p, with(s07::Step::Auto, 0, s07::SmemLayout::Padded));
    CHECK(s.head_dim_padded == 128);
    CHECK(s.block_q == 64);
    CHECK(s.block_k == 32);
    CHECK(s.threads == 128);
    CHECK(s.blocks == 3 * 2 * 3);  // T_r = ceil(130 / 64) = 3 query tiles per head
    // sQ [64][132] + sK [32][132] + sV [32][128] + sP [64][36] floats
    CHECK(s.shared_bytes == 4 * (64 * 132 + 32 * 132 + 32 * 128 + 64 * 36));
    // sQ [64][68] + sK [64][68] + sV [64][64] + sP [64][68]: d = 40 runs the D = 64 kernel
    const auto s40 = s07::launch_shape(make(1, 1, 1, 1, 1, 40, false));
    CHECK(s40.head_dim_padded == 64);
    CHECK(s40.block_k == 64);
    CHECK_FALSE(s40.swizzled);
    CHECK(s40.shared_bytes == 4 * (3 * 64 * 68 + 64 * 64));
    CHECK(s07::launch_shape(make(1, 1, 1, 1, 1, 80, false)).head_dim_padded == 96);
    CHECK(s07::launch_shape(make(1, 1, 1, 1, 1, 80, false)).block_k == 32);
    CHECK(s07::launch_shape(make(1, 1, 1, 0, 5, 64, false)).blocks == 0);
    // Auto at d = 128: the swizzled B_c = 64 tile, sQ [64][128] + sK [64][128] + sV [64][128]
    // + sP [64][64] floats, no padding: 114,688 bytes, two blocks per SM on an H200.
    const auto s0 = s07::launch_shape(p);
    CHECK(s0.swizzled);
    CHECK(s0.block_k == 64);
    CHECK(s0.shared_bytes == 4 * (3 * 64 * 128 + 64 * 64));
    CHECK(s0.blocks == s.blocks);  // B_r stays 64
    // block_k = 32 set by hand: auto picks the padded layout (the swizzle is built for 64).
    const auto s32 = s07::launch_shape(p, with(s07::Step::Auto, 32));
    CHECK_FALSE(s32.swizzled);
    CHECK(s32.block_k == 32);
    CHECK(s32.shared_bytes == s.shared_bytes);
    const auto s64 = s07::launch_shape(p, with(s07::Step::Auto, 64, s07::SmemLayout::Padded));
    CHECK(s64.block_k == 64);
    CHECK(s64.shared_bytes == 4 * (2 * 64 * 132 + 64 * 128 + 64 * 68));
    CHECK_THROWS_AS(s07::launch_shape(p, with(s07::Step::Auto, 32, s07::SmemLayout::Swizzled)), std::invalid_argument);
  }

  TEST_CASE("07: launch shapes of the steps, and the options") {
    const fa::Problem p = make(2, 3, 1, 130, 64, 128, false);
    // The steps change the schedule, never the tiles or the shared memory.
    const auto s = s07::launch_shape(p);
    CHECK(s.step == 3);  // auto: the final design, 07c
    CHECK(s.pipelined);
    CHECK(s.barriers == 2);
    const auto sa = s07::launch_shape(p, with(s07::Step::SyncLoads));
    CHECK(sa.step == 1);
    CHECK_FALSE(sa.pipelined);
    CHECK(sa.barriers == 3);
    const auto sb = s07::launch_shape(p, with(s07::Step::CpAsync));
    CHECK(sb.step == 2);
    CHECK(sb.pipelined);
    CHECK(sb.barriers == 3);
    for (const auto& other : {sa, sb}) {
      CHECK(other.block_k == s.block_k);
      CHECK(other.swizzled == s.swizzled);
      CHECK(other.shared_bytes == s.shared_bytes);
      CHECK(other.threads == s.threads);
    }
    // The options through the stage's table: names and numbers, per thread, refusals.
    CHECK(s07::current_options().step == s07::Step::Auto);
    stage().set_option("step", 1);
    CHECK(s07::current_options().step == s07::Step::SyncLoads);
    CHECK(s07::launch_shape(p).step == 1);
    CHECK(stage().get_counter("step") == 1);
    stage().set_option("step", 0);
    CHECK_THROWS_AS(stage().set_option("step", 4), std::invalid_argument);
    CHECK_THROWS_AS(stage().set_option("step", -1), std::invalid_argument);
    CHECK_THROWS_AS(stage().set_option("block_k", 48), std::invalid_argument);
    CHECK_THROWS_AS(stage().set_option("smem_layout", 3), std::invalid_argument);
    stage().set_option("smem_layout", 2);
    CHECK(stage().get_counter("smem_layout") == 2);
    stage().set_option("block_k", 32);
    CHECK_THROWS_AS(s07::launch_shape(p), std::invalid_argument);  // swizzled with B_c = 32
    stage().set_option("block_k", 0);
    stage().set_option("smem_layout", 0);
    CHECK(s07::current_options().block_k == 0);
    CHECK(stage().get_counter("threads") == 128);
  }

  TEST_CASE("07: the device entry point refuses bad input before touching the GPU") {
    // Refusals are decided on the host, before any CUDA call, so fake pointers do here.
    const fa::Problem p = make(1, 2, 1, 70, 50, 64, false);
    const auto fake = [](uintptr_t address) { return reinterpret_cast<void*>(address); };
    const auto refused = [&](const fa::Problem& q, fa::Dtype t, const void* q_ptr,
                             const std::string& fragment) {
      std::string msg;
      try {
        stage().forward_device(q, t, q_ptr, fake(0x20000), fake(0x30000), fake(0x40000),
                               static_cast<float*>(fake(0x50000)), nullptr);
      } catch (const std::invalid_argument& e) {
        msg = e.what();
      }
      INFO("message: '", msg, "'");
      CHECK(msg.find(fragment) != std::string::npos);
      CHECK(msg.find("07_smem_cuda") != std::string::npos);
    };
    refused(p, fa::Dtype::F16, fake(0x10000), "f16");
    refused(p, fa::Dtype::F32, fake(0x10004), "aligned");  // float-aligned, not 16-byte
    fa::Problem bad = p;
    bad.head_dim = 48;
    refused(bad, fa::Dtype::F32, fake(0x10000), "head_dim = 48");
    bad.head_dim = 256;
    refused(bad, fa::Dtype::F32, fake(0x10000), "head_dim = 256");
    bad = p;
    bad.kv_heads = 3;
    refused(bad, fa::Dtype::F32, fake(0x10000), "kv_heads = 3");
  }
}

TEST_CASE("07: launch report (registers, occupancy)") {
  const fa::Problem p = make(2, 3, 1, 130, 64, 128, false);
  std::string all;
  for (const auto& [key, value] : stage().report(p, fa::Dtype::F32))
    all += key + ": " + value + "\n";
  INFO(all);
  CHECK(all.find("grid: 18 x 1 x 1") != std::string::npos);
  CHECK(all.find("registers") != std::string::npos);
  CHECK(all.find("occupancy") != std::string::npos);
  CHECK(all.find("0 B per thread (spills)") != std::string::npos);  // no local memory
}

TEST_CASE("07: a refused launch writes nothing") {
  const fa::Problem p = make(1, 2, 1, 70, 50, 64, false);
  fa::DeviceBuffer Q(p.q_elems() * 4 + 16, "Q"), K(p.kv_elems() * 4, "K"), V(p.kv_elems() * 4, "V"),
      O(p.q_elems() * 4, "O"), L(p.l_elems() * 4, "L");
  for (auto* b : {&Q, &K, &V, &O, &L}) FA_CUDA_CHECK(cudaMemset(b->get(), 0x7f, b->bytes()));
  const void* misaligned = Q.as<char>() + 4;
  CHECK_THROWS_AS(stage().forward_device(p, fa::Dtype::F32, misaligned, K.get(), V.get(), O.get(),
                                         L.as<float>(), nullptr),
                  std::invalid_argument);
  fa::Problem bad = p;
  bad.head_dim = 48;
  CHECK_THROWS_AS(stage().forward_device(bad, fa::Dtype::F32, Q.get(), K.get(), V.get(), O.get(),
                                         L.as<float>(), nullptr),
                  std::invalid_argument);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> o(O.bytes()), l(L.bytes());
  FA_CUDA_CHECK(cudaMemcpy(o.data(), O.get(), o.size(), cudaMemcpyDeviceToHost));
  FA_CUDA_CHECK(cudaMemcpy(l.data(), L.get(), l.size(), cudaMemcpyDeviceToHost));
  CHECK(std::all_of(o.begin(), o.end(), [](unsigned char x) { return x == 0x7f; }));
  CHECK(std::all_of(l.begin(), l.end(), [](unsigned char x) { return x == 0x7f; }));
}

TEST_CASE("07: device pointers on a non-default stream give the host path's result") {
  const fa::Problem p = make(1, 4, 2, 200, 333, 96, true);
  fa::Tensors t = fa::Tensors::make(p, 9, fa::Dist::Normal, false);
  stage().forward(p, fa::Dtype::F32, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());

  cudaStream_t stream;
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fa::DeviceBuffer Q(p.q_elems() * 4, "Q"), K(p.kv_elems() * 4, "K"), V(p.kv_elems() * 4, "V"),
      O(p.q_elems() * 4, "O"), L(p.l_elems() * 4, "L");
  fa::upload(fa::Dtype::F32, t.Q.data(), Q.get(), p.q_elems(), stream);
  fa::upload(fa::Dtype::F32, t.K.data(), K.get(), p.kv_elems(), stream);
  fa::upload(fa::Dtype::F32, t.V.data(), V.get(), p.kv_elems(), stream);
  fa::stage07::forward(p, Q.as<float>(), K.as<float>(), V.as<float>(), O.as<float>(),
                       L.as<float>(), stream);
  std::vector<float> o(size_t(p.q_elems())), l(size_t(p.l_elems()));
  fa::download(fa::Dtype::F32, O.get(), o.data(), p.q_elems(), stream);
  fa::download(fa::Dtype::F32, L.get(), l.data(), p.l_elems(), stream);
  FA_CUDA_CHECK(cudaStreamDestroy(stream));
  CHECK(std::memcmp(o.data(), t.O.data(), o.size() * 4) == 0);
  CHECK(std::memcmp(l.data(), t.L.data(), l.size() * 4) == 0);
}

TEST_CASE("07: a tensor of more than 2^31 elements (FA_TEST_LARGE=1)") {
  if (!fa::test::env_flag("FA_TEST_LARGE")) {
    MESSAGE("skipped: set FA_TEST_LARGE=1 to run (needs about 17 GB of GPU memory)");
    return;
  }
  // Q and O hold (2^24 + 77) · 128 > 2^31 elements each; K and V are small. Row 2^24 is the
  // first row whose offset no longer fits in 32 bits.
  for (bool causal : {false, true}) {
    const fa::Problem p = make(1, 1, 1, (1 << 24) + 77, 300, 128, causal);
    REQUIRE(p.q_elems() > (int64_t(1) << 31));
    size_t free_bytes = 0, total_bytes = 0;
    FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t need = size_t(2 * p.q_elems() + 2 * p.kv_elems() + p.l_elems()) * 4;
    if (free_bytes < need + (size_t(1) << 30)) {
      MESSAGE("skipped: needs ", need >> 20, " MiB of GPU memory, ", free_bytes >> 20, " MiB free");
      return;
    }
    fa::DeviceBuffer Q(p.q_elems() * 4, "Q"), K(p.kv_elems() * 4, "K"), V(p.kv_elems() * 4, "V"),
        O(p.q_elems() * 4, "O"), L(p.l_elems() * 4, "L");
    const fa::Problem kv_shape = make(1, 1, 1, 1, 300, 128, false);
    fa::Tensors kv = fa::Tensors::make(kv_shape, 5, fa::Dist::Normal, false);
    fa::fill_random(fa::Dtype::F32, Q.get(), p.q_elems(), 77, nullptr);
    fa::upload(fa::Dtype::F32, kv.K.data(), K.get(), p.kv_elems(), nullptr);
    fa::upload(fa::Dtype::F32, kv.V.data(), V.get(), p.kv_elems(), nullptr);
    fa::stage07::forward(p, Q.as<float>(), K.as<float>(), V.as<float>(), O.as<float>(),
                         L.as<float>(), nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    CAPTURE(causal);
    fa::test::check_row_window(p, fa::Dtype::F32, 0, 64, kv.K, kv.V, Q.as<float>(), O.as<float>(), L.as<float>());
    fa::test::check_row_window(p, fa::Dtype::F32, (1 << 24) - 32, 64, kv.K, kv.V, Q.as<float>(), O.as<float>(), L.as<float>());
    fa::test::check_row_window(p, fa::Dtype::F32, p.seq_q - 64, 64, kv.K, kv.V, Q.as<float>(), O.as<float>(), L.as<float>());
  }
}

#endif  // FA_HAVE_CUDA
