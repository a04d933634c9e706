// The order of a window's one-sided writes and reads and its messages to one
// peer (csrc/window/window_order.hpp).
#include "roce_check.hpp"
#include "window/window_order.hpp"

using roce::window::WindowOrder;
using Kind = WindowOrder::Kind;

TEST(writes_to_different_bytes_overlap_and_a_signal_waits_for_them_all) {
  WindowOrder o(2);
  const auto w1 = o.enter(1, Kind::Write, 0, 8), w2 = o.enter(1, Kind::Write, 8, 8), sig = o.enter(1, Kind::Message);
  CHECK(o.mayGo(1, w1));
  CHECK(o.mayGo(1, w2));
  CHECK(!o.mayGo(1, sig));
  o.leave(1, w2);  // completion order need not be issue order
  CHECK(!o.mayGo(1, sig));
  o.leave(1, w1);
  CHECK(o.mayGo(1, sig));
}

TEST(writes_to_overlapping_bytes_go_in_issue_order) {
  WindowOrder o(2);
  const auto a = o.enter(1, Kind::Write, 0, 100), b = o.enter(1, Kind::Write, 99, 1), c = o.enter(1, Kind::Write, 100, 5);
  CHECK(o.mayGo(1, a));
  CHECK(!o.mayGo(1, b));
  CHECK(o.mayGo(1, c));  // touches byte 100 on: adjacent, not overlapping
  o.leave(1, a);
  CHECK(o.mayGo(1, b));
}

TEST(a_read_follows_earlier_writes_and_holds_back_later_writes_and_messages) {
  WindowOrder o(3);
  const auto w = o.enter(2, Kind::Write, 0, 8), r = o.enter(2, Kind::Read, 0, 8);
  const auto later = o.enter(2, Kind::Write, 64, 8), sig = o.enter(2, Kind::Message);
  CHECK(o.mayGo(2, w));
  CHECK(!o.mayGo(2, r));
  o.leave(2, w);
  CHECK(o.mayGo(2, r));
  CHECK(!o.mayGo(2, later));  // the get must not see it
  CHECK(!o.mayGo(2, sig));    // nor may the signal (or a close) overtake the read
  o.leave(2, r);
  CHECK(o.mayGo(2, later));
  CHECK(!o.mayGo(2, sig));
  o.leave(2, later);
  CHECK(o.mayGo(2, sig));
}

TEST(messages_and_reads_follow_each_other_without_waiting_and_peers_are_apart) {
  WindowOrder o(3);
  const auto a = o.enter(1, Kind::Message), r = o.enter(1, Kind::Read, 0, 8), b = o.enter(1, Kind::Message);
  CHECK(o.mayGo(1, a));
  CHECK(o.mayGo(1, r));
  CHECK(!o.mayGo(1, b));  // a message waits for the read before it
  const auto w = o.enter(2, Kind::Write, 0, 8);
  CHECK(o.mayGo(2, w));  // another peer's operations do not hold it
}

TEST(a_write_after_a_message_waits_and_one_that_left_unposted_holds_nothing_back) {
  WindowOrder o(2);
  const auto w = o.enter(1, Kind::Write, 0, 8), sig = o.enter(1, Kind::Message), w2 = o.enter(1, Kind::Write, 16, 8);
  CHECK(!o.mayGo(1, w2));
  o.leave(1, sig);  // failed or dropped before it went
  CHECK(o.mayGo(1, w2));
  CHECK(o.mayGo(1, w));
}
