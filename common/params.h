/// \file params.h
/// \brief The problem sizes a kernel's parameter struct copies from the Problem.
///
/// Stages 09, 10 and 11 each pass their kernels one struct of parameters (stage 09's and
/// stage 11's BwdParams, hopper::FwdParams) with the same five size fields; the launcher
/// fills them here, then the fields only its stage has.
#pragma once

#include "problem.h"

namespace fa {

/// params.batch, .heads, .kv_heads, .seq_q, .seq_k ← p's.
template <class Params>
void set_problem_sizes(Params& params, const Problem& p) {
  params.batch = p.batch;
  params.heads = p.heads;
  params.kv_heads = p.kv_heads;
  params.seq_q = p.seq_q;
  params.seq_k = p.seq_k;
}

}  // namespace fa
