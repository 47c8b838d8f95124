// Stage 12: the transport between virtual ranks on one GPU, and the choice of a ring's GPUs,
// transport and rank kernels. A rank's exchange is one device-to-device copy of its previous rank's buffer, on a
// stream of its own (`comm`), so it runs while the rank's kernels run on the rank's stream: the
// same overlap as between GPUs, with the GPU's copy engines standing in for the links.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_utils.h"
#include "ring_gpu.h"
#include "tensor_core_bwd.h"

namespace fa::stage12 {

namespace {

// Rank r's end: post (send buffer, an event that completes when it is written), wait for all
// posts, copy the previous rank's buffer once both its event and our own have completed (ours:
// our kernels have finished reading `recv`). finish(): wait for the copy, then for every rank,
// so no rank overwrites a buffer its next neighbour is still copying.
class DeviceTransport final : public Transport {
 public:
  DeviceTransport(Rendezvous& ring, int rank) : ring_(ring), rank_(rank) {
    FA_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    FA_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }
  ~DeviceTransport() override {
    cudaStreamSynchronize(comm_);  // a copy still queued (the ring stopped early) ends first
    cudaEventDestroy(ready_);
    cudaStreamDestroy(comm_);
  }
  DeviceTransport(const DeviceTransport&) = delete;
  DeviceTransport& operator=(const DeviceTransport&) = delete;

  void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, void* stream) override {
    FA_CUDA_CHECK(cudaEventRecord(ready_, static_cast<cudaStream_t>(stream)));
    ring_.post(rank_) = {send, send_bytes, ready_};
    ring_.arrive_and_wait();  // every rank has posted
    const Rendezvous::Post& from = ring_.post_of_previous(rank_);
    if (from.bytes != recv_bytes)
      throw std::logic_error(std::string(kGpuStageName) + ": rank " + std::to_string(rank_) + " expects " +
                             std::to_string(recv_bytes) + " bytes, its previous rank sends " + std::to_string(from.bytes));
    FA_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));                               // recv is free
    FA_CUDA_CHECK(cudaStreamWaitEvent(comm_, static_cast<cudaEvent_t>(from.ready), 0));  // send is written
    if (recv_bytes > 0) FA_CUDA_CHECK(cudaMemcpyAsync(recv, from.send, recv_bytes, cudaMemcpyDeviceToDevice, comm_));
  }

  void finish() override {
    FA_CUDA_CHECK(cudaStreamSynchronize(comm_));
    ring_.arrive_and_wait();  // every copy out of our `send` is done
  }

 private:
  Rendezvous& ring_;
  int rank_;
  cudaStream_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

class DeviceRing final : public Ring {
 public:
  explicit DeviceRing(int ranks) : rendezvous_(ranks) {
    for (int r = 0; r < ranks; ++r) endpoints_.push_back(std::make_unique<DeviceTransport>(rendezvous_, r));
  }
  Transport& endpoint(int rank) override { return *endpoints_[size_t(rank)]; }
  void abort() override { rendezvous_.abort(); }

 private:
  Rendezvous rendezvous_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
};

}  // namespace

std::unique_ptr<Ring> make_device_ring(int ranks) { return std::make_unique<DeviceRing>(ranks); }

std::vector<int> ring_devices(TransportKind t, int ranks) {
  int current = 0;
  FA_CUDA_CHECK(cudaGetDevice(&current));
  if (t == TransportKind::Device) return std::vector<int>(size_t(ranks), current);
  if (!nccl_built())
    throw std::invalid_argument(std::string(kGpuStageName) + ": transport nccl is not built in (NCCL was not found when this "
                                "tree was configured); use transport device");
  int count = 0;
  FA_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < ranks)
    throw std::invalid_argument(std::string(kGpuStageName) + ": transport nccl with ranks = " + std::to_string(ranks) +
                                " needs " + std::to_string(ranks) + " GPUs (one per rank); this machine has " +
                                std::to_string(count));
  std::vector<int> devices(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) devices[size_t(r)] = r;
  return devices;
}

std::unique_ptr<Ring> make_ring(TransportKind t, const std::vector<int>& devices) {
  return t == TransportKind::Device ? make_device_ring(int(devices.size())) : make_nccl_ring(devices);
}

#ifndef FA_HAVE_NCCL
bool nccl_built() { return false; }
std::unique_ptr<Ring> make_nccl_ring(const std::vector<int>&) {
  throw std::invalid_argument(std::string(kGpuStageName) + ": transport nccl is not built in (NCCL was not found when this "
                              "tree was configured)");
}
#endif

const char* transport_name(TransportKind t) { return t == TransportKind::Device ? "device" : "nccl"; }

const char* kernels_name(RankKernels k) {
  return k == RankKernels::Auto ? "auto" : k == RankKernels::TensorCores ? "tensor_core" : "hopper";
}

void require_head_dim_of_kernels(bool hopper, int head_dim) {
  const auto& dims = stage09::kHeadDims;
  if (!hopper && std::find(dims.begin(), dims.end(), head_dim) == dims.end())
    throw std::invalid_argument(std::string(kGpuStageName) + ": head_dim = " + std::to_string(head_dim) +
                                " needs the Hopper kernels (stages 10 and 11); the tensor-core kernels " +
                                "(stages 08 and 09) have head_dim = 64 and 128");
}

bool runs_hopper(RankKernels k, const std::vector<int>& devices) {
  if (k != RankKernels::Auto && k != RankKernels::TensorCores && k != RankKernels::Hopper)
    throw std::invalid_argument(std::string(kGpuStageName) + ": kernels = " + std::to_string(int(k)) +
                                " is not auto (0), tensor_core (1) or hopper (2)");
  if (k == RankKernels::TensorCores) return false;
  for (int device : devices) {
    int major = 0, minor = 0;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major == 9) continue;
    if (k == RankKernels::Auto) return false;
    throw std::invalid_argument(std::string(kGpuStageName) + ": kernels = hopper needs GPUs of compute capability " +
                                "9.x (stages 10 and 11); GPU " + std::to_string(device) + " is " +
                                std::to_string(major) + "." + std::to_string(minor));
  }
  return true;
}

}  // namespace fa::stage12
