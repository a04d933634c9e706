// The harness itself (check.hpp, roce_check.hpp): a check that should fail
// does, and says where and what. Failures are provoked with stderr sent to a
// file, read back, and then taken off the running test's count.
//
// Built with -DUNIT_PLANT_FAILURE (tests/test_unit_cpp.py does), it also holds
// one test that really fails, to prove that a failing check fails the binary.
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "roce_check.hpp"

namespace {

struct Captured {
  std::string text;   // what the checks printed
  int failures = 0;   // failures they recorded
  bool aborted = false;  // a REQUIRE ended the block
};

template <class Fn>
Captured capture(Fn&& fn) {
  Captured out;
  std::fflush(stderr);
  FILE* tmp = std::tmpfile();
  if (!tmp) throw std::runtime_error("tmpfile() failed");
  const int saved = dup(2);
  dup2(fileno(tmp), 2);
  const int before = unit::failures();
  try {
    fn();
  } catch (const unit::Abort&) {
    out.aborted = true;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  out.failures = unit::failures() - before;
  unit::failures() = before;
  std::rewind(tmp);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), tmp)) > 0;) out.text.append(buf, n);
  std::fclose(tmp);
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

enum class Colour { Red = 3 };

}  // namespace

TEST(passing_checks_record_nothing) {
  const Captured c = capture([] {
    CHECK(1 + 1 == 2);
    CHECK_EQ(std::string("ab") + "c", "abc");
    CHECK_NE(1, 2);
    CHECK_LT(1, 2);
    CHECK_LE(2, 2);
    CHECK_GT(3u, 2);
    CHECK_GE(-1, -1);
    CHECK_THROWS(std::out_of_range, std::string("x").at(5), "");
    REQUIRE(true);
    REQUIRE_EQ(7, 7);
  });
  CHECK_EQ(c.failures, 0);
  CHECK_EQ(c.text, "");
  CHECK(!c.aborted);
}

TEST(failed_check_prints_file_line_expression_and_values) {
  int line = 0;
  const Captured c = capture([&] {
    line = __LINE__ + 1;
    CHECK_EQ(1 + 1, 3);
  });
  CHECK_EQ(c.failures, 1);
  CHECK(contains(c.text, "test_harness.cpp:" + std::to_string(line) + ": FAILED CHECK(1 + 1 == 3): 1 + 1 = 2, 3 = 3"));
  const Captured plain = capture([&] {
    line = __LINE__ + 1;
    CHECK(2 < 1);
  });
  CHECK_EQ(plain.failures, 1);
  CHECK(contains(plain.text, "test_harness.cpp:" + std::to_string(line) + ": FAILED CHECK(2 < 1)"));
}

TEST(values_print_readably) {
  CHECK_EQ(unit::show(static_cast<int8_t>(-5)), "-5");
  CHECK_EQ(unit::show(static_cast<uint8_t>(200)), "200");
  CHECK_EQ(unit::show(std::string("ab")), "\"ab\"");
  CHECK_EQ(unit::show(true), "true");
  CHECK_EQ(unit::show(Colour::Red), "enum 3");
  CHECK_EQ(unit::show(0.1), "0.10000000000000001");
  const Captured c = capture([] { CHECK_EQ(std::string("left"), std::string("right")); });
  CHECK(contains(c.text, "= \"left\", std::string(\"right\") = \"right\""));
}

TEST(integers_compare_by_value_across_signedness) {
  // -1 == 4294967295u holds after the usual conversions; by value it does not.
  const Captured c = capture([] {
    CHECK_EQ(-1, 4294967295u);
    CHECK_LT(4294967295u, -1);
  });
  CHECK_EQ(c.failures, 2);
  CHECK_LT(-1, 1u);
  CHECK_NE(-1, 4294967295u);
}

TEST(operands_are_evaluated_once) {
  int i = 0;
  CHECK_EQ(++i, 1);
  CHECK_EQ(i, 1);
  const Captured c = capture([&] { CHECK_EQ(++i, 5); });
  CHECK_EQ(i, 2);
  CHECK(contains(c.text, "++i = 2"));
}

TEST(check_throws_tells_each_way_it_can_fail) {
  const Captured none = capture([] { CHECK_THROWS(std::runtime_error, (void)0, "x"); });
  CHECK_EQ(none.failures, 1);
  CHECK(contains(none.text, "nothing was thrown"));
  const Captured text = capture([] { CHECK_THROWS(std::runtime_error, throw std::runtime_error("disk full"), "memory"); });
  CHECK_EQ(text.failures, 1);
  CHECK(contains(text.text, "does not contain \"memory\": disk full"));
  const Captured type = capture([] { CHECK_THROWS(std::invalid_argument, std::string("x").at(3), ""); });
  CHECK_EQ(type.failures, 1);
  CHECK(contains(type.text, "threw std::out_of_range instead"));
}

TEST(check_error_compares_kind_and_message) {
  CHECK_ERROR(Invalid, roce::throwInvalid("bad value"), "bad value");
  const Captured kind = capture([] { CHECK_ERROR(Invalid, roce::throwComm("peer gone"), "peer gone"); });
  CHECK_EQ(kind.failures, 1);
  CHECK(contains(kind.text, "threw a Comm error: roce: peer gone"));
  const Captured text = capture([] { CHECK_ERROR(Comm, roce::throwComm("peer gone"), "timeout"); });
  CHECK_EQ(text.failures, 1);
  CHECK(contains(text.text, "does not contain \"timeout\""));
  const Captured other = capture([] { CHECK_ERROR(Comm, throw std::logic_error("oops"), "oops"); });
  CHECK(contains(other.text, "threw std::logic_error instead: oops"));
}

TEST(require_ends_the_block) {
  bool after = false;
  const Captured c = capture([&] {
    REQUIRE_EQ(1, 2);
    after = true;
  });
  CHECK(c.aborted);
  CHECK(!after);
  CHECK_EQ(c.failures, 1);
}

TEST(info_adds_context_to_failures_in_its_scope) {
  const Captured c = capture([] {
    for (int k = 0; k < 3; ++k) {
      INFO("case k=", k);
      CHECK(k != 1);
    }
    CHECK(false);
  });
  CHECK_EQ(c.failures, 2);
  CHECK(contains(c.text, "    with case k=1\n"));
  CHECK(!contains(c.text, "k=0"));
  CHECK(!contains(c.text, "k=2"));
}

#ifdef UNIT_PLANT_FAILURE
TEST(planted_failure) {
  CHECK_EQ(2 + 2, 5);  // planted failure: tests/test_unit_cpp.py expects this line in the output
}
#endif
