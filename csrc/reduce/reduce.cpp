#include "reduce.hpp"

#include <algorithm>
#include <complex>
#include <cstdint>
#include <type_traits>

#include "../common/error.hpp"
#include "half.hpp"

// Each exported kernel is compiled twice (AVX2+F16C+FMA and baseline x86-64) and
// picked at load time, so one binary is fast on current CPUs and runs on old ones.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ROCE_KERNEL __attribute__((target_clones("arch=haswell", "default"), flatten))
#else
#define ROCE_KERNEL __attribute__((flatten))
#endif

namespace roce::reduce {
namespace {

// How a storage type is loaded into the type arithmetic happens in, and stored back.
template <class T> struct Acc {
  using type = T;
  static T load(T x) { return x; }
  static T store(T x) { return x; }
};
template <> struct Acc<Half> {
  using type = float;
  static float load(Half x) { return toFloat(x); }
  static Half store(float x) { return toHalf(x); }
};
template <> struct Acc<BFloat16> {
  using type = float;
  static float load(BFloat16 x) { return toFloat(x); }
  static BFloat16 store(float x) { return toBFloat16(x); }
};

template <class A> constexpr bool kIntegral = std::is_integral_v<A>;
template <class A> using Wide = std::make_unsigned_t<A>;  // wrap-around arithmetic

struct OpSum {
  template <class A> static A apply(A a, A b) {
    if constexpr (std::is_same_v<A, bool>) return a | b;
    else if constexpr (kIntegral<A>) return static_cast<A>(static_cast<Wide<A>>(a) + static_cast<Wide<A>>(b));
    else return a + b;
  }
};
struct OpProduct {
  template <class A> static A apply(A a, A b) {
    if constexpr (std::is_same_v<A, bool>) return a & b;
    else if constexpr (kIntegral<A>) {
      // Promote to at least unsigned int so uint16*uint16 cannot overflow a signed int.
      using W = std::common_type_t<Wide<A>, unsigned>;
      return static_cast<A>(static_cast<W>(static_cast<Wide<A>>(a)) * static_cast<W>(static_cast<Wide<A>>(b)));
    } else return a * b;
  }
};
struct OpMin { template <class A> static A apply(A a, A b) { return b < a ? b : a; } };
struct OpMax { template <class A> static A apply(A a, A b) { return a < b ? b : a; } };
struct OpBAnd { template <class A> static A apply(A a, A b) { return a & b; } };
struct OpBOr { template <class A> static A apply(A a, A b) { return a | b; } };
struct OpBXor { template <class A> static A apply(A a, A b) { return a ^ b; } };

template <class T, class Op>
inline void manyLoop(T* out, const T* const* ins, int nin, size_t n) {
  using L = Acc<T>;
  using A = typename L::type;
  constexpr size_t kBlock = 256;  // accumulator stays in L1 and registers
  A acc[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    const T* in0 = ins[0] + base;
    for (size_t i = 0; i < m; ++i) acc[i] = L::load(in0[i]);
    for (int j = 1; j < nin; ++j) {
      const T* p = ins[j] + base;
      for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], L::load(p[i]));
    }
    T* o = out + base;
    for (size_t i = 0; i < m; ++i) o[i] = L::store(acc[i]);
  }
}

template <class T>
inline void manyForType(ReduceOp op, void* out, const void* const* ins, int nin, size_t n) {
  auto o = static_cast<T*>(out);
  auto in = reinterpret_cast<const T* const*>(ins);
  using A = typename Acc<T>::type;
  switch (op) {
    case ReduceOp::Sum: return manyLoop<T, OpSum>(o, in, nin, n);
    case ReduceOp::Product: return manyLoop<T, OpProduct>(o, in, nin, n);
    default: break;
  }
  if constexpr (!std::is_same_v<A, std::complex<float>> && !std::is_same_v<A, std::complex<double>>) {
    switch (op) {
      case ReduceOp::Min: return manyLoop<T, OpMin>(o, in, nin, n);
      case ReduceOp::Max: return manyLoop<T, OpMax>(o, in, nin, n);
      default: break;
    }
    if constexpr (kIntegral<A>) {
      switch (op) {
        case ReduceOp::BAnd: return manyLoop<T, OpBAnd>(o, in, nin, n);
        case ReduceOp::BOr: return manyLoop<T, OpBOr>(o, in, nin, n);
        case ReduceOp::BXor: return manyLoop<T, OpBXor>(o, in, nin, n);
        default: break;
      }
    }
  }
  throwInvalid(str("internal: no kernel for reduce op ", reduceOpName(op)));
}

template <class T>
inline void scaleForType(void* out, const void* in, size_t n, double factor) {
  using L = Acc<T>;
  using A = typename L::type;
  auto o = static_cast<T*>(out);
  auto p = static_cast<const T*>(in);
  if constexpr (kIntegral<A>) {
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(static_cast<double>(p[i]) * factor);
  } else if constexpr (std::is_same_v<A, std::complex<float>>) {
    const float f = static_cast<float>(factor);
    for (size_t i = 0; i < n; ++i) o[i] = p[i] * f;
  } else {
    const auto f = static_cast<typename std::conditional_t<std::is_same_v<A, std::complex<double>>, double, A>>(factor);
    for (size_t i = 0; i < n; ++i) o[i] = L::store(L::load(p[i]) * f);
  }
}

template <class T>
inline void divideForType(void* x, size_t n, int divisor) {
  using L = Acc<T>;
  using A = typename L::type;
  auto p = static_cast<T*>(x);
  if constexpr (kIntegral<A>) {
    const A d = static_cast<A>(divisor);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
  } else if constexpr (std::is_same_v<A, std::complex<float>>) {
    const float d = static_cast<float>(divisor);
    for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
  } else if constexpr (std::is_same_v<A, std::complex<double>>) {
    const double d = divisor;
    for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
  } else {
    const A d = static_cast<A>(divisor);
    for (size_t i = 0; i < n; ++i) p[i] = L::store(L::load(p[i]) / d);
  }
}

// Calls fn.template operator()<StorageType>() for the storage type of `t`.
template <class Fn>
inline void visitType(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::Float32: return fn(float{});
    case DataType::Float64: return fn(double{});
    case DataType::Float16: return fn(Half{});
    case DataType::BFloat16: return fn(BFloat16{});
    case DataType::Int8: return fn(int8_t{});
    case DataType::UInt8: return fn(uint8_t{});
    case DataType::Int16: return fn(int16_t{});
    case DataType::Int32: return fn(int32_t{});
    case DataType::Int64: return fn(int64_t{});
    case DataType::Bool: return fn(bool{});
    case DataType::Complex64: return fn(std::complex<float>{});
    case DataType::Complex128: return fn(std::complex<double>{});
  }
}

}  // namespace

ReduceOp kernelOp(ReduceOp op) {
  return (op == ReduceOp::Avg || op == ReduceOp::PreMulSum) ? ReduceOp::Sum : op;
}

ROCE_KERNEL void reduceMany(DataType t, ReduceOp op, void* out, const void* const* ins, int nin, size_t n) {
  checkSupported(op, t);
  op = kernelOp(op);
  visitType(t, [&](auto tag) { manyForType<decltype(tag)>(op, out, ins, nin, n); });
}

ROCE_KERNEL void reduceInto(DataType t, ReduceOp op, void* acc, const void* in, size_t n) {
  const void* ins[2] = {acc, in};
  reduceMany(t, op, acc, ins, 2, n);
}

ROCE_KERNEL void scaleCopy(DataType t, void* out, const void* in, size_t n, double factor) {
  visitType(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) throwInvalid("PREMUL_SUM is not defined for bool");
    else scaleForType<T>(out, in, n, factor);
  });
}

ROCE_KERNEL void divideBy(DataType t, void* x, size_t n, int divisor) {
  visitType(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) throwInvalid("AVG is not defined for bool");
    else divideForType<T>(x, n, divisor);
  });
}

}  // namespace roce::reduce
