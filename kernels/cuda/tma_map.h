// Tensor maps for our Hopper GEMMs (fp8_gemm_sm90.cu, bf16_gemm_sm90.cu): the driver's encoder,
// the 128-byte-swizzled operand and output maps the kernels load and store through, and the
// device's multiprocessor count (their persistent grids).
#ifndef BOULDER_KERNELS_CUDA_TMA_MAP_H_
#define BOULDER_KERNELS_CUDA_TMA_MAP_H_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace boulder::kernels::cuda::tma {

inline PFN_cuTensorMapEncodeTiled_v12000 Encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// The output: rows × cols BF16, row-major, boxes of 64 × 64 with the 128-byte swizzle.
inline bool EncodeOutMap(CUtensorMap* map, __nv_bfloat16* ptr, int rows, int cols) {
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem[2] = {1, 1};
  return Encoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ptr, dims, strides, box, elem,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_NONE,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// rows × K bytes, row-major, boxes of box_rows × 128 bytes with the 128-byte swizzle.
inline bool EncodeMap(CUtensorMap* map, const uint8_t* ptr, int rows, int K, int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(K)};
  const cuuint32_t box[2] = {cuuint32_t(128), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return Encoder()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(ptr), dims, strides,
                   box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

inline int SmCount() {
  static int n = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 0;
    }
    return sms;
  }();
  return n;
}

}  // namespace boulder::kernels::cuda::tma

#endif  // BOULDER_KERNELS_CUDA_TMA_MAP_H_
