#include "check.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "reference.h"

namespace fa {

bool CheckReport::pass() const {
  for (const auto& c : items)
    if (!c.pass) return false;
  return !items.empty();
}

std::string CheckReport::summary() const {
  std::ostringstream s;
  for (const auto& c : items) s << c.summary() << "\n";
  return s.str();
}

const Comparison& CheckReport::at(const std::string& name) const {
  for (const auto& c : items)
    if (c.name == name) return c;
  throw std::out_of_range("no comparison named " + name);
}

namespace {
Shape4 q_shape(const Problem& p) { return {p.batch, p.heads, p.seq_q, p.head_dim}; }
Shape4 kv_shape(const Problem& p) { return {p.batch, p.kv_heads, p.seq_k, p.head_dim}; }
Shape4 l_shape(const Problem& p) { return {p.batch, p.heads, p.seq_q, 1}; }

using Output = std::vector<double> Reference::*;  // &Reference::O, &Reference::dQ, ...

// The allowed error of one output: twice the largest error among the same-precision
// baselines (one per summation order a stage may use, compare.h), plus the floor.
double tol_of(Output out, const Reference& exact, const std::vector<Reference>& bases, Dtype dtype) {
  double err = 0;
  for (const Reference& base : bases) err = std::max(err, baseline_error(exact.*out, base.*out));
  return tolerance(exact.*out, err, dtype);
}
}  // namespace

CheckReport compare_forward(const Problem& p, Dtype dtype, const Tensors& t, int merged_parts) {
  const Reference exact = reference_forward(p, t.Q.data(), t.K.data(), t.V.data());
  std::vector<Reference> bases;
  for (RefMode mode : baseline_modes(dtype, merged_parts))
    bases.push_back(reference_forward(p, t.Q.data(), t.K.data(), t.V.data(), mode, false, merged_parts));
  CheckReport r;
  r.items.push_back(compare("O", t.O.data(), exact.O, q_shape(p), tol_of(&Reference::O, exact, bases, dtype)));
  // L is always fp32, and its error is a sum of rounding in m and log(l); the baselines'
  // L error in the stage's precision is the right budget for it too.
  r.items.push_back(compare("L", t.L.data(), exact.L, l_shape(p), tol_of(&Reference::L, exact, bases, dtype)));
  return r;
}

CheckReport compare_backward(const Problem& p, Dtype dtype, const Tensors& t, int merged_parts) {
  const Reference exact =
      reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data());
  std::vector<Reference> bases;
  for (RefMode mode : baseline_modes(dtype, merged_parts)) {
    bases.push_back(reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data(), mode, merged_parts));
    // The merging baseline once more with the stage's own L (reference.h): a merging stage's
    // backward recomputes P from the L it was handed, whose rounding falls in other rows than
    // the baseline's own merges put theirs; that L itself is judged by the forward's check.
    if (mode == RefMode::F32Merged)
      bases.push_back(
          reference_backward(p, t.Q.data(), t.K.data(), t.V.data(), t.dO.data(), mode, merged_parts, t.L.data()));
  }
  CheckReport r;
  r.items.push_back(compare("dQ", t.dQ.data(), exact.dQ, q_shape(p), tol_of(&Reference::dQ, exact, bases, dtype)));
  r.items.push_back(compare("dK", t.dK.data(), exact.dK, kv_shape(p), tol_of(&Reference::dK, exact, bases, dtype)));
  r.items.push_back(compare("dV", t.dV.data(), exact.dV, kv_shape(p), tol_of(&Reference::dV, exact, bases, dtype)));
  return r;
}

int merged_parts_of(const StageInfo& stage, const Problem& p) {
  return stage.merged_parts ? stage.merged_parts(p) : 0;
}

CheckReport check_forward(const StageInfo& stage, const Problem& p, Dtype dtype, Tensors& t) {
  t.poison_outputs();
  stage.forward(p, dtype, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
  return compare_forward(p, dtype, t, merged_parts_of(stage, p));
}

CheckReport check_backward(const StageInfo& stage, const Problem& p, Dtype dtype, Tensors& t) {
  if (!stage.has_backward())
    throw std::invalid_argument(stage.name + ": this stage has no backward pass");
  t.poison_outputs();
  stage.forward(p, dtype, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
  stage.backward(p, dtype, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(),
                 t.dO.data(), t.dQ.data(), t.dK.data(), t.dV.data());
  CheckReport r = compare_forward(p, dtype, t, merged_parts_of(stage, p));
  for (auto& c : compare_backward(p, dtype, t, merged_parts_of(stage, p)).items) r.items.push_back(c);
  return r;
}

}  // namespace fa
