#include "cuda_utils.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "errors.h"
#include "tensors.h"

namespace fa {

void cuda_check(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::ostringstream s;
  s << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") in "
    << expr << " at " << file << ":" << line;
  throw std::runtime_error(s.str());
}

size_t dtype_size(Dtype t) { return t == Dtype::F32 ? 4 : 2; }

DeviceBuffer::DeviceBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    std::ostringstream s;
    s << what << ": cannot allocate " << bytes / (1 << 20) << " MiB on the GPU ("
      << free_b / (1 << 20) << " MiB free): " << cudaGetErrorString(err);
    ptr_ = nullptr;
    throw OutOfMemory(s.str());
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = o.bytes_;
  }
  return *this;
}

void require_device_pointer(const std::string& stage, const char* name, const void* ptr,
                            size_t alignment, const std::string& why) {
  if (ptr == nullptr) throw std::invalid_argument(stage + ": pointer " + name + " is NULL");
  if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0) {
    std::ostringstream s;
    s << stage << ": pointer " << name << " = " << ptr << " is not " << alignment
      << "-byte aligned (" << why << ")";
    throw std::invalid_argument(s.str());
  }
}

void require_head_dim(const std::string& stage, int head_dim, const std::vector<int>& head_dims) {
  if (std::find(head_dims.begin(), head_dims.end(), head_dim) != head_dims.end()) return;
  std::string list;
  for (int d : head_dims) list += (list.empty() ? "" : ", ") + std::to_string(d);
  throw std::invalid_argument(stage + ": head_dim = " + std::to_string(head_dim) + " is not supported (supported: " +
                              list + ")");
}

void require_tensor_core_request(const std::string& stage, const Problem& p, Dtype dtype,
                                 const std::vector<int>& head_dims) {
  p.validate(stage);
  if (dtype != Dtype::BF16 && dtype != Dtype::F16)
    throw std::invalid_argument(stage + ": dtype " + dtype_name(dtype) +
                                " is not supported (tensor cores take bf16 or f16)");
  require_head_dim(stage, p.head_dim, head_dims);
}

void require_grid_rows(const std::string& stage, const Problem& p) {
  if (p.heads > 65535 || p.batch > 65535)
    throw std::invalid_argument(stage + ": " +
                                (p.heads > 65535 ? "heads = " + std::to_string(p.heads)
                                                 : "batch = " + std::to_string(p.batch)) +
                                " exceeds the grid's limit of 65535 (one grid row per head, one layer per batch)");
}

void attach_forward_and_backward(StageInfo& s, const std::string& stage, const std::vector<int>& head_dims,
                                 ForwardDeviceFn forward, BackwardDeviceFn backward) {
  s.is_gpu = true;
  s.dtypes = {Dtype::BF16, Dtype::F16};
  s.head_dims = head_dims;
  const auto check = [stage, head_dims](const Problem& p) {
    p.validate(stage);
    require_head_dim(stage, p.head_dim, head_dims);
  };
  s.forward_device = [check, f = std::move(forward)](const Problem& p, Dtype t, const void* Q, const void* K,
                                                     const void* V, void* O, float* L, void* stream) {
    check(p);
    f(p, t, Q, K, V, O, L, stream);
  };
  s.forward = [check, f = host_forward_via_device(s.forward_device)](const Problem& p, Dtype t, const float* Q,
                                                                     const float* K, const float* V, float* O,
                                                                     float* L) {
    check(p);
    f(p, t, Q, K, V, O, L);
  };
  s.backward_device = std::move(backward);
  s.backward = [check, f = host_backward_via_device(s.backward_device)](
                   const Problem& p, Dtype t, const float* Q, const float* K, const float* V, const float* O,
                   const float* L, const float* dO, float* dQ, float* dK, float* dV) {
    check(p);
    f(p, t, Q, K, V, O, L, dO, dQ, dK, dV);
  };
  s.bench_forward = bench_forward_on_device(s.forward_device);
  // The whole backward is timed: the preprocess, the main kernel, the dQ pass or conversion.
  s.bench_backward = bench_backward_on_device(s.forward_device, s.backward_device);
}

void require_hopper(const std::string& stage) {
  require_gpu(stage);
  int device = 0, major = 0, minor = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9)
    throw std::runtime_error(stage + ": needs a Hopper GPU (compute capability 9.x: wgmma, TMA, setmaxnreg); device " +
                             std::to_string(device) + " has compute capability " + std::to_string(major) + "." +
                             std::to_string(minor));
}

int sm_count() {
  int device = 0, sms = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) cudaGetLastError();  // clear the "no device" error, so later calls do not see it
  return ok;
}

void require_gpu(const std::string& who) {
  if (!have_gpu()) {
    throw NoCudaDevice((who.empty() ? "" : who + ": ") + "no CUDA device is available on this machine");
  }
}

namespace {

template <typename T>
__device__ T from_float(float x);
template <>
__device__ float from_float<float>(float x) { return x; }
template <>
__device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__global__ void convert_in(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<T>(src[i]);
}

template <typename T>
__global__ void convert_out(const T* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = float(src[i]);
}

// A counter-based generator (splitmix64), so every element is independent of launch shape;
// the sum of four uniforms, centred and scaled, is close enough to N(0,1) for timing.
template <typename T>
__global__ void random_fill(T* __restrict__ dst, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float s = 0;
    for (int k = 0; k < 4; ++k) s += float((z >> (16 * k)) & 0xFFFF) / 65535.0f;
    dst[i] = from_float<T>((s - 2.0f) * 1.7320508f);
  }
}

dim3 grid_for(int64_t n) { return dim3(unsigned(std::min<int64_t>((n + 255) / 256, 65535 * 4))); }

template <typename Fn>
void dispatch(Dtype t, Fn&& fn) {
  switch (t) {
    case Dtype::F32: fn(float{}); break;
    case Dtype::F16: fn(__half{}); break;
    case Dtype::BF16: fn(__nv_bfloat16{}); break;
  }
}

}  // namespace

void upload(Dtype t, const float* host, void* dev, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (t == Dtype::F32) {
    FA_CUDA_CHECK(cudaMemcpyAsync(dev, host, size_t(n) * 4, cudaMemcpyHostToDevice, stream));
    return;
  }
  DeviceBuffer staging(size_t(n) * 4, "upload staging");
  FA_CUDA_CHECK(cudaMemcpyAsync(staging.get(), host, size_t(n) * 4, cudaMemcpyHostToDevice, stream));
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    convert_in<T><<<grid_for(n), 256, 0, stream>>>(staging.as<float>(), static_cast<T*>(dev), n);
  });
  FA_CHECK_LAUNCH("convert_in");
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void download(Dtype t, const void* dev, float* host, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (t == Dtype::F32) {
    FA_CUDA_CHECK(cudaMemcpyAsync(host, dev, size_t(n) * 4, cudaMemcpyDeviceToHost, stream));
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  DeviceBuffer staging(size_t(n) * 4, "download staging");
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    convert_out<T><<<grid_for(n), 256, 0, stream>>>(static_cast<const T*>(dev), staging.as<float>(), n);
  });
  FA_CHECK_LAUNCH("convert_out");
  FA_CUDA_CHECK(cudaMemcpyAsync(host, staging.get(), size_t(n) * 4, cudaMemcpyDeviceToHost, stream));
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void fill_random(Dtype t, void* dev, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    random_fill<T><<<grid_for(n), 256, 0, stream>>>(static_cast<T*>(dev), n, seed);
  });
  FA_CHECK_LAUNCH("random_fill");
}

ForwardFn host_forward_via_device(ForwardDeviceFn fwd) {
  return [fwd](const Problem& p, Dtype t, const float* Q, const float* K, const float* V,
               float* O, float* L) {
    p.validate("GPU stage");  // refuse a bad problem before sizes become allocations
    require_gpu("");  // the caller (driver, C ABI) names the stage
    const size_t es = dtype_size(t);
    DeviceBuffer dQ(p.q_elems() * es, "Q"), dK(p.kv_elems() * es, "K"), dV(p.kv_elems() * es, "V");
    DeviceBuffer dO(p.q_elems() * es, "O"), dL(p.l_elems() * 4, "L");
    upload(t, Q, dQ.get(), p.q_elems(), nullptr);
    upload(t, K, dK.get(), p.kv_elems(), nullptr);
    upload(t, V, dV.get(), p.kv_elems(), nullptr);
    fwd(p, t, dQ.get(), dK.get(), dV.get(), dO.get(), dL.as<float>(), nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    download(t, dO.get(), O, p.q_elems(), nullptr);
    download(Dtype::F32, dL.get(), L, p.l_elems(), nullptr);
  };
}

BackwardFn host_backward_via_device(BackwardDeviceFn bwd) {
  return [bwd](const Problem& p, Dtype t, const float* Q, const float* K, const float* V,
               const float* O, const float* L, const float* dO, float* dQ, float* dK, float* dV) {
    p.validate("GPU stage");  // refuse a bad problem before sizes become allocations
    require_gpu("");  // the caller (driver, C ABI) names the stage
    const size_t es = dtype_size(t);
    const int64_t nq = p.q_elems(), nkv = p.kv_elems();
    DeviceBuffer bQ(nq * es, "Q"), bK(nkv * es, "K"), bV(nkv * es, "V"), bO(nq * es, "O"),
        bL(p.l_elems() * 4, "L"), bdO(nq * es, "dO"), bdQ(nq * es, "dQ"), bdK(nkv * es, "dK"),
        bdV(nkv * es, "dV");
    upload(t, Q, bQ.get(), nq, nullptr);
    upload(t, K, bK.get(), nkv, nullptr);
    upload(t, V, bV.get(), nkv, nullptr);
    upload(t, O, bO.get(), nq, nullptr);
    upload(Dtype::F32, L, bL.get(), p.l_elems(), nullptr);
    upload(t, dO, bdO.get(), nq, nullptr);
    bwd(p, t, bQ.get(), bK.get(), bV.get(), bO.get(), bL.as<float>(), bdO.get(), bdQ.get(),
        bdK.get(), bdV.get(), nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    download(t, bdQ.get(), dQ, nq, nullptr);
    download(t, bdK.get(), dK, nkv, nullptr);
    download(t, bdV.get(), dV, nkv, nullptr);
  };
}

namespace {

// Several independent input sets, together larger than the L2 cache (60 MB on an H200),
// so that timing rotates through them and never measures cached inputs.
struct InputSets {
  std::vector<DeviceBuffer> Q, K, V, O, L, dO, dQ, dK, dV;
  int count = 0;
  InputSets(const Problem& p, Dtype t, bool backward) {
    const size_t es = dtype_size(t);
    const size_t one = (2 * p.q_elems() + 2 * p.kv_elems()) * es;
    const size_t l2 = 64u << 20;
    count = int(std::clamp<size_t>((3 * l2) / std::max<size_t>(one, 1) + 1, 1, 8));
    for (int i = 0; i < count; ++i) {
      Q.emplace_back(p.q_elems() * es, "Q");
      K.emplace_back(p.kv_elems() * es, "K");
      V.emplace_back(p.kv_elems() * es, "V");
      O.emplace_back(p.q_elems() * es, "O");
      L.emplace_back(p.l_elems() * 4, "L");
      fill_random(t, Q.back().get(), p.q_elems(), 11 + 4 * i, nullptr);
      fill_random(t, K.back().get(), p.kv_elems(), 12 + 4 * i, nullptr);
      fill_random(t, V.back().get(), p.kv_elems(), 13 + 4 * i, nullptr);
      if (backward) {
        dO.emplace_back(p.q_elems() * es, "dO");
        dQ.emplace_back(p.q_elems() * es, "dQ");
        dK.emplace_back(p.kv_elems() * es, "dK");
        dV.emplace_back(p.kv_elems() * es, "dV");
        fill_random(t, dO.back().get(), p.q_elems(), 14 + 4 * i, nullptr);
      }
    }
    FA_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

template <typename Launch>
double median_event_ms(int count, int repeats, Launch&& launch) {
  for (int i = 0; i < std::max(3, count); ++i) launch(i % count);  // warm-up
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  FA_CUDA_CHECK(cudaEventCreate(&start));
  FA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    FA_CUDA_CHECK(cudaEventRecord(start));
    launch(r % count);
    FA_CUDA_CHECK(cudaEventRecord(stop));
    FA_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    FA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

BenchFn bench_forward_on_device(ForwardDeviceFn fwd) {
  return [fwd](const Problem& p, Dtype t, int repeats) {
    require_gpu("benchmark");
    InputSets s(p, t, false);
    return median_event_ms(s.count, repeats, [&](int i) {
      fwd(p, t, s.Q[i].get(), s.K[i].get(), s.V[i].get(), s.O[i].get(), s.L[i].as<float>(), nullptr);
    });
  };
}

BenchFn bench_backward_on_device(ForwardDeviceFn fwd, BackwardDeviceFn bwd) {
  return [fwd, bwd](const Problem& p, Dtype t, int repeats) {
    require_gpu("benchmark");
    InputSets s(p, t, true);
    for (int i = 0; i < s.count; ++i)
      fwd(p, t, s.Q[i].get(), s.K[i].get(), s.V[i].get(), s.O[i].get(), s.L[i].as<float>(), nullptr);
    return median_event_ms(s.count, repeats, [&](int i) {
      bwd(p, t, s.Q[i].get(), s.K[i].get(), s.V[i].get(), s.O[i].get(), s.L[i].as<float>(),
          s.dO[i].get(), s.dQ[i].get(), s.dK[i].get(), s.dV[i].get(), nullptr);
    });
  };
}

std::vector<std::pair<std::string, std::string>> describe_launch(const void* kernel, dim3 grid,
                                                                 dim3 block, size_t dynamic_smem) {
  cudaFuncAttributes attr{};
  FA_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  int device = 0, blocks_per_sm = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  FA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int threads = int(block.x * block.y * block.z);
  FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, dynamic_smem));
  const int warps_per_block = (threads + 31) / 32;
  const int max_warps = prop.maxThreadsPerMultiProcessor / 32;
  std::ostringstream g, b, sm, occ;
  g << grid.x << " x " << grid.y << " x " << grid.z << " blocks";
  b << block.x << " x " << block.y << " x " << block.z << " threads (" << warps_per_block << " warps)";
  sm << (attr.sharedSizeBytes + dynamic_smem) << " B per block (" << attr.sharedSizeBytes
     << " static + " << dynamic_smem << " dynamic; " << prop.sharedMemPerMultiprocessor
     << " B per SM)";
  occ << blocks_per_sm << " blocks/SM = " << blocks_per_sm * warps_per_block << " of " << max_warps
      << " warps (" << 100 * blocks_per_sm * warps_per_block / max_warps << "%)";
  return {{"grid", g.str()},
          {"block", b.str()},
          {"shared memory", sm.str()},
          {"registers", std::to_string(attr.numRegs) + " per thread (" +
                            std::to_string(attr.numRegs * threads) + " per block, " +
                            std::to_string(prop.regsPerMultiprocessor) + " per SM)"},
          {"local memory", std::to_string(attr.localSizeBytes) + " B per thread (spills)"},
          {"occupancy", occ.str()},
          {"device", prop.name}};
}

}  // namespace fa
