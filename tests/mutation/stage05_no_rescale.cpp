// Mutation check for stage 05's notes ("How the tests catch a mistake"): with the rescale
// factor set to 1 (α = 1: what was summed before the max moved is never rescaled), the shape
// matrix fails on O, naming the worst row. Built from a copy of one_pass_fused.cpp with that
// change (tests/CMakeLists.txt makes the copy, namespace fa::stage05_mutant).
#include <doctest/doctest.h>

#include "one_pass_fused.h"
#include "stage_checks.h"

TEST_CASE("mutant: shape matrix") {
  fa::StageInfo s;
  s.name = "05_one_pass_fused (alpha = 1)";
  s.forward = [](const fa::Problem& p, fa::Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) { fa::stage05::forward(p, Q, K, V, O, L); };
  fa::test::check_matrix(s, fa::Dtype::F32, false);
}
