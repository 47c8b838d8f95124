/// \file scratch.h
/// \brief Stream-ordered scratch memory for the GPU stages (a backward's L2, D, dQ_accum).
///
/// Scratch comes from a memory pool per device, allocated and freed in stream order
/// (cudaMallocFromPoolAsync / cudaFreeAsync). The pool keeps its memory between calls
/// (release threshold: unlimited), so after the first call a stage neither calls cudaMalloc
/// nor synchronises the device, and a benchmark times kernels, not allocations. Stream
/// ordering also makes concurrent calls on different streams safe, which one cached buffer
/// shared by all calls would not be.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace fa {

/// Where scratch comes from instead of the pool: a host that manages GPU memory itself (the
/// PyTorch op hands in torch's caching allocator, so scratch is reused with the framework's
/// memory and is legal inside a CUDA graph capture) installs one for the whole process.
/// `allocate` returns nullptr when it cannot provide the bytes; both run in stream order.
struct ScratchAllocator {
  void* (*allocate)(size_t bytes, void* stream, void* context) = nullptr;  ///< stream: a cudaStream_t
  void (*release)(void* ptr, void* stream, void* context) = nullptr;
  void* context = nullptr;
};

/// Installs `allocator` for every later Scratch of the process; one whose functions are null
/// restores the default pool. Call it before any thread runs a GPU stage (scratch taken before
/// the change is still released by the allocator that gave it).
void set_scratch_allocator(const ScratchAllocator& allocator);

//! [scratch memory]
/// One call's scratch, freed (in stream order) when it goes out of scope. Throws
/// std::runtime_error naming `who` and `what` when the GPU cannot provide the bytes.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream, const std::string& who, const char* what);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* floats() const { return static_cast<float*>(ptr_); }
  void* data() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  const ScratchAllocator* from_ = nullptr;  ///< the host's allocator that gave ptr_, or null (the pool)
};
//! [scratch memory]

}  // namespace fa
