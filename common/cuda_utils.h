/// \file cuda_utils.h
/// \brief CUDA plumbing shared by the GPU stages (07–09): checked calls, device buffers,
/// dtype conversion, host-buffer adapters, event timing and launch reports.
///
/// Nothing here knows attention; a GPU stage provides its device entry point
/// (`ForwardDeviceFn`) and gets the host-buffer version, the benchmark and the C ABI's
/// device path from these adapters.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stage.h"

namespace fa {

/// Throws std::runtime_error naming the call, file and line when `err` is not cudaSuccess.
void cuda_check(cudaError_t err, const char* expr, const char* file, int line);
#define FA_CUDA_CHECK(expr) ::fa::cuda_check((expr), #expr, __FILE__, __LINE__)
/// After a launch: reports a bad launch configuration (cudaGetLastError) by kernel name.
#define FA_CHECK_LAUNCH(name) ::fa::cuda_check(cudaGetLastError(), name, __FILE__, __LINE__)

/// Bytes of one element of `t` on the device (4, 2, 2).
size_t dtype_size(Dtype t);

/// An owning device allocation of `bytes` bytes; an allocation that does not fit is
/// refused with the size it needed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const std::string& what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Copies `n` host floats to `dev`, converting to `t` on the device.
void upload(Dtype t, const float* host, void* dev, int64_t n, cudaStream_t stream);
/// Copies `n` elements of type `t` from `dev` to host floats.
void download(Dtype t, const void* dev, float* host, int64_t n, cudaStream_t stream);
/// Fills `n` elements of type `t` with reproducible pseudo-random N(0,1)-like values.
void fill_random(Dtype t, void* dev, int64_t n, uint64_t seed, cudaStream_t stream);

/// The host-buffer forward of a GPU stage, built from its device forward: upload Q, K, V
/// in `dtype`, run, download O and L. Throws when no GPU is present.
ForwardFn host_forward_via_device(ForwardDeviceFn fwd);
/// The host-buffer backward of a GPU stage, built from its device backward.
BackwardFn host_backward_via_device(BackwardDeviceFn bwd);

/// Median milliseconds of `fwd` over `repeats` launches after warm-up, timed with CUDA
/// events on random inputs. Several input sets are rotated so that together they are
/// larger than the L2 cache and no launch finds its inputs there.
BenchFn bench_forward_on_device(ForwardDeviceFn fwd);
/// Same for a backward (inputs O, L come from a forward run with `fwd`).
BenchFn bench_backward_on_device(ForwardDeviceFn fwd, BackwardDeviceFn bwd);

/// Fills in a GPU stage that adds a backward to an earlier stage's forward (09 on 08's, 11
/// on 10's): is_gpu, the bf16/f16 dtypes, `head_dims`; the forward (`forward`, restricted to
/// `head_dims`, so that every forward the stage accepts has a backward), the backward, their
/// host-buffer adapters and benchmarks. A bad problem or another head dim is refused by name
/// before the host adapters allocate anything. The caller sets name, idea, report, options.
void attach_forward_and_backward(StageInfo& s, const std::string& stage, const std::vector<int>& head_dims,
                                 ForwardDeviceFn forward, BackwardDeviceFn backward);

/// The launch facts a stage prints: grid, block, dynamic shared memory, registers per
/// thread (cudaFuncGetAttributes), and theoretical occupancy (the occupancy API), as
/// "key: value" rows for the driver's table.
std::vector<std::pair<std::string, std::string>> describe_launch(const void* kernel, dim3 grid,
                                                                 dim3 block, size_t dynamic_smem);

/// Refuses a NULL or misaligned device pointer with std::invalid_argument:
/// "<stage>: pointer <name> = 0x… is not <alignment>-byte aligned (<why>)".
void require_device_pointer(const std::string& stage, const char* name, const void* ptr,
                            size_t alignment, const std::string& why);

/// Refuses a head dim not in `head_dims` (a stage's kHeadDims) with std::invalid_argument:
/// "<stage>: head_dim = 80 is not supported (supported: 64, 128)".
void require_head_dim(const std::string& stage, int head_dim, const std::vector<int>& head_dims);

/// The refusals every tensor-core stage shares, before anything is launched or written: the
/// problem (Problem::validate), a dtype other than bf16/f16, a head dim not in `head_dims`
/// (require_head_dim).
void require_tensor_core_request(const std::string& stage, const Problem& p, Dtype dtype,
                                 const std::vector<int>& head_dims);
/// Refuses heads or batch above 65535, for a grid with one row per head and one layer per
/// batch (gridDim.y and gridDim.z).
void require_grid_rows(const std::string& stage, const Problem& p);

/// Refuses (std::runtime_error) a current device that is not compute capability 9.x: the
/// Hopper stages' wgmma, TMA and setmaxnreg exist in the sm_90a target only. Also
/// require_gpu first.
void require_hopper(const std::string& stage);

/// True when a CUDA device is present and usable (the failed query's error is cleared).
bool have_gpu();

/// The current device's number of SMs (a persistent grid's size, a wave of blocks).
int sm_count();

/// Throws NoCudaDevice("<who>: no CUDA device ...") when no GPU is usable (no prefix when
/// `who` is empty).
void require_gpu(const std::string& who);

}  // namespace fa
