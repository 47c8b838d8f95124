/// \file two_pass_online.h
/// \brief Stage 04: the online normaliser — max and sum in one pass, then the output.
#pragma once

#include "problem.h"
#include "stage.h"

namespace fa::stage04 {

/// Same result as stage 03 with two passes over the keys per row. `row_max` / `row_sum`
/// (optional, [b][h][N_q]) receive the final m_i and l_i.
void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L,
             float* row_max = nullptr, float* row_sum = nullptr);

StageInfo info();

}  // namespace fa::stage04
