// The process's shared-memory doorbell (doorbell.hpp): one Unix datagram
// socket for every group of the process (an extra local group costs no
// descriptor for it), read by the runtime thread, which wakes the group a
// datagram's key names. The socket is autobound to an abstract address
// (Linux: a NUL and 5 hex digits, unique in the network namespace, gone when
// the process closes it; ranks of one machine share a namespace: their
// lifelines use 127.0.0.1), opened when the first group enrols (a later group
// tries again if that failed) and kept for the process's life.
//
// Sends block at most kSendTimeout when the receiving process's queue is full
// (the kernel queues 10 datagrams per socket by default,
// net.unix.max_dgram_qlen, and one process's groups may all be asleep at
// once); a send that times out loses that wake-up, which the waiter's next
// slow check (200 ms) makes up for.
#pragma once
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "../../runtime/process_runtime.hpp"

namespace roce {
class Wakeup;
}
namespace roce::transport::shm {
using namespace roce::runtime;

struct ShmBellControl;

class ShmDoorbells : public RuntimeService {
 public:
  static constexpr std::chrono::milliseconds kSendTimeout{20};

  explicit ShmDoorbells(ProcessRuntime& rt) : rt_(rt) {}
  ~ShmDoorbells() override;

  // A new group's key (never reused in this process), with the process's
  // address written into `ctl`; 0 if the process has no doorbell socket.
  uint64_t enrol(ShmBellControl* ctl);
  // Datagrams with `key` wake `w` from now on (null: nobody). Once this
  // returns, the runtime thread no longer uses the previous one.
  void wakeThrough(uint64_t key, Wakeup* w);
  void leave(uint64_t key);
  // Sends `key` to a peer process's doorbell; 0 or the errno of the failure
  // (EAGAIN: its queue stayed full for kSendTimeout).
  int send(const sockaddr_un& to, socklen_t len, uint64_t key);
  size_t groups() const;

  Clock::time_point tick(Clock::time_point now) override { return now + std::chrono::hours(1); }
  void addPollFds(std::vector<pollfd>& fds) override;
  void polled(const pollfd* fds, size_t n) override;

 private:
  bool open();  // under mu_; true once the socket is open

  ProcessRuntime& rt_;
  mutable std::mutex mu_;            // wakeups_, and the socket's opening
  std::atomic<int> fd_{-1};          // opened once, closed with the process
  sockaddr_un addr_{};
  socklen_t addrLen_ = 0;
  std::unordered_map<uint64_t, Wakeup*> wakeups_;  // enrolled groups; null: not waking anyone yet
  uint64_t nextKey_ = 1;
};

}  // namespace roce::transport::shm
