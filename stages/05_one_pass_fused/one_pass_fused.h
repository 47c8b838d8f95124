/// \file one_pass_fused.h
/// \brief Stage 05: one pass over K and V per row — online softmax with output rescaling.
#pragma once

#include "problem.h"
#include "stage.h"

namespace fa::stage05 {

/// Same result as stage 04 with a single pass over the keys per row; writes O and L.
/// `row_max` / `row_sum` (optional, [b][h][N_q]) receive the final m_i and l_i.
void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L,
             float* row_max = nullptr, float* row_sum = nullptr);

StageInfo info();

}  // namespace fa::stage05
