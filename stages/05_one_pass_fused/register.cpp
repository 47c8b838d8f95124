// How stage 05 presents itself to the driver, the tour, the tests and the C ABI.
#include "one_pass_fused.h"

namespace fa::stage05 {

StageInfo info() {
  StageInfo s;
  s.name = "05_one_pass_fused";
  s.idea = "online softmax with output rescaling: one pass over K,V per row; writes O and L";
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) { forward(p, Q, K, V, O, L); };
  return s;
}

}  // namespace fa::stage05
