// How stage 01 presents itself to the driver, the tour, the tests and the C ABI.
#include "naive.h"

namespace fa::stage01 {

StageInfo info() {
  StageInfo s;
  s.name = "01_naive";
  s.idea = "standard attention exp(x)/sum exp(x); materialises S and P; overflows";
  s.overflows_on_large_logits = true;
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) { forward(p, Q, K, V, O, L); };
  return s;
}

}  // namespace fa::stage01
