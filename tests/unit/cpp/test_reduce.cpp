// The reduction kernels (csrc/reduce/reduce.hpp) for every dtype x op,
// against references computed here independently: integers exactly (wrap-
// around through uint64_t), floats through exact double sums and products of
// values chosen so the exact result fits a double, then rounded to the
// storage type by this file's own round-to-nearest-even (float16, bfloat16).
// float16 and bfloat16 must accumulate in float32 and round once: inputs are
// chosen so that rounding after every step would give another answer.
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/dtype.hpp"
#include "reduce/reduce.hpp"
#include "roce_check.hpp"

using roce::DataType;
using roce::ReduceOp;

namespace {

// ---- references -------------------------------------------------------------

// Round-to-nearest-even of a finite double to a binary float with `mant`
// stored mantissa bits and exponent bias `bias`, as its bit pattern. Written
// from the format's definition (frexp / nearbyint), not from half.hpp's bit tricks.
uint32_t roundToFormat(double x, int mant, int bias, int expBits) {
  const uint32_t sign = std::signbit(x) ? 1u << (mant + expBits) : 0;
  const double a = std::fabs(x);
  const uint32_t infBits = ((1u << expBits) - 1) << mant;
  if (std::isnan(x)) return sign | infBits | (1u << (mant - 1));
  const int minExp = 1 - bias;  // of the smallest normal
  int e;
  std::frexp(a, &e);
  e -= 1;  // a = 1.f * 2^e
  if (a == 0 || e < minExp) {
    // Subnormal (or rounds up to the smallest normal, which this encodes too).
    const double m = std::nearbyint(std::ldexp(a, mant - minExp));
    return sign | static_cast<uint32_t>(m);
  }
  double m = std::nearbyint(std::ldexp(a, mant - e));  // in [2^mant, 2^(mant+1)]
  if (m == std::ldexp(1.0, mant + 1)) m /= 2, ++e;
  if (e + bias >= (1 << expBits) - 1) return sign | infBits;
  return sign | (static_cast<uint32_t>(e + bias) << mant) | (static_cast<uint32_t>(m) - (1u << mant));
}
uint16_t halfBits(double x) { return static_cast<uint16_t>(roundToFormat(x, 10, 15, 5)); }
uint16_t bf16Bits(double x) { return static_cast<uint16_t>(roundToFormat(x, 7, 127, 8)); }
double fromFormat(uint32_t bits, int mant, int bias, int expBits) {
  const bool neg = bits >> (mant + expBits);
  const uint32_t e = (bits >> mant) & ((1u << expBits) - 1), m = bits & ((1u << mant) - 1);
  double v;
  if (e == 0) v = std::ldexp(m, 1 - bias - mant);
  else if (e == (1u << expBits) - 1) v = m ? std::nan("") : INFINITY;
  else v = std::ldexp(m + (1u << mant), static_cast<int>(e) - bias - mant);
  return neg ? -v : v;
}
double halfValue(uint16_t b) { return fromFormat(b, 10, 15, 5); }
double bf16Value(uint16_t b) { return fromFormat(b, 7, 127, 8); }

// A fixed pseudo-random sequence (splitmix64): the same cases on every run.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1)); }
};

const ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max,
                            ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor, ReduceOp::PreMulSum};
const DataType kAllTypes[] = {DataType::Float32, DataType::Float64, DataType::Float16, DataType::BFloat16,
                              DataType::Int8, DataType::UInt8, DataType::Int16, DataType::Int32,
                              DataType::Int64, DataType::Bool, DataType::Complex64, DataType::Complex128};

bool isBitwise(ReduceOp op) { return op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor; }

// Whether op means anything for t, written out per family (not via checkSupported).
bool defined(ReduceOp op, DataType t) {
  const bool floating = t == DataType::Float32 || t == DataType::Float64 || t == DataType::Float16 ||
                        t == DataType::BFloat16;
  const bool complex = t == DataType::Complex64 || t == DataType::Complex128;
  if (isBitwise(op)) return !floating && !complex;
  if (op == ReduceOp::Avg || op == ReduceOp::PreMulSum) return t != DataType::Bool;
  if (op == ReduceOp::Min || op == ReduceOp::Max) return !complex;
  return true;
}

// The kernels' elementwise operator for integers, exactly: SUM and PRODUCT
// wrap modulo 2^bits (computed in uint64_t, then truncated by the caller).
int64_t intApply(ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::Sum: case ReduceOp::Avg: case ReduceOp::PreMulSum:
      return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case ReduceOp::Product: return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    case ReduceOp::Min: return a < b ? a : b;
    case ReduceOp::Max: return a > b ? a : b;
    case ReduceOp::BAnd: return a & b;
    case ReduceOp::BOr: return a | b;
    case ReduceOp::BXor: return a ^ b;
  }
  return 0;
}

// ---- one integer type ----------------------------------------------------------

template <class T>
void checkIntegers(DataType t, ReduceOp op, int nin, size_t n, uint64_t seed) {
  INFO(roce::dataTypeName(t), " ", roce::reduceOpName(op), " nin=", nin, " n=", n);
  Rng rng{seed};
  const int64_t lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  std::vector<std::vector<T>> in(nin, std::vector<T>(n));
  for (auto& v : in)
    for (size_t i = 0; i < n; ++i) {
      // Mostly the full range (wrap-around), some small values, and the extremes.
      const uint64_t pick = rng.next() % 8;
      int64_t x = pick == 0 ? lo : pick == 1 ? hi : pick < 4 ? rng.range(-3, 3) : static_cast<int64_t>(rng.next());
      if (x < lo || x > hi) x = static_cast<T>(static_cast<uint64_t>(x));  // keep the low bits
      v[i] = static_cast<T>(x);
    }
  std::vector<const void*> ptrs;
  for (auto& v : in) ptrs.push_back(v.data());
  std::vector<T> out(n + 4, static_cast<T>(0x5a));  // the tail must stay untouched
  roce::reduce::reduceMany(t, op, out.data(), ptrs.data(), nin, n);
  int wrong = 0;
  for (size_t i = 0; i < n && wrong < 3; ++i) {
    int64_t acc = in[0][i];
    for (int j = 1; j < nin; ++j) acc = intApply(op, acc, in[j][i]);
    const T expect = static_cast<T>(static_cast<uint64_t>(acc));  // modulo 2^bits
    if (!CHECK_EQ(out[i], expect)) {
      INFO("element ", i);
      ++wrong;
    }
  }
  for (size_t i = n; i < n + 4; ++i) CHECK_EQ(out[i], static_cast<T>(0x5a));
}

// ---- floating types --------------------------------------------------------------

// How a float type is stored and read back in these tests.
template <class T> struct FloatCodec;
template <> struct FloatCodec<float> {
  using Storage = float;
  static Storage store(double x) { return static_cast<float>(x); }  // exact for the values used
  static double load(Storage s) { return s; }
  static Storage round(double exact) { return static_cast<float>(exact); }
};
template <> struct FloatCodec<double> {
  using Storage = double;
  static Storage store(double x) { return x; }
  static double load(Storage s) { return s; }
  static Storage round(double exact) { return exact; }
};
struct Half16 { uint16_t bits; };
struct Brain16 { uint16_t bits; };
template <> struct FloatCodec<Half16> {
  using Storage = uint16_t;
  static Storage store(double x) { return halfBits(x); }
  static double load(Storage s) { return halfValue(s); }
  static Storage round(double exact) { return halfBits(exact); }
};
template <> struct FloatCodec<Brain16> {
  using Storage = uint16_t;
  static Storage store(double x) { return bf16Bits(x); }
  static double load(Storage s) { return bf16Value(s); }
  static Storage round(double exact) { return bf16Bits(exact); }
};

// Values every format here holds exactly, whose sums and products over up
// to five inputs stay exact in float32 and double: multiples of 1/8 up to
// 2^maxLog (sums), or +-(1 + k/8) (products), or any of those for MIN/MAX.
double floatInput(Rng& rng, ReduceOp op, int maxLog) {
  if (op == ReduceOp::Product) return (rng.next() & 1 ? -1 : 1) * (1 + rng.range(0, 8) / 8.0);
  const int64_t scale = int64_t(1) << rng.range(0, maxLog);  // spread the magnitudes
  return static_cast<double>(rng.range(-8 * scale, 8 * scale)) / 8;
}

template <class F>
void checkFloats(DataType t, ReduceOp op, int nin, size_t n, uint64_t seed, int maxLog) {
  using C = FloatCodec<F>;
  using S = typename C::Storage;
  INFO(roce::dataTypeName(t), " ", roce::reduceOpName(op), " nin=", nin, " n=", n);
  Rng rng{seed};
  std::vector<std::vector<S>> in(nin, std::vector<S>(n));
  for (auto& v : in)
    for (size_t i = 0; i < n; ++i) {
      v[i] = C::store(floatInput(rng, op, maxLog));
      REQUIRE(std::isfinite(C::load(v[i])));
    }
  std::vector<const void*> ptrs;
  for (auto& v : in) ptrs.push_back(v.data());
  std::vector<S> out(n + 4, C::store(-7.5));
  roce::reduce::reduceMany(t, op, out.data(), ptrs.data(), nin, n);
  int wrong = 0;
  for (size_t i = 0; i < n && wrong < 3; ++i) {
    double acc = C::load(in[0][i]);
    for (int j = 1; j < nin; ++j) {
      const double x = C::load(in[j][i]);
      switch (roce::reduce::kernelOp(op)) {
        case ReduceOp::Sum: acc += x; break;  // exact: few bits, small magnitudes
        case ReduceOp::Product: acc *= x; break;
        case ReduceOp::Min: acc = std::min(acc, x); break;
        case ReduceOp::Max: acc = std::max(acc, x); break;
        default: REQUIRE(false);
      }
    }
    const S expect = C::round(acc);
    if (std::memcmp(&out[i], &expect, sizeof(S)) != 0) {
      INFO("element ", i, ": exact result ", acc);
      CHECK_EQ(C::load(out[i]), C::load(expect));
      ++wrong;
    }
  }
  for (size_t i = n; i < n + 4; ++i) CHECK_EQ(C::load(out[i]), -7.5);
}

template <class R>
void checkComplex(DataType t, ReduceOp op, int nin, size_t n, uint64_t seed) {
  INFO(roce::dataTypeName(t), " ", roce::reduceOpName(op), " nin=", nin, " n=", n);
  Rng rng{seed};
  // Small integer parts: every sum and product over five inputs is an exact integer.
  std::vector<std::vector<std::complex<R>>> in(nin, std::vector<std::complex<R>>(n));
  for (auto& v : in)
    for (auto& x : v) x = {static_cast<R>(rng.range(-3, 3)), static_cast<R>(rng.range(-3, 3))};
  std::vector<const void*> ptrs;
  for (auto& v : in) ptrs.push_back(v.data());
  std::vector<std::complex<R>> out(n);
  roce::reduce::reduceMany(t, op, out.data(), ptrs.data(), nin, n);
  for (size_t i = 0; i < n; ++i) {
    long long re = static_cast<long long>(in[0][i].real()), im = static_cast<long long>(in[0][i].imag());
    for (int j = 1; j < nin; ++j) {
      const long long c = static_cast<long long>(in[j][i].real()), d = static_cast<long long>(in[j][i].imag());
      if (roce::reduce::kernelOp(op) == ReduceOp::Sum) {
        re += c, im += d;
      } else {
        const long long r2 = re * c - im * d, i2 = re * d + im * c;
        re = r2, im = i2;
      }
    }
    if (!CHECK_EQ(out[i].real(), static_cast<R>(re)) || !CHECK_EQ(out[i].imag(), static_cast<R>(im))) {
      INFO("element ", i);
      break;
    }
  }
}

void checkBools(ReduceOp op, int nin, size_t n, uint64_t seed) {
  INFO("bool ", roce::reduceOpName(op), " nin=", nin, " n=", n);
  Rng rng{seed};
  std::vector<std::vector<uint8_t>> in(nin, std::vector<uint8_t>(n));  // bool's bytes: 0 or 1
  for (auto& v : in)
    for (auto& x : v) x = rng.next() % 3 != 0;
  std::vector<const void*> ptrs;
  for (auto& v : in) ptrs.push_back(v.data());
  std::vector<uint8_t> out(n);
  roce::reduce::reduceMany(DataType::Bool, op, out.data(), ptrs.data(), nin, n);
  for (size_t i = 0; i < n; ++i) {
    int ones = 0;
    for (int j = 0; j < nin; ++j) ones += in[j][i];
    // SUM is "any", PRODUCT "all" (torch's bool arithmetic), XOR the parity.
    bool expect = false;
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Max: case ReduceOp::BOr: expect = ones > 0; break;
      case ReduceOp::Product: case ReduceOp::Min: case ReduceOp::BAnd: expect = ones == nin; break;
      case ReduceOp::BXor: expect = ones % 2 == 1; break;
      default: REQUIRE(false);
    }
    if (!CHECK_EQ(static_cast<int>(out[i]), static_cast<int>(expect))) {
      INFO("element ", i);
      break;
    }
  }
}

void checkOne(DataType t, ReduceOp op, int nin, size_t n, uint64_t seed) {
  switch (t) {
    case DataType::Float32: return checkFloats<float>(t, op, nin, n, seed, 13);
    case DataType::Float64: return checkFloats<double>(t, op, nin, n, seed, 40);
    // Sums up to 2^13: past float16's 11 significant bits, so results round
    // (once: the inputs' eighths are kept by the float32 accumulator).
    case DataType::Float16: return checkFloats<Half16>(t, op, nin, n, seed, 11);
    case DataType::BFloat16: return checkFloats<Brain16>(t, op, nin, n, seed, 13);
    case DataType::Int8: return checkIntegers<int8_t>(t, op, nin, n, seed);
    case DataType::UInt8: return checkIntegers<uint8_t>(t, op, nin, n, seed);
    case DataType::Int16: return checkIntegers<int16_t>(t, op, nin, n, seed);
    case DataType::Int32: return checkIntegers<int32_t>(t, op, nin, n, seed);
    case DataType::Int64: return checkIntegers<int64_t>(t, op, nin, n, seed);
    case DataType::Bool: return checkBools(op, nin, n, seed);
    case DataType::Complex64: return checkComplex<float>(t, op, nin, n, seed);
    case DataType::Complex128: return checkComplex<double>(t, op, nin, n, seed);
  }
}

}  // namespace

TEST(reference_rounding_matches_known_bit_patterns) {
  // The test's own float16/bfloat16 rounding, against values from the formats' definitions.
  CHECK_EQ(halfBits(1.0), 0x3c00);
  CHECK_EQ(halfBits(-2.0), 0xc000);
  CHECK_EQ(halfBits(65504.0), 0x7bff);
  CHECK_EQ(halfBits(65520.0), 0x7c00);          // the midpoint to 2^16 rounds to even: inf
  CHECK_EQ(halfBits(std::ldexp(1.0, -24)), 0x0001);  // smallest subnormal
  CHECK_EQ(halfBits(std::ldexp(1.0, -25)), 0x0000);  // its half: ties to even (zero)
  CHECK_EQ(halfBits(1024.5), 0x6400);           // 1024: ties to even
  CHECK_EQ(halfBits(1025.5), 0x6402);           // 1026
  CHECK_EQ(bf16Bits(1.0), 0x3f80);
  CHECK_EQ(bf16Bits(257.0), 0x4380);            // 256: ties to even
  CHECK_EQ(bf16Bits(259.0), 0x4382);            // 260
  CHECK_EQ(halfValue(0x3555), 0.333251953125);
  CHECK_EQ(bf16Value(0xc049), -3.140625);
}

TEST(every_dtype_and_op_against_reference) {
  int cases = 0;
  for (DataType t : kAllTypes)
    for (ReduceOp op : kAllOps) {
      if (!defined(op, t)) continue;
      // nin 1 copies; sizes cross the kernels' 256-element blocks.
      for (int nin : {1, 2, 3, 5})
        for (size_t n : {size_t(1), size_t(255), size_t(1000)}) {
          checkOne(t, op, nin, n, 1000003u * static_cast<uint64_t>(t) + 7919u * static_cast<uint64_t>(op) + nin * 31 + n);
          ++cases;
        }
    }
  // 12 dtypes x 9 ops less the undefined pairs (bitwise on 4 float + 2
  // complex types, AVG/PREMUL_SUM on bool, MIN/MAX on complex): 108 - 18 - 2 - 4.
  CHECK_EQ(cases, (108 - 18 - 2 - 4) * 4 * 3);
}

TEST(half_types_accumulate_in_float32_and_round_once) {
  // 1024 + 0.5 + 0.25 = 1024.75 rounds to 1025 in float16; rounding after
  // each step would give 1024 (1024.5 ties to even, then 1024.25 to 1024).
  const uint16_t a[] = {halfBits(1024)}, b[] = {halfBits(0.5)}, c[] = {halfBits(0.25)};
  const void* ins[] = {a, b, c};
  uint16_t out[1] = {};
  roce::reduce::reduceMany(DataType::Float16, ReduceOp::Sum, out, ins, 3, 1);
  CHECK_EQ(halfValue(out[0]), 1025.0);
  // bfloat16: 256 + 0.75 + 0.75 = 257.5 -> 258; stepwise 256 + 0.75 -> 256 twice.
  const uint16_t x[] = {bf16Bits(256)}, y[] = {bf16Bits(0.75)};
  const void* bins[] = {x, y, y};
  roce::reduce::reduceMany(DataType::BFloat16, ReduceOp::Sum, out, bins, 3, 1);
  CHECK_EQ(bf16Value(out[0]), 258.0);
  // Ties round to even: 2048 + 1 lies between 2048 (even) and 2050; for
  // bfloat16, 256 + 1 between 256 (even) and 258.
  const uint16_t h2048[] = {halfBits(2048)}, h1[] = {halfBits(1)};
  const void* hties[] = {h2048, h1};
  roce::reduce::reduceMany(DataType::Float16, ReduceOp::Sum, out, hties, 2, 1);
  CHECK_EQ(halfValue(out[0]), 2048.0);
  const uint16_t b256[] = {bf16Bits(256)}, b1[] = {bf16Bits(1)}, b3[] = {bf16Bits(3)};
  const void* bties[] = {b256, b1};
  roce::reduce::reduceMany(DataType::BFloat16, ReduceOp::Sum, out, bties, 2, 1);
  CHECK_EQ(bf16Value(out[0]), 256.0);
  const void* bup[] = {b256, b3};  // 259: between 258 and 260 (even)
  roce::reduce::reduceMany(DataType::BFloat16, ReduceOp::Sum, out, bup, 2, 1);
  CHECK_EQ(bf16Value(out[0]), 260.0);
  // Overflow of the storage type: +inf, not a wrapped or clamped value.
  const uint16_t big[] = {halfBits(60000)};
  const void* two[] = {big, big};
  roce::reduce::reduceMany(DataType::Float16, ReduceOp::Sum, out, two, 2, 1);
  CHECK_EQ(out[0], 0x7c00);
}

TEST(integer_sum_and_product_wrap_like_tensor_arithmetic) {
  const int8_t a[] = {127, -128, 100}, b[] = {1, -1, 100};
  const void* ins[] = {a, b};
  int8_t out[3];
  roce::reduce::reduceMany(DataType::Int8, ReduceOp::Sum, out, ins, 2, 3);
  CHECK_EQ(out[0], -128);
  CHECK_EQ(out[1], 127);
  CHECK_EQ(out[2], -56);  // 200 - 256
  roce::reduce::reduceMany(DataType::Int8, ReduceOp::Product, out, ins, 2, 3);
  CHECK_EQ(out[0], 127);
  CHECK_EQ(out[1], -128);  // 128 wraps
  CHECK_EQ(out[2], 16);    // 10000 mod 256
  const uint8_t u[] = {255, 200}, v[] = {255, 100};
  const void* uins[] = {u, v};
  uint8_t uout[2];
  roce::reduce::reduceMany(DataType::UInt8, ReduceOp::Product, uout, uins, 2, 2);
  CHECK_EQ(uout[0], 1);    // 65025 mod 256
  CHECK_EQ(uout[1], 32);   // 20000 mod 256
  roce::reduce::reduceMany(DataType::UInt8, ReduceOp::Sum, uout, uins, 2, 2);
  CHECK_EQ(uout[0], 254);  // 510 mod 256
  CHECK_EQ(uout[1], 44);   // 300 mod 256
}

TEST(reduce_into_and_aliased_output) {
  int32_t acc[300], in[300], expect[300];
  for (int i = 0; i < 300; ++i) acc[i] = i * 3 - 400, in[i] = 1000 - i * 7, expect[i] = acc[i] + in[i];
  roce::reduce::reduceInto(DataType::Int32, ReduceOp::Sum, acc, in, 300);
  for (int i = 0; i < 300; ++i)
    if (!CHECK_EQ(acc[i], expect[i])) break;
  // out may alias ins[0]
  double a[3] = {1.5, -2, 8}, b[3] = {4, 4, -9};
  const void* ins[] = {a, b};
  roce::reduce::reduceMany(DataType::Float64, ReduceOp::Max, a, ins, 2, 3);
  CHECK_EQ(a[0], 4.0);
  CHECK_EQ(a[1], 4.0);
  CHECK_EQ(a[2], 8.0);
  // n == 0 touches nothing
  int64_t untouched[1] = {42};
  const void* one[] = {b};
  roce::reduce::reduceMany(DataType::Int64, ReduceOp::Sum, untouched, one, 1, 0);
  CHECK_EQ(untouched[0], 42);
}

TEST(scale_copy_for_premul_sum) {
  const int32_t i32[] = {7, -7, 100, 0};
  int32_t o32[4];
  roce::reduce::scaleCopy(DataType::Int32, o32, i32, 4, 0.5);
  CHECK_EQ(o32[0], 3);  // 3.5 truncated toward zero
  CHECK_EQ(o32[1], -3);
  CHECK_EQ(o32[2], 50);
  CHECK_EQ(o32[3], 0);
  const float f[] = {1.5f, -3.25f};
  float fo[2];
  roce::reduce::scaleCopy(DataType::Float32, fo, f, 2, -4.0);
  CHECK_EQ(fo[0], -6.0f);
  CHECK_EQ(fo[1], 13.0f);
  // float16 scales in float32, then rounds once: 1023 * 1.5 = 1534.5 -> 1534 (even).
  const uint16_t h[] = {halfBits(1023), halfBits(-0.125)};
  uint16_t ho[2];
  roce::reduce::scaleCopy(DataType::Float16, ho, h, 2, 1.5);
  CHECK_EQ(ho[0], halfBits(1534.5));
  CHECK_EQ(halfValue(ho[0]), 1534.0);
  CHECK_EQ(halfValue(ho[1]), -0.1875);
  const uint16_t bf[] = {bf16Bits(3)};
  uint16_t bfo[1];
  roce::reduce::scaleCopy(DataType::BFloat16, bfo, bf, 1, 0.25);
  CHECK_EQ(bf16Value(bfo[0]), 0.75);
  const std::complex<double> c[] = {{1, -2}};
  std::complex<double> co[1];
  roce::reduce::scaleCopy(DataType::Complex128, co, c, 1, 3.0);
  CHECK_EQ(co[0].real(), 3.0);
  CHECK_EQ(co[0].imag(), -6.0);
  const uint8_t u8[] = {3, 101};
  uint8_t uo[2];
  roce::reduce::scaleCopy(DataType::UInt8, uo, u8, 2, 2.5);
  CHECK_EQ(uo[0], 7);    // 7.5 truncated
  CHECK_EQ(uo[1], 252);  // 252.5 truncated
}

TEST(divide_by_for_avg) {
  const int64_t in[] = {7, -7, 9, -9, INT64_MIN, INT64_MAX};
  int64_t x[6];
  std::memcpy(x, in, sizeof(in));
  roce::reduce::divideBy(DataType::Int64, x, 6, 3);
  for (int i = 0; i < 6; ++i) {
    // Truncation toward zero, from |a| / d and the sign.
    const uint64_t mag = in[i] < 0 ? 0 - static_cast<uint64_t>(in[i]) : static_cast<uint64_t>(in[i]);
    const uint64_t q = mag / 3;
    const int64_t expect = in[i] < 0 ? -static_cast<int64_t>(q) : static_cast<int64_t>(q);
    CHECK_EQ(x[i], expect);
  }
  int8_t small[] = {-128, 127, -1};
  roce::reduce::divideBy(DataType::Int8, small, 3, 7);
  CHECK_EQ(small[0], -18);
  CHECK_EQ(small[1], 18);
  CHECK_EQ(small[2], 0);
  float f[] = {1.0f, -10.0f};
  roce::reduce::divideBy(DataType::Float32, f, 2, 3);
  CHECK_EQ(f[0], static_cast<float>(1.0 / 3));
  CHECK_EQ(f[1], static_cast<float>(-10.0 / 3));
  double d[] = {1.0};
  roce::reduce::divideBy(DataType::Float64, d, 1, 3);
  CHECK_EQ(d[0], static_cast<double>(1.0L / 3));
  uint16_t h[] = {halfBits(1000), halfBits(-0.5)};
  roce::reduce::divideBy(DataType::Float16, h, 2, 3);
  CHECK_EQ(h[0], halfBits(1000.0 / 3));
  CHECK_EQ(h[1], halfBits(-0.5 / 3));
  uint16_t b[] = {bf16Bits(100)};
  roce::reduce::divideBy(DataType::BFloat16, b, 1, 7);
  CHECK_EQ(b[0], bf16Bits(100.0 / 7));
  std::complex<float> c[] = {{3, -6}};
  roce::reduce::divideBy(DataType::Complex64, c, 1, 3);
  CHECK_EQ(c[0].real(), 1.0f);
  CHECK_EQ(c[0].imag(), -2.0f);
}

TEST(kernel_op_maps_avg_and_premul_sum_to_sum) {
  for (ReduceOp op : kAllOps) {
    INFO(roce::reduceOpName(op));
    const bool summed = op == ReduceOp::Avg || op == ReduceOp::PreMulSum;
    CHECK_EQ(roce::reduce::kernelOp(op), summed ? ReduceOp::Sum : op);
  }
}

TEST(undefined_pairs_are_refused_naming_op_and_dtype) {
  int refused = 0;
  for (DataType t : kAllTypes)
    for (ReduceOp op : kAllOps) {
      if (defined(op, t)) continue;
      INFO(roce::dataTypeName(t), " ", roce::reduceOpName(op));
      char buf[64] = {};
      const void* ins[] = {buf, buf};
      const std::string both = std::string("reduce op ") + roce::reduceOpName(op) + " is not defined for dtype " +
                               roce::dataTypeName(t);
      CHECK_ERROR(Invalid, roce::reduce::reduceMany(t, op, buf, ins, 2, 1), both.c_str());
      CHECK_ERROR(Invalid, roce::reduce::reduceInto(t, op, buf, buf, 1), both.c_str());
      CHECK_ERROR(Invalid, roce::checkSupported(op, t), both.c_str());
      ++refused;
    }
  CHECK_EQ(refused, 24);
  uint8_t b[1] = {1};
  CHECK_ERROR(Invalid, roce::reduce::scaleCopy(DataType::Bool, b, b, 1, 2.0), "PREMUL_SUM is not defined for bool");
  CHECK_ERROR(Invalid, roce::reduce::divideBy(DataType::Bool, b, 1, 2), "AVG is not defined for bool");
}
