// Stage 08 (tensor-core forward, bf16/f16): the shared matrix in both dtypes, plus what is
// particular to this kernel.
//
// Test suite "cpu" — the index math, checked exhaustively without a GPU (tile_index.h):
//   the shared-memory layouts (bijective; ldmatrix, cp.async and the O staging free of
//   bank conflicts; the plain layout really conflicts), the split of ldmatrix addresses
//   into a lane part and a constant, the ldmatrix lane patterns against the PTX rules for
//   ldmatrix and the m16n8k16 fragments (emulated here), the reuse of S's accumulators as
//   the A operand of P·V, and the causal tile ranges against Problem::visible_keys.
// GPU tests: check_matrix / adversarial / properties / refusals / random shapes for BF16 and
//   F16, for the default and for step 08a (bitwise equal to the default: only the loads move);
//   every ablation variant and both d = 128 tiles against the reference; refusals of
//   misaligned pointers, head dims and dtypes at the device entry (nothing written); empty
//   sequences; a non-default stream; the launch report; > 2³¹ elements (FA_TEST_LARGE=1).
//
// Environment: FA_TEST_SMALL=1 shrinks the cases (compute-sanitizer runs); FA_TEST_LARGE=1
// adds the > 2³¹-element case.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "problem.h"
#include "sm80/tile_index.h"
#include "stage_checks.h"
#include "stage_list.h"

namespace {

constexpr auto make = &fa::test::make_problem;

namespace s8 = fa::stage08;
using s8::SmemLayout;


const char* layout_name(SmemLayout l) {
  return l == SmemLayout::Swizzled ? "swizzled" : l == SmemLayout::Padded ? "padded" : "plain";
}

// The layouts each head dim is built with (the swizzle needs 4 or a multiple of 8 chunks).
std::vector<SmemLayout> layouts_for(int d) {
  if (s8::swizzle_supported(d)) return {SmemLayout::Swizzled, SmemLayout::Padded, SmemLayout::Plain};
  return {SmemLayout::Padded, SmemLayout::Plain};
}

// The 16-byte slot (0..7) of a 128-byte line that a byte offset falls in: ldmatrix and
// 16-byte stores are free of bank conflicts when the 8 rows of one phase use 8 slots.
int slot_of_element(int element_offset) { return (element_offset * 2 / 16) % 8; }

// How many of `offsets` (element offsets of 16-byte accesses) share the busiest slot.
int worst_slot_sharing(const std::vector<int>& offsets) {
  std::map<int, int> count;
  int worst = 0;
  for (int o : offsets) worst = std::max(worst, ++count[slot_of_element(o)]);
  return worst;
}

// ---- The PTX rules, written out independently of the kernel's helpers ------------------
// ldmatrix.x4: lanes 8q..8q+7 give the addresses of rows 0..7 of matrix q. Afterwards lane
// L holds, in register q, (row L/4, columns 2(L%4), 2(L%4)+1) of matrix q; with .trans,
// (rows 2(L%4), 2(L%4)+1, column L/4).
// m16n8k16: A register i holds (g + 8(i%2), 2t + 8(i/2)) and the next column; B register i
// holds (k = 2t + 8i, n = g) and k + 1; C element e is (g + 8(e/2), 2t + e%2).
struct Pos {
  int row, col;
  bool operator==(const Pos& o) const { return row == o.row && col == o.col; }
};

Pos a_fragment(int lane, int reg, int half) {
  return {lane / 4 + 8 * (reg % 2), 2 * (lane % 4) + 8 * (reg / 2) + half};
}
Pos b_fragment(int lane, int reg, int half) {  // (k, n)
  return {2 * (lane % 4) + 8 * reg + half, lane / 4};
}
Pos c_fragment(int lane, int e) { return {lane / 4 + 8 * (e / 2), 2 * (lane % 4) + e % 2}; }

// A tile of `rows` rows of d elements in "shared memory": element (r, c) of the logical
// tile holds the value id(r, c) and is stored at smem_offset(r, c / 8) + c % 8.
struct EmulatedTile {
  int rows, d;
  SmemLayout layout;
  std::vector<int> mem;
  static int id(int r, int c) { return 1 + r * 1000 + c; }
  EmulatedTile(int rows_, int d_, SmemLayout layout_) : rows(rows_), d(d_), layout(layout_) {
    mem.assign(size_t(s8::smem_tile_bytes(rows, d, layout) / 2), 0);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < d; ++c) mem[size_t(s8::smem_offset(r, c / 8, d, layout) + c % 8)] = id(r, c);
  }
  // ldmatrix.x4 with the lanes' element offsets; returns [lane][reg][half] values.
  std::array<std::array<std::array<int, 2>, 4>, 32> ldmatrix(const std::array<int, 32>& addr, bool trans) const {
    std::array<std::array<std::array<int, 2>, 4>, 32> out{};
    for (int lane = 0; lane < 32; ++lane)
      for (int q = 0; q < 4; ++q)
        for (int half = 0; half < 2; ++half) {
          const int row = trans ? 2 * (lane % 4) + half : lane / 4;
          const int col = trans ? lane / 4 : 2 * (lane % 4) + half;
          out[size_t(lane)][size_t(q)][size_t(half)] = mem[size_t(addr[size_t(8 * q + row)] + col)];
        }
    return out;
  }
};

// The addresses the kernel gives ldmatrix for block (br, bc): lane part + constant.
std::array<int, 32> kernel_addresses(int br, int bc, int d, SmemLayout layout, bool pattern_x) {
  std::array<int, 32> a{};
  const int v = s8::ldsm_variants(d, layout);
  for (int lane = 0; lane < 32; ++lane) {
    const int lr = pattern_x ? s8::ldsm_row_x(lane) : s8::ldsm_row_y(lane);
    const int lc = pattern_x ? s8::ldsm_chunk_x(lane) : s8::ldsm_chunk_y(lane);
    a[size_t(lane)] = s8::ldsm_lane_offset(lr, lc, bc % v, d, layout) + s8::ldsm_block_offset(br, bc, d, layout);
  }
  return a;
}

}  // namespace

// ======================================================================================
// Index math, no GPU needed
// ======================================================================================

TEST_SUITE("cpu") {
  TEST_CASE("08: every layout stores each element of a tile at its own place") {
    for (int d : {32, 64, 96, 128, 256})
      for (SmemLayout layout : layouts_for(d)) {
        const int rows = 128;
        std::set<int> seen;
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < d / 8; ++c) {
            const int o = s8::smem_offset(r, c, d, layout);
            CHECK(o % 8 == 0);  // 16-byte aligned chunks
            CHECK(o >= 0);
            CHECK(o + 8 <= s8::smem_tile_bytes(rows, d, layout) / 2);
            seen.insert(o);
          }
        INFO("d = " << d << ", " << layout_name(layout));
        CHECK(int(seen.size()) == rows * d / 8);
        if (layout == SmemLayout::Swizzled) {  // a permutation of the chunks within each row
          for (int r = 0; r < rows; ++r) {
            std::set<int> row_chunks;
            for (int c = 0; c < d / 8; ++c) row_chunks.insert(s8::swizzle_chunk(r, c, d / 8));
            CHECK(int(row_chunks.size()) == d / 8);
            CHECK(*row_chunks.rbegin() == d / 8 - 1);
          }
        }
      }
    CHECK_FALSE(s8::swizzle_supported(96));
    CHECK(s8::smem_tile_bytes(64, 64, SmemLayout::Padded) == 64 * 72 * 2);
  }

  TEST_CASE("08: ldmatrix reads are free of bank conflicts, except in the plain layout") {
    for (int d : {32, 64, 96, 128, 256})
      for (SmemLayout layout : layouts_for(d)) {
        int worst = 0;
        for (int r0 = 0; r0 < 128; r0 += 8)  // one phase: 8 consecutive rows, same chunk
          for (int c = 0; c < d / 8; ++c) {
            std::vector<int> offsets;
            for (int r = r0; r < r0 + 8; ++r) offsets.push_back(s8::smem_offset(r, c, d, layout));
            worst = std::max(worst, worst_slot_sharing(offsets));
          }
        INFO("d = " << d << ", " << layout_name(layout) << ": up to " << worst << " rows share a slot");
        if (layout == SmemLayout::Plain)
          CHECK(worst == (d == 32 || d == 96 ? 4 : 8));  // 64- and 192-byte rows: 4-way
        else
          CHECK(worst == 1);
      }
  }

  TEST_CASE("08: cp.async writes and the O staging stores are free of bank conflicts") {
    const int threads = 128;
    for (int d : {32, 64, 96, 128, 256})
      for (SmemLayout layout : layouts_for(d)) {
        if (layout == SmemLayout::Plain) continue;
        INFO("d = " << d << ", " << layout_name(layout));
        // load_tile_async: chunk c = tid + it·threads is row c / (d/8), chunk c % (d/8);
        // a warp's 32 copies go out in 4 phases of 8 lanes. Swizzled: no conflict. Padded:
        // where 8 lanes span two rows (d = 32, 96) two of them may meet.
        const int C = d / 8;
        int worst = 0;
        for (int it = 0; it < 64 * C / threads; ++it)
          for (int first = 0; first < threads; first += 8) {
            std::vector<int> offsets;
            for (int tid = first; tid < first + 8; ++tid) {
              const int c = tid + it * threads;
              offsets.push_back(s8::smem_offset(c / C, c % C, d, layout));
            }
            worst = std::max(worst, worst_slot_sharing(offsets));
          }
        CHECK(worst == (layout == SmemLayout::Padded && (d == 32 || d == 96) ? 2 : 1));
        // The epilogue: lane (g, t) stores 4 bytes at row base + g (+8), column 8·dt + 2t.
        for (int base : {0, 8, 16, 48})
          for (int dt = 0; dt < C; ++dt) {
            std::set<int> banks;
            for (int lane = 0; lane < 32; ++lane)
              banks.insert(((s8::smem_offset(base + lane / 4, dt, d, layout) + 2 * (lane % 4)) * 2 / 4) % 32);
            CHECK(banks.size() == 32);
          }
      }
  }

  TEST_CASE("08: an ldmatrix address is the lane part plus a compile-time constant") {
    for (int d : {32, 64, 96, 128, 256})
      for (SmemLayout layout : layouts_for(d)) {
        INFO("d = " << d << ", " << layout_name(layout));
        const int v = s8::ldsm_variants(d, layout);
        for (int br = 0; br < 8; ++br)
          for (int bc = 0; bc < d / 16; ++bc)
            for (int lr = 0; lr < 16; ++lr)
              for (int lc = 0; lc < 2; ++lc)
                CHECK(s8::smem_offset(16 * br + lr, 2 * bc + lc, d, layout) ==
                      s8::ldsm_lane_offset(lr, lc, bc % v, d, layout) + s8::ldsm_block_offset(br, bc, d, layout));
        // A warp's rows start at a multiple of 16, so they can be folded into the base.
        CHECK(s8::ldsm_block_offset(3, 0, d, layout) == 3 * 16 * s8::smem_row_stride(d, layout));
      }
  }

  TEST_CASE("08: the ldmatrix lane patterns produce the m16n8k16 fragments (PTX rules emulated)") {
    for (int d : {32, 64, 96, 128})
      for (SmemLayout layout : layouts_for(d)) {
        const EmulatedTile tile(64, d, layout);
        INFO("d = " << d << ", " << layout_name(layout));
        for (int br = 0; br < 4; ++br)
          for (int bc = 0; bc < d / 16; ++bc) {
            const int r0 = 16 * br, c0 = 16 * bc;
            // A stored [m][k] (Q_i): pattern X, no transpose → a[0..3].
            const auto qa = tile.ldmatrix(kernel_addresses(br, bc, d, layout, true), false);
            // B stored [n][k] (K_j): pattern Y, no transpose → {b0, b1} of n 0-7, then of n 8-15.
            const auto kb = tile.ldmatrix(kernel_addresses(br, bc, d, layout, false), false);
            // B stored [k][n] (V_j): pattern X, .trans → {b0, b1} of n 0-7, then of n 8-15.
            const auto vb = tile.ldmatrix(kernel_addresses(br, bc, d, layout, true), true);
            // A stored [k][m] (stage 09's transposed operands): pattern Y, .trans → a[0..3].
            const auto ta = tile.ldmatrix(kernel_addresses(br, bc, d, layout, false), true);
            bool ok = true;
            for (int lane = 0; lane < 32; ++lane)
              for (int half = 0; half < 2; ++half) {
                for (int reg = 0; reg < 4; ++reg) {
                  const Pos a = a_fragment(lane, reg, half);  // A[m][k]
                  ok = ok && qa[size_t(lane)][size_t(reg)][size_t(half)] == EmulatedTile::id(r0 + a.row, c0 + a.col);
                  ok = ok && ta[size_t(lane)][size_t(reg)][size_t(half)] == EmulatedTile::id(r0 + a.col, c0 + a.row);
                  const int n_tile = reg / 2;
                  const Pos b = b_fragment(lane, reg % 2, half);  // B[k][n] within the n8 tile
                  ok = ok && kb[size_t(lane)][size_t(reg)][size_t(half)] ==
                                 EmulatedTile::id(r0 + 8 * n_tile + b.col, c0 + b.row);  // K[n][k]
                  ok = ok && vb[size_t(lane)][size_t(reg)][size_t(half)] ==
                                 EmulatedTile::id(r0 + b.row, c0 + 8 * n_tile + b.col);  // V[k][n]
                }
              }
            CHECK_MESSAGE(ok, "block (" << br << ", " << bc << ")");
          }
      }
  }

  TEST_CASE("08: two C fragments side by side are the A fragment of P (no data movement)") {
    // accumulators_to_a_fragment (mma.cuh): a[0] = left[0..1], a[1] = left[2..3],
    // a[2] = right[0..1], a[3] = right[2..3], where left holds columns 0-7 and right 8-15.
    for (int lane = 0; lane < 32; ++lane)
      for (int reg = 0; reg < 4; ++reg)
        for (int half = 0; half < 2; ++half) {
          const int tile = reg / 2;               // left or right n8 tile
          const int e = 2 * (reg % 2) + half;     // element of that tile's C fragment
          Pos from = c_fragment(lane, e);
          from.col += 8 * tile;
          CHECK(from == a_fragment(lane, reg, half));
        }
  }

  TEST_CASE("08: key tile ranges: nothing above the band is visited, off-band tiles need no mask") {
    int checked = 0;
    for (bool causal : {false, true})
      for (int seq_q : {1, 2, 17, 64, 97, 128, 255, 300})
        for (int seq_k : {0, 1, 9, 64, 77, 128, 300})
          for (int block_m : {64, 128})
            for (int block_n : {32, 64})
              for (bool split : {true, false}) {
                const fa::Problem p = make(1, 1, 1, seq_q, seq_k, 64, causal);
                for (int64_t row0 = 0; row0 < seq_q; row0 += block_m) {
                  const int rows = int(std::min<int64_t>(block_m, seq_q - row0));
                  const s8::KvTileRange r = s8::kv_tile_range(row0, rows, seq_q, seq_k, causal, block_n, split);
                  CAPTURE(p.describe());
                  CAPTURE(row0);
                  CAPTURE(block_n);
                  CHECK(r.n_unmasked <= r.n_tiles);
                  if (!split) CHECK(r.n_unmasked == 0);
                  for (int j = 0; j * block_n < std::max(seq_k, 1) + block_n; ++j) {
                    bool any = false, all = true;
                    for (int64_t i = row0; i < row0 + rows; ++i) {
                      CHECK(s8::visible_key_end(i, seq_q, seq_k, causal) == p.visible_keys(i));
                      const int64_t end = p.visible_keys(i);
                      any = any || end > int64_t(j) * block_n;
                      all = all && end >= int64_t(j + 1) * block_n;
                    }
                    CHECK((j < r.n_tiles) == any);
                    if (split) CHECK((j < r.n_unmasked) == all);
                    ++checked;
                  }
                }
              }
    CHECK(checked > 5000);
  }
}

// ======================================================================================
// On the GPU
// ======================================================================================

#ifdef FA_HAVE_CUDA
#include <cuda_runtime.h>

#include "check.h"
#include "cuda_utils.h"
#include "tensor_core_fwd.h"
#include "tensors.h"

namespace {

const fa::StageInfo& stage() { return fa::find_stage("08"); }


// Selects a kernel variant for the scope of one test, through the C ABI's path
// (StageInfo::set_option), and puts the default back afterwards.
struct Variant {
  Variant(s8::Ablation a, s8::TileD128 t, s8::Step step = s8::Step::Auto) {
    stage().set_option("step", int64_t(step));
    stage().set_option("ablation", int64_t(a));
    stage().set_option("tile_d128", int64_t(t));
  }
  ~Variant() {
    stage().set_option("step", 0);
    stage().set_option("ablation", 0);
    stage().set_option("tile_d128", 0);
  }
};

// O and L of one forward (host path) under the options in force.
fa::Tensors run_forward(const fa::Problem& p, fa::Dtype t, uint64_t seed) {
  fa::Tensors x = fa::Tensors::make(p, seed, fa::Dist::Normal, false);
  stage().forward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
  return x;
}

}  // namespace

TEST_CASE("08: the shared shape matrix, bf16 and f16") {
  fa::test::check_matrix(stage(), fa::Dtype::BF16, false);
  fa::test::check_matrix(stage(), fa::Dtype::F16, false);
}

TEST_CASE("08: adversarial inputs (large logits, empty rows, constant rows, NaN), bf16 and f16") {
  fa::test::check_adversarial(stage(), fa::Dtype::BF16, false);
  fa::test::check_adversarial(stage(), fa::Dtype::F16, false);
}

TEST_CASE("08: properties (key permutation, bitwise determinism), bf16 and f16") {
  fa::test::check_properties(stage(), fa::Dtype::BF16, false);
  fa::test::check_properties(stage(), fa::Dtype::F16, false);
}

TEST_CASE("08: refusals, bf16 and f16") {
  fa::test::check_refusals(stage(), fa::Dtype::BF16);
  fa::test::check_refusals(stage(), fa::Dtype::F16);
}

TEST_CASE("08: random shapes, bf16 and f16") {
  fa::test::check_random_shapes(stage(), fa::Dtype::BF16, false, fa::test::small_mode() ? 4 : 24);
  fa::test::check_random_shapes(stage(), fa::Dtype::F16, false, fa::test::small_mode() ? 4 : 24);
}

TEST_CASE("08: step 08a (one K/V buffer) passes the shared checks, bf16 and f16") {
  const Variant v(s8::Ablation::None, s8::TileD128::Auto, s8::Step::OneBuffer);
  for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16}) {
    fa::test::check_matrix(stage(), t, false);
    fa::test::check_adversarial(stage(), t, false);
    fa::test::check_properties(stage(), t, false);
    fa::test::check_random_shapes(stage(), t, false, fa::test::small_mode() ? 4 : 12);
  }
}

TEST_CASE("08: step 08a and 08b give bitwise the same O and L (only the loads move)") {
  // The steps differ in when K_j, V_j are copied, not in the order of any product or sum.
  std::vector<fa::Problem> problems;
  for (int d : {32, 64, 96, 128, 256}) {
    problems.push_back(make(1, 4, 2, 200, 200, d, true));  // square causal: on- and off-band tiles
    problems.push_back(make(2, 2, 2, 130, 77, d, false));  // ragged key tail, rows past seq_q
    problems.push_back(make(1, 2, 1, 70, 0, d, true));     // no key at all
  }
  if (!fa::test::small_mode()) problems.push_back(make(1, 2, 1, 1025, 1025, 128, false));
  for (auto tile : {s8::TileD128::QInRegisters, s8::TileD128::QInSharedWide})
    for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16})
      for (const auto& p : problems) {
        if (p.head_dim != 128 && tile != s8::TileD128::QInRegisters) continue;
        CAPTURE(p.describe());
        CAPTURE(std::string(fa::dtype_name(t)));
        CAPTURE(int(tile));
        const fa::Tensors one = [&] {
          const Variant v(s8::Ablation::None, tile, s8::Step::OneBuffer);
          return run_forward(p, t, 61);
        }();
        const Variant v(s8::Ablation::None, tile, s8::Step::DoubleBuffer);
        const fa::Tensors two = run_forward(p, t, 61);
        CHECK(fa::test::bitwise_equal(one.O, two.O));
        CHECK(fa::test::bitwise_equal(one.L, two.L));
      }
}

TEST_CASE("08: every ablation variant still computes attention (bf16, d = 64 and 128)") {
  // Each variant turns one optimisation off; none may change the result beyond rounding.
  std::vector<fa::Problem> problems;
  for (int d : {64, 128}) {
    problems.push_back(make(1, 4, 2, 200, 200, d, true));   // square causal: on- and off-band tiles
    problems.push_back(make(1, 2, 1, 97, 300, d, true));    // bottom-right offset, ragged tails
    problems.push_back(make(2, 2, 2, 130, 77, d, false));   // ragged key tail, rows past seq_q
    if (!fa::test::small_mode()) problems.push_back(make(1, 2, 1, 1025, 1025, d, true));
  }
  for (const auto& [value, name] : s8::ablation_values()) {
    const Variant v(s8::Ablation(value), s8::TileD128::QInRegisters);
    for (const auto& p : problems) {
      CAPTURE(name);
      fa::test::expect_pass(stage(), p, fa::Dtype::BF16, uint64_t(31 + value), fa::Dist::Normal, false);
    }
  }
  // Logits in the hundreds through the mask on every tile too.
  const Variant v(s8::Ablation::NoCausalSplit, s8::TileD128::QInRegisters);
  fa::test::expect_pass(stage(), make(1, 2, 1, 97, 77, 64, true), fa::Dtype::BF16, 5, fa::Dist::LargeLogits, false);
}

TEST_CASE("08: ablations outside bf16 at d = 64, 128 of step 08b are refused by name") {
  {
    const Variant v(s8::Ablation::NoSwizzle, s8::TileD128::QInRegisters);
    for (auto [d, dtype] : {std::pair{64, fa::Dtype::F16}, std::pair{32, fa::Dtype::BF16}}) {
      fa::Problem p = make(1, 1, 1, 16, 16, d, false);
      fa::Tensors x = fa::Tensors::make(p, 1, fa::Dist::Normal, false);
      std::string msg;
      try {
        stage().forward(p, dtype, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
      } catch (const std::invalid_argument& e) {
        msg = e.what();
      }
      INFO(msg);
      CHECK(msg.find("no_swizzle") != std::string::npos);
      CHECK(msg.find("08_tensor_core_fwd") != std::string::npos);
    }
    CHECK(stage().get_counter("ablation") == int64_t(s8::Ablation::NoSwizzle));
  }
  {
    const Variant v(s8::Ablation::Padded, s8::TileD128::Auto, s8::Step::OneBuffer);
    fa::Problem p = make(1, 1, 1, 16, 16, 64, false);
    fa::Tensors x = fa::Tensors::make(p, 1, fa::Dist::Normal, false);
    std::string msg;
    try {
      stage().forward(p, fa::Dtype::BF16, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find("padded") != std::string::npos);
    CHECK(msg.find("step 08a") != std::string::npos);
  }
}

TEST_CASE("08: every d = 128 tile (Q in registers, Q in shared memory and wide) matches the reference") {
  // Tile-size invariance: B_r = 64 / B_c = 64 and B_r = 128 / B_c = 64 put different rows
  // together, so the online softmax rescales at different points.
  std::vector<fa::Problem> problems = {make(1, 2, 1, 97, 130, 128, true), make(1, 8, 2, 300, 77, 128, false),
                                       make(1, 2, 2, 77, 300, 128, true), make(2, 4, 4, 65, 64, 128, false)};
  if (!fa::test::small_mode()) problems.push_back(make(1, 4, 2, 1025, 1025, 128, true));
  for (const auto& [value, name] : s8::tile_d128_values()) {
    const Variant v(s8::Ablation::None, s8::TileD128(value));
    for (fa::Dtype t : {fa::Dtype::BF16, fa::Dtype::F16})
      for (const auto& p : problems) {
        CAPTURE(name);
        fa::test::expect_pass(stage(), p, t, 41, fa::Dist::Normal, false);
      }
  }
  // The wide tile is FlashAttention-2's shape: 4 warps of 32 rows, 64 keys, 96 KB of shared memory.
  const Variant v(s8::Ablation::None, s8::TileD128::QInSharedWide);
  std::string all;
  for (const auto& [key, value] : stage().report(make(1, 2, 1, 300, 300, 128, true), fa::Dtype::BF16))
    all += key + ": " + value + "\n";
  INFO(all);
  CHECK(all.find("B_r=128 B_c=64") != std::string::npos);
  CHECK(all.find("Q in shared memory") != std::string::npos);
  CHECK(all.find("98304 dynamic") != std::string::npos);  // Q 32 KB + 2 buffers × (K, V) 16 KB
}

TEST_CASE("08: tile_d128 = auto takes the wide tile without a causal mask and q_regs with one") {
  const Variant v(s8::Ablation::None, s8::TileD128::Auto);
  for (bool causal : {false, true}) {
    std::string all;
    for (const auto& [key, value] : stage().report(make(1, 2, 1, 300, 300, 128, causal), fa::Dtype::BF16))
      all += key + ": " + value + "\n";
    INFO(all);
    CHECK(all.find(causal ? "B_r=64 B_c=64" : "B_r=128 B_c=64") != std::string::npos);
    CHECK((all.find("lazy rescale") != std::string::npos) == !causal);
  }
}

TEST_CASE("08: the device entry point refuses bad input and writes nothing") {
  const fa::Problem p = make(1, 2, 1, 70, 50, 64, false);
  const size_t es = 2;
  fa::DeviceBuffer Q(p.q_elems() * es + 16, "Q"), K(p.kv_elems() * es + 16, "K"), V(p.kv_elems() * es + 16, "V"),
      O(p.q_elems() * es + 16, "O"), L(p.l_elems() * 4 + 16, "L");
  for (auto* b : {&Q, &K, &V, &O, &L}) FA_CUDA_CHECK(cudaMemset(b->get(), 0x7f, b->bytes()));
  const auto refused = [&](const fa::Problem& q, fa::Dtype t, const void* q_ptr, const void* k_ptr, void* o_ptr,
                           float* l_ptr, const std::string& fragment) {
    bool thrown = false;
    try {
      s8::forward(q, t, q_ptr, k_ptr, V.get(), o_ptr, l_ptr, nullptr);
    } catch (const std::invalid_argument& e) {
      thrown = true;
      INFO(e.what());
      CHECK(std::string(e.what()).find(fragment) != std::string::npos);
      CHECK(std::string(e.what()).find("08_tensor_core_fwd") != std::string::npos);
    }
    CHECK_MESSAGE(thrown, "expected a refusal naming '" << fragment << "'");
  };
  const auto bf = fa::Dtype::BF16;
  float* Lp = L.as<float>();
  refused(p, bf, Q.as<char>() + 8, K.get(), O.get(), Lp, "pointer Q");  // 8- but not 16-byte aligned
  refused(p, bf, Q.get(), K.as<char>() + 2, O.get(), Lp, "pointer K");
  refused(p, bf, Q.get(), K.get(), O.as<char>() + 4, Lp, "16-byte aligned");
  refused(p, bf, Q.get(), K.get(), O.get(), reinterpret_cast<float*>(L.as<char>() + 2), "pointer L");
  refused(p, bf, nullptr, K.get(), O.get(), Lp, "NULL");
  refused(p, fa::Dtype::F32, Q.get(), K.get(), O.get(), Lp, "dtype f32");
  for (int d : {16, 48, 80, 512}) {
    fa::Problem bad = p;
    bad.head_dim = d;
    refused(bad, bf, Q.get(), K.get(), O.get(), Lp, "head_dim = " + std::to_string(d));
    refused(bad, bf, Q.get(), K.get(), O.get(), Lp, "supported: 32, 64, 96, 128, 256");
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

TEST_CASE("08: empty sequences: seq_q = 0 launches nothing, seq_k = 0 gives O = 0 and L = -inf") {
  // seq_q = 0: nothing to compute; even null pointers are accepted.
  CHECK_NOTHROW(s8::forward(make(1, 2, 1, 0, 64, 64, false), fa::Dtype::BF16, nullptr, nullptr, nullptr, nullptr,
                            nullptr, nullptr));
  // seq_k = 0: K and V are never read (null is fine), every row sees no key.
  const fa::Problem p = make(2, 2, 1, 70, 0, 128, true);
  fa::DeviceBuffer Q(p.q_elems() * 2, "Q"), O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L");
  FA_CUDA_CHECK(cudaMemset(O.get(), 0x7f, O.bytes()));
  fa::fill_random(fa::Dtype::BF16, Q.get(), p.q_elems(), 3, nullptr);
  s8::forward(p, fa::Dtype::BF16, Q.get(), nullptr, nullptr, O.get(), L.as<float>(), nullptr);
  std::vector<float> o(size_t(p.q_elems())), l(size_t(p.l_elems()));
  fa::download(fa::Dtype::BF16, O.get(), o.data(), p.q_elems(), nullptr);
  fa::download(fa::Dtype::F32, L.get(), l.data(), p.l_elems(), nullptr);
  CHECK(std::all_of(o.begin(), o.end(), [](float x) { return x == 0.0f; }));
  CHECK(std::all_of(l.begin(), l.end(), [](float x) { return x == -std::numeric_limits<float>::infinity(); }));
}

TEST_CASE("08: device pointers on a non-default stream give the host path's result") {
  for (fa::Dtype dtype : {fa::Dtype::BF16, fa::Dtype::F16}) {
    const fa::Problem p = make(1, 4, 2, 200, 333, 96, true);
    fa::Tensors t = fa::Tensors::make(p, 9, fa::Dist::Normal, false);
    stage().forward(p, dtype, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());

    cudaStream_t stream;
    FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    fa::DeviceBuffer Q(p.q_elems() * 2, "Q"), K(p.kv_elems() * 2, "K"), V(p.kv_elems() * 2, "V"),
        O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L");
    fa::upload(dtype, t.Q.data(), Q.get(), p.q_elems(), stream);
    fa::upload(dtype, t.K.data(), K.get(), p.kv_elems(), stream);
    fa::upload(dtype, t.V.data(), V.get(), p.kv_elems(), stream);
    s8::forward(p, dtype, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), stream);
    std::vector<float> o(size_t(p.q_elems())), l(size_t(p.l_elems()));
    fa::download(dtype, O.get(), o.data(), p.q_elems(), stream);
    fa::download(fa::Dtype::F32, L.get(), l.data(), p.l_elems(), stream);
    FA_CUDA_CHECK(cudaStreamDestroy(stream));
    CHECK(std::memcmp(o.data(), t.O.data(), o.size() * 4) == 0);
    CHECK(std::memcmp(l.data(), t.L.data(), l.size() * 4) == 0);
  }
}

TEST_CASE("08: the options: steps, ablations and tiles by number, the rest refused" * doctest::test_suite("cpu")) {
  CHECK(s8::step_names() == std::vector<std::string>{"auto", "08a", "08b"});
  for (int k : {1, 2, 0}) {
    stage().set_option("step", k);
    CHECK(stage().get_counter("step") == k);
    CHECK(s8::current_options().step == s8::Step(k));
  }
  for (int64_t bad : {1, 5, 6, -1}) CHECK_THROWS_AS(stage().set_option("ablation", bad), std::invalid_argument);
  for (int64_t bad : {2, 4, -1}) CHECK_THROWS_AS(stage().set_option("tile_d128", bad), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("step", 3), std::invalid_argument);
  CHECK_THROWS_AS(stage().set_option("block_n", 64), std::invalid_argument);
  CHECK(s8::parse_ablation("no_causal_split") == s8::Ablation::NoCausalSplit);
  CHECK_THROWS_AS(s8::parse_ablation("no_exp2"), std::invalid_argument);
  CHECK(s8::ablation_name(s8::Ablation::Padded) == "padded");
}

TEST_CASE("08: launch report") {
  const fa::Problem p = make(2, 3, 1, 130, 64, 64, true);
  std::string all;
  for (const auto& [key, value] : stage().report(p, fa::Dtype::BF16)) all += key + ": " + value + "\n";
  INFO(all);
  CHECK(all.find("grid: 2 x 3 x 2") != std::string::npos);  // ceil(130 / 128) query tiles, heads, batch
  CHECK(all.find("B_r=128 B_c=64") != std::string::npos);
  CHECK(all.find("4 warps") != std::string::npos);
  CHECK(all.find("registers") != std::string::npos);
  CHECK(all.find("occupancy") != std::string::npos);
  CHECK(all.find("49152 dynamic") != std::string::npos);  // Q 16 KB + 2 buffers × (K, V) 8 KB
  CHECK(all.find("step: 08b (auto)") != std::string::npos);
  const Variant v(s8::Ablation::None, s8::TileD128::Auto, s8::Step::OneBuffer);
  std::string one;
  for (const auto& [key, value] : stage().report(p, fa::Dtype::BF16)) one += key + ": " + value + "\n";
  INFO(one);
  CHECK(one.find("step: 08a") != std::string::npos);
  CHECK(one.find("1 K/V buffer(s)") != std::string::npos);
  CHECK(one.find("32768 dynamic") != std::string::npos);  // Q 16 KB + 1 buffer × (K, V) 8 KB
}

TEST_CASE("08: a tensor of more than 2^31 elements (FA_TEST_LARGE=1)") {
  if (!fa::test::env_flag("FA_TEST_LARGE")) {
    MESSAGE("skipped: set FA_TEST_LARGE=1 to run (needs about 9 GB of GPU memory)");
    return;
  }
  // Q and O hold (2^24 + 77) · 128 > 2^31 elements each; row 2^24 is the first whose
  // element offset no longer fits in 32 bits. K and V are small (inputs are exactly
  // representable in bf16 after the round trip, so the sub-problem check is exact).
  for (bool causal : {false, true}) {
    const fa::Problem p = make(1, 1, 1, (1 << 24) + 77, 300, 128, causal);
    REQUIRE(p.q_elems() > (int64_t(1) << 31));
    size_t free_bytes = 0, total_bytes = 0;
    FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t need = size_t(2 * p.q_elems() + 2 * p.kv_elems()) * 2 + size_t(p.l_elems()) * 4;
    if (free_bytes < need + (size_t(1) << 30)) {
      MESSAGE("skipped: needs ", need >> 20, " MiB of GPU memory, ", free_bytes >> 20, " MiB free");
      return;
    }
    fa::DeviceBuffer Q(p.q_elems() * 2, "Q"), K(p.kv_elems() * 2, "K"), V(p.kv_elems() * 2, "V"),
        O(p.q_elems() * 2, "O"), L(p.l_elems() * 4, "L");
    fa::Tensors kv = fa::Tensors::make(make(1, 1, 1, 1, 300, 128, false), 5, fa::Dist::Normal, false);
    // Round K and V through bf16 on the host side too, so the reference sees what the GPU sees.
    fa::upload(fa::Dtype::BF16, kv.K.data(), K.get(), p.kv_elems(), nullptr);
    fa::upload(fa::Dtype::BF16, kv.V.data(), V.get(), p.kv_elems(), nullptr);
    fa::download(fa::Dtype::BF16, K.get(), kv.K.data(), p.kv_elems(), nullptr);
    fa::download(fa::Dtype::BF16, V.get(), kv.V.data(), p.kv_elems(), nullptr);
    fa::fill_random(fa::Dtype::BF16, Q.get(), p.q_elems(), 77, nullptr);
    s8::forward(p, fa::Dtype::BF16, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    CAPTURE(causal);
    fa::test::check_row_window(p, fa::Dtype::BF16, 0, 64, kv.K, kv.V, Q.get(), O.get(), L.as<float>());
    fa::test::check_row_window(p, fa::Dtype::BF16, (1 << 24) - 32, 64, kv.K, kv.V, Q.get(), O.get(), L.as<float>());
    fa::test::check_row_window(p, fa::Dtype::BF16, p.seq_q - 64, 64, kv.K, kv.V, Q.get(), O.get(), L.as<float>());
  }
}

#endif  // FA_HAVE_CUDA
