/// \file prep.h
/// \brief The backward's preprocess (D, L2 per query row) and its last step (dQ from the
/// fp32 accumulator), launched around the main kernel. Plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "problem.h"

namespace fa::stage11 {

struct PrepParams {
  const void* O;     ///< [heads_total][seq_q][d], the input dtype
  const void* dO;
  const float* L;    ///< [heads_total][seq_q], natural log
  float* L2;         ///< [heads_total][n_q_pad] (out)
  float* D;          ///< [heads_total][n_q_pad] (out)
  float* dQ_accum;   ///< [heads_total][n_q_pad][d]: zeroed by the preprocess, read by the conversion
  void* dQ;          ///< [heads_total][seq_q][d] (out), the input dtype
  int64_t heads_total;  ///< batch·heads
  int seq_q, n_q_pad;
  float scale;
  bool blocked_dq;  ///< dQ_accum in [64, 64] blocks (step 11d, dq_layout.h) instead of row-major
};

void launch_preprocess(const PrepParams& p, Dtype dtype, int d, cudaStream_t stream);
void launch_convert_dq(const PrepParams& p, Dtype dtype, int d, cudaStream_t stream);

}  // namespace fa::stage11
