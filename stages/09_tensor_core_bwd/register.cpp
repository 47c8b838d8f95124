// How stage 09 presents itself to the driver, the tour, the tests and the C ABI.
//
// Its forward IS stage 08's: the backward consumes that forward's O and L, so "run stage
// 09" means stage 08's forward followed by this stage's backward, and the shared checks
// (check_backward) test the two together against the reference's gradients. The forward
// is limited to this stage's head dims, so that every forward it accepts has a backward.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>

#include "cuda_utils.h"
#include "options.h"
#include "tensor_core_bwd.h"
#include "tensor_core_fwd.h"

namespace fa::stage09 {

namespace {

constexpr const char* kStageName = "09_tensor_core_bwd";

/// Refuses a bad problem or an unsupported head dim by name, before the host adapters
/// allocate anything (a negative size must be refused, not turned into a huge allocation).
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
                      "which step of the stage runs: auto (09b at d = 64, 09c at d = 128), 09a (dQ by a second "
                      "kernel: bitwise reproducible), 09b (dQ by fp32 atomics), 09c (warps 4 x 2, P and dS through "
                      "shared memory)")}};
  return table;
}

}  // namespace

Options current_options() { return Options{Step(options().get("step"))}; }

void set_options(const Options& o) { options().set("step", int64_t(o.step)); }

StageInfo info() {
  const StageInfo fwd = stage08::info();
  StageInfo s;
  s.name = kStageName;
  s.idea = "fp16/bf16 backward on tensor cores: preprocess D, dK/dV with K,V resident, dQ by a second pass or by atomics";
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
  // The whole backward is timed: preprocess, dK/dV (+ atomics), dQ pass or conversion.
  s.bench_backward = bench_backward_on_device(s.forward_device, s.backward_device);

  s.report = [](const Problem& p, Dtype t) { return launch_report(p, t, have_gpu()); };
  options().attach(s);
  return s;
}

}  // namespace fa::stage09
