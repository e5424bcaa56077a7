#include "csrc/common/types.h"

namespace ringdist {

size_t elementSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kBool: return 1;
  }
  return 0;
}

const char* dataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "unknown";
}

bool isFloating(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
      dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

}  // namespace ringdist
