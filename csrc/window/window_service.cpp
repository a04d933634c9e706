#include "window_service.hpp"

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"

namespace roce::window {
using namespace roce::comm;

namespace {

// Served tasks have no deadline of their own: they wait for peers' puts for
// as long as the window exists, and the group's liveness fails them when a
// peer dies.
constexpr auto kForever = std::chrono::hours(24 * 365 * 100);

void prepare(Request& r, Request::Kind kind, int peer, uint64_t tag, void* buf, size_t len) {
  r = Request{};
  r.kind = kind;
  r.peer = peer;
  r.tag = tag;
  r.buf = buf;
  r.len = len;
}

}  // namespace

WindowService::WindowService(std::shared_ptr<void> keep, WindowBoard* board, uint64_t id, std::vector<int> peers,
                             std::string what, std::unique_ptr<ExposedMemory> exposure)
    : keep_(std::move(keep)), exposure_(std::move(exposure)), board_(board), id_(id), what_(std::move(what)) {
  timeout = kForever;
  serves = true;
  peers_.resize(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) peers_[i].rank = peers[i];
}

void WindowService::postHead(Communicator& c, Peer& p) {
  p.inData = false;
  prepare(p.head, Request::Kind::Recv, p.rank, windowHeadTag(id_), &p.op, sizeof(p.op));
  c.post(p.head);
}

bool WindowService::start(Communicator& c) {
  for (auto& p : peers_) postHead(c, p);
  return poll(c);
}

void WindowService::moveBytes(Communicator& c, Peer& p, Request::Kind kind, uint64_t tag, const char* verb) {
  // The sender checked the bounds against what this rank published; a head
  // beyond them is corrupt, and following it would reach memory that is not
  // the window's.
  const uint64_t size = board_->windowBytes;
  if (p.op.offset > size || p.op.bytes > size - p.op.offset)
    throwComm(str(what_, ": rank ", p.rank, " ", verb, " ", p.op.bytes, " bytes at byte ", p.op.offset,
                  ", beyond this rank's ", size, "-byte window (a corrupted message)"));
  if (p.op.bytes == 0) {
    postHead(c, p);
    return;
  }
  p.inData = true;
  prepare(p.data, kind, p.rank, tag, board_->window() + p.op.offset, p.op.bytes);
  c.post(p.data);
}

void WindowService::advance(Communicator& c, Peer& p) {
  if (p.inData) {
    if (p.data.failed()) throwComm(str(what_, ": a put or get of rank ", p.rank, " failed: ", p.data.error));
    postHead(c, p);
    return;
  }
  if (p.head.failed()) throwComm(str(what_, ": rank ", p.rank, " is no longer reachable: ", p.head.error));
  switch (static_cast<WindowOpKind>(p.op.kind)) {
    case WindowOpKind::Put:
      Counters::add(c.counters().windowPutsServed, 1);
      moveBytes(c, p, Request::Kind::Recv, windowDataTag(id_), "put");
      return;
    case WindowOpKind::Get:
      moveBytes(c, p, Request::Kind::Send, windowReplyTag(id_), "asked for");
      return;
    case WindowOpKind::Signal:
      Counters::add(c.counters().windowSignalsServed, 1);
      board_->signalFrom(p.rank);
      postHead(c, p);
      return;
    case WindowOpKind::Close:
      p.closed = true;
      return;
  }
  throwComm(str(what_, ": rank ", p.rank, " sent an unknown window operation ", p.op.kind, " (a corrupted message)"));
}

bool WindowService::poll(Communicator& c) {
  bool open = false;
  for (auto& p : peers_) {
    while (!p.closed && (p.inData ? p.data.done : p.head.done)) advance(c, p);
    open = open || !p.closed;
  }
  return !open;
}

void WindowService::complete(std::exception_ptr error) {
  // Every served peer closed (after its writes and reads completed), or the
  // group failed: nobody reaches the window by RDMA any more.
  if (onEnd) onEnd(error, std::move(exposure_));
  exposure_.reset();
}

WindowSendTask::WindowSendTask(std::shared_ptr<void> keep, uint64_t id, int peer, WindowOp op, void* buf,
                               std::string what, std::shared_ptr<WindowOrder> order, const RemoteMemory* remote,
                               BufferOwner source, uint32_t signalCount)
    : keep_(std::move(keep)), op_(op), what_(std::move(what)), order_(std::move(order)), signalCount_(signalCount) {
  const auto kind = static_cast<WindowOpKind>(op.kind);
  const bool exposed = remote && remote->exposed();
  signal_ = exposed && kind == WindowOpKind::Signal;
  const bool oneSided = signal_ || (exposed && (kind == WindowOpKind::Put || kind == WindowOpKind::Get) && op.bytes > 0);
  write_ = oneSided && kind != WindowOpKind::Get;
  if (oneSided) {
    remote_ = *remote;
    if (signal_) {
      buf = &signalCount_;
      op_.bytes = sizeof(signalCount_);
    }
    prepare(data_, write_ ? Request::Kind::Write : Request::Kind::Read, peer, 0, buf, op_.bytes);
    data_.remote = &remote_;
    data_.remoteOffset = op.offset;
    data_.owner = std::move(source);
    head_.peer = peer;
    head_.done = true;
    return;
  }
  prepare(head_, Request::Kind::Send, peer, windowHeadTag(id), &op_, sizeof(op_));
  if (kind == WindowOpKind::Put && op.bytes > 0)
    prepare(data_, Request::Kind::Send, peer, windowDataTag(id), buf, op.bytes);
  else if (kind == WindowOpKind::Get && op.bytes > 0)
    prepare(data_, Request::Kind::Recv, peer, windowReplyTag(id), buf, op.bytes);
  else
    data_.done = true;
}

WindowSendTask::~WindowSendTask() { leave(); }

void WindowSendTask::leave() {
  if (entered_) order_->leave(head_.peer, ticket_);
  entered_ = false;
}

void WindowSendTask::post(Communicator& c) {
  posted_ = true;
  if (head_.done) return c.post(data_);  // one-sided: no head
  c.post(head_);
  if (!data_.done) c.post(data_);
}

bool WindowSendTask::start(Communicator& c) {
  using Kind = WindowOrder::Kind;
  // A written signal follows everything before it and holds back everything
  // after it: a write over every byte.
  if (signal_) ticket_ = order_->enter(head_.peer, Kind::Write, 0, UINT64_MAX);
  else ticket_ = order_->enter(head_.peer, !head_.done ? Kind::Message : write_ ? Kind::Write : Kind::Read, op_.offset,
                               op_.bytes);
  entered_ = true;
  return poll(c);
}

bool WindowSendTask::poll(Communicator& c) {
  if (!posted_) {
    if (!order_->mayGo(head_.peer, ticket_)) return false;
    post(c);
  }
  if (!head_.done || !data_.done) return false;
  leave();
  const std::string& why = head_.failed() ? head_.error : data_.error;
  if (!why.empty()) throwComm(str(what_, " failed: ", why));
  return true;
}

void WindowSendTask::complete(std::exception_ptr error) {
  leave();
  if (onEnd) onEnd(error);
}

}  // namespace roce::window
