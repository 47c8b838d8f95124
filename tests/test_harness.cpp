// Tests of the harness itself: the reference (its backward against central finite
// differences), the comparison and tolerance, Problem validation, the stage list.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>
#include <string>

#include "check.h"
#include "mask_reference.h"
#include "reference.h"
#include "stage_list.h"
#include "tensors.h"

using fa::Problem;

namespace {
Problem small(bool causal, int seq_q = 5, int seq_k = 7) {
  Problem p;
  p.batch = 2;
  p.heads = 2;
  p.kv_heads = 1;  // GQA: both query heads read kv head 0, so dK and dV sum two heads
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.head_dim = 4;
  p.causal = causal;
  return p;
}

// loss = Σ dO ∘ O, so ∂loss/∂O = dO and the reference backward gives its gradient.
double loss(const Problem& p, const fa::Tensors& t) {
  const fa::Reference r = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data());
  double s = 0;
  for (size_t i = 0; i < r.O.size(); ++i) s += double(t.dO[i]) * r.O[i];
  return s;
}

// Central difference of the loss in element i of x; the step actually taken (after fp32
// rounding of x ± eps) is the denominator.
double central_difference(const Problem& p, fa::Tensors& t, std::vector<float>& x, size_t i) {
  const float x0 = x[i], eps = 1.0f / 64;
  x[i] = x0 + eps;
  const double up = loss(p, t);
  const float hi = x[i];
  x[i] = x0 - eps;
  const double down = loss(p, t);
  const float lo = x[i];
  x[i] = x0;
  return (up - down) / (double(hi) - double(lo));
}
}  // namespace

TEST_CASE("reference backward matches central finite differences") {
  for (bool causal : {false, true}) {
    const Problem p = small(causal, causal ? 9 : 5, 7);  // causal 9×7: rows 0,1 see no key
    fa::Tensors t = fa::Tensors::make(p, 3, fa::Dist::Normal, true);
    const fa::Reference r =
        fa::reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data());
    struct Grad {
      std::string name;  // a std::string: doctest prints a const char* in INFO as a pointer
      std::vector<float>* x;
      const std::vector<double>* g;
    };
    for (const Grad& gr : {Grad{"dQ", &t.Q, &r.dQ}, Grad{"dK", &t.K, &r.dK}, Grad{"dV", &t.V, &r.dV}}) {
      for (size_t i = 0; i < gr.x->size(); i += 3) {
        const double fd = central_difference(p, t, *gr.x, i);
        const double an = (*gr.g)[i];
        INFO(gr.name << "[" << i << "] causal=" << causal << " analytic " << an << " finite-diff " << fd);
        CHECK(std::abs(fd - an) <= 2e-3 * (1.0 + std::abs(an)));
      }
    }
  }
}

TEST_CASE("reference forward: P rows sum to 1, masked and empty rows, L = log-sum-exp") {
  const Problem p = small(true, 9, 7);
  fa::Tensors t = fa::Tensors::make(p, 4, fa::Dist::Normal, false);
  const fa::Reference r = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data(),
                                                fa::RefMode::Exact, true);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h)
      for (int i = 0; i < p.seq_q; ++i) {
        const double* P = &r.P[size_t(((b * p.heads + h) * p.seq_q + i) * p.seq_k)];
        double sum = 0;
        for (int j = 0; j < p.seq_k; ++j) {
          if (j >= p.visible_keys(i)) CHECK(P[j] == 0.0);  // bottom-right causal mask
          sum += P[j];
        }
        const double L = r.L[size_t(p.l_offset(b, h, i))];
        if (p.visible_keys(i) == 0) {
          CHECK(sum == 0.0);
          CHECK(L == -INFINITY);
          for (int c = 0; c < p.head_dim; ++c) CHECK(r.O[size_t(p.q_offset(b, h, i) + c)] == 0.0);
        } else {
          CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
          CHECK(L == doctest::Approx(r.m[size_t(p.l_offset(b, h, i))] +
                                     std::log(r.l[size_t(p.l_offset(b, h, i))])));
        }
      }
}

TEST_CASE("bottom-right causal alignment") {
  Problem p;
  p.causal = true;
  p.seq_q = 3;
  p.seq_k = 5;  // decoding: the last query row sees every key
  CHECK(p.visible_keys(0) == 3);
  CHECK(p.visible_keys(2) == 5);
  p.seq_q = 5;
  p.seq_k = 3;  // more queries than keys: the first two rows see nothing
  CHECK(p.visible_keys(0) == 0);
  CHECK(p.visible_keys(1) == 0);
  CHECK(p.visible_keys(2) == 1);
  CHECK(p.visible_keys(4) == 3);
  p.seq_q = p.seq_k = 4;  // square: the usual lower triangle
  for (int i = 0; i < 4; ++i) CHECK(p.visible_keys(i) == i + 1);
}

TEST_CASE("the check fails a wrong output and names the worst element") {
  const Problem p = small(false, 6, 8);
  fa::Tensors t = fa::Tensors::make(p, 5, fa::Dist::Normal, false);
  const fa::StageInfo& s = fa::find_stage("03");  // 03 has no lab regions, so this passes in a lab tree too
  REQUIRE(fa::check_forward(s, p, fa::Dtype::F32, t).pass());

  SUBCASE("a perturbed element") {
    const int64_t at = p.q_offset(1, 1, 4) + 2;
    t.O[size_t(at)] += 1e-3f;
    const fa::CheckReport r = fa::compare_forward(p, fa::Dtype::F32, t);
    CHECK_FALSE(r.pass());
    const fa::Comparison& o = r.at("O");
    CHECK(o.b == 1);
    CHECK(o.h == 1);
    CHECK(o.row == 4);
    CHECK(o.col == 2);
    CHECK(o.summary().find("(1,1,4,2)") != std::string::npos);
  }
  SUBCASE("NaN never passes") {
    t.O[7] = std::numeric_limits<float>::quiet_NaN();
    const fa::CheckReport r = fa::compare_forward(p, fa::Dtype::F32, t);
    CHECK_FALSE(r.pass());
    CHECK(r.at("O").nonfinite_mismatch == 1);
  }
  SUBCASE("an unwritten (poisoned) output never passes") {
    t.poison_outputs();
    CHECK_FALSE(fa::compare_forward(p, fa::Dtype::F32, t).pass());
  }
  SUBCASE("a finite L where the reference has -inf fails") {
    Problem q = small(true, 9, 7);
    fa::Tensors u = fa::Tensors::make(q, 6, fa::Dist::Normal, false);
    REQUIRE(fa::check_forward(s, q, fa::Dtype::F32, u).pass());
    u.L[0] = -1e30f;  // row 0 sees no key: L must be exactly -inf
    CHECK_FALSE(fa::compare_forward(q, fa::Dtype::F32, u).pass());
  }
}

TEST_CASE("tolerance: twice the same-precision baseline plus a floor of a few ulps") {
  const std::vector<double> exact{1.0, -2.0, 0.5}, base{1.0 + 1e-6, -2.0, 0.5};
  const double tol = fa::tolerance(exact, base, fa::Dtype::F32);
  CHECK(tol == doctest::Approx(2e-6 + 8 * std::ldexp(1.0, -24) * 2.0));
  // bf16's unit roundoff is 2^-8, so its floor is 2^16 times fp32's.
  CHECK(fa::unit_roundoff(fa::Dtype::BF16) == std::ldexp(1.0, -8));
  // The fp16 baseline (inputs and P rounded) lands much farther from exact than fp32's.
  const Problem p = small(false, 16, 16);
  fa::Tensors t = fa::Tensors::make(p, 8, fa::Dist::Normal, false);
  const auto ex = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data());
  const auto f32 = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data(), fa::RefMode::F32);
  const auto f16 = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data(), fa::RefMode::F16);
  CHECK(fa::tolerance(ex.O, f16.O, fa::Dtype::F16) > 10 * fa::tolerance(ex.O, f32.O, fa::Dtype::F32));
}

// The in-order baseline adds a kv head's dK and dV as a plain loop over the GQA group does:
// every row of every query head into one accumulator, not a sum per head added to it (whose
// sums are a group's size shorter, and whose error so falls short of such a stage's: stage
// 06's dV missed a budget so, 4.3e-6 against 3.4e-6 at 6 query heads over 2). With one key,
// P = 1 exactly and dV is the sum of dO's rows: head 0 brings 1, then head 1 four times 2⁻²⁴.
// One accumulator rounds each 1 + 2⁻²⁴ back to 1 (a tie, to even); sums per head give
// 4·2⁻²⁴, then 1 + 2⁻²² exactly. dK is added by the same function.
TEST_CASE("the in-order baseline adds dK and dV over the whole GQA group in one sum") {
  const Problem p = small(false, 4, 1);  // 2 query heads over 1 kv head, 4 rows, 1 key
  fa::Tensors t = fa::Tensors::make(p, 3, fa::Dist::Normal, true);
  for (int b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seq_q; ++i)
      for (int c = 0; c < p.head_dim; ++c) {
        t.dO[size_t(p.q_offset(b, 0, i) + c)] = i == 0 ? 1.0f : 0.0f;
        t.dO[size_t(p.q_offset(b, 1, i) + c)] = std::ldexp(1.0f, -24);
      }
  const auto exact = fa::reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data());
  const auto in_order =
      fa::reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data(), fa::RefMode::F32InOrder);
  const auto masked = fa::reference_backward_masked(p, fa::Modifiers{}, t.Q.data(), t.K.data(), t.V.data(),
                                                    t.dO.data(), fa::RefMode::F32InOrder);
  for (size_t i = 0; i < exact.dV.size(); ++i) {
    INFO("in-order dV[" << i << "] = 1 + " << (in_order.dV[i] - 1) << ", masked reference's 1 + "
                        << (masked.dV[i] - 1) << ", exact 1 + " << (exact.dV[i] - 1)
                        << ": one sum over the group gives 1 + 0");
    CHECK(exact.dV[i] == 1 + std::ldexp(1.0, -22));
    CHECK(in_order.dV[i] == 1.0);
    CHECK(masked.dV[i] == 1.0);
  }
}

namespace {
// The outputs of `r` (a reference evaluation) rounded to fp32 into t, as a stage would store them.
void store_outputs(const fa::Reference& r, fa::Tensors& t) {
  for (auto [dst, src] : {std::pair{&t.O, &r.O}, std::pair{&t.L, &r.L}, std::pair{&t.dQ, &r.dQ},
                          std::pair{&t.dK, &r.dK}, std::pair{&t.dV, &r.dV}})
    for (size_t i = 0; i < src->size(); ++i) (*dst)[i] = float((*src)[i]);
}
}  // namespace

// The verdict is taken against the exact reference, with the budget of the stage's own
// precision. For every dtype: the plain evaluation in that precision (its baseline) passes;
// an output that stays within the budget of the baseline but moves away from the exact
// value by more than the budget fails; a coarser precision's baseline fails. A check that
// compared with the baseline instead of the exact reference passes the second; a budget taken
// from another precision's baseline fails the first (fp32's, tighter, for fp16) or passes the
// third (bf16's, looser, for fp32 or fp16).
TEST_CASE("the verdict: against the exact reference with the budget of the stage's precision") {
  Problem p = small(false, 33, 70);
  p.head_dim = 16;
  fa::Tensors t = fa::Tensors::make(p, 15, fa::Dist::LargeLogits, true);
  const fa::Reference exact = fa::reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data());
  for (fa::Dtype dtype : {fa::Dtype::F32, fa::Dtype::F16, fa::Dtype::BF16}) {
    const fa::Reference base = fa::reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data(),
                                                      fa::baseline_mode(dtype));
    store_outputs(base, t);
    fa::CheckReport r = fa::compare_forward(p, dtype, t);
    for (auto& c : fa::compare_backward(p, dtype, t).items) r.items.push_back(c);
    INFO(std::string(fa::dtype_name(dtype)) << " baseline, rounded to fp32:\n" << r.summary());
    CHECK(r.pass());

    struct Out {
      std::string name;
      std::vector<float>* got;
      const std::vector<double>* exact;
      const std::vector<double>* base;
    };
    for (const Out& o : {Out{"O", &t.O, &exact.O, &base.O}, Out{"L", &t.L, &exact.L, &base.L},
                         Out{"dQ", &t.dQ, &exact.dQ, &base.dQ}, Out{"dK", &t.dK, &exact.dK, &base.dK},
                         Out{"dV", &t.dV, &exact.dV, &base.dV}}) {
      // At the entry where the baseline is farthest from exact (by e), the value
      // exact ± (tol + e/2) on the baseline's side: tol − e/2 from the baseline, tol + e/2 from exact.
      const double tol = r.at(o.name).tol;
      size_t at = 0;
      for (size_t i = 0; i < o.exact->size(); ++i)
        if (std::abs((*o.base)[i] - (*o.exact)[i]) > std::abs((*o.base)[at] - (*o.exact)[at])) at = i;
      const float keep = (*o.got)[at];
      const double e = (*o.base)[at] - (*o.exact)[at];
      (*o.got)[at] = float((*o.exact)[at] + (e >= 0 ? 1.0 : -1.0) * tol + e / 2);
      INFO(std::string(fa::dtype_name(dtype)) << " " << o.name << "[" << at << "] = " << (*o.got)[at] << ": exact "
                                 << (*o.exact)[at] << ", baseline " << (*o.base)[at] << ", tol " << tol);
      REQUIRE(std::abs((*o.got)[at] - (*o.base)[at]) <= tol);   // within the baseline's budget…
      REQUIRE(std::abs((*o.got)[at] - (*o.exact)[at]) > tol);   // …but not within the exact value's
      const bool forward = o.name == "O" || o.name == "L";
      const fa::CheckReport wrong = forward ? fa::compare_forward(p, dtype, t) : fa::compare_backward(p, dtype, t);
      INFO(wrong.summary());
      CHECK_FALSE(wrong.at(o.name).pass);
      (*o.got)[at] = keep;
    }
  }
  // A coarser precision's plain evaluation is wrong for a finer one: fp16's or bf16's
  // baseline fails the fp32 check, bf16's fails the fp16 check.
  for (auto [coarse, fine] : {std::pair{fa::Dtype::F16, fa::Dtype::F32}, std::pair{fa::Dtype::BF16, fa::Dtype::F32},
                              std::pair{fa::Dtype::BF16, fa::Dtype::F16}}) {
    const fa::RefMode mode = fa::baseline_mode(coarse);
    store_outputs(fa::reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data(), mode), t);
    fa::CheckReport r = fa::compare_forward(p, fine, t);
    for (auto& c : fa::compare_backward(p, fine, t).items) r.items.push_back(c);
    INFO(std::string(fa::dtype_name(coarse)) << " baseline checked as " << fa::dtype_name(fine) << ":\n"
                                             << r.summary());
    CHECK_FALSE(r.pass());
  }
}

TEST_CASE("a non-finite reference entry is matched by class (NaN by NaN and an infinity by itself)") {
  const std::vector<double> ref{std::nan(""), INFINITY, -INFINITY, 1.0};
  const fa::Shape4 shape{1, 1, 1, 4};
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  CHECK(fa::compare("x", std::vector<float>{nan, inf, -inf, 1.0f}.data(), ref, shape, 0.0).pass);
  for (int i = 0; i < 3; ++i) {
    for (float wrong : {0.5f, nan, inf, -inf}) {
      std::vector<float> got{nan, inf, -inf, 1.0f};
      if (std::isnan(wrong) ? std::isnan(got[size_t(i)]) : wrong == got[size_t(i)]) continue;
      got[size_t(i)] = wrong;
      const fa::Comparison c = fa::compare("x", got.data(), ref, shape, 1e30);
      INFO("reference " << ref[size_t(i)] << ", got " << wrong << ": " << c.summary());
      CHECK_FALSE(c.pass);
      CHECK(c.nonfinite_mismatch == 1);
      CHECK(c.worst == i);
    }
  }
  // Through the check: a NaN in one query row makes that row of O and L NaN in the
  // reference; a finite value there fails, whatever the budget.
  const Problem p = small(false, 6, 8);
  fa::Tensors t = fa::Tensors::make(p, 16, fa::Dist::Normal, false);
  t.Q[size_t(p.q_offset(0, 1, 2) + 1)] = nan;
  REQUIRE(fa::check_forward(fa::find_stage("03"), p, fa::Dtype::F32, t).pass());
  REQUIRE(std::isnan(t.O[size_t(p.q_offset(0, 1, 2))]));
  t.O[size_t(p.q_offset(0, 1, 2))] = 0.0f;
  CHECK_FALSE(fa::compare_forward(p, fa::Dtype::F32, t).at("O").pass);
  t.L[size_t(p.l_offset(0, 1, 2))] = 0.0f;
  CHECK_FALSE(fa::compare_forward(p, fa::Dtype::F32, t).at("L").pass);
}

TEST_CASE("a bad Problem is refused with a message naming the value") {
  auto message = [](Problem p) {
    try {
      p.validate("test");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Problem p;
  p.heads = 8;
  p.kv_heads = 3;
  CHECK(message(p).find("heads = 8 is not a multiple of kv_heads = 3") != std::string::npos);
  p = Problem{};
  p.seq_q = -4;
  CHECK(message(p).find("seq_q = -4") != std::string::npos);
  p = Problem{};
  p.head_dim = 0;
  CHECK(message(p).find("head_dim = 0") != std::string::npos);
  p = Problem{};
  p.scale = std::numeric_limits<float>::infinity();
  CHECK(message(p).find("scale = inf") != std::string::npos);
  p = Problem{};
  p.seq_q = 0;
  p.seq_k = 0;
  CHECK(message(p) == "accepted");  // empty sequences are valid
  CHECK_THROWS_AS(fa::parse_dtype("f64"), std::invalid_argument);
  CHECK_THROWS_AS(fa::parse_dist("cauchy"), std::invalid_argument);
}

TEST_CASE("a Problem whose element counts or byte sizes overflow is refused with the sizes") {
  auto message = [](Problem p) {
    try {
      p.validate("test");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto make = [](int batch, int heads, int kv_heads, int seq_q, int seq_k, int d) {
    Problem p;
    p.batch = batch;
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.seq_q = seq_q;
    p.seq_k = seq_k;
    p.head_dim = d;
    return p;
  };
  // Q's count wraps past int64 to 4 elements (issue 13's reproducer).
  std::string m = message(make(494770, 769546, 769546, 48448661, 1, 1));
  CHECK(m.find("test: Q would hold") != std::string::npos);
  CHECK(m.find("494770 x 769546 x 48448661 x 1") != std::string::npos);
  // 2^22 · 2^21 · 2^21 = 2^64 wraps to exactly 0: an empty-looking problem.
  m = message(make(1 << 22, 1 << 21, 1, 1 << 21, 0, 1));
  CHECK(m.find("Q would hold") != std::string::npos);
  CHECK(m.find("4194304 x 2097152 x 2097152 x 1") != std::string::npos);
  // K alone overflows.
  m = message(make(1 << 20, 1 << 20, 1 << 20, 1, 1 << 30, 1));
  CHECK(m.find("K would hold") != std::string::npos);
  // The count fits in int64 but its fp32 bytes do not (2^62 elements).
  m = message(make(1 << 30, 1 << 30, 1, 4, 1, 1));
  CHECK(m.find("Q would hold") != std::string::npos);
  CHECK(m.find("at most " + std::to_string(fa::kMaxTensorElems)) != std::string::npos);
  // 2^61 elements are 2^63 bytes: one too many; 3 · 2^59 are accepted. A zero size makes
  // the tensor empty, not overflowing.
  CHECK(message(make(1 << 30, 1 << 29, 1, 4, 1, 1)).find("Q would hold") != std::string::npos);
  CHECK(message(make(1 << 30, 1 << 29, 1, 3, 1, 1)) == "accepted");
  CHECK(message(make(1 << 30, 1 << 30, 1, 0, 0, 1 << 30)) == "accepted");
}

TEST_CASE("the stage list: names, prefixes, unknown names") {
  const auto& all = fa::all_stages();
  REQUIRE(all.size() >= 5);
  CHECK(all[0].name == "01_naive");
  CHECK(fa::find_stage("03").name == "03_three_pass");
  CHECK(fa::find_stage("05_one_pass_fused").name == "05_one_pass_fused");
  CHECK_THROWS_WITH_AS(fa::find_stage("0"), doctest::Contains("matches several"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(fa::find_stage("99"), doctest::Contains("is not a stage"), std::invalid_argument);
  for (size_t i = 1; i < all.size(); ++i) CHECK(all[i - 1].name < all[i].name);
}
