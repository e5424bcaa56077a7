#pragma once

#include <c10/core/ScalarType.h>

#include "csrc/common/types.h"

namespace ringdist {

// The engine's DataType for a torch dtype; false for dtypes ringdist does not handle.
inline bool toDataType(at::ScalarType type, DataType* out) {
  switch (type) {
    case at::kFloat: *out = DataType::kFloat32; return true;
    case at::kDouble: *out = DataType::kFloat64; return true;
    case at::kHalf: *out = DataType::kFloat16; return true;
    case at::kBFloat16: *out = DataType::kBFloat16; return true;
    case at::kChar: *out = DataType::kInt8; return true;
    case at::kByte: *out = DataType::kUInt8; return true;
    case at::kInt: *out = DataType::kInt32; return true;
    case at::kLong: *out = DataType::kInt64; return true;
    case at::kBool: *out = DataType::kBool; return true;
    default: return false;
  }
}

}  // namespace ringdist
