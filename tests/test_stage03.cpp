// Stage 03 against the shared matrix (docs/design.md §6), plus its per-row intermediates m and l.
#include <doctest/doctest.h>

#include "three_pass.h"
#include "stage_checks.h"
#include "stage_list.h"

namespace {
const fa::StageInfo& stage() { return fa::find_stage("03"); }
}  // namespace

TEST_CASE("stage 03: shape matrix") { fa::test::check_matrix(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 03: adversarial inputs") { fa::test::check_adversarial(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 03: NaN and inf under a mask") { fa::test::check_nonfinite_semantics(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 03: properties") { fa::test::check_properties(stage(), fa::Dtype::F32, false); }
TEST_CASE("stage 03: refusals") { fa::test::check_refusals(stage(), fa::Dtype::F32); }
TEST_CASE("stage 03: random shapes") { fa::test::check_random_shapes(stage(), fa::Dtype::F32, false, 6); }

TEST_CASE("stage 03: per-row m and l equal the reference's") {
  fa::test::check_row_stats(&fa::stage03::forward);
}
