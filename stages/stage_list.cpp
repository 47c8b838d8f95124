// The one list of stages. A stage that is not in this tree (or, for GPU stages, a build
// without CUDA) is simply absent from the list; the tour reports GPU stages as skipped.
#include "stage_list.h"

#include <stdexcept>

#if __has_include("naive.h")
#include "naive.h"
#endif
#if __has_include("safe_softmax.h")
#include "safe_softmax.h"
#endif
#if __has_include("three_pass.h")
#include "three_pass.h"
#endif
#if __has_include("two_pass_online.h")
#include "two_pass_online.h"
#endif
#if __has_include("one_pass_fused.h")
#include "one_pass_fused.h"
#endif
#if __has_include("tiled_cpu.h")
#include "tiled_cpu.h"
#define FA_HAS_06 1
#endif
#if __has_include("ring_attention.h")
#include "ring_attention.h"
#define FA_HAS_12 1
#endif
#ifdef FA_HAVE_CUDA
#include "cuda_utils.h"
#if __has_include("smem_cuda.h")
#include "smem_cuda.h"
#define FA_HAS_07 1
#endif
#if __has_include("tensor_core_fwd.h")
#include "tensor_core_fwd.h"
#define FA_HAS_08 1
#endif
#if __has_include("tensor_core_bwd.h")
#include "tensor_core_bwd.h"
#define FA_HAS_09 1
#endif
#if __has_include("hopper_fwd.h")
#include "hopper_fwd.h"
#define FA_HAS_10 1
#endif
#if __has_include("hopper_bwd.h")
#include "hopper_bwd.h"
#define FA_HAS_11 1
#endif
#if __has_include("ring_gpu.h")
#include "ring_gpu.h"
#define FA_HAS_12_GPU 1
#endif
#endif

namespace fa {

const std::vector<StageInfo>& all_stages() {
  static const std::vector<StageInfo> list = {
      stage01::info(), stage02::info(), stage03::info(), stage04::info(), stage05::info(),
#ifdef FA_HAS_06
      stage06::info(),
#endif
#ifdef FA_HAS_07
      stage07::info(),
#endif
#ifdef FA_HAS_08
      stage08::info(),
#endif
#ifdef FA_HAS_09
      stage09::info(),
#endif
#ifdef FA_HAS_10
      stage10::info(),
#endif
#ifdef FA_HAS_11
      stage11::info(),
#endif
#ifdef FA_HAS_12
      stage12::info(),
#endif
#ifdef FA_HAS_12_GPU
      stage12::gpu_info(),
#endif
  };
  return list;
}

const StageInfo& find_stage(const std::string& name) {
  const StageInfo* found = nullptr;
  int matches = 0;
  std::string names;
  for (const auto& s : all_stages()) {
    names += (names.empty() ? "" : ", ") + s.name;
    if (s.name == name) return s;
    if (!name.empty() && s.name.compare(0, name.size(), name) == 0) {
      found = &s;
      ++matches;
    }
  }
  if (matches == 1) return *found;
  throw std::invalid_argument("stage '" + name + "' " +
                              (matches ? "matches several stages" : "is not a stage") +
                              " (stages: " + names + ")");
}

bool gpu_available() {
#ifdef FA_HAVE_CUDA
  return have_gpu();
#else
  return false;
#endif
}

}  // namespace fa
