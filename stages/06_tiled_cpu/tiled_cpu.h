/// \file tiled_cpu.h
/// \brief Stage 06: FlashAttention-2 on the CPU — B_r × B_c tiles sized to a fast-memory
/// budget, forward and backward, with counted slow-memory traffic.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "problem.h"
#include "stage.h"

namespace fa::stage06 {

/// The stage's name (StageInfo::name, its folder): its option table's, and the first
/// word of every refusal.
inline constexpr const char* kStageName = "06_tiled_cpu";

/// How the work is cut up. Every field has a command-line flag and a C ABI option.
struct Config {
  /// B_r, query rows per tile; 0 means "from sram_bytes": min(⌈M/4d⌉, d).
  int block_q = 0;
  /// B_c, key rows per tile; 0 means "from sram_bytes": ⌈M/4d⌉.
  int block_k = 0;
  /// The fast-memory budget in bytes. The papers' M counts elements, so M = sram_bytes / 4
  /// (fp32). The default, 256 KiB, is the private L2 cache of a CPU core (256 KiB on older
  /// x86 cores, 1–2 MiB on recent ones): the CPU's closest analogue of a GPU's shared memory.
  /// At d = 64 it gives B_c = 256, B_r = 64.
  int64_t sram_bytes = 256 * 1024;
  /// Worker threads, 1 … kMaxThreads. Results are bitwise the same for any count.
  int threads = 1;
};

/// The most worker threads a run starts (each is an OS thread with its own fast memory).
inline constexpr int kMaxThreads = 1024;

/// The large arrays whose traffic is counted. D = rowsum(dO∘O) is the backward's own
/// O(N) scratch array in slow memory, so it is counted too.
enum Array { kQ, kK, kV, kO, kL, kdO, kD, kdQ, kdK, kdV, kArrayCount };
/// "Q", "K", ..., "dV".
const char* array_name(int a);

/// Elements (not bytes) read from and written to the large arrays by one run.
struct Traffic {
  std::array<int64_t, kArrayCount> read{}, written{};
  int64_t reads() const;
  int64_t writes() const;
  Traffic& operator+=(const Traffic& o);
  bool operator==(const Traffic& o) const { return read == o.read && written == o.written; }
  /// One line such as "reads 9437184 (Q 262144, K 4194304, ...), writes 266240 (...)".
  std::string describe() const;
};

/// The tile sizes a problem is run with, and how many tiles that makes.
struct Tiles {
  int64_t B_r, B_c;  ///< rows per query tile, rows per key/value tile
  int64_t T_r, T_c;  ///< ⌈N_q / B_r⌉ query tiles, ⌈N_k / B_c⌉ key tiles
};

/// B_c = ⌈M/4d⌉ and B_r = min(⌈M/4d⌉, d) with M = sram_bytes/4 elements (unless set), and
/// the tile counts. Throws std::invalid_argument for a negative block size, a budget ≤ 0
/// or a thread count outside 1 … kMaxThreads.
Tiles tiles_for(const Problem& p, const Config& c);

/// The causal skip (both directions). Query tile i visits key tiles 0 … n−1 with
/// n = key_tiles_visited(p, t, i): they hold a key that some row of tile i sees, and every
/// later key tile lies entirely above the diagonal. Without a causal mask n = T_c.
int64_t key_tiles_visited(const Problem& p, const Tiles& t, int64_t i);
/// Key tile j is visited by query tiles first_query_tile(p, t, j) … T_r−1: the rows of the
/// earlier query tiles see none of its keys. Without a causal mask this is 0.
int64_t first_query_tile(const Problem& p, const Tiles& t, int64_t j);

/// FlashAttention-2 forward (Algorithm 1), on host fp32 buffers in the layouts of
/// docs/design.md §3. Writes O and L = m + log l. Counts traffic into `traffic` when it is
/// not null (and costs nothing when it is).
void forward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V,
             float* O, float* L, Traffic* traffic = nullptr);

/// FlashAttention-2 backward (Algorithm 2), recomputing P from L. O and L are this stage's
/// forward outputs; dQ, dK, dV are overwritten (for GQA, dK and dV sum the query heads of a
/// group). Counts traffic into `traffic` when it is not null.
void backward(const Problem& p, const Config& c, const float* Q, const float* K, const float* V,
              const float* O, const float* L, const float* dO, float* dQ, float* dK, float* dV,
              Traffic* traffic = nullptr);

/// The traffic forward() and backward() perform, from the tile geometry alone (traffic.cpp).
/// The tests require the counted traffic to equal these exactly.
Traffic predicted_forward_traffic(const Problem& p, const Config& c);
Traffic predicted_backward_traffic(const Problem& p, const Config& c);

/// The driver's view of this stage. Its forward/backward read the calling thread's Config
/// from the stage's option table (register.cpp), set by the command line (--block-q
/// --block-k --sram-bytes --threads --count-traffic) or by set_option("block_q" | "block_k"
/// | "sram_bytes" | "threads" | "count_traffic", v); get_counter("reads" | "writes" |
/// "reads_K" | "writes_dQ" | ...) returns the counts of the calling thread's last run.
StageInfo info();

}  // namespace fa::stage06
