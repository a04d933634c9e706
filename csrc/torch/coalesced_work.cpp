#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "coalesced_work.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <optional>

#include "../common/log.hpp"

namespace roce::adapter {
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
  std::optional<c10::Stream> stream;
  std::shared_ptr<c10::Event> end;
  try {
    const c10::Device device = ends.front()->device();
    c10::impl::VirtualGuardImpl impl(device.type());
    stream = impl.getStreamFromGlobalPool(device);
    for (const auto& e : ends) e->block(*stream);
    end = std::make_shared<c10::Event>(device.type());
    end->record(*stream);
  } catch (...) {
    all.complete(error ? error : std::current_exception());  // a device error: report it rather than hang a waiter
    return;
  }
  all.completeOnDevice(error, std::move(end), *stream);
}

}  // namespace

void CoalescingRegion::start(int rank) {
  std::vector<c10::intrusive_ptr<RoceWork>> stale;
  std::lock_guard<std::mutex> g(mu_);
  if (open_)
    ROCE_WARN("roce: rank ", rank, ": startCoalescing() while a region with ", works_.size(),
              " operations was still open (did the code inside batch_isend_irecv or _coalescing_manager raise?): "
              "those ran as issued and keep their own Works; a new region starts");
  stale.swap(works_);  // released after the lock
  open_ = true;
}

void CoalescingRegion::issued(const c10::intrusive_ptr<RoceWork>& work) {
  std::lock_guard<std::mutex> g(mu_);
  if (open_) works_.push_back(work);
}

c10::intrusive_ptr<RoceWork> CoalescingRegion::end(int rank) {
  std::vector<c10::intrusive_ptr<RoceWork>> works;
  {
    std::lock_guard<std::mutex> g(mu_);
    open_ = false;  // none open (as NCCL): nothing to return
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

}  // namespace roce::adapter
