// Completion queues that grow with the connected peers. A CQ must hold every
// completion that can be outstanding - each posted receive and each signalled
// send of every queue pair on it - so its size follows the peers a rank
// talks to. Resizing (ibv_resize_cq) is not portable, so when the current CQ
// has no room for a new peer's queue pairs another one is created, on the
// same completion channel; progress polls them all, idle waits arm them all.
#pragma once
#include <infiniband/verbs.h>

#include <string>
#include <vector>

namespace roce {

class VerbsDevice;

class CqSet {
 public:
  explicit CqSet(VerbsDevice& dev);
  ~CqSet();
  CqSet(const CqSet&) = delete;
  CqSet& operator=(const CqSet&) = delete;

  // A CQ with room for `entries` more completions; its capacity is spoken for.
  ibv_cq* reserve(int entries);
  // The first asynchronous error the device recorded for one of these CQs.
  std::string errorOn(const VerbsDevice& dev) const;
  // Up to `max` completions from all CQs; negative if polling failed.
  int poll(ibv_wc* wcs, int max);

  // Blocking waits: the channel's descriptor (-1 without one), arming every
  // CQ for its next completion, and consuming the events once woken.
  int channelFd() const { return channel_ ? channel_->fd : -1; }
  bool arm();
  void consumeEvents();

 private:
  struct Cq {
    ibv_cq* cq;
    int capacity;
    int reserved;
    unsigned unacked;  // events received, acknowledged before the CQ is destroyed
  };
  VerbsDevice& dev_;
  ibv_comp_channel* channel_ = nullptr;
  std::vector<Cq> cqs_;
  size_t next_ = 0;  // where polling starts, round robin
};

}  // namespace roce
