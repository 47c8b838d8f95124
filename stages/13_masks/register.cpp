// How stage 13's CPU step presents itself: the tile-size options (command line, set_option)
// and the tile counts of the calling thread's last run. info() is the stage with no
// modifiers, for the shared matrix; the program (main.cpp) adds the modifiers.
#include <stdexcept>

#include "masks.h"
#include "options.h"

namespace fa::stage13 {

namespace {

thread_local TileCounts t_last;
thread_local bool t_counted = false;

int64_t last(int64_t TileCounts::*field) {
  if (!t_counted)
    throw std::invalid_argument(std::string(kStageName) + ": no run on this thread yet (run forward or backward first)");
  return t_last.*field;
}

const OptionTable& options() {
  static const OptionTable table{
      kStageName,
      {Option::range("block_q", 1, 1 << 30, 0, "B_r, query rows per tile (0: stage 06's rule, min(ceil(M/4d), d))"),
       Option::range("block_k", 1, 1 << 30, 0, "B_c, key rows per tile (0: stage 06's rule, ceil(M/4d))")},
      {{"tiles_skip", "tiles the last run skipped", [] { return last(&TileCounts::skip); }},
       {"tiles_full", "tiles it computed without a mask", [] { return last(&TileCounts::full); }},
       {"tiles_partial", "tiles it computed with the element mask", [] { return last(&TileCounts::partial); }}}};
  return table;
}

void remember(const TileCounts& counts) {
  t_last = counts;
  t_counted = true;
}

}  // namespace

Config current_config() {
  Config c;
  c.block_q = int(options().get("block_q"));
  c.block_k = int(options().get("block_k"));
  return c;
}

StageInfo info() {
  StageInfo s;
  s.name = kStageName;
  s.idea = "a block mask (skip, full, partial tiles) and score modifiers in stage 06's tiled loop";
  s.forward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V, float* O, float* L) {
    TileCounts counts;
    forward(p, Modifiers{}, current_config(), Q, K, V, O, L, &counts);
    remember(counts);
  };
  s.backward = [](const Problem& p, Dtype, const float* Q, const float* K, const float* V, const float* O,
                  const float* L, const float* dO, float* dQ, float* dK, float* dV) {
    TileCounts counts;
    backward(p, Modifiers{}, current_config(), Q, K, V, O, L, dO, dQ, dK, dV, nullptr, &counts);
    remember(counts);
  };
  s.report = [](const Problem&, Dtype) {
    std::vector<std::pair<std::string, std::string>> rows;
    if (t_counted) rows.push_back({"tiles", t_last.describe()});
    return rows;
  };
  options().attach(s);
  return s;
}

}  // namespace fa::stage13
