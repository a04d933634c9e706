// A tiny header-only test harness for the torch-free core (csrc/ outside
// csrc/torch/): no external dependency, so CI builds the unit tests with g++
// alone (scripts/unit_tests.py). One test file makes one binary.
//
//   TEST(name) { ... }                    registers a test case
//   CHECK(cond)                           records a failure and goes on
//   CHECK_EQ(a, b)  CHECK_NE  CHECK_LT  CHECK_LE  CHECK_GT  CHECK_GE
//                                         ... printing both values
//   CHECK_THROWS(Type, expr, "text")      expr must throw Type (or a subclass)
//                                         whose what() contains "text"
//   REQUIRE(cond)  REQUIRE_EQ(a, b)       as CHECK, but end the test case:
//                                         for conditions later lines rely on
//   INFO(...)                             context printed with every failure
//                                         of the current scope (a loop's case)
//
// Every failure prints "file:line: " and the expression, with the values, so
// a failing CI log points at the line. The binary runs every test, or those
// whose names contain one of its arguments; --list prints the names. It exits
// 1 when a test failed (or threw), 2 when the arguments matched no test.
#pragma once
#include <cxxabi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace unit {

struct Case {
  const char* name;
  void (*fn)();
  const char* file;
  int line;
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

struct Register {
  Register(const char* name, void (*fn)(), const char* file, int line) { registry().push_back({name, fn, file, line}); }
};

// Failures of the running test case (the runner resets it per case).
inline int& failures() {
  static int n = 0;
  return n;
}

// Thrown by REQUIRE to end the running case; caught by the runner only.
struct Abort {};

// Context lines of the enclosing INFO scopes, innermost last.
inline std::vector<std::string>& context() {
  static std::vector<std::string> lines;
  return lines;
}

struct Scope {
  explicit Scope(std::string line) { context().push_back(std::move(line)); }
  ~Scope() { context().pop_back(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// A value as a failure message shows it: numbers as numbers (also int8_t and
// uint8_t, which streams would print as characters), enums by their value,
// strings quoted, pointers as addresses, anything else that streams as it
// streams, and the rest by its type's size.
template <class T>
std::string show(const T& v) {
  using U = std::decay_t<T>;
  std::ostringstream os;
  if constexpr (std::is_array_v<T>) {
    return show<const std::remove_extent_t<T>*>(v);  // a string literal: as its pointer
  } else if constexpr (std::is_same_v<U, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_same_v<U, char>) {
    os << '\'' << v << "' (" << static_cast<int>(v) << ")";
  } else if constexpr (std::is_same_v<U, signed char> || std::is_same_v<U, unsigned char>) {
    os << static_cast<int>(v);
  } else if constexpr (std::is_enum_v<U>) {
    os << "enum " << static_cast<long long>(static_cast<std::underlying_type_t<U>>(v));
  } else if constexpr (std::is_same_v<U, std::string> || std::is_same_v<U, const char*> ||
                       std::is_same_v<U, char*>) {
    if constexpr (!std::is_same_v<U, std::string>)
      if (!v) return "(null)";
    os << '"' << v << '"';
  } else if constexpr (std::is_floating_point_v<U>) {
    os.precision(17);
    os << v;
  } else if constexpr (requires(std::ostream& o, const U& x) { o << x; }) {
    os << v;
  } else {
    os << "<" << sizeof(U) << "-byte value>";
  }
  return os.str();
}

// A type's name as written in the source, for "threw X" messages.
inline std::string typeName(const std::type_info& t) {
  int status = 0;
  char* name = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : t.name();
  std::free(name);
  return out;
}

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::fprintf(stderr, "%s:%d: FAILED %s\n", file, line, what.c_str());
  for (const std::string& c : context()) std::fprintf(stderr, "    with %s\n", c.c_str());
}

// Comparisons in the harness, not in the macros, so each operand is
// evaluated once. Integers of mixed signedness compare by value
// (std::cmp_*), never by the converted bits; the cmp functions take no bool
// or character types, which compare as the language does.
template <class T>
constexpr bool kPlainInteger =
    std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char> && !std::is_same_v<T, wchar_t> &&
    !std::is_same_v<T, char8_t> && !std::is_same_v<T, char16_t> && !std::is_same_v<T, char32_t>;
template <class A, class B>
bool eq(const A& a, const B& b) {
  if constexpr (kPlainInteger<A> && kPlainInteger<B>)
    return std::cmp_equal(a, b);
  else
    return a == b;
}
template <class A, class B>
bool lt(const A& a, const B& b) {
  if constexpr (kPlainInteger<A> && kPlainInteger<B>)
    return std::cmp_less(a, b);
  else
    return a < b;
}

template <class A, class B>
bool compare(const char* file, int line, const char* op, const char* ea, const char* eb, bool ok, const A& a,
             const B& b) {
  if (!ok) fail(file, line, cat("CHECK(", ea, " ", op, " ", eb, "): ", ea, " = ", show(a), ", ", eb, " = ", show(b)));
  return ok;
}

inline int runAll(int argc, char** argv) {
  std::vector<std::string> filters;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) list = true;
    else filters.emplace_back(argv[i]);
  }
  auto selected = [&](const Case& c) {
    if (filters.empty()) return true;
    for (const std::string& f : filters)
      if (std::strstr(c.name, f.c_str())) return true;
    return false;
  };
  int ran = 0, failed = 0;
  for (const Case& c : registry()) {
    if (!selected(c)) continue;
    if (list) {
      std::printf("%s\n", c.name);
      ++ran;
      continue;
    }
    failures() = 0;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.fn();
    } catch (const Abort&) {
      // REQUIRE failed and said where.
    } catch (const std::exception& e) {
      fail(c.file, c.line, cat("test ", c.name, " threw ", typeName(typeid(e)), ": ", e.what()));
    } catch (...) {
      fail(c.file, c.line, cat("test ", c.name, " threw a non-std exception"));
    }
    context().clear();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++ran;
    if (failures()) ++failed;
    std::printf("%s %s (%.0f ms%s)\n", failures() ? "FAIL" : "ok  ", c.name, ms,
                failures() ? cat(", ", failures(), " failed check(s)").c_str() : "");
    std::fflush(stdout);
  }
  if (ran == 0) {
    std::fprintf(stderr, "no test matches the arguments given\n");
    return 2;
  }
  if (!list) std::printf("%d test(s), %d failed\n", ran, failed);
  return failed ? 1 : 0;
}

}  // namespace unit

#define UNIT_CAT2(a, b) a##b
#define UNIT_CAT(a, b) UNIT_CAT2(a, b)

#define TEST(name)                                                                               \
  static void unit_test_##name();                                                                \
  static const ::unit::Register unit_register_##name(#name, &unit_test_##name, __FILE__, __LINE__); \
  static void unit_test_##name()

#define CHECK(cond) \
  ((cond) ? true : (::unit::fail(__FILE__, __LINE__, "CHECK(" #cond ")"), false))

#define UNIT_CMP(op, fn, a, b)                                                          \
  [&](const auto& unit_a, const auto& unit_b) {                                         \
    return ::unit::compare(__FILE__, __LINE__, #op, #a, #b, fn, unit_a, unit_b);        \
  }((a), (b))

#define CHECK_EQ(a, b) UNIT_CMP(==, ::unit::eq(unit_a, unit_b), a, b)
#define CHECK_NE(a, b) UNIT_CMP(!=, !::unit::eq(unit_a, unit_b), a, b)
#define CHECK_LT(a, b) UNIT_CMP(<, ::unit::lt(unit_a, unit_b), a, b)
#define CHECK_LE(a, b) UNIT_CMP(<=, !::unit::lt(unit_b, unit_a), a, b)
#define CHECK_GT(a, b) UNIT_CMP(>, ::unit::lt(unit_b, unit_a), a, b)
#define CHECK_GE(a, b) UNIT_CMP(>=, !::unit::lt(unit_a, unit_b), a, b)

#define REQUIRE(cond) \
  do {                \
    if (!CHECK(cond)) throw ::unit::Abort{}; \
  } while (0)
#define REQUIRE_EQ(a, b) \
  do {                   \
    if (!CHECK_EQ(a, b)) throw ::unit::Abort{}; \
  } while (0)

#define CHECK_THROWS(Type, expr, text)                                                                        \
  do {                                                                                                        \
    try {                                                                                                     \
      (void)(expr);                                                                                           \
      ::unit::fail(__FILE__, __LINE__, "CHECK_THROWS(" #Type ", " #expr "): nothing was thrown");             \
    } catch (const Type& unit_e) {                                                                            \
      if (!std::strstr(unit_e.what(), (text)))                                                                \
        ::unit::fail(__FILE__, __LINE__,                                                                      \
                     ::unit::cat("CHECK_THROWS(" #Type ", " #expr "): the message does not contain \"", (text), \
                                 "\": ", unit_e.what()));                                                     \
    } catch (const ::unit::Abort&) {                                                                          \
      throw;                                                                                                  \
    } catch (const std::exception& unit_e) {                                                                  \
      ::unit::fail(__FILE__, __LINE__, ::unit::cat("CHECK_THROWS(" #Type ", " #expr "): threw ",              \
                                                   ::unit::typeName(typeid(unit_e)), " instead: ", unit_e.what()));      \
    } catch (...) {                                                                                           \
      ::unit::fail(__FILE__, __LINE__, "CHECK_THROWS(" #Type ", " #expr "): threw a non-std exception");      \
    }                                                                                                         \
  } while (0)

#define INFO(...) const ::unit::Scope UNIT_CAT(unit_scope_, __LINE__)(::unit::cat(__VA_ARGS__))

#ifndef UNIT_NO_MAIN
int main(int argc, char** argv) { return ::unit::runAll(argc, argv); }
#endif
