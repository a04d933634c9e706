// Element types and reduction operators as the library below the torch adapter
// sees them; the adapter maps at::ScalarType / c10d::ReduceOp onto these.
#pragma once
#include <cstddef>
#include <cstdint>

namespace roce {

enum class DataType : uint8_t {
  Float32, Float64, Float16, BFloat16, Int8, UInt8, Int16, Int32, Int64, Bool,
  Complex64, Complex128,
};

enum class ReduceOp : uint8_t { Sum, Avg, Product, Min, Max, BAnd, BOr, BXor, PreMulSum };

size_t elementSize(DataType t);
const char* dataTypeName(DataType t);
const char* reduceOpName(ReduceOp op);
bool isFloating(DataType t);
bool isComplex(DataType t);

// A reduction as the algorithms need it: the operator, and for PREMUL_SUM the
// factor every rank applies to its own input before summing.
struct Reduction {
  ReduceOp op = ReduceOp::Sum;
  double factor = 1.0;
};

// Raises roce::Error(Invalid) naming op and dtype if the pair has no meaning.
void checkSupported(ReduceOp op, DataType t);

}  // namespace roce
