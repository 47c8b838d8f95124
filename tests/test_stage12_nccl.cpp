// Stage 12's ring over several GPUs by NCCL (rank r on GPU r): the same result, bit for bit, as
// the ring of virtual ranks on one GPU (the same kernels on the same chunks, merged and summed in
// the same order: only the transport differs), and within tolerance of the reference. Ring sizes
// 2 and every GPU present (up to 8), both splits, causal and not, bf16 and f16.
// Exits 77 (skipped) without two GPUs or without NCCL in the build.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "check.h"
#include "cuda_utils.h"
#include "ring_gpu.h"
#include "stage_checks.h"
#include "stage_list.h"

namespace {

using fa::Dtype;
using fa::Problem;
namespace s12 = fa::stage12;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : (cudaGetLastError(), 0);
}

// One run of forward and backward on device 0's tensors; returns every output's bits.
std::vector<std::vector<char>> run(const Problem& p, Dtype t, const fa::Tensors& x, const s12::GpuConfig& c,
                                   fa::Tensors* host) {
  FA_CUDA_CHECK(cudaSetDevice(0));
  const size_t es = fa::dtype_size(t), q = size_t(p.q_elems()) * es, kv = size_t(p.kv_elems()) * es;
  fa::DeviceBuffer Q(q, "Q"), K(kv, "K"), V(kv, "V"), dO(q, "dO"), O(q, "O"), L(size_t(p.l_elems()) * 4, "L"),
      dQ(q, "dQ"), dK(kv, "dK"), dV(kv, "dV");
  fa::upload(t, x.Q.data(), Q.get(), p.q_elems(), nullptr);
  fa::upload(t, x.K.data(), K.get(), p.kv_elems(), nullptr);
  fa::upload(t, x.V.data(), V.get(), p.kv_elems(), nullptr);
  fa::upload(t, x.dO.data(), dO.get(), p.q_elems(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  s12::forward_gpu(p, c, t, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), nullptr);
  s12::backward_gpu(p, c, t, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), dO.get(), dQ.get(), dK.get(),
                    dV.get(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<char>> bits;
  for (const fa::DeviceBuffer* b : {&O, &L, &dQ, &dK, &dV}) {
    std::vector<char> h(b->bytes());
    FA_CUDA_CHECK(cudaMemcpy(h.data(), b->get(), b->bytes(), cudaMemcpyDeviceToHost));
    bits.push_back(h);
  }
  if (host) {
    fa::download(t, O.get(), host->O.data(), p.q_elems(), nullptr);
    fa::download(Dtype::F32, L.get(), host->L.data(), p.l_elems(), nullptr);
    fa::download(t, dQ.get(), host->dQ.data(), p.q_elems(), nullptr);
    fa::download(t, dK.get(), host->dK.data(), p.kv_elems(), nullptr);
    fa::download(t, dV.get(), host->dV.data(), p.kv_elems(), nullptr);
  }
  return bits;
}

}  // namespace

TEST_CASE("stage 12 nccl: a ring over GPUs gives the virtual ring's bits and the reference's values") {
  const int gpus = std::min(gpu_count(), 8);
  uint64_t seed = 1280;
  std::vector<int> sizes{2};
  if (gpus > 2) sizes.push_back(gpus);
  for (int P : sizes) {
    for (s12::Split split : {s12::Split::Zigzag, s12::Split::Plain})
      for (bool causal : {false, true})
        for (Dtype t : {Dtype::BF16, Dtype::F16}) {
          const Problem p = fa::test::make_problem(1, 8, 2, 16 * P + 5, 16 * P + 5, t == Dtype::BF16 ? 64 : 128, causal);
          fa::Tensors x = fa::Tensors::make(p, seed++, fa::Dist::Normal, true);
          INFO("P = " << P << ", " << s12::split_name(split) << ", " << fa::dtype_name(t) << ", " << p.describe());
          const auto nccl = run(p, t, x, {P, split, s12::TransportKind::Nccl}, &x);
          const auto virtual_ranks = run(p, t, x, {P, split, s12::TransportKind::Device}, nullptr);
          CHECK(nccl == virtual_ranks);
          fa::CheckReport r = fa::compare_forward(p, t, x);
          for (auto& c : fa::compare_backward(p, t, x).items) r.items.push_back(c);
          INFO(r.summary());
          CHECK(r.pass());
        }
  }
}

int main(int argc, char** argv) {
  if (!fa::gpu_available() || gpu_count() < 2 || !s12::nccl_built()) {
    std::printf("NCCL ring tests skipped: %s\n", !s12::nccl_built() ? "NCCL is not built in" : "fewer than 2 GPUs");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
