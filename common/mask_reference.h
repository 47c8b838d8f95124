/// \file mask_reference.h
/// \brief The reference of stage 13: exact attention under the modifiers of modifiers.h
/// (window, documents, ALiBi, soft-cap, sinks), forward and backward, in Eigen.
///
/// It follows the definitions in modifiers.h element by element (mask_keeps() decides each
/// (row, key) from the document boundaries and the window, with no tiles and no intervals),
/// so that a stage that reasons about tiles is checked against one that does not.
#pragma once

#include <cstdint>
#include <vector>

#include "check.h"
#include "modifiers.h"
#include "reference.h"
#include "tensors.h"

namespace fa {

/// The reference's outputs: those of reference.h, and the sinks' gradient.
struct MaskedReference : Reference {
  std::vector<double> dsinks;  ///< dσ_h = −Σ_{b, rows} e^{σ_h − L_i}·D_i, [heads] (backward with sinks)
};

/// Whether row `row` sees key `col` (both indices into the packed sequence), by the
/// definition of modifiers.h.
bool mask_keeps(const Problem& p, const Modifiers& m, int64_t row, int64_t col);

/// The key on row `row`'s diagonal, in packed key indices (cu_seqlens_k[doc] + i + n_k − n_q);
/// ALiBi adds slope·(col − diagonal_key(row)).
int64_t diagonal_key(const Problem& p, const Modifiers& m, int64_t row);

/// Forward under the modifiers. `mode` is RefMode::Exact (double) or RefMode::F32 (the same
/// formulas in float: the same-precision baseline whose error sets a stage's budget).
MaskedReference reference_forward_masked(const Problem& p, const Modifiers& m, const float* Q, const float* K,
                                         const float* V, RefMode mode = RefMode::Exact);

/// Forward and backward under the modifiers: dQ, dK, dV, D and (with sinks) dsinks.
/// Soft-capping's derivative enters dS: ∂(cap·tanh(s/cap))/∂s = 1 − tanh²(s/cap).
MaskedReference reference_backward_masked(const Problem& p, const Modifiers& m, const float* Q, const float* K,
                                          const float* V, const float* dO, RefMode mode = RefMode::Exact);

/// Compares t.O, t.L (and with `backward` t.dQ, t.dK, t.dV, and `dsinks` when m has sinks
/// and it is not null) with the exact masked reference, each allowed twice the error of the
/// F32 mode plus the floor (compare.h's policy, with the F32 baseline).
CheckReport compare_masked(const Problem& p, const Modifiers& m, const Tensors& t, bool backward,
                           const float* dsinks = nullptr);

}  // namespace fa
