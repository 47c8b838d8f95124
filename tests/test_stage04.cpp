// Stage 04 against the shared matrix (docs/design.md §6), plus its per-row intermediates m and l.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "two_pass_online.h"
#include "stage_checks.h"
#include "reference.h"
#include "stage_list.h"

namespace {
const fa::StageInfo& stage() { return fa::find_stage("04"); }
}  // namespace

TEST_CASE("stage 04: shape matrix") { fa::test::check_matrix(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 04: adversarial inputs") { fa::test::check_adversarial(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 04: NaN and inf under a mask") { fa::test::check_nonfinite_semantics(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 04: properties") { fa::test::check_properties(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 04: refusals") { fa::test::check_refusals(stage(), fa::Dtype::F32); }
TEST_CASE("stage 04: random shapes") { fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, 6); }

TEST_CASE("stage 04: per-row m and l equal the reference's") {
  fa::test::check_row_stats(&fa::stage04::forward);
}

// While every logit so far is −inf, m = −inf, and l·e^{m − m_new} + e^{s − m_new} must subtract
// 0, not m_new: e^{−inf − (−inf)} is NaN. Here every row starts with a run of −inf logits
// (keys 0–2), one row has only −inf logits, and the others go on with finite ones; m, l, O
// and L must all match the reference.
TEST_CASE("stage 04: leading -inf logits: the m = -inf guard") {
  const float inf = std::numeric_limits<float>::infinity();
  for (bool causal : {false, true}) {
    const fa::Problem p = fa::test::make_problem(1, 2, 1, 10, 13, 16, causal);
    fa::Tensors t = fa::Tensors::make(p, 19, fa::Dist::Normal, false);
    // Q[:, 0] < 0; K[j, 0] = +inf for keys 0–2, > 0 after: those keys give −inf logits.
    for (int h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        float& q = t.Q[size_t(p.q_offset(0, h, i))];
        q = -std::abs(q) - 0.5f;
      }
    for (int64_t j = 0; j < p.seq_k; ++j) {
      float* k = &t.K[size_t(p.kv_offset(0, 0, j))];
      if (j < 3) std::fill_n(k, p.head_dim, 0.0f);
      k[0] = j < 3 ? inf : std::abs(k[0]) + 0.5f;
    }
    // Head 1, row 9 sees only −inf logits: Q = (−inf, 0, …, 0).
    std::fill_n(t.Q.begin() + p.q_offset(0, 1, 9), p.head_dim, 0.0f);
    t.Q[size_t(p.q_offset(0, 1, 9))] = -inf;

    std::vector<float> m(size_t(p.l_elems())), l(size_t(p.l_elems()));
    fa::stage04::forward(p, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), m.data(), l.data());
    const fa::CheckReport r = fa::compare_forward(p, fa::Dtype::F32, t);
    const fa::Reference ex = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data());
    const fa::Reference base = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data(), fa::RefMode::F32);
    const fa::Shape4 shape{p.batch, p.heads, p.seq_q, 1};
    const fa::Comparison cm = fa::compare("m", m.data(), ex.m, shape, fa::tolerance(ex.m, base.m, fa::Dtype::F32));
    const fa::Comparison cl = fa::compare("l", l.data(), ex.l, shape, fa::tolerance(ex.l, base.l, fa::Dtype::F32));
    INFO("leading −inf logits, causal " << causal << "\n" << r.summary() << cm.summary() << "\n" << cl.summary());
    CHECK(r.pass());
    CHECK(cm.pass);
    CHECK(cl.pass);
    CHECK(l[size_t(p.l_offset(0, 1, 9))] == 0.0f);
    CHECK(t.L[size_t(p.l_offset(0, 1, 9))] == -inf);
  }
}
