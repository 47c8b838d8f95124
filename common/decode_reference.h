/// \file decode_reference.h
/// \brief The reference of the decoding problem (stage 14), and the check of a decode
/// step's outputs against it.
///
/// Decoding is attention with seq_q = q_len and seq_k = cache_seqlens[b], bottom-right
/// causal, one sequence at a time: each sequence's keys are gathered out of the cache
/// (contiguous or paged) and the one reference (reference.h) runs on them. The tolerance is
/// the project's (compare.h): twice the error of the same-precision baselines, plus a floor.
#pragma once

#include <vector>

#include "check.h"
#include "decode_problem.h"
#include "reference.h"

namespace fa {

/// O [batch][heads][q_len][d] and L [batch][heads][q_len] in double (L = −inf on a row that
/// sees no key), evaluated in `mode`.
struct DecodeReference {
  std::vector<double> O, L;
};
DecodeReference decode_reference(const DecodeProblem& p, const float* Q, const float* K_cache,
                                 const float* V_cache, const int* block_table, RefMode mode = RefMode::Exact);

/// Compares O and L (a decode step's outputs, in fp32 on the host) with the exact reference
/// of t's inputs, with the tolerance of a stage computing in `dtype`.
CheckReport check_decode(const DecodeProblem& p, Dtype dtype, const DecodeTensors& t, const float* O,
                         const float* L);

}  // namespace fa
