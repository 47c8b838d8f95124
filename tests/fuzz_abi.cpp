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
//   fuzz_abi                 FA_FUZZ_SEED=<n> replays a run; FA_FUZZ_SECONDS (default 10)
//                            and FA_FUZZ_CALLS (default 3000) bound it, whichever comes first.
#include <algorithm>
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

struct Fuzzer {
  std::mt19937_64 rng;
  std::vector<std::string> stages;  // CPU stages
  int64_t calls = 0, valid = 0, refused = 0, failures = 0;

  void fail(const std::string& what, const char* stage, const fa_problem& p, int32_t dtype) {
    if (++failures <= 20)
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
  f.names();
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (f.calls < max_calls && elapsed() < max_seconds) {
    const size_t k = size_t(f.rng() % f.stages.size());
    f.one(f.stages[k].c_str(), backward[k]);
  }
  std::printf(
      "fuzz_abi: %lld calls over %zu CPU stages in %.1f s: %lld valid, %lld refused, %lld "
      "failures\n",
      static_cast<long long>(f.calls), f.stages.size(), elapsed(), static_cast<long long>(f.valid),
      static_cast<long long>(f.refused), static_cast<long long>(f.failures));
  return f.failures == 0 ? 0 : 1;
}
