// How stage 07 presents itself to the driver, the tour, the tests and the C ABI: its
// options (per calling thread, options.h) and the launch report.
#include <stdexcept>

#include "cuda_utils.h"
#include "options.h"
#include "smem_cuda.h"

namespace fa::stage07 {

namespace {

constexpr const char* kStage = "07_smem_cuda";

// Refuses what the kernel cannot run before anything is allocated or copied.
void require_runnable(const Problem& p, Dtype t) {
  if (t != Dtype::F32)
    throw std::invalid_argument(std::string(kStage) + ": dtype " + dtype_name(t) +
                                " is not supported (this stage computes in f32 only)");
  launch_shape(p);  // validates the problem and the head dim
}

const OptionTable& options() {
  static const OptionTable table{
      kStage,
      {Option::choice("block_k", {{0, "auto"}, {32, "32"}, {64, "64"}},
                      "keys per shared-memory tile B_c of the padded kernel (auto: 64 for d <= 64, else 32; "
                      "at d = 128 a value other than auto runs the padded kernel instead of the swizzled "
                      "B_c = 64 one)"),
       Option::choice("pipeline", {"auto", "cp_async", "sync"},
                      "K, V loads: auto and cp_async (1) copy the next K, V tiles with cp.async during this "
                      "tile's math; sync (2) loads each tile, then computes it"),
       Option::choice("variant", {"auto", "swizzled", "swizzled_256", "padded_two_barriers", "padded"},
                      "kernel variant: auto (0: 1 at d = 128, else 4); 1 B_c = 64, swizzled tiles (2 blocks/SM "
                      "at d = 128); 2 as 1 with 256 threads; 3 the padded tiles, 2 barriers per key tile; "
                      "4 the padded kernel (3 barriers)")},
      {{"block_q", "query rows per thread block", [] { return int64_t(launch_shape(Problem{}).block_q); }},
       {"threads", "threads per block at d = 64", [] { return int64_t(launch_shape(Problem{}).threads); }}}};
  return table;
}

}  // namespace

void set_block_k(int block_k) { options().set("block_k", block_k); }
int block_k_option() { return int(options().get("block_k")); }
void set_pipeline(int pipeline) { options().set("pipeline", pipeline); }
int pipeline_option() { return int(options().get("pipeline")); }
void set_variant(int variant) { options().set("variant", variant); }
int variant_option() { return int(options().get("variant")); }

StageInfo info() {
  StageInfo s;
  s.name = kStage;
  s.idea = "the tiled forward as a CUDA kernel: fp32, tiles in shared memory, S and O in registers";
  s.is_gpu = true;
  s.dtypes = {Dtype::F32};
  s.head_dims = supported_head_dims();

  s.forward_device = [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V,
                        void* O, float* L, void* stream) {
    require_runnable(p, t);
    forward(p, static_cast<const float*>(Q), static_cast<const float*>(K),
            static_cast<const float*>(V), static_cast<float*>(O), L,
            static_cast<cudaStream_t>(stream));
  };
  s.forward = [on_host = host_forward_via_device(s.forward_device)](
                  const Problem& p, Dtype t, const float* Q, const float* K, const float* V,
                  float* O, float* L) {
    require_runnable(p, t);  // before the adapter allocates device buffers for p
    on_host(p, t, Q, K, V, O, L);
  };
  s.bench_forward = bench_forward_on_device(s.forward_device);
  s.report = [](const Problem& p, Dtype) { return launch_report(p); };
  options().attach(s);
  return s;
}

}  // namespace fa::stage07
