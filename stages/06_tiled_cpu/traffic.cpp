// Stage 06's slow-memory traffic, predicted from the tile geometry alone.
//
// tiled_cpu.cpp and tiled_backward.cpp count every element that load() and store()
// (fast_memory.h) move; this file says what that count must be, tile by tile, without
// running anything. The tests require the two to be equal, element for element and array
// by array. Without a causal mask the sums collapse to closed forms (per (batch, head);
// g = heads / kv_heads; T_r = ⌈N_q/B_r⌉, T_c = ⌈N_k/B_c⌉):
//
//   forward:   read  Q: N_q·d    K, V: T_r·N_k·d each
//              write O: N_q·d    L: N_q
//   backward:  D pass:    read O, dO: N_q·d each;  write D: N_q
//              dK/dV pass (per kv head): read K, V: N_k·d each; read Q, dO: g·T_c·N_q·d each,
//                                        L, D: g·T_c·N_q each; write dK, dV: N_k·d each
//              dQ pass:   read Q, dO: N_q·d each, L, D: N_q each; K, V: T_r·N_k·d each;
//                         write dQ: N_q·d
//
// A causal mask removes the tiles above the diagonal: query tile i reads only the key tiles
// 0 … key_tiles_visited(i)−1, and key tile j is read only by query tiles first_query_tile(j) ….
#include <algorithm>
#include <sstream>

#include "tiled_cpu.h"

namespace fa::stage06 {

const char* array_name(int a) {
  static const char* const names[kArrayCount] = {"Q", "K", "V", "O", "L", "dO", "D", "dQ", "dK", "dV"};
  return a >= 0 && a < kArrayCount ? names[a] : "?";
}

int64_t Traffic::reads() const {
  int64_t sum = 0;
  for (int64_t x : read) sum += x;
  return sum;
}

int64_t Traffic::writes() const {
  int64_t sum = 0;
  for (int64_t x : written) sum += x;
  return sum;
}

Traffic& Traffic::operator+=(const Traffic& o) {
  for (int a = 0; a < kArrayCount; ++a) {
    read[size_t(a)] += o.read[size_t(a)];
    written[size_t(a)] += o.written[size_t(a)];
  }
  return *this;
}

std::string Traffic::describe() const {
  std::ostringstream s;
  const auto list = [&](const std::array<int64_t, kArrayCount>& x) {
    bool first = true;
    for (int a = 0; a < kArrayCount; ++a) {
      if (x[size_t(a)] == 0) continue;
      s << (first ? "" : ", ") << array_name(a) << " " << x[size_t(a)];
      first = false;
    }
  };
  s << "read " << reads() << " (";
  list(read);
  s << "), written " << writes() << " (";
  list(written);
  s << ")";
  return s.str();
}

namespace {
// Rows in query tile i, keys in key tile j (the last tile of each may be short).
int64_t rows_of(const Problem& p, const Tiles& t, int64_t i) {
  return std::min(t.B_r, p.seq_q - i * t.B_r);
}
int64_t cols_of(const Problem& p, const Tiles& t, int64_t j) {
  return std::min(t.B_c, p.seq_k - j * t.B_c);
}
// Keys in key tiles 0 … n−1.
int64_t keys_in_first_tiles(const Problem& p, const Tiles& t, int64_t n) {
  return std::min<int64_t>(p.seq_k, n * t.B_c);
}
// Rows in query tiles i0 … T_r−1.
int64_t rows_from_tile(const Problem& p, const Tiles& t, int64_t i0) {
  return std::max<int64_t>(0, p.seq_q - i0 * t.B_r);
}
}  // namespace

Traffic predicted_forward_traffic(const Problem& p, const Config& c) {
  const Tiles t = tiles_for(p, c);
  const int64_t d = p.head_dim;
  Traffic one_head;  // every (batch, head) moves the same amount
  for (int64_t i = 0; i < t.T_r; ++i) {
    const int64_t rows = rows_of(p, t, i);
    const int64_t keys = keys_in_first_tiles(p, t, key_tiles_visited(p, t, i));
    one_head.read[kQ] += rows * d;
    one_head.read[kK] += keys * d;
    one_head.read[kV] += keys * d;
    one_head.written[kO] += rows * d;
    one_head.written[kL] += rows;
  }
  Traffic total;
  for (int64_t n = 0; n < int64_t(p.batch) * p.heads; ++n) total += one_head;
  return total;
}

Traffic predicted_backward_traffic(const Problem& p, const Config& c) {
  const Tiles t = tiles_for(p, c);
  const int64_t d = p.head_dim, g = p.group_size();
  Traffic per_head;  // D pass and dQ pass, per (batch, query head)
  per_head.read[kO] += p.seq_q * d;
  per_head.read[kdO] += p.seq_q * d;
  per_head.written[kD] += p.seq_q;
  for (int64_t i = 0; i < t.T_r; ++i) {
    const int64_t rows = rows_of(p, t, i);
    const int64_t keys = keys_in_first_tiles(p, t, key_tiles_visited(p, t, i));
    per_head.read[kQ] += rows * d;
    per_head.read[kdO] += rows * d;
    per_head.read[kL] += rows;
    per_head.read[kD] += rows;
    per_head.read[kK] += keys * d;
    per_head.read[kV] += keys * d;
    per_head.written[kdQ] += rows * d;
  }
  Traffic per_kv_head;  // dK/dV pass, per (batch, kv head)
  for (int64_t j = 0; j < t.T_c; ++j) {
    const int64_t cols = cols_of(p, t, j);
    const int64_t rows = g * rows_from_tile(p, t, first_query_tile(p, t, j));
    per_kv_head.read[kK] += cols * d;
    per_kv_head.read[kV] += cols * d;
    per_kv_head.read[kQ] += rows * d;
    per_kv_head.read[kdO] += rows * d;
    per_kv_head.read[kL] += rows;
    per_kv_head.read[kD] += rows;
    per_kv_head.written[kdK] += cols * d;
    per_kv_head.written[kdV] += cols * d;
  }
  Traffic total;
  for (int64_t n = 0; n < int64_t(p.batch) * p.heads; ++n) total += per_head;
  for (int64_t n = 0; n < int64_t(p.batch) * p.kv_heads; ++n) total += per_kv_head;
  return total;
}

}  // namespace fa::stage06
