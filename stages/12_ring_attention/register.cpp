// How stage 12 presents itself to the driver, the tour, the tests and the C ABI: two entries,
// one per machine it runs on.
//   12_ring_attention      the CPU ring: P threads over stage 06, fp32 (every machine, CI)
//   12_ring_attention_gpu  the GPU ring: stages 08 and 09 on each rank, fp16/bf16; virtual
//                          ranks on one GPU (device copies) or one GPU per rank (NCCL)
// Both take --ranks and --split, and count the work of the calling thread's last run.
#include <algorithm>
#include <cstdio>
#include <string>

#include "options.h"
#include "ring_attention.h"
#ifdef FA_HAVE_CUDA
#include "cuda_utils.h"
#include "ring_gpu.h"
#endif

namespace fa::stage12 {

namespace {

thread_local Work t_last_work;  // what the calling thread's last run counted

int64_t last(int64_t (Work::*field)() const) {
  if (t_last_work.ranks() == 0)
    throw std::invalid_argument(std::string(kStageName) + ": no ring has run on this thread yet");
  return (t_last_work.*field)();
}

std::vector<Counter> work_counters() {
  return {
      {"work_total", "score entries (query row, key) computed by all ranks, per head",
       [] { return last(&Work::total); }},
      {"work_busiest", "score entries of the busiest rank", [] { return last(&Work::busiest); }},
      {"work_idlest", "score entries of the idlest rank", [] { return last(&Work::idlest); }},
      {"work_critical", "sum over steps of the busiest rank's entries at that step (the ring's time)",
       [] { return last(&Work::critical); }},
      {"efficiency_permille", "1000 * total / (ranks * critical): 1000 when every step is balanced",
       [] { return last(&Work::efficiency_permille); }},
  };
}

Option ranks_option() {
  return Option::range("ranks", 1, kMaxRanks, 0, "P, the ranks of the ring (0: 4, fewer for a short sequence)");
}
Option split_option() {
  return Option::choice("split", std::vector<std::string>{"zigzag", "plain"},
                        "zigzag (rank r holds chunks r and 2P-1-r) or plain (rank r holds chunk r)");
}

const OptionTable& cpu_options() {
  static const OptionTable table{kStageName, {ranks_option(), split_option()}, work_counters()};
  return table;
}

Config cpu_config() { return Config{int(cpu_options().get("ranks")), Split(cpu_options().get("split"))}; }

std::vector<std::pair<std::string, std::string>> work_rows(const Problem& p, int ranks, Split split) {
  if (t_last_work.ranks() == 0) return {};
  std::string per_rank;
  for (int r = 0; r < t_last_work.ranks(); ++r) {
    if (r > 0) per_rank += ' ';
    per_rank += std::to_string(t_last_work.of_rank(r));
  }
  char ratio[64] = "- (a rank has no work)", balance[160];
  if (t_last_work.idlest() > 0)
    std::snprintf(ratio, sizeof ratio, "%.2f", double(t_last_work.busiest()) / double(t_last_work.idlest()));
  std::snprintf(balance, sizeof balance, "busiest/idlest rank %s, ring efficiency %.1f %% of ideal", ratio,
                100.0 * t_last_work.efficiency());
  return {{"ring", std::to_string(ranks_for(p, ranks, split)) + " ranks, " + split_name(split) + " split"},
          {"work per rank", per_rank + " score entries per head"},
          {"balance", balance}};
}

// A row's result is merged from one partial result per key chunk it sees: at most the
// ring's key chunks (2P zigzag, P plain).
int key_chunks(const Problem& p, int ranks, Split split) {
  return int(make_plan(p, ranks_for(p, ranks, split), split, kStageName).k_chunks.size());
}

}  // namespace

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.merged_parts = [](const Problem& p) { return key_chunks(p, cpu_config().ranks, cpu_config().split); };
  s.idea = "ring attention: the sequence split across P ranks, K/V passed around a ring, partial (O, L) merged; "
           "zigzag split for causal balance";
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V, float* O, float* L) {
    forward(p, cpu_config(), Q, K, V, O, L, &t_last_work);
  };
  s.backward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V, const float* O,
                  const float* L, const float* dO, float* dQ, float* dK, float* dV) {
    backward(p, cpu_config(), Q, K, V, O, L, dO, dQ, dK, dV, &t_last_work);
  };
  s.report = [](const Problem& p, Dtype) { return work_rows(p, cpu_config().ranks, cpu_config().split); };
  cpu_options().attach(s);
  return s;
}

#ifdef FA_HAVE_CUDA
namespace {

const OptionTable& gpu_options() {
  static const OptionTable table{
      kGpuStageName,
      {ranks_option(), split_option(),
       Option::choice("transport", std::vector<std::string>{"device", "nccl"},
                      "device (virtual ranks on this GPU, device copies) or nccl (rank r on GPU r)"),
       Option::choice("kernels", std::vector<std::string>{"auto", "tensor_core", "hopper"},
                      "what each rank runs on its pairs: auto (stages 10 and 11 on Hopper GPUs, 08 and 09 elsewhere), "
                      "tensor_core (08 and 09) or hopper (10 and 11)")},
      work_counters()};
  return table;
}

GpuConfig gpu_config() {
  const OptionTable& o = gpu_options();
  return GpuConfig{int(o.get("ranks")), Split(o.get("split")), TransportKind(o.get("transport")),
                   RankKernels(o.get("kernels"))};
}

}  // namespace

StageInfo gpu_info() {
  StageInfo s;
  s.name = kGpuStageName;
  s.merged_parts = [](const Problem& p) { return key_chunks(p, gpu_config().ranks, gpu_config().split); };
  s.idea = "ring attention on GPUs: stages 10 and 11 (Hopper) or 08 and 09 on each rank, K/V passed by device copies "
           "or NCCL";
  s.is_gpu = true;
  s.dtypes = {Dtype::BF16, Dtype::F16};
  s.head_dims = gpu_head_dims();
  s.forward_device = [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V, void* O, float* L,
                        void* stream) {
    forward_gpu(p, gpu_config(), t, Q, K, V, O, L, static_cast<cudaStream_t>(stream), &t_last_work);
  };
  s.backward_device = [](const Problem& p, Dtype t, const void* Q, const void* K, const void* V, const void* O,
                         const float* L, const void* dO, void* dQ, void* dK, void* dV, void* stream) {
    backward_gpu(p, gpu_config(), t, Q, K, V, O, L, dO, dQ, dK, dV, static_cast<cudaStream_t>(stream),
                 &t_last_work);
  };
  s.forward = host_forward_via_device(s.forward_device);
  s.backward = host_backward_via_device(s.backward_device);
  s.bench_forward = bench_forward_on_device(s.forward_device);
  s.bench_backward = bench_backward_on_device(s.forward_device, s.backward_device);
  s.report = [](const Problem& p, Dtype) {
    auto rows = work_rows(p, gpu_config().ranks, gpu_config().split);
    rows.insert(rows.begin(), {"transport", std::string(transport_name(gpu_config().transport)) +
                                                (nccl_built() ? "" : " (nccl: not built in)")});
    // The kernels as the calling thread's GPU decides them (an NCCL ring asks every rank's GPU).
    int device = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    const RankKernels k = gpu_config().kernels;
    rows.insert(rows.begin() + 1, {"kernels", std::string(runs_hopper(k, {device}) ? "stages 10 and 11" : "stages 08 and 09") +
                                                  " (" + kernels_name(k) + ")"});
    return rows;
  };
  gpu_options().attach(s);
  return s;
}
#endif

}  // namespace fa::stage12
