// The one Work of the operations issued between startCoalescing() and
// endCoalescing() (batch_isend_irecv, _coalescing_manager with a device). roce
// runs each operation as it is issued (point-to-point requests are posted and
// polled, so a batch's sends and receives cannot deadlock each other); the
// batch's Work completes once every one of them has, fails with the first
// failure, and for device tensors orders the caller's stream after every
// operation's copies back.
#pragma once
#include <mutex>
#include <vector>

#include "work.hpp"

namespace roce::adapter {

// The operations of one coalescing region of a group. Thread-safe.
class CoalescingRegion {
 public:
  // A region still open (its end never came: an exception inside the batch)
  // is dropped with a warning; its operations ran as issued.
  void start(int rank);
  // Called for every Work the group hands out; kept while a region is open.
  void issued(const c10::intrusive_ptr<RoceWork>& work);
  // Closes the region: the batch's Work, or null for an empty one or none
  // open (as NCCL).
  c10::intrusive_ptr<RoceWork> end(int rank);
  bool isOpen() {
    std::lock_guard<std::mutex> g(mu_);
    return open_;
  }

 private:
  std::mutex mu_;
  bool open_ = false;
  std::vector<c10::intrusive_ptr<RoceWork>> works_;
};

// A Work that completes when all of `works` have (at least one).
c10::intrusive_ptr<RoceWork> coalescedWork(const std::vector<c10::intrusive_ptr<RoceWork>>& works, int rank);

}  // namespace roce::adapter
