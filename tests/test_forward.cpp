// The forward of a stage that also has a backward, graded on its own: the shared matrix,
// adversarial inputs, the non-finite rules, the properties, the refusals and random shapes,
// all without the backward (CTest: stageNN_forward, with FA_TEST_STAGE=NN). In a lab tree
// the forward then passes or fails by itself, whatever state the backward is in.
#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "stage_checks.h"
#include "stage_list.h"

namespace {

const fa::StageInfo& stage() {
  const char* number = std::getenv("FA_TEST_STAGE");
  if (number == nullptr || *number == '\0')
    throw std::invalid_argument("test_forward: set FA_TEST_STAGE to a stage number, e.g. 06");
  const fa::StageInfo& s = fa::find_stage(number);
  if (!s.has_backward())
    throw std::invalid_argument("test_forward: stage " + s.name +
                                " has no backward: its own test program grades its forward");
  return s;
}

constexpr fa::Dtype kF32 = fa::Dtype::F32;

}  // namespace

TEST_CASE("forward only: shape matrix") { fa::test::check_matrix(stage(), kF32, false); }
TEST_CASE("forward only: adversarial inputs") { fa::test::check_adversarial(stage(), kF32, false); }
TEST_CASE("forward only: NaN and inf under a mask") { fa::test::check_nonfinite_semantics(stage(), kF32, false); }
TEST_CASE("forward only: properties") { fa::test::check_properties(stage(), kF32, false); }
TEST_CASE("forward only: refusals") { fa::test::check_refusals(stage(), kF32); }
TEST_CASE("forward only: random shapes") { fa::test::check_random_shapes(stage(), kF32, false, 6); }
