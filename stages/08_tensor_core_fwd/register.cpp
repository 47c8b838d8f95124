// How stage 08 presents itself to the driver, the tour, the tests and the C ABI.
#include <cuda_runtime_api.h>

#include "cuda_utils.h"
#include "options.h"
#include "tensor_core_fwd.h"

namespace fa::stage08 {

namespace {

constexpr const char* kStageName = "08_tensor_core_fwd";

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::choice("ablation", ablation_names(),
                      "turn one optimisation off (bf16, d = 64 or 128): none, no_pipeline, no_swizzle, padded, "
                      "no_causal_split, no_exp2"),
       Option::choice("tile_d128", tile_d128_names(),
                      "tile shape at d = 128: auto (q_smem_wide without a causal mask, q_regs with one), "
                      "q_regs (B_r = 64, B_c = 64, Q in registers), q_smem (B_r = 128, B_c = 32, Q re-read from "
                      "shared memory) or q_smem_wide (B_r = 128, B_c = 64, Q re-read from shared memory, "
                      "FlashAttention-2's sm90 shape)")}};
  return table;
}

}  // namespace

Options current_options() {
  return Options{Ablation(options().get("ablation")), TileD128(options().get("tile_d128"))};
}

void set_options(const Options& o) {
  options().set("ablation", int64_t(o.ablation));
  options().set("tile_d128", int64_t(o.tile_d128));
}

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "fp16/bf16 forward on tensor cores: mma.sync, ldmatrix, cp.async pipeline, swizzled smem, causal split";
  s.is_gpu = true;
  s.dtypes = {Dtype::BF16, Dtype::F16};
  s.head_dims = supported_head_dims();
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

}  // namespace fa::stage08
