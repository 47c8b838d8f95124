// Stage 14's CUDA kernels, unchanged, run on CPU threads (tests/emu/cuda_emu.h): every step
// but 14e (its tensor-core instructions have no emulation), the combine, the paged cache and
// the append against the reference, on machines without a GPU (CI). A block is 128 threads
// meeting at real barriers, so the cases are small; what the emulator cannot see (races,
// cp.async timing) is for compute-sanitizer on a GPU (scripts/gpu/stage14.sh).
#include "cuda_emu.h"  // first: it replaces CUDA's built-in variables and qualifiers

#include "14a_one_block.cu"
#include "14b_split_kv.cu"
#include "14c_gqa_packing.cu"
#include "append_kv.cu"
#include "combine.cu"
#include "14d_paged.cu"

#include <doctest/doctest.h>

#include <sched.h>

#include <thread>
#include <vector>

#include "decode_reference.h"

namespace {

namespace s14 = fa::stage14;
using T = __nv_bfloat16;

// Pins the calling thread, and so the threads it starts, to the core it is running on, for
// the object's lifetime. A block's threads meet at a barrier every few statements; spread over
// cores that other work also wants (a parallel CTest run), each barrier waits for the thread
// that lost its core, and the test took 3× its time alone (13 s instead of 2 s in ctest -j2 on
// 2 cores); on one core a thread that waits hands the core to the next.
struct OneCore {
  cpu_set_t saved;
  bool pinned = false;
  OneCore() {
    const int cpu = sched_getcpu();
    if (cpu < 0 || sched_getaffinity(0, sizeof saved, &saved) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pinned = sched_setaffinity(0, sizeof one, &one) == 0;
  }
  ~OneCore() {
    if (pinned) sched_setaffinity(0, sizeof saved, &saved);
  }
  OneCore(const OneCore&) = delete;
  OneCore& operator=(const OneCore&) = delete;
};

// Runs `k` over `grid`, one block after another, on k.threads std::threads (one per CUDA
// thread, reused from block to block, meeting at a barrier between blocks: the kernel's
// __shared__ memory is one static, so a block must be done before the next starts), all on
// one core (OneCore).
template <class... Args>
void run_grid(const fa::StepKernel& k, dim3 grid, Args... args) {
  const OneCore one_core;
  auto fn = reinterpret_cast<void (*)(Args...)>(const_cast<void*>(k.fn));
  std::barrier<> block(k.threads);
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  for (int w = 0; w * 32 < k.threads; ++w) {
    warps.push_back(std::make_unique<std::barrier<>>(std::min(32, k.threads - 32 * w)));
    emu::warp_barriers[w] = warps.back().get();
  }
  emu::block_barrier = &block;
  std::vector<std::thread> threads;
  for (int t = 0; t < k.threads; ++t)
    threads.emplace_back([&, t] {
      emu::thread_idx = {unsigned(t), 0, 0};
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            emu::block_idx = {x, y, z};
            fn(args...);
            block.arrive_and_wait();
          }
    });
  for (auto& th : threads) th.join();
}

std::vector<T> to_bf16(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  for (size_t k = 0; k < x.size(); ++k) y[k] = __float2bfloat16(x[k]);
  return y;
}

// One decode call as decode_device makes it (same grid, same split rule on a pretend
// 132-SM GPU holding 4 blocks each, unless `splits` is given), on host memory.
void decode_emulated(const fa::DecodeProblem& p, s14::Step step, int splits, fa::DecodeTensors& t) {
  const std::vector<T> Q = to_bf16(t.Q), K = to_bf16(t.K_cache), V = to_bf16(t.V_cache);
  std::vector<T> O(size_t(p.q_elems()));
  const bool packed = step == s14::Step::GqaPacking || step == s14::Step::Paged;
  const int row_tiles = packed ? (p.group_size() * p.q_len + s14::kTileRows - 1) / s14::kTileRows : 1;
  if (step == s14::Step::OneBlock) splits = 1;
  if (splits == 0) splits = s14::split_rule(int64_t(p.batch) * p.kv_heads * row_tiles, p.max_seqlen(), 132, 4);
  const int64_t rows = p.l_elems();
  std::vector<float> O_split(size_t(splits * rows * p.head_dim)), L_split(size_t(splits * rows));

  s14::DecodeParams params = s14::params_of(p);
  params.Q = Q.data();
  params.K_cache = K.data();
  params.V_cache = V.data();
  params.O = O.data();
  params.L = t.L.data();
  params.O_split = O_split.data();
  params.L_split = L_split.data();
  params.cache_seqlens = p.cache_seqlens.data();
  params.block_table = t.block_table.data();
  params.splits = splits;
  params.row_tiles = row_tiles;
  const fa::Dtype dtype = fa::Dtype::BF16;
  switch (step) {
    case s14::Step::OneBlock: run_grid(s14::step_14a(p.head_dim, dtype), dim3(p.kv_heads, p.batch), params); break;
    case s14::Step::SplitKV:
      run_grid(s14::step_14b(p.head_dim, dtype), dim3(splits, p.kv_heads, p.batch), params);
      break;
    case s14::Step::GqaPacking:
      run_grid(s14::step_14c(p.head_dim, dtype), dim3(splits, p.kv_heads * row_tiles, p.batch), params);
      break;
    case s14::Step::Paged:
      run_grid(s14::step_14d(p.head_dim, dtype, p.paged()), dim3(splits, p.kv_heads * row_tiles, p.batch), params);
      break;
    default: FAIL("step " << s14::step_name(step) << " has no CPU emulation");
  }
  if (splits > 1) run_grid(s14::combine_kernel(p.head_dim, dtype), dim3(unsigned(rows)), params);
  for (size_t k = 0; k < O.size(); ++k) t.O[k] = __bfloat162float(O[k]);
}

fa::DecodeProblem problem(std::vector<int> lens, int heads, int kv_heads, int q_len, int d, int block_size) {
  fa::DecodeProblem p = fa::DecodeProblem::sequences(std::move(lens), heads, kv_heads, q_len, d);
  if (block_size > 0) return p.in_blocks(block_size, 1, 0);  // a spare block per sequence
  p.capacity = p.max_seqlen() + 3;
  return p;
}

void check(const fa::DecodeProblem& p, s14::Step step, int splits, uint64_t seed) {
  fa::DecodeTensors t = fa::DecodeTensors::make(p, seed);
  decode_emulated(p, step, splits, t);
  const fa::CheckReport r = fa::check_decode(p, fa::Dtype::BF16, t, t.O.data(), t.L.data());
  INFO(p.describe() << " step " << s14::step_name(step) << " splits " << splits);
  INFO(r.summary());
  CHECK(r.pass());
}

}  // namespace

TEST_CASE("every step on CPU threads: mixed lengths 0, 1, 2^k +- 1; q_len 1 and 4; GQA 1 and 4") {
  // 14e is left out: its mma.sync and ldmatrix have no CPU emulation (the GPU tests check it).
  for (s14::Step step : {s14::Step::OneBlock, s14::Step::SplitKV, s14::Step::GqaPacking, s14::Step::Paged})
    for (int q_len : {1, 4}) {
      check(problem({0, 1, 33, 65}, 4, 1, q_len, 64, 0), step, 3, 1);
      check(problem({31, 2}, 2, 2, q_len, 64, 0), step, 0, 2);
    }
}

TEST_CASE("packed rows past one tile (GQA 8 x q_len 4 = 32 rows), d = 128, non-causal") {
  check(problem({40}, 8, 1, 4, 128, 0), s14::Step::GqaPacking, 2, 3);
  fa::DecodeProblem p = problem({40, 7}, 8, 1, 3, 64, 0);
  p.causal = false;
  check(p, s14::Step::Paged, 2, 4);
}

TEST_CASE("14d on a paged cache: blocks of 16, 64, 256, shuffled tables; splits 1 to more than tiles") {
  for (int block : {16, 64})
    for (int splits : {1, 2, 9}) check(problem({100, 0, 17}, 4, 2, 2, 64, block), s14::Step::Paged, splits, 5);
  check(problem({1000, 257}, 8, 2, 1, 128, 256), s14::Step::Paged, 0, 6);  // the split rule's count
}

TEST_CASE("the append kernel writes the new tokens, contiguous and paged") {
  for (int block : {0, 16}) {
    const fa::DecodeProblem p = problem({9, 20}, 4, 2, 4, 64, block);
    fa::DecodeTensors t = fa::DecodeTensors::make(p, 6);
    std::vector<T> K = to_bf16(t.K_cache), V = to_bf16(t.V_cache);
    const std::vector<T> K_new = to_bf16(t.K_new), V_new = to_bf16(t.V_new);
    s14::DecodeParams params = s14::params_of(p);
    params.cache_seqlens = p.cache_seqlens.data();
    params.block_table = t.block_table.data();
    run_grid(s14::append_kernel(p.head_dim), dim3(p.q_len, p.kv_heads, p.batch), params,
             reinterpret_cast<const uint4*>(K_new.data()), reinterpret_cast<const uint4*>(V_new.data()),
             reinterpret_cast<uint4*>(K.data()), reinterpret_cast<uint4*>(V.data()));
    std::vector<float> K_want = t.K_cache, V_want = t.V_cache;
    fa::append_kv_host(p, t.K_new.data(), t.V_new.data(), K_want.data(), V_want.data(),
                       block ? t.block_table.data() : nullptr);
    int64_t wrong = 0;
    for (size_t k = 0; k < K.size(); ++k)
      wrong += __bfloat162float(K[k]) != __bfloat162float(__float2bfloat16(K_want[k])) ||
               __bfloat162float(V[k]) != __bfloat162float(__float2bfloat16(V_want[k]));
    INFO("block_size " << block);
    CHECK(wrong == 0);
  }
}
