// The tour: every stage in the list, on one default problem, in one table, then the two
// stages that are not in the list (their problems are not `Problem`'s): stage 13's CPU step
// under a mask of its own (causal, a sliding window) against the masked reference, and
// stage 14's CPU split-KV step decoding one token of each sequence against the problem's
// length of cache. Stages this machine cannot run (GPU stages without a GPU) say so instead
// of vanishing. --dist large shows stage 01 overflowing (its expected failure); --backward
// adds a row for every stage that has a backward pass.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "decode.h"
#include "decode_reference.h"
#include "driver.h"
#include "errors.h"
#include "mask_reference.h"
#include "masks.h"
#include "stage_list.h"
#include "timing.h"

namespace {

void print_row(const std::string& name, fa::Dtype t, double max_abs, double tol, bool pass,
               double secs, double flops, const std::string& note) {
  char speed_s[32];
  std::snprintf(speed_s, sizeof speed_s, "%.2f GF/s", flops / secs / 1e9);
  std::printf("%-22s %-5s %-12.3e %-12.3e %-6s %10.2f %12s  %s\n", name.c_str(),
              fa::dtype_name(t), max_abs, tol, pass ? "PASS" : "FAIL", secs * 1e3, speed_s,
              note.c_str());
}

// Stage 13's row (and its bwd row): the tour's problem, bottom-right causal with a sliding
// window of a quarter of the keys, so that the block mask skips whole tiles. The speed counts
// the visible (row, key) pairs only.
bool masks_rows(const fa::Problem& tour_problem, fa::Tensors& tensors, bool backward) {
  namespace s13 = fa::stage13;
  fa::Problem p = tour_problem;
  p.causal = true;
  fa::Modifiers m;
  m.window_left = std::max<int64_t>(1, p.seq_k / 4);
  m.window_right = 0;  // what causal implies, so that the note reads "window=(N/4,0)"
  m.validate(p, "tour");
  int64_t visible = 0;
  for (int64_t row = 0; row < p.seq_q; ++row)
    for (int64_t col = 0; col < p.seq_k; ++col) visible += fa::mask_keeps(p, m, row, col);
  const double flops = 4.0 * p.batch * p.heads * double(visible) * p.head_dim;
  const std::string idea = "a block mask (skip, full, partial tiles) in stage 06's loop; here causal, " + m.describe();
  const s13::Config config = s13::current_config();
  tensors.poison_outputs();
  const double secs = fa::median_seconds(
      [&] { s13::forward(p, m, config, tensors.Q.data(), tensors.K.data(), tensors.V.data(), tensors.O.data(),
                         tensors.L.data()); },
      0, 1);
  const fa::CheckReport r = fa::compare_masked(p, m, tensors, false);
  const auto& o = r.at("O");
  print_row(s13::kStageName, fa::Dtype::F32, o.max_abs, o.tol, r.pass(), secs, flops, idea);
  if (!backward) return r.pass();
  const double bwd_secs = fa::median_seconds(
      [&] {
        s13::backward(p, m, config, tensors.Q.data(), tensors.K.data(), tensors.V.data(), tensors.O.data(),
                      tensors.L.data(), tensors.dO.data(), tensors.dQ.data(), tensors.dK.data(), tensors.dV.data());
      },
      0, 1);
  const fa::CheckReport rb = fa::compare_masked(p, m, tensors, true);
  const fa::Comparison* worst = &rb.items.front();
  for (const auto& c : rb.items)
    if (c.max_abs / c.tol > worst->max_abs / worst->tol) worst = &c;
  print_row(std::string(s13::kStageName) + " bwd", fa::Dtype::F32, worst->max_abs, worst->tol, rb.pass(), bwd_secs,
            2.5 * flops, "backward; worst of O, L, dQ, dK, dV: " + worst->name);
  return r.pass() && rb.pass();
}

// Stage 14's row: one new token of each of the tour's sequences against a cache of the tour's
// length (the last row of a causal problem of that length), on the CPU split-KV step, with
// the decode problem's own seeded inputs (normal, whatever --dist says).
bool decode_row(const fa::Problem& tour_problem, uint64_t seed) {
  namespace s14 = fa::stage14;
  fa::DecodeProblem p = fa::DecodeProblem::sequences(std::vector<int>(size_t(tour_problem.batch), tour_problem.seq_k),
                                                     tour_problem.heads, tour_problem.kv_heads, 1,
                                                     tour_problem.head_dim);
  p.validate("tour");
  fa::DecodeTensors t = fa::DecodeTensors::make(p, seed);
  const double secs = fa::median_seconds(
      [&] { s14::decode_cpu(p, t.Q.data(), t.K_cache.data(), t.V_cache.data(), nullptr, t.O.data(), t.L.data()); },
      0, 1);
  const fa::CheckReport r = fa::check_decode(p, fa::Dtype::F32, t, t.O.data(), t.L.data());
  const auto& o = r.at("O");
  double visible = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.q_len; ++i) visible += double(p.visible_keys(b, i));
  print_row(s14::kStageName, fa::Dtype::F32, o.max_abs, o.tol, r.pass(), secs,
            4.0 * p.heads * visible * p.head_dim,
            "decoding, CPU split-KV step: one new token per sequence against its KV cache (own seeded inputs)");
  return r.pass();
}

int run_tour(int argc, char** argv) {
  fa::Problem p;
  p.batch = 1;
  p.heads = 4;
  p.kv_heads = 2;
  p.seq_q = 512;
  p.seq_k = 512;
  p.head_dim = 64;
  p.causal = false;
  int64_t seed = 7;
  std::string dist_s = "normal";
  bool backward = false;
  CLI::App app{"Runs every stage on one problem and checks each against the reference"};
  app.add_option("--heads", p.heads, "query heads")->capture_default_str();
  app.add_option("--kv-heads", p.kv_heads, "key/value heads (heads must be a multiple)")
      ->capture_default_str();
  app.add_option("--seq", p.seq_q, "sequence length (queries and keys)")->capture_default_str();
  app.add_option("--head-dim", p.head_dim, "head dimension d")->capture_default_str();
  app.add_flag("--causal", p.causal, "bottom-right causal mask");
  app.add_option("--seed", seed, "input generator seed (0 to 2^63 - 1)")
      ->check(CLI::Range(int64_t(0), std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  app.add_option("--dist", dist_s,
                 "input distribution (large: logits in the hundreds, where stage 01 overflows)")
      ->check(CLI::IsMember({"normal", "uniform", "large"}))
      ->capture_default_str();
  app.add_flag("--backward", backward, "also run and check the backward of every stage that has one");
  fa::refuse_empty_values(app);  // "--seq ''" is refused, not read as 0
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(std::string(e.what()) + " (see --help)");
  }
  p.seq_k = p.seq_q;
  p.validate("tour");
  // One set of inputs for every stage; a problem too large for memory is refused here.
  const fa::Dist dist = fa::parse_dist(dist_s);
  fa::Tensors tensors = fa::Tensors::make(p, uint64_t(seed), dist, backward);

  std::printf("problem: %s, inputs %s\n\n", p.describe().c_str(), dist_s.c_str());
  std::printf("%-22s %-5s %-12s %-12s %-6s %10s %12s  %s\n", "stage", "dtype", "max|ΔO|",
              "tolerance", "check", "time ms", "speed", "idea");
  const bool have_gpu = fa::gpu_available();
  bool all_pass = true;
  for (const auto& s : fa::all_stages()) {
    if (s.is_gpu && !have_gpu) {
      std::printf("%-22s %-5s %-12s %-12s %-6s %10s %12s  %s\n", s.name.c_str(), "-", "-", "-",
                  "skip", "-", "-", ("skipped: no GPU — " + s.idea).c_str());
      continue;
    }
    const fa::Dtype t = s.dtypes.front();
    if (!s.supports_head_dim(p.head_dim)) {
      std::printf("%-22s %-5s skipped: head_dim %d not supported\n", s.name.c_str(),
                  fa::dtype_name(t), p.head_dim);
      continue;
    }
    tensors.poison_outputs();
    try {
      const double secs = fa::median_seconds(
          [&] {
            s.forward(p, t, tensors.Q.data(), tensors.K.data(), tensors.V.data(),
                      tensors.O.data(), tensors.L.data());
          },
          s.is_gpu ? 1 : 0, s.is_gpu ? 3 : 1);
      const fa::CheckReport r = fa::compare_forward(p, t, tensors);
      const auto& o = r.at("O");
      // Stage 01 failing on large logits is its lesson, not a broken stage.
      const bool expected_fail = s.overflows_on_large_logits && dist == fa::Dist::LargeLogits;
      all_pass = all_pass && (r.pass() || expected_fail);
      std::string note = s.idea;
      if (o.nonfinite_mismatch > 0)  // max|ΔO| covers finite entries only: say what it misses
        note = std::to_string(o.nonfinite_mismatch) + " non-finite entries of O — " + note;
      if (expected_fail && !r.pass()) note = "expected: exp() overflows; " + note;
      print_row(s.name, t, o.max_abs, o.tol, r.pass(), secs, p.forward_flops(), note);
      if (backward && s.has_backward()) {
        const double bwd_secs = fa::median_seconds(
            [&] {
              s.backward(p, t, tensors.Q.data(), tensors.K.data(), tensors.V.data(),
                         tensors.O.data(), tensors.L.data(), tensors.dO.data(), tensors.dQ.data(),
                         tensors.dK.data(), tensors.dV.data());
            },
            s.is_gpu ? 1 : 0, s.is_gpu ? 3 : 1);
        const fa::CheckReport rb = fa::compare_backward(p, t, tensors);
        // The gradient that is furthest from its tolerance stands for the three.
        const fa::Comparison* worst = &rb.items.front();
        for (const auto& c : rb.items)
          if (c.max_abs / c.tol > worst->max_abs / worst->tol) worst = &c;
        all_pass = all_pass && rb.pass();
        print_row(s.name + " bwd", t, worst->max_abs, worst->tol, rb.pass(), bwd_secs,
                  2.5 * p.forward_flops(), "backward; worst of dQ, dK, dV: " + worst->name);
      }
    } catch (const std::exception& e) {
      // One stage failing (out of memory in its S buffer, say) does not stop the tour.
      all_pass = false;
      std::printf("%-22s error: %s\n", s.name.c_str(), e.what());
    }
  }
  // The stages outside the list: their own problems, their own checks.
  for (const auto& [name, row] : std::vector<std::pair<std::string, std::function<bool()>>>{
           {fa::stage13::kStageName, [&] { return masks_rows(p, tensors, backward); }},
           {fa::stage14::kStageName, [&] { return decode_row(p, uint64_t(seed)); }}}) {
    try {
      all_pass = row() && all_pass;
    } catch (const std::exception& e) {
      all_pass = false;
      std::printf("%-22s error: %s\n", name.c_str(), e.what());
    }
  }
  std::printf("\nmax|ΔO| is the largest |O − O_ref| against the double-precision reference (for a\n"
              "bwd row, of the gradient furthest from its tolerance); GPU stage times include\n"
              "host<->device copies (use a stage's --bench for kernel time).\n");
  return all_pass ? fa::kExitPass : fa::kExitCheckFailed;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_tour(argc, argv);
  } catch (...) {
    return fa::report_failure("tour", std::current_exception());
  }
}
