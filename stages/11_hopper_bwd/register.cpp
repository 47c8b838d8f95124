// How stage 11 presents itself to the driver, the tour, the tests and the C ABI.
//
// Its forward IS stage 10's (restricted to this stage's head dims): the backward consumes
// that forward's O and L, so "run stage 11" means stage 10's forward followed by this
// stage's backward, and the shared checks test the two together against the reference.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>

#include "cuda_utils.h"
#include "hopper_bwd.h"
#include "hopper_fwd.h"
#include "options.h"

namespace fa::stage11 {

namespace {

constexpr const char* kStageName = "11_hopper_bwd";

/// Refuses a head dim without a backward before the host adapters allocate anything.
void check_problem(const Problem& p) {
  p.validate(kStageName);
  const auto& dims = supported_head_dims();
  if (std::find(dims.begin(), dims.end(), p.head_dim) == dims.end())
    throw std::invalid_argument(std::string(kStageName) + ": head_dim = " + std::to_string(p.head_dim) +
                                " is not supported (supported: 64, 128)");
}

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::choice("step", step_names(),
                      "which step of the stage runs: auto (the final design, 11d), 11a (TMA + wgmma, one "
                      "warpgroup), 11b (warp specialization: a producer warp, two consumer warpgroups), 11c "
                      "(exponentials and dQ atomics overlapped with the products), 11d (dQ added by TMA bulk "
                      "reductions from shared memory)"),
       Option::flag_option("deterministic",
                           "dQ by a second kernel that sums the key tiles in a fixed order (bitwise reproducible) "
                           "instead of fp32 atomics")}};
  return table;
}

}  // namespace

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
  const StageInfo fwd = stage10::info();
  StageInfo s;
  s.name = kStageName;
  s.idea = "the backward on Hopper's units: TMA, wgmma with operands in registers and shared memory, warp "
           "specialization";
  s.is_gpu = true;
  s.dtypes = {Dtype::BF16, Dtype::F16};
  s.head_dims = supported_head_dims();
  s.forward_device = [f = fwd.forward_device](const Problem& p, Dtype t, const void* Q, const void* K, const void* V,
                                              void* O, float* L, void* stream) {
    check_problem(p);
    f(p, t, Q, K, V, O, L, stream);
  };
  s.forward = [f = host_forward_via_device(s.forward_device)](const Problem& p, Dtype t, const float* Q,
                                                              const float* K, const float* V, float* O, float* L) {
    check_problem(p);
    f(p, t, Q, K, V, O, L);
  };
  s.backward_device = [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V, const void* O,
                         const float* L, const void* dO, void* dQ, void* dK, void* dV, void* stream) {
    backward(p, t, Q, K, V, O, L, dO, dQ, dK, dV, static_cast<cudaStream_t>(stream));
  };
  s.backward = [f = host_backward_via_device(s.backward_device)](
                   const Problem& p, Dtype t, const float* Q, const float* K, const float* V, const float* O,
                   const float* L, const float* dO, float* dQ, float* dK, float* dV) {
    check_problem(p);
    f(p, t, Q, K, V, O, L, dO, dQ, dK, dV);
  };
  s.bench_forward = bench_forward_on_device(s.forward_device);
  // The whole backward is timed: preprocess, the main kernel (+ atomics), conversion.
  s.bench_backward = bench_backward_on_device(s.forward_device, s.backward_device);
  s.report = [](const Problem& p, Dtype t) {
    if (!have_gpu()) return std::vector<std::pair<std::string, std::string>>{};
    return launch_report(p, t);
  };
  options().attach(s);
  return s;
}

}  // namespace fa::stage11
