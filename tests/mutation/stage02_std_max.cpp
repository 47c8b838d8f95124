// Mutation check for stage 02's notes: with the row max written as std::max(row_max, s)
// a query row of NaN logits keeps m = −inf and comes out finite (O = 0, L = −inf). Built
// from a copy of safe_softmax.cpp with that change (tests/CMakeLists.txt makes the copy
// and renames the namespace to fa::stage02_mutant); CTest expects the NaN case to fail.
#include <doctest/doctest.h>

#include "safe_softmax.h"
#include "stage_checks.h"

TEST_CASE("mutant: adversarial inputs") {
  fa::StageInfo s;
  s.name = "02_safe_softmax (std::max)";
  s.forward = [](const fa::Problem& p, fa::Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) { fa::stage02::forward(p, Q, K, V, O, L); };
  fa::test::check_adversarial(s, fa::Dtype::F32, false);
}
