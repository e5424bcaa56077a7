#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <string>

#include "csrc/codec/codec.h"
#include "csrc/common/types.h"

namespace ringdist {

// The engine's enums for what Python hands the backend.

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

// The wire codec named by Python ("fp16", "bf16", "int8", "int4"); raises for others.
inline Codec parseCodec(const std::string& name) {
  Codec codec = Codec::kInt8;
  TORCH_CHECK(codecFromName(name, &codec), "ringdist codec: unknown codec '", name,
              "' (known: fp16, bf16, int8, int4)");
  return codec;
}

}  // namespace ringdist
