#include "decode_reference.h"

#include <algorithm>

#include "compare.h"

namespace fa {

DecodeReference decode_reference(const DecodeProblem& p, const float* Q, const float* K_cache,
                                 const float* V_cache, const int* block_table, RefMode mode) {
  p.validate("decode reference");
  p.validate_block_table(block_table, "decode reference");
  DecodeReference r;
  r.O.assign(size_t(p.q_elems()), 0.0);
  r.L.assign(size_t(p.l_elems()), 0.0);
  const int64_t d = p.head_dim;
  for (int b = 0; b < p.batch; ++b) {
    const Problem one = p.as_problem(b);  // batch 1, seq_q = q_len, seq_k = this sequence's length
    // This sequence's keys and values, out of the cache: [kv_heads][len][d].
    std::vector<float> K(size_t(one.kv_elems())), V(size_t(one.kv_elems()));
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int64_t j = 0; j < one.seq_k; ++j) {
        const int64_t from = p.cache_offset(block_table, b, hk, j), to = one.kv_offset(0, hk, j);
        std::copy(K_cache + from, K_cache + from + d, K.begin() + to);
        std::copy(V_cache + from, V_cache + from + d, V.begin() + to);
      }
    const Reference ref = reference_forward(one, Q + p.q_offset(b, 0, 0), K.data(), V.data(), mode);
    std::copy(ref.O.begin(), ref.O.end(), r.O.begin() + p.q_offset(b, 0, 0));
    std::copy(ref.L.begin(), ref.L.end(), r.L.begin() + p.l_offset(b, 0, 0));
  }
  return r;
}

CheckReport check_decode(const DecodeProblem& p, Dtype dtype, const DecodeTensors& t, const float* O,
                         const float* L) {
  const int* table = p.paged() ? t.block_table.data() : nullptr;
  const DecodeReference exact = decode_reference(p, t.Q.data(), t.K_cache.data(), t.V_cache.data(), table);
  double err_O = 0, err_L = 0;
  for (RefMode mode : baseline_modes(dtype)) {
    const DecodeReference base = decode_reference(p, t.Q.data(), t.K_cache.data(), t.V_cache.data(), table, mode);
    err_O = std::max(err_O, baseline_error(exact.O, base.O));
    err_L = std::max(err_L, baseline_error(exact.L, base.L));
  }
  CheckReport r;
  r.items.push_back(compare("O", O, exact.O, {p.batch, p.heads, p.q_len, p.head_dim}, tolerance(exact.O, err_O, dtype)));
  r.items.push_back(compare("L", L, exact.L, {p.batch, p.heads, p.q_len, 1}, tolerance(exact.L, err_L, dtype)));
  return r;
}

}  // namespace fa
