// Stage 13's program. The modifiers are not part of the common `Problem`, and the check needs
// the masked reference, so the stage has its own command line (as stage 14 has) with the
// driver's habits: seeded inputs, one table, the exit codes of errors.h, and bad input refused
// with one line before any work.
//
//   stage13 --seqlens 100,0,1,300 --causal --window-left 64 --backward   documents + window
//   stage13 --seq-q 512 --seq-k 512 --softcap 5 --alibi --sinks --backward
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "driver.h"
#include "errors.h"
#include "mask_reference.h"
#include "masks.h"
#include "tensors.h"

namespace s13 = fa::stage13;

int main(int argc, char** argv) {
  const std::string program = s13::kStageName;
  fa::Problem p;
  int seed = 1;
  bool backward = false, no_check = false, alibi = false, sinks = false;
  std::optional<int64_t> window_left, window_right;
  double softcap = 0;
  std::vector<int64_t> seqlens;
  std::string dist_s = "normal";

  CLI::App app{"Stage 13 (CPU step): block masks and score modifiers in stage 06's tiled loop"};
  app.add_option("--batch", p.batch, "batch (1 with --seqlens)")->capture_default_str();
  app.add_option("--heads", p.heads, "query heads")->capture_default_str();
  app.add_option("--kv-heads", p.kv_heads, "KV heads (heads must be a multiple)")->capture_default_str();
  app.add_option("--seq-q", p.seq_q, "N_q (set by --seqlens)")->capture_default_str();
  app.add_option("--seq-k", p.seq_k, "N_k (set by --seqlens)")->capture_default_str();
  app.add_option("--head-dim", p.head_dim, "d")->capture_default_str();
  app.add_flag("--causal", p.causal, "bottom-right causal mask (in each document)");
  app.add_option("--window-left", window_left, "keys before the diagonal a row sees (>= 0; default: all)");
  app.add_option("--window-right", window_right, "keys after the diagonal a row sees (>= 0; default: all; 0 when causal)");
  app.add_option("--softcap", softcap, "logit soft-cap: s -> cap*tanh(s/cap) (> 0; default: off)");
  app.add_flag("--alibi", alibi, "ALiBi with the geometric slopes 2^(-8(h+1)/H)");
  app.add_flag("--sinks", sinks, "one sink logit per head (from the seed), in the softmax's denominator");
  app.add_option("--seqlens", seqlens, "document lengths packed into one sequence, e.g. 100,0,1,300 (sets --seq-q, --seq-k)")
      ->delimiter(',');
  app.add_option("--seed", seed, "inputs' seed")->capture_default_str();
  app.add_option("--dist", dist_s, "inputs: normal, uniform, large")->capture_default_str();
  app.add_flag("--backward", backward, "run and check the backward too");
  app.add_flag("--no-check", no_check, "skip the comparison with the reference");
  s13::info().add_options(app);  // --block-q, --block-k (the stage's option table)
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
    fa::Modifiers m;
    m.window_left = window_left;
    m.window_right = window_right;
    if (app.count("--softcap") && !(softcap > 0))
      throw std::invalid_argument(program + ": softcap = " + std::to_string(softcap) + " is not allowed (the cap must be > 0)");
    m.softcap = softcap;
    if (alibi) m.alibi_slopes = fa::alibi_slopes(p.heads);
    if (!seqlens.empty()) {
      m.cu_seqlens_q = m.cu_seqlens_k = fa::cu_seqlens_of(seqlens, program);
      p.seq_q = p.seq_k = int(m.cu_seqlens_q.back());
    }
    p.validate(program);
    const fa::Dist dist = fa::parse_dist(dist_s);
    fa::Tensors t = fa::Tensors::make(p, uint64_t(seed), dist, backward);
    if (sinks) {  // σ_h from the seed: the first heads' Q entries, a N(0, 1) draw
      m.sinks.resize(size_t(p.heads));
      fa::Tensors draw = fa::Tensors::make(fa::Problem{1, 1, 1, p.heads, 1, 1}, uint64_t(seed) + 7, fa::Dist::Normal, false);
      for (int h = 0; h < p.heads; ++h) m.sinks[size_t(h)] = draw.Q[size_t(h)];
    }
    m.validate(p, program);
    const s13::Config config = s13::current_config();
    std::printf("problem   %s\n", p.describe().c_str());
    std::printf("modifiers %s\n", m.describe().c_str());

    s13::TileCounts fwd, bwd;
    s13::forward(p, m, config, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), &fwd);
    std::vector<float> dsinks(size_t(p.heads), 0.0f);
    if (backward)
      s13::backward(p, m, config, t.Q.data(), t.K.data(), t.V.data(), t.O.data(), t.L.data(), t.dO.data(),
                    t.dQ.data(), t.dK.data(), t.dV.data(), dsinks.data(), &bwd);
    const fa::stage06::Tiles tiles = fa::stage06::tiles_for(p, config);
    std::printf("tiles     B_r=%lld B_c=%lld T_r=%lld T_c=%lld\n", (long long)tiles.B_r, (long long)tiles.B_c,
                (long long)tiles.T_r, (long long)tiles.T_c);
    std::printf("forward   %s\n", fwd.describe().c_str());
    if (backward) std::printf("backward  %s (dK/dV pass + dQ pass)\n", bwd.describe().c_str());
    if (no_check) return fa::kExitPass;

    const fa::CheckReport report = fa::compare_masked(p, m, t, backward, dsinks.data());
    std::printf("%s", report.summary().c_str());
    std::printf("result %s\n", report.pass() ? "PASS" : "FAIL");
    return report.pass() ? fa::kExitPass : fa::kExitCheckFailed;
  } catch (...) {
    return fa::report_failure(program, std::current_exception());
  }
}
