// The stream queue: one worker thread per stream runs its tasks in order.

#include "testdev.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <iostream>
#include <thread>
#include <utility>

namespace testdev {

uint64_t Queue::enqueue(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_ != nullptr) {
    // A graph node: nothing runs until a replay, which is not modelled.
    ++capture_->tasks_recorded;
    return enqueued_;
  }
  if (!worker_started_) {
    // Detached: queues are never destroyed, their workers live until exit.
    std::thread([this] { run(); }).detach();
    worker_started_ = true;
  }
  tasks_.push_back(std::move(task));
  work_added_.notify_one();
  return ++enqueued_;
}

void Queue::enqueue_wait(Queue& other, uint64_t ticket) {
  // Our own earlier work is ordered before anything we queue now anyway.
  if (&other == this || other.reached(ticket)) {
    return;
  }
  enqueue([&other, ticket] { other.wait(ticket); });
}

std::shared_ptr<Capture> Queue::capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  return capture_;
}

void Queue::set_capture(std::shared_ptr<Capture> capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_ = std::move(capture);
}

void Queue::refuse_if_capturing(const char* what) {
  const std::shared_ptr<Capture> capture = this->capture();
  if (capture == nullptr) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(capture->mutex);
    capture->invalidated = std::string(what) + " on " + describe(stream_);
  }
  TORCH_CHECK(
      false,
      "testdev: operation not permitted when stream is capturing (",
      what,
      " on ",
      describe(stream_),
      "); the capture is invalidated");
}

uint64_t Queue::last_ticket() {
  std::lock_guard<std::mutex> lock(mutex_);
  return enqueued_;
}

bool Queue::reached(uint64_t ticket) const {
  return completed_.load(std::memory_order_acquire) >= ticket;
}

void Queue::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return reached(ticket); });
}

void Queue::synchronize() {
  refuse_if_capturing("synchronize");
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = enqueued_;
  work_done_.wait(lock, [&] { return reached(target); });
  const std::string error = std::exchange(error_, {});
  lock.unlock();
  TORCH_CHECK(
      error.empty(),
      "testdev: a task on ",
      describe(stream_),
      " failed: ",
      error);
}

void Queue::run() {
  // Tasks compute on CPU aliases of device memory; autograd was already
  // handled by the thread that queued them.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_added_.wait(lock, [&] { return !tasks_.empty(); });
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    std::string error;
    try {
      task();
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      error = e.what();
    }
    // Release what the task captured (a destination CPU tensor, a pinned
    // buffer) before the task counts as done, so that after a synchronize
    // the allocators' counters are final.
    task = nullptr;
    lock.lock();
    if (!error.empty()) {
      // Printed at once too: a test may never synchronize this stream.
      std::cerr << "testdev: a task on " << describe(stream_)
                << " failed: " << error << std::endl;
      if (error_.empty()) {
        error_ = error;
      }
    }
    completed_.fetch_add(1, std::memory_order_release);
    work_done_.notify_all();
  }
}

} // namespace testdev
