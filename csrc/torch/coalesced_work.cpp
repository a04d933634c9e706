#include "coalesced_work.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

namespace roce {
namespace {

// What the batch has seen of its operations so far.
struct Batch {
  std::mutex mu;
  size_t remaining;
  std::exception_ptr firstError;
  std::vector<std::shared_ptr<c10::Event>> ends;  // device operations' copies back
};

// Completes `all` after every operation: on a stream that waited for each
// device operation's end event, so that its own end event follows them all.
void completeBatch(RoceWork& all, std::exception_ptr error, const std::vector<std::shared_ptr<c10::Event>>& ends) {
  if (ends.empty()) {
    all.complete(error);
    return;
  }
  const c10::Device device = ends.front()->device();
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStreamFromGlobalPool(device);
  for (const auto& e : ends) e->block(stream);
  auto end = std::make_shared<c10::Event>(device.type());
  end->record(stream);
  all.completeOnDevice(error, std::move(end), stream);
}

}  // namespace

void CoalescingRegion::start() {
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(!open_, "roce: startCoalescing() was called twice without endCoalescing() in between");
  open_ = true;
  works_.clear();
}

void CoalescingRegion::issued(const c10::intrusive_ptr<RoceWork>& work) {
  std::lock_guard<std::mutex> g(mu_);
  if (open_) works_.push_back(work);
}

c10::intrusive_ptr<RoceWork> CoalescingRegion::end(int rank) {
  std::vector<c10::intrusive_ptr<RoceWork>> works;
  {
    std::lock_guard<std::mutex> g(mu_);
    TORCH_CHECK(open_, "roce: endCoalescing() was called without startCoalescing()");
    open_ = false;
    works.swap(works_);
  }
  if (works.empty()) return {};
  return coalescedWork(works, rank);
}

c10::intrusive_ptr<RoceWork> coalescedWork(const std::vector<c10::intrusive_ptr<RoceWork>>& works, int rank) {
  std::vector<at::Tensor> outputs;
  for (const auto& w : works) outputs.insert(outputs.end(), w->outputs().begin(), w->outputs().end());
  auto all = c10::make_intrusive<RoceWork>(c10d::OpType::COALESCED, rank, "coalesced", std::move(outputs));
  auto batch = std::make_shared<Batch>();
  batch->remaining = works.size();
  for (const auto& w : works) {
    w->whenComplete([batch, all](std::exception_ptr error, std::shared_ptr<c10::Event> end) {
      std::exception_ptr firstError;
      std::vector<std::shared_ptr<c10::Event>> ends;
      {
        std::lock_guard<std::mutex> g(batch->mu);
        if (error && !batch->firstError) batch->firstError = error;
        if (end) batch->ends.push_back(std::move(end));
        if (--batch->remaining > 0) return;
        firstError = batch->firstError;
        ends.swap(batch->ends);
      }
      completeBatch(*all, firstError, ends);
    });
  }
  return all;
}

}  // namespace roce
