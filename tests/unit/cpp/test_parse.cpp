// Strict parsing of numbers from other processes (csrc/common/parse.hpp):
// decimal digits only, no sign, no spaces, no overflow, inside [lo, hi];
// the output is written only on success.
#include <cstdint>
#include <string>

#include "common/parse.hpp"
#include "roce_check.hpp"

namespace {
// The value parsed, or 12345 (the output's value before) on refusal.
uint64_t parsed(const std::string& s, uint64_t lo = 0, uint64_t hi = UINT64_MAX) {
  uint64_t out = 12345;
  const bool ok = roce::parseU64(s, lo, hi, out);
  if (!ok) CHECK_EQ(out, 12345u);  // untouched
  return out;
}
bool accepts(const std::string& s, uint64_t lo = 0, uint64_t hi = UINT64_MAX) {
  uint64_t out = 0;
  return roce::parseU64(s, lo, hi, out);
}
}  // namespace

TEST(plain_decimals) {
  CHECK_EQ(parsed("0"), 0u);
  CHECK_EQ(parsed("7"), 7u);
  CHECK_EQ(parsed("007"), 7u);
  CHECK_EQ(parsed("65535", 0, 65535), 65535u);
  CHECK_EQ(parsed("18446744073709551615"), UINT64_MAX);
  CHECK_EQ(parsed("00000000000000000001"), 1u);  // 20 characters
}

TEST(refuses_what_stoi_would_take) {
  for (const char* bad : {"", " 1", "1 ", "+1", "-1", "12abc", "0x10", "1e3", "1.0", "\n5", "５"}) {
    INFO("'", bad, "'");
    CHECK(!accepts(bad));
    parsed(bad);
  }
}

TEST(refuses_overflow_and_overlong_text) {
  CHECK(!accepts("18446744073709551616"));  // UINT64_MAX + 1
  CHECK(!accepts("99999999999999999999"));
  CHECK(!accepts("000000000000000000001"));  // 21 characters, even though the value is small
  CHECK_EQ(parsed("18446744073709551616"), 12345u);
}

TEST(range_bounds_are_inclusive) {
  CHECK(accepts("1", 1, 10));
  CHECK(accepts("10", 1, 10));
  CHECK(!accepts("0", 1, 10));
  CHECK(!accepts("11", 1, 10));
  CHECK_EQ(parsed("11", 1, 10), 12345u);
}
