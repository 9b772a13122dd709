#include "kernels/backend.h"

namespace boulder::kernels {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kF64:
      return "fp64";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

}  // namespace boulder::kernels
