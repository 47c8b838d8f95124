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
