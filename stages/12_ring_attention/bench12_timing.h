/// \file bench12_timing.h
/// \brief bench12's clock on the ring: two transports put in front of the real one (no
/// overlap; no exchange at all), and the timing of a GpuRing's ring with all ranks started
/// together. Benchmark apparatus, not part of the ring.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "cuda_utils.h"
#include "ring_gpu.h"

namespace fa::stage12::bench {

namespace s12 = fa::stage12;
using Clock = std::chrono::steady_clock;

// ---- the two transports that change the ring's schedule, in front of the real one

// `serial`: the exchange is waited for as soon as it is started, before the step's kernels.
// The ring moves the same bytes at the same points and gives the same bits.
class SerialTransport final : public s12::Transport {
 public:
  explicit SerialTransport(s12::Transport& real) : real_(real) {}
  void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, void* stream) override {
    real_.start(send, send_bytes, recv, recv_bytes, stream);
    real_.finish();
  }
  void finish() override {}

 private:
  s12::Transport& real_;
};

// `compute`: nothing moves. The ranks do not wait for each other, so a rank's time is its own
// arithmetic (the result is wrong: the K/V buffers keep what they held).
class NoTransport final : public s12::Transport {
 public:
  void start(const void*, size_t, void*, size_t, void*) override {}
  void finish() override {}
};

enum class Mode { Overlap, Serial, Compute };

// Rank `rank`'s transports in mode `mode`: nullptr (the ring's own) for overlap.
class Schedule {
 public:
  Schedule(s12::GpuRing& ring, int rank, Mode mode) : mode_(mode), kv_(ring.kv_endpoint(rank)) {
    if (ring.pass() == s12::GpuRing::Pass::Backward) dkv_ = std::make_unique<SerialTransport>(ring.dkv_endpoint(rank));
  }
  s12::Transport* kv() { return pick(&kv_); }
  s12::Transport* dkv() { return pick(dkv_.get()); }

 private:
  s12::Transport* pick(SerialTransport* serial) {
    if (mode_ == Mode::Overlap) return nullptr;
    return mode_ == Mode::Serial ? static_cast<s12::Transport*>(serial) : &none_;
  }
  Mode mode_;
  SerialTransport kv_;
  std::unique_ptr<SerialTransport> dkv_;
  NoTransport none_;
};

// A barrier for the ranks' threads that a failing rank can open (so no thread waits forever).
using Barrier = s12::Rendezvous;

struct Timing {
  double ring_ms = 0;            // median over repetitions of (last rank's end − first rank's start)
  std::vector<double> rank_ms;   // [rank] median GPU time of the rank's ring (events on its stream)
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Runs `ring` `warmup + reps` times in mode `mode`; each time every rank loads its slices, all
// ranks wait at a barrier, and the ring alone is timed.
inline Timing time_ring(s12::GpuRing& ring, const s12::WholeTensors& x, Mode mode, int warmup, int reps) {
  const int P = ring.ranks();
  const std::vector<std::vector<double>> zeros(size_t(reps), std::vector<double>(size_t(P), 0.0));
  std::vector<std::vector<double>> begin = zeros, end = zeros, gpu = zeros;  // [rep][rank]
  Barrier barrier(P);
  const auto t_origin = Clock::now();
  ring.run(
      [&](int rank) {
        Schedule schedule(ring, rank, mode);
        const cudaStream_t stream = ring.stream(rank);
        cudaEvent_t e0, e1;
        FA_CUDA_CHECK(cudaEventCreate(&e0));
        FA_CUDA_CHECK(cudaEventCreate(&e1));
        for (int rep = 0; rep < warmup + reps; ++rep) {
          ring.load(rank, x);
          FA_CUDA_CHECK(cudaStreamSynchronize(stream));
          barrier.arrive_and_wait();  // every rank starts together
          const double t0 = std::chrono::duration<double, std::milli>(Clock::now() - t_origin).count();
          FA_CUDA_CHECK(cudaEventRecord(e0, stream));
          ring.ring(rank, nullptr, schedule.kv(), schedule.dkv());
          FA_CUDA_CHECK(cudaEventRecord(e1, stream));
          FA_CUDA_CHECK(cudaStreamSynchronize(stream));
          const double t1 = std::chrono::duration<double, std::milli>(Clock::now() - t_origin).count();
          if (rep < warmup) continue;
          float ms = 0;
          FA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          begin[size_t(rep - warmup)][size_t(rank)] = t0;
          end[size_t(rep - warmup)][size_t(rank)] = t1;
          gpu[size_t(rep - warmup)][size_t(rank)] = ms;
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
      },
      [&] { barrier.abort(); });
  Timing t;
  std::vector<double> ring_ms;
  for (int rep = 0; rep < reps; ++rep)
    ring_ms.push_back(*std::max_element(end[size_t(rep)].begin(), end[size_t(rep)].end()) -
                      *std::min_element(begin[size_t(rep)].begin(), begin[size_t(rep)].end()));
  t.ring_ms = median(ring_ms);
  for (int r = 0; r < P; ++r) {
    std::vector<double> g;
    for (int rep = 0; rep < reps; ++rep) g.push_back(gpu[size_t(rep)][size_t(r)]);
    t.rank_ms.push_back(median(g));
  }
  return t;
}

// One untimed run of the ring on x (load, ring, store), in mode `mode`.
inline void run_once(s12::GpuRing& ring, const s12::WholeTensors& x, Mode mode) {
  ring.run([&](int rank) {
    Schedule schedule(ring, rank, mode);
    ring.load(rank, x);
    ring.ring(rank, nullptr, schedule.kv(), schedule.dkv());
    ring.store(rank, x);
  });
}

}  // namespace fa::stage12::bench
