// Stage 13's CPU step: the block mask and score modifiers in stage 06's tiled loop.
//  - the shared matrix (docs/design.md §6) with no modifiers: causal as one block mask;
//  - the masked reference: its mask against a brute-force reading of the definitions, its
//    backward (dsinks and soft-cap's derivative included) against central differences;
//  - the mask: keep() against the reference's mask_keeps() element by element, every tile's
//    classification against a count of its visible entries (and a wrong one caught);
//  - forward and backward against the reference per modifier and in combinations, over
//    shapes with tails, GQA and tile sizes that do not divide N;
//  - the tile counts, and refusals of bad modifiers before anything is written.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mask_reference.h"
#include "masked_backward.h"
#include "masks.h"
#include "modifier_cases.h"
#include "stage13_mask_checks.h"
#include "stage_checks.h"

namespace {

using fa::Modifiers;
using fa::Problem;
using fa::test::documents;
using fa::test::misclassified;
using fa::test::sink_logits;
namespace s13 = fa::stage13;

constexpr auto make = &fa::test::make_problem;

s13::Config tiles(int block_q, int block_k) {
  s13::Config c;
  c.block_q = block_q;
  c.block_k = block_k;
  return c;
}

// Runs the stage (forward, and backward when asked) and checks it against the reference.
fa::CheckReport run_and_check(const Problem& p, const Modifiers& m, const s13::Config& c, bool backward,
                              uint64_t seed = 1) {
  fa::Tensors t = fa::Tensors::make(p, seed, fa::Dist::Normal, backward);
  std::vector<float> dsinks(size_t(p.heads), std::numeric_limits<float>::quiet_NaN());
  s13::forward(p, m, c, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
  if (backward)
    s13::backward(p, m, c, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), t.dO.data(), t.dQ.data(),
                  t.dK.data(), t.dV.data(), dsinks.data());
  return fa::compare_masked(p, m, t, backward, dsinks.data());
}

void expect_pass(const Problem& p, const Modifiers& m, const s13::Config& c, bool backward = true) {
  const fa::CheckReport r = run_and_check(p, m, c, backward);
  INFO(p.describe(), " | ", m.describe(), " | B_r=", c.block_q, " B_c=", c.block_k, "\n", r.summary());
  CHECK(r.pass());
}

// The shapes the modifiers run over: tails, N_q ≠ N_k both ways, one row, GQA.
std::vector<Problem> modifier_shapes() {
  return {make(1, 1, 1, 1, 1, 16, false),    make(1, 2, 1, 17, 17, 16, false), make(1, 4, 2, 97, 97, 32, false),
          make(2, 2, 2, 64, 128, 16, false), make(1, 2, 1, 130, 77, 64, false), make(1, 2, 2, 77, 130, 16, false)};
}

// Every modifier alone and the combinations, causal and not.
std::vector<std::pair<std::string, Modifiers>> modifier_sets(int heads) {
  std::vector<std::pair<std::string, Modifiers>> sets;
  const auto add = [&](const std::string& name, auto edit) {
    Modifiers m;
    edit(m);
    sets.push_back({name, m});
  };
  add("window 0", [](Modifiers& m) { m.window_left = 0, m.window_right = 0; });
  add("window (5, 3)", [](Modifiers& m) { m.window_left = 5, m.window_right = 3; });
  add("window left 16", [](Modifiers& m) { m.window_left = 16; });
  add("window right 2", [](Modifiers& m) { m.window_right = 2; });
  add("window >= N", [](Modifiers& m) { m.window_left = 1000, m.window_right = 1000; });
  add("softcap 2", [](Modifiers& m) { m.softcap = 2.0; });
  add("softcap 0.05 (tanh saturates)", [](Modifiers& m) { m.softcap = 0.05; });
  add("alibi", [&](Modifiers& m) { m.alibi_slopes = fa::alibi_slopes(heads); });
  add("sinks", [&](Modifiers& m) { m.sinks = sink_logits(heads); });
  add("softcap + alibi", [&](Modifiers& m) { m.softcap = 1.5, m.alibi_slopes = fa::alibi_slopes(heads); });
  add("window + softcap + alibi + sinks", [&](Modifiers& m) {
    m.window_left = 9, m.softcap = 3.0, m.alibi_slopes = fa::alibi_slopes(heads), m.sinks = sink_logits(heads);
  });
  return sets;
}

// A mask that skips one tile that holds visible entries: what a wrong classify would do.
struct SkipsOneTile {
  s13::BlockMask real;
  int64_t r0_bad, c0_bad;
  s13::KeyInterval keys(int64_t row) const { return real.keys(row); }
  int64_t diagonal(int64_t row) const { return real.diagonal(row); }
  std::pair<int64_t, int64_t> rows_touching(int64_t c0, int64_t c1) const { return real.rows_touching(c0, c1); }
  s13::TileKind classify(int64_t r0, int64_t rows, int64_t c0, int64_t cols) const {
    if (r0 == r0_bad && c0 == c0_bad) return s13::TileKind::Skip;
    return real.classify(r0, rows, c0, cols);
  }
};

}  // namespace

TEST_CASE("stage 13 with no modifiers passes the shared matrix (causal is one block mask)") {
  const fa::StageInfo s = s13::info();
  fa::test::check_matrix(s, fa::Dtype::F32, true);
  fa::test::check_adversarial(s, fa::Dtype::F32, true);
  fa::test::check_nonfinite_semantics(s, fa::Dtype::F32, true);
  fa::test::check_properties(s, fa::Dtype::F32, true);
  fa::test::check_refusals(s, fa::Dtype::F32);
}

TEST_CASE("the masked reference's mask follows the definitions; its backward matches central differences") {
  // One document of 5 rows and 7 keys, causal, window left 2: row i sees keys i+2−2 … i+2.
  const Problem p = make(1, 1, 1, 5, 7, 16, true);
  Modifiers w;
  w.window_left = 2;
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 7; ++j) CHECK(fa::mask_keeps(p, w, i, j) == (j <= i + 2 && j >= i));
  // Documents: a key of another document is never seen; an empty document holds nothing.
  const Problem pd = make(1, 1, 1, 6, 6, 16, false);
  const Modifiers d = documents({2, 0, 4}, {2, 0, 4});
  CHECK(fa::mask_keeps(pd, d, 1, 0));
  CHECK_FALSE(fa::mask_keeps(pd, d, 1, 2));
  CHECK(fa::mask_keeps(pd, d, 2, 5));
  CHECK(fa::diagonal_key(pd, d, 3) == 3);

  // The gradient of Σ dO∘O by central differences, every modifier at once, in double.
  Problem q = make(1, 2, 1, 6, 7, 4, true);
  Modifiers m = documents({2, 4}, {3, 4});
  m.window_left = 2;
  m.softcap = 0.8;
  m.alibi_slopes = fa::alibi_slopes(2);
  m.sinks = sink_logits(2);
  fa::Tensors t = fa::Tensors::make(q, 3, fa::Dist::Normal, true);
  const fa::MaskedReference g = fa::reference_backward_masked(q, m, t.Q.data(), t.K.data(), t.V.data(), t.dO.data());
  const auto loss = [&]() {
    const fa::MaskedReference f = fa::reference_forward_masked(q, m, t.Q.data(), t.K.data(), t.V.data());
    double s = 0;
    for (size_t x = 0; x < f.O.size(); ++x) s += f.O[x] * double(t.dO[x]);
    return s;
  };
  const auto check_grad = [&](std::vector<float>& x, const std::vector<double>& grad, const char* name) {
    for (size_t k = 0; k < x.size(); ++k) {
      const float x0 = x[k];
      x[k] = x0 + 1e-3f;
      const double up = loss(), hi = x[k];
      x[k] = x0 - 1e-3f;
      const double down = loss(), lo = x[k];
      x[k] = x0;
      INFO(name, "[", k, "]");
      CHECK(grad[k] == doctest::Approx((up - down) / (hi - lo)).epsilon(1e-4).scale(1.0));
    }
  };
  check_grad(t.Q, g.dQ, "dQ");
  check_grad(t.K, g.dK, "dK");
  check_grad(t.V, g.dV, "dV");
  for (int h = 0; h < 2; ++h) {
    const float s0 = m.sinks[size_t(h)];
    m.sinks[size_t(h)] = s0 + 1e-3f;
    const double up = loss(), hi = m.sinks[size_t(h)];
    m.sinks[size_t(h)] = s0 - 1e-3f;
    const double down = loss(), lo = m.sinks[size_t(h)];
    m.sinks[size_t(h)] = s0;
    CHECK(g.dsinks[size_t(h)] == doctest::Approx((up - down) / (hi - lo)).epsilon(1e-4).scale(1.0));
  }
}

TEST_CASE("a wrong classification is caught: by the tile count and by the reference") {
  const Problem p = make(1, 1, 1, 64, 64, 16, true);
  const Modifiers m;
  const s13::BlockMask real(p, m);
  const SkipsOneTile broken{real, 32, 16};  // tile (2, 1) of 16 × 16: under the diagonal, full
  CHECK(misclassified(p, m, real, 16, 16, true) == 0);
  CHECK(misclassified(p, m, broken, 16, 16, true) == 1);

  // The loop run with the broken mask misses the keys of that tile, forward and backward.
  const fa::stage06::Tiles t16 = fa::stage06::tiles_for(p, tiles(16, 16));
  fa::Tensors t = fa::Tensors::make(p, 5, fa::Dist::Normal, true);
  s13::forward_tiles(p, m, t16, broken, s13::Score<false, false>{}, t.Q.data(), t.K.data(), t.V.data(), t.O.data(),
                     t.L.data(), nullptr);
  s13::backward_tiles(p, m, t16, broken, s13::Score<false, false>{}, t.Q.data(), t.K.data(), t.V.data(), t.O.data(),
                      t.L.data(), t.dO.data(), t.dQ.data(), t.dK.data(), t.dV.data(), nullptr, nullptr);
  const fa::CheckReport r = fa::compare_masked(p, m, t, true);
  for (const char* name : {"O", "L", "dQ", "dK", "dV"}) CHECK_FALSE(r.at(name).pass);
  // The same loop with the real mask passes.
  t.poison_outputs();
  s13::forward_tiles(p, m, t16, real, s13::Score<false, false>{}, t.Q.data(), t.K.data(), t.V.data(), t.O.data(),
                     t.L.data(), nullptr);
  s13::backward_tiles(p, m, t16, real, s13::Score<false, false>{}, t.Q.data(), t.K.data(), t.V.data(), t.O.data(),
                      t.L.data(), t.dO.data(), t.dQ.data(), t.dK.data(), t.dV.data(), nullptr, nullptr);
  CHECK(fa::compare_masked(p, m, t, true).pass());
}

TEST_CASE("every modifier and combination, forward and backward, against the reference") {
  for (const Problem& base : modifier_shapes())
    for (bool causal : {false, true}) {
      Problem p = base;
      p.causal = causal;
      for (const auto& [name, m] : modifier_sets(p.heads)) {
        INFO(name);
        expect_pass(p, m, tiles(16, 32));
      }
    }
  // Stage 06's tile sizes from the budget (B_c = 256 at d = 16), and sizes that divide nothing.
  const Problem p = make(1, 2, 1, 255, 255, 16, true);
  for (const auto& [name, m] : modifier_sets(p.heads)) {
    INFO(name);
    expect_pass(p, m, tiles(0, 0));
    expect_pass(p, m, tiles(7, 13));
  }
}

TEST_CASE("the shape matrix of docs/design.md section 6 under the modifiers together") {
  // Every shape of the shared matrix (tails, N_q ≠ N_k, GQA, every CPU head dim, causal and
  // not), with a window, soft-cap, ALiBi and sinks at once, and documents where the batch is one
  // row; stage 06's tile sizes from the budget, then sizes that divide nothing.
  for (const Problem& p : fa::test::shape_matrix(fa::test::tested_head_dims(s13::info()))) {
    Modifiers m;
    m.window_left = 40;
    if (!p.causal) m.window_right = 7;
    m.softcap = 4.0;
    m.alibi_slopes = fa::alibi_slopes(p.heads);
    m.sinks = sink_logits(p.heads);
    if (p.batch == 1 && p.seq_q == p.seq_k && p.seq_q > 2) {
      const int64_t n = p.seq_q, a = n / 3;
      m.cu_seqlens_q = m.cu_seqlens_k = fa::cu_seqlens_of({a, 0, 1, n - a - 1}, "test");
    }
    expect_pass(p, m, tiles(0, 0));
    if (p.seq_q <= 300) expect_pass(p, m, tiles(24, 40));
  }
}

TEST_CASE("documents: packed sequences, one-token and empty documents, with windows and modifiers") {
  const auto with = [](Modifiers m, auto edit) {
    edit(m);
    return m;
  };
  const Modifiers ones = documents(std::vector<int64_t>(12, 1), std::vector<int64_t>(12, 1));
  const Modifiers empty = documents({0, 5, 0, 0, 17, 0, 40, 0}, {0, 5, 0, 0, 17, 0, 40, 0});
  const Modifiers cross = documents({3, 0, 10, 30}, {5, 2, 1, 60});  // n_q ≠ n_k per document
  const Modifiers short_end = documents({10, 20}, {10, 20});          // rows 30 … 44 see nothing
  for (bool causal : {false, true}) {
    expect_pass(make(1, 2, 1, 12, 12, 16, causal), ones, tiles(4, 4));
    expect_pass(make(1, 2, 1, 62, 62, 16, causal), empty, tiles(16, 16));
    expect_pass(make(1, 4, 2, 62, 62, 32, causal), with(empty, [](Modifiers& m) { m.window_left = 4; }), tiles(8, 16));
    expect_pass(make(1, 2, 1, 43, 68, 16, causal), cross, tiles(16, 16));
    expect_pass(make(1, 2, 1, 43, 68, 16, causal),
                with(cross, [](Modifiers& m) { m.softcap = 1.0, m.alibi_slopes = fa::alibi_slopes(2); }), tiles(8, 8));
    expect_pass(make(1, 2, 1, 45, 45, 16, causal), short_end, tiles(16, 16));
    expect_pass(make(1, 2, 1, 45, 45, 16, causal), with(short_end, [](Modifiers& m) { m.sinks = sink_logits(2); }),
                tiles(16, 16));
  }
  // Every document empty: every row sees nothing (O = 0, L = −∞; with sinks L = σ).
  expect_pass(make(1, 1, 1, 0, 0, 16, false), documents({0, 0}, {0, 0}), tiles(4, 4));
}

TEST_CASE("ALiBi slopes are the usual geometric series") {
  const std::vector<float> s8 = fa::alibi_slopes(8);
  REQUIRE(s8.size() == 8);
  for (int h = 0; h < 8; ++h) CHECK(s8[size_t(h)] == std::exp2(-float(h + 1)));  // 2^(−8(h+1)/8)
  const std::vector<float> s4 = fa::alibi_slopes(4);
  for (int h = 0; h < 4; ++h) CHECK(s4[size_t(h)] == std::exp2(-2.0f * float(h + 1)));
  // 12 heads: the 8-head series, then every other slope of the 16-head one: 2^−0.5, 2^−1.5, …
  const std::vector<float> s12 = fa::alibi_slopes(12);
  REQUIRE(s12.size() == 12);
  for (int k = 0; k < 4; ++k) CHECK(s12[size_t(8 + k)] == doctest::Approx(std::exp2(-0.5 - double(k))));
}

TEST_CASE("soft-capping saturates: the capped logits and the gradient through tanh stay right") {
  // Logits in the hundreds (cap·tanh(s/cap) = ±cap almost everywhere: the derivative is ~0).
  const Problem p = make(1, 2, 1, 65, 65, 32, true);
  Modifiers m;
  m.softcap = 0.5;
  fa::Tensors t = fa::Tensors::make(p, 9, fa::Dist::LargeLogits, true);
  std::vector<float> dsinks(2);
  s13::forward(p, m, tiles(16, 16), t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
  s13::backward(p, m, tiles(16, 16), t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), t.dO.data(),
                t.dQ.data(), t.dK.data(), t.dV.data(), dsinks.data());
  const fa::CheckReport r = fa::compare_masked(p, m, t, true);
  INFO(r.summary());
  CHECK(r.pass());
}

TEST_CASE("tile counts: what the loops skip is what classify says, and causal skips the triangle") {
  const Problem p = make(1, 2, 1, 128, 128, 16, true);
  fa::Tensors t = fa::Tensors::make(p, 1, fa::Dist::Normal, true);
  s13::TileCounts fwd, bwd;
  s13::forward(p, Modifiers{}, tiles(16, 16), t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), &fwd);
  // 8 × 8 tiles per head: 28 above the diagonal skipped, 8 on it partial, 28 below full.
  CHECK(fwd == s13::TileCounts{2 * 28, 2 * 28, 2 * 8});
  CHECK(fwd == s13::count_tiles(p, Modifiers{}, tiles(16, 16)));
  s13::backward(p, Modifiers{}, tiles(16, 16), t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(),
                t.dO.data(), t.dQ.data(), t.dK.data(), t.dV.data(), nullptr, &bwd);
  CHECK(bwd == s13::TileCounts{4 * 28, 4 * 28, 4 * 8});  // the dK/dV pass and the dQ pass

  // A window of 16 behind the diagonal: each query tile sees its diagonal tile and the one before.
  Modifiers w;
  w.window_left = 16;
  const s13::TileCounts cw = s13::count_tiles(p, w, tiles(16, 16));
  CHECK(cw.full == 0);
  CHECK(cw.partial == 2 * (8 + 7));
  CHECK(cw.skip == 2 * 64 - cw.partial);
  // Documents of 32 tokens aligned to the tiles: the off-diagonal blocks are skipped whole.
  const Problem pd = make(1, 1, 1, 128, 128, 16, false);
  const s13::TileCounts cd = s13::count_tiles(pd, documents({32, 32, 32, 32}, {32, 32, 32, 32}), tiles(16, 16));
  CHECK(cd == s13::TileCounts{64 - 16, 16, 0});
}

TEST_CASE("bad modifiers are refused with the value named, before anything is written") {
  const Problem p = make(1, 2, 1, 10, 10, 16, false);
  const auto refused = [&](const Modifiers& m, const std::string& words) {
    fa::Tensors t = fa::Tensors::make(p, 1, fa::Dist::Normal, false);
    std::string message;
    try {
      s13::forward(p, m, tiles(4, 4), t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("13_masks: ") == 0);
    CHECK(message.find(words) != std::string::npos);
    CHECK(std::isnan(t.O[0]));  // nothing written
    CHECK(std::isnan(t.L[0]));
  };
  Modifiers m;
  m.window_left = -1;
  refused(m, "window_left = -1 is not allowed");
  m = Modifiers{};
  m.window_right = -5;
  refused(m, "window_right = -5");
  m = Modifiers{};
  m.softcap = -1;
  refused(m, "softcap = -1");
  m.softcap = std::numeric_limits<double>::quiet_NaN();
  refused(m, "softcap = nan");
  // Finite in double, but not a normal float: the kernels' cap would be inf or 0 (NaN out).
  m.softcap = 1e300;
  refused(m, "softcap = 1e+300 is not allowed (the cap must be 0, which turns soft-capping off, or a float");
  m.softcap = 1e-44;
  refused(m, "softcap = 1e-44");
  m = Modifiers{};
  m.alibi_slopes = fa::alibi_slopes(3);
  refused(m, "alibi_slopes has 3 entries (one per query head: heads = 2)");
  m = Modifiers{};
  m.sinks = {1.0f};
  refused(m, "sinks has 1 entries");
}

TEST_CASE("bad cu_seqlens are refused") {
  const Problem p = make(1, 2, 1, 10, 10, 16, false);
  const auto message = [&](const Modifiers& m) {
    try {
      m.validate(p, "13_masks");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Modifiers m;
  m.cu_seqlens_q = m.cu_seqlens_k = {1, 4, 10};
  CHECK(message(m) == "13_masks: cu_seqlens_q starts at 1 (it must start at 0)");
  m.cu_seqlens_q = m.cu_seqlens_k = {0, 6, 4, 10};
  CHECK(message(m).find("cu_seqlens_q decreases at entry 2 (6 then 4") != std::string::npos);
  m.cu_seqlens_q = m.cu_seqlens_k = {0, 4, 11};
  CHECK(message(m) == "13_masks: cu_seqlens_q ends at 11, past the tensor (seq_q = 10)");
  m.cu_seqlens_q = {0, 4, 10};
  m.cu_seqlens_k = {0, 10};
  CHECK(message(m).find("cu_seqlens_q has 2 documents and cu_seqlens_k 1") != std::string::npos);
  m.cu_seqlens_k = {};
  CHECK(message(m).find("cu_seqlens_q is given without cu_seqlens_k") != std::string::npos);
  m.cu_seqlens_q = m.cu_seqlens_k = {0, 4, 10};
  CHECK(message(m) == "accepted");
  CHECK(message(documents({4, 6}, {4, 6})) == "accepted");
  Problem b2 = p;
  b2.batch = 2;
  try {
    m.validate(b2, "13_masks");
    FAIL("batch 2 with documents was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("batch = 2 with cu_seqlens") != std::string::npos);
  }
  CHECK_THROWS_AS(fa::cu_seqlens_of({3, -1}, "13_masks"), std::invalid_argument);
}
