// c10d::Work for roce, and the engine Tasks that complete it.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <vector>

#include "../engine/engine.hpp"
#include "../transport/transport.hpp"
#include "tensor_staging.hpp"

namespace roce {

class RoceWork : public c10d::Work {
 public:
  RoceWork(c10d::OpType type, int rank, const char* title, std::vector<at::Tensor> outputs);

  // The future's value is the list of output tensors (what DDP's comm hooks read).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override;
  int sourceRank() const override;

  // Called once from the progress thread.
  void complete(std::exception_ptr error);
  void setSourceRank(int r) { sourceRank_ = r; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int rank_;
  std::string title_;
  std::atomic<int> sourceRank_{-1};
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
// Engine::runInline), then copies staged outputs back.
class CollectiveTask : public Task {
 public:
  using Body = std::function<void(Communicator&)>;
  CollectiveTask(c10::intrusive_ptr<RoceWork> work, OpLabel what, std::vector<Staged> outputs, Body body)
      : work_(std::move(work)), what_(what), outputs_(std::move(outputs)), body_(std::move(body)) {}
  bool start(Communicator& c) override;
  void complete(std::exception_ptr error) override;
  std::string describe() const override { return what_.text(); }

 private:
  c10::intrusive_ptr<RoceWork> work_;
  OpLabel what_;
  std::vector<Staged> outputs_;
  Body body_;
};

// send / recv / recv from any source: posts one request, then is polled.
class PointToPointTask : public Task {
 public:
  PointToPointTask(c10::intrusive_ptr<RoceWork> work, std::string what, Staged buffer, Request::Kind kind,
                   int peer, uint64_t tag);
  bool start(Communicator& c) override;
  bool poll(Communicator& c) override;
  void complete(std::exception_ptr error) override;
  std::string describe() const override { return what_; }

 private:
  c10::intrusive_ptr<RoceWork> work_;
  std::string what_;
  Staged buffer_;
  Request req_;
};

// Rethrows roce errors as c10::DistBackendError (torch.distributed.DistBackendError).
std::exception_ptr toTorchError(std::exception_ptr e);

}  // namespace roce
