#include "stage.h"

#include <algorithm>

namespace fa {

bool StageInfo::supports(Dtype t) const {
  return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end();
}

bool StageInfo::supports_head_dim(int d) const {
  return head_dims.empty() || std::find(head_dims.begin(), head_dims.end(), d) != head_dims.end();
}

}  // namespace fa
