#include "modifiers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace fa {

namespace {

int64_t longest(const std::vector<int64_t>& cu, int64_t whole) {
  if (cu.empty()) return whole;
  int64_t m = 0;
  for (size_t i = 1; i < cu.size(); ++i) m = std::max(m, cu[i] - cu[i - 1]);
  return m;
}

void check_cu(const std::vector<int64_t>& cu, const char* name, int64_t total, const char* total_name,
              const std::string& who) {
  const auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(who + ": " + name + " " + what);
  };
  if (cu.size() < 2) refuse("has " + std::to_string(cu.size()) + " entries (at least 2: 0 and the end of the first document)");
  if (cu[0] != 0) refuse("starts at " + std::to_string(cu[0]) + " (it must start at 0)");
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      refuse("decreases at entry " + std::to_string(i) + " (" + std::to_string(cu[i - 1]) + " then " +
             std::to_string(cu[i]) + "; document lengths must be >= 0)");
  if (cu.back() > total)
    refuse("ends at " + std::to_string(cu.back()) + ", past the tensor (" + total_name + " = " + std::to_string(total) + ")");
}

}  // namespace

int64_t Modifiers::max_seqlen_q(const Problem& p) const { return longest(cu_seqlens_q, p.seq_q); }
int64_t Modifiers::max_seqlen_k(const Problem& p) const { return longest(cu_seqlens_k, p.seq_k); }

void Modifiers::validate(const Problem& p, const std::string& who) const {
  const auto refuse = [&](const std::string& what) { throw std::invalid_argument(who + ": " + what); };
  if (window_left && *window_left < 0)
    refuse("window_left = " + std::to_string(*window_left) + " is not allowed (a window size must be >= 0; leave it out for no bound)");
  if (window_right && *window_right < 0)
    refuse("window_right = " + std::to_string(*window_right) + " is not allowed (a window size must be >= 0; leave it out for no bound)");
  // The kernels compute in float: a cap that float cannot hold as a normal number would round
  // to inf (then inf·tanh(s/inf) is NaN) or towards 0 (then 0·tanh(0/0) is NaN).
  const double least = std::numeric_limits<float>::min(), most = std::numeric_limits<float>::max();
  if (!(softcap >= 0) || std::isinf(softcap) || (softcap > 0 && (softcap < least || softcap > most))) {
    std::ostringstream s;
    s << "softcap = " << softcap << " is not allowed (the cap must be 0, which turns soft-capping off, or a float "
      << "from " << least << " to " << most << ")";
    refuse(s.str());
  }
  if (!alibi_slopes.empty() && int64_t(alibi_slopes.size()) != p.heads)
    refuse("alibi_slopes has " + std::to_string(alibi_slopes.size()) + " entries (one per query head: heads = " +
           std::to_string(p.heads) + ")");
  for (size_t h = 0; h < alibi_slopes.size(); ++h)
    if (!std::isfinite(alibi_slopes[h])) refuse("alibi_slopes[" + std::to_string(h) + "] is not finite");
  if (!sinks.empty() && int64_t(sinks.size()) != p.heads)
    refuse("sinks has " + std::to_string(sinks.size()) + " entries (one logit per query head: heads = " +
           std::to_string(p.heads) + ")");
  for (size_t h = 0; h < sinks.size(); ++h)
    if (!std::isfinite(sinks[h])) refuse("sinks[" + std::to_string(h) + "] is not finite");
  if (cu_seqlens_q.empty() != cu_seqlens_k.empty())
    refuse(std::string(cu_seqlens_q.empty() ? "cu_seqlens_k" : "cu_seqlens_q") + " is given without " +
           (cu_seqlens_q.empty() ? "cu_seqlens_q" : "cu_seqlens_k") + " (documents need both)");
  if (has_documents()) {
    if (p.batch != 1)
      refuse("batch = " + std::to_string(p.batch) + " with cu_seqlens (documents are packed into one row: batch must be 1)");
    check_cu(cu_seqlens_q, "cu_seqlens_q", p.seq_q, "seq_q", who);
    check_cu(cu_seqlens_k, "cu_seqlens_k", p.seq_k, "seq_k", who);
    if (cu_seqlens_q.size() != cu_seqlens_k.size())
      refuse("cu_seqlens_q has " + std::to_string(cu_seqlens_q.size() - 1) + " documents and cu_seqlens_k " +
             std::to_string(cu_seqlens_k.size() - 1) + " (they must have as many)");
  }
}

std::string Modifiers::describe() const {
  std::ostringstream s;
  const auto side = [](const std::optional<int64_t>& w) { return w ? std::to_string(*w) : std::string("inf"); };
  if (has_window()) s << " window=(" << side(window_left) << "," << side(window_right) << ")";
  if (softcap > 0) s << " softcap=" << softcap;
  if (!alibi_slopes.empty()) s << " alibi";
  if (!sinks.empty()) s << " sinks";
  if (has_documents()) s << " documents=" << documents();
  const std::string out = s.str();
  return out.empty() ? "none" : out.substr(1);
}

std::vector<float> alibi_slopes(int heads) {
  // Geometric: slope_h = r^(h+1) with r = 2^(−8/n), n the largest power of two ≤ heads.
  const auto series = [](int n) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int h = 0; h < n; ++h) s[size_t(h)] = float(std::exp2(-8.0 * (h + 1) / n));
    return s;
  };
  if (heads <= 0) return {};
  int n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<float> s = series(n);
  const std::vector<float> finer = series(2 * n);  // the rest: every other slope of 2n heads
  for (int k = 0; int(s.size()) < heads; k += 2) s.push_back(finer[size_t(k)]);
  return s;
}

std::vector<int64_t> cu_seqlens_of(const std::vector<int64_t>& lengths, const std::string& who) {
  std::vector<int64_t> cu{0};
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0)
      throw std::invalid_argument(who + ": document " + std::to_string(i) + " has length " + std::to_string(lengths[i]) +
                                  " (lengths must be >= 0)");
    cu.push_back(cu.back() + lengths[i]);
  }
  return cu;
}

}  // namespace fa
