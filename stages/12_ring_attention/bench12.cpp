// bench12 — stage 12's scaling measurement (a benchmark, not a test): the GPU ring over P ranks
// for given sequence lengths, splits and masks, forward and backward, in three modes:
//
//   overlap   the ring as it is: each step's exchange runs beside the step's kernels
//   serial    the same exchanges, waited for before the step's kernels: nothing overlaps
//   compute   the same kernels with no exchange at all (a rank attends to whatever its K/V
//             buffers hold): the time of the arithmetic alone, with no communication
//
// Every rank's buffers and the transports are made once per configuration (GpuRing), and each
// repetition loads the rank's slices, starts all ranks together and times the ring only: what
// a training step pays. From the three times (README, "Measuring the ring"):
//   the exchanges' cost, serialised   (t_serial − t_compute) / t_compute
//   the exchanges' cost, overlapped   (t_overlap − t_compute) / t_compute
// (both can come out a little below zero: the run-to-run noise of the three times; a share of
// the exchanges' own time would divide by that noise where the link is fast)
// and with the P = 1 time of the same problem, the fraction of the ideal 1/P = t_1 / (P · t_P).
//
// Before timing it checks the ring it times: for every ring size and split of the sweep, a
// small problem through the same GpuRing, forward and backward, against the reference, and the
// serial mode bitwise equal to the overlapped one.
//
// Run: ./build/stages/12_ring_attention/bench12 --ranks 1,2 --seq 32768,65536 --csv out.csv
//      (scripts/gpu/stage12_scaling.sh runs the whole sweep on a multi-GPU machine)
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "cuda_utils.h"
#include "bench12_timing.h"
#include "ring_gpu.h"
#include "tensors.h"

namespace {

using fa::Dtype;
using fa::Problem;
using namespace fa::stage12::bench;

// ---- the whole tensors of one problem, on the calling thread's GPU

struct Whole {
  fa::DeviceBuffer Q, K, V, O, L, dO, dQ, dK, dV;
  s12::WholeTensors view() {
    s12::WholeTensors x;
    x.Q = Q.get(), x.K = K.get(), x.V = V.get(), x.O = O.get(), x.L = L.as<float>(), x.dO = dO.get();
    x.dQ = dQ.get(), x.dK = dK.get(), x.dV = dV.get();
    return x;
  }
};

Whole allocate(const Problem& p, Dtype t) {
  const size_t es = fa::dtype_size(t), q = size_t(p.q_elems()) * es, kv = size_t(p.kv_elems()) * es;
  return Whole{fa::DeviceBuffer(q, "bench12: Q"),   fa::DeviceBuffer(kv, "bench12: K"),
               fa::DeviceBuffer(kv, "bench12: V"),  fa::DeviceBuffer(q, "bench12: O"),
               fa::DeviceBuffer(size_t(p.l_elems()) * 4, "bench12: L"), fa::DeviceBuffer(q, "bench12: dO"),
               fa::DeviceBuffer(q, "bench12: dQ"),  fa::DeviceBuffer(kv, "bench12: dK"),
               fa::DeviceBuffer(kv, "bench12: dV")};
}

std::vector<char> bits(const fa::DeviceBuffer& b) {
  std::vector<char> h(b.bytes());
  FA_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

// Forward and backward of `c` on a small problem through GpuRing, against the reference, and
// the serial schedule bitwise equal to the overlapped one. Returns "" or what failed.
std::string self_check(const Problem& big, const s12::GpuConfig& c, Dtype t, std::shared_ptr<s12::Ring> kv_ring,
                       std::shared_ptr<s12::Ring> dkv_ring) {
  Problem p = big;
  p.heads = 2, p.kv_heads = 1, p.seq_q = p.seq_k = 64 * c.ranks + 3;  // odd: uneven chunks
  fa::Tensors host = fa::Tensors::make(p, 1200 + uint64_t(c.ranks), fa::Dist::Normal, true);
  Whole w = allocate(p, t);
  fa::upload(t, host.Q.data(), w.Q.get(), p.q_elems(), nullptr);
  fa::upload(t, host.K.data(), w.K.get(), p.kv_elems(), nullptr);
  fa::upload(t, host.V.data(), w.V.get(), p.kv_elems(), nullptr);
  fa::upload(t, host.dO.data(), w.dO.get(), p.q_elems(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<char>> out[2];
  for (Mode mode : {Mode::Overlap, Mode::Serial}) {
    s12::GpuRing fwd(p, c, t, s12::GpuRing::Pass::Forward, kv_ring);
    run_once(fwd, w.view(), mode);
    s12::GpuRing bwd(p, c, t, s12::GpuRing::Pass::Backward, kv_ring, dkv_ring);
    run_once(bwd, w.view(), mode);
    for (const fa::DeviceBuffer* b : {&w.O, &w.L, &w.dQ, &w.dK, &w.dV}) out[mode == Mode::Serial].push_back(bits(*b));
  }
  fa::download(t, w.O.get(), host.O.data(), p.q_elems(), nullptr);
  fa::download(Dtype::F32, w.L.get(), host.L.data(), p.l_elems(), nullptr);
  fa::download(t, w.dQ.get(), host.dQ.data(), p.q_elems(), nullptr);
  fa::download(t, w.dK.get(), host.dK.data(), p.kv_elems(), nullptr);
  fa::download(t, w.dV.get(), host.dV.data(), p.kv_elems(), nullptr);
  fa::CheckReport r = fa::compare_forward(p, t, host);
  for (auto& item : fa::compare_backward(p, t, host).items) r.items.push_back(item);
  if (!r.pass()) return p.describe() + ": " + r.summary();
  if (out[0] != out[1]) return p.describe() + ": the serial schedule does not give the overlapped ring's bits";
  return "";
}

// ---- the CSV (the columns of scripts/bench/bench_gpu.py where they mean the same, then the ring's)

const char* kColumns =
    "device,gpus,commit,date,what,pass,dtype,batch,heads,kv_heads,seq_q,seq_k,head_dim,causal,ranks,split,"
    "transport,ms,ms_serial,ms_compute,tflops,sent_mib,rank_ms,rank_compute_ms,check,note";

std::string joined(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, "%s%.3f", s.empty() ? "" : " ", x);
    s += buf;
  }
  return s;
}

// MiB the busiest rank sends in one ring: K/V shards (P − 1 of them) and, in the backward,
// the fp32 dK/dV sums (P of them).
double sent_mib(const s12::Plan& plan, Dtype t, bool backward) {
  const int P = plan.ranks;
  double most = 0;
  for (int r = 0; r < P && P > 1; ++r) {
    double bytes = 0;
    for (int step = 0; step < P; ++step) {
      const double shard = double(plan.kv_shard_elems(s12::kv_owner(r, step, P)));
      if (step + 1 < P) bytes += shard * double(fa::dtype_size(t));
      if (backward) bytes += shard * 4;
    }
    most = std::max(most, bytes);
  }
  return most / (1024.0 * 1024.0);
}

struct Run {  // what every row shares
  std::string device, commit, date, what;
  int gpus = 0;
  std::FILE* csv = nullptr;
};

void write_row(const Run& run, const Problem& p, Dtype t, const s12::GpuConfig& c, bool backward,
               const Timing (&m)[3], double sent, const std::string& check, const std::string& note) {
  if (!run.csv) return;
  const double flops = p.forward_flops() * (backward ? 2.5 : 1.0);
  // what: the stage, and [kernels=hopper] when the ranks ran stages 10/11 (no tag: 08/09).
  std::fprintf(run.csv, "%s,%d,%s,%s,%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%d,%s,%s,", run.device.c_str(), run.gpus,
               run.commit.c_str(), run.date.c_str(), run.what.c_str(), backward ? "bwd" : "fwd", fa::dtype_name(t), p.batch,
               p.heads, p.kv_heads, p.seq_q, p.seq_k, p.head_dim, int(p.causal), c.ranks, s12::split_name(c.split),
               s12::transport_name(c.transport));
  const auto ms = [](const Timing& x) { return x.rank_ms.empty() ? std::string() : std::to_string(x.ring_ms); };
  std::fprintf(run.csv, "%s,%s,%s,%.2f,%.1f,%s,%s,%s,\"%s\"\n", ms(m[0]).c_str(), ms(m[1]).c_str(), ms(m[2]).c_str(),
               flops / (m[0].ring_ms * 1e-3) / 1e12, sent, joined(m[0].rank_ms).c_str(), joined(m[2].rank_ms).c_str(),
               check.c_str(), note.c_str());
  std::fflush(run.csv);
}

std::string utc_now() {
  char buf[40];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S+00:00", &tm);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench12: stage 12's ring over P ranks, timed with and without overlap (scaling measurement)"};
  std::vector<int> ranks{1, 2}, seqs{32768}, causals{0, 1};
  std::vector<std::string> splits{"plain", "zigzag"};
  int batch = 1, heads = 8, kv_heads = 0, head_dim = 128, reps = 3, warmup = 1;
  std::string dtype_text = "bf16", transport_text = "nccl", kernels_text = "auto", csv_path, commit = "unknown";
  double budget_s = 0;
  bool backward = true, check = true;
  app.add_option("--ranks", ranks, "ring sizes P, e.g. 1,2,4,8 (P = 1 is the baseline of the fraction of ideal)")
      ->delimiter(',');
  app.add_option("--seq", seqs, "total sequence lengths N (seq_q = seq_k), e.g. 32768,65536")->delimiter(',');
  app.add_option("--split", splits, "plain and/or zigzag")->delimiter(',');
  app.add_option("--causal", causals, "0 and/or 1")->delimiter(',');
  app.add_option("--batch", batch, "batch");
  app.add_option("--heads", heads, "query heads");
  app.add_option("--kv-heads", kv_heads, "key/value heads (0: = heads)");
  app.add_option("--head-dim", head_dim, "head dim (64, 128; 256 with the Hopper kernels)");
  app.add_option("--dtype", dtype_text, "bf16 or f16");
  app.add_option("--transport", transport_text, "nccl (rank r on GPU r) or device (virtual ranks on GPU 0)");
  app.add_option("--kernels", kernels_text,
                 "what each rank runs: auto (stages 10/11 on Hopper, else 08/09), tensor_core (08/09) or hopper (10/11)");
  app.add_option("--reps", reps, "timed repetitions per mode (median; more for short rings)");
  app.add_option("--warmup", warmup, "untimed repetitions before them");
  app.add_option("--budget-s", budget_s, "stop starting configurations that would end after this many seconds (0: no limit)");
  app.add_flag("!--no-backward", backward, "time the forward only");
  app.add_flag("!--no-check", check, "skip the small correctness check of each ring size and split");
  app.add_option("--csv", csv_path, "write the rows to this CSV file");
  app.add_option("--commit", commit, "commit recorded in every row");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "bench12: %s\n", e.what());
    return 2;
  }
  const auto start = Clock::now();
  const auto elapsed_s = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  Run run;
  std::vector<std::pair<int, s12::Split>> rings;  // (P, split) in sweep order
  Dtype t = Dtype::BF16;
  s12::TransportKind transport = s12::TransportKind::Nccl;
  s12::RankKernels kernels = s12::RankKernels::Auto;
  try {  // every refusal before the GPU is touched: exit 2 and one line naming the value
    const auto refuse = [](const std::string& what) { throw std::invalid_argument("bench12: " + what); };
    t = fa::parse_dtype(dtype_text);
    if (t == Dtype::F32) refuse("dtype = f32 is not allowed (the GPU ring takes bf16 or f16)");
    if (transport_text != "nccl" && transport_text != "device")
      refuse("transport = " + transport_text + " is not nccl or device");
    transport = transport_text == "nccl" ? s12::TransportKind::Nccl : s12::TransportKind::Device;
    if (kernels_text != "auto" && kernels_text != "tensor_core" && kernels_text != "hopper")
      refuse("kernels = " + kernels_text + " is not auto, tensor_core or hopper");
    kernels = kernels_text == "auto"          ? s12::RankKernels::Auto
              : kernels_text == "tensor_core" ? s12::RankKernels::TensorCores
                                              : s12::RankKernels::Hopper;
    const auto& dims = s12::gpu_head_dims();
    if (std::find(dims.begin(), dims.end(), head_dim) == dims.end())
      refuse("head dim = " + std::to_string(head_dim) + " is not supported (64, 128, or 256 with the Hopper kernels)");
    if (reps < 1 || warmup < 0) refuse("reps = " + std::to_string(reps) + ", warmup = " + std::to_string(warmup) +
                                       " (reps must be at least 1, warmup at least 0)");
    if (budget_s < 0) refuse("budget = " + std::to_string(budget_s) + " s is negative");
    for (int c : causals)
      if (c != 0 && c != 1) refuse("causal = " + std::to_string(c) + " is not 0 or 1");
    for (int N : seqs)
      if (N < 1) refuse("seq = " + std::to_string(N) + " is not allowed (a length to time is at least 1)");
    std::sort(ranks.begin(), ranks.end());
    for (const std::string& name : splits)
      if (name != "plain" && name != "zigzag") refuse("split = " + name + " is not plain or zigzag");
    for (int P : ranks)
      for (const std::string& name : splits) {
        const s12::Split split = name == "plain" ? s12::Split::Plain : s12::Split::Zigzag;
        if (P == 1 && !rings.empty() && rings.back().first == 1) continue;  // one chunk: the splits agree
        rings.push_back({P, split});
        for (int N : seqs)
          for (int c : causals) {  // the problem and its cut, refused here as the ring would
            const Problem p{batch, heads, kv_heads ? kv_heads : heads, N, N, head_dim, c == 1, 0.0f};
            p.validate("bench12");
            s12::make_plan(p, P, split, "bench12");
          }
      }
    if (!fa::have_gpu()) {
      std::fprintf(stderr, "bench12: no CUDA GPU is visible; nothing to measure\n");
      return 1;
    }
    const bool hopper = s12::runs_hopper(kernels, s12::ring_devices(transport, ranks.back()));  // enough GPUs,
    run.what = std::string(s12::kGpuStageName) + (hopper ? "[kernels=hopper]" : "");       // NCCL built in
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }

  FA_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  FA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  FA_CUDA_CHECK(cudaGetDeviceCount(&run.gpus));
  run.device = prop.name, run.commit = commit, run.date = utc_now();
  if (!csv_path.empty()) {
    run.csv = std::fopen(csv_path.c_str(), "w");
    if (!run.csv) {
      std::fprintf(stderr, "bench12: cannot write %s\n", csv_path.c_str());
      return 1;
    }
    std::fprintf(run.csv, "%s\n", kColumns);
  }
  std::printf("bench12: %s x%d, %s transport, %s, heads %d/%d, d %d\n", run.device.c_str(), run.gpus,
              transport_text.c_str(), dtype_text.c_str(), heads, kv_heads ? kv_heads : heads, head_dim);

  // The transports, made once per ring size and shared by every configuration of that size.
  std::map<int, std::pair<std::shared_ptr<s12::Ring>, std::shared_ptr<s12::Ring>>> transports;
  const auto transports_of = [&](int P) {
    auto& r = transports[P];
    if (!r.first) {
      const std::vector<int> devices = s12::ring_devices(transport, P);
      r = {s12::make_ring(transport, devices), s12::make_ring(transport, devices)};
    }
    return r;
  };

  std::map<std::pair<int, s12::Split>, std::string> checked;  // "pass" or what failed
  int failures = 0;
  for (const auto& [P, split] : rings) {
    if (P == 1 || !check) continue;
    const Problem p{batch, heads, kv_heads ? kv_heads : heads, 0, 0, head_dim, false, 0.0f};
    for (bool causal : {false, true}) {
      Problem q = p;
      q.causal = causal;
      const auto [kv_ring, dkv_ring] = transports_of(P);
      const std::string why = self_check(q, {P, split, transport, kernels}, t, kv_ring, dkv_ring);
      if (checked[{P, split}] != "FAIL") checked[{P, split}] = why.empty() ? "pass" : "FAIL";
      if (!why.empty()) ++failures;
      std::printf("check P=%d %s %s: %s\n", P, s12::split_name(split), causal ? "causal" : "full",
                  why.empty() ? "pass (reference; serial = overlap bitwise)" : why.c_str());
    }
  }
  if (failures) std::printf("bench12: %d checks failed; the rows of those rings say FAIL\n", failures);

  // The sweep: N ascending, then mask, then P ascending (P = 1 first: the baseline).
  double tflops_per_gpu = 150;  // what a group is predicted at; updated from each group measured
  std::map<std::tuple<int, bool, bool>, double> t1_ms;  // (N, causal, backward) → P = 1 time
  for (int N : seqs) {
    const Problem whole_p{batch, heads, kv_heads ? kv_heads : heads, N, N, head_dim, false, 0.0f};
    Whole w = allocate(whole_p, t);
    for (const fa::DeviceBuffer* b : {&w.Q, &w.K, &w.V, &w.dO})
      fa::fill_random(t, b->get(), int64_t(b->bytes() / fa::dtype_size(t)), uint64_t(N) + 7, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    for (int c : causals)
      for (const auto& [P, split] : rings) {
        Problem p = whole_p;
        p.causal = c == 1;
        const s12::GpuConfig config{P, split, transport, kernels};
        const std::vector<Mode> modes =
            P == 1 ? std::vector<Mode>{Mode::Overlap} : std::vector<Mode>{Mode::Serial, Mode::Compute, Mode::Overlap};
        const double work = p.forward_flops() * (backward ? 3.5 : 1.0) * double(modes.size());
        const double run_s = work / double(modes.size()) / (P * tflops_per_gpu * 1e12);
        int n_reps = std::clamp(int(0.25 / std::max(run_s, 1e-6)), reps, 4 * reps), n_warm = warmup;
        const auto predict = [&](int r, int wu) { return work * (r + wu) / (P * tflops_per_gpu * 1e12) + 1.0; };
        std::string note;
        if (budget_s > 0 && elapsed_s() + predict(n_reps, n_warm) > budget_s) {
          n_reps = 1, n_warm = std::min(warmup, 1);
          note = "1 repetition (budget)";
          if (elapsed_s() + predict(n_reps, n_warm) > budget_s) {
            std::printf("skipped (budget): N=%d %s P=%d %s, predicted %.0f s, %.0f s left\n", N,
                        c ? "causal" : "full", P, s12::split_name(split), predict(n_reps, n_warm),
                        budget_s - elapsed_s());
            continue;
          }
        }
        const auto group_start = Clock::now();
        const auto [kv_ring, dkv_ring] = transports_of(P);
        const std::string check_text = P == 1 ? "-" : checked.count({P, split}) ? checked[{P, split}] : "not checked";
        for (bool bwd : {false, true}) {
          if (bwd && !backward) break;
          Timing m[3];  // overlap, serial, compute
          {
            s12::GpuRing ring(p, config, t, bwd ? s12::GpuRing::Pass::Backward : s12::GpuRing::Pass::Forward, kv_ring,
                              dkv_ring);
            for (Mode mode : modes) m[int(mode)] = time_ring(ring, w.view(), mode, n_warm, n_reps);
            if (!bwd) ring.run([&](int rank) { ring.store(rank, w.view()); });  // O, L for the backward
          }
          if (P == 1) t1_ms[{N, p.causal, bwd}] = m[0].ring_ms;
          const double sent = sent_mib(s12::make_plan(p, P, split, "bench12"), t, bwd);
          write_row(run, p, t, config, bwd, m, sent, check_text, note);
          const auto t1 = t1_ms.find({N, p.causal, bwd});
          std::printf("N=%-7d %-6s P=%d %-6s %s  overlap %9.2f ms", N, c ? "causal" : "full", P,
                      P == 1 ? "-" : s12::split_name(split), bwd ? "bwd" : "fwd", m[0].ring_ms);
          if (P > 1) {
            const double compute = m[2].ring_ms;
            std::printf("  serial %9.2f  compute %9.2f  exchanges %+5.1f %% -> %+5.1f %%", m[1].ring_ms, compute,
                        100.0 * (m[1].ring_ms - compute) / compute, 100.0 * (m[0].ring_ms - compute) / compute);
          }
          if (t1 != t1_ms.end()) std::printf("  of ideal %5.1f %%", 100.0 * t1->second / (P * m[0].ring_ms));
          std::printf("\n");
          std::fflush(stdout);
        }
        const double group_s = std::chrono::duration<double>(Clock::now() - group_start).count();
        tflops_per_gpu = std::max(20.0, work * (n_reps + n_warm) / (P * std::max(group_s - 0.5, 1e-3) * 1e12));
      }
  }
  if (run.csv) std::fclose(run.csv);
  std::printf("bench12: done in %.0f s%s\n", elapsed_s(), failures ? " (with failed checks)" : "");
  return failures ? 1 : 0;
}
