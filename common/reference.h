/// \file reference.h
/// \brief The one reference: exact softmax attention in Eigen, forward and backward.
///
/// Every stage is checked against this. It materialises S and P one block of query rows
/// at a time (so memory stays bounded) and is written for clarity, not speed.
#pragma once

#include <cstdint>
#include <vector>

#include "problem.h"

namespace fa {

/// The arithmetic the reference is evaluated in.
///  - Exact: double precision everywhere. This is "the truth" a stage is compared with.
///  - F32: a plain single-precision evaluation (same formulas, float arithmetic, Eigen's
///    blocked matrix products). Its distance from Exact is part of the error budget of fp32
///    stages (see compare.h).
///  - F32InOrder: the same, with every sum taken one term after another in index order, as
///    a plain loop adds (`for c: dot += q[c]·k[c]`). Recursive summation has the largest
///    error bound of all orders (γ_{n−1}·Σ|terms| against γ_{⌈log₂n⌉}·Σ|terms| for pairwise),
///    so an fp32 stage is held to the worse of F32 and F32InOrder (compare.h). dK and dV of a
///    kv head are one sum over every row of every query head of its GQA group, as a plain loop
///    over the group adds them (group_size·N_q terms, not a sum per head added to them).
///    D = rowsum(dO∘O) runs from the last column to the first, against dP = dO Vᵀ from the
///    first, so that dP − D, which cancels where one key takes a row's whole weight, keeps
///    the difference of two orders' roundings that a stage's product and row sum leave.
///  - F16 / BF16: double arithmetic on inputs rounded to the type, with P (and dS, and O
///    before D) rounded to the type before they enter a matrix product, as a tensor-core
///    kernel does. Its distance from Exact is the error budget of fp16/bf16 stages.
///  - F32Merged: F32, with each row's keys split in `merged_parts` runs whose partial results
///    (O, L) are merged one after another by the log-sum-exp rule in fp32, as a ring of ranks
///    (stage 12) folds its pairs' results into a row's. Every merge rounds L: after one it is
///    off by up to about one ulp (the other modes round the exact L: half an ulp), after k − 1
///    by more, and a backward recomputes every P of the row from it: at logits in the
///    hundreds that is most of such a stage's error, and a large term of dK or dV carries it
///    at any logits.
enum class RefMode { Exact, F32, F32InOrder, F32Merged, F16, BF16 };

/// Reference outputs, in double. Tensors have the layouts of docs/design.md §3.
struct Reference {
  std::vector<double> O, L;       ///< [b][h][N_q][d], [b][h][N_q] (L = −inf on empty rows)
  std::vector<double> P;          ///< [b][h][N_q][N_k], only when asked for
  std::vector<double> m, l;       ///< row max and row sum of exp(S − m): [b][h][N_q]
  std::vector<double> D;          ///< rowsum(dO∘O) [b][h][N_q] (backward only)
  std::vector<double> dQ, dK, dV; ///< gradients (backward only)
};

/// Forward: O = softmax(scale·QKᵀ + mask)·V, L = m + log(l) per row.
/// If `want_P`, also stores the probabilities (size batch·heads·N_q·N_k: small problems only).
/// `merged_parts`: the runs of keys F32Merged merges (no other mode reads it).
Reference reference_forward(const Problem& p, const float* Q, const float* K, const float* V,
                            RefMode mode = RefMode::Exact, bool want_P = false, int merged_parts = 2);

/// Forward and backward for the loss whose gradient with respect to O is dO.
/// GQA: dK and dV of a kv head sum the contributions of every query head in its group.
/// `L_given` (F32Merged only; [b][h][N_q] fp32): the L of the stage under test, used for the
/// merged weights e^{L_t − L} of every row where it is finite, in place of the L this
/// baseline's own merges give. A merging stage's backward recomputes every P of a row from
/// the L it was handed, so the rounding of that L (judged by the forward's check) reaches a
/// large term of dK or dV; this baseline then carries the same rounding in the same rows,
/// where its own merges put theirs elsewhere (compare_backward takes both).
Reference reference_backward(const Problem& p, const float* Q, const float* K, const float* V,
                             const float* dO, RefMode mode = RefMode::Exact, int merged_parts = 2,
                             const float* L_given = nullptr);

/// The reference mode of the plain same-precision evaluation for a stage computing in `t`
/// (F32, F16 or BF16).
RefMode baseline_mode(Dtype t);

/// Every reference mode whose error budget applies to a stage computing in `t`: F32 and
/// F32InOrder for f32, and F32Merged too for a stage that merges a row's result from
/// `merged_parts` ≥ 2 partial results; F16 or BF16 alone for the 16-bit types (their inputs'
/// rounding, not the order of fp32 sums, sets their budget).
std::vector<RefMode> baseline_modes(Dtype t, int merged_parts = 0);

}  // namespace fa
