// Tensor maps through the driver's cuTensorMapEncodeTiled, found at run time with the
// runtime's cudaGetDriverEntryPointByVersion (so nothing links libcuda directly).
#include "hopper/tensor_map.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fa::hopper {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || ptr == nullptr) {
      cudaGetLastError();
      throw std::runtime_error("the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12+)");
    }
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tensor_map(const void* base, Dtype dtype, int d, int seq, int64_t heads_total, int box_rows,
                            const char* who, const char* what) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(seq), cuuint64_t(heads_total)};
  const cuuint64_t strides[2] = {cuuint64_t(d) * 2, cuuint64_t(d) * 2 * cuuint64_t(seq)};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {64, cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode_tiled()(
      &map, dtype == Dtype::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string(who) + ": cuTensorMapEncodeTiled refused the map of " + what +
                             " (error " + std::to_string(int(r)) + ", d = " + std::to_string(d) +
                             ", seq = " + std::to_string(seq) + ", heads = " + std::to_string(heads_total) + ")");
  return map;
}

}  // namespace fa::hopper
