// How stage 07 presents itself to the driver, the tour, the tests and the C ABI.
#include <CLI/CLI.hpp>
#include <stdexcept>

#include "cuda_utils.h"
#include "smem_cuda.h"

namespace fa::stage07 {

namespace {

// Refuses what the kernel cannot run before anything is allocated or copied.
void require_runnable(const Problem& p, Dtype t) {
  if (t != Dtype::F32)
    throw std::invalid_argument(std::string("07_smem_cuda: dtype ") + dtype_name(t) +
                                " is not supported (this stage computes in f32 only)");
  launch_shape(p);  // validates the problem and the head dim
}

}  // namespace

StageInfo info() {
  StageInfo s;
  s.name = "07_smem_cuda";
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

  s.add_options = [](CLI::App& app) {
    app.add_option_function<int>(
           "--block-k", [](const int& v) { set_block_k(v); },
           "keys per shared-memory tile B_c of the padded kernel (0: 64 for d <= 64, else 32; at d = 128 "
           "a value other than 0 runs the padded kernel instead of the swizzled B_c = 64 one)")
        ->check(CLI::IsMember({0, 32, 64}));
    app.add_option_function<int>(
           "--pipeline", [](const int& v) { set_pipeline(v); },
           "0 or 1: copy the next K, V tiles with cp.async during this tile's math (the default); "
           "2: load each tile, then compute it")
        ->check(CLI::IsMember({0, 1, 2}));
    app.add_option_function<int>(
           "--variant", [](const int& v) { set_variant(v); },
           "kernel variant: 0 auto (the default: 1 at d = 128, else 4); 1 B_c = 64, swizzled tiles "
           "(2 blocks/SM at d = 128); 2 as 1 with 256 threads; 3 the padded tiles, 2 barriers per "
           "key tile; 4 the padded kernel (3 barriers)")
        ->check(CLI::IsMember({0, 1, 2, 3, 4}));
  };
  s.set_option = [](const std::string& name, int64_t value) {
    if (name == "block_k") return set_block_k(int(value));
    if (name == "pipeline") return set_pipeline(int(value));
    if (name == "variant") return set_variant(int(value));
    throw std::invalid_argument("07_smem_cuda: no option '" + name +
                                "' (options: block_k, pipeline, variant)");
  };
  s.get_counter = [](const std::string& name) -> int64_t {
    if (name == "block_k") return block_k_option();
    if (name == "pipeline") return pipeline_option();
    if (name == "variant") return variant_option();
    if (name == "block_q") return launch_shape(Problem{}).block_q;
    if (name == "threads") return launch_shape(Problem{}).threads;
    throw std::invalid_argument("07_smem_cuda: no counter '" + name +
                                "' (counters: block_k, pipeline, variant, block_q, threads)");
  };
  s.report = [](const Problem& p, Dtype) { return launch_report(p); };
  return s;
}

}  // namespace fa::stage07
