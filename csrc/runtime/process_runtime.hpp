// The per-process runtime (issue 27): what every process group of a process
// shares instead of owning a copy. Today: one thread ("roce-runtime") that
// runs the process's front desk (one TCP listener for every group, see
// front_desk.hpp), its links to peer processes (one connection per peer
// process for every group's lifelines, process_links.hpp) and every group's
// lifelines (liveness/lifeline.hpp), flushes what the TCP transport's
// shared connections could not send at once (transport/tcp/tcp_mux.hpp), and
// forwards local peers' shared-memory doorbells to the groups they wake
// (transport/shm/shm_doorbells.hpp).
// The worker pool (common/worker_pool.hpp) and the verbs devices
// (transport/verbs/verbs_device.hpp) are per process too; they need no thread
// of this one.
//
// A service is anything that waits for descriptors and timers: each round the
// thread calls every attached service's tick() (its timed work; it answers
// when it wants the next round at the latest), collects the descriptors
// addPollFds() names, blocks in poll(), and hands each service its own
// entries back (polled()). Services never block: one slow service would
// delay every group's heartbeats.
//
// Created on first use and never destroyed (a thread joined from a static
// destructor at interpreter exit can deadlock). A forked child gets a runtime
// of its own the first time it asks for one: the parent's thread does not
// exist there.
#pragma once
#include <poll.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "../common/backoff.hpp"

namespace roce {

class FrontDesk;
class ProcessLinks;
class ShmDoorbells;
class TcpMux;

class RuntimeService {
 public:
  virtual ~RuntimeService() = default;
  // Timed work; returns the latest time the next round should call it.
  virtual Clock::time_point tick(Clock::time_point now) = 0;
  virtual void addPollFds(std::vector<pollfd>& fds) = 0;
  // The entries addPollFds() added this round, with their revents.
  virtual void polled(const pollfd* fds, size_t n) = 0;
};

class ProcessRuntime {
 public:
  static ProcessRuntime& get();

  FrontDesk& desk() { return *desk_; }
  ProcessLinks& links() { return *links_; }
  TcpMux& tcpMux() { return *tcpMux_; }
  ShmDoorbells& shmDoorbells() { return *shmDoorbells_; }
  // Runs `s` on the runtime thread from the next round on.
  void attach(RuntimeService* s);
  // Returns once the runtime thread no longer uses `s` (it may be running it).
  void detach(RuntimeService* s);
  // Starts a new round now (a service has something to send or to read).
  void poke();
  size_t services() const;

 private:
  ProcessRuntime();
  void loop();

  int pokeFd_ = -1;                     // eventfd
  std::unique_ptr<FrontDesk> desk_;
  std::unique_ptr<ProcessLinks> links_;  // after desk_: it opens a mailbox there
  std::unique_ptr<TcpMux> tcpMux_;      // the TCP transport's connections, one per peer process
  std::unique_ptr<ShmDoorbells> shmDoorbells_;  // every local group's shared-memory doorbell
  mutable std::mutex mu_;               // services_ and, held around every callback, their use
  struct Attached {
    RuntimeService* s;
    uint64_t id;  // a service detached and another attached at its address is not it
  };
  std::vector<Attached> services_;
  uint64_t nextId_ = 1;
};

}  // namespace roce
