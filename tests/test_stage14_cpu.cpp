// Stage 14 (decoding), what runs on every machine: the decode problem and its refusals, the
// reference (a paged cache gives the same answer as a contiguous one holding the same
// tokens), the CPU split-KV step against the reference over lengths 0, 1, 2^k ± 1, mixed
// lengths, q_len 1/4/16, GQA ratios 1/4/8, block sizes 16/64/256 with shuffled block tables,
// and split counts 1 … more than there are keys (the result does not depend on the split
// beyond rounding), the append, and the GPU steps' split rule.
//
// The stage is not in the stage list, so the test links the stage alone rather than every
// stage (and test_main.cpp's main, which without FA_GPU_TEST needs nothing of the list).
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode.h"
#include "decode_reference.h"

namespace {

namespace s14 = fa::stage14;

// A decode problem with a contiguous cache of `capacity` (default: the longest length).
fa::DecodeProblem contiguous(std::vector<int> lens, int heads, int kv_heads, int q_len, int d = 64, int capacity = 0) {
  fa::DecodeProblem p = fa::DecodeProblem::sequences(std::move(lens), heads, kv_heads, q_len, d);
  if (capacity > 0) p.capacity = capacity;
  return p;
}

// The same sequences in a paged cache of `block_size` (a pool with a few spare blocks).
fa::DecodeProblem paged(const fa::DecodeProblem& p, int block_size) { return p.in_blocks(block_size, 0, 3); }

// Runs the CPU step on t's inputs and checks it against the reference.
fa::CheckReport run_cpu(const fa::DecodeProblem& p, fa::DecodeTensors& t, s14::CpuOptions o = {}) {
  s14::decode_cpu(p, t.Q.data(), t.K_cache.data(), t.V_cache.data(), p.paged() ? t.block_table.data() : nullptr,
                  t.O.data(), t.L.data(), o);
  return fa::check_decode(p, fa::Dtype::F32, t, t.O.data(), t.L.data());
}

void require_pass(const fa::DecodeProblem& p, const fa::CheckReport& r) {
  INFO(p.describe());
  INFO(r.summary());
  CHECK(r.pass());
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

TEST_SUITE("cpu") {

TEST_CASE("the paged reference equals the contiguous one on the same tokens") {
  for (int block : {16, 64, 256}) {
    const fa::DecodeProblem pc = contiguous({300, 1, 0, 65}, 8, 2, 4);
    const fa::DecodeProblem pp = paged(pc, block);
    fa::DecodeTensors tc = fa::DecodeTensors::make(pc, 1);
    fa::DecodeTensors tp = fa::DecodeTensors::make(pp, 2);
    tp.Q = tc.Q;
    for (int b = 0; b < pc.batch; ++b)  // copy every token of the contiguous cache into its block
      for (int hk = 0; hk < pc.kv_heads; ++hk)
        for (int j = 0; j < pc.cache_seqlens[size_t(b)]; ++j)
          for (int c = 0; c < pc.head_dim; ++c) {
            tp.K_cache[size_t(pp.cache_offset(tp.block_table.data(), b, hk, j) + c)] =
                tc.K_cache[size_t(pc.cache_offset(nullptr, b, hk, j) + c)];
            tp.V_cache[size_t(pp.cache_offset(tp.block_table.data(), b, hk, j) + c)] =
                tc.V_cache[size_t(pc.cache_offset(nullptr, b, hk, j) + c)];
          }
    const auto rc = fa::decode_reference(pc, tc.Q.data(), tc.K_cache.data(), tc.V_cache.data(), nullptr);
    const auto rp = fa::decode_reference(pp, tp.Q.data(), tp.K_cache.data(), tp.V_cache.data(), tp.block_table.data());
    CHECK(rc.O == rp.O);
    CHECK(rc.L == rp.L);
  }
}

TEST_CASE("the reference: an empty cache gives O = 0, L = -inf; causal rows see their prefix") {
  fa::DecodeProblem p = contiguous({0, 3}, 2, 1, 4, 16, 8);
  fa::DecodeTensors t = fa::DecodeTensors::make(p, 3);
  const auto r = fa::decode_reference(p, t.Q.data(), t.K_cache.data(), t.V_cache.data(), nullptr);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) CHECK(r.L[size_t(p.l_offset(0, h, i))] == -INFINITY);
  // Sequence 1 holds 3 tokens with 4 new ones: token 0 sees no key (3 − 4 + 0 + 1 = 0).
  CHECK(p.visible_keys(1, 0) == 0);
  CHECK(p.visible_keys(1, 3) == 3);
  CHECK(r.L[size_t(p.l_offset(1, 0, 0))] == -INFINITY);
  CHECK(std::isfinite(r.L[size_t(p.l_offset(1, 0, 1))]));
}

TEST_CASE("CPU step: lengths 0, 1, 2^k +- 1 and mixed lengths in a batch") {
  for (int q_len : {1, 4, 16}) {
    const fa::DecodeProblem p = contiguous({0, 1, 2, 15, 17, 63, 65, 127, 129, 1023, 1025}, 4, 1, q_len, 32);
    fa::DecodeTensors t = fa::DecodeTensors::make(p, 10 + uint64_t(q_len));
    require_pass(p, run_cpu(p, t, {5, 2}));
  }
}

TEST_CASE("CPU step: GQA ratios 1, 4, 8; q_len 1, 4, 16; causal and not") {
  for (int ratio : {1, 4, 8})
    for (int q_len : {1, 4, 16})
      for (bool causal : {true, false}) {
        fa::DecodeProblem p = contiguous({257, 33}, 8, 8 / ratio, q_len, 64, 300);
        p.causal = causal;
        fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(100 * ratio + q_len));
        require_pass(p, run_cpu(p, t, {3, 2}));
      }
}

TEST_CASE("CPU step: paged caches of blocks 16, 64, 256 with shuffled block tables") {
  for (int block : {16, 64, 256})
    for (int q_len : {1, 16}) {
      const fa::DecodeProblem p = paged(contiguous({511, 0, 16, 17, 256, 1}, 8, 2, q_len), block);
      fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(block + q_len));
      require_pass(p, run_cpu(p, t, {4, 2}));
    }
}

//! [split invariance]
TEST_CASE("CPU step: split count does not change the result beyond rounding") {
  const fa::DecodeProblem p = contiguous({1000, 37, 0}, 4, 2, 4);
  fa::DecodeTensors t = fa::DecodeTensors::make(p, 7);
  run_cpu(p, t, {1, 1});
  const std::vector<float> O_one = t.O;  // one split: stage 05's loop over all the keys
  for (int splits : {2, 3, 7, 64, 1001, 4096}) {  // up to more splits than keys (empty splits)
    fa::DecodeTensors u = t;
    const fa::CheckReport r = run_cpu(p, u, {splits, 2});
    INFO("splits = " << splits << "\n" << r.summary());
    CHECK(r.pass());
    double diff = 0;
    for (size_t k = 0; k < O_one.size(); ++k) diff = std::max(diff, double(std::abs(u.O[k] - O_one[k])));
    CHECK(diff <= r.at("O").tol);  // as close to one split as to the reference: rounding only
  }
}
//! [split invariance]

TEST_CASE("append: the new tokens land at the end of each sequence, contiguous and paged") {
  for (int block : {0, 16}) {
    fa::DecodeProblem p = contiguous({5, 40, 4}, 4, 2, 4, 16, 48);
    if (block) p = paged(p, block);
    fa::DecodeTensors t = fa::DecodeTensors::make(p, 11);
    const int* table = block ? t.block_table.data() : nullptr;
    std::vector<float> K = t.K_cache, V = t.V_cache;
    s14::append_kv_cpu(p, t.K_new.data(), t.V_new.data(), K.data(), V.data(), table);
    for (int b = 0; b < p.batch; ++b)
      for (int hk = 0; hk < p.kv_heads; ++hk)
        for (int i = 0; i < p.q_len; ++i) {
          const int64_t at = p.cache_offset(table, b, hk, p.cache_seqlens[size_t(b)] - p.q_len + i);
          CHECK(K[size_t(at)] == t.K_new[size_t(p.new_kv_offset(b, hk, i))]);
          CHECK(V[size_t(at + 15)] == t.V_new[size_t(p.new_kv_offset(b, hk, i) + 15)]);
        }
    // Nothing else changed: the tokens before them are the old cache's.
    CHECK(K[size_t(p.cache_offset(table, 1, 1, 0))] == t.K_cache[size_t(p.cache_offset(table, 1, 1, 0))]);
  }
}

TEST_CASE("refusals name the value and what is allowed; nothing is written") {
  fa::DecodeProblem p = contiguous({10, 20}, 4, 2, 1, 16, 32);
  fa::DecodeTensors t = fa::DecodeTensors::make(p, 5);
  auto decode = [&](const fa::DecodeProblem& q, const int* table = nullptr, s14::CpuOptions o = {}) {
    return refusal([&] {
      s14::decode_cpu(q, t.Q.data(), t.K_cache.data(), t.V_cache.data(), table, t.O.data(), t.L.data(), o);
    });
  };
  fa::DecodeProblem q = p;
  q.q_len = 17;
  CHECK(decode(q).find("q_len = 17 is not allowed (allowed: 1 to 16") != std::string::npos);
  q = p;
  q.heads = 3;
  CHECK(decode(q).find("heads = 3 is not a multiple of kv_heads = 2") != std::string::npos);
  q = p;
  q.cache_seqlens = {10, 33};
  CHECK(decode(q).find("cache_seqlens[1] = 33 is not allowed (allowed: 0 to 32") != std::string::npos);
  q = p;
  q.cache_seqlens = {10};
  CHECK(decode(q).find("cache_seqlens holds 1 lengths for batch = 2") != std::string::npos);
  q = p;
  q.cache_seqlens = {10, -1};
  CHECK(decode(q).find("cache_seqlens[1] = -1 is not allowed") != std::string::npos);
  CHECK(decode(p, nullptr, {-1, 0}).find("splits = -1 is not allowed") != std::string::npos);
  CHECK(decode(p, nullptr, {0, 5000}).find("threads = 5000 is not allowed") != std::string::npos);

  fa::DecodeProblem pp = paged(p, 16);
  fa::DecodeTensors tp = fa::DecodeTensors::make(pp, 6);
  std::vector<int> table = tp.block_table;
  table[size_t(pp.blocks_per_seq + 1)] = pp.num_blocks;  // sequence 1's second block: out of the pool
  CHECK(decode(pp, table.data()).find("block_table[1][1] = " + std::to_string(pp.num_blocks) +
                                      " is not allowed (allowed: 0 to " + std::to_string(pp.num_blocks - 1)) !=
        std::string::npos);
  table[size_t(pp.blocks_per_seq + 1)] = -3;
  CHECK(decode(pp, table.data()).find("block_table[1][1] = -3 is not allowed") != std::string::npos);
  CHECK(decode(pp, nullptr).find("needs a block table") != std::string::npos);
  q = pp;
  q.block_size = 48;
  CHECK(decode(q, table.data()).find("block_size = 48 is not allowed (allowed: 16, 32, 64, 128, 256)") !=
        std::string::npos);
  // Nothing was written by a refused call: O still holds the poison of make() (NaN).
  for (float x : t.O) REQUIRE(std::isnan(x));
  // Entries past a sequence's used blocks are not read, and so not checked.
  table = tp.block_table;
  table[size_t(pp.blocks_per_seq - 1)] = 1 << 30;  // sequence 0 (10 tokens) uses 1 block of 2
  CHECK(refusal([&] {
          s14::decode_cpu(pp, tp.Q.data(), tp.K_cache.data(), tp.V_cache.data(), table.data(), tp.O.data(),
                          tp.L.data());
        }) == "(not refused)");

  q = p;
  q.cache_seqlens = {10, 0};
  q.q_len = 4;
  CHECK(refusal([&] {
          s14::append_kv_cpu(q, t.K_new.data(), t.V_new.data(), t.K_cache.data(), t.V_cache.data(), nullptr);
        }).find("cache_seqlens[1] = 0 is not allowed (allowed: q_len = 4 or more") != std::string::npos);
}

TEST_CASE("the split rule fills the GPU, keeps splits long, and caps them") {
  // batch 1 x 8 KV heads = 8 blocks on 132 SMs holding 4 each: 66 splits where the keys allow.
  CHECK(s14::split_rule(8, 32768, 132, 4) == 66);
  CHECK(s14::split_rule(8, 1024, 132, 4) == 8);     // 1024 keys: at most 8 splits of 128
  CHECK(s14::split_rule(64, 32768, 132, 1) == 2);   // 128 blocks: one wave; 3 splits would start a second
  CHECK(s14::split_rule(8, 100, 132, 4) == 1);      // too short to split
  CHECK(s14::split_rule(512, 32768, 132, 4) == 1);  // batch 64 x 8: 512 blocks, most of one wave already
  CHECK(s14::split_rule(1, 1 << 20, 132, 4) == s14::kMaxSplits);
  CHECK(s14::parse_step("14c") == s14::Step::GqaPacking);
  CHECK(refusal([] { s14::parse_step("14z"); }).find("step '14z' is not a step") != std::string::npos);
}

}  // TEST_SUITE("cpu")
