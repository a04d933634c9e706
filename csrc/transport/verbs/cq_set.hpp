// Completion queues that grow with the connected peers. A CQ must hold every
// completion that can be outstanding - each posted receive and each signalled
// send of every queue pair on it - so its size follows the peers a rank
// talks to. Resizing (ibv_resize_cq) is not portable, so when the current CQ
// has no room for a new peer's queue pairs another one is created; progress
// polls them all, idle waits arm them all. Their events arrive on the
// device's completion channel (one per port per process, verbs_device.hpp),
// whose reader calls notified(): the group's blocked wait wakes.
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace roce {
class Wakeup;
}
namespace roce::transport::verbs {

class VerbsDevice;

class CqSet {
 public:
  // `wake` (may be null: no blocking waits) is the group's wake-up.
  CqSet(VerbsDevice& dev, Wakeup* wake);
  ~CqSet();
  CqSet(const CqSet&) = delete;
  CqSet& operator=(const CqSet&) = delete;

  // A CQ with room for `entries` more completions; its capacity is spoken for.
  ibv_cq* reserve(int entries);
  // The first asynchronous error the device recorded for one of these CQs.
  std::string errorOn(const VerbsDevice& dev) const;
  // Up to `max` completions from all CQs; negative if polling failed.
  int poll(ibv_wc* wcs, int max);

  // Blocking waits: arms every CQ for its next completion, whose event wakes
  // the group; false if none can be armed (no completion channel). Call it
  // after the group's wake-up is announced.
  bool arm();
  // No wake-up of the group from here on (it is going away; the CQs are
  // destroyed later, by the reaper: reaper.hpp).
  void detachWake();

  // One CQ's notification state: its cq_context, so that the device's
  // reader (the runtime thread) finds it from an event.
  struct Notify {
    CqSet* owner;
    // Armed and its event not yet read. A CQ is re-armed only once the
    // reader has taken the event of its last arming: the providers advance
    // the CQ's arming sequence number when the event is read (mlx4/mlx5:
    // arm_sn), so an arming issued before that, on another thread, could
    // use a stale number and be ignored. An unread event wakes the group
    // anyway.
    std::atomic<bool> armed{false};
    // Called by the reader for an event of this CQ, already acknowledged.
    void fired();
  };

 private:
  struct Cq {
    ibv_cq* cq;
    int capacity;
    int reserved;
    std::unique_ptr<Notify> notify;  // its cq_context (a stable address)
  };
  VerbsDevice& dev_;
  Wakeup* wake_;
  std::vector<Cq> cqs_;
  size_t next_ = 0;  // where polling starts, round robin
};

}  // namespace roce::transport::verbs
