/// \file stage.h
/// \brief What a stage tells the shared harness about itself.
///
/// A stage is a small library in its own namespace (`fa::stage05::forward(...)`) plus one
/// `StageInfo` that hands it to the driver, the tour, the tests and the C ABI. Nothing in
/// the harness knows a stage by number: it only sees these fields.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "problem.h"

namespace CLI {
class App;
}

namespace fa {

class OptionTable;

/// Forward on host fp32 buffers. GPU stages copy to the device, convert to `dtype`,
/// run, and copy O back (rounded through `dtype`) and L (fp32).
using ForwardFn = std::function<void(const Problem&, Dtype, const float* Q, const float* K,
                                     const float* V, float* O, float* L)>;
/// Backward on host fp32 buffers; O and L are the stage's own forward outputs.
using BackwardFn = std::function<void(const Problem&, Dtype, const float* Q, const float* K,
                                      const float* V, const float* O, const float* L,
                                      const float* dO, float* dQ, float* dK, float* dV)>;
/// Forward on device buffers in `dtype` (L always fp32); `stream` is a cudaStream_t.
using ForwardDeviceFn = std::function<void(const Problem&, Dtype, const void* Q, const void* K,
                                           const void* V, void* O, float* L, void* stream)>;
/// Backward on device buffers in `dtype`.
using BackwardDeviceFn =
    std::function<void(const Problem&, Dtype, const void* Q, const void* K, const void* V,
                       const void* O, const float* L, const void* dO, void* dQ, void* dK,
                       void* dV, void* stream)>;
/// Median milliseconds of one forward (or backward) on device-resident inputs, timed on
/// the device with events; used by GPU stages instead of host timing.
using BenchFn = std::function<double(const Problem&, Dtype, int repeats)>;
/// Extra rows for the driver's table, e.g. launch configuration or memory traffic.
using ReportFn = std::function<std::vector<std::pair<std::string, std::string>>(const Problem&, Dtype)>;

struct StageInfo {
  std::string name;  ///< folder name, e.g. "05_one_pass_fused"
  std::string idea;  ///< one line: what this stage adds
  bool is_gpu = false;
  std::vector<Dtype> dtypes{Dtype::F32};  ///< dtypes it computes in
  std::vector<int> head_dims;             ///< supported head dims; empty means any
  /// Stage 01 only: exp() overflows on large logits, so it is expected to fail there.
  bool overflows_on_large_logits = false;
  /// The most partial results (O, L) of key blocks a row's result is merged from by the
  /// log-sum-exp rule, for a problem under the calling thread's options (stage 12's rings:
  /// one per key chunk); empty for a stage that merges none. An fp32 check then also allows
  /// the error of a baseline that merges as many (RefMode::F32Merged): every merge rounds L.
  std::function<int(const Problem&)> merged_parts;

  ForwardFn forward;                  ///< always set
  BackwardFn backward;                ///< empty when the stage has no backward
  ForwardDeviceFn forward_device;     ///< GPU stages only
  BackwardDeviceFn backward_device;   ///< GPU stages with a backward only
  BenchFn bench_forward, bench_backward;  ///< GPU stages only

  /// The stage's options and counters (options.h), when it declares them in a table; the
  /// table's attach() then fills add_options, set_option and get_counter below. A stage
  /// without a table may still set those three by hand.
  const OptionTable* options = nullptr;
  /// Stage-specific command-line options (e.g. tile sizes); may be empty.
  std::function<void(CLI::App&)> add_options;
  /// Stage-specific rows printed after a run; may be empty.
  ReportFn report;
  /// Stage-specific settings and counters for the C ABI (fa_set_option / fa_get_counter);
  /// may be empty. Both throw std::invalid_argument for a name they do not know.
  std::function<void(const std::string& name, int64_t value)> set_option;
  std::function<int64_t(const std::string& name)> get_counter;

  bool has_backward() const { return bool(backward); }
  bool supports(Dtype t) const;
  bool supports_head_dim(int d) const;
};

}  // namespace fa
