// The owner's side of a window for the peers it serves over the network
// (ranks on other machines; on this machine peers write into the window's
// shared memory themselves). A task on the group's progress engine that
// keeps one head receive posted per served peer: a put's bytes are received
// into the window, a get's bytes are sent back from it, a signal bumps the
// peer's count in the board, a close (every rank sends one when the window
// is deregistered) ends that peer's service. Puts and gets of peers whose
// transport writes and reads this window by RDMA never reach it. It runs
// until every served peer closed, or the group fails.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "../engine/engine.hpp"
#include "../transport/transport.hpp"
#include "window_board.hpp"
#include "window_order.hpp"
#include "window_wire.hpp"

namespace roce::window {
using namespace roce::engine;
using namespace roce::transport;

class WindowService : public Task {
 public:
  // `keep` holds the memory behind `board` for as long as the task lives;
  // `exposure` (may be null) keeps the window open to the served peers'
  // one-sided writes and reads until the service ends.
  WindowService(std::shared_ptr<void> keep, WindowBoard* board, uint64_t id, std::vector<int> peers,
                std::string what, std::unique_ptr<ExposedMemory> exposure = nullptr);
  bool start(Communicator& c) override;
  bool poll(Communicator& c) override;
  void complete(std::exception_ptr error) override;
  std::string describe() const override { return what_; }
  // Called once with the task's outcome (null: every peer closed) and the
  // exposure, which nobody reaches any more: the callee decides where it
  // is released (unpinning a large window takes a while).
  std::function<void(std::exception_ptr, std::unique_ptr<ExposedMemory>)> onEnd;

 private:
  struct Peer {
    int rank = -1;
    WindowOp op;      // the head being received
    Request head, data;
    bool inData = false;  // `data` (a put's bytes in, a get's out) is in flight
    bool closed = false;
  };
  void postHead(Communicator& c, Peer& p);
  // A put's bytes into the window (Recv) or a get's out of it (Send), after
  // checking p's head against the window; `verb` names it in the error.
  void moveBytes(Communicator& c, Peer& p, Request::Kind kind, uint64_t tag, const char* verb);
  // Handles p's finished head (or put bytes); false once p closed.
  void advance(Communicator& c, Peer& p);

  std::shared_ptr<void> keep_;
  std::unique_ptr<ExposedMemory> exposure_;  // declared after keep_: goes first
  WindowBoard* board_;
  uint64_t id_;
  std::vector<Peer> peers_;
  std::string what_;
};

// A put's head and bytes, or a signal's or close's head, to one served peer;
// done when the transport is done with the bytes (the source may be reused).
// A get's head, with the receive of its bytes into `buf`: done when they
// arrived. To a peer that exposed its window, a put or get is instead one
// one-sided write or read (no head, nothing for the peer's service).
class WindowSendTask : public Task {
 public:
  // `keep` holds `buf` (a put's source, a get's destination) until the task
  // ends. `remote`: the peer exposed its window (op.offset is then where in
  // that memory), so a put or get with bytes is a one-sided write or read
  // there (`source` lets the transport register buf), and a signal writes
  // `signalCount` (this rank's signals to the peer so far) into this rank's
  // count there; all in the order WindowOrder keeps.
  WindowSendTask(std::shared_ptr<void> keep, uint64_t id, int peer, WindowOp op, void* buf, std::string what,
                 std::shared_ptr<WindowOrder> order, const RemoteMemory* remote = nullptr, BufferOwner source = {},
                 uint32_t signalCount = 0);
  ~WindowSendTask() override;
  bool start(Communicator& c) override;
  bool poll(Communicator& c) override;
  void complete(std::exception_ptr error) override;
  std::string describe() const override { return what_; }
  std::function<void(std::exception_ptr)> onEnd;

 private:
  void post(Communicator& c);
  void leave();

  std::shared_ptr<void> keep_;
  WindowOp op_;
  Request head_, data_;
  std::string what_;
  std::shared_ptr<WindowOrder> order_;
  RemoteMemory remote_;
  bool write_ = false;   // data_ is a one-sided write (a one-sided read has no head either: head_.done)
  bool signal_ = false;  // that write is a signal's count
  uint32_t signalCount_ = 0;
  bool posted_ = false;
  bool entered_ = false;
  uint64_t ticket_ = 0;
};

}  // namespace roce::window
