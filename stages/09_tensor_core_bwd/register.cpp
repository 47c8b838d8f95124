// How stage 09 presents itself to the driver, the tour, the tests and the C ABI.
//
// Its forward IS stage 08's: the backward consumes that forward's O and L, so "run stage
// 09" means stage 08's forward followed by this stage's backward, and the shared checks
// (check_backward) test the two together against the reference's gradients. The forward
// is limited to this stage's head dims, so that every forward it accepts has a backward.
#include <cuda_runtime_api.h>

#include "cuda_utils.h"
#include "options.h"
#include "tensor_core_bwd.h"
#include "tensor_core_fwd.h"

namespace fa::stage09 {

namespace {

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::choice("step", {"auto", "09a", "09b", "09c"},
                      "which step of the stage runs: auto (09b at d = 64, 09c at d = 128), 09a (dQ by a second "
                      "kernel: bitwise reproducible), 09b (dQ by fp32 atomics), 09c (warps 4 x 2, P and dS through "
                      "shared memory)")}};
  return table;
}

}  // namespace

const std::vector<std::string>& step_names() { return options().value_names("step"); }

Options current_options() { return Options{Step(options().get("step"))}; }

void set_options(const Options& o) { options().set("step", int64_t(o.step)); }

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "fp16/bf16 backward on tensor cores: preprocess D, dK/dV with K,V resident, dQ by a second pass or by atomics";
  attach_forward_and_backward(s, kStageName, kHeadDims, stage08::info().forward_device,
                              [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V,
                                 const void* O, const float* L, const void* dO, void* dQ, void* dK, void* dV,
                                 void* stream) {
                                backward(p, t, Q, K, V, O, L, dO, dQ, dK, dV, static_cast<cudaStream_t>(stream));
                              });
  s.report = [](const Problem& p, Dtype t) { return launch_report(p, t, have_gpu()); };
  options().attach(s);
  return s;
}

}  // namespace fa::stage09
