#include "driver.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <limits>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "check.h"
#include "errors.h"
#include "tensors.h"
#include "timing.h"

namespace fa {

namespace {

struct Row {
  std::string key, value;
};

void print_table(const std::string& title, const std::vector<Row>& rows) {
  size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.key.size());
  std::cout << title << "\n";
  for (const auto& r : rows) std::cout << "  " << std::left << std::setw(int(w)) << r.key << "  " << r.value << "\n";
}

std::string fmt(double v, int prec = 3) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(prec) << v;
  return s.str();
}

// True when every element of `x` is finite (L may also be −inf: a row that sees no key).
bool all_finite(const std::vector<float>& x, bool minus_inf_ok) {
  for (float v : x)
    if (!std::isfinite(v) && !(minus_inf_ok && v == -INFINITY)) return false;
  return true;
}

// kMaxCheckFlops, or FA_MAX_CHECK_FLOPS from the environment (lets a test reach the
// skipped check on a small problem).
double max_check_flops() {
  const char* e = std::getenv("FA_MAX_CHECK_FLOPS");
  return e != nullptr && *e != '\0' ? std::strtod(e, nullptr) : kMaxCheckFlops;
}

int run_stage(int argc, char** argv, const StageInfo& stage) {
  Problem p;
  int64_t seed = 1;
  std::string dist_s = "normal", dtype_s = dtype_name(stage.dtypes.front());
  int repeat = 5;
  bool bench = false, backward = false, no_check = false;

  CLI::App app{stage.name + ": " + stage.idea};
  app.add_option("--batch", p.batch, "batch size")->capture_default_str();
  app.add_option("--heads", p.heads, "query heads")->capture_default_str();
  app.add_option("--kv-heads", p.kv_heads, "key/value heads (heads must be a multiple)")->capture_default_str();
  app.add_option("--seq-q", p.seq_q, "query length N_q")->capture_default_str();
  app.add_option("--seq-k", p.seq_k, "key length N_k")->capture_default_str();
  app.add_option("--head-dim", p.head_dim, "head dimension d")->capture_default_str();
  app.add_flag("--causal", p.causal, "bottom-right causal mask");
  app.add_option("--scale", p.scale, "softmax scale (0 = 1/sqrt(d))")->capture_default_str();
  app.add_option("--seed", seed, "input generator seed (0 to 2^63 - 1)")
      ->check(CLI::Range(int64_t(0), std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  app.add_option("--dist", dist_s, "input distribution")
      ->check(CLI::IsMember({"normal", "uniform", "large"}))
      ->capture_default_str();
  app.add_option("--dtype", dtype_s, "compute type (f32, f16, bf16; what the stage supports)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--repeat", repeat, "timed runs with --bench (the median is reported)")
      ->check(CLI::Range(1, kMaxRepeat))
      ->capture_default_str();
  app.add_flag("--bench", bench, "warm up, then time --repeat runs");
  app.add_flag("--backward", backward, "also run and check the backward pass");
  app.add_flag("--no-check", no_check, "skip the comparison with the reference");
  if (stage.add_options) stage.add_options(app);
  refuse_empty_values(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << stage.name << ": " << e.what() << " (see --help)\n";
    return kExitBadInput;
  }

    const Dist dist = parse_dist(dist_s);
    const Dtype dtype = parse_dtype(dtype_s);
    p.validate(stage.name);
    if (!stage.supports(dtype))
      throw std::invalid_argument(stage.name + ": dtype " + dtype_s + " is not supported by this stage");
    if (!stage.supports_head_dim(p.head_dim))
      throw std::invalid_argument(stage.name + ": head_dim = " + std::to_string(p.head_dim) +
                                  " is not supported by this stage");
    if (backward && !stage.has_backward())
      throw std::invalid_argument(stage.name + ": --backward given, but this stage has no backward pass");

    Tensors t = Tensors::make(p, uint64_t(seed), dist, backward);
    std::vector<Row> rows{{"problem", p.describe()},
                          {"dtype / inputs", dtype_s + ", " + dist_s + " seed " + std::to_string(seed)}};

    // Run once (this is also the run that is checked). Without a query row there is
    // nothing to compute: no O or L, and dK = dV = 0, so the stage's loops over every head
    // (there may be 2^30) are not entered.
    const bool empty = p.q_elems() == 0;
    const auto run_fwd = [&] {
      if (!empty) stage.forward(p, dtype, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
    };
    const auto run_bwd = [&] {
      if (empty) {
        std::fill(t.dK.begin(), t.dK.end(), 0.0f);
        std::fill(t.dV.begin(), t.dV.end(), 0.0f);
        return;
      }
      stage.backward(p, dtype, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(),
                     t.dO.data(), t.dQ.data(), t.dK.data(), t.dV.data());
    };
    const double fwd_once = median_seconds(run_fwd, 0, 1);
    double bwd_once = 0;
    if (backward) bwd_once = median_seconds(run_bwd, 0, 1);

    // The result: PASS or FAIL against the reference; SKIPPED when the reference cannot
    // afford even one batch, or "not checked" with --no-check. The generated inputs are
    // finite, so the reference's O and gradients are finite and its L finite or −inf (a
    // row that sees no key): a non-finite output where it cannot be is a FAIL even
    // without a comparison, never a PASS.
    std::string result = "not checked";
    bool pass = true;
    if (!no_check) {
      // Check as many leading batches as the reference can afford.
      Problem pc = p;
      const double per_batch = p.forward_flops() / p.batch * (backward ? 3.5 : 1.0);
      pc.batch = int(std::min<double>(p.batch, max_check_flops() / std::max(per_batch, 1.0)));
      if (pc.batch == 0) {
        rows.push_back({"check", "skipped: too large for the CPU reference (one batch needs " +
                                     fmt(per_batch / 1e9, 1) + " GFLOP)"});
        result = "SKIPPED (too large for the reference)";
      } else {
        CheckReport r = compare_forward(pc, dtype, t, merged_parts_of(stage, pc));
        if (backward)
          for (auto& c : compare_backward(pc, dtype, t, merged_parts_of(stage, pc)).items) r.items.push_back(c);
        if (pc.batch < p.batch)
          rows.push_back({"check", "first " + std::to_string(pc.batch) + " of " +
                                       std::to_string(p.batch) + " batches"});
        for (const auto& c : r.items) rows.push_back({"error " + c.name, c.summary()});
        pass = r.pass();
        result = pass ? "PASS" : "FAIL";
      }
    }
    const bool finite = all_finite(t.O, false) && all_finite(t.L, true) &&
                        (!backward || (all_finite(t.dQ, false) && all_finite(t.dK, false) &&
                                       all_finite(t.dV, false)));
    if (!finite) {
      rows.push_back({"outputs", "non-finite values where the reference is finite (inputs are finite)"});
      pass = false;
      result = "FAIL";
    }

    const auto add_speed = [&](const std::string& what, double seconds, double flops) {
      rows.push_back({"time " + what, fmt(seconds * 1e3) + " ms"});
      if (stage.is_gpu)
        rows.push_back({"speed " + what, fmt(flops / seconds / 1e12, 2) + " TFLOP/s"});
      else
        rows.push_back({"speed " + what, fmt(flops / seconds / 1e9, 2) + " GFLOP/s"});
    };
    double fwd_s = fwd_once, bwd_s = bwd_once;
    std::string how = "single run (use --bench for the median)";
    if (bench) {
      if (stage.bench_forward) {
        fwd_s = stage.bench_forward(p, dtype, repeat) / 1e3;
        if (backward && stage.bench_backward) bwd_s = stage.bench_backward(p, dtype, repeat) / 1e3;
        how = "device events, median of " + std::to_string(repeat);
      } else {
        fwd_s = median_seconds(run_fwd, 1, repeat);
        if (backward) bwd_s = median_seconds(run_bwd, 1, repeat);
        how = "host clock, median of " + std::to_string(repeat) + " after a warm-up";
      }
    }
    rows.push_back({"timing", how});
    add_speed("forward", fwd_s, p.forward_flops());
    if (backward) add_speed("backward", bwd_s, 2.5 * p.forward_flops());
    if (stage.report)
      for (auto& [k, v] : stage.report(p, dtype)) rows.push_back({k, v});
    rows.push_back({"result", result});
    print_table(stage.name + " — " + stage.idea, rows);
    return pass ? kExitPass : kExitCheckFailed;
}

}  // namespace

void refuse_empty_values(CLI::App& app) {
  const CLI::Validator non_empty(
      [](std::string& value) { return value.empty() ? std::string("an empty value is not allowed") : std::string(); },
      "", "NON-EMPTY");
  for (CLI::Option* option : app.get_options())
    if (option->get_type_size_max() > 0) option->check(non_empty);
}

int run_stage_cli(int argc, char** argv, const StageInfo& stage) {
  try {
    return run_stage(argc, argv, stage);
  } catch (...) {
    return report_failure(stage.name, std::current_exception());
  }
}

}  // namespace fa
