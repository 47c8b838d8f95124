// How stage 10 presents itself to the driver, the tour, the tests and the C ABI.
#include <cuda_runtime_api.h>

#include "cuda_utils.h"
#include "hopper_fwd.h"
#include "options.h"

namespace fa::stage10 {

namespace {

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::choice("step", {"auto", "10a", "10b", "10c", "10d", "10e", "10f"},
                      "which step of the stage runs: auto (the final design, 10f; 10a at d = 64 with at most 1024 keys), 10a (TMA + wgmma, one warpgroup), "
                      "10b (warp specialization), 10c (ping-pong), 10d (softmax overlapped with the next GEMM), "
                      "10e (persistent: one block per SM), 10f (dynamic tile scheduler)")}};
  return table;
}

}  // namespace

const std::vector<std::string>& step_names() { return options().value_names("step"); }

Options current_options() { return Options{Step(options().get("step"))}; }

void set_options(const Options& o) { options().set("step", int64_t(o.step)); }

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "the forward on Hopper's units: TMA on mbarriers, wgmma, warp specialization, ping-pong, overlap";
  s.is_gpu = true;
  s.dtypes = {Dtype::BF16, Dtype::F16};
  s.head_dims = kHeadDims;
  s.forward_device = [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V, void* O, float* L,
                        void* stream) { forward(p, t, Q, K, V, O, L, static_cast<cudaStream_t>(stream)); };
  s.forward = host_forward_via_device(s.forward_device);
  s.bench_forward = bench_forward_on_device(s.forward_device);
  s.report = [](const Problem& p, Dtype t) {
    if (!have_gpu()) return std::vector<std::pair<std::string, std::string>>{};
    return launch_report(p, t);
  };
  options().attach(s);
  return s;
}

}  // namespace fa::stage10
