// Stage 08's host side: the names of its options, what it refuses, which step's kernel runs,
// and the launch report. The launch itself is tensor_core_fwd.cu's forward().
#include <cuda_runtime_api.h>

#include <sstream>
#include <stdexcept>
#include <string>

#include "cuda_utils.h"
#include "fwd_steps.h"
#include "tensor_core_fwd.h"

namespace fa::stage08 {

namespace {

void check_pointer(const char* name, const void* ptr, size_t alignment) {
  require_device_pointer(kStageName, name, ptr, alignment,
                         alignment == 16 ? "tiles move in 16-byte cp.async copies and vector stores"
                                         : "L is fp32");
}

}  // namespace

const std::vector<std::pair<int64_t, std::string>>& ablation_values() {
  static const std::vector<std::pair<int64_t, std::string>> values{
      {0, "none"}, {2, "no_swizzle"}, {3, "padded"}, {4, "no_causal_split"}};
  return values;
}

std::string ablation_name(Ablation a) {
  for (const auto& [value, name] : ablation_values())
    if (value == int64_t(a)) return name;
  return "ablation " + std::to_string(int(a));
}

Ablation parse_ablation(const std::string& name) {
  for (const auto& [value, n] : ablation_values())
    if (n == name) return Ablation(value);
  throw std::invalid_argument(std::string(kStageName) + ": ablation '" + name +
                              "' is not one of none, no_swizzle, padded, no_causal_split");
}

const std::vector<std::pair<int64_t, std::string>>& tile_d128_values() {
  static const std::vector<std::pair<int64_t, std::string>> values{{0, "auto"}, {1, "q_regs"}, {3, "q_smem_wide"}};
  return values;
}

void check_request(const Problem& p, Dtype dtype) {
  require_tensor_core_request(kStageName, p, dtype, kHeadDims);
  require_grid_rows(kStageName, p);
}

void check_pointers(const Problem& p, const void* Q, const void* K, const void* V, const void* O, const float* L) {
  check_pointer("Q", Q, 16);
  check_pointer("O", O, 16);
  check_pointer("L", L, alignof(float));
  if (p.kv_elems() > 0) {  // seq_k = 0: K and V are never read
    check_pointer("K", K, 16);
    check_pointer("V", V, 16);
  }
}

dim3 grid_of(const Problem& p, int block_rows) {
  return dim3(unsigned((p.seq_q + block_rows - 1) / block_rows), unsigned(p.heads), unsigned(p.batch));
}

StepKernel kernel_for(const Problem& p, Dtype dtype, const Options& o) {
  if (o.step == Step::OneBuffer) return step_08a(p.head_dim, dtype, p.causal, o);
  return step_08b(p.head_dim, dtype, p.causal, o);
}

std::vector<std::pair<std::string, std::string>> launch_report(const Problem& p, Dtype dtype) {
  check_request(p, dtype);
  const Options o = current_options();
  const StepKernel k = kernel_for(p, dtype, o);
  std::vector<std::pair<std::string, std::string>> rows;
  const bool one_buffer = o.step == Step::OneBuffer;
  rows.push_back({"step", std::string(one_buffer ? "08a" : "08b") + (o.step == Step::Auto ? " (auto)" : "")});
  rows.push_back({"tile", k.description});
  prepare_kernel(k);
  for (auto& r : describe_launch(k.fn, grid_of(p, k.block_rows), dim3(unsigned(k.threads)), k.smem_bytes))
    rows.push_back(r);
  return rows;
}

}  // namespace fa::stage08
