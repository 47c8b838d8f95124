// How stage 04 presents itself to the driver, the tour, the tests and the C ABI.
#include "two_pass_online.h"

namespace fa::stage04 {

StageInfo info() {
  StageInfo s;
  s.name = "04_two_pass_online";
  s.idea = "online normaliser: max and sum in one pass, then output";
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) { forward(p, Q, K, V, O, L); };
  return s;
}

}  // namespace fa::stage04
