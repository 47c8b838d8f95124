// How stage 11 presents itself to the driver, the tour, the tests and the C ABI.
//
// Its forward IS stage 10's (restricted to this stage's head dims): the backward consumes
// that forward's O and L, so "run stage 11" means stage 10's forward followed by this
// stage's backward, and the shared checks test the two together against the reference.
#include <cuda_runtime_api.h>

#include "cuda_utils.h"
#include "hopper_bwd.h"
#include "hopper_fwd.h"
#include "options.h"

namespace fa::stage11 {

namespace {

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::choice("step", {"auto", "11a", "11b", "11c", "11d"},
                      "which step of the stage runs: auto (the final design, 11d), 11a (TMA + wgmma, one "
                      "warpgroup), 11b (warp specialization: a producer warpgroup, two consumer warpgroups), 11c "
                      "(exponentials and dQ atomics overlapped with the products), 11d (dQ added by TMA bulk "
                      "reductions from shared memory)"),
       Option::flag_option("deterministic",
                           "dQ by a second kernel that sums the key tiles in a fixed order (bitwise reproducible) "
                           "instead of fp32 atomics")}};
  return table;
}

}  // namespace

const std::vector<std::string>& step_names() { return options().value_names("step"); }

Options current_options() {
  const OptionTable& t = options();
  Options o;
  o.step = Step(t.get("step"));
  o.deterministic = t.get("deterministic") != 0;
  return o;
}

void set_options(const Options& o) {
  const OptionTable& t = options();
  t.set("step", int64_t(o.step));
  t.set("deterministic", o.deterministic ? 1 : 0);
}

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "the backward on Hopper's units: TMA, wgmma with operands in registers and shared memory, warp "
           "specialization";
  attach_forward_and_backward(s, kStageName, kHeadDims, stage10::info().forward_device,
                              [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V,
                                 const void* O, const float* L, const void* dO, void* dQ, void* dK, void* dV,
                                 void* stream) {
                                backward(p, t, Q, K, V, O, L, dO, dQ, dK, dV, static_cast<cudaStream_t>(stream));
                              });
  s.report = [](const Problem& p, Dtype t) {
    if (!have_gpu()) return std::vector<std::pair<std::string, std::string>>{};
    return launch_report(p, t);
  };
  options().attach(s);
  return s;
}

}  // namespace fa::stage11
