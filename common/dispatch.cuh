/// \file dispatch.cuh
/// \brief Host-side helpers of the GPU stages that turn a run-time choice (a dtype, a
/// variant) into a template argument, so that one generic lambda launches the kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "problem.h"

namespace fa {

/// A type passed as a value, so that a generic lambda can receive a type (a kernel's
/// traits): the caller passes a TypeTag of it, and the lambda takes the type back from the
/// tag's member `type`.
template <class T>
struct TypeTag {
  using type = T;
};

/// Calls fn(__nv_bfloat16{}) for Dtype::BF16 and fn(__half{}) otherwise: the element type
/// of a tensor-core stage, which has refused every other dtype before it dispatches.
template <class Fn>
void with_dtype(Dtype t, Fn&& fn) {
  if (t == Dtype::BF16)
    fn(__nv_bfloat16{});
  else
    fn(__half{});
}

}  // namespace fa
