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
/// lands from the exact (double) reference on the very same inputs — the modes of
/// reference.h that baseline_modes() names — and allows the stage twice that, plus a small
/// floor:
///
///     tolerance = kBaselineFactor · max over baselines of max|baseline − exact|
///                 + kFloorUlps · u · max(1, max|exact|)
///
/// An fp32 stage has two baselines, because the order of a sum decides its rounding: F32
/// (Eigen's blocked products, which cut a long sum into panels and add the panels' partial
/// sums) and F32InOrder (every sum one term after another, as the plain loops of stages
/// 01–05 add, and as stage 06 adds dK and dV over a GQA group's rows in a tile that crosses
/// the diagonal: one sum of group_size·N_q terms). The error bound of a sum of n terms is
/// γ_{n−1}·Σ|terms| in index order and smaller for any order that splits the sum
/// (γ_{⌈log₂n⌉}·Σ|terms| pairwise), with
/// γ_k = k·u/(1 − k·u): index order is the worst case. Up to d = 512 the two baselines give
/// the same budget; at d = 1024 and 2048 the in-order one sets a budget 1.6 and 2.3 times
/// larger on average (stage 05's problem of N = 64, 10 seeds), and a budget from the blocked
/// one alone failed 11 and 9 of 20 seeds of the correct stages 01 and 05 at d = 2048. The
/// worse of the two holds for any order a stage may use. A stage that merges a row's result
/// from k partial (O, L) (StageInfo::merged_parts) adds a third, F32Merged, merging k runs of
/// keys one after another: the merges' own rounding of L.
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

/// max |baseline − exact| over the entries where `exact` is finite.
double baseline_error(const std::vector<double>& exact, const std::vector<double>& baseline);

/// The allowed max-abs error for a tensor whose exact value is `exact`, given the largest
/// error of its same-precision baselines: kBaselineFactor · base_err + the floor.
double tolerance(const std::vector<double>& exact, double base_err, Dtype t);

/// The same with one baseline: tolerance(exact, baseline_error(exact, baseline), t).
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
