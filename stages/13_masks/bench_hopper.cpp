// Stage 13 on Hopper, timed: one forward under a mask and score modifiers (with --backward: a
// forward and a backward), and the useful work (the visible (query, key) pairs) it did per
// second. Time: CUDA events around --calls calls in a row (10: the host prepares a call while
// the GPU runs the one before), per call, median of --repeats such runs. The benchmark script
// (scripts/bench/bench_masks.py) runs it beside flex_attention and SDPA.
//
//   bench13_hopper --seq 16384 --heads 16 --head-dim 128 --causal --window-left 1024
//   bench13_hopper --seq 16384 --seqlens 300,2000,... --causal          (documents)
//   bench13_hopper --seq 16384 --causal --window-left 1024 --backward
//   bench13_hopper --seq 16384 --causal --alibi                        (or --softcap 50, --sinks)
// Prints one line: "ms=<median> tflops=<4·d·visible pairs·heads / time>"; with --backward ms
// is forward + backward, tflops counts 3.5× the forward's work (the backward's five products
// against the forward's two), and bwd_ms is the backward alone.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_utils.h"
#include "document_mask.h"
#include "mask_reference.h"
#include "masked_hopper.h"

int main(int argc, char** argv) {
  CLI::App app{"stage 13's Hopper forward, timed"};
  fa::Problem p;
  p.seq_q = p.seq_k = 4096;
  p.heads = p.kv_heads = 16;
  p.head_dim = 128;
  int64_t window_left = -1, window_right = -1;
  std::vector<int64_t> seqlens;
  int repeats = 10, calls = 10;
  std::string dtype_name = "bf16";
  bool backward = false, alibi = false, sinks = false;
  double softcap = 0;
  app.add_option("--seq", p.seq_q, "tokens (queries = keys)");
  app.add_option("--heads", p.heads, "query heads (= kv heads)");
  app.add_option("--head-dim", p.head_dim, "d");
  app.add_flag("--causal", p.causal, "the causal mask");
  app.add_option("--window-left", window_left, "keys before the diagonal (-1: none)");
  app.add_option("--window-right", window_right, "keys after the diagonal (-1: none)");
  app.add_option("--seqlens", seqlens, "document lengths (sum <= seq)")->delimiter(',');
  app.add_option("--softcap", softcap, "logit soft-cap: s -> cap*tanh(s/cap) (> 0; default: off)");
  app.add_flag("--alibi", alibi, "ALiBi with the geometric slopes 2^(-8(h+1)/H)");
  app.add_flag("--sinks", sinks, "one sink logit per head (0: the time does not depend on its value)");
  app.add_option("--repeats", repeats, "timed runs")->check(CLI::PositiveNumber);
  app.add_option("--calls", calls, "calls in a row per timed run")->check(CLI::PositiveNumber);
  app.add_option("--dtype", dtype_name, "bf16 or f16");
  app.add_flag("--backward", backward, "time forward + backward (and the backward alone)");
  CLI11_PARSE(app, argc, argv);
  try {
    p.seq_k = p.seq_q;
    p.kv_heads = p.heads;
    fa::Modifiers m;
    if (window_left >= 0) m.window_left = window_left;
    if (window_right >= 0) m.window_right = window_right;
    if (!seqlens.empty()) m.cu_seqlens_q = m.cu_seqlens_k = fa::cu_seqlens_of(seqlens, "bench13_hopper");
    if (app.count("--softcap") && !(softcap > 0))  // 0 would mean off, which no one asks for by name
      throw std::invalid_argument("bench13_hopper: softcap = " + std::to_string(softcap) +
                                  " is not allowed (the cap must be > 0)");
    m.softcap = softcap;
    if (alibi) m.alibi_slopes = fa::alibi_slopes(p.heads);
    if (sinks) m.sinks.assign(size_t(p.heads), 0.0f);
    const fa::Dtype dtype = fa::parse_dtype(dtype_name);
    m.validate(p, "bench13_hopper");

    // Visible pairs, row by row, with the kernel's own mask (document indices).
    const std::vector<int64_t> cu = m.has_documents() ? m.cu_seqlens_q : std::vector<int64_t>{0, p.seq_q};
    int right = m.window_right ? int(*m.window_right) : fa::stage13::kNoBound;
    if (p.causal) right = std::min(right, 0);
    const int left = m.window_left ? int(*m.window_left) : fa::stage13::kNoBound;
    double pairs = 0;
    for (size_t d = 0; d + 1 < cu.size(); ++d) {
      const int n = int(cu[d + 1] - cu[d]);
      const fa::stage13::DocumentMask mask{n, n, left, right};
      for (int i = 0; i < n; ++i) pairs += mask.hi(i) - mask.lo(i);
    }

    const size_t elems = size_t(p.q_elems());
    fa::DeviceBuffer Q(elems * 2, "Q"), K(elems * 2, "K"), V(elems * 2, "V"), O(elems * 2, "O");
    fa::DeviceBuffer L(size_t(p.l_elems()) * 4, "L");
    fa::fill_random(dtype, Q.get(), int64_t(elems), 1, nullptr);
    fa::fill_random(dtype, K.get(), int64_t(elems), 2, nullptr);
    fa::fill_random(dtype, V.get(), int64_t(elems), 3, nullptr);
    fa::DeviceBuffer dO(backward ? elems * 2 : 16, "dO"), dQ(backward ? elems * 2 : 16, "dQ");
    fa::DeviceBuffer dK(backward ? elems * 2 : 16, "dK"), dV(backward ? elems * 2 : 16, "dV");
    if (backward) fa::fill_random(dtype, dO.get(), int64_t(elems), 4, nullptr);
    fa::DeviceBuffer dsinks(size_t(p.heads) * 4, "dsinks");  // [heads] fp32, written with sinks
    const auto forward = [&] {
      fa::stage13::forward_hopper(p, m, dtype, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), nullptr);
    };
    const auto backward_only = [&] {
      fa::stage13::backward_hopper(p, m, dtype, Q.get(), K.get(), V.get(), O.get(), L.as<float>(), dO.get(), dQ.get(),
                                   dK.get(), dV.get(), dsinks.as<float>(), nullptr);
    };
    cudaEvent_t a, b;
    FA_CUDA_CHECK(cudaEventCreate(&a));
    FA_CUDA_CHECK(cudaEventCreate(&b));
    const auto median_ms = [&](const auto& run) {
      for (int i = 0; i < 3; ++i) run();
      std::vector<float> ms;
      for (int i = 0; i < repeats; ++i) {
        FA_CUDA_CHECK(cudaEventRecord(a));
        for (int c = 0; c < calls; ++c) run();
        FA_CUDA_CHECK(cudaEventRecord(b));
        FA_CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        FA_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t / float(calls));
      }
      std::sort(ms.begin(), ms.end());
      return double(ms[ms.size() / 2]);
    };
    double median = 0, bwd_ms = 0, work = 4.0 * p.head_dim * pairs * p.heads;
    if (backward) {
      forward();  // O and L for the backward alone
      bwd_ms = median_ms(backward_only);
      median = median_ms([&] { forward(), backward_only(); });
      work *= 3.5;
    } else {
      median = median_ms(forward);
    }
    const fa::stage13::HopperTileCounts tiles = fa::stage13::count_hopper_tiles(p, m);
    std::printf("ms=%.4f tflops=%.1f tiles_skip=%lld tiles_full=%lld tiles_partial=%lld", median,
                work / (median * 1e-3) / 1e12, (long long)tiles.skip, (long long)tiles.full, (long long)tiles.partial);
    if (backward) std::printf(" bwd_ms=%.4f", bwd_ms);
    std::printf("\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
