// The one launch of the GPU stages' step kernels (step_kernel.h).
#include "step_kernel.h"

#include <mutex>
#include <set>
#include <tuple>

#include "cuda_utils.h"

namespace fa {

namespace {

// A kernel attribute lives in the device's context, so it is set once per device: a
// launch on another device of the same process sets it there too. The key holds the size
// and carveout as well, so a row asking for more shared memory than an earlier one of the
// same kernel is set again. (cudaDeviceReset would drop the attributes; nothing here resets.)
using Prepared = std::tuple<const void*, int, size_t, int>;  // kernel, device, bytes, carveout

std::mutex& prepared_mutex() {
  static std::mutex m;
  return m;
}

std::set<Prepared>& prepared() {
  static std::set<Prepared> s;
  return s;
}

}  // namespace

void prepare_kernel(const StepKernel& k) {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  const Prepared key{k.fn, device, k.smem_bytes, k.carveout};
  {
    std::lock_guard<std::mutex> lock(prepared_mutex());
    if (prepared().count(key) != 0) return;
  }
  // Not under the lock: two threads may both set the same values, which is harmless; the
  // key goes in only once the attributes hold, so no thread launches before they do.
  FA_CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(k.smem_bytes)));
  if (k.carveout >= 0)
    FA_CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributePreferredSharedMemoryCarveout, k.carveout));
  std::lock_guard<std::mutex> lock(prepared_mutex());
  prepared().insert(key);
}

void launch_kernel(const void* fn, dim3 grid, dim3 threads, size_t smem_bytes, void** args, cudaStream_t stream,
                   StreamOrder order) {
  if (order == StreamOrder::Serial) {
    FA_CUDA_CHECK(cudaLaunchKernel(fn, grid, threads, args, smem_bytes, stream));
    return;
  }
  // The same launch, described as a configuration so that it can carry an attribute: "this
  // kernel resolves its dependency on the previous one itself" (griddepcontrol.wait).
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = threads;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  FA_CUDA_CHECK(cudaLaunchKernelExC(&config, fn, args));
}

void launch(const StepKernel& k, dim3 grid, void** args, cudaStream_t stream, StreamOrder order) {
  prepare_kernel(k);
  launch_kernel(k.fn, grid, dim3(unsigned(k.threads)), k.smem_bytes, args, stream, order);
}

}  // namespace fa
