/// \file stage_checks.h
/// \brief The shared test matrix (docs/design.md §6) and the checks every stage must pass.
///
/// Each stage's test program calls these with its StageInfo, so no stage can pass on the
/// easy shapes only. Failures are reported through doctest with the problem, the seed and
/// the worst element (b, h, row, col), so they can be replayed with the stage program.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "stage.h"

// A C string that starts an INFO() message prints as text: doctest 2.4.9 prints a pointer
// (its own switch for this, DOCTEST_CONFIG_TREAT_CHAR_STAR_AS_STRING, does not compile).
#if DOCTEST_VERSION <= 20409
namespace doctest {
template <>
struct StringMaker<const char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
template <>
struct StringMaker<char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
}  // namespace doctest
#endif

namespace fa::test {

/// The shapes of docs/design.md §6 for a stage: lengths 1, 2, 17, 64, 97, 128, 255, 1025;
/// seq_q ≠ seq_k (1×512, 300×77, 77×300); every head dim in `head_dims` (CPU stages:
/// 16, 32, 40, 64, 80, 96, 128); causal and not; heads = kv_heads and GQA (8 over 2).
std::vector<Problem> shape_matrix(const std::vector<int>& head_dims);

/// The head dims a stage is tested on: its own list, or the CPU list when it takes any.
std::vector<int> tested_head_dims(const StageInfo& s);

/// Runs the forward over the whole matrix in `dtype`, checking O and L against the
/// reference with the tolerance policy. (`with_backward`: also dQ, dK, dV.)
void check_matrix(const StageInfo& s, Dtype dtype, bool with_backward);

/// Adversarial inputs: logits in the hundreds (must match, or must overflow for stage
/// 01), rows that see no key (O = 0, L = −inf), constant rows, NaN in a Q row and in a K
/// row (NaN reaches exactly the rows it should).
void check_adversarial(const StageInfo& s, Dtype dtype, bool with_backward);

/// Non-finite inputs under a mask (README, "NaN and infinity"): a row's outputs depend only
/// on the keys it sees, so NaN or inf in K or V of a key a row does not see never reaches it
/// (nor that key's dK, dV from that row); a row whose every logit is −inf has O = 0, L = −inf;
/// a leading −inf logit takes no weight. Stage and reference must agree element by element.
void check_nonfinite_semantics(const StageInfo& s, Dtype dtype, bool with_backward);

/// Properties: key-permutation invariance (non-causal), bitwise determinism of two runs.
void check_properties(const StageInfo& s, Dtype dtype, bool with_backward);

/// Bad input: invalid problems and unsupported head dims are refused with a message that
/// names the value (std::invalid_argument); nothing is written.
void check_refusals(const StageInfo& s, Dtype dtype);

/// Random shapes from a printed seed (FA_TEST_SEED overrides it), so a failure replays.
void check_random_shapes(const StageInfo& s, Dtype dtype, bool with_backward, int count);

/// A forward that also returns the per-row max m and sum l (stages 03–05).
using RowStatsForward = void (*)(const Problem&, const float* Q, const float* K, const float* V,
                                 float* O, float* L, float* row_max, float* row_sum);

/// The per-row m and l of `forward` against the reference's, with the fp32 tolerance,
/// causal and not, on normal and large-logit inputs.
void check_row_stats(RowStatsForward forward);

/// A problem from its sizes (batch, heads, kv_heads, seq_q, seq_k, head_dim, causal).
Problem make_problem(int batch, int heads, int kv_heads, int seq_q, int seq_k, int d, bool causal);

/// True when the environment variable `name` is set to anything but "" or "0"
/// (e.g. FA_TEST_SMALL=1, FA_TEST_LARGE=1).
bool env_flag(const char* name);
/// FA_TEST_SMALL=1: the matrix shrinks for compute-sanitizer runs.
bool small_mode();
/// Same size and the same bits (NaN included).
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);

#ifdef FA_HAVE_CUDA
/// Checks rows [r0, r0 + n) of a forward already computed on the device (Q, O in `dtype`,
/// L fp32, one head: batch = heads = 1) against the reference, on a sub-problem with the
/// same keys: under the bottom-right mask those rows see what the n rows of a problem with
/// n + r0 + N_k − N_q keys see. `K`, `V` are the host copies of the (small) key tensors.
/// Lets a problem of more than 2^31 elements be checked without a CPU reference of it all.
void check_row_window(const Problem& p, Dtype dtype, int64_t r0, int n, const std::vector<float>& K,
                      const std::vector<float>& V, const void* Q_dev, const void* O_dev,
                      const float* L_dev);
#endif

/// Runs forward (and backward) and asserts the report passes, printing it otherwise.
CheckReport expect_pass(const StageInfo& s, const Problem& p, Dtype dtype, uint64_t seed,
                        Dist dist, bool with_backward);

}  // namespace fa::test
