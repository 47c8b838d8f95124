// How stage 06 presents itself to the driver, the tour, the tests and the C ABI: one
// stage-wide Config (tile sizes, budget, threads), the traffic switch, and the report rows.
#include <CLI/CLI.hpp>
#include <stdexcept>

#include "tiled_cpu.h"

namespace fa::stage06 {

namespace {

// What the command line (or fa_set_option) chose, and what the last run counted.
struct Settings {
  Config config;
  bool count_traffic = false;
  Traffic forward, backward;  ///< the last forward's and backward's counts
  bool forward_counted = false, backward_counted = false;
  const Traffic* last = nullptr;  ///< whichever of the two ran last
};

Settings& settings() {
  static Settings s;
  return s;
}

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

int64_t counter(const std::string& name) {
  const Settings& s = settings();
  if (s.last == nullptr)
    throw std::invalid_argument("06_tiled_cpu: no traffic has been counted yet (set option "
                                "count_traffic to 1, then run forward or backward)");
  if (name == "reads") return s.last->reads();
  if (name == "writes") return s.last->writes();
  for (int a = 0; a < kArrayCount; ++a) {
    if (name == std::string("reads_") + array_name(a)) return s.last->read[size_t(a)];
    if (name == std::string("writes_") + array_name(a)) return s.last->written[size_t(a)];
  }
  throw std::invalid_argument("06_tiled_cpu: counter '" + name +
                              "' is not one of reads, writes, reads_<array>, writes_<array> "
                              "(arrays: Q K V O L dO D dQ dK dV)");
}

void set(const std::string& name, int64_t value) {
  Config& c = settings().config;
  const auto as_int = [&](int64_t v) {
    if (v < 0 || v > (int64_t(1) << 30))
      throw std::invalid_argument("06_tiled_cpu: " + name + " = " + std::to_string(v) +
                                  " is not allowed (must be between 0 and 2^30)");
    return int(v);
  };
  Config next = c;
  if (name == "block_q") next.block_q = as_int(value);
  else if (name == "block_k") next.block_k = as_int(value);
  else if (name == "sram_bytes") next.sram_bytes = value;
  else if (name == "threads") next.threads = as_int(value);
  else if (name == "count_traffic") {
    settings().count_traffic = value != 0;
    return;
  } else
    throw std::invalid_argument("06_tiled_cpu: option '" + name +
                                "' is not one of block_q, block_k, sram_bytes, threads, count_traffic");
  Problem any;
  tiles_for(any, next);  // refuses a bad value now, with its name, rather than at the next run
  c = next;
}

}  // namespace

StageInfo info() {
  StageInfo s;
  s.name = "06_tiled_cpu";
  s.idea = "FlashAttention-2 tiles (B_r x B_c sized to a fast-memory budget), forward and backward; counts memory traffic";
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                 float* O, float* L) {
    Settings& st = settings();
    Traffic counted;
    forward(p, st.config, Q, K, V, O, L, st.count_traffic ? &counted : nullptr);
    if (st.count_traffic) {
      st.forward = counted;
      st.forward_counted = true;
      st.last = &st.forward;
    }
  };
  s.backward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V,
                  const float* O, const float* L, const float* dO, float* dQ, float* dK, float* dV) {
    Settings& st = settings();
    Traffic counted;
    backward(p, st.config, Q, K, V, O, L, dO, dQ, dK, dV, st.count_traffic ? &counted : nullptr);
    if (st.count_traffic) {
      st.backward = counted;
      st.backward_counted = true;
      st.last = &st.backward;
    }
  };
  s.add_options = [](CLI::App& app) {
    Settings& st = settings();
    app.add_option("--block-q", st.config.block_q, "B_r, query rows per tile (0: min(ceil(M/4d), d))")
        ->check(CLI::Range(0, 1 << 30))
        ->capture_default_str();
    app.add_option("--block-k", st.config.block_k, "B_c, key rows per tile (0: ceil(M/4d))")
        ->check(CLI::Range(0, 1 << 30))
        ->capture_default_str();
    app.add_option("--sram-bytes", st.config.sram_bytes, "fast-memory budget in bytes (M = bytes/4 floats)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
        ->capture_default_str();
    app.add_option("--threads", st.config.threads, "worker threads (results are the same for any count)")
        ->check(CLI::Range(1, 1 << 30))
        ->capture_default_str();
    app.add_flag("--count-traffic", st.count_traffic,
                 "count elements read from and written to Q, K, V, O, L, dO, D, dQ, dK, dV");
  };
  s.report = [](const Problem& p, Dtype) {
    const Settings& st = settings();
    std::vector<std::pair<std::string, std::string>> rows;
    rows.push_back({"tiles", tiles_row(p, st.config)});
    rows.push_back({"threads", std::to_string(st.config.threads)});
    if (!st.count_traffic) {
      rows.push_back({"traffic", "not counted (add --count-traffic)"});
      return rows;
    }
    if (st.forward_counted) {
      rows.push_back({"traffic forward", st.forward.describe()});
      rows.push_back({"  closed form", compare_row(st.forward, predicted_forward_traffic(p, st.config))});
    }
    if (st.backward_counted) {
      rows.push_back({"traffic backward", st.backward.describe()});
      rows.push_back({"  closed form", compare_row(st.backward, predicted_backward_traffic(p, st.config))});
    }
    // What standard attention moves in its forward (S and P written and read back once each).
    const double standard = double(p.batch) * p.heads *
                            (4.0 * p.seq_q * p.seq_k + 2.0 * p.seq_q * p.head_dim + 2.0 * p.seq_k * p.head_dim);
    rows.push_back({"  standard attention", "forward moves about " + std::to_string(int64_t(standard)) +
                                                " elements (4·N_q·N_k + 2·N_q·d + 2·N_k·d per head)"});
    return rows;
  };
  s.set_option = set;
  s.get_counter = counter;
  return s;
}

}  // namespace fa::stage06
