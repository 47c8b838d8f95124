/// \file compare.h
/// \brief Comparing a stage's output with the reference, and the tolerance policy.
///
/// ## Tolerance policy (the one place the numbers live)
///
/// A stage may not be held to "bitwise equal to double precision": it computes in fp32
/// (stages 01–07) or with fp16/bf16 operands (08–09), and different but correct orders of
/// summation give different roundings. Nor may it be held to a magic number such as 1e-3,
/// which is loose for a 16-element dot product and tight for a 4096-element one.
///
/// Instead, each check measures how far a *plain* implementation in the same precision
/// lands from the exact (double) reference on the very same inputs — the F32, F16 or
/// BF16 mode of reference.h — and allows the stage twice that, plus a small floor:
///
///     tolerance = kBaselineFactor · max|baseline − exact| + kFloorUlps · u · max(1, max|exact|)
///
/// where u is the unit roundoff of the stage's type (2⁻²⁴ for fp32, 2⁻¹¹ for fp16, 2⁻⁸ for
/// bf16). The factor 2 is FlashAttention's own rule: a fused kernel may reorder sums and
/// rescale partial results, which costs at most about as much rounding again as the plain
/// evaluation. The floor covers problems where the baseline happens to be exact (one key:
/// O = V) while a stage's rescaling still rounds once or twice; it is a few units in the
/// last place of the largest value, so it cannot hide a wrong result.
///
/// Non-finite values are compared by class, never by value: wherever the reference is
/// finite the stage must be finite (NaN never passes), and where the reference is NaN or
/// ±inf (a NaN input row, L = −inf on a row that sees no key) the stage must give the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

namespace fa {

inline constexpr double kBaselineFactor = 2.0;
inline constexpr double kFloorUlps = 8.0;

/// Unit roundoff of a type: 2⁻²⁴ (f32), 2⁻¹¹ (f16), 2⁻⁸ (bf16).
double unit_roundoff(Dtype t);

/// The allowed max-abs error for a tensor whose exact value is `exact` and whose
/// same-precision baseline is `baseline`.
double tolerance(const std::vector<double>& exact, const std::vector<double>& baseline, Dtype t);

/// The shape used to name an element: [batch][heads][rows][cols].
struct Shape4 {
  int64_t batch, heads, rows, cols;
};

/// How one output tensor compares with its reference.
struct Comparison {
  std::string name;      ///< "O", "L", "dQ", ...
  double max_abs = 0;    ///< max |got − ref| over finite reference entries
  double max_rel = 0;    ///< max |got − ref| / |ref| over entries with ref ≠ 0
  double rel_fro = 0;    ///< ‖got − ref‖₂ / ‖ref‖₂ over finite entries
  int64_t worst = -1;    ///< flat index of the max-abs error (or of the first non-finite mismatch)
  int64_t b = 0, h = 0, row = 0, col = 0;  ///< `worst` as (batch, head, row, col)
  double got_at_worst = 0, ref_at_worst = 0;
  int64_t nonfinite_mismatch = 0;  ///< entries whose finiteness class differs from the reference
  int64_t count = 0;               ///< entries compared
  double tol = 0;                  ///< allowed max_abs
  bool pass = false;

  /// One line: "O max_abs=… (tol …) rel_fro=… worst (b,h,row,col)=(…) got … ref … PASS".
  std::string summary() const;
};

/// Compares `count` entries of `got` with `ref`; `shape` names the worst element.
Comparison compare(const std::string& name, const float* got, const std::vector<double>& ref,
                   Shape4 shape, double tol);

}  // namespace fa
