// A bounded, seeded robustness fuzzer over the C ABI (common/fa_c.h), as a hostile caller
// would use it: random problem structs, dtypes and stage names for every CPU stage of
// libfa_c.so, with exactly sized, sentinel-filled buffers.
//
// Each call is classified by an oracle written from the contract (docs/design.md §3, §4), not
// from the library's code:
//   - a valid problem with buffers: return 0, an empty fa_last_error(), every output element
//     written (O finite, L finite or −inf for a row that sees no key), the inputs untouched;
//   - anything invalid: return FA_ERR_INVALID (1), a message that names one of the values at
//     fault, and every buffer (inputs and outputs) bitwise untouched;
// and nothing may crash (under the asan preset, ASan and UBSan watch every call: a buffer is
// allocated at exactly its size, so one element past its end is reported).
//
// Stage 13's entries (fa_forward_masked, fa_backward_masked; and, on a machine without a GPU,
// fa_forward_masked_device, fa_backward_masked_device) take two more shares of the calls, with
// random fa_modifiers structs (on the heap at their exact size, as are their arrays): window
// sides of 0, within and past the sequence, up to INT64_MAX, negative, set or not, with flags
// not 0/1; caps of 0, > 0, < 0, NaN, ±inf; slopes and sinks of the right and wrong count,
// with non-finite values, a negative count, NULL behind a count; cu_seqlens valid (empty
// documents included), not from 0, decreasing, past the tensor, with batch 2, a negative
// count, one array NULL; a wrong size field; a NULL struct, NULL buffers, a NULL dsinks. The
// oracle is that of the contract (fa_c.h on fa_modifiers, modifiers.h's definitions): a
// valid call writes every output, and a row that sees no key (past the last document, or
// outside its window) has O = 0 and L = −inf, or L = σ_h with a sink, and no dQ; a key no row
// sees has no dK, dV; dsinks is written with sinks, untouched without. Without a GPU a device
// call is refused before any GPU is looked for when the problem, the struct or the dtype is
// at fault (FA_ERR_INVALID), and is FA_ERR_RUNTIME when valid, writing nothing either way.
//
//   fuzz_abi                 FA_FUZZ_SEED=<n> replays a run; FA_FUZZ_SECONDS (default 10)
//                            and FA_FUZZ_CALLS (default 3000) bound it, whichever comes first;
//                            FA_FUZZ_PRINT (default 20) failures are printed.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fa_c.h"

namespace {

// Outputs start as this NaN payload; a stage that writes an element replaces it.
constexpr uint32_t kSentinelBits = 0x7fc0dead;
// The largest tensor the fuzzer allocates; larger valid problems are called with NULL
// buffers, which must be refused.
constexpr int64_t kMaxAllocElems = 1 << 16;

float sentinel() {
  float f;
  std::memcpy(&f, &kSentinelBits, sizeof f);
  return f;
}

bool is_sentinel(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b == kSentinelBits;
}

// A buffer of exactly `n` floats (new[], so ASan knows its end), or none when n = 0.
struct Buffer {
  std::unique_ptr<float[]> data;
  int64_t n = 0;
  Buffer() = default;
  Buffer(int64_t count, std::mt19937_64* rng)
      : data(count > 0 ? new float[size_t(count)] : nullptr), n(count) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) data[size_t(i)] = rng ? normal(*rng) : sentinel();
  }
  float* get() const { return data.get(); }
  std::vector<float> copy() const { return std::vector<float>(data.get(), data.get() + n); }
  bool same_bits(const std::vector<float>& before) const {
    return int64_t(before.size()) == n &&
           (n == 0 || std::memcmp(before.data(), get(), size_t(n) * 4) == 0);
  }
};

// Products in 128 bits, so the oracle itself cannot overflow.
__int128 product(std::initializer_list<int64_t> xs) {
  __int128 p = 1;
  for (int64_t x : xs) p *= x;
  return p;
}

struct Sizes {
  __int128 q, kv, l;
};

Sizes sizes_of(const fa_problem& p) {
  return {product({p.batch, p.heads, p.seq_q, p.head_dim}),
          product({p.batch, p.kv_heads, p.seq_k, p.head_dim}),
          product({p.batch, p.heads, p.seq_q})};
}

// Everything wrong with a call, each as a piece of text its message may contain. Empty: the
// call is valid. (The library may report any one of them: the order of checks is its own.)
std::vector<std::string> faults(const char* stage, const fa_problem& p, int32_t dtype) {
  std::vector<std::string> f;
  if (stage == nullptr) f.push_back("stage name is NULL");
  auto at_least = [&](const char* name, int32_t v, int32_t min) {
    if (v < min) f.push_back(std::string(name) + " = " + std::to_string(v));
  };
  at_least("batch", p.batch, 1);
  at_least("heads", p.heads, 1);
  at_least("kv_heads", p.kv_heads, 1);
  at_least("seq_q", p.seq_q, 0);
  at_least("seq_k", p.seq_k, 0);
  at_least("head_dim", p.head_dim, 1);
  if (p.causal != 0 && p.causal != 1) f.push_back("causal = " + std::to_string(p.causal));
  if (dtype != FA_F32) f.push_back("dtype");  // CPU stages compute in fp32 only
  if (!std::isfinite(p.scale) || p.scale < 0.0f) f.push_back("scale = ");
  if (p.heads >= 1 && p.kv_heads >= 1 && p.heads % p.kv_heads != 0)
    f.push_back("heads = " + std::to_string(p.heads) + " is not a multiple");
  const bool in_range = p.batch >= 1 && p.heads >= 1 && p.kv_heads >= 1 && p.seq_q >= 0 &&
                        p.seq_k >= 0 && p.head_dim >= 1;
  if (!in_range) return f;  // the sizes below are only meaningful when all are in range
  const Sizes s = sizes_of(p);
  const __int128 limit = std::numeric_limits<int64_t>::max() / 4;
  if (s.q > limit) f.push_back("Q would hold");
  if (s.kv > limit) f.push_back("K would hold");
  if (s.l > limit) f.push_back("L would hold");
  return f;
}

// A value from a list of the interesting ones, or a small random one.
int32_t pick_size(std::mt19937_64& rng, int32_t small_max) {
  static const int32_t edges[] = {std::numeric_limits<int32_t>::min(),
                                  -65536,
                                  -2,
                                  -1,
                                  0,
                                  1,
                                  2,
                                  3,
                                  7,
                                  1 << 16,
                                  494770,
                                  769546,
                                  48448661,
                                  1 << 21,
                                  1 << 22,
                                  1 << 30,
                                  std::numeric_limits<int32_t>::max()};
  if (rng() % 3 == 0) return edges[rng() % (sizeof edges / sizeof edges[0])];
  return int32_t(rng() % uint64_t(small_max + 1));
}

fa_problem random_problem(std::mt19937_64& rng) {
  fa_problem p{};
  const bool small = rng() % 2 == 0;  // half the calls: a valid-looking small problem
  if (small) {
    p.kv_heads = 1 + int32_t(rng() % 2);
    p.heads = p.kv_heads * (1 + int32_t(rng() % 2));
    p.batch = 1 + int32_t(rng() % 2);
    p.seq_q = int32_t(rng() % 20);
    p.seq_k = int32_t(rng() % 20);
    p.head_dim = 1 + int32_t(rng() % 40);
  } else {
    p.batch = pick_size(rng, 3);
    p.heads = pick_size(rng, 6);
    p.kv_heads = pick_size(rng, 3);
    p.seq_q = pick_size(rng, 30);
    p.seq_k = pick_size(rng, 30);
    p.head_dim = pick_size(rng, 70);
  }
  static const int32_t causal[] = {0, 1, 0, 1, 2, -1, std::numeric_limits<int32_t>::min()};
  p.causal = causal[rng() % (small ? 2 : sizeof causal / sizeof causal[0])];
  const float inf = std::numeric_limits<float>::infinity();
  const float scales[] = {0.0f,
                          0.25f,
                          1.0f,
                          -0.0f,
                          -1.0f,
                          std::nanf(""),
                          inf,
                          -inf,
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::max()};
  p.scale = scales[rng() % (small && rng() % 4 != 0 ? 3 : sizeof scales / sizeof scales[0])];
  return p;
}

int32_t random_dtype(std::mt19937_64& rng) {
  static const int32_t values[] = {
      FA_F32, FA_F16, FA_BF16, -1, 3, 7, std::numeric_limits<int32_t>::min()};
  return rng() % 4 != 0 ? FA_F32 : values[rng() % (sizeof values / sizeof values[0])];
}

// Passes an int32 as the enum parameter without forming an out-of-range fa_dtype value in
// this program: a C caller (or ctypes) passes it as a plain int.
using ForwardDtypeInt = int (*)(const char*, const fa_problem*, int32_t, const float*, const float*,
                                const float*, float*, float*);
using BackwardDtypeInt = int (*)(const char*, const fa_problem*, int32_t, const float*,
                                 const float*, const float*, const float*, const float*,
                                 const float*, float*, float*, float*);

// ---- Stage 13's entries: fa_forward_masked, fa_backward_masked (host fp32, the CPU step) and
// fa_forward_masked_device, fa_backward_masked_device (probed without a GPU only) ----
//
// The oracle reads common/fa_c.h's comment on fa_modifiers and modifiers.h's definitions (not
// fa_c.cpp or Modifiers::validate): a valid struct gives 0 with every output written, a row
// that sees no key (past the last document, or masked out by the window or causal alignment)
// has O = 0 and L = −inf, or L = σ_h with a sink; its dQ is 0, as are dK and dV of a key that
// no row sees. Anything else is FA_ERR_INVALID naming a value at fault, nothing written.

// A fault as the pieces its message names, in this order, case-insensitively: {"sinks", "3"}.
using Fault = std::vector<std::string>;

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool names_fault(const std::string& msg, const Fault& f) {
  const std::string m = lower(msg);
  size_t at = 0;
  for (const std::string& piece : f) {
    const size_t k = m.find(lower(piece), at);
    if (k == std::string::npos) return false;
    at = k + piece.size();
  }
  return true;
}

// An array of exactly n elements on the heap (ASan knows its end), or none.
template <typename T>
struct Array {
  std::unique_ptr<T[]> data;
  int32_t n = 0;
  void assign(const std::vector<T>& v) {
    n = int32_t(v.size());
    data.reset(v.empty() ? nullptr : new T[v.size()]);
    std::copy(v.begin(), v.end(), data.get());
  }
  const T* get() const { return data.get(); }
  std::vector<T> copy() const { return std::vector<T>(data.get(), data.get() + n); }
  bool same_bits(const std::vector<T>& before) const {
    return int32_t(before.size()) == n &&
           (n == 0 || std::memcmp(before.data(), get(), size_t(n) * sizeof(T)) == 0);
  }
};

// One fa_modifiers (on the heap, exactly its size: a read past the struct is reported) with
// the arrays it points into; `m` null: the call passes a NULL struct.
struct ModSpec {
  std::unique_ptr<fa_modifiers> m;
  Array<float> slopes, sinks;
  Array<int32_t> cu_q, cu_k;

  std::string describe() const {
    if (!m) return "modifiers NULL";
    std::string s = "size " + std::to_string(m->size) + ", window_left (" +
                    std::to_string(m->has_window_left) + ", " + std::to_string(m->window_left) +
                    "), window_right (" + std::to_string(m->has_window_right) + ", " +
                    std::to_string(m->window_right) + "), softcap ";
    char cap[40];
    std::snprintf(cap, sizeof cap, "%g", m->softcap);
    s += cap;
    const auto floats = [&](const char* name, const float* a, int32_t n, const Array<float>& own) {
      s += std::string(", ") + name + " " + std::to_string(n) + (a ? "" : " NULL");
      if (a == own.get() && a != nullptr) {
        s += " [";
        for (int32_t i = 0; i < own.n; ++i) {
          char v[32];
          std::snprintf(v, sizeof v, "%s%g", i ? " " : "", double(own.get()[i]));
          s += v;
        }
        s += "]";
      }
    };
    floats("slopes", m->alibi_slopes, m->n_alibi_slopes, slopes);
    floats("sinks", m->sinks, m->n_sinks, sinks);
    s += ", n_cu_seqlens " + std::to_string(m->n_cu_seqlens);
    const auto ints = [&](const char* name, const int32_t* a, const Array<int32_t>& own) {
      s += std::string(" ") + name + (a ? "" : " NULL");
      if (a == own.get() && a != nullptr) {
        s += " [";
        for (int32_t i = 0; i < own.n; ++i) s += (i ? " " : "") + std::to_string(own.get()[i]);
        s += "]";
      }
    };
    ints("q", m->cu_seqlens_q, cu_q);
    ints("k", m->cu_seqlens_k, cu_k);
    return s;
  }
};

// What the contract says of a struct for problem p (p valid or not: the problem's own faults
// are listed apart). `maybe`: a one-entry cu_seqlens ({0}: no document, every row past the
// last one), which the contract neither lists as a refusal nor spells out; either answer is
// taken, each checked as such.
struct ModFaults {
  std::vector<Fault> definite, maybe;
  bool sinks = false;  // valid sinks are given (the backward needs dsinks)
};

ModFaults modifier_faults(const fa_problem& p, const ModSpec& spec) {
  ModFaults r;
  auto& f = r.definite;
  const fa_modifiers* m = spec.m.get();
  if (m == nullptr) {
    f.push_back({"modifiers", "null"});
    return r;
  }
  if (m->size != sizeof(fa_modifiers)) f.push_back({"size", std::to_string(m->size)});
  for (const auto& [flag, value, fname, vname] :
       {std::tuple{m->has_window_left, m->window_left, "has_window_left", "window_left"},
        std::tuple{m->has_window_right, m->window_right, "has_window_right", "window_right"}}) {
    if (flag != 0 && flag != 1) f.push_back({fname, std::to_string(flag)});
    else if (flag == 1 && value < 0) f.push_back({vname, std::to_string(value)});
  }
  // The contract (modifiers.h): 0, or a cap float holds as a normal number.
  if (!(m->softcap >= 0) || std::isinf(m->softcap) ||
      (m->softcap > 0 && (m->softcap < std::numeric_limits<float>::min() ||
                          m->softcap > std::numeric_limits<float>::max())))
    f.push_back({"softcap"});
  const auto per_head = [&](const char* name, const char* count, const float* a, int32_t n) {
    if (n < 0) return f.push_back({count, std::to_string(n)});
    if (n == 0) return;
    if (a == nullptr) return f.push_back({name, "null"});
    if (n != p.heads) f.push_back({name, std::to_string(n)});
    for (int32_t i = 0; i < n; ++i)
      if (!std::isfinite(a[i])) f.push_back({std::string(name) + "[" + std::to_string(i) + "]"});
  };
  const size_t before = f.size();
  per_head("alibi_slopes", "n_alibi_slopes", m->alibi_slopes, m->n_alibi_slopes);
  const size_t after_slopes = f.size();
  per_head("sinks", "n_sinks", m->sinks, m->n_sinks);
  r.sinks = m->n_sinks > 0 && f.size() == after_slopes;
  (void)before;
  const int32_t n = m->n_cu_seqlens;
  if (n < 0) {
    f.push_back({"n_cu_seqlens", std::to_string(n)});
  } else if (n > 0) {
    if (m->cu_seqlens_q == nullptr) f.push_back({"cu_seqlens_q", "null"});
    if (m->cu_seqlens_k == nullptr) f.push_back({"cu_seqlens_k", "null"});
    if (m->cu_seqlens_q != nullptr && m->cu_seqlens_k != nullptr) {
      std::vector<Fault> docs;
      if (p.batch != 1) docs.push_back({"batch", std::to_string(p.batch)});
      for (const auto& [cu, name, total] :
           {std::tuple{m->cu_seqlens_q, "cu_seqlens_q", p.seq_q},
            std::tuple{m->cu_seqlens_k, "cu_seqlens_k", p.seq_k}}) {
        if (cu[0] != 0) docs.push_back({name, std::to_string(cu[0])});
        for (int32_t i = 1; i < n; ++i)
          if (cu[i] < cu[i - 1]) docs.push_back({name, std::to_string(cu[i])});
        if (cu[n - 1] > total) docs.push_back({name, std::to_string(cu[n - 1])});
      }
      if (n == 1) r.maybe.push_back({"cu_seqlens"});
      f.insert(f.end(), docs.begin(), docs.end());
    }
  }
  return r;
}

// The keys [lo, hi] (packed indices; lo > hi: none) that row r sees, by modifiers.h's
// definition, for a valid problem and struct.
struct RowMask {
  const fa_problem& p;
  const fa_modifiers& m;
  std::pair<int64_t, int64_t> keys(int64_t r) const {
    int64_t q0 = 0, q1 = p.seq_q, k0 = 0, k1 = p.seq_k;
    if (m.n_cu_seqlens > 0) {
      int32_t d = 0;
      while (d + 1 < m.n_cu_seqlens && !(m.cu_seqlens_q[d] <= r && r < m.cu_seqlens_q[d + 1])) ++d;
      if (d + 1 >= m.n_cu_seqlens) return {0, -1};  // past the last document
      q0 = m.cu_seqlens_q[d], q1 = m.cu_seqlens_q[d + 1];
      k0 = m.cu_seqlens_k[d], k1 = m.cu_seqlens_k[d + 1];
    }
    const __int128 n_q = q1 - q0, n_k = k1 - k0, diag = (r - q0) + n_k - n_q;
    __int128 lo = 0, hi = n_k - 1;
    if (p.causal == 1) hi = std::min(hi, diag);
    if (m.has_window_left == 1) lo = std::max(lo, diag - m.window_left);
    if (m.has_window_right == 1) hi = std::min(hi, diag + m.window_right);
    if (lo > hi) return {0, -1};
    return {k0 + int64_t(lo), k0 + int64_t(hi)};
  }
};

// Problem faults of a stage-13 call: every stage's rule (faults() with a named stage, fp32).
std::vector<Fault> problem_faults(const fa_problem& p) {
  std::vector<Fault> f;
  for (const std::string& s : faults("13_masks", p, FA_F32)) f.push_back({s});
  return f;
}

using ForwardMaskedDeviceInt = int (*)(const fa_problem*, const fa_modifiers*, int32_t,
                                       const void*, const void*, const void*, void*, float*,
                                       void*);
using BackwardMaskedDeviceInt = int (*)(const fa_problem*, const fa_modifiers*, int32_t,
                                        const void*, const void*, const void*, const void*,
                                        const float*, const void*, void*, void*, void*, float*,
                                        void*);

struct Fuzzer {
  std::mt19937_64 rng;
  std::vector<std::string> stages;  // CPU stages
  int64_t calls = 0, valid = 0, refused = 0, failures = 0;
  int64_t print_limit = 20;  // FA_FUZZ_PRINT: how many failures are printed

  void fail(const std::string& what, const char* stage, const fa_problem& p, int32_t dtype) {
    if (++failures <= print_limit)
      std::printf(
          "FAIL %s\n     stage %s, problem {batch %d, heads %d, kv_heads %d, seq_q %d, seq_k %d, "
          "head_dim %d, causal %d, scale %g}, dtype %d\n",
          what.c_str(), stage ? stage : "(NULL)", p.batch, p.heads, p.kv_heads, p.seq_q, p.seq_k,
          p.head_dim, p.causal, double(p.scale), dtype);
  }

  // One forward (and, for a stage with a backward, one backward) call.
  void one(const char* stage, bool has_backward) {
    const fa_problem p = random_problem(rng);
    const int32_t dtype = random_dtype(rng);
    const std::vector<std::string> why = faults(stage, p, dtype);
    const bool ok = why.empty();
    const Sizes s = ok ? sizes_of(p) : Sizes{0, 0, 0};
    const bool fits = ok && s.q <= kMaxAllocElems && s.kv <= kMaxAllocElems;
    // Exactly sized buffers for a problem the fuzzer can afford; otherwise small sentinel
    // buffers (an invalid problem must touch nothing) or NULL (a valid but huge problem
    // must be refused for its NULL tensors, never taken as empty).
    const bool use_null = ok && !fits;
    const int64_t nq = fits ? int64_t(s.q) : 64, nkv = fits ? int64_t(s.kv) : 64,
                  nl = fits ? int64_t(s.l) : 64;
    Buffer Q(nq, &rng), K(nkv, &rng), V(nkv, &rng), O(nq, nullptr), L(nl, nullptr);
    const auto q0 = Q.copy(), k0 = K.copy(), v0 = V.copy(), o0 = O.copy(), l0 = L.copy();
    auto ptr = [&](const Buffer& b) { return use_null ? nullptr : b.get(); };

    const auto fwd = reinterpret_cast<ForwardDtypeInt>(&fa_forward_dtype);
    const bool plain = dtype == FA_F32 && rng() % 2 == 0;  // fa_forward takes the stage's own dtype
    int rc = plain ? fa_forward(stage, &p, ptr(Q), ptr(K), ptr(V), ptr(O), ptr(L))
                   : fwd(stage, &p, dtype, ptr(Q), ptr(K), ptr(V), ptr(O), ptr(L));
    ++calls;
    const std::string msg = fa_last_error();
    const bool inputs_same = Q.same_bits(q0) && K.same_bits(k0) && V.same_bits(v0);
    if (!inputs_same) fail("the inputs were modified", stage, p, dtype);
    if (!ok || use_null) {
      ++refused;
      check_refusal(rc, msg, use_null ? std::vector<std::string>{"is NULL"} : why, stage, p, dtype,
                    "forward");
      if (!O.same_bits(o0) || !L.same_bits(l0))
        fail("forward wrote an output it refused", stage, p, dtype);
      return;
    }
    ++valid;
    if (rc != FA_OK)
      return fail("forward of a valid problem returned " + std::to_string(rc) + ": " + msg, stage,
                  p, dtype);
    if (!msg.empty()) fail("success left a message: " + msg, stage, p, dtype);
    // Every element written. With a moderate scale the logits of normal inputs are finite,
    // so O is finite and L finite or −inf; scale = FLT_MAX makes logits ±inf, and +inf
    // logits give NaN rows (as in PyTorch), so only "written" is checked there.
    const bool moderate = p.scale <= 1.0f;
    for (int64_t i = 0; i < O.n; ++i)
      if (is_sentinel(O.get()[i]) || (moderate && !std::isfinite(O.get()[i])))
        return fail("O[" + std::to_string(i) + "] is not written or not finite", stage, p, dtype);
    for (int64_t i = 0; i < L.n; ++i)
      if (is_sentinel(L.get()[i]) ||
          (moderate &&
           (std::isnan(L.get()[i]) || L.get()[i] == std::numeric_limits<float>::infinity())))
        return fail("L[" + std::to_string(i) + "] is not written, or NaN or +inf", stage, p, dtype);
    if (!has_backward) return;

    // Backward on the forward's own O and L, with a dtype and a scale fuzzed again.
    Buffer dO(nq, &rng), dQ(nq, nullptr), dK(nkv, nullptr), dV(nkv, nullptr);
    const auto do0 = dO.copy(), dq0 = dQ.copy(), dk0 = dK.copy(), dv0 = dV.copy(), o1 = O.copy(),
               l1 = L.copy();
    fa_problem pb = p;
    int32_t dtype_b = FA_F32;
    if (rng() % 4 == 0) {
      pb.scale = random_problem(rng).scale;
      dtype_b = random_dtype(rng);
    }
    const std::vector<std::string> why_b = faults(stage, pb, dtype_b);
    const auto bwd = reinterpret_cast<BackwardDtypeInt>(&fa_backward_dtype);
    rc = bwd(stage, &pb, dtype_b, Q.get(), K.get(), V.get(), O.get(), L.get(), dO.get(), dQ.get(),
             dK.get(), dV.get());
    ++calls;
    const std::string msg_b = fa_last_error();
    if (!Q.same_bits(q0) || !K.same_bits(k0) || !V.same_bits(v0) || !O.same_bits(o1) ||
        !L.same_bits(l1) || !dO.same_bits(do0))
      fail("backward modified an input", stage, pb, dtype_b);
    if (!why_b.empty()) {
      ++refused;
      check_refusal(rc, msg_b, why_b, stage, pb, dtype_b, "backward");
      if (!dQ.same_bits(dq0) || !dK.same_bits(dk0) || !dV.same_bits(dv0))
        fail("backward wrote an output it refused", stage, pb, dtype_b);
      return;
    }
    ++valid;
    if (rc != FA_OK)
      return fail("backward of a valid problem returned " + std::to_string(rc) + ": " + msg_b,
                  stage, pb, dtype_b);
    for (const Buffer* g : {&dQ, &dK, &dV})
      for (int64_t i = 0; i < g->n; ++i)
        if (is_sentinel(g->get()[i]) ||
            (moderate && pb.scale <= 1.0f && !std::isfinite(g->get()[i])))
          return fail("a gradient is not written or not finite", stage, pb, dtype_b);
  }

  // ---- stage 13 ----
  int64_t masked_calls = 0, masked_valid = 0, masked_refused = 0, masked_maybe = 0;
  bool device_probe = false;  // no GPU: the device entries' refusals are fuzzed too

  void fail_masked(const std::string& what, const char* entry, const fa_problem& p,
                   const ModSpec& spec, int32_t dtype = FA_F32) {
    if (++failures <= print_limit)
      std::printf(
          "FAIL %s: %s\n     problem {batch %d, heads %d, kv_heads %d, seq_q %d, seq_k %d, "
          "head_dim %d, causal %d, scale %g}, dtype %d\n     modifiers {%s}\n",
          entry, what.c_str(), p.batch, p.heads, p.kv_heads, p.seq_q, p.seq_k, p.head_dim,
          p.causal, double(p.scale), dtype, spec.describe().c_str());
  }

  template <typename T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[rng() % values.size()];
  }
  bool one_in(uint64_t n) { return rng() % n == 0; }

  // A random struct for p: mostly valid, each field now and then out of the contract.
  ModSpec random_mods(const fa_problem& p) {
    ModSpec s;
    if (one_in(64)) return s;  // NULL struct
    s.m.reset(new fa_modifiers{});
    fa_modifiers& m = *s.m;
    m.size = sizeof(fa_modifiers);
    if (one_in(20))
      m.size = pick<uint32_t>({0, 1, uint32_t(sizeof(fa_modifiers) - 4),
                               uint32_t(sizeof(fa_modifiers) - 8), uint32_t(sizeof(fa_modifiers) + 8),
                               std::numeric_limits<uint32_t>::max()});
    const int64_t n = std::max<int32_t>(0, std::max(p.seq_q, p.seq_k));
    const auto window = [&](int32_t* flag, int64_t* value) {
      *value = pick<int64_t>({0, 1, 2, 3, n > 0 ? n - 1 : 0, n, n + 5, int64_t(1) << 40,
                              std::numeric_limits<int64_t>::max()});
      if (one_in(8)) *value = pick<int64_t>({-1, -5, std::numeric_limits<int64_t>::min()});
      *flag = rng() % 3 != 0 ? 1 : 0;  // unset: the value (even negative) is ignored
      if (one_in(32)) *flag = pick<int32_t>({2, -1, std::numeric_limits<int32_t>::min()});
    };
    if (one_in(2)) window(&m.has_window_left, &m.window_left);
    if (one_in(2)) window(&m.has_window_right, &m.window_right);
    const double dinf = std::numeric_limits<double>::infinity();
    if (one_in(2))
      m.softcap = one_in(6) ? pick<double>({-0.0, -1.0, -1e-300, std::nan(""), dinf, -dinf})
                            : pick<double>({0.5, 1.0, 5.0, 30.0, 1e-30, 1e30, 1e38, 1e-44, 4e-320, 1e300});
    const float finf = std::numeric_limits<float>::infinity();
    const auto per_head = [&](Array<float>* a, const float** ptr, int32_t* count,
                              std::initializer_list<float> values) {
      if (one_in(2)) {
        if (one_in(8)) {  // a count of 0 with a pointer: no array, the pointer is not read
          a->assign({1.0f});
          *ptr = a->get();
        }
        return;
      }
      int64_t k = std::max<int32_t>(p.heads, 0);
      if (one_in(10)) k = std::max<int64_t>(1, k + pick<int64_t>({-1, 1, 2}));
      std::vector<float> v(size_t(std::min<int64_t>(k, 64)));
      for (float& x : v) x = values.begin()[rng() % values.size()];
      if (!v.empty() && one_in(16))
        v[rng() % v.size()] = pick<float>({std::nanf(""), finf, -finf});
      a->assign(v);
      *ptr = a->get();
      *count = a->n;
      if (one_in(40)) *count = pick<int32_t>({-1, std::numeric_limits<int32_t>::min()});
      if (one_in(40) && *count > 0) *ptr = nullptr;
    };
    per_head(&s.slopes, &m.alibi_slopes, &m.n_alibi_slopes,
             {0.0f, 0.5f, 0.25f, 0.0625f, 1.0f / 256, -0.5f, 1000.0f});
    per_head(&s.sinks, &m.sinks, &m.n_sinks,
             {0.0f, -1.0f, 2.5f, -30.0f, 80.0f, 100.0f, -100.0f, 1e30f, -1e30f});
    if (one_in(2)) {
      // Documents: D >= 1 (D = 0, one entry, now and then), lengths >= 0 (empty ones too),
      // ending at most at the tensor; then now and then one entry out of the contract.
      const int32_t docs = one_in(24) ? 0 : 1 + int32_t(rng() % 4);
      const auto cu = [&](int32_t n) {
        const int64_t total = std::max(n, 0);
        const int64_t end = one_in(2) ? total : int64_t(rng() % uint64_t(total + 1));
        std::vector<int32_t> c(size_t(docs) + 1, 0);
        for (int32_t i = 1; i < docs; ++i) c[size_t(i)] = int32_t(rng() % uint64_t(end + 1));
        if (docs > 0) c[size_t(docs)] = int32_t(end);
        std::sort(c.begin(), c.end());
        if (one_in(24)) c[0] = pick<int32_t>({1, -1, std::numeric_limits<int32_t>::min()});
        if (docs >= 1 && one_in(24)) {
          const size_t i = 1 + size_t(rng() % uint64_t(docs));
          c[i] = int32_t(std::max<int64_t>(int64_t(c[i - 1]) - 1 - int64_t(rng() % 3),
                                           std::numeric_limits<int32_t>::min()));
        }
        if (docs >= 1 && one_in(24))
          c[size_t(docs)] = int32_t(std::min<int64_t>(
              pick<int64_t>({total + 1, total + 7, std::numeric_limits<int32_t>::max()}),
              std::numeric_limits<int32_t>::max()));
        return c;
      };
      s.cu_q.assign(cu(p.seq_q));
      s.cu_k.assign(cu(p.seq_k));
      m.cu_seqlens_q = s.cu_q.get();
      m.cu_seqlens_k = s.cu_k.get();
      m.n_cu_seqlens = s.cu_q.n;
      if (one_in(40)) m.n_cu_seqlens = pick<int32_t>({-1, std::numeric_limits<int32_t>::min()});
      if (one_in(40)) (one_in(2) ? m.cu_seqlens_q : m.cu_seqlens_k) = nullptr;
    }
    return s;
  }

  // A problem for stage 13: mostly small and valid (batch 1 with documents), now and then
  // one of random_problem's (invalid, or too large: called with NULL buffers).
  fa_problem masked_problem(bool device) {
    if (one_in(8)) return random_problem(rng);
    fa_problem p{};
    p.kv_heads = 1 + int32_t(rng() % 2);
    p.heads = p.kv_heads * (1 + int32_t(rng() % 2));
    p.batch = one_in(3) ? 2 : 1;
    p.seq_q = int32_t(rng() % 25);
    p.seq_k = int32_t(rng() % 25);
    p.head_dim = device && !one_in(4) ? pick<int32_t>({64, 128}) : 1 + int32_t(rng() % 16);
    p.causal = one_in(24) ? pick<int32_t>({2, -1}) : int32_t(rng() % 2);
    p.scale = one_in(10) ? pick<float>({-1.0f, std::nanf("")}) : pick<float>({0.0f, 0.25f, 1.0f});
    return p;
  }

  // One refusal: the code, a message naming one of `why`, nothing written (the caller checks
  // the buffers).
  void check_masked_refusal(int rc, const std::string& msg, const std::vector<Fault>& why,
                            const char* entry, const fa_problem& p, const ModSpec& spec,
                            int32_t dtype = FA_F32) {
    ++masked_refused;
    if (rc != FA_ERR_INVALID)
      fail_masked("returned " + std::to_string(rc) + ", not FA_ERR_INVALID (1): " + msg, entry, p,
                  spec, dtype);
    if (!std::any_of(why.begin(), why.end(), [&](const Fault& f) { return names_fault(msg, f); })) {
      std::string all;
      for (const Fault& f : why) {
        all += " '";
        for (size_t i = 0; i < f.size(); ++i) all += (i ? "…" : "") + f[i];
        all += "'";
      }
      fail_masked("message '" + msg + "' names none of" + all, entry, p, spec, dtype);
    }
  }

  // Host entries: a forward, then a backward on its O and L.
  void masked_one() {
    fa_problem p = masked_problem(false);
    ModSpec spec = random_mods(p);
    // Documents with batch 2 now and then (refused), mostly with batch 1.
    if (spec.m && spec.m->n_cu_seqlens > 0 && p.batch == 2 && !one_in(6)) p.batch = 1;
    const std::vector<Fault> pf = problem_faults(p);
    const bool p_ok = pf.empty();
    const Sizes sz = p_ok ? sizes_of(p) : Sizes{0, 0, 0};
    const bool fits = p_ok && sz.q <= kMaxAllocElems && sz.kv <= kMaxAllocElems;
    const int64_t nq = fits ? int64_t(sz.q) : 64, nkv = fits ? int64_t(sz.kv) : 64,
                  nl = fits ? int64_t(sz.l) : 64;
    const ModFaults mf = modifier_faults(p, spec);
    Buffer Q(nq, &rng), K(nkv, &rng), V(nkv, &rng), O(nq, nullptr), L(nl, nullptr);
    const auto q0 = Q.copy(), k0 = K.copy(), v0 = V.copy(), o0 = O.copy(), l0 = L.copy();
    const auto sl0 = spec.slopes.copy(), si0 = spec.sinks.copy();
    const auto cq0 = spec.cu_q.copy(), ck0 = spec.cu_k.copy();
    // Buffer pointers: NULL for a valid problem too large to allocate, and now and then one
    // NULL on a small one (refused when the tensor has elements).
    int null_at = fits && one_in(12) ? int(rng() % 5) : -1;
    std::vector<Fault> bf;
    const int64_t elems[] = {nq, nkv, nkv, nq, nl};
    const char* names[] = {"Q", "K", "V", "O", "L"};
    const Buffer* bufs[] = {&Q, &K, &V, &O, &L};
    const float* ptrs[5];
    for (int i = 0; i < 5; ++i) {
      const bool null = (p_ok && !fits) || i == null_at;
      ptrs[i] = null ? nullptr : bufs[i]->get();
      if (null && (!fits || elems[i] > 0)) bf.push_back({std::string(" ") + names[i] + " ", "null"});
    }
    std::vector<Fault> why = pf;
    why.insert(why.end(), mf.definite.begin(), mf.definite.end());
    why.insert(why.end(), bf.begin(), bf.end());
    std::vector<Fault> why_maybe = why;  // what a refusal may name
    why_maybe.insert(why_maybe.end(), mf.maybe.begin(), mf.maybe.end());

    int rc = fa_forward_masked(&p, spec.m.get(), ptrs[0], ptrs[1], ptrs[2],
                               const_cast<float*>(ptrs[3]), const_cast<float*>(ptrs[4]));
    ++calls, ++masked_calls;
    std::string msg = fa_last_error();
    const char* fwd = "fa_forward_masked";
    if (!Q.same_bits(q0) || !K.same_bits(k0) || !V.same_bits(v0) || !spec.slopes.same_bits(sl0) ||
        !spec.sinks.same_bits(si0) || !spec.cu_q.same_bits(cq0) || !spec.cu_k.same_bits(ck0))
      fail_masked("an input was modified", fwd, p, spec);
    const bool maybe = why.empty() && !mf.maybe.empty();
    if (maybe) ++masked_maybe;
    if (!why.empty() || (maybe && rc != FA_OK)) {
      check_masked_refusal(rc, msg, why_maybe, fwd, p, spec);
      if (!O.same_bits(o0) || !L.same_bits(l0)) fail_masked("wrote an output it refused", fwd, p, spec);
      return;
    }
    ++masked_valid;
    if (rc != FA_OK)
      return fail_masked("a valid call returned " + std::to_string(rc) + ": " + msg, fwd, p, spec);
    if (!msg.empty()) fail_masked("success left a message: " + msg, fwd, p, spec);
    const fa_modifiers& m = *spec.m;
    const RowMask mask{p, m};
    // Finite outputs for moderate logits: scale <= 1 and slopes of |x| <= 1000 (the cap and
    // the sinks take any value the contract allows).
    const bool moderate = p.scale <= 1.0f;
    const int64_t d = p.head_dim;
    for (int32_t b = 0; b < p.batch; ++b)
      for (int32_t h = 0; h < p.heads; ++h)
        for (int64_t r = 0; r < p.seq_q; ++r) {
          const int64_t row = (int64_t(b) * p.heads + h) * p.seq_q + r;
          const auto [lo, hi] = mask.keys(r);
          const bool none = lo > hi;
          const float l = L.get()[row];
          const float sink = mf.sinks ? m.sinks[h] : -std::numeric_limits<float>::infinity();
          const std::string at = "row (b " + std::to_string(b) + ", h " + std::to_string(h) +
                                 ", i " + std::to_string(r) + ")";
          for (int64_t c = 0; c < d; ++c) {
            const float o = O.get()[row * d + c];
            if (is_sentinel(o)) return fail_masked("O of " + at + " is not written", fwd, p, spec);
            if (none && o != 0.0f)
              return fail_masked("O of " + at + ", which sees no key, is not 0", fwd, p, spec);
            if (moderate && !std::isfinite(o))
              return fail_masked("O of " + at + " is not finite", fwd, p, spec);
          }
          if (is_sentinel(l)) return fail_masked("L of " + at + " is not written", fwd, p, spec);
          if (none && !(l == sink))  // −inf without a sink, σ_h with one
            return fail_masked("L of " + at + ", which sees no key, is " + std::to_string(l) +
                                   ", not " + std::to_string(sink),
                               fwd, p, spec);
          if (!none && moderate &&
              (!std::isfinite(l) || (mf.sinks && l < sink - 1e-4f * (1.0f + std::fabs(sink)))))
            return fail_masked("L of " + at + " = " + std::to_string(l) +
                                   " is not finite, or below its sink",
                               fwd, p, spec);
        }
    backward_masked(p, spec, mf, Q, K, V, O, L, moderate);
  }

  void backward_masked(const fa_problem& p, ModSpec& fwd_spec, const ModFaults& fwd_mf,
                       const Buffer& Q, const Buffer& K, const Buffer& V, const Buffer& O,
                       const Buffer& L, bool moderate) {
    // The forward's struct, or (a quarter of the calls) another one: then the forward's O
    // and L are not its own, and only "written" is checked of a gradient.
    ModSpec other;
    const bool same = !one_in(4);
    if (!same) other = random_mods(p);
    const ModSpec& spec = same ? fwd_spec : other;
    const ModFaults mf = same ? fwd_mf : modifier_faults(p, spec);
    const int64_t nq = Q.n, nkv = K.n;
    Buffer dO(nq, &rng), dQ(nq, nullptr), dK(nkv, nullptr), dV(nkv, nullptr),
        dS(p.heads, nullptr);
    const auto q0 = Q.copy(), k0 = K.copy(), v0 = V.copy(), o0 = O.copy(), l0 = L.copy(),
               do0 = dO.copy(), dq0 = dQ.copy(), dk0 = dK.copy(), dv0 = dV.copy(),
               ds0 = dS.copy();
    const bool null_dsinks = one_in(8);
    std::vector<Fault> why = mf.definite;
    if (mf.sinks && why.empty() && null_dsinks) why.push_back({"dsinks", "null"});
    std::vector<Fault> why_maybe = why;
    why_maybe.insert(why_maybe.end(), mf.maybe.begin(), mf.maybe.end());
    const char* bwd = "fa_backward_masked";
    const int rc = fa_backward_masked(&p, spec.m.get(), Q.get(), K.get(), V.get(), O.get(),
                                      L.get(), dO.get(), dQ.get(), dK.get(), dV.get(),
                                      null_dsinks ? nullptr : dS.get());
    ++calls, ++masked_calls;
    const std::string msg = fa_last_error();
    if (!Q.same_bits(q0) || !K.same_bits(k0) || !V.same_bits(v0) || !O.same_bits(o0) ||
        !L.same_bits(l0) || !dO.same_bits(do0))
      fail_masked("an input was modified", bwd, p, spec);
    const bool maybe = why.empty() && !mf.maybe.empty();
    if (maybe) ++masked_maybe;
    if (!why.empty() || (maybe && rc != FA_OK)) {
      check_masked_refusal(rc, msg, why_maybe, bwd, p, spec);
      if (!dQ.same_bits(dq0) || !dK.same_bits(dk0) || !dV.same_bits(dv0) || !dS.same_bits(ds0))
        fail_masked("wrote an output it refused", bwd, p, spec);
      return;
    }
    ++masked_valid;
    if (rc != FA_OK)
      return fail_masked("a valid call returned " + std::to_string(rc) + ": " + msg, bwd, p, spec);
    if (!msg.empty()) fail_masked("success left a message: " + msg, bwd, p, spec);
    const bool finite = same && moderate;
    for (const Buffer* g : {&dQ, &dK, &dV})
      for (int64_t i = 0; i < g->n; ++i)
        if (is_sentinel(g->get()[i]) || (finite && !std::isfinite(g->get()[i])))
          return fail_masked("a gradient (dQ, dK or dV) is not written or not finite", bwd, p, spec);
    if (mf.sinks) {
      if (!null_dsinks)
        for (int64_t i = 0; i < dS.n; ++i)
          if (is_sentinel(dS.get()[i]) || (finite && !std::isfinite(dS.get()[i])))
            return fail_masked("dsinks[" + std::to_string(i) + "] is not written or not finite",
                               bwd, p, spec);
    } else if (!dS.same_bits(ds0)) {
      fail_masked("dsinks was written without sinks", bwd, p, spec);
    }
    // A row that sees no key has no gradient; nor has a key that no row sees.
    const RowMask mask{p, *spec.m};
    const int64_t d = p.head_dim;
    std::vector<char> seen(size_t(std::max(p.seq_k, 0)), 0);
    for (int64_t r = 0; r < p.seq_q; ++r) {
      const auto [lo, hi] = mask.keys(r);
      for (int64_t j = lo; j <= hi; ++j) seen[size_t(j)] = 1;
      if (lo <= hi) continue;
      for (int64_t bh = 0; bh < int64_t(p.batch) * p.heads; ++bh)
        for (int64_t c = 0; c < d; ++c)
          if (dQ.get()[(bh * p.seq_q + r) * d + c] != 0.0f)
            return fail_masked("dQ of row " + std::to_string(r) + ", which sees no key, is not 0",
                               bwd, p, spec);
    }
    for (int64_t j = 0; j < p.seq_k; ++j) {
      if (seen[size_t(j)]) continue;
      for (int64_t bh = 0; bh < int64_t(p.batch) * p.kv_heads; ++bh)
        for (int64_t c = 0; c < d; ++c) {
          const int64_t at = (bh * p.seq_k + j) * d + c;
          if (dK.get()[at] != 0.0f || dV.get()[at] != 0.0f)
            return fail_masked("dK or dV of key " + std::to_string(j) +
                                   ", which no row sees, is not 0",
                               bwd, p, spec);
        }
    }
  }

  // Device entries on a machine without a GPU: what fa_c.h says is checked before anything is
  // launched (the problem, the struct, the dtype) is refused as FA_ERR_INVALID; the rest (a
  // head_dim other than 64, 128, a NULL buffer or dsinks) may be refused as invalid or meet
  // the missing GPU first (FA_ERR_RUNTIME); a valid call is FA_ERR_RUNTIME. Nothing is
  // written: the "device" pointers are host buffers filled with the sentinel.
  void masked_device() {
    fa_problem p = masked_problem(true);
    ModSpec spec = random_mods(p);
    if (spec.m && spec.m->n_cu_seqlens > 0 && p.batch == 2 && !one_in(6)) p.batch = 1;
    const std::vector<Fault> pf = problem_faults(p);
    const bool p_ok = pf.empty();
    const Sizes sz = p_ok ? sizes_of(p) : Sizes{0, 0, 0};
    const bool fits = p_ok && sz.q <= kMaxAllocElems && sz.kv <= kMaxAllocElems;
    const int64_t nq = fits ? int64_t(sz.q) : 64, nkv = fits ? int64_t(sz.kv) : 64,
                  nl = fits ? int64_t(sz.l) : 64;
    const ModFaults mf = modifier_faults(p, spec);
    const int32_t dtype = one_in(4) ? pick<int32_t>({FA_F32, -1, 3, std::numeric_limits<int32_t>::min()})
                                    : pick<int32_t>({FA_F16, FA_BF16});
    std::vector<Fault> before = pf;  // refused before the GPU is looked for
    before.insert(before.end(), mf.definite.begin(), mf.definite.end());
    if (dtype != FA_F16 && dtype != FA_BF16) before.push_back({"dtype", std::to_string(dtype)});
    std::vector<Fault> later;  // refused, or the missing GPU reported first
    if (p_ok && p.head_dim != 64 && p.head_dim != 128) later.push_back({"head_dim", std::to_string(p.head_dim)});
    const bool null_all = (p_ok && !fits) || one_in(16);
    if (null_all) later.push_back({"null"});
    const bool null_dsinks = one_in(4);
    if (mf.sinks && null_dsinks) later.push_back({"dsinks", "null"});
    if (!mf.maybe.empty()) later.insert(later.end(), mf.maybe.begin(), mf.maybe.end());
    Buffer Q(nq, nullptr), K(nkv, nullptr), V(nkv, nullptr), O(nq, nullptr), L(nl, nullptr),
        dO(nq, nullptr), dQ(nq, nullptr), dK(nkv, nullptr), dV(nkv, nullptr), dS(16, nullptr);
    const Buffer* all[] = {&Q, &K, &V, &O, &L, &dO, &dQ, &dK, &dV, &dS};
    std::vector<std::vector<float>> b0;
    for (const Buffer* b : all) b0.push_back(b->copy());
    const auto untouched = [&] {
      for (size_t i = 0; i < b0.size(); ++i)
        if (!all[i]->same_bits(b0[i])) return false;
      return true;
    };
    const auto ptr = [&](const Buffer& b) { return null_all ? nullptr : b.get(); };
    const auto fwd = reinterpret_cast<ForwardMaskedDeviceInt>(&fa_forward_masked_device);
    const auto bwd = reinterpret_cast<BackwardMaskedDeviceInt>(&fa_backward_masked_device);
    for (const bool backward : {false, true}) {
      const char* entry = backward ? "fa_backward_masked_device" : "fa_forward_masked_device";
      const int rc =
          backward ? bwd(&p, spec.m.get(), dtype, ptr(Q), ptr(K), ptr(V), ptr(O), ptr(L), ptr(dO),
                         ptr(dQ), ptr(dK), ptr(dV), null_dsinks ? nullptr : dS.get(), nullptr)
                   : fwd(&p, spec.m.get(), dtype, ptr(Q), ptr(K), ptr(V), ptr(O), ptr(L), nullptr);
      ++calls, ++masked_calls;
      const std::string msg = fa_last_error();
      if (!untouched()) fail_masked("a buffer was written without a GPU", entry, p, spec, dtype);
      if (!before.empty()) {
        std::vector<Fault> why = before;
        why.insert(why.end(), later.begin(), later.end());
        check_masked_refusal(rc, msg, why, entry, p, spec, dtype);
        continue;
      }
      ++masked_refused;
      if (rc == FA_OK || msg.empty())
        fail_masked("without a GPU returned " + std::to_string(rc) + " with the message '" + msg + "'",
                    entry, p, spec, dtype);
      else if (later.empty() && rc != FA_ERR_RUNTIME)
        fail_masked("a valid call without a GPU returned " + std::to_string(rc) +
                        ", not FA_ERR_RUNTIME (3): " + msg,
                    entry, p, spec, dtype);
      else if (rc == FA_ERR_INVALID &&
               !std::any_of(later.begin(), later.end(), [&](const Fault& f) { return names_fault(msg, f); }))
        fail_masked("message '" + msg + "' names no value at fault", entry, p, spec, dtype);
      else if (rc != FA_ERR_INVALID && rc != FA_ERR_RUNTIME)
        fail_masked("returned " + std::to_string(rc) + ": " + msg, entry, p, spec, dtype);
    }
  }

  // Whether the device entries can be probed here: no GPU (a valid call with NULL buffers is
  // FA_ERR_RUNTIME, where a GPU would refuse the NULL tensors as FA_ERR_INVALID).
  bool no_gpu() {
    // A valid problem and struct with NULL buffers: the entry looks for a GPU before it looks
    // at the buffers, so it fails at run time without one and refuses the buffers with one.
    // (The plain device entries check their pointers first and cannot tell the two apart.)
    fa_modifiers m{};
    m.size = sizeof m;
    const fa_problem p{1, 1, 1, 4, 4, 64, 0, 0.0f};
    return fa_forward_masked_device(&p, &m, FA_F16, nullptr, nullptr, nullptr, nullptr, nullptr,
                                    nullptr) == FA_ERR_RUNTIME;
  }

  // Fixed cases, so that every kind of struct the contract speaks of is met in every run.
  void masked_edges() {
    const fa_problem p{1, 2, 1, 6, 5, 4, 1, 0.0f};
    const fa_problem p2{2, 2, 1, 6, 5, 4, 0, 0.0f};
    Buffer Q(96, &rng), K(40, &rng), V(40, &rng);
    const auto run = [&](const fa_problem& pp, const ModSpec& spec, bool valid) {
      Buffer O(96, nullptr), L(24, nullptr);
      const auto o0 = O.copy(), l0 = L.copy();
      const int rc = fa_forward_masked(&pp, spec.m.get(), Q.get(), K.get(), V.get(), O.get(), L.get());
      ++calls, ++masked_calls;
      const std::string msg = fa_last_error();
      if (valid) {
        ++masked_valid;
        if (rc != FA_OK) fail_masked("a valid call returned " + std::to_string(rc) + ": " + msg,
                                     "fa_forward_masked (fixed case)", pp, spec);
        return;
      }
      check_masked_refusal(rc, msg, modifier_faults(pp, spec).definite, "fa_forward_masked (fixed case)",
                           pp, spec);
      if (!O.same_bits(o0) || !L.same_bits(l0))
        fail_masked("wrote an output it refused", "fa_forward_masked (fixed case)", pp, spec);
    };
    const auto base = [&] {
      ModSpec s;
      s.m.reset(new fa_modifiers{});
      s.m->size = sizeof(fa_modifiers);
      return s;
    };
    const auto docs = [&](ModSpec& s, std::vector<int32_t> q, std::vector<int32_t> k) {
      s.cu_q.assign(q);
      s.cu_k.assign(k);
      s.m->cu_seqlens_q = s.cu_q.get();
      s.m->cu_seqlens_k = s.cu_k.get();
      s.m->n_cu_seqlens = s.cu_q.n;
    };
    const auto heads = [&](Array<float>* a, const float** ptr, int32_t* n, std::vector<float> v) {
      a->assign(v);
      *ptr = a->get();
      *n = a->n;
    };
    {
      ModSpec s = base();  // zeroed: plain attention
      run(p, s, true);
    }
    {
      ModSpec s = base();
      docs(s, {0, 0, 3, 3, 5}, {0, 2, 2, 4, 5});  // empty documents, rows past the last
      s.m->has_window_left = 1;
      s.m->window_left = 0;
      s.m->has_window_right = 1;
      s.m->window_right = 1000;
      s.m->softcap = 5;
      heads(&s.slopes, &s.m->alibi_slopes, &s.m->n_alibi_slopes, {0.5f, 0.25f});
      heads(&s.sinks, &s.m->sinks, &s.m->n_sinks, {0.0f, -2.0f});
      run(p, s, true);
    }
    ModSpec null;
    run(p, null, false);
    for (const uint32_t size : {0u, uint32_t(sizeof(fa_modifiers) - 8), uint32_t(sizeof(fa_modifiers) + 8)}) {
      ModSpec s = base();
      s.m->size = size;
      run(p, s, false);
    }
    for (const int32_t flag : {2, -1}) {
      ModSpec s = base();
      s.m->has_window_right = flag;
      run(p, s, false);
    }
    for (const int64_t w : {int64_t(-1), std::numeric_limits<int64_t>::min()}) {
      ModSpec s = base();
      s.m->has_window_left = 1;
      s.m->window_left = w;
      run(p, s, false);
    }
    for (const double cap : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
      ModSpec s = base();
      s.m->softcap = cap;
      run(p, s, false);
    }
    for (const std::vector<float>& v : std::vector<std::vector<float>>{
             {0.5f}, {0.5f, 0.5f, 0.5f}, {0.5f, std::nanf("")}, {std::numeric_limits<float>::infinity(), 1.0f}}) {
      ModSpec s = base();
      heads(&s.slopes, &s.m->alibi_slopes, &s.m->n_alibi_slopes, v);
      run(p, s, false);
      ModSpec t = base();
      heads(&t.sinks, &t.m->sinks, &t.m->n_sinks, v);
      run(p, t, false);
    }
    {
      ModSpec s = base();
      heads(&s.sinks, &s.m->sinks, &s.m->n_sinks, {1.0f, 1.0f});
      s.m->n_sinks = -2;
      run(p, s, false);
      ModSpec t = base();
      t.m->n_alibi_slopes = 2;  // NULL behind a count
      run(p, t, false);
    }
    for (const auto& [q, k] : std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>{
             {{1, 6}, {0, 5}},         // not from 0
             {{0, 4, 3}, {0, 2, 5}},   // decreasing
             {{0, 3, 7}, {0, 2, 5}},   // past seq_q
             {{0, 3, 6}, {0, 2, 6}}})  // past seq_k
    {
      ModSpec s = base();
      docs(s, q, k);
      run(p, s, false);
    }
    {
      ModSpec s = base();
      docs(s, {0, 3, 6}, {0, 2, 5});
      run(p2, s, false);  // documents with batch 2
      ModSpec t = base();
      docs(t, {0, 3, 6}, {0, 2, 5});
      t.m->n_cu_seqlens = -1;
      run(p, t, false);
      ModSpec u = base();
      docs(u, {0, 3, 6}, {0, 2, 5});
      u.m->cu_seqlens_k = nullptr;
      run(p, u, false);
    }
  }

  void check_refusal(int rc, const std::string& msg, const std::vector<std::string>& why,
                     const char* stage, const fa_problem& p, int32_t dtype, const char* what) {
    if (rc != FA_ERR_INVALID)
      fail(std::string(what) + " returned " + std::to_string(rc) +
               ", not FA_ERR_INVALID (1): " + msg,
           stage, p, dtype);
    const bool named = std::any_of(why.begin(), why.end(), [&](const std::string& w) {
      return msg.find(w) != std::string::npos;
    });
    // A call that names a stage gets a message that names it too.
    if (stage != nullptr && std::find(stages.begin(), stages.end(), stage) != stages.end() &&
        msg.find(stage) == std::string::npos)
      fail(std::string(what) + " message '" + msg + "' does not name the stage", stage, p, dtype);
    if (!named) {
      std::string all;
      for (const auto& w : why) all += " '" + w + "'";
      fail(std::string(what) + " message '" + msg + "' names none of" + all, stage, p, dtype);
    }
  }

  // Stage names: NULL, empty, ambiguous, unknown must be refused with code 1.
  void names() {
    const fa_problem p{1, 1, 1, 4, 4, 8, 0, 0.0f};
    Buffer Q(32, &rng), O(32, nullptr), L(4, nullptr);
    const auto o0 = O.copy();
    struct Case {
      const char* name;
      const char* says;
    };
    for (const Case c : {Case{nullptr, "NULL"}, Case{"", "is not a stage"},
                         Case{"0", "matches several"}, Case{"99_nothing", "is not a stage"}}) {
      const int rc = fa_forward(c.name, &p, Q.get(), Q.get(), Q.get(), O.get(), L.get());
      ++calls;
      check_refusal(rc, fa_last_error(), {c.says}, c.name, p, FA_F32, "forward");
      if (!O.same_bits(o0)) fail("a refused stage name wrote O", c.name, p, FA_F32);
    }
    const int rc = fa_forward("05", nullptr, Q.get(), Q.get(), Q.get(), O.get(), L.get());
    ++calls;
    check_refusal(rc, fa_last_error(), {"problem pointer is NULL"}, "05", p, FA_F32, "forward");
  }
};

int64_t env_int(const char* name, int64_t fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != '\0' ? std::strtoll(e, nullptr, 10) : fallback;
}

}  // namespace

int main() {
  uint64_t seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  if (const char* e = std::getenv("FA_FUZZ_SEED")) seed = std::strtoull(e, nullptr, 10);
  const int64_t max_calls = env_int("FA_FUZZ_CALLS", 3000);
  const double max_seconds = double(env_int("FA_FUZZ_SECONDS", 10));
  std::printf("fuzz_abi: seed %llu (replay with FA_FUZZ_SEED=%llu); at most %lld calls or %.0f s\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed),
              static_cast<long long>(max_calls), max_seconds);
  std::fflush(stdout);

  Fuzzer f{std::mt19937_64(seed), {}, 0, 0, 0, 0};
  std::vector<bool> backward;
  for (int i = 0; i < fa_stage_count(); ++i) {
    const char* name = fa_stage_name(i);
    if (fa_stage_is_gpu(name) == 0) {
      f.stages.push_back(name);
      backward.push_back(fa_stage_has_backward(name) == 1);
    }
  }
  if (f.stages.empty()) {
    std::printf("FAIL no CPU stage in the library\n");
    return 1;
  }
  f.print_limit = env_int("FA_FUZZ_PRINT", 20);
  f.names();
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Stage 13's entries take two shares of the calls beside the stages' one each: the host
  // entries, and (without a GPU) the device entries' refusals.
  f.masked_edges();
  f.device_probe = f.no_gpu();
  while (f.calls < max_calls && elapsed() < max_seconds) {
    const size_t k = size_t(f.rng() % (f.stages.size() + 2));
    if (k < f.stages.size())
      f.one(f.stages[k].c_str(), backward[k]);
    else if (k == f.stages.size() + 1 && f.device_probe)
      f.masked_device();
    else
      f.masked_one();
  }
  std::printf(
      "fuzz_abi: %lld calls in %.1f s, %lld failures\n"
      "  the %zu CPU stages: %lld valid, %lld refused\n"
      "  stage 13's entries (%s): %lld calls, %lld valid, %lld refused, %lld with a one-entry "
      "cu_seqlens\n",
      static_cast<long long>(f.calls), elapsed(), static_cast<long long>(f.failures),
      f.stages.size(), static_cast<long long>(f.valid), static_cast<long long>(f.refused),
      f.device_probe ? "host, and device without a GPU" : "host only: a GPU is present",
      static_cast<long long>(f.masked_calls), static_cast<long long>(f.masked_valid),
      static_cast<long long>(f.masked_refused), static_cast<long long>(f.masked_maybe));
  return f.failures == 0 ? 0 : 1;
}
