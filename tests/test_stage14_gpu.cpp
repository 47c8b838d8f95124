// Stage 14 (decoding), the CUDA steps: every step against the reference over lengths 0, 1,
// 2^k ± 1 (FA_TEST_LARGE=1: up to 128k), mixed lengths in a batch, q_len 1/4/16, GQA ratios
// 1/4/8, head dims 64/128, bf16 and f16; the paged cache with blocks of 16/64/256 and
// shuffled tables; split counts 1 … more than there are key tiles (the result does not
// depend on the split beyond rounding); the KV append, contiguous and paged; the refusals
// (nothing written); a bad device block table reads nothing outside the pool.
//
// Without a GPU only the test suite "cpu" runs (the refusals decided before the device is
// touched), then the program exits 77 (skipped). FA_TEST_SMALL=1 shrinks the cases (for
// compute-sanitizer runs).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_utils.h"
#include "decode.h"
#include "decode_reference.h"

namespace {

namespace s14 = fa::stage14;

bool small() { return std::getenv("FA_TEST_SMALL") != nullptr; }
bool large() { return std::getenv("FA_TEST_LARGE") != nullptr; }

fa::DecodeProblem contiguous(std::vector<int> lens, int heads, int kv_heads, int q_len, int d = 128) {
  fa::DecodeProblem p = fa::DecodeProblem::sequences(std::move(lens), heads, kv_heads, q_len, d);
  p.capacity = std::max(1, p.max_seqlen() + 5);  // room past the longest: a read past a length would show
  return p;
}

fa::DecodeProblem paged(const fa::DecodeProblem& p, int block_size) { return p.in_blocks(block_size, 0, 2); }

fa::CheckReport run_gpu(const fa::DecodeProblem& p, fa::Dtype dtype, fa::DecodeTensors& t, s14::GpuOptions o) {
  s14::decode_gpu(p, dtype, t.Q.data(), t.K_cache.data(), t.V_cache.data(), p.paged() ? t.block_table.data() : nullptr,
                  t.O.data(), t.L.data(), o);
  return fa::check_decode(p, dtype, t, t.O.data(), t.L.data());
}

void require_pass(const fa::DecodeProblem& p, s14::GpuOptions o, fa::Dtype dtype, const fa::CheckReport& r) {
  INFO(p.describe() << " step " << s14::step_name(o.step) << " splits " << o.splits << " " << fa::dtype_name(dtype));
  INFO(r.summary());
  CHECK(r.pass());
}

// The steps that read a cache of this layout.
std::vector<s14::Step> steps_for(const fa::DecodeProblem& p) {
  if (p.paged()) return {s14::Step::Paged, s14::Step::TensorCores};
  return {std::begin(s14::kSteps), std::end(s14::kSteps)};
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

}  // namespace

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

TEST_SUITE("cpu") {
TEST_CASE("refusals decided on the host, before the device is touched") {
  fa::DecodeProblem p = contiguous({10, 20}, 8, 2, 1);
  const s14::GpuOptions o;
  CHECK(refusal([&] { s14::require_gpu_request(p, fa::Dtype::F32, o); }).find("dtype f32 is not supported") !=
        std::string::npos);
  fa::DecodeProblem q = p;
  q.head_dim = 80;
  CHECK(refusal([&] { s14::require_gpu_request(q, fa::Dtype::BF16, o); })
            .find("head_dim = 80 is not supported by the CUDA steps (supported: 64, 128)") != std::string::npos);
  q = paged(p, 16);
  CHECK(refusal([&] { s14::require_gpu_request(q, fa::Dtype::BF16, {s14::Step::GqaPacking, 0}); })
            .find("step 14c reads a contiguous cache; block_size = 16") != std::string::npos);
  CHECK(refusal([&] { s14::require_gpu_request(p, fa::Dtype::BF16, {s14::Step::Auto, 5000}); })
            .find("splits = 5000 is not allowed") != std::string::npos);
  q = p;
  q.q_len = 0;
  CHECK(refusal([&] { s14::require_gpu_request(q, fa::Dtype::BF16, o); }).find("q_len = 0 is not allowed") !=
        std::string::npos);
}
}  // TEST_SUITE("cpu")

TEST_CASE("every step: lengths 0, 1, 2^k +- 1, mixed in a batch; q_len 1, 4, 16") {
  std::vector<int> lens = {0, 1, 2, 31, 33, 255, 257, 1023, 1025, 4097};
  if (small()) lens = {0, 1, 33, 257};
  for (int q_len : {1, 4, 16})
    for (int d : {64, 128}) {
      const fa::DecodeProblem p = contiguous(lens, 8, 2, q_len, d);
      fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(q_len * 1000 + d));
      for (s14::Step step : steps_for(p)) {
        const s14::GpuOptions o{step, 0};
        require_pass(p, o, fa::Dtype::BF16, run_gpu(p, fa::Dtype::BF16, t, o));
      }
    }
}

TEST_CASE("every step: GQA ratios 1, 4, 8 (up to 128 packed rows), f16 and bf16, causal and not") {
  for (int ratio : {1, 4, 8})
    for (int q_len : {1, 16})
      for (bool causal : {true, false}) {
        fa::DecodeProblem p = contiguous({700, 65}, 8, 8 / ratio, q_len);
        p.causal = causal;
        fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(ratio * 100 + q_len));
        for (fa::Dtype dtype : {fa::Dtype::BF16, fa::Dtype::F16}) {
          if (small() && dtype == fa::Dtype::F16) continue;
          for (s14::Step step : steps_for(p)) {
            const s14::GpuOptions o{step, 3};
            require_pass(p, o, dtype, run_gpu(p, dtype, t, o));
          }
        }
      }
}

TEST_CASE("14d, 14e: paged caches of blocks 16, 64, 256 with shuffled block tables") {
  for (int block : {16, 64, 256})
    for (int q_len : {1, 4, 16}) {
      const fa::DecodeProblem p = paged(contiguous({1000, 0, 17, 256, 1, 513}, 16, 4, q_len), block);
      fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(block * 10 + q_len));
      for (s14::Step step : {s14::Step::Paged, s14::Step::TensorCores})
        for (int splits : {0, 1, 5}) {
          const s14::GpuOptions o{step, splits};
          require_pass(p, o, fa::Dtype::BF16, run_gpu(p, fa::Dtype::BF16, t, o));
        }
    }
}

TEST_CASE("split count does not change the result beyond rounding") {
  const fa::DecodeProblem p = contiguous({small() ? 2000 : 8193, 100, 0}, 8, 2, 4);
  fa::DecodeTensors t = fa::DecodeTensors::make(p, 5);
  for (s14::Step step : {s14::Step::SplitKV, s14::Step::GqaPacking, s14::Step::Paged, s14::Step::TensorCores}) {
    std::vector<float> O_one;
    double tol = 0;
    for (int splits : {1, 2, 3, 7, 64, 300, small() ? 1000 : 4096}) {  // 300 on: more splits than key tiles
      const s14::GpuOptions o{step, splits};
      const fa::CheckReport r = run_gpu(p, fa::Dtype::BF16, t, o);
      require_pass(p, o, fa::Dtype::BF16, r);
      if (splits == 1) {
        O_one = t.O;
        tol = r.at("O").tol;
        continue;
      }
      double diff = 0;
      for (size_t k = 0; k < O_one.size(); ++k) diff = std::max(diff, double(std::abs(t.O[k] - O_one[k])));
      INFO("step " << s14::step_name(step) << " splits " << splits);
      CHECK(diff <= tol);
    }
  }
}

TEST_CASE("long caches: 2^k +- 1 up to 32k (FA_TEST_LARGE=1: 128k)") {
  if (small()) return;
  std::vector<int> lens = {32767, 32769};
  if (large()) lens = {131071, 131073};
  for (int q_len : {1, 4}) {
    const fa::DecodeProblem p = contiguous(lens, 8, 1, q_len);
    fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(q_len));
    require_pass(p, {}, fa::Dtype::BF16, run_gpu(p, fa::Dtype::BF16, t, {}));
    const fa::DecodeProblem pp = paged(p, 256);
    fa::DecodeTensors tp = fa::DecodeTensors::make(pp, uint64_t(q_len + 7));
    require_pass(pp, {}, fa::Dtype::BF16, run_gpu(pp, fa::Dtype::BF16, tp, {}));
  }
}

TEST_CASE("the KV append writes the new tokens and nothing else, contiguous and paged") {
  for (int block : {0, 16, 64, 256}) {
    fa::DecodeProblem p = contiguous({300, 4, 77}, 8, 2, 4, 64);
    if (block) p = paged(p, block);
    fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(block + 3));
    const int* table = block ? t.block_table.data() : nullptr;
    std::vector<float> K = t.K_cache, V = t.V_cache;
    s14::append_kv_gpu(p, fa::Dtype::BF16, t.K_new.data(), t.V_new.data(), K.data(), V.data(), table);
    std::vector<float> K_want = t.K_cache, V_want = t.V_cache;
    fa::append_kv_host(p, t.K_new.data(), t.V_new.data(), K_want.data(), V_want.data(), table);
    // Every element equals the host append's, rounded through bf16 (the cache lives in bf16).
    int64_t wrong = 0;
    for (size_t k = 0; k < K.size(); ++k) {
      wrong += std::abs(K[k] - K_want[k]) > 8e-3f * (1.0f + std::abs(K_want[k]));
      wrong += std::abs(V[k] - V_want[k]) > 8e-3f * (1.0f + std::abs(V_want[k]));
    }
    INFO("block_size " << block);
    CHECK(wrong == 0);
    // Then a decode over the appended cache passes against the reference of that cache.
    t.K_cache = K_want;
    t.V_cache = V_want;
    require_pass(p, {}, fa::Dtype::BF16, run_gpu(p, fa::Dtype::BF16, t, {}));
  }
}

TEST_CASE("refusals write nothing; a bad host table is refused by name") {
  fa::DecodeProblem p = paged(contiguous({100, 40}, 8, 2, 1), 16);
  fa::DecodeTensors t = fa::DecodeTensors::make(p, 9);
  std::vector<int> table = t.block_table;
  table[size_t(p.blocks_per_seq + 2)] = p.num_blocks + 7;  // sequence 1 (40 tokens) uses blocks 0..2
  CHECK(refusal([&] {
          s14::decode_gpu(p, fa::Dtype::BF16, t.Q.data(), t.K_cache.data(), t.V_cache.data(), table.data(),
                          t.O.data(), t.L.data());
        }).find("block_table[1][2] = " + std::to_string(p.num_blocks + 7) + " is not allowed") != std::string::npos);
  fa::DecodeProblem q = p;
  q.cache_seqlens = {100, 100000};
  CHECK(refusal([&] {
          s14::decode_gpu(q, fa::Dtype::BF16, t.Q.data(), t.K_cache.data(), t.V_cache.data(), t.block_table.data(),
                          t.O.data(), t.L.data());
        }).find("cache_seqlens[1] = 100000 is not allowed") != std::string::npos);
  for (float x : t.O) REQUIRE(std::isnan(x));
}

TEST_CASE("a bad device block table reads nothing outside the pool") {
  // The device path does not read the table on the host; an entry out of the pool loads its
  // keys as zeros (the result is wrong, but no load leaves the pool: compute-sanitizer agrees).
  fa::DecodeProblem p = paged(contiguous({100}, 4, 1, 1, 64), 16);
  fa::DecodeTensors t = fa::DecodeTensors::make(p, 4);
  std::vector<int> table = t.block_table;
  table[1] = 1 << 28;
  table[2] = -5;
  fa::DeviceBuffer Q(size_t(p.q_elems()) * 2, "Q"), K(size_t(p.cache_elems()) * 2, "K"), V(size_t(p.cache_elems()) * 2, "V");
  fa::DeviceBuffer O(size_t(p.q_elems()) * 2, "O"), L(size_t(p.l_elems()) * 4, "L"), lens(4, "lens"),
      tab(table.size() * 4, "table");
  fa::upload(fa::Dtype::BF16, t.Q.data(), Q.get(), p.q_elems(), nullptr);
  fa::upload(fa::Dtype::BF16, t.K_cache.data(), K.get(), p.cache_elems(), nullptr);
  fa::upload(fa::Dtype::BF16, t.V_cache.data(), V.get(), p.cache_elems(), nullptr);
  REQUIRE(cudaMemcpy(lens.get(), p.cache_seqlens.data(), 4, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(tab.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  s14::decode_device(p, fa::Dtype::BF16, Q.get(), K.get(), V.get(), lens.as<int>(), tab.as<int>(), O.get(),
                     L.as<float>(), nullptr, {s14::Step::Paged, 2});
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> L_host(size_t(p.l_elems()));
  fa::download(fa::Dtype::F32, L.get(), L_host.data(), p.l_elems(), nullptr);
  for (float x : L_host) CHECK(std::isfinite(x));
}
