// Stage 14's program. Decoding's problem is not the common `Problem` (one cache length per
// sequence, a cache larger than what it holds, a paged layout), so the stage has its own
// command line instead of the shared driver; it keeps the driver's habits: seeded inputs, a
// check against the reference, one table, the exit codes of errors.h.
//
//   stage14 --cpu --lens 1000,37,0 --q-len 4                    the CPU split-KV step, checked
//   stage14 --step 14b --batch 1 --cache 32768 --bench          one CUDA step, timed
//   stage14 --block-size 16 --lens 5000,17 --append             paged; the append checked too
//   stage14 --bench --csv out.csv ...                           append one row to a CSV
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "decode.h"
#include "decode_reference.h"
#include "driver.h"
#include "errors.h"

namespace s14 = fa::stage14;

namespace {

// The check of one run: "O max_abs=… PASS" lines, and whether both passed.
bool print_check(const fa::DecodeProblem& p, fa::Dtype dtype, const fa::DecodeTensors& t) {
  const fa::CheckReport r = fa::check_decode(p, dtype, t, t.O.data(), t.L.data());
  std::printf("%s", r.summary().c_str());
  std::printf("result %s\n", r.pass() ? "PASS" : "FAIL");
  return r.pass();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program = s14::kStageName;
  fa::DecodeProblem p;
  int cache = 1024, seed = 1, repeat = 20;
  std::vector<int> lens;
  bool cpu = false, bench = false, append = false, no_check = false, non_causal = false;
  std::string step_s = "auto", dtype_s = "bf16", csv;
  s14::CpuOptions cpu_options;
  int splits = 0;

  CLI::App app{"Stage 14: decoding at the memory roofline (split-KV, GQA packing, paged KV cache)"};
  app.add_option("--batch", p.batch, "sequences")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--heads", p.heads, "query heads")->capture_default_str();
  app.add_option("--kv-heads", p.kv_heads, "KV heads (heads must be a multiple)")->capture_default_str();
  app.add_option("--head-dim", p.head_dim, "d")->capture_default_str();
  app.add_option("--q-len", p.q_len, "new tokens per sequence (1 to 16)")->capture_default_str();
  app.add_option("--cache", cache, "tokens in every sequence's cache (the new ones included)")->capture_default_str();
  app.add_option("--lens", lens, "one cache length per sequence (sets --batch), e.g. 1000,37,0")->delimiter(',');
  app.add_option("--capacity", p.capacity, "contiguous cache: tokens per sequence (0: the longest length)");
  app.add_option("--block-size", p.block_size, "paged cache: tokens per block (16 to 256; 0: contiguous)");
  app.add_flag("--non-causal", non_causal, "every new token sees every key (default: causal among them)");
  app.add_option("--seed", seed, "inputs' seed")->capture_default_str();
  app.add_flag("--cpu", cpu, "run the CPU split-KV step (default: a CUDA step)");
  app.add_option("--threads", cpu_options.threads, "CPU step: threads (0: the machine's)");
  app.add_option("--splits", splits, "key splits per sequence (0: the split rule; CPU: one per thread)");
  app.add_option("--step", step_s, "CUDA step: auto, 14a, 14b, 14c, 14d, 14e")->capture_default_str();
  app.add_option("--dtype", dtype_s, "CUDA steps: bf16 or f16")->capture_default_str();
  app.add_flag("--append", append, "also check the KV append (contiguous or paged)");
  app.add_flag("--bench", bench, "time the decode (CUDA) and report the bandwidth");
  app.add_option("--repeat", repeat, "timed runs for --bench")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_flag("--no-check", no_check, "skip the comparison with the reference");
  app.add_option("--csv", csv, "append the benchmark's row to this CSV file");
  fa::refuse_empty_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << program << ": " << e.what() << " (see --help)\n";
    return fa::kExitBadInput;
  }

  try {
    if (!lens.empty()) p.batch = int(lens.size());
    p.cache_seqlens = lens.empty() ? std::vector<int>(size_t(p.batch), cache) : lens;
    p.causal = !non_causal;
    p.size_cache();
    cpu_options.splits = splits;
    const fa::Dtype dtype = cpu ? fa::Dtype::F32 : fa::parse_dtype(dtype_s);
    p.validate(program);
    std::printf("problem   %s\n", p.describe().c_str());
    bool pass = true;

    if (cpu) {
      std::printf("step      cpu (split-KV over %d threads, %d splits)\n",
                  cpu_options.threads > 0 ? cpu_options.threads : s14::cpu_splits({0, 0}), s14::cpu_splits(cpu_options));
      if (bench) throw std::invalid_argument(program + ": --bench times the CUDA steps (leave out --cpu)");
      fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(seed));
      const int* table = p.paged() ? t.block_table.data() : nullptr;
      s14::decode_cpu(p, t.Q.data(), t.K_cache.data(), t.V_cache.data(), table, t.O.data(), t.L.data(), cpu_options);
      if (!no_check) pass = print_check(p, dtype, t);
      if (append) {
        std::vector<float> K = t.K_cache, V = t.V_cache;
        s14::append_kv_cpu(p, t.K_new.data(), t.V_new.data(), K.data(), V.data(), table);
        std::printf("append    done (host)\n");
      }
      return pass ? fa::kExitPass : fa::kExitCheckFailed;
    }

#ifdef FA_HAVE_CUDA
    s14::GpuOptions options;
    options.step = s14::parse_step(step_s);
    options.splits = splits;
    s14::require_gpu_request(p, dtype, options);
    std::printf("launch    %s\n", s14::plan(p, options).describe().c_str());
    if (!no_check) {
      fa::DecodeTensors t = fa::DecodeTensors::make(p, uint64_t(seed));
      const int* table = p.paged() ? t.block_table.data() : nullptr;
      s14::decode_gpu(p, dtype, t.Q.data(), t.K_cache.data(), t.V_cache.data(), table, t.O.data(), t.L.data(), options);
      pass = print_check(p, dtype, t);
      if (append) {
        std::vector<float> K = t.K_cache, V = t.V_cache;
        s14::append_kv_gpu(p, dtype, t.K_new.data(), t.V_new.data(), K.data(), V.data(), table);
        fa::append_kv_host(p, t.K_new.data(), t.V_new.data(), t.K_cache.data(), t.V_cache.data(), table);
        // The appended rows come back rounded through dtype: compare with the host append's, rounded alike.
        int64_t wrong = 0;
        for (int b = 0; b < p.batch; ++b)
          for (int hk = 0; hk < p.kv_heads; ++hk)
            for (int i = 0; i < p.q_len; ++i)
              for (int c = 0; c < p.head_dim; ++c) {
                const int64_t at = p.cache_offset(table, b, hk, p.cache_seqlens[size_t(b)] - p.q_len + i) + c;
                const float want = t.K_cache[size_t(at)];
                wrong += std::abs(K[size_t(at)] - want) > 1e-2f * (1.0f + std::abs(want));
              }
        std::printf("append    %s (%lld wrong elements)\n", wrong ? "FAIL" : "PASS", (long long)wrong);
        pass = pass && wrong == 0;
      }
    }
    if (bench) {
      const s14::BenchResult r = s14::bench_gpu(p, dtype, options, repeat);
      const double gbs = r.kv_bytes / (r.decode_ms * 1e6), copy_gbs = 2.0 * r.kv_bytes / (r.copy_ms * 1e6);
      std::printf("time      %.4f ms (median of %d)\n", r.decode_ms, repeat);
      std::printf("bandwidth %.1f GB/s of K/V read; copy %.1f GB/s (read + write); %.1f%% of copy\n", gbs, copy_gbs,
                  100.0 * gbs / copy_gbs);
      if (!csv.empty()) {
        std::ofstream f(csv, std::ios::app);
        f << s14::step_name(options.step) << ',' << fa::dtype_name(dtype) << ',' << p.batch << ',' << p.heads << ','
          << p.kv_heads << ',' << p.head_dim << ',' << p.q_len << ',' << p.max_seqlen() << ',' << p.block_size << ','
          << s14::plan(p, options).splits << ',' << r.decode_ms << ',' << gbs << ',' << copy_gbs << ','
          << 100.0 * gbs / copy_gbs << '\n';
      }
    }
    return pass ? fa::kExitPass : fa::kExitCheckFailed;
#else
    throw fa::NoCudaDevice(program + ": this build has no CUDA steps (use --cpu)");
#endif
  } catch (...) {
    return fa::report_failure(program, std::current_exception());
  }
}
