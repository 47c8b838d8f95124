// Stage 07 (shared-memory fp32 CUDA kernel): the shared matrix, plus what is particular to
// a GPU kernel: both key-tile widths, the kernel variants (option `variant`), bitwise
// determinism, the device entry point's refusals, a non-default stream, the launch report,
// and a tensor of more than 2³¹ elements (FA_TEST_LARGE=1; about 17 GB of GPU memory).
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



// Sets B_c for the scope of one test and restores the default afterwards.
struct BlockK {
  explicit BlockK(int v) { fa::stage07::set_block_k(v); }
  ~BlockK() { fa::stage07::set_block_k(0); }
};

// Sets the load schedule (option `pipeline`) for the scope of one test, then the default.
struct Pipeline {
  explicit Pipeline(int v) { fa::stage07::set_pipeline(v); }
  ~Pipeline() { fa::stage07::set_pipeline(0); }
};

// Sets the kernel variant (option `variant`) for the scope of one test, then the default.
struct Variant {
  explicit Variant(int v) { fa::stage07::set_variant(v); }
  ~Variant() { fa::stage07::set_variant(0); }
};

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

TEST_CASE("07: both key-tile widths (B_c = 32 and 64) match the reference") {
  // Tile-size invariance: B_c changes which keys share a tile, and so where the online
  // softmax rescales; both must agree with the reference on tails, causal and GQA.
  std::vector<fa::Problem> problems = {
      make(1, 2, 1, 97, 130, 40, true), make(1, 8, 2, 300, 77, 64, false),
      make(1, 2, 2, 77, 300, 128, true), make(2, 4, 4, 65, 64, 96, false)};
  if (!fa::test::small_mode()) {
    problems.push_back(make(1, 4, 2, 1025, 1025, 128, true));
    problems.push_back(make(1, 2, 1, 255, 1024, 80, false));
    problems.push_back(make(1, 2, 1, 513, 513, 16, true));
  }
  for (int block_k : {32, 64}) {
    BlockK scope(block_k);
    for (const auto& p : problems) {
      CAPTURE(block_k);
      CAPTURE(p.describe());
      CHECK(fa::stage07::launch_shape(p).block_k == block_k);
      fa::test::expect_pass(stage(), p, fa::Dtype::F32, 7, fa::Dist::Normal, false);
    }
  }
  CHECK(fa::stage07::launch_shape(make(1, 1, 1, 64, 64, 64, false)).block_k == 64);
  CHECK(fa::stage07::launch_shape(make(1, 1, 1, 64, 64, 128, false)).block_k == 64);  // auto: variant 1
  Variant padded(4);
  CHECK(fa::stage07::launch_shape(make(1, 1, 1, 64, 64, 128, false)).block_k == 32);
}

TEST_CASE("07: the synchronous schedule (pipeline = 2) matches the reference, bitwise the default") {
  // Only the load schedule changes: every product and sum runs in the same order, so O and
  // L must equal the default kernel's bit for bit; the reference check covers the tails
  // (zero-filled copies), causal tiles, GQA and N_k = 0 (no tile, Q copied but unused).
  std::vector<fa::Problem> problems = {
      make(1, 2, 1, 97, 130, 40, true),   make(1, 8, 2, 300, 77, 64, false),
      make(1, 2, 2, 77, 300, 128, true),  make(2, 4, 4, 65, 64, 96, false),
      make(1, 2, 1, 70, 0, 128, false),   make(1, 1, 1, 1, 1, 16, true),
      make(1, 2, 2, 200, 33, 128, false)};
  if (!fa::test::small_mode()) {
    problems.push_back(make(1, 4, 2, 1025, 1025, 128, true));
    problems.push_back(make(1, 2, 1, 255, 1024, 80, false));
    problems.push_back(make(2, 4, 2, 513, 700, 128, false));
  }
  for (int block_k : {32, 64}) {
    BlockK scope(block_k);
    for (const auto& p : problems) {
      CAPTURE(block_k);
      CAPTURE(p.describe());
      fa::Tensors base = fa::Tensors::make(p, 11, fa::Dist::Normal, false);
      fa::Tensors piped = fa::Tensors::make(p, 11, fa::Dist::Normal, false);
      stage().forward(p, fa::Dtype::F32, base.Q.data(), base.K.data(), base.V.data(),
                      base.O.data(), base.L.data());
      CHECK(fa::stage07::launch_shape(p).pipelined);  // the default is the cp.async pipeline
      {
        Pipeline on(2);
        CHECK_FALSE(fa::stage07::launch_shape(p).pipelined);
        stage().forward(p, fa::Dtype::F32, piped.Q.data(), piped.K.data(), piped.V.data(),
                        piped.O.data(), piped.L.data());
        fa::test::expect_pass(stage(), p, fa::Dtype::F32, 7, fa::Dist::Normal, false);
        fa::test::expect_pass(stage(), p, fa::Dtype::F32, 8, fa::Dist::LargeLogits, false);
      }
      CHECK(std::memcmp(base.O.data(), piped.O.data(), base.O.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(base.L.data(), piped.L.data(), base.L.size() * sizeof(float)) == 0);
    }
  }
  Pipeline on(2);
  fa::test::check_adversarial(stage(), fa::Dtype::F32, false);
}

TEST_CASE("07: each kernel variant passes the shared checks") {
  // The variants change the thread layout (2: 256 threads, 16 lanes per row), the shared
  // layout (1, 2: XOR swizzle) and the barrier schedule (1, 2, 3); each must be correct on
  // every shape the stage handles, so each gets the full shared suite. The default (auto)
  // runs 1 at d = 128 and 4 elsewhere: forcing 4 covers the padded kernel at d = 128 too.
  for (int variant : {1, 2, 3, 4}) {
    CAPTURE(variant);
    Variant scope(variant);
    fa::test::check_matrix(stage(), fa::Dtype::F32, false);
    fa::test::check_adversarial(stage(), fa::Dtype::F32, false);
    fa::test::check_properties(stage(), fa::Dtype::F32, false);
    fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, fa::test::small_mode() ? 4 : 12);
  }
}

TEST_CASE("07: variants on tails, causal, GQA and N_k = 0, both schedules; bitwise where promised") {
  // Per variant and schedule: the reference check (normal and large logits), and bitwise
  // equality of the synchronous schedule with the cp.async one (the sums run in the same
  // order). Variant 3 only removes a barrier, so it must equal the default bit for bit, at
  // both B_c; variant 1 only changes the shared layout and the barriers of the default
  // kernel at B_c = 64; variant 2 at a head dim it does not cover runs the default kernel.
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
  }
  for (int variant : {1, 2, 3}) {
    for (int pipeline : {0, 2}) {
      for (const auto& p : problems) {
        CAPTURE(variant);
        CAPTURE(pipeline);
        CAPTURE(p.describe());
        fa::Tensors out = [&] {
          Variant v(variant);
          Pipeline s(pipeline);
          fa::test::expect_pass(stage(), p, fa::Dtype::F32, 7, fa::Dist::Normal, false);
          fa::test::expect_pass(stage(), p, fa::Dtype::F32, 8, fa::Dist::LargeLogits, false);
          return run_forward(p, 11);
        }();
        if (pipeline == 0) {  // the synchronous schedule of the same variant, bit for bit
          Variant v(variant);
          Pipeline s(2);
          CHECK(same_output(out, run_forward(p, 11)));
        }
        const int D = fa::stage07::launch_shape(p).head_dim_padded;
        if (variant == 3 || (variant == 2 && D % 64 != 0)) {
          Variant padded(4);
          Pipeline s(pipeline);
          CHECK(same_output(out, run_forward(p, 11)));  // the padded kernel
        }
        if (variant == 3) {
          BlockK other(D <= 64 ? 32 : 64);  // the other B_c, with and without variant 3
          Pipeline s(pipeline);
          const fa::Tensors base = [&] {
            Variant padded(4);
            return run_forward(p, 12);
          }();
          Variant v(3);
          CHECK(same_output(base, run_forward(p, 12)));
        }
        if (variant == 1) {
          Variant padded(4);
          BlockK wide(64);
          Pipeline s(pipeline);
          CHECK(same_output(out, run_forward(p, 11)));  // the padded kernel at B_c = 64
        }
      }
    }
  }
}

TEST_CASE("07: variants compile without spills and reach their blocks per SM") {
  // What the notes' occupancy table for the variants promises, read back from the driver:
  // no local memory (spills) for any variant at d = 64 and 128, and on an H100/H200 (228 KiB
  // of shared memory per SM) the blocks per SM each variant was sized for at d = 128.
  int device = 0;
  cudaDeviceProp prop{};
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const bool hopper_smem = prop.major == 9 && prop.sharedMemPerMultiprocessor >= 233472;
  struct Expect {
    int variant, d, blocks_per_sm;
  };
  for (const Expect e : {Expect{0, 128, 2}, Expect{1, 128, 2}, Expect{2, 128, 2}, Expect{3, 128, 3},
                         Expect{4, 128, 3}, Expect{0, 64, 3}, Expect{1, 64, 3}, Expect{2, 64, 2},
                         Expect{3, 64, 3}, Expect{4, 64, 3}}) {
    for (int pipeline : {0, 2}) {
      CAPTURE(e.variant);
      CAPTURE(e.d);
      CAPTURE(pipeline);
      Variant v(e.variant);
      Pipeline s(pipeline);
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
    // The padded kernel (variant 4), the one the notes' occupancy section works through;
    // the swizzled tile auto runs at d = 128 is checked in "launch shapes of the kernel variants".
    Variant padded(4);
    const fa::Problem p = make(2, 3, 1, 130, 64, 128, false);
    const auto s = fa::stage07::launch_shape(p);
    CHECK(s.head_dim_padded == 128);
    CHECK(s.block_q == 64);
    CHECK(s.block_k == 32);
    CHECK(s.threads == 128);
    CHECK(s.blocks == 3 * 2 * 3);  // T_r = ceil(130 / 64) = 3 query tiles per head
    // sQ [64][132] + sK [32][132] + sV [32][128] + sP [64][36] floats
    CHECK(s.shared_bytes == 4 * (64 * 132 + 32 * 132 + 32 * 128 + 64 * 36));
    // sQ [64][68] + sK [64][68] + sV [64][64] + sP [64][68]: d = 40 runs the D = 64 kernel
    const auto s40 = fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 40, false));
    CHECK(s40.head_dim_padded == 64);
    CHECK(s40.block_k == 64);
    CHECK(s40.shared_bytes == 4 * (3 * 64 * 68 + 64 * 64));
    CHECK(fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 80, false)).head_dim_padded == 96);
    CHECK(fa::stage07::launch_shape(make(1, 1, 1, 0, 5, 64, false)).blocks == 0);
    CHECK_THROWS_AS(fa::stage07::set_block_k(48), std::invalid_argument);
    {
      BlockK scope(64);
      CHECK(fa::stage07::launch_shape(p).block_k == 64);
    }
    CHECK(fa::stage07::block_k_option() == 0);
    // The schedule changes when tiles are copied, not their shapes or shared memory.
    CHECK(s.pipelined);  // default (0) = cp.async pipeline (1)
    CHECK_THROWS_AS(fa::stage07::set_pipeline(3), std::invalid_argument);
    {
      Pipeline scope(2);
      const auto sp = fa::stage07::launch_shape(p);
      CHECK_FALSE(sp.pipelined);
      CHECK(sp.block_q == s.block_q);
      CHECK(sp.block_k == s.block_k);
      CHECK(sp.shared_bytes == s.shared_bytes);
      CHECK(stage().get_counter("pipeline") == 2);
    }
    CHECK(fa::stage07::pipeline_option() == 0);
    stage().set_option("pipeline", 1);
    CHECK(fa::stage07::pipeline_option() == 1);
    stage().set_option("pipeline", 0);
    CHECK_THROWS_AS(stage().set_option("pipeline", 3), std::invalid_argument);
    CHECK_THROWS_AS(stage().set_option("pipeline", -1), std::invalid_argument);
  }

  TEST_CASE("07: launch shapes of the kernel variants") {
    const fa::Problem p = make(2, 3, 1, 130, 64, 128, false);
    const auto s = [&] {  // the padded kernel
      Variant padded(4);
      return fa::stage07::launch_shape(p);
    }();
    CHECK(s.variant == 4);
    CHECK_FALSE(s.swizzled);
    CHECK(s.barriers == 3);
    CHECK(s.block_k == 32);
    {
      // Auto (the default): variant 1 at d = 128, unless block_k is set; variant 4 elsewhere.
      const auto s0 = fa::stage07::launch_shape(p);
      CHECK(s0.variant == 1);
      CHECK(s0.swizzled);
      CHECK(s0.block_k == 64);
      CHECK(s0.barriers == 2);
      CHECK(fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 64, false)).variant == 4);
      CHECK(fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 96, false)).variant == 4);
      CHECK(fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 96, true)).variant == 4);
      BlockK forced(64);
      const auto s0k = fa::stage07::launch_shape(p);
      CHECK(s0k.variant == 4);
      CHECK_FALSE(s0k.swizzled);
      CHECK(s0k.block_k == 64);
    }
    {
      // Variant 1: B_c = 64 whatever block_k says; sQ [64][128] + sK [64][128] + sV [64][128]
      // + sP [64][64] floats, no padding: 114,688 bytes, two blocks per SM on an H200.
      Variant v(1);
      BlockK ignored(32);
      const auto s1 = fa::stage07::launch_shape(p);
      CHECK(s1.variant == 1);
      CHECK(s1.block_k == 64);
      CHECK(s1.threads == 128);
      CHECK(s1.swizzled);
      CHECK(s1.barriers == 2);
      CHECK(s1.shared_bytes == 4 * (3 * 64 * 128 + 64 * 64));
      CHECK(s1.blocks == s.blocks);  // B_r stays 64
      Pipeline sync(2);
      CHECK(fa::stage07::launch_shape(p).barriers == 3);  // the synchronous schedule keeps 3
    }
    {
      // Variant 2: 256 threads with the same tiles; d = 96 (and 80) runs the padded kernel.
      Variant v(2);
      const auto s2 = fa::stage07::launch_shape(p);
      CHECK(s2.variant == 2);
      CHECK(s2.threads == 256);
      CHECK(s2.block_k == 64);
      CHECK(s2.shared_bytes == 4 * (3 * 64 * 128 + 64 * 64));
      CHECK(stage().get_counter("threads") == 256);  // Problem{}: d = 64, covered
      const auto s80 = fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 80, false));
      CHECK(s80.variant == 4);
      CHECK(s80.threads == 128);
      CHECK(s80.block_k == 32);
      CHECK(s80.barriers == 3);
      CHECK(fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 40, false)).variant == 2);
      CHECK(fa::stage07::launch_shape(make(1, 1, 1, 1, 1, 32, false)).variant == 4);
    }
    {
      // Variant 3: the padded tiles and shared memory, two barriers per tile; block_k applies.
      Variant v(3);
      const auto s3 = fa::stage07::launch_shape(p);
      CHECK(s3.variant == 3);
      CHECK(s3.block_k == s.block_k);
      CHECK(s3.shared_bytes == s.shared_bytes);
      CHECK(s3.threads == 128);
      CHECK(s3.barriers == 2);
      BlockK wide(64);
      CHECK(fa::stage07::launch_shape(p).block_k == 64);
    }
    CHECK(fa::stage07::variant_option() == 0);
    CHECK_THROWS_AS(fa::stage07::set_variant(5), std::invalid_argument);
    CHECK_THROWS_AS(stage().set_option("variant", -1), std::invalid_argument);
    stage().set_option("variant", 2);
    CHECK(stage().get_counter("variant") == 2);
    stage().set_option("variant", 0);
    CHECK(fa::stage07::variant_option() == 0);
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
