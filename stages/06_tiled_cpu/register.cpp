// How stage 06 presents itself to the driver, the tour, the tests and the C ABI: its options
// (the Config fields and the traffic switch, per calling thread), its traffic counters (the
// calling thread's last run), and the report rows.
#include <functional>
#include <stdexcept>

#include "options.h"
#include "tiled_cpu.h"

namespace fa::stage06 {

namespace {

// What the calling thread's last forward and backward counted (with count_traffic on).
struct LastRuns {
  Traffic forward, backward;
  bool forward_counted = false, backward_counted = false;
  const Traffic* last = nullptr;  ///< whichever of the two ran last
};
thread_local LastRuns t_runs;

int64_t count_of(const std::function<int64_t(const Traffic&)>& field) {
  if (t_runs.last == nullptr)
    throw std::invalid_argument(std::string(kStageName) + ": no traffic has been counted yet on this thread (set "
                                "option count_traffic to 1, then run forward or backward)");
  return field(*t_runs.last);
}

std::vector<Counter> traffic_counters() {
  std::vector<Counter> c{
      {"reads", "elements read from the large arrays by the last run", [] { return count_of(&Traffic::reads); }},
      {"writes", "elements written to them", [] { return count_of(&Traffic::writes); }}};
  for (int a = 0; a < kArrayCount; ++a) {
    c.push_back({std::string("reads_") + array_name(a), std::string("elements of ") + array_name(a) + " read",
                 [a] { return count_of([a](const Traffic& t) { return t.read[size_t(a)]; }); }});
    c.push_back({std::string("writes_") + array_name(a), std::string("elements of ") + array_name(a) + " written",
                 [a] { return count_of([a](const Traffic& t) { return t.written[size_t(a)]; }); }});
  }
  return c;
}

// Every Config field and the traffic switch, each with its flag and C ABI name.
const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::range("block_q", 1, 1 << 30, 0, "B_r, query rows per tile (0: min(ceil(M/4d), d))"),
       Option::range("block_k", 1, 1 << 30, 0, "B_c, key rows per tile (0: ceil(M/4d))"),
       Option::range("sram_bytes", 1, int64_t(1) << 40, Config{}.sram_bytes,
                     "fast-memory budget in bytes (M = bytes/4 floats)"),
       Option::range("threads", 1, kMaxThreads, Config{}.threads,
                     "worker threads (results are the same for any count)"),
       Option::flag_option("count_traffic",
                           "count elements read from and written to Q, K, V, O, L, dO, D, dQ, dK, dV")},
      traffic_counters()};
  return table;
}

// The calling thread's Config, read at the start of each call.
Config current_config() {
  const OptionTable& o = options();
  Config c;
  c.block_q = int(o.get("block_q"));
  c.block_k = int(o.get("block_k"));
  c.sram_bytes = o.get("sram_bytes");
  c.threads = int(o.get("threads"));
  return c;
}

bool counting() { return options().get("count_traffic") != 0; }

std::string tiles_row(const Problem& p, const Config& c) {
  const Tiles t = tiles_for(p, c);
  return "B_r=" + std::to_string(t.B_r) + " B_c=" + std::to_string(t.B_c) +
         "  T_r=" + std::to_string(t.T_r) + " T_c=" + std::to_string(t.T_c) +
         "  (M = " + std::to_string(c.sram_bytes) + " bytes" +
         (c.block_q > 0 || c.block_k > 0 ? ", sizes set by hand)" : ")");
}

std::string compare_row(const Traffic& counted, const Traffic& predicted) {
  return "read " + std::to_string(predicted.reads()) + ", written " +
         std::to_string(predicted.writes()) +
         (counted == predicted ? "  (counted == closed form)" : "  (MISMATCH with the count)");
}

}  // namespace

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "FlashAttention-2 tiles (B_r x B_c sized to a fast-memory budget), forward and backward; counts memory traffic";
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) {
    const bool count = counting();
    Traffic counted;
    forward(p, current_config(), Q, K, V, O, L, count ? &counted : nullptr);
    if (count) {
      t_runs.forward = counted;
      t_runs.forward_counted = true;
      t_runs.last = &t_runs.forward;
    }
  };
  s.backward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                  const float* O, const float* L, const float* dO, float* dQ, float* dK, float* dV) {
    const bool count = counting();
    Traffic counted;
    backward(p, current_config(), Q, K, V, O, L, dO, dQ, dK, dV, count ? &counted : nullptr);
    if (count) {
      t_runs.backward = counted;
      t_runs.backward_counted = true;
      t_runs.last = &t_runs.backward;
    }
  };
  s.report = [](const Problem& p, Dtype) {
    const Config config = current_config();
    const LastRuns& st = t_runs;
    std::vector<std::pair<std::string, std::string>> rows;
    rows.push_back({"tiles", tiles_row(p, config)});
    rows.push_back({"threads", std::to_string(config.threads)});
    if (!counting()) {
      rows.push_back({"traffic", "not counted (add --count-traffic)"});
      return rows;
    }
    if (st.forward_counted) {
      rows.push_back({"traffic forward", st.forward.describe()});
      rows.push_back({"  closed form", compare_row(st.forward, predicted_forward_traffic(p, config))});
    }
    if (st.backward_counted) {
      rows.push_back({"traffic backward", st.backward.describe()});
      rows.push_back({"  closed form", compare_row(st.backward, predicted_backward_traffic(p, config))});
    }
    // What standard attention moves in its forward (S and P written and read back once each).
    const double standard = double(p.batch) * p.heads *
                            (4.0 * p.seq_q * p.seq_k + 2.0 * p.seq_q * p.head_dim + 2.0 * p.seq_k * p.head_dim);
    rows.push_back({"  standard attention", "forward moves about " + std::to_string(int64_t(standard)) +
                                                " elements (4·N_q·N_k + 2·N_q·d + 2·N_k·d per head)"});
    return rows;
  };
  options().attach(s);
  return s;
}

}  // namespace fa::stage06
