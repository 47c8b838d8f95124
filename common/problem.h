/// \file problem.h
/// \brief The attention problem every stage solves: sizes, mask, scale, and their checks.
#pragma once

#include <cstdint>
#include <string>

namespace fa {

/// Element type a stage computes in. Stages 01–07 are fp32; 08–09 take fp16 or bf16.
enum class Dtype { F32 = 0, F16 = 1, BF16 = 2 };

/// "f32", "f16", "bf16".
const char* dtype_name(Dtype t);
/// Parses "f32"/"fp32", "f16"/"fp16", "bf16"; throws std::invalid_argument otherwise.
Dtype parse_dtype(const std::string& s);

/// The most elements one tensor of a problem may hold: its size in bytes at fp32 must fit
/// in int64_t, so every element count, offset and byte size is exact. Problem::validate
/// refuses a problem with a larger tensor (or one whose count would wrap).
inline constexpr int64_t kMaxTensorElems = INT64_MAX / 4;

/// One attention problem: O = softmax(scale · Q Kᵀ + mask) V.
///
/// Layout (docs/design.md §3): Q, O are [batch][heads][seq_q][head_dim]; K, V are
/// [batch][kv_heads][seq_k][head_dim]; L is [batch][heads][seq_q]. Query head h reads
/// kv head h / (heads / kv_heads) (grouped-query attention).
struct Problem {
  int batch = 1;
  int heads = 1;
  int kv_heads = 1;
  int seq_q = 128;
  int seq_k = 128;
  int head_dim = 64;
  bool causal = false;
  float scale = 0.0f;  ///< 0 means 1/sqrt(head_dim)

  /// Throws std::invalid_argument naming the bad value and what is allowed; a tensor of
  /// more than kMaxTensorElems elements (or whose count would wrap) is refused with its sizes.
  /// `who` (a stage name) is put in front of the message.
  void validate(const std::string& who = "problem") const;

  /// The softmax scale actually used: `scale`, or 1/sqrt(head_dim) when scale is 0.
  float softmax_scale() const;

  /// Number of query heads that share one kv head.
  int group_size() const { return heads / kv_heads; }
  /// The kv head read by query head `h`.
  int kv_head_of(int h) const { return h / group_size(); }

  /// Bottom-right causal alignment: query row i sees keys j < visible_keys(i).
  /// Equals seq_k when not causal; 0 for a row that sees nothing.
  int64_t visible_keys(int64_t i) const {
    if (!causal) return seq_k;
    const int64_t end = i + int64_t(seq_k) - int64_t(seq_q) + 1;
    return end < 0 ? 0 : (end > seq_k ? seq_k : end);
  }

  int64_t q_elems() const { return int64_t(batch) * heads * seq_q * head_dim; }
  int64_t kv_elems() const { return int64_t(batch) * kv_heads * seq_k * head_dim; }
  int64_t l_elems() const { return int64_t(batch) * heads * seq_q; }

  /// Offset of row `row` of head `h` in batch `b` of a Q/O-shaped tensor.
  int64_t q_offset(int b, int h, int64_t row) const {
    return ((int64_t(b) * heads + h) * seq_q + row) * head_dim;
  }
  /// Offset of row `row` of kv head `hk` in batch `b` of a K/V-shaped tensor.
  int64_t kv_offset(int b, int hk, int64_t row) const {
    return ((int64_t(b) * kv_heads + hk) * seq_k + row) * head_dim;
  }
  /// Offset of row `row` of head `h` in batch `b` of an L/D-shaped tensor.
  int64_t l_offset(int b, int h, int64_t row) const {
    return (int64_t(b) * heads + h) * seq_q + row;
  }

  /// Forward FLOPs by the papers' convention: 4·batch·heads·N_q·N_k·d, halved when
  /// causal and N_q == N_k. Backward is 2.5× this.
  double forward_flops() const;

  /// One line such as "batch=1 heads=8 kv_heads=2 seq_q=300 seq_k=77 d=64 causal".
  std::string describe() const;
};

/// Refuses a null host buffer where `p` has elements for it (std::invalid_argument,
/// "<who>: Q is a null pointer (N elements expected)"): the forward's Q, K, V, O, L.
void require_forward_buffers(const std::string& who, const Problem& p, const float* Q, const float* K,
                             const float* V, const float* O, const float* L);
/// The same for the backward's ten: Q, K, V, O, L, dO, dQ, dK, dV.
void require_backward_buffers(const std::string& who, const Problem& p, const float* Q, const float* K,
                              const float* V, const float* O, const float* L, const float* dO, const float* dQ,
                              const float* dK, const float* dV);

}  // namespace fa
