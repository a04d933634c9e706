// The group's abort notice in the store ("rank 3: <why>"), read and written by a
// thread of its own.
//
// Why a thread: a store call blocks until the store answers or its timeout
// (the group timeout, often 10-30 minutes) expires. When the store's host is
// unreachable - a partition, this machine's port taken down, rank 0's machine
// gone - the progress thread must not sit in such a call: it would stop
// noticing the lifelines, the deadlines and the user's abort. This thread may
// block; the progress thread only reads what it last saw.
#pragma once
#include <memory>
#include <optional>
#include <string>

namespace roce {

class Bootstrap;

class AbortNotice {
 public:
  // `store` should be a connection of its own (Bootstrap::clone()).
  AbortNotice(std::unique_ptr<Bootstrap> store, std::string key);
  // Does not wait for a store call that is stuck: the thread is then left to
  // finish on its own (it owns everything it touches).
  ~AbortNotice();

  // The notice another rank published, once this thread has read it.
  std::optional<std::string> seen() const;
  // Publishes `msg` unless a notice exists already; returns at once.
  void publish(const std::string& msg);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace roce
