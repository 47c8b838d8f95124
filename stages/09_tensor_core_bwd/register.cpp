// How stage 09 presents itself to the driver, the tour, the tests and the C ABI.
//
// Its forward IS stage 08's: the backward consumes that forward's O and L, so "run stage
// 09" means stage 08's forward followed by this stage's backward, and the shared checks
// (check_backward) test the two together against the reference's gradients. The forward
// is limited to this stage's head dims, so that every forward it accepts has a backward.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <stdexcept>

#include "cuda_utils.h"
#include "tensor_core_bwd.h"
#include "tensor_core_fwd.h"

namespace fa::stage09 {

namespace {

constexpr const char* kStageName = "09_tensor_core_bwd";

bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) cudaGetLastError();  // clear the "no device" error
  return ok;
}

/// Refuses a bad problem or an unsupported head dim by name, before the host adapters
/// allocate anything (a negative size must be refused, not turned into a huge allocation).
void check_problem(const Problem& p) {
  p.validate(kStageName);
  const auto& dims = supported_head_dims();
  if (std::find(dims.begin(), dims.end(), p.head_dim) == dims.end())
    throw std::invalid_argument(std::string(kStageName) + ": head_dim = " + std::to_string(p.head_dim) +
                                " is not supported (supported: 64, 128)");
}

// The settings the C ABI can change by name (fa_set_option / fa_get_counter):
//   "deterministic": 0 (dQ by fp32 atomics, the default) or 1 (a separate dQ pass)
//   "ablation":      0 none, 1 no_pipeline, 2 no_swizzle
//   "tile":          0 wide (the default tiles), 1 narrow (smaller tiles; see bwd_traits.cuh)
//   "schedule":      0 two_barriers (the default), 1 one_barrier (wide tile only)
//   "layout":        0 auto (the default: p_smem at d = 128 where it fits, else p_regs),
//                    1 p_regs, 2 p_smem (wide tile, two_barriers, no ablation only)
void set_option(const std::string& name, int64_t value) {
  Options o = current_options();
  if (name == "deterministic") {
    if (value != 0 && value != 1)
      throw std::invalid_argument(std::string(kStageName) + ": deterministic = " + std::to_string(value) +
                                  " is not 0 (dQ by atomics) or 1 (a separate dQ pass)");
    o.deterministic = value == 1;
  } else if (name == "ablation") {
    if (value < 0 || value >= int64_t(ablation_names().size()))
      throw std::invalid_argument(std::string(kStageName) + ": ablation = " + std::to_string(value) +
                                  " is not 0..2 (none, no_pipeline, no_swizzle)");
    o.ablation = Ablation(value);
  } else if (name == "tile") {
    if (value != 0 && value != 1)
      throw std::invalid_argument(std::string(kStageName) + ": tile = " + std::to_string(value) +
                                  " is not 0 (wide) or 1 (narrow)");
    o.tile = Tile(value);
  } else if (name == "schedule") {
    if (value != 0 && value != 1)
      throw std::invalid_argument(std::string(kStageName) + ": schedule = " + std::to_string(value) +
                                  " is not 0 (two_barriers) or 1 (one_barrier)");
    o.schedule = Schedule(value);
  } else if (name == "layout") {
    if (value < 0 || value > 2)
      throw std::invalid_argument(std::string(kStageName) + ": layout = " + std::to_string(value) +
                                  " is not 0 (auto), 1 (p_regs) or 2 (p_smem)");
    o.layout = WarpLayout(value);
  } else {
    throw std::invalid_argument(std::string(kStageName) + ": no option named '" + name +
                                "' (options: deterministic, ablation, tile, schedule, layout)");
  }
  set_options(o);
}

int64_t get_counter(const std::string& name) {
  const Options o = current_options();
  if (name == "deterministic") return o.deterministic ? 1 : 0;
  if (name == "ablation") return int64_t(o.ablation);
  if (name == "tile") return int64_t(o.tile);
  if (name == "schedule") return int64_t(o.schedule);
  if (name == "layout") return int64_t(o.layout);
  throw std::invalid_argument(std::string(kStageName) + ": no counter named '" + name +
                              "' (counters: deterministic, ablation, tile, schedule, layout)");
}

}  // namespace

StageInfo info() {
  const StageInfo fwd = stage08::info();
  StageInfo s;
  s.name = kStageName;
  s.idea = "fp16/bf16 backward on tensor cores: preprocess D, dK/dV with K,V resident, dQ by atomics or a second pass";
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
  // The whole backward is timed: preprocess, dK/dV (+ atomics), conversion or dQ pass.
  s.bench_backward = bench_backward_on_device(s.forward_device, s.backward_device);

  s.add_options = [](CLI::App& app) {
    app.add_flag_callback(
        "--deterministic", [] { set_option("deterministic", 1); },
        "dQ by a separate pass over the key tiles (bitwise reproducible) instead of fp32 atomics");
    app.add_option_function<std::string>(
           "--ablation", [](const std::string& v) { set_option("ablation", int64_t(parse_ablation(v))); },
           "turn one optimisation of the dK/dV kernel off (bf16): none, no_pipeline, no_swizzle")
        ->check(CLI::IsMember(ablation_names()));
    app.add_option_function<std::string>(
           "--tile", [](const std::string& v) { set_option("tile", v == tile_names()[1] ? 1 : 0); },
           "dK/dV tile shape: wide (default) or narrow (d = 64: B_r = 64; d = 128: B_c = 64 over 4 warps)")
        ->check(CLI::IsMember(tile_names()));
    app.add_option_function<std::string>(
           "--schedule", [](const std::string& v) { set_option("schedule", v == schedule_names()[1] ? 1 : 0); },
           "dK/dV loop: two_barriers (default) or one_barrier per query tile (dSᵀ double-buffered; wide tile)")
        ->check(CLI::IsMember(schedule_names()));
    app.add_option_function<std::string>(
           "--layout",
           [](const std::string& v) {
             const auto& names = layout_names();
             set_option("layout", std::find(names.begin(), names.end(), v) - names.begin());
           },
           "dK/dV warp layout: auto (default: p_smem at d = 128, else p_regs), p_regs (Pᵀ, dSᵀ in registers) "
           "or p_smem (warps 4 × 2, Pᵀ and dSᵀ through shared memory; wide tile, two_barriers)")
        ->check(CLI::IsMember(layout_names()));
  };
  s.report = [](const Problem& p, Dtype t) { return launch_report(p, t, have_gpu()); };
  s.set_option = set_option;
  s.get_counter = get_counter;
  return s;
}

}  // namespace fa::stage09
