/// \file modifiers.h
/// \brief What changes one attention into another (stage 13): a sliding window, documents
/// packed into one sequence (`cu_seqlens`), ALiBi, logit soft-capping, attention sinks.
///
/// The definitions every implementation follows (docs/design.md §3 for the rest). Indices
/// are those of one document: a row i of a document of n_q queries and n_k keys has its
/// diagonal at key `i + n_k − n_q` (the bottom-right alignment of the causal mask).
///  - mask: the row sees key j of its own document iff
///      j ≤ diag (causal),  j ≥ diag − window_left,  j ≤ diag + window_right
///    (a window side left out is unbounded). Keys of other documents are never seen; rows
///    past the last document see nothing (O = 0, L = −∞ without sinks).
///  - scores: s = scale·q·k;  s ← cap·tanh(s / cap) (softcap > 0);  s ← s + slope_h·(j − diag)
///    (ALiBi: a key k places behind the diagonal loses slope_h·k).
///  - sinks: a logit σ_h per head added to every row's softmax denominator, with no value:
///      P_ij = e^{s_ij} / (e^{σ_h} + Σ_j e^{s_ij}),   L_i = log(e^{σ_h} + Σ_j e^{s_ij}).
///    A row that sees no key has O = 0 and L = σ_h. Sinks are learnable: the backward
///    returns dσ_h = −Σ_rows P_sink·D_i with P_sink = e^{σ_h − L_i}.
/// Validation refuses what cannot be meant, before any work (the message names the value).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "problem.h"

namespace fa {

struct Modifiers {
  std::optional<int64_t> window_left, window_right;  ///< keys before / after the diagonal; none: unbounded
  double softcap = 0;                  ///< cap of cap·tanh(s/cap); 0: off
  std::vector<float> alibi_slopes;     ///< one per query head, or empty: no ALiBi
  std::vector<float> sinks;            ///< one logit per query head, or empty: no sinks
  /// Document boundaries in the packed rows and keys (documents + 1 entries each, from 0,
  /// non-decreasing, last ≤ seq_q or seq_k), or both empty: one document, the whole sequence.
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_k;

  bool has_window() const { return window_left.has_value() || window_right.has_value(); }
  bool has_documents() const { return !cu_seqlens_q.empty(); }
  int64_t documents() const { return has_documents() ? int64_t(cu_seqlens_q.size()) - 1 : 1; }
  /// The longest document's queries and keys (max_seqlen_q, max_seqlen_k).
  int64_t max_seqlen_q(const Problem& p) const;
  int64_t max_seqlen_k(const Problem& p) const;

  /// Throws std::invalid_argument naming `who`, the value and what is allowed: a negative
  /// window, softcap < 0, not finite or, when > 0, outside float's normal range (the kernels
  /// compute in float), slopes or sinks whose length is not `heads`, a
  /// non-finite slope, cu_seqlens not starting at 0, decreasing, ending past the tensor, of
  /// unequal document counts, or given with batch ≠ 1 (documents are packed into one row).
  void validate(const Problem& p, const std::string& who) const;

  /// One line: "window=(128,0) softcap=30 alibi sinks documents=3".
  std::string describe() const;
};

/// The usual ALiBi slopes: 2^(−8(h+1)/H) for h = 0 … H−1 (H a power of two; otherwise the
/// series of the next power of two below, then every other slope of the one above, as in
/// the ALiBi paper's code).
std::vector<float> alibi_slopes(int heads);

/// cu_seqlens of documents of these lengths: {0, l0, l0 + l1, …}. Throws on a negative length.
std::vector<int64_t> cu_seqlens_of(const std::vector<int64_t>& lengths, const std::string& who);

}  // namespace fa
