/// \file check.h
/// \brief Running a stage and checking its outputs against the reference.
#pragma once

#include <string>
#include <vector>

#include "compare.h"
#include "stage.h"
#include "tensors.h"

namespace fa {

/// The comparisons of one run (O and L for a forward; dQ, dK, dV too for a backward).
struct CheckReport {
  std::vector<Comparison> items;
  bool pass() const;
  /// One line per compared tensor.
  std::string summary() const;
  /// The comparison named `name` ("O", "L", "dQ", ...); throws if absent.
  const Comparison& at(const std::string& name) const;
};

/// Compares t.O and t.L (already computed) with the exact reference, using the tolerance
/// of `dtype` (compare.h). Only the first `p.batch` batches of `t` are looked at.
/// `merged_parts` ≥ 2: the stage merges a row's result from that many partial results
/// (StageInfo::merged_parts), which adds a baseline that merges as many.
CheckReport compare_forward(const Problem& p, Dtype dtype, const Tensors& t, int merged_parts = 0);

/// Compares t.dQ, t.dK, t.dV (already computed from t.dO) with the exact reference.
CheckReport compare_backward(const Problem& p, Dtype dtype, const Tensors& t, int merged_parts = 0);

/// StageInfo::merged_parts for `p`, or 0 for a stage that merges nothing.
int merged_parts_of(const StageInfo& stage, const Problem& p);

/// Poisons t's outputs, runs `stage`'s forward on t's inputs, and compares.
CheckReport check_forward(const StageInfo& stage, const Problem& p, Dtype dtype, Tensors& t);

/// Poisons t's outputs, runs the stage's forward then backward, and compares the gradients
/// (and O, L).
CheckReport check_backward(const StageInfo& stage, const Problem& p, Dtype dtype, Tensors& t);

}  // namespace fa
