// One TCP listener for every process group of the process: a group opens
// no port of its own. The runtime thread
// (process_runtime.hpp) accepts connections, reads their first bytes
// (hello.hpp) under a deadline, so a client that never speaks delays nobody,
// and hands each to the mailbox its key names: a forming group's leader
// (joins), a group's rank (its data connections), the process links
// (process_links.hpp: every group's lifelines). The owner of a
// mailbox checks what it takes (the dialer's nonce against its roster); the
// desk only routes. Where no mailbox is open for the key:
//   * a key this process closed (a destroyed group's): closed at once, a data
//     dial answered Gone first, so the dialer fails that peer instead of
//     retrying;
//   * a join: closed at once. The leader opens its mailbox before it
//     publishes its record, so the joiner read a stale record and waits for
//     a newer one;
//   * a hello for a key never seen: kept (parked) until the mailbox opens,
//     the dialer hangs up, or kParkLimit passes. A subgroup formed from its
//     parent (no join: every member computes every key) may be dialed by a
//     member that got there first.
// The desk never reads past a connection's head, so it keeps a parked
// connection's later bytes (a data stream's) for the owner.
//
// The listener opens on first use and stays open for the process's life, so
// a refused connection still means the process is gone. It listens on the
// address the groups advertise and on 127.0.0.1, not on every interface.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../common/backoff.hpp"
#include "../common/config.hpp"
#include "hello.hpp"
#include "process_runtime.hpp"
#include "../common/unique_fd.hpp"

namespace roce::runtime {

class TcpListener;

// A connection the desk routed: who dialed, for what, and the socket.
struct Arrival {
  LinkKind kind;
  int src;               // the dialer's group rank
  int dst;               // the rank it asked for
  uint64_t srcNonce = 0; // hellos only
  UniqueFd fd;
  std::string head;      // bytes already read from it (a join's header)
};

// Where the desk leaves a key's connections. While a group forms, its
// descriptor (an eventfd) reads ready while something waits in it, so the
// setup's poll() loops can watch it beside their sockets. A formed group
// trades the descriptor for a wake-up call (useWaker): its wait loops block
// on their own wake-ups and look at pending() after announcing the sleep, so
// an extra group costs no descriptor for its mailbox.
class Mailbox {
 public:
  Mailbox();
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  int fd() const { return efd_.load(); }  // -1 once useWaker() closed it
  bool pending() const { return pending_.load(std::memory_order_seq_cst); }
  // Everything delivered so far; clears the descriptor's readiness and
  // pending() with it (under the lock deliveries take).
  std::vector<Arrival> takeAll();
  // Waits up to `ms` for a delivery (with or without the descriptor).
  void wait(int ms);
  // From now on a delivery calls `waker` (on the desk's thread, under this
  // mailbox's lock: it must only set flags and wake) instead of writing the
  // descriptor, which is closed; called at once if something is pending. An
  // empty function stops the calls: once it returns, none is in flight.
  void useWaker(std::function<void()> waker);
  void deliver(Arrival a);  // the desk

 private:
  std::atomic<int> efd_{-1};  // changed under mu_; read without it by fd()
  std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<Arrival> items_;
  std::atomic<bool> pending_{false};
  std::function<void()> waker_;
};

class FrontDesk : public RuntimeService {
 public:
  explicit FrontDesk(ProcessRuntime& runtime);
  ~FrontDesk() override;

  // Listens on `advertised` (the address this process's groups publish:
  // peers on other machines dial it) and on 127.0.0.1 (peers on this
  // machine dial that), not on every interface; returns the port, the same
  // on both. The first call picks the port; a later group advertising
  // another address is refused (peers know a process by its address).
  int listen(const std::string& advertised);
  // The listeners' port (0 before the first listen()).
  int port() const;
  // Connections that name `key` go to the returned mailbox until close(key).
  std::shared_ptr<Mailbox> open(uint64_t key);
  void close(uint64_t key);
  size_t openMailboxes() const;
  size_t parked() const;
  // Connections closed because their head's MAC did not match the job secret.
  uint64_t unauthenticated() const { return unauthenticated_.load(); }
  // Hellos of another protocol version (answered with this one's, then closed).
  uint64_t otherVersions() const { return otherVersions_.load(); }
  // Connections closed unread because too many heads were pending (from
  // their source address, or from all), and the heads pending now.
  uint64_t refusedBusy() const { return refusedBusy_.load(); }
  size_t pendingHeads() const { return pendingCount_.load(); }
  // Whether a mailbox was open for `key` once and closed since (its group
  // was destroyed here, or failed to form).
  bool wasClosed(uint64_t key) const;

  Clock::time_point tick(Clock::time_point now) override;
  void addPollFds(std::vector<pollfd>& fds) override;
  void polled(const pollfd* fds, size_t n) override;

 private:
  struct Pending;
  void acceptNew();
  bool acceptFrom(int listenerFd);  // false once out of descriptors (accepting pauses)
  bool readHead(Pending& p);  // true when done with it (routed or dropped)
  void refuseUnauthenticated(const Pending& p);  // its MAC did not match: counted, logged once
  // Removes the pending connections `done` says are done with, keeping the
  // per-source counts.
  template <class Done>
  void dropPending(Done done);
  void route(uint64_t key, Arrival a);

  ProcessRuntime& runtime_;
  const NetworkBudgets budgets_;
  // Listens on `address` at `port` (0: any) beside the listeners open:
  // null if the port is taken there (EADDRINUSE), throws on other failures.
  std::unique_ptr<TcpListener> listenOn(const std::string& address, int port);  // under mu_
  mutable std::mutex mu_;  // listeners_ and boxes_ (group threads open and close)
  std::vector<std::unique_ptr<TcpListener>> listeners_;
  std::unordered_map<uint64_t, std::shared_ptr<Mailbox>> boxes_;
  std::unordered_set<uint64_t> closed_;  // keys whose mailbox was open once
  struct Parked {
    uint64_t key;
    Arrival arrival;
    Clock::time_point since;
  };
  std::vector<Parked> parked_;
  std::atomic<uint64_t> unauthenticated_{0};
  std::atomic<uint64_t> otherVersions_{0};
  Clock::time_point nextParkCheck_{};  // the runtime thread's only
  std::vector<std::unique_ptr<Pending>> pending_;  // the runtime thread's only
  std::unordered_map<uint32_t, int> pendingBySource_;  // likewise: pending_ per source address
  Clock::time_point acceptPausedUntil_{};              // likewise (EMFILE)
  bool outOfDescriptorsLogged_ = false;                // likewise
  std::atomic<uint64_t> refusedBusy_{0};
  std::atomic<size_t> pendingCount_{0};
};

}  // namespace roce::runtime

namespace roce::runtime {

// A mailbox open for as long as this lives (a group's, for the group's life).
class MailboxLease {
 public:
  MailboxLease(FrontDesk& desk, uint64_t key) : desk_(desk), key_(key), box_(desk.open(key)) {}
  ~MailboxLease() { desk_.close(key_); }
  MailboxLease(const MailboxLease&) = delete;
  MailboxLease& operator=(const MailboxLease&) = delete;
  const std::shared_ptr<Mailbox>& box() const { return box_; }

 private:
  FrontDesk& desk_;
  uint64_t key_;
  std::shared_ptr<Mailbox> box_;
};

}  // namespace roce::runtime
