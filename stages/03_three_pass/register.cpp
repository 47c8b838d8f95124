// How stage 03 presents itself to the driver, the tour, the tests and the C ABI.
#include "three_pass.h"

namespace fa::stage03 {

StageInfo info() {
  StageInfo s;
  s.name = "03_three_pass";
  s.idea = "stream each query row: pass 1 max, pass 2 sum, pass 3 output; no NxN buffer";
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) { forward(p, Q, K, V, O, L); };
  return s;
}

}  // namespace fa::stage03
