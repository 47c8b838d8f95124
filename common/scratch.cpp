#include "scratch.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "cuda_utils.h"

namespace fa {

namespace {

cudaMemPool_t scratch_pool() {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;  // one per device
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = pools.find(device); it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool;
  FA_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep_everything = UINT64_MAX;
  FA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  pools[device] = pool;
  return pool;
}

// The host's allocator, when one is installed. Each installation is a new object that is never
// freed, so a Scratch alive across a change still releases through the allocator it came from.
std::atomic<const ScratchAllocator*> host_allocator{nullptr};

}  // namespace

void set_scratch_allocator(const ScratchAllocator& allocator) {
  const bool valid = allocator.allocate != nullptr && allocator.release != nullptr;
  host_allocator.store(valid ? new ScratchAllocator(allocator) : nullptr);
}

Scratch::Scratch(size_t bytes, cudaStream_t stream, const std::string& who, const char* what) : stream_(stream) {
  if (bytes == 0) return;
  if (const ScratchAllocator* host = host_allocator.load()) {
    ptr_ = host->allocate(bytes, static_cast<void*>(stream), host->context);
    if (ptr_ != nullptr) {
      from_ = host;
      return;
    }
    throw std::runtime_error(who + ": the host's allocator could not provide " + std::to_string(bytes >> 20) +
                             " MiB of scratch (" + what + ")");
  }
  const cudaError_t err = cudaMallocFromPoolAsync(&ptr_, bytes, scratch_pool(), stream);
  if (err == cudaSuccess) return;
  cudaGetLastError();
  ptr_ = nullptr;
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  std::ostringstream s;
  s << who << ": cannot allocate " << bytes / (1 << 20) << " MiB of scratch (" << what << ") on the GPU ("
    << free_bytes / (1 << 20) << " MiB free): " << cudaGetErrorString(err);
  throw std::runtime_error(s.str());
}

Scratch::~Scratch() {
  if (ptr_ == nullptr) return;
  if (from_ != nullptr)
    from_->release(ptr_, static_cast<void*>(stream_), from_->context);
  else
    cudaFreeAsync(ptr_, stream_);
}

}  // namespace fa
