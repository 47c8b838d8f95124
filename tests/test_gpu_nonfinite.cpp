// The GPU stages' documented exception to the NaN rule (README.md, "NaN and infinity"), on
// every GPU stage of the stage list: a non-finite K or V of a key the causal mask hides from a
// row may reach the row only through a key tile the row visits. Rows that never visit the
// tile of a bad key must come out finite (O, L, and dQ where the stage has a backward), and a
// row that sees the bad key must come out NaN, as in the reference. The rows in between, which
// share a key tile with the bad key without seeing it, are the exception and are not checked.
//
// Every GPU stage's key tiles hold at most 256 keys, so with the bad keys at 300 and 511 of
// 512 (causal, seq_q = seq_k), rows 0 … 255 never visit their tiles.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "problem.h"
#include "stage_checks.h"
#include "stage_list.h"
#include "tensors.h"

#ifdef FA_HAVE_CUDA
#include <cuda_runtime.h>

namespace {

// Stages 10 and up are built for compute capability 9.x only.
bool runs_here(const fa::StageInfo& s) {
  if (s.name.compare(0, 2, "10") < 0) return true;
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major != 9) MESSAGE("skipped " << s.name << ": it needs compute capability 9.x");
  return major == 9;
}

bool row_finite(const std::vector<float>& a, int64_t offset, int n) {
  for (int c = 0; c < n; ++c)
    if (!std::isfinite(a[size_t(offset + c)])) return false;
  return true;
}

}  // namespace

TEST_CASE("GPU stages: a non-finite hidden key reaches only the rows that visit its key tile") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int stages = 0;
  for (const fa::StageInfo& s : fa::all_stages()) {
    if (!s.is_gpu || !runs_here(s)) continue;
    ++stages;
    const fa::Dtype t = s.dtypes.front();
    const int d = s.head_dims.front();
    const bool backward = bool(s.backward);
    const fa::Problem p = fa::test::make_problem(1, 2, 1, 512, 512, d, true);
    fa::Tensors x = fa::Tensors::make(p, 31, fa::Dist::Normal, backward);
    x.V[size_t(p.kv_offset(0, 0, 511) + 3)] = nan;  // seen by row 511 only
    x.K[size_t(p.kv_offset(0, 0, 300) + 1)] = nan;  // seen by rows 300 … 511
    x.poison_outputs();
    s.forward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data());
    if (backward)
      s.backward(p, t, x.Q.data(), x.K.data(), x.V.data(), x.O.data(), x.L.data(), x.dO.data(), x.dQ.data(),
                 x.dK.data(), x.dV.data());
    CAPTURE(s.name);
    for (int h = 0; h < p.heads; ++h) {
      for (int64_t i = 0; i < 256; ++i) {
        INFO("head " << h << " row " << i);
        CHECK(row_finite(x.O, p.q_offset(0, h, i), d));
        CHECK(std::isfinite(x.L[size_t(p.l_offset(0, h, i))]));
        if (backward) CHECK(row_finite(x.dQ, p.q_offset(0, h, i), d));
      }
      CHECK(std::isnan(x.O[size_t(p.q_offset(0, h, 511) + 3)]));  // V's NaN, seen
      CHECK(std::isnan(x.L[size_t(p.l_offset(0, h, 400))]));      // K's NaN, seen: its logit is NaN
    }
  }
  MESSAGE(stages << " GPU stages checked");
}

#endif  // FA_HAVE_CUDA
