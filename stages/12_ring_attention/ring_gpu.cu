// Stage 12, the GPU ring: each rank keeps its shards in device memory and runs a forward and
// a backward stage on its chunk pairs — stages 10 and 11 on Hopper, stages 08 and 09 elsewhere
// (GpuConfig::kernels); this file adds what a rank needs around them (the merge, fp32 sums,
// scatter and gather of slices) and the device-copy transport for virtual ranks. The ring
// loop is ring_attention.cpp's; NCCL is nccl_ring.cpp.
//
// Precision: a pair's O comes out of the forward stage in fp16/bf16 and is merged into an
// fp32 O; a pair's gradients come out of the backward stage in fp16/bf16 and are summed in
// fp32 (dK, dV travel the ring in fp32). The final O, dQ, dK, dV are rounded to the input
// type once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>

#include "cuda_utils.h"
#include "dispatch.cuh"
#include "hopper_bwd.h"
#include "hopper_fwd.h"
#include "merge.h"
#include "ring_gpu.h"
#include "tensor_core_bwd.h"
#include "tensor_core_fwd.h"

namespace fa::stage12 {

namespace {


__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

//! [gpu merge]
// (O_acc, L_acc) ← merge((O_acc, L_acc), (O_part, L_part)) for `rows` rows of d values: one
// warp per row. Every lane reads L_acc[row] before lane 0 overwrites it (__syncwarp).
template <class T>
__global__ void merge_rows(float* O_acc, float* L_acc, const T* O_part, const float* L_part, int64_t rows, int d) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const MergeWeights w = merge_weights(L_acc[row], L_part[row]);
  for (int x = lane; x < d; x += 32)  // O = e^{L_acc − L}·O_acc + e^{L_part − L}·O_part
    O_acc[row * d + x] = w.w_acc * O_acc[row * d + x] + w.w_part * to_float(O_part[row * d + x]);
  __syncwarp();
  if (lane == 0) L_acc[row] = w.L;  // L = log(e^{L_acc} + e^{L_part})
}
//! [gpu merge]

// acc[i] += part[i] in fp32 (part in fp16, bf16 or fp32).
template <class T>
__global__ void add_into(float* acc, const T* part, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] += to_float(part[i]);
}

// dst[i] = src[i] rounded to T (round to nearest even).
template <class T>
__global__ void round_to(const float* src, T* dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<T>(src[i]);
}

__global__ void fill(float* x, float value, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

// A grid for n elements: 256 threads a block, at most 4096 blocks (the loops stride over the rest).
dim3 grid_for(int64_t n) { return dim3(unsigned(std::clamp<int64_t>((n + 255) / 256, 1, 4096))); }

}  // namespace

// One rank of the GPU ring, on device `device`: its shards (ring_plan.h) in device memory.
class GpuRank final : public Rank {
 public:
  // `device`: this rank's GPU; `whole_device`: the GPU of the caller's whole tensors;
  // `hopper`: stages 10 and 11 on the pairs (else 08 and 09).
  GpuRank(const Plan& plan, int rank, Dtype dtype, int device, int whole_device, bool backward, bool hopper)
      : plan_(plan), p_(plan.problem), rank_(rank), dtype_(dtype), es_(dtype_size(dtype)), device_(device),
        whole_device_(whole_device), hopper_(hopper) {
    FA_CUDA_CHECK(cudaSetDevice(device));
    FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const auto buffer = [&](int64_t elems, size_t bytes, const char* what) {
      return DeviceBuffer(size_t(elems) * bytes, std::string(kGpuStageName) + ": rank " + std::to_string(rank) + " " + what);
    };
    const int64_t q = plan.q_shard_elems(rank), l = q / p_.head_dim, kv = plan.max_kv_shard_elems();
    const int64_t q_chunk = int64_t(p_.batch) * p_.heads * plan.max_q_chunk_rows() * p_.head_dim;
    const int64_t k_chunk = int64_t(p_.batch) * p_.kv_heads * plan.max_k_chunk_rows() * p_.head_dim;
    Q_ = buffer(q, es_, "Q shard");
    kv_[0] = buffer(kv, es_, "K/V shard");
    kv_[1] = buffer(kv, es_, "K/V shard");
    O_acc_ = buffer(q, 4, "O (fp32) shard");
    L_ = buffer(l, 4, "L shard");
    O_part_ = buffer(q_chunk, es_, "O of a pair");  // also the staging of the rounded O, dQ
    if (!backward) {
      L_part_ = buffer(q_chunk / p_.head_dim, 4, "L of a pair");
      return;
    }
    O_ = buffer(q, es_, "O shard");
    dO_ = buffer(q, es_, "dO shard");
    for (auto& b : dkv_) b = buffer(kv, 4, "dK/dV (fp32) shard");
    dK_part_ = buffer(k_chunk, es_, "dK of a pair");
    dV_part_ = buffer(k_chunk, es_, "dV of a pair");
  }
  ~GpuRank() override {
    // The rank's queued work ends before its buffers are freed (after this body), also when
    // the ring stopped early on an error (errors ignored: a destructor must not throw).
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  GpuRank(const GpuRank&) = delete;
  GpuRank& operator=(const GpuRank&) = delete;

  void* stream() override { return stream_; }
  size_t kv_elem_bytes() const override { return es_; }
  void* kv(int buffer) override { return kv_[buffer].get(); }
  void* dkv(int buffer) override { return dkv_[buffer].get(); }
  void synchronize() { FA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // ---- this rank's rows of the whole tensors (which may live on another GPU)
  void load_forward(const void* Q, const void* K, const void* V) {
    gather_queries(Q, Q_, row_bytes());
    load_keys(K, V);
    const int64_t q = int64_t(O_acc_.bytes() / 4), l = int64_t(L_.bytes() / 4);
    fill<<<grid_for(q), 256, 0, stream_>>>(O_acc_.as<float>(), 0.0f, q);  // the merge's identity:
    fill<<<grid_for(l), 256, 0, stream_>>>(L_.as<float>(), -INFINITY, l);  // O = 0, L = −∞
    FA_CHECK_LAUNCH("12: fill");
  }
  void load_backward(const void* Q, const void* K, const void* V, const void* O, const float* L, const void* dO) {
    gather_queries(Q, Q_, row_bytes());
    gather_queries(O, O_, row_bytes());
    gather_queries(L, L_, sizeof(float));
    gather_queries(dO, dO_, row_bytes());
    load_keys(K, V);
    zero(O_acc_);  // the dQ sums (fp32)
  }
  void store_forward(void* O, float* L) {
    store_rounded(O_acc_.as<float>(), O);
    for (size_t i = 0; i < chunks().size(); ++i)
      copy_rows(bytes(L_) + q_at(int(i), sizeof(float)), L, false, q_slices(), p_.seq_q, query_chunk(i).begin,
                query_chunk(i).size(), sizeof(float), stream_);
  }
  void store_backward(int sums, void* dQ, void* dK, void* dV) {
    store_rounded(O_acc_.as<float>(), dQ);  // O_acc_ holds the dQ sums in the backward
    for (size_t i = 0; i < chunks().size(); ++i) {
      const Range k = plan_.k_chunks[size_t(chunks()[i])];
      const int64_t n = plan_.kv_chunk_elems(chunks()[i]);
      const float* dK_c = dkv_[sums].as<float>() + plan_.kv_chunk_offset(rank_, int(i));
      round(dK_c, dK_part_.get(), n);
      round(dK_c + n, dV_part_.get(), n);
      copy_rows(dK_part_.get(), dK, false, kv_slices(), p_.seq_k, k.begin, k.size(), row_bytes(), stream_);
      copy_rows(dV_part_.get(), dV, false, kv_slices(), p_.seq_k, k.begin, k.size(), row_bytes(), stream_);
      synchronize();  // the staging buffers are reused by the next chunk
    }
  }

  void attend(int a, int kv, int owner, int c, const Problem& pair) override {
    const int64_t rows = int64_t(pair.batch) * pair.heads * pair.seq_q;
    if (hopper_)
      stage10::forward(pair, dtype_, at(Q_, a), K_of(kv, owner, c), V_of(kv, owner, c), O_part_.get(),
                       L_part_.as<float>(), stream_, stage10::Options{});
    else
      stage08::forward(pair, dtype_, at(Q_, a), K_of(kv, owner, c), V_of(kv, owner, c), O_part_.get(),
                       L_part_.as<float>(), stream_, stage08::Options{});
    with_dtype(dtype_, [&](auto tag) {
      using T = decltype(tag);
      merge_rows<<<unsigned((rows * 32 + 255) / 256), 256, 0, stream_>>>(
          O_acc_.as<float>() + q_offset(a, p_.head_dim), L_.as<float>() + q_offset(a, 1), O_part_.as<T>(),
          L_part_.as<float>(), rows, p_.head_dim);
    });
    FA_CHECK_LAUNCH("12: merge_rows");
  }

  void zero_dkv(int buffer) override { zero(dkv_[buffer]); }

  void add_incoming_dkv(int into, int owner) override {
    const int64_t n = plan_.kv_shard_elems(owner);
    add_into<<<grid_for(n), 256, 0, stream_>>>(dkv_[into].as<float>(), dkv_[kIncoming].as<float>(), n);
    FA_CHECK_LAUNCH("12: add_into");
  }

  void backward_pair(int a, int kv, int owner, int c, int dkv, const Problem& pair) override {
    // The whole problem's O and L for these rows make the pair's gradients exact parts. The
    // deterministic mode gives reproducible sums: the same bits on every transport.
    const float* L = L_.as<float>() + q_offset(a, 1);
    if (hopper_) {
      stage11::Options deterministic;
      deterministic.deterministic = true;
      stage11::backward(pair, dtype_, at(Q_, a), K_of(kv, owner, c), V_of(kv, owner, c), at(O_, a), L, at(dO_, a),
                        O_part_.get(), dK_part_.get(), dV_part_.get(), stream_, deterministic);
    } else {
      stage09::Options deterministic;
      deterministic.deterministic = true;
      stage09::backward(pair, dtype_, at(Q_, a), K_of(kv, owner, c), V_of(kv, owner, c), at(O_, a), L, at(dO_, a),
                        O_part_.get(), dK_part_.get(), dV_part_.get(), stream_, deterministic);
    }
    float* dK_c = dkv_[dkv].as<float>() + plan_.kv_chunk_offset(owner, c);
    with_dtype(dtype_, [&](auto tag) {
      using T = decltype(tag);
      add_into<<<grid_for(pair.q_elems()), 256, 0, stream_>>>(O_acc_.as<float>() + q_offset(a, p_.head_dim),
                                                              O_part_.as<T>(), pair.q_elems());  // dQ_a += dQ
      add_into<<<grid_for(pair.kv_elems()), 256, 0, stream_>>>(dK_c, dK_part_.as<T>(), pair.kv_elems());
      add_into<<<grid_for(pair.kv_elems()), 256, 0, stream_>>>(dK_c + pair.kv_elems(), dV_part_.as<T>(),
                                                               pair.kv_elems());
    });
    FA_CHECK_LAUNCH("12: add_into");
  }

 private:
  // Copies rows [row0, row0 + n) of each of `slices` slices of `rows` rows × `row_bytes` (a whole
  // tensor, on the caller's GPU) into a dense chunk on this rank's GPU, or back. A pitched copy
  // between two GPUs is cudaMemcpy3DPeerAsync; on one GPU it is a device-to-device copy.
  void copy_rows(const void* from, void* to, bool into_chunk, int64_t slices, int64_t rows, int64_t row0, int64_t n,
                 size_t row_bytes, cudaStream_t stream) const {
    if (n == 0 || slices == 0) return;
    const size_t chunk_pitch = size_t(n) * row_bytes, whole_pitch = size_t(rows) * row_bytes;
    const size_t at = size_t(row0) * row_bytes;  // where the chunk's rows start in a slice
    cudaMemcpy3DPeerParms m = {};
    if (into_chunk) {
      m.srcPtr = make_cudaPitchedPtr(const_cast<char*>(static_cast<const char*>(from)) + at, whole_pitch, chunk_pitch,
                                     size_t(slices));
      m.dstPtr = make_cudaPitchedPtr(to, chunk_pitch, chunk_pitch, size_t(slices));
      m.srcDevice = whole_device_;
      m.dstDevice = device_;
    } else {
      m.srcPtr = make_cudaPitchedPtr(const_cast<void*>(from), chunk_pitch, chunk_pitch, size_t(slices));
      m.dstPtr = make_cudaPitchedPtr(static_cast<char*>(to) + at, whole_pitch, chunk_pitch, size_t(slices));
      m.srcDevice = device_;
      m.dstDevice = whole_device_;
    }
    m.extent = make_cudaExtent(chunk_pitch, size_t(slices), 1);  // width in bytes, rows, one layer
    FA_CUDA_CHECK(cudaMemcpy3DPeerAsync(&m, stream));
  }
  const std::vector<int>& chunks() const { return plan_.chunks_of[size_t(rank_)]; }
  Range query_chunk(size_t i) const { return plan_.q_chunks[size_t(chunks()[i])]; }
  int64_t q_slices() const { return int64_t(p_.batch) * p_.heads; }
  int64_t kv_slices() const { return int64_t(p_.batch) * p_.kv_heads; }
  size_t row_bytes() const { return size_t(p_.head_dim) * es_; }  // one row of Q, K, V, O
  static char* bytes(const DeviceBuffer& b) { return static_cast<char*>(b.get()); }
  // Element offset of this rank's a-th query chunk in a shard whose rows are `width` wide (d, or 1 for L).
  int64_t q_offset(int a, int64_t width) const { return plan_.q_chunk_offset(rank_, a) / p_.head_dim * width; }
  // The same in bytes, for rows of `row_bytes` bytes.
  int64_t q_at(int a, size_t row_bytes) const { return plan_.q_chunk_offset(rank_, a) / p_.head_dim * int64_t(row_bytes); }
  const void* at(const DeviceBuffer& shard, int a) const { return bytes(shard) + q_at(a, row_bytes()); }
  // K and V of `owner`'s c-th chunk in K/V buffer `kv`.
  char* K_of(int kv, int owner, int c) const { return bytes(kv_[kv]) + plan_.kv_chunk_offset(owner, c) * int64_t(es_); }
  char* V_of(int kv, int owner, int c) const {
    return K_of(kv, owner, c) + plan_.kv_chunk_elems(plan_.chunks_of[size_t(owner)][size_t(c)]) * int64_t(es_);
  }
  void zero(DeviceBuffer& b) {
    if (b.bytes() > 0) FA_CUDA_CHECK(cudaMemsetAsync(b.get(), 0, b.bytes(), stream_));
  }
  void round(const float* src, void* dst, int64_t n) {
    with_dtype(dtype_, [&](auto tag) {
      using T = decltype(tag);
      round_to<<<grid_for(n), 256, 0, stream_>>>(src, static_cast<T*>(dst), n);
    });
    FA_CHECK_LAUNCH("12: round_to");
  }
  // Each query chunk of an fp32 shard rounded into O_part_, then copied to its rows of `whole`.
  void store_rounded(const float* shard, void* whole) {
    for (size_t i = 0; i < chunks().size(); ++i) {
      const Range q = query_chunk(i);
      round(shard + q_offset(int(i), p_.head_dim), O_part_.get(), q_slices() * q.size() * p_.head_dim);
      copy_rows(O_part_.get(), whole, false, q_slices(), p_.seq_q, q.begin, q.size(), row_bytes(), stream_);
      synchronize();  // O_part_ is reused by the next chunk
    }
  }
  // This rank's query chunks of a whole Q-shaped tensor (rows of d elements) or of L (one fp32).
  void gather_queries(const void* whole, const DeviceBuffer& shard, size_t row) {
    for (size_t i = 0; i < chunks().size(); ++i)
      copy_rows(whole, bytes(shard) + q_at(int(i), row), true, q_slices(), p_.seq_q, query_chunk(i).begin,
                query_chunk(i).size(), row, stream_);
  }
  void load_keys(const void* K, const void* V) {  // this rank's own K/V shard, into buffer 0
    for (size_t i = 0; i < chunks().size(); ++i) {
      const Range k = plan_.k_chunks[size_t(chunks()[i])];
      copy_rows(K, K_of(0, rank_, int(i)), true, kv_slices(), p_.seq_k, k.begin, k.size(), row_bytes(), stream_);
      copy_rows(V, V_of(0, rank_, int(i)), true, kv_slices(), p_.seq_k, k.begin, k.size(), row_bytes(), stream_);
    }
  }

  const Plan& plan_;
  const Problem& p_;
  int rank_;
  Dtype dtype_;
  size_t es_;
  int device_, whole_device_;
  bool hopper_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer Q_, O_, dO_, L_, O_acc_;  // query shards (O_acc_: the fp32 O, or the dQ sums)
  DeviceBuffer kv_[2], dkv_[3];
  DeviceBuffer O_part_, L_part_, dK_part_, dV_part_;  // one pair's results
};

// The Hopper set's (stage 11's; the tensor-core set's are refused: require_head_dim_of_kernels).
const std::vector<int>& gpu_head_dims() { return stage11::kHeadDims; }

namespace {

// The calling thread's GPU, put back when a ring call returns (rank 0 runs on this thread).
struct DeviceGuard {
  int device = 0;
  DeviceGuard() { FA_CUDA_CHECK(cudaGetDevice(&device)); }
  ~DeviceGuard() { cudaSetDevice(device); }
};

// Every refusal of a call, before anything is written: the problem, dtype and head dim (as
// stages 08 and 09 refuse them), the config, and the cut of the sequence.
Plan checked_plan(const Problem& p, const GpuConfig& c, Dtype t) {
  require_tensor_core_request(kGpuStageName, p, t, gpu_head_dims());
  require_grid_rows(kGpuStageName, p);
  if (c.split != Split::Zigzag && c.split != Split::Plain)
    throw std::invalid_argument(std::string(kGpuStageName) + ": split = " + std::to_string(int(c.split)) +
                                " is not zigzag (0) or plain (1)");
  if (c.transport != TransportKind::Device && c.transport != TransportKind::Nccl)
    throw std::invalid_argument(std::string(kGpuStageName) + ": transport = " + std::to_string(int(c.transport)) +
                                " is not device (0) or nccl (1)");
  return make_plan(p, ranks_for(p, c.ranks, c.split), c.split, kGpuStageName);
}

void require_tensor(const char* name, const void* ptr, int64_t elems, size_t alignment) {
  if (elems > 0)
    require_device_pointer(kGpuStageName, name, ptr, alignment,
                           alignment == 16 ? "the tensor-core stages load 16 bytes at a time" : "fp32");
}

}  // namespace

GpuRing::GpuRing(const Problem& p, const GpuConfig& c, Dtype t, Pass pass, std::shared_ptr<Ring> kv_ring,
                 std::shared_ptr<Ring> dkv_ring)
    : plan_(checked_plan(p, c, t)), dtype_(t), pass_(pass), devices_(ring_devices(c.transport, plan_.ranks)),
      hopper_(runs_hopper(c.kernels, devices_)), kv_ring_(std::move(kv_ring)), dkv_ring_(std::move(dkv_ring)),
      sums_(size_t(plan_.ranks), 0) {
  require_head_dim_of_kernels(hopper_, p.head_dim);
  const DeviceGuard guard;
  whole_device_ = guard.device;
  for (int r = 0; r < plan_.ranks; ++r)
    ranks_.push_back(std::make_unique<GpuRank>(plan_, r, t, devices_[size_t(r)], whole_device_,
                                               pass == Pass::Backward, hopper_));
  if (!kv_ring_) kv_ring_ = make_ring(c.transport, devices_);
  if (pass == Pass::Backward && !dkv_ring_) dkv_ring_ = make_ring(c.transport, devices_);
}

GpuRing::~GpuRing() {
  const DeviceGuard guard;  // each rank frees its buffers on its own GPU
  kv_ring_.reset();
  dkv_ring_.reset();
  ranks_.clear();
}

cudaStream_t GpuRing::stream(int rank) const { return static_cast<cudaStream_t>(ranks_[size_t(rank)]->stream()); }

void GpuRing::run(const std::function<void(int rank)>& body, const std::function<void()>& abort) {
  const DeviceGuard guard;
  run_on_ranks(
      plan_.ranks,
      [&](int rank) {
        FA_CUDA_CHECK(cudaSetDevice(devices_[size_t(rank)]));
        body(rank);
      },
      [&] {
        kv_ring_->abort();
        if (dkv_ring_) dkv_ring_->abort();
        if (abort) abort();
      });
}

void GpuRing::load(int rank, const WholeTensors& x) {
  GpuRank& r = *ranks_[size_t(rank)];
  if (pass_ == Pass::Forward)
    r.load_forward(x.Q, x.K, x.V);
  else
    r.load_backward(x.Q, x.K, x.V, x.O, x.L, x.dO);
}

void GpuRing::ring(int rank, Work* work, Transport* kv, Transport* dkv) {
  GpuRank& r = *ranks_[size_t(rank)];
  Transport& kv_ring = kv ? *kv : kv_endpoint(rank);
  if (pass_ == Pass::Forward)
    ring_forward(plan_, rank, r, kv_ring, work);
  else
    sums_[size_t(rank)] = ring_backward(plan_, rank, r, kv_ring, dkv ? *dkv : dkv_endpoint(rank), work);
}

void GpuRing::store(int rank, const WholeTensors& x) {
  GpuRank& r = *ranks_[size_t(rank)];
  if (pass_ == Pass::Forward)
    r.store_forward(x.O, x.L);
  else
    r.store_backward(sums_[size_t(rank)], x.dQ, x.dK, x.dV);
  r.synchronize();
}

void forward_gpu(const Problem& p, const GpuConfig& c, Dtype t, const void* Q, const void* K, const void* V, void* O,
                 float* L, cudaStream_t stream, Work* work) {
  checked_plan(p, c, t);  // the problem and config are refused before the pointers
  require_tensor("Q", Q, p.q_elems(), 16);
  require_tensor("K", K, p.kv_elems(), 16);
  require_tensor("V", V, p.kv_elems(), 16);
  require_tensor("O", O, p.q_elems(), 16);
  require_tensor("L", L, p.l_elems(), 4);
  GpuRing ring(p, c, t, GpuRing::Pass::Forward);
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));  // the caller's inputs are written
  if (work) *work = Work(ring.ranks());
  WholeTensors x;
  x.Q = Q, x.K = K, x.V = V, x.O = O, x.L = L;
  ring.run([&](int rank) {
    ring.load(rank, x);
    ring.ring(rank, work);
    ring.store(rank, x);
  });
}

void backward_gpu(const Problem& p, const GpuConfig& c, Dtype t, const void* Q, const void* K, const void* V,
                  const void* O, const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
                  Work* work) {
  checked_plan(p, c, t);
  for (const auto& [name, ptr, elems] : {std::tuple{"Q", Q, p.q_elems()}, {"K", K, p.kv_elems()},
                                         {"V", V, p.kv_elems()}, {"O", O, p.q_elems()}, {"dO", dO, p.q_elems()},
                                         {"dQ", static_cast<const void*>(dQ), p.q_elems()},
                                         {"dK", static_cast<const void*>(dK), p.kv_elems()},
                                         {"dV", static_cast<const void*>(dV), p.kv_elems()}})
    require_tensor(name, ptr, elems, 16);
  require_tensor("L", L, p.l_elems(), 4);
  GpuRing ring(p, c, t, GpuRing::Pass::Backward);
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (work) *work = Work(ring.ranks());
  WholeTensors x;
  x.Q = Q, x.K = K, x.V = V, x.O = const_cast<void*>(O), x.L = const_cast<float*>(L), x.dO = dO;
  x.dQ = dQ, x.dK = dK, x.dV = dV;
  ring.run([&](int rank) {
    ring.load(rank, x);
    ring.ring(rank, work);
    ring.store(rank, x);
  });
}

}  // namespace fa::stage12
