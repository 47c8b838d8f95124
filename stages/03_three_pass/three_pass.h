/// \file three_pass.h
/// \brief Stage 03: stream each query row in three passes over the keys; no N×N buffer.
#pragma once

#include "problem.h"
#include "stage.h"

namespace fa::stage03 {

/// Same result as stage 02, with two floats (m_i, l_i) per row in progress instead of S and P.
/// If `row_max` / `row_sum` are given ([b][h][N_q] like L), they receive m_i and
/// l_i = Σ_j e^{S_ij − m_i} (−inf and 0 for a row that sees no key).
void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L,
             float* row_max = nullptr, float* row_sum = nullptr);

StageInfo info();

}  // namespace fa::stage03
