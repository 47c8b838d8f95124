/// \file safe_softmax.h
/// \brief Stage 02: standard attention with the max-subtracted ("safe") softmax.
#pragma once

#include "problem.h"
#include "stage.h"

namespace fa::stage02 {

/// O = softmax(scale·Q Kᵀ) V with softmax(x)_j = e^{x_j − m} / Σ_k e^{x_k − m}, m = max_k x_k;
/// L = m + log Σ_k e^{x_k − m}. Still materialises S and P ([N_q, N_k] per head).
void forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* L);

StageInfo info();

}  // namespace fa::stage02
