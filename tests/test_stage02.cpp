// Stage 02 against the shared matrix (docs/design.md §6).
#include <doctest/doctest.h>

#include "stage_checks.h"
#include "stage_list.h"

namespace {
const fa::StageInfo& stage() { return fa::find_stage("02"); }
}  // namespace

TEST_CASE("stage 02: shape matrix") { fa::test::check_matrix(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 02: adversarial inputs") { fa::test::check_adversarial(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 02: NaN and inf under a mask") { fa::test::check_nonfinite_semantics(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 02: properties") { fa::test::check_properties(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 02: refusals") { fa::test::check_refusals(stage(), fa::Dtype::F32); }
TEST_CASE("stage 02: random shapes") { fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, 6); }

// m_i is the max over the keys row i sees, never over the masked columns of S (they hold 0,
// or whatever they held before). When every logit a row sees is far below 0 (here about
// −120), a max that also read a masked 0 would make every e^{S_ij − m_i} underflow to 0:
// l_i = 0 and O = 0/0. A row max of the visible keys gives e^0 = 1 for the largest.
TEST_CASE("stage 02: the row max reads only the keys a row sees and never masked columns") {
  for (int seq_k : {20, 13, 31}) {  // square, more queries than keys (rows that see none), fewer
    const fa::Problem p = fa::test::make_problem(2, 2, 1, 20, seq_k, 16, true);
    fa::Tensors t = fa::Tensors::make(p, 18, fa::Dist::Normal, false);
    // Q ≈ 5, K ≈ −6: every logit ≈ 0.25 · 16 · (−30) = −120.
    for (float& q : t.Q) q = 5.0f + 0.1f * q;
    for (float& k : t.K) k = -6.0f + 0.1f * k;
    const fa::CheckReport r = fa::check_forward(stage(), p, fa::Dtype::F32, t);
    INFO("logits near -120 under a causal mask, " << p.describe() << "\n" << r.summary());
    CHECK(r.pass());
  }
}
