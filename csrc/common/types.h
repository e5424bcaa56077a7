#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ringdist {

// Element types the engine understands. Values travel in wire headers, so the
// numbering is part of the protocol: append only.
enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
};

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,
  kProduct = 2,
  kMin = 3,
  kMax = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
};

size_t elementSize(DataType dtype);
const char* dataTypeName(DataType dtype);
const char* reduceOpName(ReduceOp op);
bool isFloating(DataType dtype);

}  // namespace ringdist
