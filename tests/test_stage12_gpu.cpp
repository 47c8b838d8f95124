// Stage 12's GPU ring with virtual ranks on one GPU (stages 10 and 11 on every rank of a Hopper
// GPU, 08 and 09 elsewhere; shards passed by device copies on a stream of their own) against the
// shared matrix (docs/design.md §6) in bf16 and f16, forward and backward, plus: every ring size
// 1, 2, 3, 4, 8 and both splits on odd and unequal lengths, GQA, causal and not, with each kernel
// set the GPU has; d = 256 on the Hopper set (refused on 08/09); P = 1 equal to the rank's stages
// bitwise; runs bitwise reproducible; the work counted as on the CPU; refusals before anything is
// written.
// Needs a GPU (exits 77 without one). FA_TEST_SMALL=1 (compute-sanitizer) shrinks the shapes.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "check.h"
#include "cuda_utils.h"
#include "hopper_bwd.h"
#include "hopper_fwd.h"
#include "ring_gpu.h"
#include "stage_checks.h"
#include "stage_list.h"
#include "tensor_core_bwd.h"
#include "tensor_core_fwd.h"

namespace {

using fa::Dtype;
using fa::Problem;
using fa::test::bitwise_equal;
namespace s12 = fa::stage12;

constexpr auto make = &fa::test::make_problem;

const fa::StageInfo& registered() { return fa::find_stage("12_ring_attention_gpu"); }

// The current GPU is a Hopper (compute capability 9.x): both kernel sets run on it.
bool on_hopper() {
  int device = 0, major = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major == 9;
}

// The stage as this GPU runs it by default: d = 256 only where auto picks the Hopper kernels,
// so the shared checks (which take their head dims from the stage) leave it out elsewhere.
const fa::StageInfo& stage() {
  static const fa::StageInfo on_this_gpu = [] {
    fa::StageInfo s = registered();
    if (!on_hopper()) s.head_dims = {64, 128};
    return s;
  }();
  return on_this_gpu;
}

struct RingOptions {
  RingOptions(int ranks, s12::Split split, s12::RankKernels kernels = s12::RankKernels::Auto) {
    registered().set_option("ranks", ranks);
    registered().set_option("split", int64_t(split));
    registered().set_option("kernels", int64_t(kernels));
  }
  ~RingOptions() {
    registered().set_option("ranks", 0);
    registered().set_option("split", 0);
    registered().set_option("kernels", 0);
  }
};

// The kernel sets this GPU runs: 08/09 everywhere, 10/11 on Hopper.
std::vector<s12::RankKernels> kernel_sets() {
  if (on_hopper()) return {s12::RankKernels::Hopper, s12::RankKernels::TensorCores};
  return {s12::RankKernels::TensorCores};
}

// Device copies of a problem's inputs and room for every output, in `dtype` (L fp32).
struct DeviceTensors {
  Problem p;
  Dtype t;
  fa::DeviceBuffer Q, K, V, dO, O, L, dQ, dK, dV;
  DeviceTensors(const Problem& problem, Dtype dtype, const fa::Tensors& x)
      : p(problem), t(dtype), Q(bytes(p.q_elems()), "Q"), K(bytes(p.kv_elems()), "K"), V(bytes(p.kv_elems()), "V"),
        dO(bytes(p.q_elems()), "dO"), O(bytes(p.q_elems()), "O"), L(size_t(p.l_elems()) * 4, "L"),
        dQ(bytes(p.q_elems()), "dQ"), dK(bytes(p.kv_elems()), "dK"), dV(bytes(p.kv_elems()), "dV") {
    fa::upload(t, x.Q.data(), Q.get(), p.q_elems(), nullptr);
    fa::upload(t, x.K.data(), K.get(), p.kv_elems(), nullptr);
    fa::upload(t, x.V.data(), V.get(), p.kv_elems(), nullptr);
    fa::upload(t, x.dO.data(), dO.get(), p.q_elems(), nullptr);
    for (const fa::DeviceBuffer* b : {&O, &L, &dQ, &dK, &dV})  // read back even when refused
      if (b->bytes() > 0) FA_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
    FA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  size_t bytes(int64_t n) const { return size_t(n) * fa::dtype_size(t); }
  // The outputs' raw bits, to compare runs bit for bit.
  std::vector<std::vector<char>> outputs() const {
    std::vector<std::vector<char>> all;
    for (const fa::DeviceBuffer* b : {&O, &L, &dQ, &dK, &dV}) {
      std::vector<char> host(b->bytes());
      FA_CUDA_CHECK(cudaMemcpy(host.data(), b->get(), b->bytes(), cudaMemcpyDeviceToHost));
      all.push_back(host);
    }
    return all;
  }
  void ring(const s12::GpuConfig& c, s12::Work* work = nullptr) {
    s12::forward_gpu(p, c, t, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), nullptr, work);
    s12::backward_gpu(p, c, t, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), dO.get(), dQ.get(), dK.get(),
                      dV.get(), nullptr);
  }
};

}  // namespace

// ---- the shared checks, default ring (4 virtual ranks, fewer for short sequences, zigzag)

TEST_CASE("stage 12 gpu: shape matrix, bf16 and f16, forward and backward") {
  fa::test::check_matrix(stage(), Dtype::BF16, true);
  if (!fa::test::small_mode()) fa::test::check_matrix(stage(), Dtype::F16, true);  // sanitizers: bf16 only
}
TEST_CASE("stage 12 gpu: adversarial inputs") {
  fa::test::check_adversarial(stage(), Dtype::BF16, true);
  if (!fa::test::small_mode()) fa::test::check_adversarial(stage(), Dtype::F16, true);
}
TEST_CASE("stage 12 gpu: properties (key permutation, bitwise determinism)") {
  fa::test::check_properties(stage(), Dtype::BF16, true);
}
TEST_CASE("stage 12 gpu: refusals") { fa::test::check_refusals(stage(), Dtype::BF16); }
TEST_CASE("stage 12 gpu: random shapes") { fa::test::check_random_shapes(stage(), Dtype::BF16, true, 4); }

// ---- every ring size and split

TEST_CASE("stage 12 gpu: virtual ranks P = 1, 2, 3, 4, 8, both splits, against the reference") {
  const bool small = fa::test::small_mode();
  uint64_t seed = 1250;
  for (s12::RankKernels kernels : kernel_sets())
  for (int P : {1, 2, 3, 4, 8})
    for (s12::Split split : {s12::Split::Zigzag, s12::Split::Plain})
      for (bool causal : {false, true}) {
        if (small && P != 3 && P != 8) continue;
        const RingOptions ring(P, split, kernels);
        std::vector<Problem> shapes = {make(1, 8, 2, small ? 41 : 97, small ? 41 : 97, 64, causal),  // odd, GQA
                                       make(1, 2, 1, small ? 50 : 300, 77, 128, causal),             // N_q > N_k
                                       make(1, 2, 2, 77, small ? 50 : 300, 64, causal)};             // N_q < N_k
        if (!small) shapes.push_back(make(2, 2, 2, 255, 255, 128, causal));
        for (const Problem& p : shapes)
          for (Dtype t : {Dtype::BF16, Dtype::F16}) {
            if (small && t == Dtype::F16) continue;
            INFO("P = " << P << ", " << s12::split_name(split) << " split, " << fa::dtype_name(t) << ", kernels "
                         << s12::kernels_name(kernels));
            fa::test::expect_pass(stage(), p, t, seed++, fa::Dist::Normal, true);
          }
      }
}

TEST_CASE("stage 12 gpu: one rank is the rank's stages (deterministic dQ), bitwise") {
  for (s12::RankKernels kernels : kernel_sets())
    for (bool causal : {false, true}) {
      const bool hopper = kernels == s12::RankKernels::Hopper;
      INFO("kernels " << s12::kernels_name(kernels) << (causal ? ", causal" : ""));
      const Problem p = make(1, 4, 2, 130, 97, 64, causal);
      const fa::Tensors x = fa::Tensors::make(p, 1251, fa::Dist::Normal, true);
      DeviceTensors ring(p, Dtype::BF16, x), direct(p, Dtype::BF16, x);
      ring.ring(s12::GpuConfig{1, s12::Split::Plain, s12::TransportKind::Device, kernels});
      if (hopper) {
        fa::stage11::Options o;
        o.deterministic = true;
        fa::stage10::forward(p, Dtype::BF16, direct.Q.get(), direct.K.get(), direct.V.get(), direct.O.get(),
                             direct.L.as<float>(), nullptr, fa::stage10::Options{});
        fa::stage11::backward(p, Dtype::BF16, direct.Q.get(), direct.K.get(), direct.V.get(), direct.O.get(),
                              direct.L.as<float>(), direct.dO.get(), direct.dQ.get(), direct.dK.get(),
                              direct.dV.get(), nullptr, o);
      } else {
        fa::stage09::Options o;
        o.deterministic = true;
        fa::stage08::forward(p, Dtype::BF16, direct.Q.get(), direct.K.get(), direct.V.get(), direct.O.get(),
                             direct.L.as<float>(), nullptr, fa::stage08::Options{});
        fa::stage09::backward(p, Dtype::BF16, direct.Q.get(), direct.K.get(), direct.V.get(), direct.O.get(),
                              direct.L.as<float>(), direct.dO.get(), direct.dQ.get(), direct.dK.get(),
                              direct.dV.get(), nullptr, o);
      }
      FA_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(ring.outputs() == direct.outputs());
    }
}

TEST_CASE("stage 12 gpu: auto picks the Hopper stages on a Hopper GPU, and both sets cover the ring's head dims") {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  CHECK(s12::runs_hopper(s12::RankKernels::Auto, {device}) == on_hopper());
  CHECK_FALSE(s12::runs_hopper(s12::RankKernels::TensorCores, {device}));
  CHECK(s12::gpu_head_dims() == fa::stage11::kHeadDims);  // the Hopper set's head dims
  for (int d : s12::gpu_head_dims())
    CHECK(std::count(fa::stage10::kHeadDims.begin(), fa::stage10::kHeadDims.end(), d) == 1);
  for (int d : fa::stage09::kHeadDims)  // the tensor-core set's are among them
    CHECK(std::count(s12::gpu_head_dims().begin(), s12::gpu_head_dims().end(), d) == 1);
}

TEST_CASE("stage 12 gpu: d = 256 on the Hopper kernels (both splits, causal and not, P = 3), refused on 08/09") {
  if (on_hopper()) {
    uint64_t seed = 1270;
    for (s12::Split split : {s12::Split::Zigzag, s12::Split::Plain})
      for (bool causal : {false, true}) {
        const RingOptions ring(3, split, s12::RankKernels::Hopper);
        INFO(s12::split_name(split) << " split");
        fa::test::expect_pass(stage(), make(1, 4, 2, 97, fa::test::small_mode() ? 97 : 200, 256, causal), Dtype::BF16,
                              seed++, fa::Dist::Normal, true);
      }
  }
  const Problem p = make(1, 2, 1, 64, 64, 256, false);
  const fa::Tensors x = fa::Tensors::make(p, 1271, fa::Dist::Normal, true);
  DeviceTensors d(p, Dtype::BF16, x);
  const std::vector<std::vector<char>> before = d.outputs();
  std::string what;
  try {
    d.ring(s12::GpuConfig{2, s12::Split::Plain, s12::TransportKind::Device, s12::RankKernels::TensorCores});
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  INFO("message: " << what);
  CHECK(what.find("head_dim = 256 needs the Hopper kernels") != std::string::npos);
  CHECK(d.outputs() == before);
}

TEST_CASE("stage 12 gpu: a ring is bitwise reproducible, and counts the CPU ring's work") {
  for (s12::Split split : {s12::Split::Zigzag, s12::Split::Plain}) {
    const Problem p = make(2, 4, 2, 257, 257, 64, true);
    const fa::Tensors x = fa::Tensors::make(p, 1252, fa::Dist::Normal, true);
    DeviceTensors a(p, Dtype::BF16, x), b(p, Dtype::BF16, x);
    const s12::GpuConfig c{8, split, s12::TransportKind::Device};
    s12::Work counted;
    a.ring(c, &counted);
    b.ring(c);
    CHECK(a.outputs() == b.outputs());
    CHECK(counted.at == s12::predicted_work(s12::make_plan(p, 8, split, "test")).at);
  }
}

TEST_CASE("stage 12 gpu: refusals come before anything is written") {
  const Problem p = make(1, 2, 1, 10, 10, 64, true);
  const fa::Tensors x = fa::Tensors::make(p, 1253, fa::Dist::Normal, true);
  DeviceTensors d(p, Dtype::BF16, x);
  FA_CUDA_CHECK(cudaMemset(d.O.get(), 0x7f, d.O.bytes()));
  const std::vector<std::vector<char>> before = d.outputs();
  const auto refused = [&](const Problem& q, const s12::GpuConfig& c, Dtype t, const void* K, const std::string& message) {
    std::string what;
    try {
      s12::forward_gpu(q, c, t, d.Q.get(), K, d.V.get(), d.O.get(), d.L.as<float>(), nullptr);
    } catch (const std::invalid_argument& e) {
      what = e.what();
    }
    INFO("message: " << what);
    CHECK(what.find(message) != std::string::npos);
    CHECK(d.outputs() == before);
  };
  const s12::GpuConfig ok{2, s12::Split::Plain, s12::TransportKind::Device};
  refused(p, {8, s12::Split::Zigzag, s12::TransportKind::Device}, Dtype::BF16, d.K.get(),
          "ranks = 8 with the zigzag split cuts seq_q = 10 into 16 chunks");
  refused(p, {65, s12::Split::Zigzag, s12::TransportKind::Device}, Dtype::BF16, d.K.get(), "ranks = 65 is not allowed");
  refused(p, ok, Dtype::F32, d.K.get(), "f32");
  Problem d80 = p;
  d80.head_dim = 80;
  refused(d80, ok, Dtype::BF16, d.K.get(), "head_dim = 80 is not supported");
  refused(p, ok, Dtype::BF16, static_cast<const char*>(d.K.get()) + 2, "pointer K");
  refused(p, ok, Dtype::BF16, nullptr, "K");
  refused(p, {2, s12::Split::Plain, s12::TransportKind::Device, s12::RankKernels(7)}, Dtype::BF16, d.K.get(),
          "kernels = 7 is not auto (0), tensor_core (1) or hopper (2)");
  if (!on_hopper())
    refused(p, {2, s12::Split::Plain, s12::TransportKind::Device, s12::RankKernels::Hopper}, Dtype::BF16, d.K.get(),
            "kernels = hopper needs GPUs of compute capability 9.x");
  int gpus = 0;
  FA_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  if (!s12::nccl_built())
    refused(p, {2, s12::Split::Plain, s12::TransportKind::Nccl}, Dtype::BF16, d.K.get(), "nccl is not built in");
  else if (gpus < 5)
    refused(p, {5, s12::Split::Plain, s12::TransportKind::Nccl}, Dtype::BF16, d.K.get(),
            "transport nccl with ranks = 5 needs 5 GPUs (one per rank); this machine has " + std::to_string(gpus));
}
