#include "tensors.h"

#include "errors.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <sstream>
#include <random>
#include <stdexcept>

namespace fa {

const char* dist_name(Dist d) {
  switch (d) {
    case Dist::Normal: return "normal";
    case Dist::Uniform: return "uniform";
    case Dist::LargeLogits: return "large";
  }
  return "?";
}

Dist parse_dist(const std::string& s) {
  if (s == "normal") return Dist::Normal;
  if (s == "uniform") return Dist::Uniform;
  if (s == "large") return Dist::LargeLogits;
  throw std::invalid_argument("dist '" + s + "' is not one of normal, uniform, large");
}

int64_t physical_memory_bytes() {
  if (const char* e = std::getenv("FA_HOST_MEMORY_BYTES"); e != nullptr && *e != '\0')
    return std::strtoll(e, nullptr, 10);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : INT64_MAX;
}

namespace {
// Bytes of memory this process holds now (its resident set; 0 when it cannot be read).
double resident_bytes() {
  long size = 0, resident = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  const bool ok = std::fscanf(f, "%ld %ld", &size, &resident) == 2;
  std::fclose(f);
  return ok ? double(resident) * double(sysconf(_SC_PAGE_SIZE)) : 0;
}
}  // namespace

void require_fits_in_memory(double bytes, const std::string& what) {
  const double have = double(physical_memory_bytes()), held = resident_bytes();
  if (bytes + held <= have) return;
  const double GiB = double(1 << 30);
  std::ostringstream s;
  s.precision(3);
  s << what << " needs " << bytes / GiB << " GiB, more than this machine's " << have / GiB << " GiB of memory";
  if (bytes <= have) s << " less the " << held / GiB << " GiB this process already holds";
  throw OutOfMemory(s.str());
}

std::vector<float> allocate(int64_t elems, const std::string& what) {
  if (elems < 0) throw std::invalid_argument(what + ": negative size " + std::to_string(elems));
  require_fits_in_memory(double(elems) * sizeof(float), what);
  try {
    return std::vector<float>(size_t(elems));
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(what + ": cannot allocate " + std::to_string(elems) +
                             " floats (" + std::to_string(int64_t(double(elems) * 4 / (1 << 20))) +
                             " MiB) on the host");
  } catch (const std::length_error&) {
    throw OutOfMemory(what + ": " + std::to_string(elems) + " floats is too large");
  }
}

namespace {
void fill(std::vector<float>& x, std::mt19937_64& rng, Dist dist, bool is_qk) {
  if (dist == Dist::Uniform) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : x) v = u(rng);
    return;
  }
  const float sigma = (dist == Dist::LargeLogits && is_qk) ? 15.0f : 1.0f;
  std::normal_distribution<float> n(0.0f, sigma);
  for (float& v : x) v = n(rng);
}
}  // namespace

Tensors Tensors::make(const Problem& p, uint64_t seed, Dist dist, bool with_backward) {
  p.validate("inputs");  // element counts must not wrap before they become sizes
  const double q = double(p.q_elems()), kv = double(p.kv_elems()), l = double(p.l_elems());
  require_fits_in_memory(sizeof(float) * (with_backward ? 4 * q + 4 * kv + l : 2 * q + 2 * kv + l),
                         "the problem's host tensors (" + p.describe() + ")");
  Tensors t;
  t.Q = allocate(p.q_elems(), "Q");
  t.K = allocate(p.kv_elems(), "K");
  t.V = allocate(p.kv_elems(), "V");
  t.O = allocate(p.q_elems(), "O");
  t.L = allocate(p.l_elems(), "L");
  std::mt19937_64 rng(seed);
  fill(t.Q, rng, dist, true);
  fill(t.K, rng, dist, true);
  fill(t.V, rng, dist, false);
  if (with_backward) {
    t.dO = allocate(p.q_elems(), "dO");
    t.dQ = allocate(p.q_elems(), "dQ");
    t.dK = allocate(p.kv_elems(), "dK");
    t.dV = allocate(p.kv_elems(), "dV");
    fill(t.dO, rng, dist, false);
  }
  t.poison_outputs();
  return t;
}

void Tensors::poison_outputs() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto* x : {&O, &L, &dQ, &dK, &dV}) std::fill(x->begin(), x->end(), nan);
}

}  // namespace fa
