// Mutation check for stage 03's exercise 2 ("remove std::isnan from pass 1"). This program
// is built from a copy of three_pass.cpp with the exercise's change made (tests/CMakeLists.txt
// makes the copy, and renames the namespace to fa::stage03_mutant so both copies link).
// CTest expects both test cases to fail, as the exercise says.
#include <doctest/doctest.h>

#include "stage_checks.h"
#include "three_pass.h"

namespace {
fa::StageInfo mutant() {
  fa::StageInfo s;
  s.name = "03_three_pass (without std::isnan)";
  s.forward = [](const fa::Problem& p, fa::Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) { fa::stage03::forward(p, Q, K, V, O, L); };
  return s;
}
}  // namespace

TEST_CASE("mutant: per-row m and l") { fa::test::check_row_stats(&fa::stage03::forward); }
TEST_CASE("mutant: adversarial inputs") { fa::test::check_adversarial(mutant(), fa::Dtype::F32, false); }
