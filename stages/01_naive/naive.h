/// \file naive.h
/// \brief Stage 01: standard attention, exactly as the formula reads.
#pragma once

#include "problem.h"
#include "stage.h"

namespace fa::stage01 {

/// O = softmax(scale·Q Kᵀ) V with softmax(x)_j = e^{x_j} / Σ_k e^{x_k}; L = log Σ_k e^{x_k}.
/// Materialises S and P ([N_q, N_k] per head). Overflows (inf/inf = NaN) once a logit
/// exceeds about 88.7, the log of the largest float.
void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L);

StageInfo info();

}  // namespace fa::stage01
