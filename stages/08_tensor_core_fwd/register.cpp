// How stage 08 presents itself to the driver, the tour, the tests and the C ABI.
#include <cuda_runtime_api.h>

#include "cuda_utils.h"
#include "options.h"
#include "tensor_core_fwd.h"

namespace fa::stage08 {

namespace {

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::choice("step", {"auto", "08a", "08b"},
                      "which step of the stage runs: auto (the final design, 08b), 08a (one K/V buffer: each tile "
                      "loaded after the last is done), 08b (K/V double-buffered with cp.async)"),
       Option::choice("ablation", ablation_values(),
                      "turn one optimisation of step 08b off (bf16, d = 64 or 128, the q_regs tile): none, "
                      "no_swizzle, padded, no_causal_split"),
       Option::choice("tile_d128", tile_d128_values(),
                      "tile shape at d = 128: auto (q_smem_wide without a causal mask, q_regs with one), "
                      "q_regs (B_r = 64, B_c = 64, Q in registers) or q_smem_wide (B_r = 128, B_c = 64, Q re-read "
                      "from shared memory, FlashAttention-2's sm90 shape)")}};
  return table;
}

}  // namespace

const std::vector<std::string>& step_names() { return options().value_names("step"); }

Options current_options() {
  const OptionTable& t = options();
  return Options{Step(t.get("step")), Ablation(t.get("ablation")), TileD128(t.get("tile_d128"))};
}

void set_options(const Options& o) {
  const OptionTable& t = options();
  t.set("step", int64_t(o.step));
  t.set("ablation", int64_t(o.ablation));
  t.set("tile_d128", int64_t(o.tile_d128));
}

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "fp16/bf16 forward on tensor cores: mma.sync, ldmatrix, swizzled smem, causal split, cp.async double buffer";
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

}  // namespace fa::stage08
