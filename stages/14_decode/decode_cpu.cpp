// Stage 14, the CPU step — split-KV decoding across threads, over stage 05's row loop.
//
// What changed from stage 05: nothing in the row loop. What changes is who runs it. A decode
// step has few query rows (heads × q_len per sequence) and many keys (the cache), so the
// work cannot be spread over rows: there are too few. It is spread over the keys instead.
// The keys of each (sequence, KV head) are cut into `splits` ranges; every range is a task
// for any thread; a task runs stage 05's one-pass loop on its keys for every query row of
// the KV head, which gives each row a partial result (O_s, L_s) over that range. Partials of
// disjoint key sets merge exactly by the log-sum-exp rule of stage 12 (common/merge.h):
//
//     L = log Σ_s e^{L_s},   O = Σ_s e^{L_s − L}·O_s
//
// taken one partial after another as stage 05 takes keys: each partial is a "key" whose
// score is L_s and whose value is O_s (MergeMany: a running max of the L_s, a running sum of
// e^{L_s − max}, the outputs rescaled when the max moves, L rounded once at the end).
//
// Algorithm (flash-decoding), for each sequence b and KV head hk:
//   chunk = ceil(len_b / splits)
//   in parallel, for each split s:  keys [s·chunk, (s+1)·chunk) ∩ [0, len_b)
//       for each query head h of hk's group, each new token i:
//           (O_s, L_s) = stage05 row loop over the keys of the split that row i sees
//   for each row, in split order:  (O, L) = merge of (O_0, L_0) … (O_{S−1}, L_{S−1})  — the combine
//
// A paged cache holds a sequence's keys in blocks scattered over a pool: a split's keys are
// then several contiguous runs, one per block, each a stage 05 call whose result merges into
// the split's partial by the same rule. The result depends on the number of splits only
// through rounding: the merge is exact in real arithmetic (test "split count does not change
// the result").
//
// Memory: splits × rows × (d + 1) floats of partials. Run: ./build/stages/14_decode/stage14 --cpu
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "decode.h"
#include "merge.h"
#include "one_pass_fused.h"
#include "tensors.h"

namespace fa::stage14 {

namespace {

using fa::stage12::MergeMany;

// The partial result of one query row q over keys [from, to) of (sequence b, KV head hk):
// stage 05's loop on each contiguous run of those keys (the whole range in a contiguous
// cache, one piece per block in a paged one), the runs merged into (O_part, L_part).
void attend_range(const DecodeProblem& p, const float* q, const float* K_cache, const float* V_cache,
                  const int* table, int b, int hk, int64_t from, int64_t to, float* O_part, float& L_part,
                  std::vector<float>& O_run) {
  const int d = p.head_dim;
  std::fill(O_part, O_part + d, 0.0f);
  MergeMany merged;  // over no run yet: (O = 0, L = −∞)
  Problem run;       // one query row against n keys: stage 05's problem
  run.seq_q = 1;
  run.head_dim = d;
  run.scale = p.softmax_scale();
  for (int64_t j = from; j < to;) {
    // The run of keys starting at j that lie next to each other in memory.
    const int64_t end = p.paged() ? std::min(to, (j / p.block_size + 1) * p.block_size) : to;
    run.seq_k = int(end - j);
    const int64_t at = p.cache_offset(table, b, hk, j);
    float L_run;
    stage05::forward(run, q, K_cache + at, V_cache + at, O_run.data(), &L_run);
    const MergeMany::Factors f = merged.add(L_run);  // O_part ← rescale·O_part + weight·O_run
    for (int c = 0; c < d; ++c) O_part[c] = f.rescale * O_part[c] + f.weight * O_run[size_t(c)];
    j = end;
  }
  for (int c = 0; c < d; ++c) O_part[c] *= merged.normaliser();
  L_part = merged.L();
}

}  // namespace

int cpu_splits(const CpuOptions& options) {
  if (options.splits > 0) return options.splits;
  if (options.threads > 0) return options.threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

void decode_cpu(const DecodeProblem& p, const float* Q, const float* K_cache, const float* V_cache,
                const int* block_table, float* O, float* L, const CpuOptions& options) {
  const std::string who = std::string(kStageName) + " (cpu)";
  p.validate(who);
  p.validate_block_table(block_table, who);
  if (options.splits < 0 || options.splits > 4096)
    throw std::invalid_argument(who + ": splits = " + std::to_string(options.splits) +
                                " is not allowed (allowed: 0 = one per thread, or 1 to 4096)");
  if (options.threads < 0 || options.threads > 1024)
    throw std::invalid_argument(who + ": threads = " + std::to_string(options.threads) +
                                " is not allowed (allowed: 0 = the machine's, or 1 to 1024)");
  const int splits = cpu_splits(options);
  const int d = p.head_dim, group = p.group_size();
  const int64_t rows = p.l_elems();  // every (b, h, i): one partial per split

  //! [cpu split]
  // Partials of every split: O_split [splits][b][h][i][d], L_split [splits][b][h][i].
  std::vector<float> O_split = allocate(splits * rows * d, "the CPU step's partial outputs");
  std::vector<float> L_split = allocate(splits * rows, "the CPU step's partial log-sum-exps");
  const int64_t tasks = int64_t(p.batch) * p.kv_heads * splits;  // (b, hk, s)
  std::atomic<int64_t> next{0};
  // A task that throws (a refusal in stage 05's loop, say) must not end the process from a
  // worker thread: the first exception is kept, the others stop taking tasks, and it is
  // thrown again here once every thread has joined.
  std::exception_ptr failure;
  std::mutex failure_lock;
  auto run_tasks = [&] {
    std::vector<float> O_run(static_cast<size_t>(d));  // [d] one run's output, before it merges
    for (int64_t t = next++; t < tasks; t = next++) {
      const int s = int(t % splits), hk = int(t / splits % p.kv_heads), b = int(t / splits / p.kv_heads);
      const int64_t len = p.cache_seqlens[size_t(b)];
      const int64_t chunk = (len + splits - 1) / splits;  // keys per split; the last may be short
      const int64_t from = std::min(len, s * chunk), to = std::min(len, from + chunk);
      for (int h = hk * group; h < (hk + 1) * group; ++h)
        for (int i = 0; i < p.q_len; ++i) {
          const int64_t row = p.l_offset(b, h, i);
          attend_range(p, Q + p.q_offset(b, h, i), K_cache, V_cache, block_table, b, hk, from,
                       std::min(to, std::max(from, p.visible_keys(b, i))),  // causal: keys row i sees
                       &O_split[size_t((s * rows + row) * d)], L_split[size_t(s * rows + row)], O_run);
        }
    }
  };
  auto worker = [&] {
    try {
      run_tasks();
    } catch (...) {
      const std::lock_guard<std::mutex> hold(failure_lock);
      if (!failure) failure = std::current_exception();
      next = tasks;  // nobody takes another task
    }
  };
  const int threads = int(std::min<int64_t>(tasks, options.threads > 0 ? options.threads : splits));
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  //! [cpu split]

  //! [cpu combine]
  // The combine: each row's partials merged in split order (a fixed order, so the result
  // does not depend on which thread finished first).
  for (int64_t row = 0; row < rows; ++row) {
    // LAB BEGIN: merge a row's splits — hint: MergeMany merged; per split s in order: f = merged.add(L_s); o = f.rescale·o + f.weight·O_s; at the end o *= merged.normaliser() and L = merged.L()
    float* o = O + row * d;
    std::fill(o, o + d, 0.0f);
    MergeMany merged;
    for (int s = 0; s < splits; ++s) {
      const MergeMany::Factors f = merged.add(L_split[size_t(s * rows + row)]);
      const float* O_s = &O_split[size_t((s * rows + row) * d)];
      for (int c = 0; c < d; ++c) o[c] = f.rescale * o[c] + f.weight * O_s[c];
    }
    for (int c = 0; c < d; ++c) o[c] *= merged.normaliser();
    L[row] = merged.L();
    // LAB END
  }
  //! [cpu combine]
}

void append_kv_cpu(const DecodeProblem& p, const float* K_new, const float* V_new, float* K_cache, float* V_cache,
                   const int* block_table) {
  const std::string who = std::string(kStageName) + " (append)";
  p.validate(who);
  p.validate_block_table(block_table, who);
  p.validate_append(who);
  append_kv_host(p, K_new, V_new, K_cache, V_cache, block_table);
}

}  // namespace fa::stage14
