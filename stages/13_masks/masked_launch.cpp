// Stage 13 on Hopper, the host side: what it refuses, the document table of the work list,
// the tensor maps, and which kernel runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_utils.h"
#include "document_mask.h"
#include "hopper/tensor_map.h"
#include "hopper/traits.h"
#include "masked_hopper.h"
#include "masked_hopper_kernels.h"
#include "masked_params.h"
#include "masks.h"
#include "scratch.h"

namespace fa::stage13 {

namespace {

constexpr int kBlockN = 128;                                  // B_c at d = 64 and 128 (traits.h)
int block_rows(int d) { return d == 64 ? 3 * 64 : 2 * 64; }  // B_r: three consumers at d = 64

/// Every refusal happens here, before anything is launched or written.
void check_request(const Problem& p, const Modifiers& m, Dtype dtype) {
  require_tensor_core_request(kStageName, p, dtype, kHopperHeadDims);
  m.validate(p, kStageName);
  for (const auto& [name, n] : {std::pair{"seq_q", p.seq_q}, std::pair{"seq_k", p.seq_k}})
    if (n >= kNoBound)
      throw std::invalid_argument(std::string(kStageName) + ": " + name + " = " + std::to_string(n) +
                                  " is too long for the Hopper forward (at most " + std::to_string(kNoBound - 1) + ")");
}

/// The work list's documents: cu_seqlens, or the whole sequence as one; and the rows past the
/// last document as one more with no keys (they see nothing, but O and L are written).
struct Documents {
  std::vector<int> cu_q, cu_k;
};
Documents documents_of(const Problem& p, const Modifiers& m) {
  Documents docs;
  if (!m.has_documents()) {
    docs.cu_q = {0, int(p.seq_q)};
    docs.cu_k = {0, int(p.seq_k)};
    return docs;
  }
  for (int64_t x : m.cu_seqlens_q) docs.cu_q.push_back(int(x));
  for (int64_t x : m.cu_seqlens_k) docs.cu_k.push_back(int(x));
  if (docs.cu_q.back() < p.seq_q) {
    docs.cu_q.push_back(int(p.seq_q));
    docs.cu_k.push_back(docs.cu_k.back());
  }
  return docs;
}

/// The first work tile of each document among one head's: query tiles of B_r rows, counted
/// per document (an empty document has none).
std::vector<int> first_tiles(const Documents& docs, int rows) {
  std::vector<int> first{0};
  for (size_t i = 0; i + 1 < docs.cu_q.size(); ++i)
    first.push_back(first.back() + (docs.cu_q[i + 1] - docs.cu_q[i] + rows - 1) / rows);
  return first;
}

/// Pinned host memory for the table's upload, two buffers per thread used in turn. From
/// pageable memory cudaMemcpyAsync would first wait for everything queued on the stream (the
/// previous call's kernel), so back-to-back calls would leave the GPU idle while the host
/// prepares the next; from pinned memory the copy is queued like the kernel. A buffer is
/// refilled only after its last copy has run (its event), i.e. at most two calls ahead.
class StagingRing {
 public:
  unsigned char* take(size_t bytes) {
    Slot& s = slots_[next_];
    next_ ^= 1;
    if (s.event) FA_CUDA_CHECK(cudaEventSynchronize(s.event));  // its last upload has been read
    if (bytes > s.bytes) {
      if (s.host) FA_CUDA_CHECK(cudaFreeHost(s.host));
      s.host = nullptr;
      FA_CUDA_CHECK(cudaHostAlloc(&s.host, bytes, cudaHostAllocPortable));
      s.bytes = bytes;
    }
    current_ = &s;
    return static_cast<unsigned char*>(s.host);
  }
  void copied_on(cudaStream_t stream) {
    int device = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    if (current_->event && current_->device != device) {  // an event records on its own device only
      FA_CUDA_CHECK(cudaEventDestroy(current_->event));
      current_->event = nullptr;
    }
    if (!current_->event) FA_CUDA_CHECK(cudaEventCreateWithFlags(&current_->event, cudaEventDisableTiming));
    current_->device = device;
    FA_CUDA_CHECK(cudaEventRecord(current_->event, stream));
  }
  ~StagingRing() {  // at thread exit; errors ignored (the CUDA runtime may be gone already)
    for (Slot& s : slots_) {
      if (s.event) (void)cudaEventDestroy(s.event);
      if (s.host) (void)cudaFreeHost(s.host);
    }
  }

 private:
  struct Slot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t event = nullptr;
    int device = -1;
  };
  Slot slots_[2];
  Slot* current_ = nullptr;
  int next_ = 0;
};
thread_local StagingRing t_staging;
unsigned char* staging_buffer(size_t bytes) { return t_staging.take(bytes); }
void staged_on(cudaStream_t stream) { t_staging.copied_on(stream); }

/// Stage 10f's sections: the largest power of two of (batch, head) pairs whose K and V fit in
/// the L2 together (heads that share a KV head count their share), at least one. With
/// documents a head's blocks read one document's K and V at a time: the longest counts.
int heads_per_section(const Problem& p, const Modifiers& m, int device) {
  int l2_bytes = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const double keys = double(m.max_seqlen_k(p));
  const double kv_bytes_per_head = 2.0 * keys * p.head_dim * 2 / p.group_size();  // K and V, 2 bytes
  const int64_t fit = int64_t(l2_bytes / std::max(kv_bytes_per_head, 1.0));
  int64_t heads = 1;
  while (2 * heads <= std::min<int64_t>(fit, int64_t(p.heads) * p.batch)) heads *= 2;
  return int(heads);
}

DocumentMask mask_of(const Problem& p, const Modifiers& m, const Documents& docs, size_t doc) {
  int right = m.window_right ? int(std::min<int64_t>(*m.window_right, kNoBound)) : kNoBound;
  if (p.causal) right = std::min(right, 0);
  const int left = m.window_left ? int(std::min<int64_t>(*m.window_left, kNoBound)) : kNoBound;
  return {docs.cu_q[doc + 1] - docs.cu_q[doc], docs.cu_k[doc + 1] - docs.cu_k[doc], left, right};
}

}  // namespace

HopperTileCounts count_hopper_tiles(const Problem& p, const Modifiers& m) {
  check_request(p, m, Dtype::BF16);
  const Documents docs = documents_of(p, m);
  const int rows = block_rows(p.head_dim);
  HopperTileCounts c;
  for (size_t doc = 0; doc + 1 < docs.cu_q.size(); ++doc) {
    const DocumentMask mask = mask_of(p, m, docs, doc);
    const int key_tiles = (mask.n_k + kBlockN - 1) / kBlockN;
    for (int row0 = 0; row0 < mask.n_q; row0 += rows)
      for (int j = 0; j < key_tiles; ++j) switch (mask.classify(row0, rows, j, kBlockN)) {
          case GpuTileKind::Skip: ++c.skip; break;
          case GpuTileKind::Full: ++c.full; break;
          case GpuTileKind::Partial: ++c.partial; break;
        }
  }
  const int64_t heads = int64_t(p.batch) * p.heads;
  return {c.skip * heads, c.full * heads, c.partial * heads};
}

void forward_hopper(const Problem& p, const Modifiers& m, Dtype dtype, const void* Q, const void* K, const void* V,
                    void* O, float* L, cudaStream_t stream) {
  check_request(p, m, dtype);
  if (p.q_elems() == 0) return;  // seq_q = 0: nothing to compute, nothing launched
  const char* why = "TMA reads and the epilogue writes 16-byte-aligned global memory";
  require_device_pointer(kStageName, "Q", Q, 16, why);
  require_device_pointer(kStageName, "O", O, 16, why);
  require_device_pointer(kStageName, "L", L, alignof(float), "L is fp32");
  if (p.kv_elems() > 0) {
    require_device_pointer(kStageName, "K", K, 16, why);
    require_device_pointer(kStageName, "V", V, 16, why);
  }
  require_hopper(kStageName);

  const StepKernel k = masked_hopper_kernel(p.head_dim, dtype, m.softcap > 0, !m.alibi_slopes.empty());
  const Documents docs = documents_of(p, m);
  const std::vector<int> first = first_tiles(docs, k.block_rows);
  const int64_t tiles = int64_t(first.back()) * p.batch * p.heads;
  const int sms = sm_count();
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));  // for the L2 size below
  if (tiles > INT32_MAX - sms)  // the scheduler counts up to tiles + grid in an int
    throw std::invalid_argument(std::string(kStageName) + ": " + std::to_string(tiles) +
                                " work tiles exceed the tile counter's 2^31 − 1 − " + std::to_string(sms));

  // One upload: the tile counter (0), the document table, then the slopes and sinks.
  const size_t n_docs = docs.cu_q.size() - 1, table = 3 * (n_docs + 1);
  std::vector<int32_t> ints(4 + table, 0);  // [counter, pad ×3 | cu_q | cu_k | first_tile]
  std::copy(docs.cu_q.begin(), docs.cu_q.end(), ints.begin() + 4);
  std::copy(docs.cu_k.begin(), docs.cu_k.end(), ints.begin() + 4 + (n_docs + 1));
  std::copy(first.begin(), first.end(), ints.begin() + 4 + 2 * (n_docs + 1));
  std::vector<float> floats(m.alibi_slopes);
  floats.insert(floats.end(), m.sinks.begin(), m.sinks.end());
  const size_t bytes = ints.size() * 4 + floats.size() * 4;
  const Scratch scratch(bytes, stream, kStageName, "the document table");
  auto* dev_ints = static_cast<int32_t*>(scratch.data());
  auto* dev_floats = reinterpret_cast<float*>(dev_ints + ints.size());
  unsigned char* staged = staging_buffer(bytes);
  std::memcpy(staged, ints.data(), ints.size() * 4);
  if (!floats.empty()) std::memcpy(staged + ints.size() * 4, floats.data(), floats.size() * 4);
  FA_CUDA_CHECK(cudaMemcpyAsync(scratch.data(), staged, bytes, cudaMemcpyHostToDevice, stream));
  staged_on(stream);

  MaskedParams params{};
  const int64_t q_heads = int64_t(p.batch) * p.heads, kv_heads = int64_t(p.batch) * p.kv_heads;
  params.map_q = hopper::make_tensor_map(Q, dtype, p.head_dim, int(p.seq_q), q_heads, stage10::kRowsPerWarpgroup,
                                         kStageName, "Q");
  if (p.seq_k > 0) {
    params.map_k = hopper::make_tensor_map(K, dtype, p.head_dim, int(p.seq_k), kv_heads, k.block_cols, kStageName, "K");
    params.map_v = hopper::make_tensor_map(V, dtype, p.head_dim, int(p.seq_k), kv_heads, k.block_cols, kStageName, "V");
  } else {  // no key tile is ever loaded; any valid map will do
    params.map_k = params.map_v = params.map_q;
  }
  params.O = O;
  params.L = L;
  params.batch = int(p.batch);
  params.heads = int(p.heads);
  params.kv_heads = int(p.kv_heads);
  params.seq_q = int(p.seq_q);
  params.seq_k = int(p.seq_k);
  params.documents = int(n_docs);
  params.tile_counter = dev_ints;
  params.cu_q = dev_ints + 4;
  params.cu_k = params.cu_q + (n_docs + 1);
  params.first_tile = params.cu_k + (n_docs + 1);
  const DocumentMask any = mask_of(p, m, docs, 0);  // the window is the same for every document
  params.window_left = any.window_left;
  params.window_right = any.window_right;
  params.alibi_slopes = m.alibi_slopes.empty() ? nullptr : dev_floats;
  params.sinks = m.sinks.empty() ? nullptr : dev_floats + m.alibi_slopes.size();
  params.softcap = float(m.softcap);
  params.tiles_total = int(tiles);
  params.heads_per_section = heads_per_section(p, m, device);
  params.scale = p.softmax_scale();
  params.scale_log2 = params.scale * float(M_LOG2E);

  const dim3 grid(unsigned(std::min<int64_t>(sms, tiles)));
  void* args[] = {&params};
  launch(k, grid, args, stream);
  FA_CHECK_LAUNCH("13_masks hopper forward");
}

//! [backward launch]
void backward_hopper(const Problem& p, const Modifiers& m, Dtype dtype, const void* Q, const void* K, const void* V,
                     const void* O, const float* L, const void* dO, void* dQ, void* dK, void* dV, float* dsinks,
                     cudaStream_t stream) {
  check_request(p, m, dtype);
  const bool sinks = !m.sinks.empty();
  if (sinks && dsinks == nullptr)
    throw std::invalid_argument(std::string(kStageName) + ": dsinks is null, but the modifiers have sinks (their gradient goes there)");
  const char* why = "TMA reads and the kernels write 16-byte-aligned global memory";
  if (p.q_elems() > 0) {
    for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"Q", Q}, {"O", O}, {"dO", dO}, {"dQ", dQ}})
      require_device_pointer(kStageName, name, ptr, 16, why);
    require_device_pointer(kStageName, "L", L, alignof(float), "L is fp32");
  }
  if (p.kv_elems() > 0)
    for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"K", K}, {"V", V}, {"dK", dK}, {"dV", dV}})
      require_device_pointer(kStageName, name, ptr, 16, why);
  if (sinks) require_device_pointer(kStageName, "dsinks", dsinks, alignof(float), "dsinks is fp32");
  if (p.q_elems() == 0 && p.kv_elems() == 0) return;
  require_hopper(kStageName);

  const int d = p.head_dim;
  if (sinks) FA_CUDA_CHECK(cudaMemsetAsync(dsinks, 0, size_t(p.heads) * sizeof(float), stream));
  if (p.q_elems() == 0 || p.kv_elems() == 0) {  // nothing is seen: every gradient is 0
    if (p.q_elems() > 0) FA_CUDA_CHECK(cudaMemsetAsync(dQ, 0, size_t(p.q_elems()) * 2, stream));
    if (p.kv_elems() > 0) {
      FA_CUDA_CHECK(cudaMemsetAsync(dK, 0, size_t(p.kv_elems()) * 2, stream));
      FA_CUDA_CHECK(cudaMemsetAsync(dV, 0, size_t(p.kv_elems()) * 2, stream));
    }
    return;
  }
  const StepKernel k = masked_hopper_bwd_kernel(d, dtype, m.softcap > 0, !m.alibi_slopes.empty());

  // The documents of the forward's work list, and the keys past the last document as one
  // more with no queries (their dK, dV are 0, written by that document's blocks).
  Documents docs = documents_of(p, m);
  if (docs.cu_k.back() < p.seq_k) {
    docs.cu_q.push_back(docs.cu_q.back());
    docs.cu_k.push_back(int(p.seq_k));
  }
  const size_t n_docs = docs.cu_q.size() - 1;
  std::vector<int> pad_first{0}, first_key_tile{0};
  for (size_t i = 0; i < n_docs; ++i) {
    const int n_q = docs.cu_q[i + 1] - docs.cu_q[i], n_k = docs.cu_k[i + 1] - docs.cu_k[i];
    pad_first.push_back(pad_first.back() + (n_q + kDocumentPad - 1) / kDocumentPad * kDocumentPad);
    first_key_tile.push_back(first_key_tile.back() + (n_k + k.block_cols - 1) / k.block_cols);
  }
  const int64_t n_pad = pad_first.back(), heads_total = int64_t(p.batch) * p.heads;
  const int64_t kv_rows = int64_t(p.batch) * p.kv_heads, blocks = int64_t(first_key_tile.back()) * kv_rows;
  if (blocks > INT32_MAX)
    throw std::invalid_argument(std::string(kStageName) + ": " + std::to_string(blocks) +
                                " backward blocks (key tiles × batch × kv heads) exceed the grid's 2^31 − 1");
  if (n_pad >= kNoBound)
    throw std::invalid_argument(std::string(kStageName) + ": the padded scratch of " + std::to_string(n_pad) +
                                " rows per head is too large");

  // One upload: the document table (cu_q | cu_k | pad_first | first_key_tile), then the
  // slopes and sinks. One scratch: L2 and D [heads_total][n_pad], then dQ_accum.
  std::vector<int32_t> ints;
  for (const std::vector<int>* column : {&docs.cu_q, &docs.cu_k, &pad_first, &first_key_tile})
    ints.insert(ints.end(), column->begin(), column->end());
  while (ints.size() % 4) ints.push_back(0);  // the floats after it stay 16-byte aligned
  std::vector<float> floats(m.alibi_slopes);
  floats.insert(floats.end(), m.sinks.begin(), m.sinks.end());
  const size_t table_bytes = ints.size() * 4 + floats.size() * 4;
  const size_t stat_elems = size_t(heads_total * n_pad);
  const Scratch table(table_bytes, stream, kStageName, "the document table");
  const Scratch scratch(stat_elems * (2 + size_t(d)) * sizeof(float), stream, kStageName, "L2, D, dQ_accum");
  unsigned char* staged = staging_buffer(table_bytes);
  std::memcpy(staged, ints.data(), ints.size() * 4);
  if (!floats.empty()) std::memcpy(staged + ints.size() * 4, floats.data(), floats.size() * 4);
  FA_CUDA_CHECK(cudaMemcpyAsync(table.data(), staged, table_bytes, cudaMemcpyHostToDevice, stream));
  staged_on(stream);
  const auto* dev_ints = static_cast<const int32_t*>(table.data());
  const auto* dev_floats = reinterpret_cast<const float*>(dev_ints + ints.size());

  MaskedBwdParams params{};
  params.map_q = hopper::make_tensor_map(Q, dtype, d, int(p.seq_q), heads_total, 64, kStageName, "Q");
  params.map_do = hopper::make_tensor_map(dO, dtype, d, int(p.seq_q), heads_total, 64, kStageName, "dO");
  params.map_k = hopper::make_tensor_map(K, dtype, d, int(p.seq_k), kv_rows, k.block_cols, kStageName, "K");
  params.map_v = hopper::make_tensor_map(V, dtype, d, int(p.seq_k), kv_rows, k.block_cols, kStageName, "V");
  params.O = O;
  params.dO = dO;
  params.L = L;
  params.L2 = scratch.floats();
  params.D = scratch.floats() + stat_elems;
  params.dQ_accum = scratch.floats() + 2 * stat_elems;
  params.dQ = dQ;
  params.dK = dK;
  params.dV = dV;
  params.dsinks = sinks ? dsinks : nullptr;
  params.batch = int(p.batch);
  params.heads = int(p.heads);
  params.kv_heads = int(p.kv_heads);
  params.seq_q = int(p.seq_q);
  params.seq_k = int(p.seq_k);
  params.n_pad = int(n_pad);
  params.documents = int(n_docs);
  params.cu_q = dev_ints;
  params.cu_k = params.cu_q + (n_docs + 1);
  params.pad_first = params.cu_k + (n_docs + 1);
  params.first_key_tile = params.pad_first + (n_docs + 1);
  const DocumentMask any = mask_of(p, m, docs, 0);  // the window is the same for every document
  params.window_left = any.window_left;
  params.window_right = any.window_right;
  params.alibi_slopes = m.alibi_slopes.empty() ? nullptr : dev_floats;
  params.sinks = sinks ? dev_floats + m.alibi_slopes.size() : nullptr;
  params.softcap = float(m.softcap);
  params.scale = p.softmax_scale();
  params.scale_log2 = params.scale * float(M_LOG2E);

  // Three kernels, each after the one before on the stream. The second and third are launched
  // programmatically (step_kernel.h): their blocks may start while the kernel before still
  // runs (its blocks have all started), set up, and wait (griddepcontrol.wait) only where they
  // first read its output, so a kernel's launch and start hide under its predecessor's tail.
  launch_masked_prep(params, dtype, d, stream);  // also zeroes dQ_accum, every padded row
  params.order = {first_key_tile.back(), int(kv_rows), bwd_row_group(sm_count(), first_key_tile.back(), int(kv_rows))};
  const dim3 grid{unsigned(blocks)};
  if (blocks > 0) {
    void* args[] = {&params};
    launch(k, grid, args, stream, StreamOrder::Programmatic);
    FA_CHECK_LAUNCH("13_masks hopper backward");
  }
  launch_masked_convert_dq(params, dtype, d, stream);  // programmatic too
}
//! [backward launch]

}  // namespace fa::stage13
