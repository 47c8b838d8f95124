// How stage 08 presents itself to the driver, the tour, the tests and the C ABI.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <stdexcept>

#include "cuda_utils.h"
#include "tensor_core_fwd.h"

namespace fa::stage08 {

namespace {

bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) cudaGetLastError();  // clear the "no device" error
  return ok;
}

// The settings the C ABI can change by name (fa_set_option / fa_get_counter):
//   "ablation":  0 none, 1 no_pipeline, 2 no_swizzle, 3 padded, 4 no_causal_split, 5 no_exp2
//   "tile_d128": 0 auto (q_smem_wide without a causal mask, q_regs with one), 1 q_regs (B_r = 64,
//                Q in registers), 2 q_smem (B_r = 128, B_c = 32, Q in shared memory),
//                3 q_smem_wide (B_r = 128, B_c = 64, Q in shared memory)
void set_option(const std::string& name, int64_t value) {
  Options o = current_options();
  if (name == "ablation") {
    if (value < 0 || value >= int64_t(ablation_names().size()))
      throw std::invalid_argument("08_tensor_core_fwd: ablation = " + std::to_string(value) +
                                  " is not 0..5 (none, no_pipeline, no_swizzle, padded, no_causal_split, no_exp2)");
    o.ablation = Ablation(value);
  } else if (name == "tile_d128") {
    if (value < 0 || value >= int64_t(tile_d128_names().size()))
      throw std::invalid_argument("08_tensor_core_fwd: tile_d128 = " + std::to_string(value) +
                                  " is not 0 (auto), 1 (q_regs), 2 (q_smem) or 3 (q_smem_wide)");
    o.tile_d128 = TileD128(value);
  } else {
    throw std::invalid_argument("08_tensor_core_fwd: no option named '" + name + "' (options: ablation, tile_d128)");
  }
  set_options(o);
}

int64_t get_counter(const std::string& name) {
  const Options o = current_options();
  if (name == "ablation") return int64_t(o.ablation);
  if (name == "tile_d128") return int64_t(o.tile_d128);
  throw std::invalid_argument("08_tensor_core_fwd: no counter named '" + name + "' (counters: ablation, tile_d128)");
}

}  // namespace

StageInfo info() {
  StageInfo s;
  s.name = "08_tensor_core_fwd";
  s.idea = "fp16/bf16 forward on tensor cores: mma.sync, ldmatrix, cp.async pipeline, swizzled smem, causal split";
  s.is_gpu = true;
  s.dtypes = {Dtype::BF16, Dtype::F16};
  s.head_dims = supported_head_dims();
  s.forward_device = [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V, void* O, float* L,
                        void* stream) { forward(p, t, Q, K, V, O, L, static_cast<cudaStream_t>(stream)); };
  s.forward = host_forward_via_device(s.forward_device);
  s.bench_forward = bench_forward_on_device(s.forward_device);
  s.add_options = [](CLI::App& app) {
    app.add_option_function<std::string>(
           "--ablation", [](const std::string& v) { set_option("ablation", int64_t(parse_ablation(v))); },
           "turn one optimisation off (bf16, d = 64 or 128): none, no_pipeline, no_swizzle, padded, "
           "no_causal_split, no_exp2")
        ->check(CLI::IsMember(ablation_names()));
    app.add_option_function<std::string>(
           "--tile-d128",
           [](const std::string& v) {
             const auto& names = tile_d128_names();
             set_option("tile_d128", int64_t(std::find(names.begin(), names.end(), v) - names.begin()));
           },
           "tile shape at d = 128: auto (default: q_smem_wide without a causal mask, q_regs with one), "
           "q_regs (B_r = 64, B_c = 64, Q in registers), q_smem (B_r = 128, B_c = 32, "
           "Q re-read from shared memory) or q_smem_wide (B_r = 128, B_c = 64, Q re-read from shared memory, "
           "FlashAttention-2's sm90 shape)")
        ->check(CLI::IsMember(tile_d128_names()));
  };
  s.report = [](const Problem& p, Dtype t) {
    if (!have_gpu()) return std::vector<std::pair<std::string, std::string>>{};
    return launch_report(p, t);
  };
  s.set_option = set_option;
  s.get_counter = get_counter;
  return s;
}

}  // namespace fa::stage08
