/// \file tensor_map.h
/// \brief Host side of TMA: the tensor maps (CUtensorMap) that describe Q, K and V to
/// the copy engine.
///
/// A tensor map is a 128-byte descriptor made on the host and passed to the kernel by
/// value (a __grid_constant__ parameter). The maps of stages 10 and 11 are 3-D, innermost first:
///     (d, seq, batch·heads)   strides (2·d bytes, 2·d·seq bytes)
/// with a box of [rows, 64] elements: 64 columns = 128 bytes, the widest box the 128-byte
/// swizzle takes, so a [rows, d] tile is d/64 boxes. Because the heads are the third
/// dimension, a box never crosses from one head into the next: rows past seq are read as
/// zeros, so no tail needs padding by the caller.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "problem.h"

namespace fa::hopper {

/// A map of a [heads_total][seq][d] tensor of 16-bit `dtype` at `base` with boxes of
/// [box_rows, 64], 128-byte swizzle. Throws std::runtime_error naming the stage `who` and
/// the tensor `what` when the driver refuses it. Stage 11 makes its maps with it too.
CUtensorMap make_tensor_map(const void* base, Dtype dtype, int d, int seq, int64_t heads_total, int box_rows,
                            const char* who, const char* what);

}  // namespace fa::hopper
