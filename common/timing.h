/// \file timing.h
/// \brief Wall-clock timing: warm-up, then the median of several runs.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace fa {

/// Runs `fn` `warmup` times untimed, then `repeats` times, and returns the median seconds.
template <typename Fn>
double median_seconds(Fn&& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace fa
