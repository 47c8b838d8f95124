/// \file ring_gpu.h
/// \brief Stage 12 on GPUs: the ring of ring_attention.h with each rank running the
/// tensor-core stages (08's forward, 09's backward) on its chunk pairs, fp16/bf16 in, fp32
/// merges and gradient sums. The shards move either between virtual ranks on one GPU (device
/// copies) or between GPUs with NCCL point-to-point sends on a stream of their own.
///
/// Plain C++ (no device syntax): the stage list, the tests and the C ABI include it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "ring_attention.h"

namespace fa::stage12 {

/// What carries the shards between GPU ranks.
///  - Device: P virtual ranks on the calling thread's GPU; an exchange is a device-to-device
///    copy on a stream of its own, overlapped with the ranks' kernels.
///  - Nccl: rank r on GPU r (P GPUs); an exchange is ncclSend/ncclRecv on a stream of its own.
enum class TransportKind { Device = 0, Nccl = 1 };
/// "device", "nccl".
const char* transport_name(TransportKind t);

/// How a GPU ring call is cut and carried.
struct GpuConfig {
  int ranks = 0;  ///< P; 0: the default (ranks_for)
  Split split = Split::Zigzag;
  TransportKind transport = TransportKind::Device;
};

/// Head dims with both a forward (stage 08) and a backward (stage 09) kernel: 64, 128.
const std::vector<int>& gpu_head_dims();

/// True when this tree was configured with NCCL (the Nccl transport is built in).
bool nccl_built();

/// Ring attention forward on DEVICE buffers in `dtype` (BF16 or F16; L fp32) in the layouts of
/// docs/design.md §3 (the whole tensors, on the calling thread's GPU). Waits for `stream`,
/// scatters each rank's slices to its GPU, runs the ring (one host thread per rank), gathers
/// O and L, and returns when they are written. Throws std::invalid_argument for a problem,
/// dtype, head dim, pointer, config, or (Nccl) a ring larger than the GPUs present, before
/// anything is written. `work` (may be null) receives the score entries per rank and step.
void forward_gpu(const Problem& p, const GpuConfig& c, Dtype dtype, const void* Q, const void* K, const void* V,
                 void* O, float* L, cudaStream_t stream, Work* work = nullptr);
/// The backward on device buffers: O and L are the forward's; dQ, dK, dV are overwritten.
/// Each pair runs stage 09 in its deterministic mode, so a ring's result is bitwise the same
/// from run to run and on any transport.
void backward_gpu(const Problem& p, const GpuConfig& c, Dtype dtype, const void* Q, const void* K, const void* V,
                  const void* O, const float* L, const void* dO, void* dQ, void* dK, void* dV, cudaStream_t stream,
                  Work* work = nullptr);

/// The ring of virtual ranks on the current GPU: device copies on one stream per rank.
std::unique_ptr<Ring> make_device_ring(int ranks);
/// The ring over GPUs `devices` (rank r on devices[r]) by NCCL (nccl_transport.cpp). Throws
/// std::invalid_argument when NCCL is not built in.
std::unique_ptr<Ring> make_nccl_ring(const std::vector<int>& devices);

/// The GPU ring for the driver, the tests and the C ABI ("12_ring_attention_gpu"). Options
/// --ranks, --split, --transport (set_option "ranks", "split", "transport"); the counters of
/// the CPU ring's info().
StageInfo gpu_info();

}  // namespace fa::stage12
