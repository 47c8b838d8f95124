// How stage 10 presents itself to the driver, the tour, the tests and the C ABI.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <stdexcept>

#include "cuda_utils.h"
#include "hopper_fwd.h"

namespace fa::stage10 {

namespace {

// The setting the C ABI can change by name (fa_set_option / fa_get_counter):
//   "step": 0 auto (10e), 1 10a, 2 10b, 3 10c, 4 10d, 5 10e
void set_option(const std::string& name, int64_t value) {
  if (name != "step")
    throw std::invalid_argument("10_hopper_fwd: no option named '" + name + "' (options: step)");
  if (value < 0 || value >= int64_t(step_names().size()))
    throw std::invalid_argument("10_hopper_fwd: step = " + std::to_string(value) +
                                " is not 0..5 (auto, 10a, 10b, 10c, 10d, 10e)");
  Options o = current_options();
  o.step = Step(value);
  set_options(o);
}

int64_t get_counter(const std::string& name) {
  if (name == "step") return int64_t(current_options().step);
  throw std::invalid_argument("10_hopper_fwd: no counter named '" + name + "' (counters: step)");
}

}  // namespace

StageInfo info() {
  StageInfo s;
  s.name = "10_hopper_fwd";
  s.idea = "the forward on Hopper's units: TMA on mbarriers, wgmma, warp specialization, ping-pong, overlap";
  s.is_gpu = true;
  s.dtypes = {Dtype::BF16, Dtype::F16};
  s.head_dims = supported_head_dims();
  s.forward_device = [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V, void* O, float* L,
                        void* stream) { forward(p, t, Q, K, V, O, L, static_cast<cudaStream_t>(stream)); };
  s.forward = host_forward_via_device(s.forward_device);
  s.bench_forward = bench_forward_on_device(s.forward_device);
  s.add_options = [](CLI::App& app) {
    app.add_option_function<std::string>(
           "--step",
           [](const std::string& v) {
             const auto& names = step_names();
             set_option("step", int64_t(std::find(names.begin(), names.end(), v) - names.begin()));
           },
           "which step of the stage runs: auto (the final design, 10e), 10a (TMA + wgmma, one warpgroup), "
           "10b (warp specialization), 10c (ping-pong), 10d (softmax overlapped with the next GEMM), "
           "10e (persistent: one block per SM)")
        ->check(CLI::IsMember(step_names()));
  };
  s.report = [](const Problem& p, Dtype t) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      return std::vector<std::pair<std::string, std::string>>{};
    }
    return launch_report(p, t);
  };
  s.set_option = set_option;
  s.get_counter = get_counter;
  return s;
}

}  // namespace fa::stage10
