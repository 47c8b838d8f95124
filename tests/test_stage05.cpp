// Stage 05 against the shared matrix (DESIGN §6), plus its per-row intermediates m and l.
#include <doctest/doctest.h>

#include "one_pass_fused.h"
#include "reference.h"
#include "stage_checks.h"
#include "stage_list.h"

namespace {
const fa::StageInfo& stage() { return fa::find_stage("05"); }
}  // namespace

TEST_CASE("stage 05: shape matrix") { fa::test::check_matrix(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 05: adversarial inputs") { fa::test::check_adversarial(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 05: properties") { fa::test::check_properties(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 05: refusals") { fa::test::check_refusals(stage(), fa::Dtype::F32); }
TEST_CASE("stage 05: random shapes") { fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, 6); }

TEST_CASE("stage 05: per-row m and l equal the reference's") {
  for (bool causal : {false, true}) {
    fa::Problem p;
    p.batch = 2; p.heads = 4; p.kv_heads = 2; p.seq_q = 97; p.seq_k = 80; p.head_dim = 40;
    p.causal = causal;
    for (fa::Dist dist : {fa::Dist::Normal, fa::Dist::LargeLogits}) {
      fa::Tensors t = fa::Tensors::make(p, 31, dist, false);
      std::vector<float> m(size_t(p.l_elems())), l(size_t(p.l_elems()));
      fa::stage05::forward(p, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), m.data(), l.data());
      const fa::Reference ex = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data());
      const fa::Reference base = fa::reference_forward(p, t.Q.data(), t.K.data(), t.V.data(), fa::RefMode::F32);
      const fa::Shape4 shape{p.batch, p.heads, p.seq_q, 1};
      const auto cm = fa::compare("m", m.data(), ex.m, shape, fa::tolerance(ex.m, base.m, fa::Dtype::F32));
      const auto cl = fa::compare("l", l.data(), ex.l, shape, fa::tolerance(ex.l, base.l, fa::Dtype::F32));
      INFO(p.describe() << " dist=" << fa::dist_name(dist));
      INFO(cm.summary());
      INFO(cl.summary());
      CHECK(cm.pass);
      CHECK(cl.pass);
    }
  }
}
