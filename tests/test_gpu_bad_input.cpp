// Bad input through the C ABI's device entry points (fa_forward_device, fa_backward_device)
// on every GPU stage in libfa_c.so: the stages are found with fa_stage_is_gpu, so a later GPU
// stage is covered without a change here. Each bad call must return FA_ERR_INVALID (1) with a
// message that names the value and the stage, leave every output buffer on the device
// untouched, and leave the process and its CUDA context alive: a valid call afterwards still
// succeeds. Without a GPU (or a GPU stage) the program exits 77, CTest's skip code.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fa_c.h"

namespace {

// Outputs are filled with this byte before each call; a refusal must leave it everywhere.
constexpr unsigned char kSentinel = 0x5a;

// One device allocation of `bytes`, filled with the sentinel byte.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    REQUIRE(cudaMalloc(&ptr, bytes) == cudaSuccess);
    reset();
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reset() { REQUIRE(cudaMemset(ptr, kSentinel, bytes) == cudaSuccess); }
  bool untouched() const {
    std::vector<unsigned char> host(bytes);
    REQUIRE(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (unsigned char c : host)
      if (c != kSentinel) return false;
    return true;
  }
  template <typename T = void>
  T* at(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr) + byte_offset);
  }
};

std::vector<std::string> gpu_stages() {
  std::vector<std::string> names;
  for (int i = 0; i < fa_stage_count(); ++i)
    if (fa_stage_is_gpu(fa_stage_name(i)) == 1) names.push_back(fa_stage_name(i));
  return names;
}

size_t dtype_bytes(int dtype) { return dtype == FA_F32 ? 4 : 2; }

// One bad call: a problem (or pointer) change and the text its message must contain.
struct Bad {
  const char* what;
  fa_problem p;
  int32_t dtype;
  const char* says;
  int null_tensor = -1;     // index of a tensor argument passed as NULL
  bool misaligned = false;  // Q one element past its (aligned) allocation
};

// The valid problem every bad one is derived from: small, d = 64 (every GPU stage runs it).
constexpr fa_problem kGood{1, 2, 2, 64, 64, 64, 0, 0.0f};

std::vector<Bad> bad_calls(int32_t dtype) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Bad> b;
  auto with = [&](const char* what, const char* says, auto change) {
    fa_problem p = kGood;
    change(p);
    b.push_back({what, p, dtype, says});
  };
  with("scale NaN", "scale = nan", [&](fa_problem& p) { p.scale = nan; });
  with("scale -1", "scale = -1", [](fa_problem& p) { p.scale = -1.0f; });
  with("scale inf", "scale = inf",
       [](fa_problem& p) { p.scale = std::numeric_limits<float>::infinity(); });
  with("head_dim 0", "head_dim = 0", [](fa_problem& p) { p.head_dim = 0; });
  with("head_dim 300", "head_dim = 300", [](fa_problem& p) { p.head_dim = 300; });
  with("heads 3 over kv_heads 2", "heads = 3", [](fa_problem& p) { p.heads = 3; });
  with("seq_q -1", "seq_q = -1", [](fa_problem& p) { p.seq_q = -1; });
  with("batch 0", "batch = 0", [](fa_problem& p) { p.batch = 0; });
  with("causal 2", "causal = 2", [](fa_problem& p) { p.causal = 2; });
  with("element count wraps", "would hold", [](fa_problem& p) {
    p.batch = 494770;
    p.heads = p.kv_heads = 769546;
    p.seq_q = 48448661;
  });
  for (int32_t t : {-1, 7}) b.push_back({"dtype out of range", kGood, t, "dtype = "});
  const char* names[] = {"Q", "K", "V", "O", "L"};
  for (int i = 0; i < 5; ++i) b.push_back({"NULL tensor", kGood, dtype, names[i], i});
  Bad m{"Q misaligned by one element", kGood, dtype, "aligned"};
  m.misaligned = true;
  b.push_back(m);
  return b;
}

// Calls the device entry point with `dtype` passed as a plain int, as a C caller or ctypes
// does (a value outside fa_dtype is never formed as an enum in this program).
using ForwardDeviceInt = int (*)(const char*, const fa_problem*, int32_t, const void*, const void*,
                                 const void*, void*, float*, void*);
using BackwardDeviceInt = int (*)(const char*, const fa_problem*, int32_t, const void*, const void*,
                                  const void*, const void*, const float*, const void*, void*, void*,
                                  void*, void*);

}  // namespace

TEST_CASE("GPU stages refuse bad input through the device entry points, touching nothing") {
  const std::vector<std::string> stages = gpu_stages();
  REQUIRE(!stages.empty());
  const auto fwd = reinterpret_cast<ForwardDeviceInt>(&fa_forward_device);
  const auto bwd = reinterpret_cast<BackwardDeviceInt>(&fa_backward_device);
  for (const std::string& stage : stages) {
    const bool has_backward = fa_stage_has_backward(stage.c_str()) == 1;
    // Buffers for kGood in fp32 (the widest type), with room for a misaligned Q.
    const size_t n = size_t(kGood.batch) * kGood.heads * kGood.seq_q * kGood.head_dim;
    const size_t rows = size_t(kGood.batch) * kGood.heads * kGood.seq_q;
    DeviceBuffer Q(4 * n + 16), K(4 * n), V(4 * n), O(4 * n), L(4 * rows), dO(4 * n), dQ(4 * n),
        dK(4 * n), dV(4 * n);
    int supported = 0;
    for (int32_t dtype : {FA_F32, FA_F16, FA_BF16}) {
      // Is this dtype supported? A valid call says so (and must then succeed).
      int rc =
          fwd(stage.c_str(), &kGood, dtype, Q.at(), K.at(), V.at(), O.at(), L.at<float>(), nullptr);
      if (rc != FA_OK) {
        INFO(stage << " dtype " << dtype << ": " << fa_last_error());
        CHECK(rc == FA_ERR_INVALID);
        CHECK(std::string(fa_last_error()).find("dtype") != std::string::npos);
        continue;
      }
      ++supported;
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      for (const Bad& b : bad_calls(dtype)) {
        for (bool backward : {false, true}) {
          if (backward && !has_backward) continue;
          for (DeviceBuffer* out : {&O, &L, &dQ, &dK, &dV}) out->reset();
          const void* q = b.misaligned ? Q.at(dtype_bytes(dtype)) : Q.at();
          const void* tensors[5] = {q, K.at(), V.at(), O.at(), L.at()};
          if (b.null_tensor >= 0) tensors[b.null_tensor] = nullptr;
          if (!backward) {
            rc = fwd(stage.c_str(), &b.p, b.dtype, tensors[0], tensors[1], tensors[2],
                     const_cast<void*>(tensors[3]),
                     static_cast<float*>(const_cast<void*>(tensors[4])), nullptr);
          } else {
            rc = bwd(stage.c_str(), &b.p, b.dtype, tensors[0], tensors[1], tensors[2], tensors[3],
                     static_cast<const float*>(tensors[4]), dO.at(), dQ.at(), dK.at(), dV.at(),
                     nullptr);
          }
          const std::string msg = fa_last_error();
          INFO(stage << (backward ? " backward" : " forward") << ", dtype " << dtype << ", "
                     << b.what << ": code " << rc << ", message '" << msg << "'");
          CHECK(rc == FA_ERR_INVALID);
          CHECK(msg.find(b.says) != std::string::npos);
          CHECK(msg.find(stage) != std::string::npos);
          for (const DeviceBuffer* out : {&O, &L, &dQ, &dK, &dV}) CHECK(out->untouched());
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // no launch happened, nothing failed
        }
      }
      // Still alive: a valid call succeeds after all the refusals.
      rc =
          fwd(stage.c_str(), &kGood, dtype, Q.at(), K.at(), V.at(), O.at(), L.at<float>(), nullptr);
      CHECK(rc == FA_OK);
      CHECK(cudaDeviceSynchronize() == cudaSuccess);
    }
    INFO(stage << " accepts none of f32, f16, bf16 at " << kGood.head_dim);
    CHECK(supported > 0);
  }
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("GPU bad-input tests skipped: no GPU on this machine\n");
    return 77;
  }
  if (gpu_stages().empty()) {
    std::printf("GPU bad-input tests skipped: no GPU stage in libfa_c.so\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
