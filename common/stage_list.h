/// \file stage_list.h
/// \brief The one list of stages, in order. The tour, the C ABI and the tests walk it.
#pragma once

#include <string>
#include <vector>

#include "stage.h"

namespace fa {

/// Every stage built into this tree, in order (01 … 10).
const std::vector<StageInfo>& all_stages();

/// The stage named `name` or by a unique prefix of its name ("05"); throws
/// std::invalid_argument listing the stages when there is no such stage or several match.
const StageInfo& find_stage(const std::string& name);

/// True when a CUDA device is present and usable (always false in a build without CUDA).
bool gpu_available();

}  // namespace fa
