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

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};
//! [scratch memory]

}  // namespace fa
