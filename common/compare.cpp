#include "compare.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "reference.h"

namespace fa {

double unit_roundoff(Dtype t) {
  switch (t) {
    case Dtype::F32: return std::ldexp(1.0, -24);
    case Dtype::F16: return std::ldexp(1.0, -11);
    case Dtype::BF16: return std::ldexp(1.0, -8);
  }
  return 0;
}

// The baselines a dtype's budget comes from (declared in reference.h): the policy's, here
// beside its numbers (and a small file for the mutation check that drops one).
RefMode baseline_mode(Dtype t) {
  switch (t) {
    case Dtype::F32: return RefMode::F32;
    case Dtype::F16: return RefMode::F16;
    case Dtype::BF16: return RefMode::BF16;
  }
  return RefMode::F32;
}

std::vector<RefMode> baseline_modes(Dtype t, int merged_parts) {
  const bool merges = merged_parts >= 2;
  if (t == Dtype::F32 && merges) return {RefMode::F32, RefMode::F32InOrder, RefMode::F32Merged};
  if (t == Dtype::F32) return {RefMode::F32, RefMode::F32InOrder};
  return {baseline_mode(t)};
}

double baseline_error(const std::vector<double>& exact, const std::vector<double>& baseline) {
  if (exact.size() != baseline.size())
    throw std::invalid_argument("tolerance: exact and baseline differ in size");
  double base_err = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    if (!std::isfinite(exact[i])) continue;
    const double e = std::abs(baseline[i] - exact[i]);
    base_err = std::isfinite(e) ? std::max(base_err, e) : base_err;
  }
  return base_err;
}

double tolerance(const std::vector<double>& exact, double base_err, Dtype t) {
  double max_exact = 0;
  for (double x : exact)
    if (std::isfinite(x)) max_exact = std::max(max_exact, std::abs(x));
  return kBaselineFactor * base_err + kFloorUlps * unit_roundoff(t) * std::max(1.0, max_exact);
}

double tolerance(const std::vector<double>& exact, const std::vector<double>& baseline, Dtype t) {
  return tolerance(exact, baseline_error(exact, baseline), t);
}

namespace {
// Same finiteness class: both finite, both NaN, or the same infinity.
bool same_class(double got, double ref) {
  if (std::isfinite(ref)) return std::isfinite(got);
  if (std::isnan(ref)) return std::isnan(got);
  return got == ref;
}
}  // namespace

Comparison compare(const std::string& name, const float* got, const std::vector<double>& ref,
                   Shape4 shape, double tol) {
  Comparison c;
  c.name = name;
  c.tol = tol;
  c.count = int64_t(ref.size());
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < c.count; ++i) {
    const double g = got[i], r = ref[size_t(i)];
    if (!same_class(g, r)) {
      if (c.nonfinite_mismatch++ == 0) c.worst = i;  // report the first one
      continue;
    }
    if (!std::isfinite(r)) continue;
    const double e = std::abs(g - r);
    err2 += e * e;
    ref2 += r * r;
    if (r != 0) c.max_rel = std::max(c.max_rel, e / std::abs(r));
    if (e > c.max_abs) {
      c.max_abs = e;
      if (c.nonfinite_mismatch == 0) c.worst = i;
    }
  }
  c.rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  if (c.worst >= 0) {
    int64_t i = c.worst;
    c.col = i % shape.cols;
    i /= shape.cols;
    c.row = i % shape.rows;
    i /= shape.rows;
    c.h = i % shape.heads;
    c.b = i / shape.heads;
    c.got_at_worst = got[c.worst];
    c.ref_at_worst = ref[size_t(c.worst)];
  }
  c.pass = c.nonfinite_mismatch == 0 && c.max_abs <= tol;
  return c;
}

std::string Comparison::summary() const {
  std::ostringstream s;
  s.precision(3);
  s << std::scientific << name << ": max_abs=" << max_abs << " (tol " << tol
    << ") max_rel=" << max_rel << " rel_fro=" << rel_fro;
  if (nonfinite_mismatch) s << " non-finite mismatches=" << nonfinite_mismatch;
  if (worst >= 0)
    s << " worst (b,h,row,col)=(" << b << "," << h << "," << row << "," << col
      << ") got " << got_at_worst << " ref " << ref_at_worst;
  s << (pass ? " PASS" : " FAIL");
  return s.str();
}

}  // namespace fa
