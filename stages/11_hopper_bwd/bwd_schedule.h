/// \file bwd_schedule.h
/// \brief Which query tiles meet a key tile, and which of them need a mask: plain integer
/// math shared by the kernels and the CPU tests.
#pragma once

#if defined(__CUDACC__)
#define FA11_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA11_HOST_DEVICE inline
#endif

namespace fa::stage11 {

/// The query tiles of B_r rows that a key tile [key0, key0 + B_c) meets: first … first +
/// count − 1 (always up to the last tile: under the bottom-right causal mask a key, once
/// seen, is seen by every later row). Tiles before first_unmasked need the mask: they
/// cross the causal diagonal, or the key tile runs past seq_k (its missing keys must not
/// contribute, so every tile of it is masked).
struct QueryTiles {
  int first;
  int count;
  int first_unmasked;
};

FA11_HOST_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }

FA11_HOST_DEVICE QueryTiles query_tiles(int key0, int B_c, int B_r, int seq_q, int seq_k, bool causal) {
  const int tiles = ceil_div(seq_q, B_r);
  QueryTiles t{0, tiles, 0};
  if (causal) {
    const int shift = seq_k - seq_q;  // row i sees keys ≤ i + shift
    // The first row that sees key0, and the first that sees the tile's last key.
    const int sees_first = key0 - shift < 0 ? 0 : key0 - shift;
    const int last_key = (key0 + B_c < seq_k ? key0 + B_c : seq_k) - 1;
    const int sees_all = last_key - shift < 0 ? 0 : last_key - shift;
    t.first = sees_first / B_r < tiles ? sees_first / B_r : tiles;
    t.count = tiles - t.first;
    t.first_unmasked = ceil_div(sees_all, B_r) < tiles ? ceil_div(sees_all, B_r) : tiles;
  }
  if (key0 + B_c > seq_k) t.first_unmasked = tiles;
  return t;
}

}  // namespace fa::stage11
