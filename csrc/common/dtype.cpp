#include "dtype.hpp"

#include "error.hpp"

namespace roce {

size_t elementSize(DataType t) {
  switch (t) {
    case DataType::Float32: case DataType::Int32: return 4;
    case DataType::Float64: case DataType::Int64: case DataType::Complex64: return 8;
    case DataType::Complex128: return 16;
    case DataType::Float16: case DataType::BFloat16: case DataType::Int16: return 2;
    case DataType::Int8: case DataType::UInt8: case DataType::Bool: return 1;
  }
  return 1;
}

const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::Float32: return "float32";
    case DataType::Float64: return "float64";
    case DataType::Float16: return "float16";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Int8: return "int8";
    case DataType::UInt8: return "uint8";
    case DataType::Int16: return "int16";
    case DataType::Int32: return "int32";
    case DataType::Int64: return "int64";
    case DataType::Bool: return "bool";
    case DataType::Complex64: return "complex64";
    case DataType::Complex128: return "complex128";
  }
  return "?";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Avg: return "AVG";
    case ReduceOp::Product: return "PRODUCT";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::BAnd: return "BAND";
    case ReduceOp::BOr: return "BOR";
    case ReduceOp::BXor: return "BXOR";
    case ReduceOp::PreMulSum: return "PREMUL_SUM";
  }
  return "?";
}

bool isFloating(DataType t) {
  return t == DataType::Float32 || t == DataType::Float64 || t == DataType::Float16 ||
         t == DataType::BFloat16;
}

bool isComplex(DataType t) { return t == DataType::Complex64 || t == DataType::Complex128; }

void checkSupported(ReduceOp op, DataType t) {
  bool bitwise = op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
  bool ok = true;
  if (bitwise && (isFloating(t) || isComplex(t))) ok = false;
  if ((op == ReduceOp::Avg || op == ReduceOp::PreMulSum) && t == DataType::Bool) ok = false;
  if ((op == ReduceOp::Min || op == ReduceOp::Max) && isComplex(t)) ok = false;
  if (!ok)
    throwInvalid(str("reduce op ", reduceOpName(op), " is not defined for dtype ",
                     dataTypeName(t), " (bitwise ops need integer or bool tensors; AVG and "
                     "PREMUL_SUM need numbers; MIN/MAX need ordered types)"));
}

}  // namespace roce
