// The per-process runtime: what every process group of a process shares
// instead of owning a copy. One thread ("roce-runtime") runs the process's
// front desk (one TCP listener for every group, front_desk.hpp), its links to
// peer processes (one connection per peer process for every group's
// lifelines, process_links.hpp), every group's lifelines
// (liveness/lifeline.hpp), and the process-wide services of the layers above
// it, which the runtime knows only as RuntimeServices made on first use
// (service<S>()): the TCP transport's shared connections
// (transport/tcp/tcp_mux.hpp) and the shared-memory doorbells
// (transport/shm/shm_doorbells.hpp). The runtime sits below the transports
// and never includes them.
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
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "../common/backoff.hpp"

namespace roce::runtime {

class FrontDesk;
class ProcessLinks;

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
  // The process's one S, a service of a layer above (constructed from this
  // runtime), made and attached on first use and, like the runtime, never
  // destroyed.
  template <class S>
  S& service() {
    static_assert(std::is_base_of_v<RuntimeService, S>);
    RuntimeService* made = nullptr;
    RuntimeService* s;
    {
      std::lock_guard<std::mutex> g(ownedMu_);
      auto& slot = owned_[std::type_index(typeid(S))];
      if (!slot) {
        slot = std::make_unique<S>(*this);
        made = slot.get();
      }
      s = slot.get();
    }
    // Outside ownedMu_: attach() takes mu_, which is held around the
    // services' callbacks, and those may ask for a service.
    if (made != nullptr) attach(made);
    return static_cast<S&>(*s);
  }
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
  std::mutex ownedMu_;                  // owned_
  std::map<std::type_index, std::unique_ptr<RuntimeService>> owned_;  // service<S>()'s, by type
  mutable std::mutex mu_;               // services_ and, held around every callback, their use
  struct Attached {
    RuntimeService* s;
    uint64_t id;  // a service detached and another attached at its address is not it
  };
  std::vector<Attached> services_;
  uint64_t nextId_ = 1;
};

}  // namespace roce::runtime
