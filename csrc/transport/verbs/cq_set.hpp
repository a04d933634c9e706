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

#include <string>
#include <vector>

namespace roce {

class VerbsDevice;
class Wakeup;

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
  // the group; false if none can be armed (no completion channel).
  bool arm();
  // Called by the device's reader for an event of one of these CQs (already
  // acknowledged), on the runtime thread.
  void notified();

 private:
  struct Cq {
    ibv_cq* cq;
    int capacity;
    int reserved;
  };
  VerbsDevice& dev_;
  Wakeup* wake_;
  std::vector<Cq> cqs_;
  size_t next_ = 0;  // where polling starts, round robin
};

}  // namespace roce
