// bench06 — stage 06's performance figures (a benchmark, not a test).
//
// Measures, in one run on this machine:
//   - an Eigen single-precision GEMM, 2048³, one thread: the practical ceiling;
//   - stage 06 forward and backward at N = 4096, d = 64 (batch = heads = 1, non-causal) with
//     1 and 2 threads, as GFLOP/s and as a ratio to the GEMM (docs/design.md §7 FLOP convention);
//   - stage 02 (S and P materialised) against stage 06 at N = 1024, 2048, 4096: time and peak
//     resident memory. Stage 02 needs two N×N buffers; stage 06 needs a few tiles.
// Every measurement runs in its own child process, so that its peak resident memory
// (getrusage of the child) is its own. Prints a table; --csv writes the rows to a file.
//
// Run: ./build/stages/06_tiled_cpu/bench06 --csv docs/results/cpu_stage06.csv
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <thread>
#include <vector>

#include "driver.h"
#include "eigen.h"
#include "errors.h"
#include "tensors.h"
#include "tiled_cpu.h"
#include "timing.h"
#if __has_include("safe_softmax.h")
#include "safe_softmax.h"
#define FA_BENCH_HAS_02 1
#endif

namespace {

struct Measured {
  double seconds = -1;      // median wall-clock seconds of one run; < 0 if the child failed
  double cpu_seconds = -1;  // CPU seconds of one run (all threads), averaged over the runs
  double peak_rss_mib = 0;
};

// Median wall-clock seconds of `fn` over `repeats` runs after `warmup` runs, and the mean
// CPU time per run of the process (all its threads) over the same runs. On a busy machine the
// CPU time of a one-thread run still measures the work; the wall-clock time does not.
template <typename Fn>
std::pair<double, double> timed(const Fn& fn, int warmup, int repeats) {
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  for (int i = 0; i < warmup; ++i) fn();
  const double cpu0 = cpu_now();
  const double wall = fa::median_seconds(fn, 0, repeats);
  return {wall, (cpu_now() - cpu0) / std::max(1, repeats)};
}

// Runs `fn` (which returns {wall seconds, CPU seconds}) in a child process; returns its result
// and the child's peak resident memory.
template <typename Fn>
Measured in_child(const Fn& fn) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("bench06: pipe() failed");
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("bench06: fork() failed");
  if (pid == 0) {
    close(fds[0]);
    double seconds[2] = {-1, -1};
    try {
      std::tie(seconds[0], seconds[1]) = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench06: %s\n", e.what());
    }
    const ssize_t n = write(fds[1], seconds, sizeof seconds);
    _exit(n == sizeof seconds ? 0 : 1);
  }
  close(fds[1]);
  Measured m;
  double seconds[2] = {-1, -1};
  if (read(fds[0], seconds, sizeof seconds) == sizeof seconds) {
    m.seconds = seconds[0];
    m.cpu_seconds = seconds[1];
  }
  close(fds[0]);
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  m.peak_rss_mib = double(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
  return m;
}

fa::Problem square(int n, int d) {
  fa::Problem p;
  p.seq_q = p.seq_k = n;
  p.head_dim = d;
  return p;
}

std::string first_line_of(const char* command) {
  std::string out;
  if (FILE* f = popen(command, "r")) {
    char buf[256];
    if (fgets(buf, sizeof buf, f)) out = buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// The vector instructions this program (and Eigen in it) was compiled to use: the widest of
// the compiler's predefined macros (-march=native by default, SSE2 with FA_PORTABLE=ON).
const char* compiled_isa() {
#if defined(__AVX512F__) && defined(__FMA__)
  return "AVX-512 + FMA";
#elif defined(__AVX2__) && defined(__FMA__)
  return "AVX2 + FMA";
#elif defined(__AVX__)
  return "AVX";
#else
  return "SSE2";
#endif
}

std::string device_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + " (" + std::to_string(std::thread::hardware_concurrency()) + " cores; code for " +
         compiled_isa() + ")";
}

std::string csv_field(const std::string& s) {
  return s.find(',') == std::string::npos ? s : "\"" + s + "\"";
}

}  // namespace

int run_bench(int argc, char** argv) {
  int n = 4096, d = 64, repeat = 3;
  std::vector<int> memory_sizes{1024, 2048, 4096};
  std::string csv;
  CLI::App app{"bench06: stage 06 GFLOP/s against an Eigen GEMM, and time and peak memory against stage 02"};
  app.add_option("--n", n, "sequence length N (N_q = N_k)")->capture_default_str();
  app.add_option("--d", d, "head dimension")->capture_default_str();
  app.add_option("--repeat", repeat, "timed runs per measurement (median), after one warm-up")->capture_default_str();
  app.add_option("--memory-sizes", memory_sizes, "N at which stage 02 and 06 are compared")->capture_default_str();
  app.add_option("--csv", csv, "write the rows to this CSV file");
  fa::refuse_empty_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(std::string(e.what()) + " (see --help)");
  }

  // Other work on the machine skews every figure (the two-thread rows most): say how busy it was.
  const std::string load_before = first_line_of("cat /proc/loadavg");

  struct Row {
    std::string what;
    int N, d, threads;
    double seconds, cpu_seconds, flops, peak_rss_mib;
  };
  std::vector<Row> rows;

  // 1. The ceiling: C = A·B, 2048³, single precision, one thread.
  const int g = 2048;
  const Measured gemm = in_child([&] {
    Eigen::MatrixXf A = Eigen::MatrixXf::Random(g, g), B = Eigen::MatrixXf::Random(g, g), C(g, g);
    return timed([&] { C.noalias() = A * B; }, 1, repeat);
  });
  const double gemm_flops = 2.0 * g * g * double(g);
  rows.push_back({"eigen_sgemm_2048", g, 0, 1, gemm.seconds, gemm.cpu_seconds, gemm_flops, gemm.peak_rss_mib});

  // 2. Stage 06 forward and backward, 1 and 2 threads.
  const fa::Problem p = square(n, d);
  for (int threads : {1, 2}) {
    fa::stage06::Config c;
    c.threads = threads;
    const Measured fwd = in_child([&] {
      fa::Tensors t = fa::Tensors::make(p, 1, fa::Dist::Normal, false);
      return timed([&] {
        fa::stage06::forward(p, c, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
      }, 1, repeat);
    });
    rows.push_back({"forward_06", n, d, threads, fwd.seconds, fwd.cpu_seconds, p.forward_flops(), fwd.peak_rss_mib});
    const Measured bwd = in_child([&] {
      fa::Tensors t = fa::Tensors::make(p, 1, fa::Dist::Normal, true);
      fa::stage06::forward(p, c, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
      return timed([&] {
        fa::stage06::backward(p, c, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(),
                              t.dO.data(), t.dQ.data(), t.dK.data(), t.dV.data());
      }, 1, repeat);
    });
    rows.push_back({"backward_06", n, d, threads, bwd.seconds, bwd.cpu_seconds, 2.5 * p.forward_flops(), bwd.peak_rss_mib});
  }

  // 3. Time and peak memory against stage 02, which materialises S and P (2·N² floats).
  for (int m : memory_sizes) {
    const fa::Problem q = square(m, d);
    const Measured inputs = in_child([&] {
      fa::Tensors t = fa::Tensors::make(q, 1, fa::Dist::Normal, false);
      return std::pair<double, double>{0.0, 0.0};
    });
    rows.push_back({"inputs_only", m, d, 1, 0.0, 0.0, 0.0, inputs.peak_rss_mib});
    if (m != n) {  // at N = n, the speed rows above already measured stage 06's memory
      const Measured fwd06 = in_child([&] {
        fa::Tensors t = fa::Tensors::make(q, 1, fa::Dist::Normal, false);
        return timed([&] {
          fa::stage06::forward(q, fa::stage06::Config{}, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
        }, 0, 1);
      });
      rows.push_back({"forward_06", m, d, 1, fwd06.seconds, fwd06.cpu_seconds, q.forward_flops(), fwd06.peak_rss_mib});
    }
#ifdef FA_BENCH_HAS_02
    const Measured fwd02 = in_child([&] {
      fa::Tensors t = fa::Tensors::make(q, 1, fa::Dist::Normal, false);
      return timed([&] {
        fa::stage02::forward(q, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data());
      }, 0, 1);
    });
    rows.push_back({"forward_02", m, d, 1, fwd02.seconds, fwd02.cpu_seconds, q.forward_flops(), fwd02.peak_rss_mib});
#endif
  }

  // Report.
  const double gemm_rate = gemm_flops / gemm.seconds;
  const std::string device = device_name();
  const std::string commit = first_line_of("git -C " FA_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));

  std::printf("bench06 on %s, commit %s, %s; median of %d after a warm-up (stage 02 and the\n"
              "memory rows: one run); FLOPs: forward 4·N²·d, backward 2.5× forward\n"
              "load average before: %s; after: %s\n\n",
              device.c_str(), commit.c_str(), date, repeat, load_before.c_str(),
              first_line_of("cat /proc/loadavg").c_str());
  std::printf("%-17s %6s %4s %7s %10s %9s %7s %10s %9s %7s %9s\n", "what", "N", "d", "threads",
              "wall ms", "GFLOP/s", "xGEMM", "CPU ms", "GFLOP/s", "xGEMM", "RSS MiB");
  std::printf("%-17s %6s %4s %7s %28s %28s\n", "", "", "", "", "(wall clock, the CSV)", "(CPU time, all threads)");
  std::ostringstream out;
  out << "what,N,d,threads,gflops,ratio_to_gemm,peak_rss_mib,device,commit,date\n";
  const double gemm_cpu_rate = gemm_flops / gemm.cpu_seconds;
  for (const Row& r : rows) {
    const double gflops = r.flops > 0 && r.seconds > 0 ? r.flops / r.seconds / 1e9 : 0.0;
    const double ratio = gflops > 0 ? gflops * 1e9 / gemm_rate : 0.0;
    const double cpu_gflops = r.flops > 0 && r.cpu_seconds > 0 ? r.flops / r.cpu_seconds / 1e9 : 0.0;
    const double cpu_ratio = cpu_gflops > 0 ? cpu_gflops * 1e9 / gemm_cpu_rate : 0.0;
    std::printf("%-17s %6d %4d %7d %10.1f %9.2f %7.3f %10.1f %9.2f %7.3f %9.1f\n", r.what.c_str(), r.N,
                r.d, r.threads, r.seconds * 1e3, gflops, ratio, r.cpu_seconds * 1e3, cpu_gflops,
                cpu_ratio, r.peak_rss_mib);
    char line[512];
    std::snprintf(line, sizeof line, "%s,%d,%d,%d,%.3f,%.4f,%.1f,%s,%s,%s\n", r.what.c_str(), r.N, r.d,
                  r.threads, gflops, ratio, r.peak_rss_mib, csv_field(device).c_str(), commit.c_str(), date);
    out << line;
  }

  // The targets, stated against what was measured.
  const auto rate = [&](const std::string& what, int N, int threads, bool cpu = false) {
    for (const Row& r : rows)
      if (r.what == what && r.N == N && r.threads == threads && r.seconds > 0)
        return r.flops / (cpu ? r.cpu_seconds : r.seconds);
    return 0.0;
  };
  const double f1 = rate("forward_06", n, 1), f2 = rate("forward_06", n, 2);
  const double b1 = rate("backward_06", n, 1), b2 = rate("backward_06", n, 2);
  const double f1_cpu = rate("forward_06", n, 1, true), b1_cpu = rate("backward_06", n, 1, true);
  const auto verdict = [](bool met) { return met ? "met" : "NOT met"; };
  // Targets: forward >= 0.7 x GEMM, backward >= 0.5 x GEMM (2.5 forwards of FLOPs), and two
  // threads >= 1.8 x one, all with Eigen built for the same instruction set as the stage.
  constexpr double kForward = 0.7, kBackward = 0.5, kTwoThreads = 1.8;
  std::printf("\ntargets at N = %d, d = %d (wall clock; CPU time in brackets):\n", n, d);
  std::printf("  forward,  1 thread : %.3f x GEMM (%.3f)  target >= %.1f: %s\n", f1 / gemm_rate,
              f1_cpu / gemm_cpu_rate, kForward, verdict(f1 / gemm_rate >= kForward));
  std::printf("  backward, 1 thread : %.3f x GEMM (%.3f)  target >= %.1f: %s\n", b1 / gemm_rate,
              b1_cpu / gemm_cpu_rate, kBackward, verdict(b1 / gemm_rate >= kBackward));
  std::printf("  forward,  2 threads: %.2f x 1 thread  target >= %.1f: %s\n", f2 / f1, kTwoThreads,
              verdict(f2 / f1 >= kTwoThreads));
  std::printf("  backward, 2 threads: %.2f x 1 thread  target >= %.1f: %s\n", b2 / b1, kTwoThreads,
              verdict(b2 / b1 >= kTwoThreads));
#ifdef FA_BENCH_HAS_02
  const double s02 = rate("forward_02", n, 1), s06 = rate("forward_06", n, 1);
  if (s02 > 0) std::printf("  stage 06 forward vs stage 02 at N = %d: %.1fx faster\n", n, s06 / s02);
#endif

  if (!csv.empty()) {
    std::ofstream f(csv);
    f << out.str();
    if (!f) throw std::runtime_error("could not write " + csv);
    std::printf("\nwrote %s\n", csv.c_str());
  }
  return 0;
}

// Every failure (a bad size, memory, a file that cannot be written) is one line and an
// exit code (errors.h).
int main(int argc, char** argv) {
  try {
    return run_bench(argc, argv);
  } catch (...) {
    return fa::report_failure("bench06", std::current_exception());
  }
}
