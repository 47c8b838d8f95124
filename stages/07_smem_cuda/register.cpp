// How stage 07 presents itself to the driver, the tour, the tests and the C ABI: its
// options (per calling thread, options.h) and the launch report.
#include <stdexcept>

#include "cuda_utils.h"
#include "options.h"
#include "smem_cuda.h"

namespace fa::stage07 {

namespace {

// Refuses what the kernel cannot run before anything is allocated or copied.
void require_runnable(const Problem& p, Dtype t) {
  if (t != Dtype::F32)
    throw std::invalid_argument(std::string(kStageName) + ": dtype " + dtype_name(t) +
                                " is not supported (this stage computes in f32 only)");
  launch_shape(p);  // validates the problem and the head dim
}

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::choice("step", {"auto", "07a", "07b", "07c"},
                      "which step of the stage runs: auto (the final design, 07c), 07a (tiles loaded through "
                      "registers, then computed), 07b (the next tiles copied with cp.async during this tile's "
                      "math), 07c (two barriers per key tile)"),
       Option::choice("block_k", {{0, "auto"}, {32, "32"}, {64, "64"}},
                      "keys per shared-memory tile B_c (auto: 64 for d <= 64 and for swizzled tiles, else 32)"),
       Option::choice("smem_layout", smem_layout_names(),
                      "layout of sQ, sK, sP: auto (swizzled at d = 128 unless block_k = 32, else padded), "
                      "padded (rows padded by 4 floats) or swizzled (16-byte chunks XOR-swizzled, block_k 64)")},
      {{"block_q", "query rows per thread block", [] { return int64_t(launch_shape(Problem{}).block_q); }},
       {"threads", "threads per block", [] { return int64_t(launch_shape(Problem{}).threads); }}}};
  return table;
}

}  // namespace

const std::vector<std::string>& step_names() { return options().value_names("step"); }

Options current_options() {
  const OptionTable& t = options();
  return Options{Step(t.get("step")), int(t.get("block_k")), SmemLayout(t.get("smem_layout"))};
}

void set_options(const Options& o) {
  const OptionTable& t = options();
  t.set("step", int64_t(o.step));
  t.set("block_k", o.block_k);
  t.set("smem_layout", int64_t(o.smem_layout));
}

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "the tiled forward as a CUDA kernel: fp32, tiles in shared memory, S and O in registers";
  s.is_gpu = true;
  s.dtypes = {Dtype::F32};
  s.head_dims = kHeadDims;

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
