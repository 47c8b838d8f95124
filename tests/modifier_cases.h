/// \file modifier_cases.h
/// \brief Stage 13's test inputs shared by its CPU and GPU tests: documents from their
/// lengths, and one sink logit per head.
#pragma once

#include <cstdint>
#include <vector>

#include "modifiers.h"

namespace fa::test {

/// Documents of the given query and key lengths, packed in order (cu_seqlens from 0).
inline Modifiers documents(const std::vector<int64_t>& q_lens, const std::vector<int64_t>& k_lens) {
  Modifiers m;
  m.cu_seqlens_q = cu_seqlens_of(q_lens, "test");
  m.cu_seqlens_k = cu_seqlens_of(k_lens, "test");
  return m;
}

/// One sink logit per head, different for each: 0.7·h − 1.
inline std::vector<float> sink_logits(int heads) {
  std::vector<float> s;
  for (int h = 0; h < heads; ++h) s.push_back(0.7f * float(h) - 1.0f);
  return s;
}

}  // namespace fa::test
