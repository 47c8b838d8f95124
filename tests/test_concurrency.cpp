// Several threads use the C ABI at once, each with its own options (docs/design.md §10: options
// are per thread, not process-global): stage 06 with different tile sizes, worker counts
// and the traffic count, stage 05 beside it. Every result must be bitwise the one the same
// options give when run alone, and every thread must read its own traffic counters. CI
// runs this program under ThreadSanitizer too (the "tsan" preset), which reports any data
// race on the options or the counters.
//
// Only the C ABI is used (libfa_c.so), as a Python program with threads would use it.
#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fa_c.h"

namespace {

const char* kStage06 = "06_tiled_cpu";

// One thread's settings of stage 06 (0: the default).
struct Settings {
  int64_t block_q, block_k, threads;
};

struct Run {
  std::vector<float> O, L;
  int64_t reads = -1, writes = -1, reads_K = -1;
  std::string error;  ///< empty when every call succeeded
};

struct Inputs {
  fa_problem p;
  std::vector<float> Q, K, V;
};

Inputs make_inputs() {
  Inputs in;
  in.p = fa_problem{1, 4, 2, 150, 130, 32, 1, 0.0f};
  const size_t q = size_t(in.p.batch) * in.p.heads * in.p.seq_q * in.p.head_dim;
  const size_t kv = size_t(in.p.batch) * in.p.kv_heads * in.p.seq_k * in.p.head_dim;
  std::mt19937 gen(14);
  std::normal_distribution<float> normal;
  for (auto* t : {&in.Q}) t->resize(q);
  for (auto* t : {&in.K, &in.V}) t->resize(kv);
  for (auto* t : {&in.Q, &in.K, &in.V})
    for (float& x : *t) x = normal(gen);
  return in;
}

std::string failed(const std::string& what) { return what + ": " + fa_last_error(); }

// Sets this thread's options, runs `repeats` forwards, and keeps the last one's outputs and
// counters. Every run must give the same bits and counts as the first.
Run run_06(const Inputs& in, const Settings& s, int repeats) {
  Run r;
  r.O.resize(in.Q.size());
  r.L.resize(size_t(in.p.batch) * in.p.heads * in.p.seq_q);
  if (fa_set_option(kStage06, "block_q", s.block_q) != 0 || fa_set_option(kStage06, "block_k", s.block_k) != 0 ||
      fa_set_option(kStage06, "threads", s.threads) != 0 || fa_set_option(kStage06, "count_traffic", 1) != 0)
    return r.error = failed("fa_set_option"), r;
  std::vector<float> first_O;
  int64_t first_reads = -1;
  for (int i = 0; i < repeats; ++i) {
    if (fa_forward(kStage06, &in.p, in.Q.data(), in.K.data(), in.V.data(), r.O.data(), r.L.data()) != 0)
      return r.error = failed("fa_forward"), r;
    if (fa_get_counter(kStage06, "reads", &r.reads) != 0 || fa_get_counter(kStage06, "writes", &r.writes) != 0 ||
        fa_get_counter(kStage06, "reads_K", &r.reads_K) != 0)
      return r.error = failed("fa_get_counter"), r;
    if (i == 0) {
      first_O = r.O;
      first_reads = r.reads;
    } else if (r.O != first_O || r.reads != first_reads) {
      return r.error = "run " + std::to_string(i) + " differs from run 0 on the same thread", r;
    }
    // The options this thread set are still the ones it reads back.
    int64_t block_q = -1;
    if (fa_get_counter(kStage06, "block_q", &block_q) != 0 || (s.block_q != 0 && block_q != s.block_q))
      return r.error = "block_q read back as " + std::to_string(block_q), r;
  }
  return r;
}

}  // namespace

TEST_CASE("threads that set different stage 06 options each get their own results and counters") {
  const Inputs in = make_inputs();
  const std::vector<Settings> settings{{0, 0, 0}, {16, 24, 1}, {32, 16, 2}, {7, 130, 1}, {64, 64, 3}, {150, 1, 1}};

  // Alone, one after the other, on this thread.
  std::vector<Run> alone;
  for (const Settings& s : settings) alone.push_back(run_06(in, s, 1));
  for (const Run& r : alone) REQUIRE_MESSAGE(r.error.empty(), r.error);
  // Different tilings count different traffic, so a thread that ran with another's tiles
  // or read another's counters would be seen.
  for (size_t i = 1; i < alone.size(); ++i) CHECK(alone[i].reads != alone[0].reads);

  // Together: every setting on its own thread, started at once, several runs each, with a
  // stage-05 thread beside them (no options) and a thread that only reads its defaults.
  std::vector<Run> together(settings.size());
  std::vector<float> O5(in.Q.size()), L5(alone[0].L.size());
  int rc5 = 0;
  std::string error5;
  int64_t default_block_q = -1, default_threads = -1;
  int rc_defaults = 0;
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < settings.size(); ++i)
      threads.emplace_back([&, i] { together[i] = run_06(in, settings[i], 3); });
    threads.emplace_back([&] {
      for (int i = 0; i < 3 && rc5 == 0; ++i)
        rc5 = fa_forward("05", &in.p, in.Q.data(), in.K.data(), in.V.data(), O5.data(), L5.data());
      if (rc5 != 0) error5 = failed("fa_forward on stage 05");
    });
    threads.emplace_back([&] {
      rc_defaults = fa_get_counter(kStage06, "block_q", &default_block_q) |
                    fa_get_counter(kStage06, "threads", &default_threads);
    });
    for (auto& t : threads) t.join();
  }
  for (size_t i = 0; i < settings.size(); ++i) {
    INFO("settings " << i << ": block_q " << settings[i].block_q << ", block_k " << settings[i].block_k
                     << ", threads " << settings[i].threads);
    REQUIRE_MESSAGE(together[i].error.empty(), together[i].error);
    CHECK(together[i].O == alone[i].O);
    CHECK(together[i].L == alone[i].L);
    CHECK(together[i].reads == alone[i].reads);
    CHECK(together[i].writes == alone[i].writes);
    CHECK(together[i].reads_K == alone[i].reads_K);
  }
  CHECK_MESSAGE(rc5 == 0, error5);
  // A thread that set nothing sees the defaults, whatever the others set.
  CHECK(rc_defaults == 0);
  CHECK(default_block_q == 0);
  CHECK(default_threads == 1);
}

TEST_CASE("a thread that has counted nothing has no traffic counters, even while others count") {
  int64_t reads = 0;
  int rc = 0;
  std::string message;
  std::thread t([&] {
    rc = fa_get_counter(kStage06, "reads", &reads);
    message = fa_last_error();
  });
  t.join();
  CHECK(rc == FA_ERR_INVALID);
  CHECK(message.find("06_tiled_cpu: no traffic has been counted yet on this thread") != std::string::npos);
}

TEST_CASE("threads and sram_bytes: 0 restores the default, out-of-range values are refused by name") {
  CHECK(fa_set_option(kStage06, "threads", 4) == 0);
  CHECK(fa_set_option(kStage06, "threads", 0) == 0);
  int64_t v = -1;
  CHECK(fa_get_counter(kStage06, "threads", &v) == 0);
  CHECK(v == 1);
  CHECK(fa_set_option(kStage06, "threads", int64_t(1) << 30) == FA_ERR_INVALID);
  CHECK(std::string(fa_last_error()) ==
        "06_tiled_cpu: threads = 1073741824 is not allowed (allowed: 1 to 1024, or 0 for the default (1))");
  CHECK(fa_set_option(kStage06, "sram_bytes", 0) == 0);
  CHECK(fa_get_counter(kStage06, "sram_bytes", &v) == 0);
  CHECK(v == 256 * 1024);
}

// fa_last_error() is per thread: every thread provokes its own error, waits until all have
// (so that each message has been written before any is read), then reads back its own.
// With one message shared by the threads, all but the last writer would read another's.
TEST_CASE("every thread reads its own last error") {
  const int n = 8;
  std::mutex mutex;
  std::condition_variable all_failed;
  int failed_so_far = 0;
  std::vector<int> rc(n);
  std::vector<std::string> message(n);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        rc[size_t(i)] = fa_set_option(kStage06, "threads", 2000 + i);  // refused: names 2000 + i
        std::unique_lock<std::mutex> lock(mutex);
        if (++failed_so_far == n) all_failed.notify_all();
        all_failed.wait(lock, [&] { return failed_so_far == n; });
        message[size_t(i)] = fa_last_error();
      });
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < n; ++i) {
    INFO("thread " << i << " read: " << message[size_t(i)]);
    CHECK(rc[size_t(i)] == FA_ERR_INVALID);
    CHECK(message[size_t(i)].find("threads = " + std::to_string(2000 + i) + " is not allowed") != std::string::npos);
  }
}
