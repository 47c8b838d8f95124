// Stage 05 against the shared matrix (docs/design.md §6), plus its per-row intermediates m and l.
#include <doctest/doctest.h>

#include "one_pass_fused.h"
#include "stage_checks.h"
#include "stage_list.h"

namespace {
const fa::StageInfo& stage() { return fa::find_stage("05"); }
}  // namespace

TEST_CASE("stage 05: shape matrix") { fa::test::check_matrix(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 05: adversarial inputs") { fa::test::check_adversarial(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 05: NaN and inf under a mask") { fa::test::check_nonfinite_semantics(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 05: properties") { fa::test::check_properties(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 05: refusals") { fa::test::check_refusals(stage(), fa::Dtype::F32); }
TEST_CASE("stage 05: random shapes") { fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, 6); }

TEST_CASE("stage 05: per-row m and l equal the reference's") {
  fa::test::check_row_stats(&fa::stage05::forward);
}

// At a large head dim the sums of S = QKᵀ have thousands of terms, and their rounding depends
// on the order they are added in. This stage adds them one after another, as the in-order
// fp32 baseline does; the budget must hold for it on every seed (issue 35: at d = 2048 about
// half of 20 seeds failed when the budget came from Eigen's blocked products alone).
TEST_CASE("stage 05: large head dims pass for every seed") {
  for (int d : {1024, 2048})
    for (uint64_t seed = 1; seed <= 20; ++seed)
      fa::test::expect_pass(stage(), fa::test::make_problem(1, 1, 1, 64, 64, d, false), fa::Dtype::F32, seed,
                            fa::Dist::Normal, false);
}
