// Stage 14's step names and the split rule: host code that needs no GPU, so that the CPU
// test suite checks it on every machine.
#include <algorithm>
#include <stdexcept>

#include "decode.h"

namespace fa::stage14 {

std::string step_name(Step s) {
  switch (s) {
    case Step::Auto: return "auto";
    case Step::OneBlock: return "14a";
    case Step::SplitKV: return "14b";
    case Step::GqaPacking: return "14c";
    case Step::Paged: return "14d";
    case Step::TensorCores: return "14e";
  }
  return "?";
}

Step parse_step(const std::string& name) {
  for (Step s : {Step::Auto, Step::OneBlock, Step::SplitKV, Step::GqaPacking, Step::Paged, Step::TensorCores})
    if (name == step_name(s)) return s;
  throw std::invalid_argument(std::string(kStageName) + ": step '" + name +
                              "' is not a step (steps: auto, 14a, 14b, 14c, 14d, 14e)");
}

std::vector<int> gpu_head_dims() { return {64, 128}; }

//! [split rule]
int split_rule(int64_t blocks_without_split, int max_seqlen, int sms, int blocks_per_sm) {
  // As many blocks as the SMs hold at once (`blocks_per_sm` each), and no more: with fewer,
  // SMs sit idle and their share of the memory bandwidth is lost (batch 1 × 8 KV heads is 8
  // blocks); with more, the blocks past one wave run as a second, mostly empty wave.
  const int64_t want = int64_t(sms) * blocks_per_sm;
  int64_t splits = want / std::max<int64_t>(1, blocks_without_split);
  // No split shorter than kMinKeysPerSplit keys: a split's fixed costs (loading its queries,
  // writing a partial, the combine reading it back) must stay small against its keys.
  splits = std::min<int64_t>(splits, std::max(1, max_seqlen / kMinKeysPerSplit));
  return int(std::clamp<int64_t>(splits, 1, kMaxSplits));
}
//! [split rule]

}  // namespace fa::stage14
