// Stage 12: the transport between GPUs, by NCCL. One process drives all P GPUs (one host
// thread per rank, ncclCommInitAll); each rank's exchange is a grouped ncclSend to rank r+1
// and ncclRecv from rank r−1 on a stream of its own, which first waits for the rank's
// kernels to have written `send` and finished reading `recv` (an event), so the transfer
// overlaps the kernels queued after it. Built only when CMake finds NCCL (FA_HAVE_NCCL).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mutex>
#include <string>
#include <vector>

#include "cuda_utils.h"
#include "ring_gpu.h"

namespace fa::stage12 {

namespace {

void nccl_check(ncclResult_t result, const char* call) {
  if (result != ncclSuccess)
    throw std::runtime_error(std::string(kGpuStageName) + ": " + call + " failed: " + ncclGetErrorString(result));
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, int rank, int ranks, int device) : comm_(comm), rank_(rank), ranks_(ranks) {
    FA_CUDA_CHECK(cudaSetDevice(device));
    FA_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    FA_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }
  ~NcclTransport() override {
    cudaEventDestroy(ready_);
    cudaStreamDestroy(comm_stream_);
  }
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, void* stream) override {
    FA_CUDA_CHECK(cudaEventRecord(ready_, static_cast<cudaStream_t>(stream)));
    FA_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
    // One group: NCCL posts both halves before waiting for either, so the ring cannot deadlock.
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    if (send_bytes > 0)
      nccl_check(ncclSend(send, send_bytes, ncclUint8, (rank_ + 1) % ranks_, comm_, comm_stream_), "ncclSend");
    if (recv_bytes > 0)
      nccl_check(ncclRecv(recv, recv_bytes, ncclUint8, (rank_ + ranks_ - 1) % ranks_, comm_, comm_stream_),
                 "ncclRecv");
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  }

  void finish() override { FA_CUDA_CHECK(cudaStreamSynchronize(comm_stream_)); }

 private:
  ncclComm_t comm_;
  int rank_, ranks_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

class NcclRing final : public Ring {
 public:
  explicit NcclRing(const std::vector<int>& devices) : comms_(devices.size()) {
    nccl_check(ncclCommInitAll(comms_.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
    for (size_t r = 0; r < devices.size(); ++r)
      endpoints_.push_back(std::make_unique<NcclTransport>(comms_[r], int(r), int(devices.size()), devices[r]));
  }
  ~NcclRing() override {
    endpoints_.clear();
    if (!aborted_)
      for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  Transport& endpoint(int rank) override { return *endpoints_[size_t(rank)]; }
  // A rank failed: its neighbours may wait for data that never comes. Aborting every
  // communicator ends their NCCL operations with an error instead.
  void abort() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    for (ncclComm_t c : comms_) ncclCommAbort(c);
  }

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
  std::mutex mutex_;
  bool aborted_ = false;
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Ring> make_nccl_ring(const std::vector<int>& devices) { return std::make_unique<NcclRing>(devices); }

}  // namespace fa::stage12
