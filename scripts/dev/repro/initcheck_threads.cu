// A ring of host threads on one GPU with none of the project's code: the pattern of stage 12's
// virtual ranks, reduced to what a memory checker sees. Each of P threads owns a non-blocking
// stream and buffers from cudaMalloc; per round it fills its accumulator with a kernel, then
// for P steps merges a partner buffer into it with a kernel (one warp per row, as merge_rows),
// hands its buffer to the next thread by a device copy on a second stream (events order the
// copy after the writer and after the reader, as DeviceTransport), and uses scratch from a
// shared stream-ordered pool (allocate, write, read, free, as stage 09). At the end of each
// round it checks the first column of every row of its sum. (A sanity check only: the values
// are the same every round, so stale memory would pass it.)
//
// Every byte a kernel reads here was written before it: on the same stream, or on the copy
// stream that the host waited for (cudaStreamSynchronize) before launching the reader. So an
// "uninitialized read" from compute-sanitizer's initcheck on this program is the tool's:
//   nvcc -O2 -std=c++17 -arch=sm_90 scripts/dev/repro/initcheck_threads.cu -o /tmp/ict
//   compute-sanitizer --tool initcheck --error-exitcode 86 /tmp/ict [threads] [rounds]
#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int kRows = 2048, kD = 64;
constexpr int kElems = kRows * kD;

__global__ void fill(float* x, float v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = v;
}
// acc[row, :] += part[row, :] + scratch[row]: one warp per row, each lane a strided column.
__global__ void merge(float* acc, const float* part, const float* scratch, int rows) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float s = scratch[row];
  for (int x = lane; x < kD; x += 32) acc[row * kD + x] += part[row * kD + x] + s;
}
__global__ void sum_rows(const float* x, float* out, int rows) {  // out[row] = x[row, 0]
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < rows) out[row] = x[row * kD];
}

struct Rank {
  cudaStream_t stream, comm;
  cudaEvent_t ready;
  float *acc, *buf[2];
};

// A reusable barrier for the threads (std::barrier needs C++20).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const long gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  long gen_ = 0;
};

int main(int argc, char** argv) {
  const int P = argc > 1 ? std::atoi(argv[1]) : 8, rounds = argc > 2 ? std::atoi(argv[2]) : 20;
  if (P < 1 || P > 64 || rounds < 1) {
    std::fprintf(stderr, "usage: %s [threads 1..64] [rounds >= 1]; got %d threads, %d rounds\n", argv[0], P, rounds);
    return 2;
  }
  cudaMemPool_t pool;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

  std::vector<Rank> ranks(static_cast<size_t>(P));
  Barrier barrier(P);
  std::atomic<int> bad{0};
  const auto body = [&](int r) {
    CHECK(cudaSetDevice(0));
    Rank& me = ranks[size_t(r)];
    CHECK(cudaStreamCreateWithFlags(&me.stream, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&me.comm, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&me.ready, cudaEventDisableTiming));
    std::vector<float> host(kRows);
    for (int round = 0; round < rounds; ++round) {
      CHECK(cudaMalloc(&me.acc, kElems * sizeof(float)));
      for (float*& b : me.buf) CHECK(cudaMalloc(&b, kElems * sizeof(float)));
      fill<<<64, 256, 0, me.stream>>>(me.acc, 0.0f, kElems);
      fill<<<64, 256, 0, me.stream>>>(me.buf[0], 1.0f, kElems);
      CHECK(cudaGetLastError());
      barrier.wait();
      for (int step = 0; step < P; ++step) {
        const int in_hand = step % 2;
        // hand buf[in_hand] to the next rank: our copy reads the previous rank's buffer
        CHECK(cudaEventRecord(me.ready, me.stream));
        barrier.wait();
        const Rank& prev = ranks[size_t((r + P - 1) % P)];
        CHECK(cudaStreamWaitEvent(me.comm, me.ready, 0));
        CHECK(cudaStreamWaitEvent(me.comm, prev.ready, 0));
        CHECK(cudaMemcpyAsync(me.buf[1 - in_hand], prev.buf[in_hand], kElems * sizeof(float),
                              cudaMemcpyDeviceToDevice, me.comm));
        // meanwhile: scratch from the shared pool, written then read, and the merge
        float* scratch = nullptr;
        CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&scratch), kRows * sizeof(float), pool, me.stream));
        fill<<<8, 256, 0, me.stream>>>(scratch, 0.0f, kRows);
        merge<<<kRows * 32 / 256, 256, 0, me.stream>>>(me.acc, me.buf[in_hand], scratch, kRows);
        CHECK(cudaGetLastError());
        CHECK(cudaFreeAsync(scratch, me.stream));
        CHECK(cudaStreamSynchronize(me.comm));
        barrier.wait();  // every copy out of our buffer is done
      }
      float* out = nullptr;
      CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&out), kRows * sizeof(float), pool, me.stream));
      sum_rows<<<kRows / 256, 256, 0, me.stream>>>(me.acc, out, kRows);
      CHECK(cudaGetLastError());
      CHECK(cudaMemcpyAsync(host.data(), out, kRows * sizeof(float), cudaMemcpyDeviceToHost, me.stream));
      CHECK(cudaFreeAsync(out, me.stream));
      CHECK(cudaStreamSynchronize(me.stream));
      for (float v : host)
        if (v != float(P)) ++bad;  // every step adds a buffer of ones
      barrier.wait();  // nobody frees a buffer a neighbour may still read
      CHECK(cudaFree(me.acc));
      for (float* b : me.buf) CHECK(cudaFree(b));
    }
    CHECK(cudaStreamDestroy(me.stream));
    CHECK(cudaStreamDestroy(me.comm));
    CHECK(cudaEventDestroy(me.ready));
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < P; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  std::printf("initcheck_threads: %d threads, %d rounds, %d wrong values\n", P, rounds, bad.load());
  return bad.load() == 0 ? 0 : 1;
}
