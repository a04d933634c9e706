// c10d::Work for roce, and the engine Tasks that complete it.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <cstdint>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "../engine/engine.hpp"
#include "../transport/transport.hpp"
#include "completion_hooks.hpp"
#include "tensor_staging.hpp"

namespace roce::adapter {
using namespace roce::engine;
using namespace roce::transport;

class RoceWork : public c10d::Work {
 public:
  RoceWork(c10d::OpType type, int rank, const char* title, std::vector<at::Tensor> outputs);

  // The future's value is the list of output tensors (what DDP's comm hooks
  // read). For device tensors it is created with their device, so wait() and
  // then() on it order the caller's streams after the copies back.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  // Blocks until the host part is done (the network part runs on the CPU);
  // for device tensors it then makes the caller's current stream wait for the
  // copies back (synchronize()), without waiting for the device itself.
  bool wait(std::chrono::milliseconds timeout) override;
  // Device tensors: the caller's current stream waits for the copies back.
  void synchronize() override;
  // The host part is done and, for device tensors, so are the copies back.
  bool isCompleted() override;
  int sourceRank() const override;
  // Milliseconds from the start of the operation to its end (host clock);
  // throws before it ended.
  float getDuration() const override;
#ifdef ROCE_TORCH_COMPLETION_HOOKS
  // The group's operation number: never reused within the group, unlike the
  // Work's address, which torch's default key is.
  uint64_t getCompletionKey() const override { return seq_; }
#endif

  // Before the Work is handed out: its operation number, and the hooks its
  // successful completion fires (owned by the backend, which outlives every
  // completion: its engine completes or fails all work before it goes).
  void identify(uint64_t seq, const CompletionHooks* hooks) {
    seq_ = seq;
    hooks_ = hooks;
  }
  // When the engine ran it (TraceRing::nowNs), before complete().
  void setTimes(int64_t startNs, int64_t endNs) {
    startNs_ = startNs;
    endNs_ = endNs;
  }

  // Called once from the progress thread.
  void complete(std::exception_ptr error);
  // The same for device tensors: `end` follows the last copy back, which runs
  // on `results`; the future completes with that stream current, so that the
  // events it records for its waiters and callbacks follow the copies.
  void completeOnDevice(std::exception_ptr error, std::shared_ptr<c10::Event> end, c10::Stream results);
  void setSourceRank(int r) { sourceRank_ = r; }

  // Runs `done` once this Work has completed, on the completing thread, or at
  // once on this one if it has: with its error (null on success) and, for
  // device tensors, the event that follows its copies back.
  using Done = std::function<void(std::exception_ptr, std::shared_ptr<c10::Event>)>;
  void whenComplete(Done done);

 private:
  std::shared_ptr<c10::Event> endEvent() const;
  std::optional<float> durationMs() const;

  std::vector<at::Tensor> outputs_;
  // Set before the Work completes; its own mutex, because c10d::Work::wait
  // calls synchronize() holding mutex_.
  mutable std::mutex endMu_;
  std::shared_ptr<c10::Event> end_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int rank_;
  std::string title_;
  std::atomic<int> sourceRank_{-1};
  uint64_t seq_ = 0;
  const CompletionHooks* hooks_ = nullptr;
  std::atomic<int64_t> startNs_{0}, endNs_{0};  // written by the engine, read by getDuration() anywhere
  std::mutex doneMu_;
  bool done_ = false;  // complete() ran: whenComplete() calls at once
  std::exception_ptr doneError_;
  std::vector<Done> whenDone_;
};

// Names an operation ("allreduce #12 (8 bytes)"); formatted only on demand,
// so issuing an operation formats no string.
struct OpLabel {
  const char* title;  // a string literal
  uint64_t seq;
  size_t bytes;
  std::string text() const;
};

// A collective: runs `body` on the progress thread (or inline on the caller's,
// Engine::runInline), then copies staged outputs back. body(c, first, count)
// works on elements [first, first + count) of the call's buffers: once on all
// `elems` of them, or for element-wise collectives on device tensors once per
// piece as the pieces arrive in host memory (DeviceStaging), each piece a
// collective of its own.
class CollectiveTask : public Task {
 public:
  using Body = std::function<void(Communicator&, size_t first, size_t count)>;
  CollectiveTask(c10::intrusive_ptr<RoceWork> work, OpLabel what, CallStaging staging, size_t elems, Body body)
      : work_(std::move(work)), what_(what), staging_(std::move(staging)), elems_(elems), body_(std::move(body)) {}
  bool start(Communicator& c) override;
  void complete(std::exception_ptr error) override;
  std::string describe() const override { return what_.text(); }

 private:
  c10::intrusive_ptr<RoceWork> work_;
  OpLabel what_;
  CallStaging staging_;
  size_t elems_;
  Body body_;
};

// send / recv / recv from any source: posts one request, then is polled. A
// send from a device tensor posts once its copy to the host is done; a
// receive into one queues its copy back when the data is in.
class PointToPointTask : public Task {
 public:
  PointToPointTask(c10::intrusive_ptr<RoceWork> work, std::string what, CallStaging staging, at::Tensor host,
                   Request::Kind kind, int peer, uint64_t tag);
  bool start(Communicator& c) override;
  bool poll(Communicator& c) override;
  void complete(std::exception_ptr error) override;
  std::string describe() const override { return what_; }

 private:
  c10::intrusive_ptr<RoceWork> work_;
  std::string what_;
  CallStaging staging_;
  at::Tensor host_;
  Request req_;
};

// The allocation `t` lives in, for zero-copy transports (work.cpp says how
// host and device memory are held); empty for a tensor without storage.
BufferOwner storageOwner(const at::Tensor& t);

// Completes `work` for `task` (its times included) whose tensors were staged by `staging`.
void completeWork(RoceWork& work, Task& task, CallStaging& staging, std::exception_ptr error);

// Rethrows roce errors as c10::DistBackendError (torch.distributed.DistBackendError).
std::exception_ptr toTorchError(std::exception_ptr e);

}  // namespace roce::adapter
