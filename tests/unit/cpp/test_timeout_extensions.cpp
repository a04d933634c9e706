// torch's ephemeral timeout extensions (csrc/engine/timeout_extensions.hpp):
// what each operation adds to its timeout, and when an extension expires.
#include <chrono>
#include <stdexcept>

#include "engine/timeout_extensions.hpp"
#include "roce_check.hpp"

using roce::engine::TimeoutExtensions;
using ms = std::chrono::milliseconds;

TEST(nothing_added_nothing_extended) {
  TimeoutExtensions x;
  TimeoutExtensions::Claim c;
  CHECK_EQ(x.issue(c).count(), 0);
  c.release();
  CHECK_EQ(x.active().count(), 0);
}

TEST(an_extension_lasts_until_its_first_operation_completes) {
  TimeoutExtensions x;
  x.add(ms(5000));
  TimeoutExtensions::Claim first, second, third;
  CHECK_EQ(x.issue(first).count(), 5000);
  CHECK_EQ(x.issue(second).count(), 5000);  // issued before the first completed
  second.release();                         // not the owner: nothing expires
  CHECK_EQ(x.active().count(), 5000);
  first.release();
  CHECK_EQ(x.active().count(), 0);
  CHECK_EQ(x.issue(third).count(), 0);
}

TEST(extensions_accumulate_and_expire_each_with_its_own_first_operation) {
  TimeoutExtensions x;
  x.add(ms(1000));
  TimeoutExtensions::Claim a, b;
  CHECK_EQ(x.issue(a).count(), 1000);
  x.add(ms(300));
  x.add(ms(200));
  CHECK_EQ(x.issue(b).count(), 1500);  // b owns the two later ones
  a.release();
  CHECK_EQ(x.active().count(), 500);
  b.release();
  CHECK_EQ(x.active().count(), 0);
}

TEST(an_operation_that_never_ran_releases_on_destruction) {
  TimeoutExtensions x;
  x.add(ms(700));
  {
    TimeoutExtensions::Claim c;
    CHECK_EQ(x.issue(c).count(), 700);
  }
  CHECK_EQ(x.active().count(), 0);
}

TEST(release_is_idempotent_and_negative_extensions_are_refused) {
  TimeoutExtensions x;
  x.add(ms(100));
  TimeoutExtensions::Claim c;
  x.issue(c);
  c.release();
  c.release();
  CHECK_EQ(x.active().count(), 0);
  CHECK_THROWS(std::invalid_argument, x.add(ms(-1)), "must not be negative");
}
