// The order of a window's one-sided writes and messages to one peer
// (csrc/window/window_order.hpp): writes overlap writes, messages follow
// messages (FIFO in the transport), and neither overtakes the other kind.
#include "roce_check.hpp"
#include "window/window_order.hpp"

using roce::window::WindowOrder;

TEST(writes_overlap_and_a_signal_waits_for_them_all) {
  WindowOrder o(2);
  const auto w1 = o.enter(1, true), w2 = o.enter(1, true), sig = o.enter(1, false);
  CHECK(o.mayGo(1, w1));
  CHECK(o.mayGo(1, w2));
  CHECK(!o.mayGo(1, sig));
  o.leave(1, w2);  // completion order need not be issue order
  CHECK(!o.mayGo(1, sig));
  o.leave(1, w1);
  CHECK(o.mayGo(1, sig));
}

TEST(a_write_after_a_get_waits_for_it_and_later_messages_do_not_wait_for_the_write) {
  WindowOrder o(3);
  const auto get = o.enter(2, false), put = o.enter(2, true), sig = o.enter(2, false);
  CHECK(o.mayGo(2, get));
  CHECK(!o.mayGo(2, put));
  CHECK(!o.mayGo(2, sig));  // behind the write, which is behind the get
  o.leave(2, get);
  CHECK(o.mayGo(2, put));
  CHECK(!o.mayGo(2, sig));
  o.leave(2, put);
  CHECK(o.mayGo(2, sig));
}

TEST(messages_follow_messages_without_waiting_and_peers_are_apart) {
  WindowOrder o(3);
  const auto a = o.enter(1, false), b = o.enter(1, false);
  const auto w = o.enter(2, true);
  CHECK(o.mayGo(1, a));
  CHECK(o.mayGo(1, b));
  CHECK(o.mayGo(2, w));  // another peer's messages do not hold it
}

TEST(a_task_that_left_unposted_holds_nothing_back) {
  WindowOrder o(2);
  const auto w = o.enter(1, true), sig = o.enter(1, false), w2 = o.enter(1, true);
  CHECK(!o.mayGo(1, w2));
  o.leave(1, sig);  // failed or dropped before it went
  CHECK(o.mayGo(1, w2));
  CHECK(o.mayGo(1, w));
}
