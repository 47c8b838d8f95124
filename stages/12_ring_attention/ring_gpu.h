/// \file ring_gpu.h
/// \brief Stage 12 on GPUs: the ring of ring_attention.h with each rank running the
/// tensor-core stages (08's forward, 09's backward) on its chunk pairs, fp16/bf16 in, fp32
/// merges and gradient sums. The shards move either between virtual ranks on one GPU (device
/// copies) or between GPUs with NCCL point-to-point sends on a stream of their own.
///
/// Plain C++ (no device syntax): the stage list, the tests and the C ABI include it.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <vector>

#include "ring_attention.h"

namespace fa::stage12 {

/// What carries the shards between GPU ranks.
///  - Device: P virtual ranks on the calling thread's GPU; an exchange is a device-to-device
///    copy on a stream of its own, overlapped with the ranks' kernels.
///  - Nccl: rank r on GPU r (P GPUs); an exchange is ncclSend/ncclRecv on a stream of its own.
enum class TransportKind { Device = 0, Nccl = 1 };
/// "device", "nccl".
const char* transport_name(TransportKind t);

/// The kernels each rank runs on its chunk pairs. A rank calls a stage's entry points like
/// any other caller, so the ring's arithmetic is the fastest the rank's GPU has.
///  - Auto: stages 10 and 11 when every GPU of the ring has compute capability 9.x (Hopper),
///    stages 08 and 09 otherwise.
///  - TensorCores: stages 08 and 09 (mma.sync; compute capability 8.0 and newer).
///  - Hopper: stages 10 and 11 (TMA, wgmma, warp specialization); refused on other GPUs.
enum class RankKernels { Auto = 0, TensorCores = 1, Hopper = 2 };
/// "auto", "tensor_core", "hopper" (the `kernels` option's values).
const char* kernels_name(RankKernels k);

/// How a GPU ring call is cut and carried, and what its ranks compute with.
struct GpuConfig {
  int ranks = 0;  ///< P; 0: the default (ranks_for)
  Split split = Split::Zigzag;
  TransportKind transport = TransportKind::Device;
  RankKernels kernels = RankKernels::Auto;
};

/// True when a ring over GPUs `devices` runs stages 10 and 11 for `k` (Auto: every one of
/// them has compute capability 9.x). Throws std::invalid_argument for Hopper when one has not,
/// naming it, and for a value that is not a RankKernels.
bool runs_hopper(RankKernels k, const std::vector<int>& devices);

/// Throws std::invalid_argument for a head dim the chosen kernel set has no kernel for: the
/// tensor-core set (hopper = false, stages 08 and 09) has 64 and 128 of gpu_head_dims().
void require_head_dim_of_kernels(bool hopper, int head_dim);

/// Head dims of the ring: those of the Hopper kernel set, stage 11's kHeadDims (64, 128, 256).
/// A ring on the tensor-core set (stages 08 and 09) takes 64 and 128 and refuses 256.
const std::vector<int>& gpu_head_dims();

/// True when this tree was configured with NCCL (the Nccl transport is built in).
bool nccl_built();

/// Ring attention forward on DEVICE buffers in `dtype` (BF16 or F16; L fp32) in the layouts of
/// docs/design.md §3 (the whole tensors, on the calling thread's GPU). Waits for `stream`,
/// scatters each rank's slices to its GPU, runs the ring (one host thread per rank), gathers
/// O and L, and returns when they are written. Throws std::invalid_argument for a problem,
/// dtype, head dim, pointer, config, or (Nccl) a ring larger than the GPUs present, before
/// anything is written. `work` (may be null) receives the score entries per rank and step.
void forward_gpu(const Problem& p, const GpuConfig& c, Dtype dtype, const void* Q, const void* K, const void* V,
                 void* O, float* L, cudaStream_t stream, Work* work = nullptr);
/// The backward on device buffers: O and L are the forward's; dQ, dK, dV are overwritten.
/// Each pair runs stage 09's or stage 11's deterministic mode, so a ring's result is bitwise
/// the same from run to run and on any transport.
void backward_gpu(const Problem& p, const GpuConfig& c, Dtype dtype, const void* Q, const void* K, const void* V,
                  const void* O, const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
                  Work* work = nullptr);

/// The ring of virtual ranks on the current GPU: device copies on one stream per rank.
std::unique_ptr<Ring> make_device_ring(int ranks);
/// The ring over GPUs `devices` (rank r on devices[r]) by NCCL (nccl_ring.cpp). Throws
/// std::invalid_argument when NCCL is not built in.
std::unique_ptr<Ring> make_nccl_ring(const std::vector<int>& devices);

/// The GPU of each of `ranks` ranks: the calling thread's for Device; GPU r for rank r with
/// Nccl. Throws std::invalid_argument when NCCL is not built in or there are fewer GPUs than ranks.
std::vector<int> ring_devices(TransportKind t, int ranks);
/// The ring `t` over `devices` (make_device_ring or make_nccl_ring).
std::unique_ptr<Ring> make_ring(TransportKind t, const std::vector<int>& devices);

/// The whole tensors of a call (device buffers on the calling thread's GPU, layouts of
/// docs/design.md §3): what a GpuRing reads and writes. Only the forward's or the
/// backward's fields are used.
struct WholeTensors {
  const void *Q = nullptr, *K = nullptr, *V = nullptr;  ///< forward and backward
  void* O = nullptr;                                     ///< forward: written; backward: read
  float* L = nullptr;                                    ///< forward: written; backward: read
  const void* dO = nullptr;                              ///< backward
  void *dQ = nullptr, *dK = nullptr, *dV = nullptr;      ///< backward: written
};

class GpuRank;  // one rank's device buffers and attention calls (ring_gpu.cu)

/// The P ranks of one GPU ring and its transports, kept apart from a call: forward_gpu and
/// backward_gpu make one per call, bench12 keeps one and runs its ring many times (as a
/// training system keeps each rank's slices on its GPU from step to step).
class GpuRing {
 public:
  enum class Pass { Forward, Backward };
  /// Checks the problem, dtype, head dim and config as forward_gpu does (std::invalid_argument,
  /// before anything is allocated), allocates every rank's buffers on its GPU, and makes the
  /// transports, unless `kv_ring` (and for the backward `dkv_ring`) are given: rings of
  /// make_ring for the same transport and ranks, which a caller may reuse across GpuRings.
  GpuRing(const Problem& p, const GpuConfig& c, Dtype t, Pass pass, std::shared_ptr<Ring> kv_ring = nullptr,
          std::shared_ptr<Ring> dkv_ring = nullptr);
  ~GpuRing();
  GpuRing(const GpuRing&) = delete;
  GpuRing& operator=(const GpuRing&) = delete;

  const Plan& plan() const { return plan_; }
  Pass pass() const { return pass_; }
  int ranks() const { return plan_.ranks; }
  int device(int rank) const { return devices_[size_t(rank)]; }
  bool hopper() const { return hopper_; }  ///< the ranks run stages 10 and 11 (else 08 and 09)
  cudaStream_t stream(int rank) const;
  Transport& kv_endpoint(int rank) { return kv_ring_->endpoint(rank); }
  Transport& dkv_endpoint(int rank) { return dkv_ring_->endpoint(rank); }

  /// Runs body(rank) for every rank on a thread of its own with the rank's GPU current;
  /// if one fails, the transports are aborted (and `abort` called, for what else the ranks
  /// may wait on) and the first failure is rethrown (run_on_ranks).
  void run(const std::function<void(int rank)>& body, const std::function<void()>& abort = {});

  // On rank `rank`'s thread, inside run():
  /// Copies the rank's slices of the whole inputs to its GPU (Q, K, V; backward also O, L, dO)
  /// and starts its accumulators (O = 0 and L = −∞, or dQ = 0). Queued on stream(rank).
  void load(int rank, const WholeTensors& x);
  /// Queues the rank's forward or backward ring on stream(rank) (ring_forward, ring_backward)
  /// through its own endpoints, or through `kv` and `dkv` when given (bench12 wraps them).
  void ring(int rank, Work* work, Transport* kv = nullptr, Transport* dkv = nullptr);
  /// Copies the rank's results into the whole outputs (O, L; or dQ, dK, dV) and waits for them.
  void store(int rank, const WholeTensors& x);

 private:
  Plan plan_;
  Dtype dtype_;
  Pass pass_;
  int whole_device_ = 0;  // the GPU of the whole tensors: the constructing thread's
  std::vector<int> devices_;
  bool hopper_;  // runs_hopper(config's kernels, devices_)
  std::vector<std::unique_ptr<GpuRank>> ranks_;
  std::shared_ptr<Ring> kv_ring_, dkv_ring_;
  std::vector<int> sums_;  // [rank] the dkv buffer that ring_backward left the shard's sums in
};

/// The GPU ring for the driver, the tests and the C ABI (kGpuStageName). Options
/// --ranks, --split, --transport, --kernels (set_option "ranks", "split", "transport",
/// "kernels"); the counters of the CPU ring's info().
StageInfo gpu_info();

}  // namespace fa::stage12
